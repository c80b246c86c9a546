"""`sluice.shm_pool`: redis-py, unmodified, over `sluice serve --shm`'s
shared-memory rings, the package's own entry point to the transport (the
whole command set over shm is crates/sluice-server/tests/commands_redis.rs;
clients killed mid-batch, crates/sluice-cli/tests/serve.rs)."""

import pytest
import redis  # scripts/setup installs redis-py

import sluice
from conftest import SluiceServe


@pytest.fixture(scope="module")
def sluice_shm(tmp_path_factory, sluice_bin):
    root = tmp_path_factory.mktemp("shm")
    sock = root / "shm.sock"
    server = SluiceServe(sluice_bin, root / "serve.dev", extra=("--shm", str(sock)))
    try:
        yield server, sock
    finally:
        if server.proc.poll() is None:
            server.stop()
        server.device.unlink(missing_ok=True)


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_runs_over_the_shared_memory_rings(sluice_shm, protocol):
    _, sock = sluice_shm
    r = redis.Redis(connection_pool=sluice.shm_pool(sock, protocol=protocol, decode_responses=True))
    r.flushdb()
    assert r.set("k", "v") and r.get("k") == "v"
    assert r.hset("h", mapping={"a": "1", "b": "2"}) == 2
    assert r.hgetall("h") == {"a": "1", "b": "2"}
    pipe = r.pipeline(transaction=False)
    for i in range(200):
        pipe.set(f"p{i}", "x" * i)
    assert all(pipe.execute())
    assert r.mget("p0", "p199", "missing") == ["", "x" * 199, None]
    big = "y" * (3 << 20)
    assert r.set("big", big) and r.get("big") == big
    with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
        r.incr("h")


def test_shm_pool_names_a_missing_socket(tmp_path):
    r = redis.Redis(connection_pool=sluice.shm_pool(tmp_path / "none.sock"))
    with pytest.raises(redis.ConnectionError):
        r.ping()
