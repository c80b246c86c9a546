"""Real applications built on Redis, unmodified, against `sluice serve`:
RQ (the job queue) with real worker processes — jobs enqueued before and
while a worker waits on BLPOP, results in streams, failures with their
tracebacks, registries in sorted sets, and the shutdown a worker hears
over pub/sub. scripts/setup installs RQ."""

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
