"""The index and document endpoints, request by request, against a real
OpenSearch 2.11: the same requests in the same order to both, then the same
status and the same response shape (every member OpenSearch gives, of the
same JSON type), with the values that carry meaning (`result`, `found`,
`_version`, error types, item statuses, counts, sources) equal."""

import json
import urllib.error
import urllib.request

import pytest

# Members whose values differ by design between two servers (ids they make
# up, timings, their own names and versions).
FREE_VALUES = {"took", "_seq_no", "_primary_term", "uuid", "index_uuid", "_id", "reason", "caused_by",
               "root_cause", "stack_trace", "failed", "successful", "total", "_shards", "creation_date",
               "provided_name", "version", "routing", "number_of_replicas",
               # Sluice's shards are key ranges, not hash routing: it names shard 0.
               "shard"}
# Members only OpenSearch gives (Sluice answers as Elasticsearch does).
OPENSEARCH_ONLY = {"replication"}


def call(url, method, path, body=None, ndjson=False):
    if body is None:
        data = None
    elif ndjson:
        data = ("\n".join(json.dumps(line) for line in body) + "\n").encode()
    else:
        data = json.dumps(body).encode()
    content_type = "application/x-ndjson" if ndjson else "application/json"
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    return status, (json.loads(raw) if raw and method != "HEAD" else None)


def shape_diff(want, got, where="$", out=None):
    """Where `got` lacks a member of `want`, holds another JSON type, or
    another value of a member that carries meaning."""
    out = [] if out is None else out
    if isinstance(want, dict):
        if not isinstance(got, dict):
            out.append(f"{where}: {type(got).__name__} instead of an object")
            return out
        for k, v in want.items():
            if k in OPENSEARCH_ONLY:
                continue
            if k not in got:
                out.append(f"{where}.{k}: missing")
            elif k not in FREE_VALUES:
                shape_diff(v, got[k], f"{where}.{k}", out)
            elif type(v) is not type(got[k]) and not (isinstance(v, (int, float)) and isinstance(got[k], (int, float))):
                out.append(f"{where}.{k}: {type(got[k]).__name__} instead of {type(v).__name__}")
    elif isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            out.append(f"{where}: {got!r} instead of {want!r}")
        else:
            for i, (a, b) in enumerate(zip(want, got)):
                shape_diff(a, b, f"{where}[{i}]", out)
    elif want != got:
        out.append(f"{where}: {got!r} instead of {want!r}")
    return out


STEPS = [
    ("PUT", "/api", {"settings": {"number_of_shards": 2, "number_of_replicas": 0},
                     "mappings": {"properties": {"v": {"type": "keyword"}}}}),
    ("PUT", "/api", {}),
    ("HEAD", "/api", None),
    ("HEAD", "/nope", None),
    ("GET", "/api/_mapping", None),
    ("PUT", "/api/_mapping", {"properties": {"w": {"type": "integer"}}}),
    ("GET", "/api/_mapping", None),
    ("PUT", "/api/_doc/1", {"v": "a"}),
    ("PUT", "/api/_doc/1", {"v": "b", "w": 2}),
    ("PUT", "/api/_create/1", {"v": "c"}),
    ("PUT", "/api/_doc/1?if_seq_no=999&if_primary_term=1", {"v": "d"}),
    ("GET", "/api/_doc/1", None),
    ("HEAD", "/api/_doc/1", None),
    ("HEAD", "/api/_doc/2", None),
    ("GET", "/api/_doc/2", None),
    ("GET", "/api/_source/1", None),
    ("POST", "/api/_update/1", {"doc": {"w": 5}}),
    ("POST", "/api/_update/1", {"doc": {"w": 5}}),
    ("POST", "/api/_update/9", {"doc": {"w": 1}}),
    ("POST", "/api/_update/9", {"doc": {"w": 1}, "doc_as_upsert": True}),
    ("POST", "/api/_update/8", {"doc": {"w": 1}, "upsert": {"v": "u"}}),
    ("GET", "/api/_doc/8", None),
    ("POST", "/api/_mget", {"ids": ["1", "9", "x"]}),
    ("POST", "/_mget", {"docs": [{"_index": "api", "_id": "1"}, {"_index": "api", "_id": "nope"}]}),
    ("POST", "/api/_refresh", None),
    ("DELETE", "/api/_doc/9", None),
    ("DELETE", "/api/_doc/9", None),
    ("POST", "/api/_refresh", None),
    ("GET", "/api/_count", None),
    ("POST", "/api/_count", {"query": {"term": {"v": "b"}}}),
    ("BULK", "/_bulk?refresh=true", [
        {"index": {"_index": "api", "_id": "b1"}}, {"v": "x"},
        {"create": {"_index": "api", "_id": "b1"}}, {"v": "y"},
        {"update": {"_index": "api", "_id": "missing"}}, {"doc": {"v": "z"}},
        {"update": {"_index": "api", "_id": "b1"}}, {"doc": {"w": 7}},
        {"delete": {"_index": "api", "_id": "b1"}},
        {"delete": {"_index": "api", "_id": "b1"}},
        {"index": {"_index": "api"}}, {"v": "generated"},
    ]),
    ("BULK", "/api/_bulk", [{"index": {"_id": "b2"}}, {"v": "in-path"}]),
    ("POST", "/api/_refresh", None),
    ("GET", "/api/_count", None),
    # A deleted document's version goes on counting (index.gc_deletes).
    ("DELETE", "/api/_doc/t", None),
    ("DELETE", "/api/_doc/t", None),
    ("PUT", "/api/_doc/t", {"v": "t"}),
    ("DELETE", "/api/_doc/t", None),
    ("PUT", "/api/_create/t", {"v": "t"}),
    ("DELETE", "/api/_doc/t", None),
    ("POST", "/api/_update/t", {"doc": {"v": "t"}}),
    ("POST", "/api/_update/t", {"doc": {"v": "t"}, "doc_as_upsert": True}),
    ("BULK", "/api/_bulk", [{"delete": {"_id": "t"}}, {"index": {"_id": "t"}}, {"v": 1},
                            {"delete": {"_id": "t"}}, {"delete": {"_id": "t"}}]),
    ("PUT", "/api/_doc/t", {"v": "t"}),
    ("GET", "/api/_settings", None),
    ("DELETE", "/api", None),
    ("HEAD", "/api", None),
    ("DELETE", "/api", None),
    ("GET", "/api/_doc/1", None),
    ("HEAD", "/api/_doc/1", None),
    ("GET", "/api/_source/1", None),
    ("POST", "/api/_mget", {"ids": ["1"]}),
    ("GET", "/api/_mapping", None),
    ("GET", "/api/_settings", None),
    ("POST", "/api/_count", {}),
    ("POST", "/api/_search", {}),
    ("DELETE", "/api/_doc/1", None),
    ("POST", "/api/_update/1", {"doc": {"v": 1}}),
    ("POST", "/api/_refresh", None),
]


@pytest.mark.parametrize("step", range(len(STEPS)), ids=[f"{m} {p}" for m, p, _ in STEPS])
def test_index_and_document_endpoints_answer_as_opensearch_does(both, step):
    opensearch, sluice = both
    want_status, want, got_status, got = opensearch[step], opensearch[step + len(STEPS)], sluice[step], sluice[step + len(STEPS)]
    method, path, _ = STEPS[step]
    assert got_status == want_status, f"{method} {path}: {got_status} instead of {want_status}: {got}"
    if method == "BULK":
        # Items: the same action, status and result or error type, in order.
        assert got["errors"] == want["errors"]
        def items(r):
            return [(k, v["status"], v.get("result"), v.get("_version"), (v.get("error") or {}).get("type"))
                    for item in r["items"] for k, v in item.items()]
        assert items(got) == items(want)
        return
    diffs = shape_diff(want, got)
    assert not diffs, f"{method} {path}:\n" + "\n".join(diffs) + f"\nOpenSearch: {want}\nSluice: {got}"


@pytest.fixture(scope="module")
def both(opensearch, sluice_http):
    """Every step run in order on each server: statuses, then bodies."""
    out = []
    for url in (opensearch, sluice_http.url):
        call(url, "DELETE", "/api")
        statuses, bodies = [], []
        for method, path, body in STEPS:
            if method == "BULK":
                s, b = call(url, "POST", path, body, ndjson=True)
            else:
                s, b = call(url, method, path, body)
            statuses.append(s)
            bodies.append(b)
        out.append(statuses + bodies)
    return out
