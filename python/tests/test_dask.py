"""`sluice.dask.read_keyspace` on a LocalCluster of two worker processes."""

import pytest

import sluice
import sluice.dask as sd


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            Client(c) as client:
        yield client


def test_key_ranges_cover_the_keyspace_with_no_overlap(tmp_path):
    path = tmp_path / "kv.dev"
    with sluice.Store(path, create_mib=128) as s:
        s.keyspace("docs", format="json")
        for b in range(8):
            s.write_batch([(f"k{b}{i:04}", {"n": b * 1000 + i}) for i in range(1000)], keyspace="docs")
            s.flush()
    ranges = sd.keyspace_ranges(str(path), "docs", 4)
    assert 2 <= len(ranges) <= 4
    assert ranges[0][0] is None and ranges[-1][1] is None
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end == start and end is not None
    with sluice.Store(path) as s:
        counted = [len(list(s.scan("docs", start=a, end=b))) for a, b in ranges]
    assert sum(counted) == 8000 and all(c > 0 for c in counted)


def test_read_keyspace_on_two_worker_processes_gives_every_matching_row_once(papers_store, cluster):
    where = "year >= 2000"
    with sluice.Store(papers_store) as s:
        want = s.query("papers", where=where, select=["id", "year", "venue"]).to_pandas()
    df = sd.read_keyspace(str(papers_store), "papers", where=where, select=["id", "year", "venue"],
                          partitions=4)
    assert df.npartitions >= 1
    got = df.compute()
    assert len(cluster.scheduler_info()["workers"]) == 2
    assert sorted(got["id"]) == sorted(want["id"])
    assert len(set(got["_key"])) == len(got)
    assert (got["year"] >= 2000).all()
