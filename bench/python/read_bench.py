"""Sluice's Python package against the usual Python ways, in one run.

    python3 bench/python/read_bench.py export --source URL --index INDEX --device DEV [--runs 3]
    python3 bench/python/read_bench.py query --device DEV [--runs 3]

export: a pandas DataFrame of every document of an index, three ways:
  - sluice.read_export(DEV, columns=[every field]).read_all().to_pandas()
    (DEV must hold a complete export of INDEX, e.g. `sluice export`);
  - opensearch-py's helpers.scan from the source + pd.DataFrame of the sources;
  - pandas' NDJSON reader (pd.read_json(lines=True)) on the same sources
    written as NDJSON once beforehand (untimed).
query: a predicate query over the paper store on DEV (`sluice papers
  generate`) into a DataFrame: store.query against a rocksdict (RocksDB's
  Python binding) database of the same key/value pairs iterated with
  json.loads and the filter in Python (built once beforehand, untimed).

Each side runs --runs times, alternating; medians and their ratio are
printed, with the row counts (which must agree).
"""

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import pandas as pd
import pyarrow as pa

import sluice

PAPER_FIELDS = ["id", "doi", "title", "venue", "year", "authors", "references", "abstract"]


def timed(fn):
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def report(name, runs, rows):
    med = statistics.median(runs)
    print(f"  {name:<44} median {med:8.2f} s  runs {', '.join(f'{r:.2f}' for r in runs)}  rows {rows}")
    return med


def run_sides(title, sides, runs):
    """Runs each side `runs` times, alternating; prints and returns the
    medians by side. Every side must give the same number of rows."""
    times = {k: [] for k in sides}
    rows = {}
    for _ in range(runs):
        for name, fn in sides.items():
            t, df = timed(fn)
            times[name].append(t)
            rows[name] = len(df)
            del df
    print(f"{title} ({runs} runs, alternating):")
    med = {k: report(k, v, rows[k]) for k, v in times.items()}
    assert len(set(rows.values())) == 1, rows
    return med


def bench_export(args):
    from opensearchpy import OpenSearch, helpers

    client = OpenSearch(hosts=[args.source], timeout=300)
    ndjson = os.path.join(args.workdir, "sources.ndjson")
    if not os.path.exists(ndjson):
        reader = sluice.read_export(args.device)
        with open(ndjson, "w", encoding="utf-8") as out:
            for batch in reader:
                for src in batch.column("_source").to_pylist():
                    out.write(src)
                    out.write("\n")

    def ours():
        return sluice.read_export(args.device, columns=PAPER_FIELDS, tasks=2).read_all().to_pandas()

    def scan():
        return pd.DataFrame([h["_source"] for h in helpers.scan(client, index=args.index, size=2000, scroll="5m")])

    def pandas_ndjson():
        return pd.read_json(ndjson, lines=True)

    sides = {"sluice.read_export -> pandas": ours, "opensearch-py helpers.scan -> pandas": scan,
             "pandas read_json(lines=True) on NDJSON": pandas_ndjson}
    med = run_sides(f"export of {args.index} into pandas", sides, args.runs)
    ours_med = med["sluice.read_export -> pandas"]
    print(f"  ratio vs helpers.scan: {med['opensearch-py helpers.scan -> pandas'] / ours_med:.1f}x"
          f"  vs pandas NDJSON: {med['pandas read_json(lines=True) on NDJSON'] / ours_med:.1f}x")


def bench_query(args):
    from rocksdict import Rdict

    where = "venue IN ('VLDB','SIGMOD') AND year >= 2010"
    rocks = os.path.join(args.workdir, "papers.rocksdb")
    if not os.path.exists(rocks):
        db = Rdict(rocks)
        with sluice.Store(args.device) as s:
            for k, v in s.scan("papers"):
                db[k] = v
        db.close()

    def ours():
        with sluice.Store(args.device) as s:
            return s.query("papers", where=where, select=["id", "title", "venue", "year"],
                           threads=2).to_pandas()

    # The store kept open with a block cache that holds the keyspace: what
    # the other side gets from the kernel's page cache (direct I/O has none).
    held = None

    def ours_warm():
        return held.query("papers", where=where, select=["id", "title", "venue", "year"],
                          threads=2).to_pandas()

    def rocksdict_python():
        db = Rdict(rocks)
        keys, ids, titles, venues, years = [], [], [], [], []
        for k, v in db.items():
            d = json.loads(v)
            if d["venue"] in ("VLDB", "SIGMOD") and d["year"] >= 2010:
                keys.append(k)
                ids.append(d["id"])
                titles.append(d["title"])
                venues.append(d["venue"])
                years.append(d["year"])
        db.close()
        return pd.DataFrame({"_key": keys, "id": ids, "title": titles, "venue": venues, "year": years})

    with sluice.Store(args.device) as s:
        before = pa.total_allocated_bytes()
        t, table = timed(lambda: s.query("papers", select=["title", "abstract", "year"], threads=2))
        grown = pa.total_allocated_bytes() - before
    print(f"Arrow hand-over (C stream interface): a {table.nbytes / 1e6:.0f} MB table of {table.num_rows} rows "
          f"in {t:.2f} s; pyarrow's allocator grew by {grown} bytes (the buffers are Rust's, not copied)")
    del table
    title = f"predicate query over the papers of {args.device} into pandas"
    baseline = "rocksdict + json.loads + filter -> pandas"
    cold = "store.query -> pandas (opened per run)"
    med = run_sides(title, {cold: ours, baseline: rocksdict_python}, args.runs)
    print(f"  ratio: {med[baseline] / med[cold]:.1f}x")
    held = sluice.Store(args.device, block_cache_mib=2048)
    held.query("papers", where=where, select=["id"], threads=2)
    warm = "store.query -> pandas (held open, warm cache)"
    med = run_sides(title, {warm: ours_warm, baseline: rocksdict_python}, args.runs)
    held.close()
    print(f"  ratio: {med[baseline] / med[warm]:.1f}x")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["export", "query"])
    p.add_argument("--source", default="http://127.0.0.1:9200")
    p.add_argument("--index", default="papers-bench-1m")
    p.add_argument("--device", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", default=os.path.join("data", "bench-python"))
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"sluice {sluice.__version__}, pyarrow {pa.__version__}, pandas {pd.__version__}, Python {sys.version.split()[0]}")
    (bench_export if args.what == "export" else bench_query)(args)


if __name__ == "__main__":
    main()
