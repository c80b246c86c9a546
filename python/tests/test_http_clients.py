"""Unmodified Elasticsearch and OpenSearch Python clients against
`sluice serve --http`: bulk helpers, scans, point in time with slices,
count, get, mget, update, and the errors they raise."""

import hashlib
import json
import random

import elasticsearch
import elasticsearch.helpers
import opensearchpy
import opensearchpy.helpers
import pytest


def docs(n, seed=3):
    rng = random.Random(seed)
    venues = ["VLDB", "SIGMOD", "ICDE", "CIDR", "EDBT"]
    for i in range(n):
        yield f"p{i:06d}", {
            "title": f"paper {i} " + "".join(rng.choice("abcdefgh") for _ in range(rng.randint(0, 40))),
            "venue": rng.choice(venues),
            "year": rng.randint(1990, 2025),
            "pages": rng.randint(1, 40),
            "score": rng.random(),
        }


def digest(source):
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def os_client(sluice_http):
    return opensearchpy.OpenSearch(sluice_http.url, timeout=60)


@pytest.fixture(scope="module")
def es_client(sluice_http):
    return elasticsearch.Elasticsearch(sluice_http.url, request_timeout=60)


@pytest.fixture(scope="module")
def loaded(os_client):
    """3,000 documents loaded with opensearch-py's helpers.bulk."""
    os_client.indices.create(
        index="papers",
        body={"settings": {"number_of_shards": 3}, "mappings": {"properties": {"venue": {"type": "keyword"}}}},
    )
    expected = dict(docs(3000))
    ok, errors = opensearchpy.helpers.bulk(
        os_client, ({"_index": "papers", "_id": i, "_source": s} for i, s in expected.items()), chunk_size=500
    )
    assert ok == 3000 and not errors
    return expected


def test_bulk_then_scan_gives_back_every_document(os_client, loaded):
    got = {h["_id"]: h["_source"] for h in opensearchpy.helpers.scan(os_client, index="papers", size=700)}
    assert got.keys() == loaded.keys()
    assert all(digest(got[k]) == digest(v) for k, v in loaded.items())


def test_scan_with_a_query_and_preserve_order(os_client, loaded):
    hits = list(
        opensearchpy.helpers.scan(
            os_client,
            index="papers",
            query={"query": {"term": {"venue": "VLDB"}}, "sort": [{"year": "asc"}]},
            preserve_order=True,
            size=100,
        )
    )
    want = sorted((s["year"] for s in loaded.values() if s["venue"] == "VLDB"))
    assert [h["_source"]["year"] for h in hits] == want


def test_elasticsearch_py_streaming_bulk_count_get_mget_update(es_client):
    es_client.indices.create(index="es-docs", mappings={"properties": {"venue": {"type": "keyword"}}})
    actions = ({"_index": "es-docs", "_id": i, "_source": s} for i, s in docs(500, seed=9))
    results = list(elasticsearch.helpers.streaming_bulk(es_client, actions, chunk_size=128))
    assert len(results) == 500 and all(ok for ok, _ in results)
    assert es_client.count(index="es-docs")["count"] == 500
    assert es_client.count(index="es-docs", query={"range": {"year": {"gte": 2000}}})["count"] == sum(
        1 for _, s in docs(500, seed=9) if s["year"] >= 2000
    )
    one = es_client.get(index="es-docs", id="p000007")
    assert one["found"] and one["_version"] == 1 and one["_source"] == dict(docs(500, seed=9))["p000007"]
    got = es_client.mget(index="es-docs", ids=["p000001", "nope", "p000002"])["docs"]
    assert [d["found"] for d in got] == [True, False, True]
    r = es_client.update(index="es-docs", id="p000007", doc={"pages": 999, "extra": {"a": 1}})
    assert r["result"] == "updated" and r["_version"] == 2
    after = es_client.get(index="es-docs", id="p000007")["_source"]
    assert after["pages"] == 999 and after["extra"] == {"a": 1} and after["venue"] == one["_source"]["venue"]
    r = es_client.update(index="es-docs", id="new1", doc={"x": 1}, doc_as_upsert=True)
    assert r["result"] == "created"
    with pytest.raises(elasticsearch.NotFoundError) as e:
        es_client.update(index="es-docs", id="missing", doc={"x": 1})
    assert e.value.meta.status == 404 and "document_missing_exception" in str(e.value)
    with pytest.raises(elasticsearch.ConflictError):
        es_client.create(index="es-docs", id="p000001", document={"x": 1})
    with pytest.raises(elasticsearch.NotFoundError):
        es_client.get(index="no-such-index", id="x")


def test_point_in_time_with_slices_and_search_after(es_client, loaded):
    pit = es_client.open_point_in_time(index="papers", keep_alive="1m")["id"]
    seen = {}
    slices = 4
    for s in range(slices):
        after = None
        while True:
            kw = {"search_after": after} if after else {}
            r = es_client.search(
                pit={"id": pit, "keep_alive": "1m"},
                slice={"id": s, "max": slices},
                sort=[{"_shard_doc": "asc"}],
                size=250,
                track_total_hits=False,
                **kw,
            )
            hits = r["hits"]["hits"]
            if not hits:
                break
            for h in hits:
                assert h["_id"] not in seen, "slices overlap"
                seen[h["_id"]] = h["_source"]
            after = hits[-1]["sort"]
    assert seen.keys() == loaded.keys()
    # Writes after the point in time opened are not seen through it.
    es_client.index(index="papers", id="late", document={"venue": "LATE"}, refresh=True)
    r = es_client.search(pit={"id": pit}, query={"term": {"venue": "LATE"}}, size=1)
    assert r["hits"]["total"]["value"] == 0
    assert es_client.count(index="papers", query={"term": {"venue": "LATE"}})["count"] == 1
    assert es_client.close_point_in_time(id=pit)["succeeded"]
    with pytest.raises(elasticsearch.NotFoundError) as e:
        es_client.search(pit={"id": pit}, size=1)
    assert e.value.body["error"]["root_cause"][0]["type"] == "search_context_missing_exception"
    es_client.delete(index="papers", id="late")


def test_opensearch_point_in_time_shape(os_client, loaded):
    r = os_client.create_pit(index="papers", params={"keep_alive": "1m"})
    pit = r["pit_id"]
    page = os_client.search(body={"pit": {"id": pit}, "size": 5, "sort": [{"_doc": "asc"}]})
    assert len(page["hits"]["hits"]) == 5 and page["pit_id"] == pit
    closed = os_client.delete_pit(body={"pit_id": [pit]})
    assert closed["pits"] == [{"successful": True, "pit_id": pit}]


def test_errors_have_elasticsearch_shapes(os_client, loaded):
    with pytest.raises(opensearchpy.RequestError) as e:
        os_client.search(index="papers", body={"query": {"fuzzy": {"title": "x"}}})
    assert e.value.status_code == 400 and e.value.error == "parsing_exception"
    with pytest.raises(opensearchpy.NotFoundError) as e:
        os_client.scroll(scroll_id="bm90LWEtc2Nyb2xs", scroll="1m")
    assert e.value.status_code == 404
    with pytest.raises(opensearchpy.RequestError) as e:
        os_client.indices.create(index="papers")
    assert e.value.error == "resource_already_exists_exception"
    with pytest.raises(opensearchpy.RequestError) as e:
        os_client.search(index="papers", body={"from": 9995, "size": 10})
    assert "Result window is too large" in str(e.value.info)


def test_native_query_answers_json_and_arrow(sluice_http, loaded):
    import urllib.request

    import pyarrow as pa

    def post(body, accept=None):
        headers = {"Content-Type": "application/json"}
        if accept:
            headers["Accept"] = accept
        req = urllib.request.Request(sluice_http.url + "/_sluice/query", data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.headers.get("Content-Type"), r.read()

    want = {k for k, s in loaded.items() if s["venue"] == "VLDB" and s["year"] >= 2010}
    body = {"index": "papers", "where": "venue = 'VLDB' AND year >= 2010", "select": ["year", "venue"]}
    ctype, raw = post(body)
    rows = json.loads(raw)["rows"]
    assert {r["key"] for r in rows} == want
    assert all(r["value"]["venue"] == "VLDB" and r["value"]["year"] >= 2010 for r in rows)
    ctype, raw = post(body, "application/vnd.apache.arrow.stream")
    assert ctype == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(raw).read_all()
    assert {k.decode() for k in table.column("_key").to_pylist()} == want
    assert table.schema.field("year").type == pa.int64()
    ctype, raw = post({"index": "papers", "aggregate": "count(*),avg(year)", "group_by": "venue"})
    groups = {r["venue"]: r["count(*)"] for r in json.loads(raw)["rows"]}
    assert groups == {v: sum(1 for s in loaded.values() if s["venue"] == v) for v in groups}
    assert sum(groups.values()) == len(loaded)
