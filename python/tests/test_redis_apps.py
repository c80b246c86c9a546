"""Real applications built on Redis, unmodified, against `sluice serve`,
each with its own real worker processes: RQ (jobs enqueued before and
while a worker waits on BLPOP, results in streams, failures with their
tracebacks, registries in sorted sets, the shutdown a worker hears over
pub/sub), Celery (kombu's Redis broker and result backend, its Lua
scripts) and Huey (queue, results, and a schedule popped by a Lua
script). scripts/setup installs all three."""

import re
import subprocess
import sys
import time

import pytest
import redis
from rq import Queue
from rq.command import send_shutdown_command
from rq.job import JobStatus

from conftest import SluiceServe

JOBS = """
def add(a, b):
    return a + b

def fail():
    raise ValueError("boom from a job")
"""


@pytest.fixture(scope="module")
def resp_port(tmp_path_factory, sluice_bin):
    server = SluiceServe(sluice_bin, tmp_path_factory.mktemp("apps") / "serve.dev")
    try:
        banner = "".join(server.banner)
        found = re.search(r"Redis protocol \(RESP2/RESP3\) on 127\.0\.0\.1:(\d+)", banner)
        assert found, banner
        yield int(found.group(1))
    finally:
        if server.proc.poll() is None:
            server.stop()


def wait_for(what, check, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(tmp_path, port, name):
    (tmp_path / "rqjobs.py").write_text(JOBS)
    code = (
        "import redis, sys\n"
        "from rq import Queue, Worker\n"
        f"r = redis.Redis(port={port})\n"
        f"Worker([Queue('default', connection=r)], connection=r, name='{name}').work(with_scheduler=False)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rq_workers_run_jobs_and_stop_when_told(resp_port, tmp_path):
    r = redis.Redis(port=resp_port)
    q = Queue("default", connection=r)
    before = [q.enqueue("rqjobs.add", i, i) for i in range(5)]
    failing = q.enqueue("rqjobs.fail")
    worker = start_worker(tmp_path, resp_port, "sluice-test-worker")
    try:
        wait_for("the jobs enqueued before the worker", lambda: all(j.get_status() == JobStatus.FINISHED for j in before))
        assert [j.return_value() for j in before] == [0, 2, 4, 6, 8]
        wait_for("the failing job", lambda: failing.get_status() == JobStatus.FAILED)
        assert "boom from a job" in failing.latest_result().exc_string
        # Jobs enqueued while the worker waits on its queue (BLPOP).
        time.sleep(0.5)
        after = [q.enqueue("rqjobs.add", 10, i) for i in range(20)]
        wait_for("the jobs enqueued while the worker waited", lambda: all(j.get_status() == JobStatus.FINISHED for j in after))
        assert [j.return_value() for j in after] == [10 + i for i in range(20)]
        assert q.finished_job_registry.get_job_count() >= 25
        assert q.failed_job_registry.get_job_count() == 1
        assert q.count == 0
        # The shutdown command goes to the worker over pub/sub.
        send_shutdown_command(r, "sluice-test-worker")
        out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, out
        assert "shutdown" in out.lower(), out
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


CELERY_TASKS = """
import os
from celery import Celery

url = os.environ["BROKER_URL"]
app = Celery("celerytasks", broker=url, backend=url)
app.conf.broker_connection_retry_on_startup = True


@app.task
def add(a, b):
    return a + b


@app.task
def fail():
    raise ValueError("boom from celery")
"""


def test_celery_workers_run_tasks_over_the_redis_broker_and_result_backend(resp_port, tmp_path):
    """Celery (kombu's Redis transport: lists, BRPOP, sorted sets, hashes,
    pub/sub for results, and its Lua scripts) with a real worker process."""
    (tmp_path / "celerytasks.py").write_text(CELERY_TASKS)
    env = {
        "PYTHONPATH": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "BROKER_URL": f"redis://127.0.0.1:{resp_port}/0",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celerytasks", "worker", "--pool=solo", "--loglevel=warning"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        code = (
            "from celerytasks import add, fail\n"
            "results = [add.delay(i, i) for i in range(10)]\n"
            "print([r.get(timeout=30) for r in results])\n"
            "f = fail.delay()\n"
            "try:\n"
            "    f.get(timeout=30)\n"
            "except ValueError as e:\n"
            "    print('raised', e)\n"
        )
        client = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
        )
        assert client.returncode == 0, client.stdout + client.stderr
        assert "[0, 2, 4, 6, 8, 10, 12, 14, 16, 18]" in client.stdout, client.stdout
        assert "raised boom from celery" in client.stdout, client.stdout
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=30)
        assert "EVALSHA" not in out and "unknown command" not in out, out


HUEY_TASKS = """
import os
from huey import RedisHuey

huey = RedisHuey("sluice-test", port=int(os.environ["RESP_PORT"]))


@huey.task()
def mul(a, b):
    return a * b
"""


def test_huey_consumers_run_tasks_now_and_on_schedule(resp_port, tmp_path):
    """Huey: its queue (lists), results (hashes) and schedule (a sorted set
    popped by a Lua script) with a real consumer process."""
    (tmp_path / "hueytasks.py").write_text(HUEY_TASKS)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "RESP_PORT": str(resp_port)}
    consumer = subprocess.Popen(
        [sys.executable, "-m", "huey.bin.huey_consumer", "hueytasks.huey", "-w", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        code = (
            "from hueytasks import mul\n"
            "now = [mul(i, 3) for i in range(5)]\n"
            "print([r.get(blocking=True, timeout=30) for r in now])\n"
            "later = mul.schedule((6, 7), delay=1)\n"
            "print('scheduled', later.get(blocking=True, timeout=30))\n"
        )
        client = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
        )
        assert client.returncode == 0, client.stdout + client.stderr
        assert "[0, 3, 6, 9, 12]" in client.stdout, client.stdout
        assert "scheduled 42" in client.stdout, client.stdout
    finally:
        consumer.terminate()
        out, _ = consumer.communicate(timeout=30)
        assert "Traceback" not in out, out
