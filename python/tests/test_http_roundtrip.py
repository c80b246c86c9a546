"""A round trip through Sluice's HTTP API with real tools: documents in a
real OpenSearch, `sluice export` of them, `sluice import` of the export into
the store, `sluice serve --http` over it, then `sluice export` and
elasticdump out of Sluice: the same ids and the same source bytes."""

import json
import subprocess

import opensearchpy
import opensearchpy.helpers
import pytest
import sluice
from conftest import SluiceServe, run_cli

HOSTILE = {
    "id with spaces": {"t": "caf\u00e9 \u2603 \U0001F600", "nul": "a\u0000b"},
    "slash/ed": {"deep": json.loads("[" * 20 + "1" + "]" * 20)},
    "q?x=1&y": {"small": -9223372036854775808, "e": 1e-300, "pi": 3.141592653589793238462643383279},
    "uni\u00e7ode": {"s": "x" * 200_000},
    "-5": {},
}


def sources(device):
    table = sluice.read_export(device).read_all()
    return {r["_id"]: r["_source"] for r in table.to_pylist()}


@pytest.fixture(scope="module")
def original(opensearch, sluice_bin):
    run_cli(sluice_bin, "load", "--source", opensearch, "--index", "rt-papers", "--docs", "2000",
            "--shards", "3", "--seed", "21", "--replace")
    client = opensearchpy.OpenSearch(opensearch)
    opensearchpy.helpers.bulk(client, ({"_index": "rt-papers", "_id": i, "_source": d} for i, d in HOSTILE.items()),
                              refresh=True)
    return client


def test_export_import_serve_export_gives_the_same_documents(original, opensearch, sluice_bin, tmp_path):
    first = tmp_path / "first.dev"
    run_cli(sluice_bin, "export", "--source", opensearch, "--index", "rt-papers", "--device", str(first),
            "--slices", "3", "--progress", "off")
    want = sources(first)
    assert len(want) == 2005
    store = tmp_path / "serve.dev"
    out = run_cli(sluice_bin, "import", "--export", str(first), "--device", str(store), "--create-mib", "256",
                  "--index", "rt-papers")
    assert "imported 2005 documents" in out
    server = SluiceServe(sluice_bin, store)
    try:
        second = tmp_path / "second.dev"
        run_cli(sluice_bin, "export", "--source", server.url, "--index", "rt-papers", "--device", str(second),
                "--slices", "4", "--progress", "off")
        got = sources(second)
        assert got.keys() == want.keys()
        # The store keeps each _source as the bytes it was given.
        assert [k for k in want if got[k] != want[k]] == []

        dump = tmp_path / "dump.ndjson"
        r = subprocess.run(["elasticdump", f"--input={server.url}/rt-papers", f"--output={dump}", "--type=data",
                            "--limit=300"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        dumped = {}
        for line in dump.read_text().splitlines():
            hit = json.loads(line)
            dumped[hit["_id"]] = hit["_source"]
        assert dumped.keys() == want.keys()
        differ = [k for k in want if dumped[k] != json.loads(want[k])]
        # elasticdump parses with JavaScript numbers: a 64-bit integer comes
        # out rounded to a double (its limit, not the source's).
        assert differ in ([], ["q?x=1&y"]), [(k, dumped[k], want[k][:200]) for k in differ[:3]]
        assert float(dumped["q?x=1&y"]["small"]) == float(-9223372036854775808)
        c = opensearchpy.OpenSearch(server.url)
        assert c.count(index="rt-papers")["count"] == 2005
    finally:
        server.stop()
        for dev in (first, tmp_path / "second.dev"):
            dev.unlink(missing_ok=True)
