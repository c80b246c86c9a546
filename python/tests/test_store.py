"""The embedded store from Python: writes, reads, snapshots, scans, errors."""

import pyarrow as pa
import pytest

import sluice


@pytest.fixture
def store(tmp_path):
    with sluice.Store(tmp_path / "kv.dev", create_mib=64) as s:
        yield s


def test_put_get_delete_and_batches_round_trip(store):
    store.put(b"a", b"1")
    store.put("b", "two")
    assert store.get("a") == b"1" and store.get(b"b") == b"two"
    assert store.get("missing") is None
    store.delete("a")
    assert store.get("a") is None
    seq = store.write_batch([("c", b"3"), ("d", b"4"), ("b", None)])
    assert seq > 0
    assert [k for k, _ in store.scan()] == [b"c", b"d"]


def test_a_reopened_store_holds_every_acknowledged_write(tmp_path):
    path = tmp_path / "kv.dev"
    with sluice.Store(path, create_mib=64) as s:
        s.keyspace("docs", format="json")
        s.write_batch([(f"k{i:04}", {"n": i, "s": "é\u0000x"}) for i in range(500)], keyspace="docs")
    # create_mib on an existing store opens it; nothing is erased.
    with sluice.Store(path, create_mib=64) as s:
        rows = list(s.scan("docs"))
        assert len(rows) == 500
        assert rows[7] == (b"k0007", '{"n":7,"s":"é\\u0000x"}'.encode())


def test_a_dropped_keyspace_is_gone_and_its_name_free(tmp_path):
    path = tmp_path / "kv.dev"
    with sluice.Store(path, create_mib=64) as s:
        s.keyspace("tmp", format="json")
        s.write_batch([(f"k{i}", {"n": i}) for i in range(100)], keyspace="tmp")
        s.drop_keyspace("tmp")
        assert "tmp" not in s.keyspaces()
        with pytest.raises(sluice.Error, match="tmp"):
            s.get("k1", keyspace="tmp")
        with pytest.raises(sluice.Error, match="nope"):
            s.drop_keyspace("nope")
        s.keyspace("tmp", format="raw")
        s.put("fresh", b"1", keyspace="tmp")
    with sluice.Store(path) as s:
        assert [k for k, _ in s.scan("tmp")] == [b"fresh"]


def test_scan_takes_prefixes_ranges_reverse_limits_and_snapshots(store):
    store.write_batch([(f"p{i}", str(i)) for i in range(10)] + [("q1", "x")])
    assert [k for k, _ in store.scan(prefix="p", limit=3)] == [b"p0", b"p1", b"p2"]
    assert [k for k, _ in store.scan(start="p5", end="p8")] == [b"p5", b"p6", b"p7"]
    assert [k for k, _ in store.scan(reverse=True, limit=2)] == [b"q1", b"p9"]
    with store.snapshot() as snap:
        store.put("p0", "changed")
        store.put("p99", "new")
        assert snap.get("p0") == b"0"
        assert [k for k, _ in store.scan(prefix="p", snapshot=snap)][-1] == b"p9"
    assert store.get("p0") == b"changed"
    with pytest.raises(sluice.QueryError, match="not both"):
        store.scan(prefix="p", start="a")


def test_record_keyspaces_check_values_and_come_back_typed(store):
    store.keyspace("people", format="record", schema="name:str,born:u32,score:f64")
    store.put("ada", {"name": "Ada", "born": 1815, "score": 9.5}, keyspace="people")
    with pytest.raises(sluice.QueryError, match="born"):
        store.put("bad", {"name": "X", "born": "soon", "score": 1.0}, keyspace="people")
    t = store.query("people")
    assert t.schema.field("born").type == pa.uint32()
    assert t.to_pylist() == [{"_key": b"ada", "name": "Ada", "born": 1815, "score": 9.5}]
    # The same keyspace asked for again is returned; a different definition is refused.
    assert store.keyspace("people", format="record", schema="name:str,born:u32,score:f64") >= 0
    with pytest.raises(sluice.QueryError, match="exists"):
        store.keyspace("people", format="json")


def test_bad_input_raises_clear_python_exceptions(tmp_path, store):
    with pytest.raises(sluice.NotFoundError, match="create_mib"):
        sluice.Store(tmp_path / "nothing.dev")
    with pytest.raises(TypeError, match="bytes or str"):
        store.put(42, b"x")
    with pytest.raises(TypeError, match="raw values"):
        store.put("k", {"a": 1})
    with pytest.raises(sluice.NotFoundError, match="unknown keyspace"):
        store.get("k", keyspace="nope")
    with pytest.raises(sluice.QueryError, match="unknown value format"):
        store.keyspace("x", format="yaml")
    store.keyspace("docs", format="json")
    with pytest.raises(sluice.QueryError, match="column"):
        store.query("docs", where="year >")
    with pytest.raises(sluice.QueryError):
        store.query("docs", select=[])
    with pytest.raises(TypeError, match="unexpected keyword argument .wher."):
        store.query("docs", wher="a = 1")
    with pytest.raises(TypeError):
        store.query_batches("docs", limit="ten")
    with pytest.raises(sluice.QueryError, match="types"):
        store.query("docs", select=["a"], types={"a": "decimal"})
    not_a_store = tmp_path / "zeros.dev"
    not_a_store.write_bytes(b"\0" * (1 << 20))
    with pytest.raises(sluice.Error, match="not a Sluice store"):
        sluice.Store(not_a_store)
    store.close()
    with pytest.raises(sluice.Error, match="closed"):
        store.get("k")
    assert issubclass(sluice.CorruptError, sluice.Error)


def test_a_damaged_table_block_raises_corrupt_error(tmp_path):
    path = tmp_path / "kv.dev"
    with sluice.Store(path, create_mib=64) as s:
        s.write_batch([(f"k{i:05}", b"v" * 200) for i in range(5000)])
        s.flush()
        s.compact()
    data = bytearray(path.read_bytes())
    # Flip bytes across the table region (past the WAL ring); one of the
    # scans below must meet a block whose checksum fails.
    for off in range(8 << 20, 12 << 20, 4096):
        data[off + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(sluice.CorruptError):
        with sluice.Store(path) as s:
            for _ in s.scan():
                pass


def test_a_store_is_open_in_one_process_at_a_time(tmp_path):
    import threading

    path = tmp_path / "kv.dev"
    first = sluice.Store(path, create_mib=64)
    first.put("k", "v")
    with pytest.raises(sluice.Error, match="in use"):
        sluice.Store(path, lock_timeout_s=0)
    threading.Timer(0.3, first.close).start()
    with sluice.Store(path, lock_timeout_s=30) as second:
        assert second.get("k") == b"v"
    with pytest.raises(sluice.QueryError, match="lock_timeout_s"):
        sluice.Store(path, lock_timeout_s=-1)
    with sluice.Store(path, block_cache_mib=16) as third:
        assert third.get("k") == b"v"
