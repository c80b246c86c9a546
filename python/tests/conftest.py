"""Fixtures of the Python package's tests: the `sluice` binary (the CLI the
package is checked against), a generated paper store, and a real OpenSearch
started by scripts/search-engine for the export tests."""

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPENSEARCH_PORT = 9270
ELASTICSEARCH_PORT = 9271
ELASTICSEARCH_VERSION = "8.19.7"


def _target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


@pytest.fixture(scope="session")
def sluice_bin() -> Path:
    """The release `sluice` binary, built when missing."""
    path = _target_dir() / "release" / "sluice"
    if not path.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-p", "sluice-cli"], cwd=ROOT, check=True
        )
    return path


def run_cli(sluice_bin: Path, *args: str) -> str:
    out = subprocess.run(
        [str(sluice_bin), *args], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, f"sluice {' '.join(args)} failed: {out.stderr}"
    return out.stdout


@pytest.fixture(scope="session")
def papers_store(tmp_path_factory, sluice_bin) -> Path:
    """A store with the seeded paper database (2,000 papers), written by the CLI."""
    dev = tmp_path_factory.mktemp("papers") / "papers.dev"
    run_cli(sluice_bin, "kv", "--device", str(dev), "format", "--create-mib", "256")
    run_cli(sluice_bin, "papers", "--device", str(dev), "generate", "--papers", "2000", "--seed", "7")
    return dev


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="session")
def opensearch(tmp_path_factory):
    """A real OpenSearch on 127.0.0.1, started for the session and stopped after."""
    home = _target_dir() / "tmp" / "pytest-opensearch"
    env = dict(os.environ, SEARCH_HOME=str(home), SEARCH_PORT=str(OPENSEARCH_PORT))
    script = ROOT / "scripts" / "search-engine"
    start = subprocess.run(
        [str(script), "opensearch", "2.11.1", "start"], env=env, capture_output=True, text=True
    )
    assert start.returncode == 0, f"starting OpenSearch failed: {start.stdout}{start.stderr}"
    url = f"http://127.0.0.1:{OPENSEARCH_PORT}"
    try:
        yield url
    finally:
        subprocess.run([str(script), "opensearch", "2.11.1", "stop"], env=env, capture_output=True)


@pytest.fixture(scope="session")
def elasticsearch(tmp_path_factory):
    """A real Elasticsearch 8 on 127.0.0.1, started for the session and
    stopped after (the engine Sluice's HTTP API answers as)."""
    home = _target_dir() / "tmp" / "pytest-elasticsearch"
    env = dict(os.environ, SEARCH_HOME=str(home), SEARCH_PORT=str(ELASTICSEARCH_PORT))
    script = ROOT / "scripts" / "search-engine"
    start = subprocess.run(
        [str(script), "elasticsearch", ELASTICSEARCH_VERSION, "start"], env=env, capture_output=True, text=True
    )
    assert start.returncode == 0, f"starting Elasticsearch failed: {start.stdout}{start.stderr}"
    url = f"http://127.0.0.1:{ELASTICSEARCH_PORT}"
    try:
        yield url
    finally:
        subprocess.run([str(script), "elasticsearch", ELASTICSEARCH_VERSION, "stop"], env=env, capture_output=True)


class SluiceServe:
    """A running `sluice serve --http`: its HTTP URL, device and process."""

    def __init__(self, sluice_bin: Path, device: Path, extra=(), create_mib=256, http="127.0.0.1:0"):
        self.device = device
        self.proc = subprocess.Popen(
            [
                str(sluice_bin), "serve", "--device", str(device), "--create-mib", str(create_mib),
                "--resp", "127.0.0.1:0", "--http", http, "--threads", "1", "--no-pin",
                *extra,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        )
        self.url = None
        self.banner = seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "HTTP API (Elasticsearch-compatible) on" in line:
                self.url = line.strip().rsplit(" ", 1)[-1]
            if "ready to accept connections" in line:
                break
        assert self.url, f"sluice serve did not start its HTTP API: {''.join(seen)}"

    def stop(self, keep_device=False):
        """Stops the server (SIGTERM) and, unless kept for a restart,
        removes its device: a device file is allocated whole, and a test
        run starts many servers."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, f"sluice serve exited {self.proc.returncode}: {out}"
        if not keep_device:
            self.device.unlink(missing_ok=True)
        return out


@pytest.fixture(scope="module")
def sluice_http(tmp_path_factory, sluice_bin):
    """`sluice serve --http` on a new device, for one test module."""
    server = SluiceServe(sluice_bin, tmp_path_factory.mktemp("serve") / "serve.dev")
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()
        server.device.unlink(missing_ok=True)
