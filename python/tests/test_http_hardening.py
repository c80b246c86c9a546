"""`sluice serve --http` against clients that mean harm or are merely slow:
crafted chunk sizes, senders that trickle, bodies sent before credentials,
and clients from beyond loopback while the API has no users (protected
mode). A client "from elsewhere" is a socket bound to 127.0.0.2; test
traffic never leaves the loopback range."""

import base64
import http.client
import json
import socket
import threading
import time

import opensearchpy
from conftest import SluiceServe


def port_of(server):
    return int(server.url.rsplit(":", 1)[1])


def raw(port, data, source="127.0.0.1", timeout=10, until=None):
    """Sends bytes and reads until the server closes, or (`until`) until
    the reply holds those bytes; (reply, seconds)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(data)
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
                if until is not None and until in got:
                    break
        except (ConnectionResetError, socket.timeout):
            pass
    return got, time.monotonic() - started


def get(port, path="/", source="127.0.0.1", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, json.loads(body) if body else None


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def secret_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


CRAFTED = (b"POST /idx/_doc/1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n")


def test_a_crafted_chunk_size_is_refused_and_takes_no_slot(tmp_path, sluice_bin):
    """Chunk `1` then a chunk of 2^64 - 1 bytes: the length arithmetic
    wrapped, the connection's thread panicked and its slot was never given
    back; 20 of them and every later client got 429."""
    s = SluiceServe(sluice_bin, tmp_path / "c.dev", extra=["--http-max-connections", "16"])
    port = port_of(s)
    # Each client leaves once it has the reply's head: the server's
    # lingering close (2 s for a sender whose body it refused) ends then,
    # and its slot must come back for the 17th to be served.
    for _ in range(20):
        reply, _ = raw(port, CRAFTED, until=b"\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    status, body = get(port)
    assert status == 200 and body["tagline"] == "You Know, for Search"
    c = opensearchpy.OpenSearch(s.url)
    c.index(index="idx", id="1", body={"a": 1}, refresh=True)
    assert c.count(index="idx")["count"] == 1
    s.stop()


def test_a_sender_that_trickles_is_cut_at_the_request_deadline(tmp_path, sluice_bin):
    """Each read waited its own timeout, so one byte every half second held
    a slot for ever; now the request as a whole has a deadline."""
    s = SluiceServe(sluice_bin, tmp_path / "t.dev",
                    extra=["--http-max-connections", "2", "--http-request-timeout-secs", "2"])
    port = port_of(s)
    ended = []

    def trickle():
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")
            try:
                for _ in range(60):
                    sock.sendall(b"X-Slow: 1\r\n")
                    time.sleep(0.5)
            except (BrokenPipeError, ConnectionResetError):
                pass
        ended.append(time.monotonic() - started)

    slow = [threading.Thread(target=trickle) for _ in range(2)]
    for t in slow:
        t.start()
    for t in slow:
        t.join(timeout=40)
    assert len(ended) == 2 and max(ended) < 10, ended
    # The two slots are back.
    for _ in range(3):
        assert get(port)[0] == 200
    s.stop()


def test_no_body_is_read_before_the_request_is_authorized(tmp_path, sluice_bin):
    users = secret_file(tmp_path, "users", "ann:s3cret\n")
    s = SluiceServe(sluice_bin, tmp_path / "a.dev", extra=["--http-users-file", users])
    port = port_of(s)
    # A large declared body without credentials: answered at once, unread.
    head = b"PUT /i/_doc/1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
    reply, seconds = raw(port, head)
    assert reply.startswith(b"HTTP/1.1 401") and seconds < 5, (reply[:200], seconds)
    # A small one is read and the connection goes on to a request with
    # credentials.
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("PUT", "/i/_doc/1", body=b'{"a": 1}', headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 401 and json.loads(r.read())["error"]["type"] == "security_exception"
    c.request("PUT", "/i/_doc/1", body=b'{"a": 1}', headers={"Content-Type": "application/json", **basic("ann", "s3cret")})
    r = c.getresponse()
    assert r.status == 201, r.read()
    r.read()
    c.close()
    s.stop()


def test_protected_mode_serves_loopback_and_refuses_others_without_users(tmp_path, sluice_bin):
    s = SluiceServe(sluice_bin, tmp_path / "p.dev", http="0.0.0.0:0")
    port = port_of(s)
    assert any("protected mode" in line and "403" in line for line in s.banner), s.banner
    status, body = get(port, source="127.0.0.2")
    assert status == 403 and body["error"]["type"] == "security_exception", body
    assert "--http-users-file" in body["error"]["reason"]
    assert get(port)[0] == 200
    # The refusal reads no body and keeps nothing: the index does not exist.
    reply, _ = raw(port, b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", source="127.0.0.2")
    assert reply.startswith(b"HTTP/1.1 403")
    assert get(port, "/x")[0] == 404
    s.stop()

    users = secret_file(tmp_path, "users", "ann:s3cret\n")
    s = SluiceServe(sluice_bin, tmp_path / "u.dev", http="0.0.0.0:0", extra=["--http-users-file", users])
    port = port_of(s)
    assert not any("protected mode" in line for line in s.banner), s.banner
    assert get(port, source="127.0.0.2")[0] == 401
    assert get(port, source="127.0.0.2", headers=basic("ann", "wrong"))[0] == 401
    status, body = get(port, source="127.0.0.2", headers=basic("ann", "s3cret"))
    assert status == 200 and body["tagline"] == "You Know, for Search"
    s.stop()

    s = SluiceServe(sluice_bin, tmp_path / "n.dev", http="0.0.0.0:0", extra=["--protected-mode", "no"])
    assert any("WARNING" in line for line in s.banner), s.banner
    assert get(port_of(s), source="127.0.0.2")[0] == 200
    s.stop()


def test_graph_requests_are_held_to_the_servers_memory_budget(tmp_path, sluice_bin):
    """`memory_mib` was taken up to 1 TiB and `threads` up to 256 from any
    request."""
    s = SluiceServe(sluice_bin, tmp_path / "g.dev", extra=["--http-native-memory-mib", "64"])
    c = http.client.HTTPConnection("127.0.0.1", port_of(s), timeout=30)
    for asked in [65, 1 << 20]:
        c.request("POST", "/_sluice/graph/bc", body=json.dumps({"memory_mib": asked}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 400 and "[memory_mib] must be a number from 1 to 64" in body["error"]["reason"], body
    c.close()
    s.stop()


def test_a_full_device_blocks_writes_as_elasticsearchs_flood_stage_and_deleting_an_index_frees_it(tmp_path, sluice_bin):
    server = SluiceServe(sluice_bin, tmp_path / "serve.dev", create_mib=64,
                         extra=("--write-buffer-mib", "4", "--table-mib", "4"))
    try:
        client = opensearchpy.OpenSearch(server.url, timeout=60)
        client.indices.create(index="filler")
        client.indices.create(index="kept")
        client.index(index="kept", id="1", body={"n": 1}, refresh=True)
        text = "x" * 16000
        indexed, refused, single_refused = 0, None, None
        # Filled until a bulk is refused and a single write after it too: a
        # compaction installs its outputs before it frees its inputs, so the
        # first refusal may come from that dip, after which the room is back
        # (free space above the reserve and half of it again) and the next
        # write rightly taken; once the device is full, both are refused.
        for round_no in range(200):
            body = []
            for i in range(64):
                body.append({"index": {"_index": "filler", "_id": f"{round_no}-{i}"}})
                body.append({"text": text})
            answer = client.bulk(body=body)
            refused_now = None
            for item in answer["items"]:
                result = item["index"]
                if result["status"] in (200, 201):
                    indexed += 1
                elif refused_now is None:
                    refused_now = result
            if not refused_now:
                continue
            refused = refused_now
            try:
                client.index(index="kept", id="2", body={"n": 2})
            except opensearchpy.TransportError as e:
                single_refused = e
                break
        assert refused, f"{indexed} documents of 16 KB on a 64 MiB device and no refusal"
        assert refused["status"] == 429, refused
        assert refused["error"]["type"] == "cluster_block_exception", refused
        assert "read-only-allow-delete" in refused["error"]["reason"], refused
        # Past the reserve's watermark ("device nearly full"), or, on a
        # loaded machine where compactions leave the free room in pieces,
        # a write that found no extent long enough ("device full: N blocks
        # needed, largest free extent M"): both name the device.
        reason = refused["error"]["reason"]
        assert "device nearly full" in reason or "device full" in reason, refused
        # A single document write past the flood stage is refused the same way.
        assert single_refused is not None, "a write past the flood stage was taken"
        assert single_refused.status_code == 429, single_refused
        # Reads go on.
        assert client.get(index="kept", id="1")["_source"] == {"n": 1}
        # Deleting the index that filled the device brings the room back.
        client.indices.delete(index="filler")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.index(index="kept", id="2", body={"n": 2}, refresh=True)
                break
            except opensearchpy.TransportError as e:
                assert e.status_code == 429 and time.monotonic() < deadline, e
                time.sleep(0.2)
        server.stop(keep_device=True)
        server = SluiceServe(sluice_bin, tmp_path / "serve.dev", create_mib=64)
        client = opensearchpy.OpenSearch(server.url, timeout=60)
        assert client.count(index="kept")["count"] == 2
        assert not client.indices.exists(index="filler")
    finally:
        if server.proc.poll() is None:
            server.stop()


def test_a_native_query_answer_is_held_to_a_quarter_of_the_memory_budget(tmp_path, sluice_bin):
    """`/_sluice/query` built its whole answer in memory, up to 100,000 rows
    as JSON and 10,000,000 as Arrow, whatever their size."""
    server = SluiceServe(sluice_bin, tmp_path / "q.dev", extra=("--http-native-memory-mib", "8"))
    try:
        client = opensearchpy.OpenSearch(server.url, timeout=60)
        body = []
        for i in range(300):
            body.append({"index": {"_index": "big", "_id": str(i)}})
            body.append({"n": i, "text": "y" * 20000})
        assert not client.bulk(body=body, refresh=True)["errors"]
        c = http.client.HTTPConnection("127.0.0.1", port_of(server), timeout=60)

        def query(q, accept=None):
            headers = {"Content-Type": "application/json"}
            if accept:
                headers["Accept"] = accept
            c.request("POST", "/_sluice/query", body=json.dumps(q), headers=headers)
            r = c.getresponse()
            return r.status, r.read()

        for accept in (None, "application/vnd.apache.arrow.stream"):
            status, raw = query({"index": "big"}, accept)
            answer = json.loads(raw)
            assert status == 429, (accept, status, raw[:200])
            assert answer["error"]["type"] == "circuit_breaking_exception", answer
            assert "the answer passed [2097152] bytes" in answer["error"]["reason"], answer
        status, raw = query({"index": "big", "limit": 20})
        assert status == 200 and len(json.loads(raw)["rows"]) == 20
        status, raw = query({"index": "big", "limit": 20}, "application/vnd.apache.arrow.stream")
        assert status == 200
        c.close()
    finally:
        if server.proc.poll() is None:
            server.stop()


def pki(d):
    """A CA, a server certificate for 127.0.0.1 and a client certificate
    signed by it, and a client certificate of another CA (openssl)."""
    import subprocess

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca, name in [("ca", "Sluice test CA"), ("other-ca", "Another CA")]:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN={name}")
    (d / "server.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "client.cnf").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, ca, ext in [("server", "ca", "server.cnf"), ("client", "ca", "client.cnf"),
                          ("stranger", "other-ca", "client.cnf")]:
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext)


def test_elasticsearch_py_with_a_client_certificate_and_without(tmp_path, sluice_bin):
    """`--tls-ca-cert` on the HTTP API: elasticsearch-py, unmodified, is
    served with a certificate the CA signed, and refused without one or
    with another CA's."""
    import elasticsearch

    pki(tmp_path)
    f = lambda name: str(tmp_path / name)
    server = SluiceServe(sluice_bin, tmp_path / "tls.dev",
                         extra=("--http-tls", "--tls-cert", f("server.pem"), "--tls-key", f("server.key"),
                                "--tls-ca-cert", f("ca.pem")))
    try:
        assert server.url.startswith("https://"), server.url

        def client(cert):
            extra = {"client_cert": f(f"{cert}.pem"), "client_key": f(f"{cert}.key")} if cert else {}
            return elasticsearch.Elasticsearch(server.url, ca_certs=f("ca.pem"), verify_certs=True,
                                               request_timeout=30, max_retries=0, **extra)

        es = client("client")
        es.index(index="tls", id="1", document={"n": 1}, refresh=True)
        assert es.get(index="tls", id="1")["_source"] == {"n": 1}
        for cert in (None, "stranger"):
            try:
                client(cert).info()
                raise AssertionError(f"served a client with {cert or 'no'} certificate")
            except elasticsearch.ConnectionError:
                pass
    finally:
        if server.proc.poll() is None:
            server.stop()
