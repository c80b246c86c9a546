"""`sluice bench http`: the same paper documents in OpenSearch and in
`sluice serve --http`, measured in one run with the same clients:

- bulk indexing with opensearch-py's helpers.bulk (documents/s);
- a sliced point-in-time export with `sluice export`, and helpers.scan, out
  of each (documents/s);
- a predicate count and a terms aggregation with that predicate, first
  with the request cache skipped (`request_cache=false`: the work itself),
  then as clients send them (later answers may come from either side's
  request cache); median latency.

Prints a table with the ratios and writes the figures as JSON. The source
documents come from an export device (`sluice export` of the seeded paper
index), read with `sluice.read_export`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import opensearchpy
import opensearchpy.helpers
import sluice

ROOT = Path(__file__).resolve().parents[2]
INDEX = "bench-http"
PREDICATE = {"bool": {"filter": [{"term": {"venue": "VLDB"}}, {"range": {"year": {"gte": 2015}}}]}}
MAPPING = {
    "properties": {
        "id": {"type": "long"}, "doi": {"type": "keyword"}, "title": {"type": "text"},
        "venue": {"type": "keyword"}, "year": {"type": "integer"}, "authors": {"type": "keyword"},
        "references": {"type": "long"}, "abstract": {"type": "text"},
    }
}


def actions(export_device, limit):
    """The documents whose numeric id is below `limit` (slices are read in
    parallel, so "the first N read" would differ between the two sides)."""
    for batch in sluice.read_export(export_device):
        ids = batch.column(0).to_pylist()
        sources = batch.column(1).to_pylist()
        for i, s in zip(ids, sources):
            if int(i) >= limit:
                continue
            # A string _source goes out as it is: the client does not
            # re-serialise it, for either side.
            yield {"_index": INDEX, "_id": i, "_source": s}


def start_sluice(binary, device, create_mib):
    proc = subprocess.Popen(
        [binary, "serve", "--device", str(device), "--create-mib", str(create_mib), "--resp", "127.0.0.1:0",
         "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = None
    for line in proc.stdout:
        if "HTTP API" in line:
            url = line.strip().rsplit(" ", 1)[-1]
        if "ready to accept connections" in line:
            break
    if not url:
        proc.kill()
        sys.exit("sluice serve did not start its HTTP API")
    return proc, url


def timed(f):
    t = time.perf_counter()
    r = f()
    return time.perf_counter() - t, r


def bulk(client, export_device, docs, chunk):
    if client.indices.exists(index=INDEX):
        client.indices.delete(index=INDEX)
    client.indices.create(index=INDEX, body={
        "settings": {"index": {"number_of_shards": 4, "number_of_replicas": 0, "refresh_interval": "-1"}},
        "mappings": MAPPING,
    })

    def run():
        ok, errors = opensearchpy.helpers.bulk(client, actions(export_device, docs), chunk_size=chunk,
                                                max_chunk_bytes=100 << 20, request_timeout=600)
        assert not errors and ok == docs, (ok, errors[:3])
        client.indices.refresh(index=INDEX)
        return ok

    return timed(run)


def export(binary, url, slices, runs):
    seconds = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(dir=ROOT / "data") as d:
            dev = Path(d) / "export.dev"
            s, out = timed(lambda: subprocess.run(
                [binary, "export", "--source", url, "--index", INDEX, "--device", str(dev), "--slices", str(slices),
                 "--progress", "off"], capture_output=True, text=True))
            if out.returncode != 0:
                sys.exit(f"sluice export from {url} failed: {out.stderr}")
            seconds.append(s)
    return seconds


def scan(client, runs, docs):
    seconds = []
    for _ in range(runs):
        s, n = timed(lambda: sum(1 for _ in opensearchpy.helpers.scan(client, index=INDEX, size=2048, request_timeout=600)))
        assert n == docs, n
        seconds.append(s)
    return seconds


def queries(client, runs):
    """Each query first with the request cache skipped (request_cache=false:
    the work itself), then as clients send it (the second and later answers
    may come from either side's request cache)."""
    count, aggs, count_nc, aggs_nc = [], [], [], []
    body = {"size": 0, "query": PREDICATE, "aggs": {"by_venue": {"terms": {"field": "venue", "size": 30}},
                                                      "years": {"stats": {"field": "year"}}}}
    # _count takes no request_cache parameter on OpenSearch: the uncached
    # count is a size-0 search counting every match.
    count_body = {"size": 0, "query": PREDICATE, "track_total_hits": True}
    nc = {"request_cache": "false"}
    want_count = None
    for _ in range(runs):
        s, r = timed(lambda: client.search(index=INDEX, body=count_body, params=nc, request_timeout=600))
        want_count = want_count or r["hits"]["total"]["value"]
        assert r["hits"]["total"]["value"] == want_count
        count_nc.append(s)
        s, r = timed(lambda: client.search(index=INDEX, body=body, params=nc, request_timeout=600))
        aggs_nc.append(s)
    for _ in range(runs):
        s, r = timed(lambda: client.count(index=INDEX, body={"query": PREDICATE}))
        assert r["count"] == want_count
        count.append(s)
        s, r = timed(lambda: client.search(index=INDEX, body=body, request_timeout=600))
        aggs.append(s)
    return count, aggs, count_nc, aggs_nc, want_count, r["aggregations"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--opensearch", default="http://127.0.0.1:9200")
    p.add_argument("--sluice-bin", default=str(ROOT / "target/release/sluice"))
    p.add_argument("--export", default=str(ROOT / "data/bench-export-1m.dev"), help="source documents")
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--device", default=str(ROOT / "data/bench-http.dev"))
    p.add_argument("--create-mib", type=int, default=8192)
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--json", default=str(ROOT / "data/bench-http.json"))
    a = p.parse_args()
    if os.path.exists(a.device):
        os.remove(a.device)
    proc, sluice_url = start_sluice(a.sluice_bin, a.device, a.create_mib)
    sides = {"opensearch": a.opensearch, "sluice": sluice_url}
    report = {"docs": a.docs, "slices": a.slices, "runs": a.runs, "sides": {}}
    try:
        for name, url in sides.items():
            c = opensearchpy.OpenSearch(url, timeout=600)
            print(f"{name}: bulk {a.docs} documents…", flush=True)
            bulk_s, _ = bulk(c, a.export, a.docs, a.chunk)
            print(f"{name}: exports and scans…", flush=True)
            export_s = export(a.sluice_bin, url, a.slices, a.runs)
            scan_s = scan(c, a.runs, a.docs)
            count_s, aggs_s, count_nc_s, aggs_nc_s, matched, aggregations = queries(c, max(a.runs, 5))
            report["sides"][name] = {
                "bulk_seconds": bulk_s, "bulk_docs_per_s": a.docs / bulk_s,
                "export_seconds": export_s, "export_docs_per_s": a.docs / statistics.median(export_s),
                "scan_seconds": scan_s, "scan_docs_per_s": a.docs / statistics.median(scan_s),
                "count_seconds": count_s, "aggs_seconds": aggs_s, "matched": matched,
                "count_uncached_seconds": count_nc_s, "aggs_uncached_seconds": aggs_nc_s,
                "aggregations": aggregations,
            }
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    o, s = report["sides"]["opensearch"], report["sides"]["sluice"]
    assert o["matched"] == s["matched"], "the two sides count different documents"
    assert o["aggregations"]["by_venue"]["buckets"] == s["aggregations"]["by_venue"]["buckets"], "aggregations differ"
    rows = [
        ("bulk (helpers.bulk), docs/s", o["bulk_docs_per_s"], s["bulk_docs_per_s"], True),
        ("sluice export, docs/s (median)", o["export_docs_per_s"], s["export_docs_per_s"], True),
        ("helpers.scan, docs/s (median)", o["scan_docs_per_s"], s["scan_docs_per_s"], True),
        ("_count with predicate, ms (median)", 1e3 * statistics.median(o["count_seconds"]), 1e3 * statistics.median(s["count_seconds"]), False),
        ("terms + stats aggregation, ms (median)", 1e3 * statistics.median(o["aggs_seconds"]), 1e3 * statistics.median(s["aggs_seconds"]), False),
        ("count, request cache off, ms (median)", 1e3 * statistics.median(o["count_uncached_seconds"]), 1e3 * statistics.median(s["count_uncached_seconds"]), False),
        ("aggregation, request cache off, ms (median)", 1e3 * statistics.median(o["aggs_uncached_seconds"]), 1e3 * statistics.median(s["aggs_uncached_seconds"]), False),
    ]
    print(f"\n{a.docs} documents, {a.slices} slices, {a.runs} runs; predicate matches {s['matched']}")
    print(f"{'':42} {'OpenSearch':>12} {'Sluice':>12} {'Sluice/OpenSearch':>18}")
    for label, ov, sv, higher_better in rows:
        ratio = sv / ov if higher_better else ov / sv
        print(f"{label:42} {ov:12.1f} {sv:12.1f} {ratio:17.2f}x")
    report["ratios"] = {label: (sv / ov if hb else ov / sv) for label, ov, sv, hb in rows}
    Path(a.json).write_text(json.dumps(report, indent=1))
    print(f"figures written to {a.json}")


if __name__ == "__main__":
    main()
