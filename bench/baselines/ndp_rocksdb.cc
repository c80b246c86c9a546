// The RocksDB baseline of `sluice bench ndp`: the same paper data set in
// RocksDB (Debian's librocksdb-dev), the same operations done the way an
// application on RocksDB does them: iterate, parse each JSON document
// whole (RapidJSON, Debian's rapidjson-dev), filter on the host; iterate
// the references to build the adjacency, then Brandes; point GETs.
//
//   ndp_rocksdb load DB DUMP
//       Loads the pairs dumped by `sluice bench ndp` (format below) into
//       column families "papers" and "refs", then compacts each fully.
//   ndp_rocksdb run DB CACHE_BYTES PAPERS SCAN_BELOW[,..] BC_SOURCES BC_SEED GETS HOT REPEAT
//       Prints one JSON object per measurement on stdout.
//
// Dump format (little-endian): magic "SLPAIRS1", then per pair `u8 family`
// (0 papers, 1 refs), `u32 key length`, `u32 value length`, key, value.
//
// Options match Sluice's store where RocksDB has the same knob: direct
// reads and direct I/O for flush and compaction (no page cache on either
// side), no compression, a bloom filter of 10 bits per key, an LRU block
// cache of CACHE_BYTES, index and filter blocks held in memory.

#include <rapidjson/document.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ndp_rocksdb: %s\n", what.c_str());
  std::exit(1);
}

void check(const rocksdb::Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.ToString());
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Db {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> families;  // papers, refs
  ~Db() {
    for (auto* h : families) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
};

rocksdb::Options options(size_t cache_bytes) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  o.use_direct_reads = true;
  o.use_direct_io_for_flush_and_compaction = true;
  o.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = rocksdb::NewLRUCache(cache_bytes);
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

std::unique_ptr<Db> open(const std::string& path, size_t cache_bytes) {
  auto o = options(cache_bytes);
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(o)},
      {"papers", rocksdb::ColumnFamilyOptions(o)},
      {"refs", rocksdb::ColumnFamilyOptions(o)},
  };
  auto db = std::make_unique<Db>();
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  check(rocksdb::DB::Open(rocksdb::DBOptions(o), path, cfs, &handles, &db->db), "open");
  db->db->DestroyColumnFamilyHandle(handles[0]);
  db->families = {handles[1], handles[2]};
  return db;
}

uint32_t le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t be64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void load(const std::string& path, const std::string& dump) {
  std::ifstream in(dump, std::ios::binary);
  if (!in) die("cannot read " + dump);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "SLPAIRS1", 8) != 0) die(dump + " is not a pair dump");
  auto db = open(path, 8 << 20);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  rocksdb::WriteBatch batch;
  std::string key, value;
  uint64_t pairs = 0;
  for (;;) {
    char head[9];
    in.read(head, 9);
    if (in.gcount() == 0) break;
    if (in.gcount() != 9) die("dump ends inside a pair header");
    unsigned family = static_cast<unsigned char>(head[0]);
    if (family > 1) die("unknown family in dump");
    key.resize(le32(head + 1));
    value.resize(le32(head + 5));
    in.read(key.data(), key.size());
    in.read(value.data(), value.size());
    if (!in) die("dump ends inside a pair");
    check(batch.Put(db->families[family], key, value), "put");
    if (batch.Count() >= 1000) {
      check(db->db->Write(wo, &batch), "write");
      batch.Clear();
    }
    pairs++;
  }
  check(db->db->Write(wo, &batch), "write");
  for (auto* h : db->families) {
    check(db->db->Flush(rocksdb::FlushOptions(), h), "flush");
    check(db->db->CompactRange(rocksdb::CompactRangeOptions(), h, nullptr, nullptr),
          "compact");
  }
  std::printf("{\"loaded_pairs\":%llu}\n", static_cast<unsigned long long>(pairs));
}

// SCAN with the predicate `id < below`: every document parsed whole, the
// matching pairs copied out into 256 KiB result buffers.
void scan(Db& db, uint64_t below) {
  auto t = Clock::now();
  rocksdb::ReadOptions ro;
  std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.families[0]));
  std::string batch;
  batch.reserve(256 << 10);
  uint64_t examined = 0, matched = 0, bytes_examined = 0, bytes_returned = 0;
  uint64_t key_sum = 0;
  rapidjson::Document doc;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rocksdb::Slice k = it->key(), v = it->value();
    examined++;
    bytes_examined += k.size() + v.size();
    doc.Parse(v.data(), v.size());
    if (doc.HasParseError()) die("a paper is not JSON");
    auto id = doc.FindMember("id");
    if (id == doc.MemberEnd() || !id->value.IsUint64() || id->value.GetUint64() >= below) continue;
    matched++;
    key_sum += be64(k.data());
    if (batch.size() + 8 + k.size() + v.size() > (256u << 10) && !batch.empty()) {
      bytes_returned += batch.size();
      batch.clear();
    }
    uint32_t lens[2] = {static_cast<uint32_t>(k.size()), static_cast<uint32_t>(v.size())};
    batch.append(reinterpret_cast<const char*>(lens), 8);
    batch.append(k.data(), k.size());
    batch.append(v.data(), v.size());
  }
  check(it->status(), "scan");
  bytes_returned += batch.size();
  std::printf(
      "{\"op\":\"scan\",\"below\":%llu,\"seconds\":%.6f,\"examined\":%llu,\"bytes_examined\":%llu,"
      "\"matched\":%llu,\"bytes_returned\":%llu,\"key_sum\":%llu}\n",
      (unsigned long long)below, seconds_since(t), (unsigned long long)examined,
      (unsigned long long)bytes_examined, (unsigned long long)matched,
      (unsigned long long)bytes_returned, (unsigned long long)key_sum);
}

struct Csr {
  std::vector<uint64_t> ids;
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> targets;
};

// Iterates the references and builds the adjacency: vertices numbered
// densely in the order first seen, edges sorted and deduplicated.
Csr build(Db& db) {
  std::unordered_map<uint64_t, uint32_t> index;
  std::vector<std::pair<uint32_t, uint32_t>> edges;
  Csr g;
  auto vertex = [&](uint64_t id) {
    auto [it, fresh] = index.try_emplace(id, static_cast<uint32_t>(g.ids.size()));
    if (fresh) g.ids.push_back(id);
    return it->second;
  };
  rocksdb::ReadOptions ro;
  std::unique_ptr<rocksdb::Iterator> it(db.db->NewIterator(ro, db.families[1]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rocksdb::Slice k = it->key();
    if (k.size() != 16) die("a reference key is not 16 bytes");
    uint32_t s = vertex(be64(k.data()));
    uint32_t t = vertex(be64(k.data() + 8));
    edges.emplace_back(s, t);
  }
  check(it->status(), "refs scan");
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  g.offsets.assign(g.ids.size() + 1, 0);
  for (auto& e : edges) g.offsets[e.first + 1]++;
  for (size_t v = 0; v < g.ids.size(); v++) g.offsets[v + 1] += g.offsets[v];
  g.targets.reserve(edges.size());
  for (auto& e : edges) g.targets.push_back(e.second);
  return g;
}

// Brandes from `k` sources drawn by the same partial Fisher-Yates shuffle
// as Sluice's (so both compute the same estimate), scaled by n / k.
std::vector<double> brandes_sampled(const Csr& g, size_t k, uint64_t seed) {
  size_t n = g.ids.size();
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; i++) order[i] = static_cast<uint32_t>(i);
  uint64_t x = seed;
  for (size_t i = 0; i < k; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    size_t j = i + static_cast<size_t>((x >> 33) % (n - i));
    std::swap(order[i], order[j]);
  }
  std::vector<double> bc(n, 0.0), sigma(n), delta(n);
  std::vector<uint32_t> dist(n);
  std::vector<uint32_t> stack;
  std::deque<uint32_t> queue;
  double scale = static_cast<double>(n) / static_cast<double>(k);
  auto nb_begin = [&](uint32_t v) { return g.targets.begin() + g.offsets[v]; };
  auto nb_end = [&](uint32_t v) { return g.targets.begin() + g.offsets[v + 1]; };
  for (size_t i = 0; i < k; i++) {
    uint32_t s = order[i];
    std::fill(dist.begin(), dist.end(), UINT32_MAX);
    std::fill(sigma.begin(), sigma.end(), 0.0);
    std::fill(delta.begin(), delta.end(), 0.0);
    stack.clear();
    dist[s] = 0;
    sigma[s] = 1.0;
    queue.push_back(s);
    while (!queue.empty()) {
      uint32_t v = queue.front();
      queue.pop_front();
      stack.push_back(v);
      for (auto it = nb_begin(v); it != nb_end(v); ++it) {
        uint32_t w = *it;
        if (dist[w] == UINT32_MAX) {
          dist[w] = dist[v] + 1;
          queue.push_back(w);
        }
        if (dist[w] == dist[v] + 1) sigma[w] += sigma[v];
      }
    }
    while (!stack.empty()) {
      uint32_t w = stack.back();
      stack.pop_back();
      for (auto it = nb_begin(w); it != nb_end(w); ++it) {
        uint32_t v = *it;
        if (dist[v] == dist[w] + 1) delta[w] += sigma[w] / sigma[v] * (1.0 + delta[v]);
      }
      if (w != s) bc[w] += scale * delta[w];
    }
  }
  return bc;
}

void bc(Db& db, size_t k, uint64_t seed) {
  auto t = Clock::now();
  Csr g = build(db);
  double build_seconds = seconds_since(t);
  auto scores = brandes_sampled(g, std::min(k, g.ids.size()), seed);
  size_t top = 0;
  double sum = 0;
  for (size_t v = 0; v < scores.size(); v++) {
    sum += scores[v];
    if (scores[v] > scores[top] || (scores[v] == scores[top] && g.ids[v] < g.ids[top])) top = v;
  }
  std::printf(
      "{\"op\":\"bc\",\"seconds\":%.6f,\"build_seconds\":%.6f,\"vertices\":%zu,\"edges\":%zu,"
      "\"top\":%llu,\"top_score\":%.6f,\"score_sum\":%.6f}\n",
      seconds_since(t), build_seconds, g.ids.size(), g.targets.size(),
      (unsigned long long)g.ids[top], scores[top], sum);
}

// Point GETs of papers drawn by a 64-bit LCG from the first `papers`
// (all of them, or a hot set the block cache holds), the same sequence as
// Sluice's side; per-GET latency.
void gets(Db& db, const char* set, uint64_t papers, uint64_t count) {
  std::vector<double> lat_us;
  lat_us.reserve(count);
  uint64_t x = 42, bytes = 0;
  rocksdb::ReadOptions ro;
  std::string value;
  char key[8];
  auto total = Clock::now();
  for (uint64_t i = 0; i < count; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t id = (x >> 33) % papers;
    for (int b = 0; b < 8; b++) key[b] = static_cast<char>(id >> (56 - 8 * b));
    auto t = Clock::now();
    auto s = db.db->Get(ro, db.families[0], rocksdb::Slice(key, 8), &value);
    lat_us.push_back(seconds_since(t) * 1e6);
    check(s, "get");
    bytes += value.size();
  }
  double seconds = seconds_since(total);
  std::sort(lat_us.begin(), lat_us.end());
  double mean = 0;
  for (double l : lat_us) mean += l;
  mean /= static_cast<double>(lat_us.size());
  std::printf(
      "{\"op\":\"get\",\"set\":\"%s\",\"seconds\":%.6f,\"count\":%llu,\"p50_us\":%.3f,"
      "\"p99_us\":%.3f,\"mean_us\":%.3f,\"bytes\":%llu}\n",
      set, seconds, (unsigned long long)count, lat_us[lat_us.size() / 2],
      lat_us[lat_us.size() * 99 / 100], mean, (unsigned long long)bytes);
}

std::vector<uint64_t> numbers(const std::string& list) {
  std::vector<uint64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoull(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "load") {
    load(argv[2], argv[3]);
    return 0;
  }
  if (argc == 11 && std::string(argv[1]) == "run") {
    auto db = open(argv[2], std::stoull(argv[3]));
    uint64_t papers = std::stoull(argv[4]);
    auto below = numbers(argv[5]);
    size_t sources = std::stoull(argv[6]);
    uint64_t seed = std::stoull(argv[7]);
    uint64_t count = std::stoull(argv[8]);
    uint64_t hot = std::min<uint64_t>(std::stoull(argv[9]), papers);
    int repeat = std::stoi(argv[10]);
    for (int r = 0; r < repeat; r++) {
      for (uint64_t b : below) scan(*db, b);
      bc(*db, sources, seed);
      gets(*db, "all", papers, count);
      gets(*db, "hot", hot, count);
      std::fflush(stdout);
    }
    return 0;
  }
  std::fprintf(stderr,
               "usage: ndp_rocksdb load DB DUMP\n"
               "       ndp_rocksdb run DB CACHE_BYTES PAPERS SCAN_BELOW[,..] BC_SOURCES BC_SEED "
               "GETS HOT REPEAT\n");
  return 2;
}
