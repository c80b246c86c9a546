"""Sluice from Python.

The direct-I/O store with its near-data operators, and search-index exports,
with Apache Arrow as the data interface:

- :class:`Store` -- the embedded key/value store: ``put/get/delete``,
  ``write_batch``, keyspaces, snapshots and streamed ``scan``; predicate
  queries and aggregates run next to the data and come back as
  ``pyarrow.Table`` (``query``, ``aggregate``) or a streaming
  ``pyarrow.RecordBatchReader`` (``query_batches``); ``graph(...).bc()``
  and ``.bfs()``.
- :func:`export` -- paginate an Elasticsearch/OpenSearch index onto a device
  with direct I/O (progress bar with tqdm when installed; Ctrl-C stops it
  with every page written durable, ``resume=True`` finishes it).
- :func:`read_export` -- an export read back as a ``RecordBatchReader``.
- :mod:`sluice.dask` -- the same as Dask DataFrames, a partition per slice
  or key range.
- :func:`shm_pool` -- a redis-py connection pool over ``sluice serve``'s
  shared-memory rings (``--shm PATH``):
  ``redis.Redis(connection_pool=sluice.shm_pool(PATH))`` (:mod:`sluice.shm`;
  needs redis-py).

Errors raise :class:`Error` or one of its subclasses (:class:`CorruptError`,
:class:`NotFoundError`, :class:`QueryError`, :class:`DeviceFullError`) with
the engine's message unchanged.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from ._sluice import (  # noqa: F401  (re-exported)
    CorruptError,
    DeviceFullError,
    Error,
    ExportRun,
    Graph,
    NotFoundError,
    QueryError,
    ScanIter,
    Snapshot,
    Store,
    __version__,
    export_slices,
    read_export,
)
from ._sluice import start_export as _start_export

__all__ = [
    "shm_pool",
    "Store",
    "Snapshot",
    "ScanIter",
    "Graph",
    "ExportRun",
    "export",
    "read_export",
    "export_slices",
    "Error",
    "CorruptError",
    "NotFoundError",
    "QueryError",
    "DeviceFullError",
    "__version__",
]

PathLike = Union[str, "os.PathLike[str]"]


def _progress_bar(enabled: Optional[bool]):
    """A tqdm bar when asked for (or, by default, when stderr is a terminal
    and tqdm is installed); None otherwise."""
    if enabled is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if enabled:
            print("sluice.export: install tqdm for a progress bar", file=sys.stderr)
        return None
    if enabled is None and not sys.stderr.isatty():
        return None
    return tqdm(unit="doc", unit_scale=True, desc="export", total=None)


def export(
    source: str,
    index: str,
    device: PathLike,
    *,
    slices: Optional[int] = None,
    query: Union[None, str, Dict[str, Any]] = None,
    page_docs: int = 2048,
    page_mib: int = 8,
    user: Optional[str] = None,
    password: Optional[str] = None,
    api_key: Optional[str] = None,
    ca_cert: Optional[PathLike] = None,
    cursor: str = "pit",
    resume: bool = False,
    device_mib: Optional[int] = None,
    includes: Optional[Sequence[str]] = None,
    excludes: Optional[Sequence[str]] = None,
    keep_alive: str = "5m",
    throttle_docs_per_s: Optional[float] = None,
    progress: Optional[bool] = None,
) -> Dict[str, Any]:
    """Exports ``index`` from the Elasticsearch/OpenSearch at ``source``
    (``http://host:9200``) onto ``device`` with ``slices`` sliced cursors
    (default: the index's primary shard count), each page written with
    direct I/O. ``query`` is the query clause (a dict or JSON text);
    ``throttle_docs_per_s`` spares a busy source. Pages are sized by bytes:
    each answer stays near ``page_mib`` MiB (at most ``page_docs``
    documents), and pages halve when the source answers 429, 5xx or not
    in time.

    Shows a tqdm progress bar when ``progress`` is True (default: when
    stderr is a terminal). Ctrl-C stops the export after the pages in
    flight, every page written durable, and raises KeyboardInterrupt;
    ``resume=True`` finishes it later. Returns the summary as a dict.
    """
    import json

    if isinstance(query, dict):
        query = json.dumps(query)
    run = _start_export(
        source,
        index,
        os.fspath(device),
        slices=slices,
        query=query,
        page_docs=page_docs,
        page_mib=page_mib,
        user=user,
        password=password,
        api_key=api_key,
        ca_cert=None if ca_cert is None else os.fspath(ca_cert),
        cursor=cursor,
        resume=resume,
        device_mib=device_mib,
        includes=None if includes is None else list(includes),
        excludes=None if excludes is None else list(excludes),
        keep_alive=keep_alive,
        throttle_docs_per_s=throttle_docs_per_s,
    )
    bar = _progress_bar(progress)
    try:
        while not run.wait(0.2):
            if bar is not None:
                done, total = run.progress()
                if total and bar.total != total:
                    bar.total = total
                bar.n = done
                bar.refresh()
    except KeyboardInterrupt:
        run.interrupt()
        run.wait(3600.0)
        try:
            run.result()
        except Error:
            pass
        raise
    finally:
        if bar is not None:
            done, _ = run.progress()
            bar.n = done
            bar.close()
    return run.result()


def shm_pool(path: Union[str, os.PathLike], **kwargs: Any):
    """A redis-py ``ConnectionPool`` whose connections talk to ``sluice
    serve --shm PATH`` through shared-memory rings instead of a socket;
    ``kwargs`` go to the pool as redis-py's own (``protocol``,
    ``decode_responses``, ``password``, ...). redis-py is imported here, not
    with the package: ``pip install redis``."""
    from .shm import shm_pool as _shm_pool

    return _shm_pool(os.fspath(path), **kwargs)
