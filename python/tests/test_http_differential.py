"""The same seeded random documents and queries against a real OpenSearch
2.11 and `sluice serve --http`: equal hit sets and totals, equal order
where sorted, equal counts and aggregations."""

import math
import random

import opensearchpy
import opensearchpy.helpers
import pytest

DOCS = 1500
QUERIES = 120
VENUES = ["VLDB", "SIGMOD", "ICDE", "CIDR", "EDBT", "PODS"]
LABELS = ["db", "io", "ml", "os", "net", "hw"]
MAPPING = {
    "properties": {
        "n": {"type": "long"},
        "venue": {"type": "keyword"},
        "title": {"type": "keyword"},
        "year": {"type": "long"},
        "score": {"type": "double"},
        "flag": {"type": "boolean"},
        "tag": {"type": "keyword"},
        "labels": {"type": "keyword"},
        "refs": {"type": "long"},
        "meta": {"properties": {"pages": {"type": "long"}}},
    }
}


def make_docs(rng):
    out = {}
    for n in range(DOCS):
        d = {
            "n": n,
            "venue": rng.choice(VENUES),
            "title": rng.choice(["alpha", "beta", "gamma", "delta"]) + "-" + str(rng.randint(0, 99)),
            "year": rng.randint(1995, 2025),
            "score": round(rng.uniform(-5, 5), 3),
            "flag": rng.random() < 0.4,
            "meta": {"pages": rng.randint(1, 30)},
        }
        r = rng.random()
        if r < 0.6:
            d["tag"] = rng.choice(["a", "b", "c"])
        elif r < 0.75:
            d["tag"] = None
        if rng.random() < 0.7:
            d["labels"] = rng.sample(LABELS, rng.randint(1, 3))
        r = rng.random()
        if r < 0.5:
            d["refs"] = [rng.randint(0, 500) for _ in range(rng.randint(0, 4))]
        elif r < 0.6:
            d["refs"] = rng.randint(0, 500)
        out[f"doc-{n:05d}"] = d
    return out


def leaf(rng):
    kind = rng.choice(["term", "terms", "range", "range_f", "exists", "prefix", "ids", "match", "term_label", "nested"])
    if kind == "term":
        return {"term": {"venue": rng.choice(VENUES)}}
    if kind == "term_label":
        return {"term": {"labels": rng.choice(LABELS)}}
    if kind == "terms":
        return {"terms": {"year": rng.sample(range(1995, 2026), rng.randint(1, 6))}}
    if kind == "range":
        lo = rng.randint(1995, 2025)
        ops = rng.choice([("gte", "lte"), ("gt", "lt"), ("gte",), ("lt",)])
        body = {ops[0]: lo}
        if len(ops) == 2:
            body[ops[1]] = lo + rng.randint(0, 10)
        return {"range": {"year": body}}
    if kind == "range_f":
        return {"range": {"score": {"gte": round(rng.uniform(-5, 5), 2)}}}
    if kind == "exists":
        return {"exists": {"field": rng.choice(["tag", "labels", "nope", "meta.pages"])}}
    if kind == "prefix":
        return {"prefix": {"title": rng.choice(["al", "be", "gamma-1", "d"])}}
    if kind == "ids":
        return {"ids": {"values": [f"doc-{rng.randrange(DOCS):05d}" for _ in range(rng.randint(1, 40))]}}
    if kind == "match":
        return {"match": {"tag": rng.choice(["a", "b"])}}
    return {"range": {"meta.pages": {"lte": rng.randint(1, 30)}}}


def query(rng, depth=0):
    if depth >= 2 or rng.random() < 0.45:
        return leaf(rng)
    b = {}
    for clause in ["must", "filter", "should", "must_not"]:
        if rng.random() < 0.5:
            b[clause] = [query(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if "should" in b and rng.random() < 0.4:
        b["minimum_should_match"] = rng.choice([1, 2, "50%", -1])
    return {"bool": b}


@pytest.fixture(scope="module")
def both(opensearch, sluice_http):
    rng = random.Random(20261125)
    docs = make_docs(rng)
    clients = []
    for url in (opensearch, sluice_http.url):
        c = opensearchpy.OpenSearch(url, timeout=120)
        if c.indices.exists(index="diff"):
            c.indices.delete(index="diff")
        c.indices.create(index="diff", body={"settings": {"number_of_shards": 1, "number_of_replicas": 0}, "mappings": MAPPING})
        ok, errors = opensearchpy.helpers.bulk(
            c, ({"_index": "diff", "_id": k, "_source": v} for k, v in docs.items()), chunk_size=500, refresh=True
        )
        assert ok == DOCS and not errors
        clients.append(c)
    return clients


def close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b


def same_aggs(a, b, path=""):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: {a} vs {b}"
        for k in a:
            same_aggs(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a} vs {b}"
        for i, (x, y) in enumerate(zip(a, b)):
            same_aggs(x, y, f"{path}[{i}]")
    else:
        assert close(a, b), f"{path}: {a!r} vs {b!r}"


def test_random_queries_give_the_same_hits_in_the_same_order(both):
    rng = random.Random(7)
    opensearch, sluice = both
    for _ in range(QUERIES):
        q = query(rng)
        body = {"query": q, "size": DOCS, "sort": [{"year": "desc"}, {"n": "asc"}], "track_total_hits": True}
        want = opensearch.search(index="diff", body=body)
        got = sluice.search(index="diff", body=body)
        assert got["hits"]["total"] == want["hits"]["total"], q
        assert [h["_id"] for h in got["hits"]["hits"]] == [h["_id"] for h in want["hits"]["hits"]], q
        assert [h["sort"] for h in got["hits"]["hits"]] == [h["sort"] for h in want["hits"]["hits"]], q
        assert sluice.count(index="diff", body={"query": q})["count"] == opensearch.count(index="diff", body={"query": q})["count"], q


def test_paging_with_from_size_and_search_after_matches(both):
    opensearch, sluice = both
    sort = [{"score": "asc"}, {"n": "desc"}]
    a = opensearch.search(index="diff", body={"query": {"term": {"flag": True}}, "sort": sort, "from": 40, "size": 25})
    b = sluice.search(index="diff", body={"query": {"term": {"flag": True}}, "sort": sort, "from": 40, "size": 25})
    assert [h["_id"] for h in a["hits"]["hits"]] == [h["_id"] for h in b["hits"]["hits"]]
    after = a["hits"]["hits"][-1]["sort"]
    a2 = opensearch.search(index="diff", body={"sort": sort, "size": 30, "search_after": after})
    b2 = sluice.search(index="diff", body={"sort": sort, "size": 30, "search_after": after})
    assert [h["_id"] for h in a2["hits"]["hits"]] == [h["_id"] for h in b2["hits"]["hits"]]


def test_sorts_on_array_fields_take_the_smallest_or_largest_element(both):
    opensearch, sluice = both
    for sort in ([{"refs": "asc"}, {"n": "asc"}], [{"refs": "desc"}, {"n": "asc"}],
                 [{"refs": {"order": "asc", "mode": "max"}}, {"n": "desc"}],
                 [{"labels": "desc"}, {"n": "asc"}]):
        field = next(iter(sort[0]))
        body = {"query": {"exists": {"field": field}}, "size": 300, "sort": sort}
        want = opensearch.search(index="diff", body=body)["hits"]["hits"]
        got = sluice.search(index="diff", body=body)["hits"]["hits"]
        assert [h["_id"] for h in got] == [h["_id"] for h in want], sort
        assert [h["sort"] for h in got] == [h["sort"] for h in want], sort


def test_random_aggregations_match(both):
    rng = random.Random(11)
    opensearch, sluice = both
    for _ in range(25):
        q = query(rng)
        if "ids" in str(q) or "minimum_should_match" in str(q):
            q = leaf(rng)
            if "ids" in q:
                q = {"match_all": {}}
        aggs = {
            "venues": {"terms": {"field": "venue", "size": rng.randint(2, 6)}, "aggs": {"avg_score": {"avg": {"field": "score"}}, "years": {"stats": {"field": "year"}}}},
            "tags": {"terms": {"field": "tag"}},
            "flags": {"terms": {"field": "flag"}},
            "pages": {"sum": {"field": "meta.pages"}},
            "low": {"min": {"field": "score"}},
            "high": {"max": {"field": "year"}},
            "tagged": {"value_count": {"field": "tag"}},
            "years": {"stats": {"field": "year"}},
            # Arrays: a document in each of its labels' buckets, every element counted.
            "labels": {"terms": {"field": "labels", "size": 20}, "aggs": {"refs": {"stats": {"field": "refs"}}}},
            "labelled": {"value_count": {"field": "labels"}},
            "refs": {"stats": {"field": "refs"}},
        }
        body = {"query": q, "size": 0, "aggs": aggs}
        want = opensearch.search(index="diff", body=body)
        got = sluice.search(index="diff", body=body)
        assert got["hits"]["total"] == want["hits"]["total"], q
        same_aggs(want["aggregations"], got["aggregations"])
