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
