"""Exports from Python against a real OpenSearch: `sluice.export`, then
`read_export` (pyarrow) and `sluice.dask.read_export` on a LocalCluster of
two worker processes, each checked against the documents indexed and
against the CLI's reading of the same device."""

import json
import subprocess

import pyarrow as pa
import pytest

import sluice
from conftest import run_cli

HOSTILE = [
    {"title": "caf\u00e9 \u2603 \U0001F600", "year": 2001, "h_tags": ["a", "b"], "h_meta": {"deep": {"er": [{"x": None}, {"x": 1}]}}},
    {"title": "nul \u0000 and \"quotes\" \\ backslash", "year": 1999, "h_tags": [], "h_meta": {}},
    {"title": "m" * (1 << 20), "year": 2024, "h_score": 1e38, "h_big": 9007199254740993},
    {"title": None, "year": -3, "h_tags": ["x"], "h_score": -0.0},
    {"year": 2010, "h_deep": json.loads("[" * 15 + "]" * 15)},
]
HOSTILE_IDS = ["id with spaces", "slash/ed", "uni\u00e7ode", "q?x=1&y", "-5"]


@pytest.fixture(scope="module")
def indexed(opensearch, sluice_bin):
    """1,000 generated papers plus five hostile documents in one index of 3 shards."""
    from opensearchpy import OpenSearch, helpers

    run_cli(sluice_bin, "load", "--source", opensearch, "--index", "py-papers", "--docs", "1000",
            "--shards", "3", "--seed", "5", "--replace")
    client = OpenSearch(opensearch)
    helpers.bulk(client, ({"_index": "py-papers", "_id": i, "_source": d} for i, d in zip(HOSTILE_IDS, HOSTILE)),
                 refresh=True)
    want = {h["_id"]: h["_source"] for h in helpers.scan(client, index="py-papers", size=500)}
    assert len(want) == 1005
    return want


@pytest.fixture(scope="module")
def exported(indexed, opensearch, tmp_path_factory):
    dev = tmp_path_factory.mktemp("export") / "export.dev"
    summary = sluice.export(opensearch, "py-papers", dev, slices=3, page_docs=100, progress=False)
    assert summary["docs"] == 1005 and len(summary["slices"]) == 3
    return dev


def test_read_export_gives_every_document_with_its_source(indexed, exported):
    table = sluice.read_export(exported).read_all()
    assert table.column_names == ["_id", "_source"]
    got = {r["_id"]: json.loads(r["_source"]) for r in table.to_pylist()}
    assert got == indexed


def test_columns_are_typed_projected_and_filtered(indexed, exported, sluice_bin):
    reader = sluice.read_export(exported, columns=["year", "title", "h_tags"], types={"h_tags": "json"})
    assert reader.schema.field("year").type == pa.int64()
    assert reader.schema.field("title").type == pa.string()
    rows = {r["_id"]: r for r in reader.read_all().to_pylist()}
    for i in HOSTILE_IDS:
        src = indexed[i]
        assert rows[i]["year"] == src["year"]
        assert rows[i]["title"] == src.get("title")
        assert (json.loads(rows[i]["h_tags"]) if rows[i]["h_tags"] is not None else None) == src.get("h_tags")
    filtered = sluice.read_export(exported, columns=["year"], where="year >= 2020").read_all()
    want = {i for i, s in indexed.items() if isinstance(s.get("year"), int) and s["year"] >= 2020}
    assert set(filtered.column("_id").to_pylist()) == want
    # The CLI's filter over the same device counts the same documents.
    out = subprocess.run([str(sluice_bin), "read", "--device", str(exported), "--sink", "filter",
                          "--where", "year >= 2020"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"{len(want)} " in out.stdout + out.stderr


def test_slices_read_alone_add_up_to_the_export(indexed, exported):
    slices = sluice.export_slices(exported)
    assert len(slices) == 3 and sum(s["docs"] for s in slices) == 1005
    ids = []
    for n in range(3):
        t = sluice.read_export(exported, columns=["year"], slices=[n]).read_all()
        assert t.num_rows == slices[n]["docs"]
        ids += t.column("_id").to_pylist()
    assert sorted(ids) == sorted(indexed)
    with pytest.raises(sluice.QueryError, match="slice 7"):
        sluice.read_export(exported, slices=[7])


def test_bad_export_reads_raise_clear_errors(tmp_path, exported):
    with pytest.raises(sluice.NotFoundError, match="no export device"):
        sluice.read_export(tmp_path / "none.dev")
    with pytest.raises(sluice.QueryError, match="column"):
        sluice.read_export(exported, where="year >")
    with pytest.raises(sluice.QueryError, match="columns"):
        sluice.read_export(exported, types={"year": "int64"})
    # An error met while streaming reaches pyarrow through the C stream
    # interface, which carries it as ArrowInvalid with the message unchanged.
    with pytest.raises(pa.ArrowInvalid, match="column year: document .* bool column .*year:json"):
        sluice.read_export(exported, columns=["year"], types={"year": "bool"}).read_all()


def test_dask_reads_the_export_on_two_worker_processes(indexed, exported):
    import dask
    from distributed import Client, LocalCluster

    import sluice.dask as sd

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        df = sd.read_export(exported, columns=["year", "title"])
        assert df.npartitions == 3
        pdf = df.compute()
        assert len(client.scheduler_info()["workers"]) == 2
    assert sorted(pdf["_id"]) == sorted(indexed)
    for _id, year in zip(pdf["_id"], pdf["year"]):
        assert year == indexed[_id]["year"]


def test_interrupting_an_export_leaves_it_resumable(indexed, opensearch, tmp_path, sluice_bin):
    dev = tmp_path / "resume.dev"
    run = sluice._start_export(opensearch, "py-papers", str(dev), slices=2, page_docs=10)
    run.interrupt()
    run.wait(120.0)
    with pytest.raises(sluice.Error, match="resume"):
        run.result()
    summary = sluice.export(opensearch, "py-papers", dev, resume=True, progress=False)
    assert summary["docs"] == 1005
    got = {r["_id"] for r in sluice.read_export(dev, columns=["year"]).read_all().to_pylist()}
    assert got == set(indexed)


def test_ctrl_c_stops_an_export_with_its_pages_durable(indexed, opensearch, tmp_path):
    """SIGINT during sluice.export: KeyboardInterrupt once the pages in
    flight are written; resume=True finishes the export."""
    import subprocess
    import sys
    import textwrap

    dev = tmp_path / "ctrl-c.dev"
    script = textwrap.dedent(f"""
        import os, signal, threading, sluice
        # Started from a background job, SIGINT would arrive ignored; Ctrl-C is what is tested.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            sluice.export({opensearch!r}, "py-papers", {str(dev)!r}, slices=2, page_docs=20,
                          throttle_docs_per_s=200, progress=True)
            print("finished")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted", out.stdout + out.stderr
    summary = sluice.export(opensearch, "py-papers", dev, resume=True, progress=False)
    assert summary["docs"] == 1005 and 0 < summary["docs_this_run"] < 1005
    ids = sluice.read_export(dev, columns=["year"]).read_all().column("_id").to_pylist()
    assert sorted(ids) == sorted(indexed)
