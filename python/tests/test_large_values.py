"""Values as large as the clients expect: strings, hash fields, list items,
set and sorted-set members and stream fields of hundreds of KiB to 512 MiB
over RESP, answered as a real redis-server answers them (same commands on
both, replies compared), still there after a restart; documents of MiBs
over HTTP, and a `_bulk` of 400 documents with a few of 1 MB (split into
store batches). The store keeps such values in blob files apart from its
tree (docs/FORMAT.md, "Blob files")."""

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import redis

from conftest import SluiceServe

MIB = 1 << 20


def _value(seed: int, size: int) -> bytes:
    """`size` bytes that differ from one seed to the next and within."""
    block = bytes((seed * 31 + i * 7) % 251 for i in range(65536))
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, sluice_bin):
    redis_server = shutil.which("redis-server")
    assert redis_server, "redis-server is installed by scripts/setup"
    tmp = tmp_path_factory.mktemp("large")
    sluice = SluiceServe(sluice_bin, tmp / "serve.dev", create_mib=2048)
    port = _free_port()
    real = subprocess.Popen(
        [redis_server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        real_client = redis.Redis(port=port, socket_timeout=120)
        deadline = time.monotonic() + 30
        while True:
            try:
                real_client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield sluice, real_client
    finally:
        real.terminate()
        real.wait(timeout=30)
        if sluice.proc.poll() is None:
            sluice.stop()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resp_port(server: SluiceServe) -> int:
    found = re.search(r"Redis protocol \(RESP2/RESP3\) on 127\.0\.0\.1:(\d+)", "".join(server.banner))
    assert found, server.banner
    return int(found.group(1))


# Each command with its arguments; run on both servers, replies compared.
COMMANDS = [
    ("SET", "s5", _value(1, 5 * MIB)),
    ("GET", "s5"),
    ("STRLEN", "s5"),
    ("GETRANGE", "s5", 3 * MIB - 10, 3 * MIB + 10),
    ("APPEND", "s5", _value(2, MIB)),
    ("STRLEN", "s5"),
    ("SETRANGE", "s5", 6 * MIB + 5, b"tail"),
    ("GET", "s5"),
    ("SET", "s100k", _value(3, 100_000)),
    ("GETDEL", "s100k"),
    ("EXISTS", "s100k"),
    ("HSET", "h", "small", "x", "big", _value(4, 2 * MIB), "mid", _value(5, 40_000)),
    ("HGET", "h", "big"),
    ("HSTRLEN", "h", "big"),
    ("HGETALL", "h"),
    ("RPUSH", "l", _value(6, 300_000), b"small", _value(7, 20_000)),
    ("LRANGE", "l", 0, -1),
    ("LINDEX", "l", 0),
    ("LPOP", "l"),
    # Members, fields and keys are keys of the store's tree: up to 8 KiB
    # (README, "Limits"); their values are not bounded that way.
    ("SADD", "set", _value(8, 8000), _value(9, 8000), b"m"),
    ("SISMEMBER", "set", _value(8, 8000)),
    ("SCARD", "set"),
    ("ZADD", "z", 1, _value(10, 8000), 2, b"two"),
    ("ZRANGE", "z", 0, -1, "WITHSCORES"),
    ("ZSCORE", "z", _value(10, 8000)),
    ("XADD", "x", "1-1", "f", _value(11, MIB)),
    ("XRANGE", "x", "-", "+"),
    ("SET", "s64", _value(12, 64 * MIB)),
    ("GET", "s64"),
    ("DEL", "s64"),
    ("GET", "s64"),
]


def test_large_values_answer_as_redis_answers_and_survive_a_restart(servers, sluice_bin):
    sluice, real = servers
    ours = redis.Redis(port=_resp_port(sluice), socket_timeout=120)
    for cmd in COMMANDS:
        want = real.execute_command(*cmd)
        got = ours.execute_command(*cmd)
        assert got == want, f"{cmd[0]} {cmd[1]}: replies differ ({_short(got)} vs {_short(want)})"
    snapshot = {
        "s5": real.get("s5"),
        "h": real.hgetall("h"),
        "l": real.lrange("l", 0, -1),
        "set": sorted(real.smembers("set")),
        "x": real.xrange("x"),
    }
    ours.close()
    sluice.stop(keep_device=True)
    again = SluiceServe(sluice_bin, sluice.device, create_mib=2048)
    try:
        ours = redis.Redis(port=_resp_port(again), socket_timeout=120)
        assert ours.get("s5") == snapshot["s5"]
        assert ours.hgetall("h") == snapshot["h"]
        assert ours.lrange("l", 0, -1) == snapshot["l"]
        assert sorted(ours.smembers("set")) == snapshot["set"]
        assert ours.xrange("x") == snapshot["x"]
        assert ours.get("s64") is None
        ours.close()
    finally:
        # The module's other tests and its teardown use the restarted one.
        sluice.proc, sluice.banner, sluice.url = again.proc, again.banner, again.url


def test_a_string_of_512_mib_goes_in_and_comes_back_whole(servers):
    sluice, _ = servers
    ours = redis.Redis(port=_resp_port(sluice), socket_timeout=300)
    value = _value(13, 512 * MIB)
    assert ours.set("max", value) is True
    assert ours.strlen("max") == 512 * MIB
    got = ours.get("max")
    assert got == value, "the longest string Redis takes reads back byte for byte"
    del got
    assert ours.delete("max") == 1
    ours.close()


def _http(url, method="GET", body=None, ctype="application/json"):
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, json.load(r)


def test_documents_of_megabytes_and_a_bulk_with_large_items(servers):
    sluice, _ = servers
    url = sluice.url
    text = "z" * (5 * MIB)
    status, _ = _http(f"{url}/big/_doc/1", "PUT", json.dumps({"text": text}).encode())
    assert status == 201
    status, doc = _http(f"{url}/big/_doc/1")
    assert status == 200 and doc["_source"]["text"] == text
    forty = {"blob": "q" * (40 * MIB), "n": 7}
    status, _ = _http(f"{url}/big/_doc/2", "PUT", json.dumps(forty).encode())
    assert status == 201
    _, doc = _http(f"{url}/big/_doc/2")
    assert doc["_source"] == forty
    lines = []
    for i in range(400):
        lines.append(json.dumps({"index": {"_index": "bulk", "_id": str(i)}}))
        size = MIB if i % 100 == 7 else 100
        lines.append(json.dumps({"n": i, "text": chr(97 + i % 26) * size}))
    body = ("\n".join(lines) + "\n").encode()
    status, res = _http(f"{url}/_bulk?refresh=true", "POST", body, "application/x-ndjson")
    assert status == 200 and res["errors"] is False, [i for i in res["items"] if "error" in i["index"]][:2]
    assert [i["index"]["status"] for i in res["items"]] == [201] * 400
    _, count = _http(f"{url}/bulk/_count")
    assert count["count"] == 400
    _, doc = _http(f"{url}/bulk/_doc/207")
    assert doc["_source"] == {"n": 207, "text": chr(97 + 207 % 26) * MIB}


def test_a_bulk_that_writes_a_large_document_then_changes_it(servers):
    """A document of 1 MiB or more is written from where the request holds
    it, after the other operations of its store batch: an operation later
    in the same `_bulk` on its id must still see it, and win over it."""
    sluice, _ = servers
    url = sluice.url
    big = "w" * (2 * MIB)
    ops = [
        ({"index": {"_index": "same", "_id": "x"}}, {"text": big, "n": 1}),
        ({"update": {"_index": "same", "_id": "x"}}, {"doc": {"n": 2}}),
        ({"index": {"_index": "same", "_id": "y"}}, {"text": big}),
        ({"delete": {"_index": "same", "_id": "y"}}, None),
        ({"index": {"_index": "same", "_id": "z"}}, {"text": big}),
        ({"index": {"_index": "same", "_id": "z"}}, {"text": "small"}),
        ({"create": {"_index": "same", "_id": "z"}}, {"text": big}),
    ]
    lines = []
    for action, source in ops:
        lines.append(json.dumps(action))
        if source is not None:
            lines.append(json.dumps(source))
    body = ("\n".join(lines) + "\n").encode()
    status, res = _http(f"{url}/_bulk?refresh=true", "POST", body, "application/x-ndjson")
    assert status == 200
    got = [(next(iter(i)), i[next(iter(i))]["status"]) for i in res["items"]]
    assert got == [
        ("index", 201), ("update", 200), ("index", 201), ("delete", 200),
        ("index", 201), ("index", 200), ("create", 409),
    ], got
    _, doc = _http(f"{url}/same/_doc/x")
    assert doc["_version"] == 2 and doc["_source"] == {"text": big, "n": 2}
    try:
        _http(f"{url}/same/_doc/y")
        raise AssertionError("y was deleted in the same bulk")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    _, doc = _http(f"{url}/same/_doc/z")
    assert doc["_version"] == 2 and doc["_source"] == {"text": "small"}
    _, count = _http(f"{url}/same/_count")
    assert count["count"] == 2


def _short(v):
    if isinstance(v, bytes) and len(v) > 40:
        return f"<{len(v)} bytes>"
    if isinstance(v, list):
        return [_short(x) for x in v]
    return v
