"""Near-data queries from Python against the CLI on the same device, the
Arrow hand-over, and streaming in bounded memory."""

import json
import resource
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import sluice
from conftest import run_cli


def cli_rows(sluice_bin, dev, *args):
    out = run_cli(sluice_bin, "query", "--device", str(dev), "--limit", "100000000", *args)
    rows = []
    for line in out.splitlines():
        key, value = line.split("\t", 1)
        rows.append((bytes.fromhex(key), json.loads(value)))
    return rows


def test_query_gives_the_rows_the_cli_gives(papers_store, sluice_bin):
    where = "venue IN ('VLDB','SIGMOD') AND year BETWEEN 2000 AND 2010"
    want = cli_rows(sluice_bin, papers_store, "--keyspace", "papers", "--where", where,
                    "--select", "id,year,venue,authors[0]")
    assert len(want) > 20
    with sluice.Store(papers_store) as s:
        t = s.query("papers", where=where, select=["id", "year", "venue", "authors[0]"], threads=2)
    assert t.schema.field("id").type == pa.uint64()
    assert t.schema.field("year").type == pa.uint32()
    assert t.schema.field("authors[0]").type == pa.uint64()
    got = [(r["_key"], {k: r[k] for k in ("id", "year", "venue", "authors[0]")}) for r in t.to_pylist()]
    assert got == want


def test_whole_documents_come_with_every_declared_field(papers_store, sluice_bin):
    want = cli_rows(sluice_bin, papers_store, "--keyspace", "papers", "--where", "year = 2001")
    with sluice.Store(papers_store) as s:
        t = s.query("papers", where="year = 2001")
    assert t.column_names == ["_key", "id", "title", "venue", "year", "authors", "abstract"]
    assert t.schema.field("authors").type == pa.list_(pa.uint64())
    got = [(r.pop("_key"), r) for r in t.to_pylist()]
    assert got == want


def test_aggregates_match_the_cli(papers_store, sluice_bin):
    out = run_cli(sluice_bin, "query", "--device", str(papers_store), "--keyspace", "papers",
                  "--aggregate", "count(*),avg(year),max(year)", "--group-by", "venue")
    lines = out.splitlines()[1:]
    want = {json.loads(l.split("\t")[0]): [float(x) for x in l.split("\t")[1:]] for l in lines}
    with sluice.Store(papers_store) as s:
        t = s.aggregate("papers", "count(*),avg(year),max(year)", group_by="venue", threads=2)
    assert t.column_names == ["venue", "count(*)", "avg(year)", "max(year)"]
    assert t.schema.field("count(*)").type == pa.int64()
    got = {r["venue"]: [r["count(*)"], r["avg(year)"], r["max(year)"]] for r in t.to_pylist()}
    with sluice.Store(papers_store) as s:
        assert s.query("papers", aggregate="count(*),avg(year),max(year)", group_by="venue").equals(t)
        assert s.query_batches("papers", aggregate="count(*)").read_all().column(0).to_pylist() == [2000]
        with pytest.raises(sluice.QueryError, match="group_by goes with aggregate"):
            s.query("papers", group_by="venue")
    assert got.keys() == want.keys()
    for venue, values in want.items():
        assert got[venue] == pytest.approx(values, rel=1e-12), venue


def test_betweenness_and_bfs_match_the_cli(papers_store, sluice_bin):
    out = run_cli(sluice_bin, "graph", "--device", str(papers_store), "--keyspace", "refs",
                  "bc", "--top", "15")
    want = [(int(a), float(b)) for a, b in (l.split("\t") for l in out.splitlines()[1:])]
    bfs_out = run_cli(sluice_bin, "graph", "--device", str(papers_store), "--keyspace", "refs",
                      "bfs", "--from", str(want[0][0]), "--depth", "2")
    want_bfs = sorted(tuple(map(int, l.split("\t"))) for l in bfs_out.splitlines()[1:])
    with sluice.Store(papers_store) as s:
        g = s.graph("refs")
        assert g.vertices > 1000 and g.edges > 10000
        t = g.bc(top=15)
        got = [(r["id"], round(r["betweenness"], 3)) for r in t.to_pylist()]
        assert got == want
        got_bfs = sorted((r["id"], r["depth"]) for r in g.bfs(want[0][0], depth=2).to_pylist())
        assert got_bfs == want_bfs
        with pytest.raises(sluice.NotFoundError, match="not in the graph"):
            g.bfs(10**12)


def test_arrow_crosses_without_a_copy(papers_store):
    """pyarrow imports the Rust buffers through the C stream interface:
    its own allocator takes none of the table's bytes."""
    with sluice.Store(papers_store) as s:
        before = pa.total_allocated_bytes()
        t = s.query("papers", select=["title", "abstract", "year"])
        after = pa.total_allocated_bytes()
    assert t.num_rows == 2000 and t.nbytes > 500_000
    assert after - before < 4096, (before, after, t.nbytes)


def test_json_types_nulls_unicode_and_nested_values_round_trip(tmp_path):
    docs = [
        {"s": "café \u2603 \"q\"", "i": -5, "f": 1.5, "b": True, "n": None, "o": {"x": [1, {"y": 2}]}, "l": [1, 2]},
        {"s": "\u0000nul", "i": 2**62, "f": 3, "b": False, "o": {}, "l": []},
        {"i": None, "f": -0.25, "l": [7]},
    ]
    with sluice.Store(tmp_path / "kv.dev", create_mib=64) as s:
        s.keyspace("docs", format="json")
        s.write_batch([(f"d{i}", d) for i, d in enumerate(docs)], keyspace="docs")
        t = s.query("docs", select=["s", "i", "f", "b", "n", "o", "o.x[1].y", "l"], types={"l": "list<int64>"})
        assert t.schema.field("s").type == pa.string()
        assert t.schema.field("i").type == pa.int64()
        assert t.schema.field("f").type == pa.float64()
        assert t.schema.field("b").type == pa.bool_()
        rows = t.to_pylist()
        assert rows[0]["s"] == "café \u2603 \"q\"" and rows[1]["s"] == "\u0000nul"
        assert [r["i"] for r in rows] == [-5, 2**62, None]
        assert [r["f"] for r in rows] == [1.5, 3.0, -0.25]
        assert [r["b"] for r in rows] == [True, False, None]
        assert [r["n"] for r in rows] == [None, None, None]
        assert json.loads(rows[0]["o"]) == {"x": [1, {"y": 2}]}
        assert [r["o.x[1].y"] for r in rows] == [2, None, None]
        assert [r["l"] for r in rows] == [[1, 2], [], [7]]
        # A value its column cannot hold is an error naming the row and a way out.
        s.put("d9", {"i": "text"}, keyspace="docs")
        with pytest.raises(sluice.QueryError, match="column i.*d9.*int64 column \\(as given\\).*i:json"):
            s.query("docs", select=["i"], types={"i": "int64"})
        # Inferred from a sample that holds both kinds: JSON text, nothing lost.
        assert s.query("docs", select=["i"]).column("i").to_pylist() == ["-5", str(2**62), None, '"text"']


def test_query_batches_stream_a_keyspace_larger_than_their_memory(tmp_path):
    """256 MiB of values streamed in batches of 1,000 rows: the peak RSS
    grows by a small part of that (run in a fresh interpreter)."""
    dev = tmp_path / "big.dev"
    script = textwrap.dedent(f"""
        import resource, sluice
        with sluice.Store({str(dev)!r}, create_mib=1024) as s:
            s.keyspace("blobs", format="json")
            filler = "x" * 4000
            for b in range(64):
                s.write_batch([(f"k{{b:03}}{{i:04}}", '{{"n":%d,"pad":"%s"}}' % (i, filler)) for i in range(1024)], keyspace="blobs")
            s.flush()
        with sluice.Store({str(dev)!r}) as s:
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rows = 0
            total = 0
            for batch in s.query_batches("blobs", select=["n", "pad"], batch_rows=1000):
                rows += batch.num_rows
                total += batch.column("pad").nbytes
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(rows, total, peak - base)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows, total_bytes, grown_kib = map(int, out.stdout.split())
    assert rows == 65536 and total_bytes > 256_000_000
    assert grown_kib < 96 * 1024, f"peak RSS grew by {grown_kib} KiB while streaming {total_bytes} bytes"


def test_ctrl_c_stops_a_long_query(tmp_path):
    """SIGINT during `query` raises KeyboardInterrupt and the interpreter
    carries on (the producer thread is stopped)."""
    dev = tmp_path / "kv.dev"
    script = textwrap.dedent(f"""
        import os, signal, threading, time, sluice
        # Started from a background job, SIGINT would arrive ignored; Ctrl-C is what is tested.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with sluice.Store({str(dev)!r}, create_mib=512) as s:
            s.keyspace("d", format="json")
            for b in range(40):
                s.write_batch([(f"k{{b:03}}{{i:05}}", '{{"n":%d,"t":"%s"}}' % (i, "y" * 1000)) for i in range(2000)], keyspace="d")
            threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            t0 = time.time()
            try:
                for _ in range(1000):
                    s.query("d", select=["n", "t"], batch_rows=100)
                print("not interrupted")
            except KeyboardInterrupt:
                print("interrupted", round(time.time() - t0, 1))
            print(s.query("d", where="n = 7", select=["n"]).num_rows)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].startswith("interrupted"), out.stdout
    assert lines[1] == "40"


def test_cli_writes_an_arrow_ipc_stream_that_pyarrow_pandas_and_duckdb_read(papers_store, sluice_bin, tmp_path):
    where = "venue = 'VLDB'"
    out = tmp_path / "vldb.arrows"
    run_cli(sluice_bin, "query", "--device", str(papers_store), "--keyspace", "papers", "--where", where,
            "--select", "id,year,venue", "--limit", "100000", "--format", "arrow", "--out", str(out))
    with pa.ipc.open_stream(out) as reader:
        from_cli = reader.read_all()
    with sluice.Store(papers_store) as s:
        from_python = s.query("papers", where=where, select=["id", "year", "venue"])
    assert from_cli.num_rows > 20
    assert from_cli.equals(from_python)
    df = from_cli.to_pandas()
    assert list(df.columns) == ["_key", "id", "year", "venue"] and (df["venue"] == "VLDB").all()
    import duckdb

    con = duckdb.connect()
    vldb = pa.ipc.open_stream(out)  # noqa: F841  (DuckDB scans the reader by its name)
    count, max_year = con.execute("SELECT count(*), max(year) FROM vldb WHERE venue = 'VLDB'").fetchone()
    assert count == from_cli.num_rows and max_year == max(from_cli.column("year").to_pylist())
    agg = tmp_path / "agg.arrows"
    run_cli(sluice_bin, "query", "--device", str(papers_store), "--keyspace", "papers",
            "--aggregate", "count(*),avg(year)", "--group-by", "venue", "--format", "arrow", "--out", str(agg))
    with sluice.Store(papers_store) as s:
        assert pa.ipc.open_stream(agg).read_all().equals(
            s.aggregate("papers", "count(*),avg(year)", group_by="venue"))


def test_long_calls_release_the_gil(tmp_path):
    """While a query runs on one thread, another Python thread keeps
    running: the longest pause it sees is a small part of the query."""
    import threading
    import time

    with sluice.Store(tmp_path / "kv.dev", create_mib=512) as s:
        s.keyspace("d", format="json")
        for b in range(40):
            s.write_batch([(f"k{b:03}{i:05}", '{"n":%d,"t":"%s"}' % (i, "z" * 1000)) for i in range(2000)],
                          keyspace="d")
        took = []

        def run():
            start = time.perf_counter()
            s.query("d", select=["n", "t"], where="n >= 0")
            took.append(time.perf_counter() - start)

        worker = threading.Thread(target=run)
        last = time.perf_counter()
        longest = 0.0
        worker.start()
        while worker.is_alive():
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now
        worker.join()
    assert took[0] > 0.05, f"the query took only {took[0]:.3f} s: too short to tell"
    assert longest < took[0] / 2, f"the other thread stalled {longest:.3f} s of a {took[0]:.3f} s query"


def test_ctrl_c_stops_pyarrow_reading_a_stream(tmp_path):
    """SIGINT while pyarrow's read_all reads a query_batches stream: the
    stream stops and the read ends with ArrowInvalid naming the interrupt,
    well before the whole read would have ended (the reader looks for
    Ctrl-C every 50 ms); the store goes on."""
    dev = tmp_path / "kv.dev"
    script = textwrap.dedent(f"""
        import os, signal, threading, time, sluice
        # Started from a background job, SIGINT would arrive ignored; Ctrl-C is what is tested.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with sluice.Store({str(dev)!r}, create_mib=1024) as s:
            s.keyspace("d", format="json")
            for b in range(320):
                s.write_batch([(f"k{{b:03}}{{i:05}}", '{{"n":%d,"t":"%s"}}' % (i, "y" * 1000)) for i in range(1000)], keyspace="d")
            start = time.perf_counter()
            s.query_batches("d", select=["n", "t"], where="n >= 0", batch_rows=100).read_all()
            whole = time.perf_counter() - start
            sent = []
            threading.Timer(0.1, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT))).start()
            try:
                s.query_batches("d", select=["n", "t"], where="n >= 0", batch_rows=100).read_all()
                print("not interrupted")
            except Exception as e:
                assert "interrupted (Ctrl-C)" in str(e), repr(e)
                print("interrupted", round(whole, 3), round(time.perf_counter() - sent[0], 3))
            print(s.query("d", where="n = 7", select=["n"]).num_rows)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    first, rows = out.stdout.split("\n")[:2]
    assert first.startswith("interrupted") and rows == "320", out.stdout
    whole_s, latency_s = map(float, first.split()[1:])
    assert whole_s > 0.4, f"the whole read took only {whole_s} s: too short to tell"
    assert latency_s < whole_s / 2, f"interrupted {latency_s} s after the signal; a whole read takes {whole_s} s"
