"""`sluice serve --http` as a server: what survives a restart and a kill -9,
basic auth, gzip, scroll contexts and their expiry, limits, malformed input
and idle connections."""

import gzip
import json
import os
import signal
import subprocess
import socket
import time
import urllib.error
import urllib.request

import opensearchpy
import opensearchpy.helpers
import pytest
from conftest import SluiceServe


def call(url, method, path, body=None, headers=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            if r.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            return r.status, json.loads(raw) if raw else None, r.headers
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None, e.headers


def test_documents_mappings_and_versions_survive_a_restart(tmp_path, sluice_bin):
    dev = tmp_path / "s.dev"
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    c.indices.create(index="keep", body={"settings": {"number_of_shards": 2}, "mappings": {"properties": {"v": {"type": "keyword"}}}})
    opensearchpy.helpers.bulk(c, ({"_index": "keep", "_id": str(i), "_source": {"v": str(i)}} for i in range(1000)))
    c.index(index="keep", id="7", body={"v": "seven"})
    c.indices.create(index="gone")
    c.index(index="gone", id="x", body={"a": 1})
    c.indices.delete(index="gone")
    s.stop(keep_device=True)
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    assert c.count(index="keep")["count"] == 1000
    doc = c.get(index="keep", id="7")
    assert doc["_source"] == {"v": "seven"} and doc["_version"] == 2
    assert c.indices.get_mapping(index="keep")["keep"]["mappings"]["properties"]["v"]["type"] == "keyword"
    assert c.indices.get_settings(index="keep")["keep"]["settings"]["index"]["number_of_shards"] == "2"
    assert not c.indices.exists(index="gone")
    # A write after the restart gets a sequence number above every earlier one.
    r = c.index(index="keep", id="8", body={"v": "eight"})
    assert r["_seq_no"] > doc["_seq_no"]
    s.stop()


def test_acknowledged_bulk_items_survive_kill_9(tmp_path, sluice_bin):
    dev = tmp_path / "k.dev"
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    acked = set()
    for batch in range(20):
        ok, _ = opensearchpy.helpers.bulk(c, ({"_index": "k", "_id": f"{batch}-{i}", "_source": {"i": i}} for i in range(200)))
        assert ok == 200
        acked.update(f"{batch}-{i}" for i in range(200))
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    got = {h["_id"] for h in opensearchpy.helpers.scan(c, index="k", size=1000)}
    assert acked <= got
    s.stop()


def test_basic_auth(tmp_path, sluice_bin):
    users = tmp_path / "users"
    users.write_text("ann:s3cret\n")
    users.chmod(0o600)
    s = SluiceServe(sluice_bin, tmp_path / "a.dev", extra=["--http-users-file", str(users)])
    status, body, headers = call(s.url, "GET", "/")
    assert status == 401 and body["error"]["type"] == "security_exception"
    assert headers.get("WWW-Authenticate", "").startswith("Basic")
    c = opensearchpy.OpenSearch(s.url, http_auth=("ann", "s3cret"))
    assert c.info()["version"]["number"]
    bad = opensearchpy.OpenSearch(s.url, http_auth=("ann", "wrong"))
    with pytest.raises(opensearchpy.AuthenticationException):
        bad.info()
    s.stop()


def test_indices_can_be_created_and_deleted_without_end(sluice_http):
    """A store holds 1024 keyspaces at once; a deleted index gives its two
    back, so creating and deleting goes on past that (600 rounds)."""
    c = opensearchpy.OpenSearch(sluice_http.url)
    for i in range(600):
        c.indices.create(index="cycle")
        c.index(index="cycle", id="1", body={"round": i})
        assert c.count(index="cycle")["count"] == 1
        c.indices.delete(index="cycle")
    assert not c.indices.exists(index="cycle")


def test_counts_and_size_0_searches_are_cached_until_the_next_write(sluice_http):
    c = opensearchpy.OpenSearch(sluice_http.url)
    opensearchpy.helpers.bulk(c, ({"_index": "rc", "_id": str(i), "_source": {"v": i % 7, "t": "x"}} for i in range(2000)))
    body = {"query": {"range": {"v": {"gte": 3}}}}
    aggs = {"size": 0, "query": body["query"], "aggs": {"by_v": {"terms": {"field": "v"}}, "s": {"stats": {"field": "v"}}}}

    def cache():
        return call(sluice_http.url, "GET", "/_sluice/stats")[1]["request_cache"]

    before = cache()
    first = c.count(index="rc", body=body)["count"]
    first_aggs = c.search(index="rc", body=aggs)
    assert c.count(index="rc", body=body)["count"] == first == sum(1 for i in range(2000) if i % 7 >= 3)
    again = c.search(index="rc", body=aggs)
    assert again["aggregations"] == first_aggs["aggregations"]
    assert again["hits"]["total"] == first_aggs["hits"]["total"]
    after = cache()
    assert after["hits"] - before["hits"] == 2 and after["misses"] - before["misses"] == 2, (before, after)
    # request_cache=false neither reads nor fills it.
    assert c.count(index="rc", body=body, params={"request_cache": "false"})["count"] == first
    assert cache()["hits"] == after["hits"]
    # A write is seen by the very next count and aggregation.
    c.index(index="rc", id="new", body={"v": 6})
    assert c.count(index="rc", body=body)["count"] == first + 1
    buckets = {b["key"]: b["doc_count"] for b in c.search(index="rc", body=aggs)["aggregations"]["by_v"]["buckets"]}
    assert buckets[6] == sum(1 for i in range(2000) if i % 7 == 6) + 1
    # Counting while writes go on: the count after the last write has all of them.
    import threading
    done = threading.Event()

    def writer():
        for i in range(200):
            c.index(index="rc", id=f"w{i}", body={"v": 5})
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    while not done.is_set():
        c.count(index="rc", body=body)
    t.join()
    assert c.count(index="rc", body=body)["count"] == first + 1 + 200


def test_counts_and_aggregations_come_from_field_columns_and_follow_writes(tmp_path, sluice_bin):
    dev = tmp_path / "c.dev"
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    docs = {str(i): {"venue": ["A", "B", "C"][i % 3], "year": 2000 + i % 20} for i in range(3000)}
    opensearchpy.helpers.bulk(c, ({"_index": "col", "_id": k, "_source": v} for k, v in docs.items()))
    query = {"bool": {"filter": [{"term": {"venue": "B"}}, {"range": {"year": {"gte": 2010}}}]}}
    body = {"size": 0, "track_total_hits": True, "query": query,
            "aggs": {"v": {"terms": {"field": "venue"}}, "y": {"stats": {"field": "year"}}}}
    nc = {"request_cache": "false"}

    def columns():
        return call(s.url, "GET", "/_sluice/stats")[1]["columns"]["indices"]["col"]

    def expect():
        hits = [d for d in docs.values() if d["venue"] == "B" and d["year"] >= 2010]
        return len(hits), sum(d["year"] for d in hits)

    def check():
        n, total_years = expect()
        assert c.count(index="col", body={"query": query}, params=nc)["count"] == n
        r = c.search(index="col", body=body, params=nc)
        assert r["hits"]["total"]["value"] == n
        assert r["aggregations"]["y"]["count"] == n and r["aggregations"]["y"]["sum"] == total_years
        assert [b["key"] for b in r["aggregations"]["v"]["buckets"]] == (["B"] if n else [])

    assert columns()["answers"] == 0
    check()
    first = columns()
    assert first["fields"] == 2 and first["docs"] == 3000 and first["builds"] == 1 and first["answers"] == 2, first
    # Writes, updates and deletes are seen by the next answer, with no new build.
    for i in range(0, 300, 3):
        docs[str(i)] = {"venue": "B", "year": 2019}
        c.index(index="col", id=str(i), body=docs[str(i)])
    for i in range(1, 300, 3):
        del docs[str(i)]
        c.delete(index="col", id=str(i))
    c.update(index="col", id="2", body={"doc": {"venue": "B"}})
    docs["2"]["venue"] = "B"
    check()
    later = columns()
    assert later["builds"] == 1 and later["answers"] == 4 and later["docs"] == len(docs), later
    # Only which fields had columns is kept: a restart builds them again
    # in the background, before any count asks.
    s.stop(keep_device=True)
    s = SluiceServe(sluice_bin, dev)
    c = opensearchpy.OpenSearch(s.url)
    deadline = time.monotonic() + 30
    while columns()["fields"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert columns()["fields"] == 2 and columns()["builds"] == 1 and columns()["answers"] == 0
    check()
    assert columns()["builds"] == 1 and columns()["docs"] == len(docs) and columns()["answers"] == 2
    s.stop(keep_device=True)
    # Without room for columns every answer scans, and is the same.
    s = SluiceServe(sluice_bin, dev, extra=("--http-columns-mib", "0"))
    c = opensearchpy.OpenSearch(s.url)
    check()
    assert columns()["answers"] == 0 and columns()["fields"] == 0
    s.stop()


def test_a_point_in_time_counts_what_its_snapshot_holds(sluice_http):
    c = opensearchpy.OpenSearch(sluice_http.url)
    opensearchpy.helpers.bulk(c, ({"_index": "pitc", "_id": str(i), "_source": {"v": i}} for i in range(100)))
    pit = call(sluice_http.url, "POST", "/pitc/_pit?keep_alive=1m")[1]["id"]
    opensearchpy.helpers.bulk(c, ({"_index": "pitc", "_id": f"n{i}", "_source": {"v": i}} for i in range(50)))
    body = {"size": 0, "track_total_hits": True, "query": {"range": {"v": {"gte": 10}}}, "pit": {"id": pit}}
    assert call(sluice_http.url, "POST", "/_search", body)[1]["hits"]["total"]["value"] == 90
    assert c.count(index="pitc", body={"query": body["query"]})["count"] == 90 + 40
    call(sluice_http.url, "DELETE", "/_pit", {"id": pit})


def test_gzip_bodies_both_ways(sluice_http):
    body = "\n".join(json.dumps(x) for i in range(300) for x in ({"index": {"_index": "gz", "_id": str(i)}}, {"t": "x" * 50})) + "\n"
    status, r, _ = call(sluice_http.url, "POST", "/_bulk", gzip.compress(body.encode()), {"Content-Encoding": "gzip", "Content-Type": "application/x-ndjson"})
    assert status == 200 and not r["errors"] and len(r["items"]) == 300
    status, r, headers = call(sluice_http.url, "POST", "/gz/_search", {"size": 100}, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip" and len(r["hits"]["hits"]) == 100


def test_sliced_scroll_reads_everything_once_then_clears_and_expires(sluice_http):
    c = opensearchpy.OpenSearch(sluice_http.url)
    opensearchpy.helpers.bulk(c, ({"_index": "sc", "_id": f"d{i}", "_source": {"i": i}} for i in range(2500)))
    seen = []
    ids = []
    for s in range(3):
        r = c.search(index="sc", scroll="1m", body={"slice": {"id": s, "max": 3}, "size": 300, "sort": ["_doc"]})
        while r["hits"]["hits"]:
            seen += [h["_id"] for h in r["hits"]["hits"]]
            r = c.scroll(scroll_id=r["_scroll_id"], scroll="1m")
        ids.append(r["_scroll_id"])
    assert sorted(seen) == sorted(f"d{i}" for i in range(2500))
    assert c.clear_scroll(body={"scroll_id": ids})["num_freed"] == 3
    r = c.search(index="sc", scroll="1s", body={"size": 10})
    time.sleep(1.5)
    with pytest.raises(opensearchpy.NotFoundError):
        c.scroll(scroll_id=r["_scroll_id"], scroll="1s")
    status, body, _ = call(sluice_http.url, "POST", "/sc/_search?scroll=2d", {"size": 1})
    # Refused by the shards, as Elasticsearch refuses it.
    assert status == 400 and "search.max_keep_alive" in body["error"]["root_cause"][0]["reason"]


def test_malformed_input_gets_errors_and_the_server_stays_up(sluice_http):
    url = sluice_http.url
    status, body, _ = call(url, "POST", "/mal/_doc/1", b'{"a":')
    assert status == 400 and body["error"]["type"] == "mapper_parsing_exception"
    status, body, _ = call(url, "POST", "/_search", b"{not json")
    assert status == 400 and body["error"]["type"] == "x_content_parse_exception"
    status, body, _ = call(url, "POST", "/_bulk", b'{"index":{"_index":"mal"}}\n')
    assert status == 400
    status, body, _ = call(url, "GET", "/mal/_nothing_here")
    assert status == 400 and "no handler found" in body["error"]["reason"]
    host, port = url[len("http://"):].split(":")
    for garbage in [b"\x00\x01\x02garbage\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"]:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(garbage)
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 4"), reply[:100]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PUT /mal/_doc/2 HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\"")
    # Nothing half-sent was stored, and the server answers.
    status, body, _ = call(url, "GET", "/mal/_doc/2")
    assert status == 404 and body == {"_index": "mal", "_id": "2", "found": False}


def test_a_body_over_the_limit_is_refused(tmp_path, sluice_bin):
    s = SluiceServe(sluice_bin, tmp_path / "l.dev", extra=["--http-max-content-mib", "1"])
    status, body, _ = call(s.url, "POST", "/big/_doc/1", json.dumps({"x": "y" * (2 << 20)}).encode())
    assert status == 413 and "http.max_content_length" in body["error"]["reason"]
    status, _, _ = call(s.url, "GET", "/")
    assert status == 200
    s.stop()


def test_a_client_still_sending_a_refused_body_reads_the_413(tmp_path, sluice_bin):
    """The refusal comes once the head is read; the client goes on sending
    its body after it. The server reads and drops that body before it
    closes: closing with unread bytes resets the connection, and a reset
    throws away the 413 the client has not read yet."""
    s = SluiceServe(sluice_bin, tmp_path / "r.dev", extra=["--http-max-content-mib", "1"])
    try:
        host, port = s.url[len("http://"):].split(":")
        body = b"y" * (4 << 20)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            head = (f"PUT /big/_doc/1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            c.sendall(head)
            time.sleep(0.3)  # the server has answered and would have closed
            c.sendall(body)
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = c.recv(65536)
                assert chunk, f"closed before the reply: {reply!r}"
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    finally:
        s.stop()


def test_hundreds_of_idle_connections_do_not_stop_service(sluice_http):
    host, port = sluice_http.url[len("http://"):].split(":")
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
    try:
        status, body, _ = call(sluice_http.url, "GET", "/")
        assert status == 200 and body["tagline"] == "You Know, for Search"
    finally:
        for s in idle:
            s.close()


def read_response(sock, buffered=b""):
    """One HTTP response from `sock` (content-length framed): its status,
    body and the bytes read past it."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    return int(head.split(b" ")[1]), rest[:length], rest[length:]


def server_threads(server):
    return len(os.listdir(f"/proc/{server.proc.pid}/task"))


def test_a_thousand_keep_alive_connections_cost_no_thread(sluice_http):
    """Connections are slots on the HTTP ring: a thousand that each made a
    request and stay open add no thread, and the server still answers."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    host, port = sluice_http.url[len("http://"):].split(":")
    before = server_threads(sluice_http)
    conns = []
    try:
        for _ in range(1000):
            c = socket.create_connection((host, int(port)), timeout=30)
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            conns.append(c)
        for c in conns:
            status, body, rest = read_response(c)
            assert status == 200 and rest == b"" and json.loads(body)["tagline"] == "You Know, for Search"
        during = server_threads(sluice_http)
        assert during <= before + 2, f"{before} threads before, {during} with 1,000 connections open"
        # Kept alive: each answers a second request on the same connection.
        for c in conns[::100]:
            c.sendall(b"GET /_cluster/health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body, _ = read_response(c)
            assert status == 200 and json.loads(body)["status"] == "green"
        status, body, _ = call(sluice_http.url, "GET", "/")
        assert status == 200
    finally:
        for c in conns:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_pipelined_requests_are_answered_in_order(sluice_http):
    """Requests sent back to back on one connection, before any answer:
    each is answered, in the order sent, bodies and all; one sent in two
    pieces across another's answer too."""
    host, port = sluice_http.url[len("http://"):].split(":")
    call(sluice_http.url, "PUT", "/piped/_doc/1?refresh=true", {"n": 1})
    body = json.dumps({"query": {"match_all": {}}}).encode()
    count = b"POST /piped/_count HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    root = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    missing = b"GET /piped/_doc/nope HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as c:
        c.sendall(count + root + missing + count[:40])
        answers, rest = [], b""
        for _ in range(3):
            status, payload, rest = read_response(c, rest)
            answers.append((status, json.loads(payload)))
        assert answers[0] == (200, answers[0][1]) and answers[0][1]["count"] == 1
        assert answers[1][0] == 200 and answers[1][1]["tagline"] == "You Know, for Search"
        assert answers[2][0] == 404 and answers[2][1]["found"] is False
        c.sendall(count[40:])
        status, payload, rest = read_response(c, rest)
        assert status == 200 and json.loads(payload)["count"] == 1 and rest == b""


def test_api_keys_and_tls(tmp_path, sluice_bin):
    import base64
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    keys = tmp_path / "keys"
    keys.write_text("k1:topsecret\n")
    keys.chmod(0o600)
    s = SluiceServe(sluice_bin, tmp_path / "t.dev",
                    extra=["--http-tls", "--tls-cert", str(cert), "--tls-key", str(key), "--http-api-keys-file", str(keys)])
    assert s.url.startswith("https://")
    c = opensearchpy.OpenSearch(s.url, ca_certs=str(cert), verify_certs=True,
                                headers={"Authorization": "ApiKey " + base64.b64encode(b"k1:topsecret").decode()})
    c.index(index="tls", id="1", body={"a": 1})
    assert c.get(index="tls", id="1")["_source"] == {"a": 1}
    ctx = ssl.create_default_context(cafile=str(cert))
    req = urllib.request.Request(s.url + "/", headers={"Authorization": "ApiKey " + base64.b64encode(b"k1:wrong").decode()})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, context=ctx, timeout=10)
    assert e.value.code == 401
    # Plain HTTP to the TLS port gets no answer that a client would take.
    host, port = s.url[len("https://"):].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        try:
            assert not sock.recv(100).startswith(b"HTTP/1.1 200")
        except (ConnectionResetError, socket.timeout):
            pass
    s.stop()


def test_point_in_time_slices_over_many_tables_cover_the_index_once(tmp_path, sluice_bin):
    # A small write buffer: the documents land in several tables, and the
    # slices of a point in time read key ranges cut at table boundaries.
    s = SluiceServe(sluice_bin, tmp_path / "p.dev", extra=["--write-buffer-mib", "1"])
    c = opensearchpy.OpenSearch(s.url)
    ids = [f"k{i:06d}" for i in range(30000)]
    opensearchpy.helpers.bulk(c, ({"_index": "many", "_id": i, "_source": {"pad": "x" * 200, "i": n}} for n, i in enumerate(ids)))
    c.indices.flush(index="many")
    # Restarted: the block cache starts empty.
    s.stop(keep_device=True)
    s = SluiceServe(sluice_bin, tmp_path / "p.dev", extra=["--write-buffer-mib", "1"])
    c = opensearchpy.OpenSearch(s.url)
    tables = sum(call(s.url, "GET", "/_sluice/stats")[1]["store"]["tables_per_level"])
    assert tables >= 4, tables
    pit = c.create_pit(index="many", params={"keep_alive": "1m"})["pit_id"]
    c.index(index="many", id="later", body={"i": -1})
    seen = []
    per_slice = []
    slices = []
    for sl in range(4):
        after, n = None, 0
        slices.append([])
        while True:
            body = {"pit": {"id": pit}, "size": 1000, "sort": [{"_shard_doc": "asc"}], "slice": {"id": sl, "max": 4}}
            if after:
                body["search_after"] = after
            hits = c.search(body=body)["hits"]["hits"]
            if not hits:
                break
            seen += [h["_id"] for h in hits]
            slices[-1] += [h["_id"] for h in hits]
            n += len(hits)
            after = hits[-1]["sort"]
        per_slice.append(n)
    assert sorted(seen) == ids
    assert min(per_slice) > 0, per_slice
    # Each slice is one key range: slice after slice, in key order.
    assert all(max(slices[i]) < min(slices[i + 1]) for i in range(3))
    # Paging through a point in time reads thousands of blocks from the
    # device and adds none to the block cache (they would only evict what
    # others read); the write's point read above cached its one block.
    cache = call(s.url, "GET", "/_sluice/stats")[1]["store"]["block_cache"]
    assert cache["misses"] > 1000 and cache["used_bytes"] <= 16384, cache
    s.stop()


def test_expect_100_continue_is_answered_at_once(sluice_http):
    # curl sends Expect: 100-continue for bodies over 1 KiB and waits a
    # second for the answer before sending the body.
    host, port = sluice_http.url[len("http://"):].split(":")
    body = json.dumps({"pad": "x" * 5000}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"PUT /cont/_doc/1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        started = time.monotonic()
        interim = sock.recv(100)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and time.monotonic() - started < 0.5
        sock.sendall(body)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 201 Created")
