"""Sluice exports and keyspaces as Dask DataFrames.

Each partition is read by its own task with Sluice's direct-I/O reader, so
the same code runs on a laptop and on a ``dask.distributed`` cluster whose
workers see the device (a shared block device or file).

- :func:`read_export` -- one partition per export slice;
- :func:`read_keyspace` -- partitions cut at key ranges of one snapshot.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

from . import Store, export_slices
from . import read_export as _read_export

__all__ = ["read_export", "read_keyspace", "keyspace_ranges"]


def _to_pandas(table: pa.Table):
    """Binary columns (store keys) stay Arrow-backed bytes: Dask would
    otherwise turn object columns into strings, which keys are not."""
    import pandas as pd

    binary = pd.ArrowDtype(pa.binary())
    return table.to_pandas(types_mapper={pa.binary(): binary}.get)


class _SliceReader:
    """Reads one slice of an export into pandas; Dask calls it per
    partition. Column projection is pushed into the reader."""

    def __init__(self, device: str, columns, where, types):
        self.device = device
        self.columns = columns
        self.where = where
        self.types = types

    def __call__(self, slice_no: int):
        reader = _read_export(
            self.device,
            columns=self.columns,
            where=self.where,
            types=self.types,
            tasks=1,
            slices=[slice_no],
        )
        return reader.read_all().to_pandas()


def read_export(
    device: Union[str, "os.PathLike[str]"],
    columns: Optional[Sequence[str]] = None,
    where: Optional[str] = None,
    types: Optional[Dict[str, str]] = None,
):
    """A ``dask.dataframe.DataFrame`` of an export: ``_id`` and the
    ``columns`` (paths into ``_source``) or the whole ``_source``; one
    partition per slice. ``where`` filters inside each partition's reader.
    """
    import dask.dataframe as dd

    device = os.fspath(device)
    slices = export_slices(device)
    cols = None if columns is None else list(columns)
    # The schema (``meta``) comes from the first slice that holds documents:
    # the same inference every partition makes from its own first page,
    # pinned so that all partitions agree.
    first = next((i for i, s in enumerate(slices) if s["docs"] > 0), 0)
    sample = _read_export(device, columns=cols, where=where, types=types, tasks=1, slices=[first])
    schema = sample.schema
    sample.close()  # stops the reader that was started for its schema
    pinned = dict(types or {})
    if cols is not None:
        for field in schema:
            if field.name != "_id" and field.name not in pinned:
                pinned[field.name] = _type_name(field.type)
    meta = schema.empty_table().to_pandas()
    return dd.from_map(
        _SliceReader(device, cols, where, pinned or None),
        list(range(len(slices))),
        meta=meta,
        label="sluice-read-export",
        enforce_metadata=False,
    )


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{_type_name(t.value_type)}>"
    return {
        pa.bool_(): "bool",
        pa.int64(): "int64",
        pa.uint64(): "uint64",
        pa.uint32(): "uint32",
        pa.float64(): "float64",
        pa.string(): "string",
    }.get(t, "json")


# Partitions open the store in turn: it is open in one process at a time,
# so a partition waits (up to an hour) for the one before it to close it.
_LOCK_TIMEOUT_S = 3600.0


def _open_store(path):
    return Store(path, lock_timeout_s=_LOCK_TIMEOUT_S)


def keyspace_ranges(
    path: Union[str, Sequence[str]], keyspace: str, partitions: int
) -> List[Tuple[Optional[bytes], Optional[bytes]]]:
    """``partitions`` (or fewer) consecutive ``[start, end)`` key ranges
    that cover the keyspace with no overlap (None: unbounded), cut at the
    first keys of its tables, or at keys of one snapshot's scan while the
    keyspace has too few tables."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    with _open_store(path) as store:
        cuts = list(store.split_keys(keyspace, partitions))
        if len(cuts) < partitions - 1:
            with store.snapshot() as snap:
                keys = [k for k, _ in store.scan(keyspace, snapshot=snap)]
            step = max(1, len(keys) // partitions)
            cuts = sorted(set(keys[i] for i in range(step, len(keys), step)))[: partitions - 1]
    bounds: List[Optional[bytes]] = [None, *cuts, None]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


class _RangeReader:
    def __init__(self, path, keyspace, where, select, types):
        self.path = path
        self.keyspace = keyspace
        self.where = where
        self.select = select
        self.types = types

    def __call__(self, key_range):
        start, end = key_range
        with _open_store(self.path) as store:
            table = store.query(
                self.keyspace,
                where=self.where,
                select=self.select,
                start=start,
                end=end,
                types=self.types,
            )
        return _to_pandas(table)


def read_keyspace(
    path: Union[str, Sequence[str]],
    keyspace: str,
    where: Optional[str] = None,
    select: Optional[Sequence[str]] = None,
    partitions: int = 4,
    types: Optional[Dict[str, str]] = None,
):
    """A ``dask.dataframe.DataFrame`` of a keyspace's rows matching
    ``where``: ``partitions`` partitions over disjoint key ranges, each a
    near-data query of its range."""
    import dask.dataframe as dd

    path = path if isinstance(path, str) else [os.fspath(p) for p in path]
    ranges = keyspace_ranges(path, keyspace, partitions)
    sel = None if select is None else list(select)
    with _open_store(path) as store:
        sample = store.query(keyspace, where=where, select=sel, limit=1024, types=types)
    pinned = dict(types or {})
    if sel is not None:
        for field in sample.schema:
            if field.name not in ("_key", "value") and field.name not in pinned:
                pinned[field.name] = _type_name(field.type)
    meta = _to_pandas(sample.schema.empty_table())
    return dd.from_map(
        _RangeReader(path, keyspace, where, sel, pinned or None),
        ranges,
        meta=meta,
        label="sluice-read-keyspace",
        enforce_metadata=False,
    )
