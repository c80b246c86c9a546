"""Type stubs of the native module (re-exported by ``sluice``)."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

_Path = Union[str, "os.PathLike[str]"]
_Bytes = Union[bytes, str]

__version__: str

class Error(Exception):
    """Any error Sluice raises; the message is the engine's own."""

class CorruptError(Error):
    """Stored data failed its checks (a checksum, a damaged log, a malformed page)."""

class NotFoundError(Error):
    """A device, store, keyspace or export that is not there."""

class QueryError(Error):
    """A query, predicate, projection or option that is wrong; nothing ran."""

class DeviceFullError(Error):
    """No room left on the device (or in the write-ahead log)."""

class Snapshot:
    """A consistent view of a store as of one moment."""

    @property
    def seq(self) -> int:
        """The sequence of the last write it sees."""
    def get(self, key: _Bytes, keyspace: str = "default") -> Optional[bytes]:
        """The key's value as of the snapshot, or None."""
    def close(self) -> None:
        """Releases the view."""
    def __enter__(self) -> Snapshot: ...
    def __exit__(self, *args: Any) -> bool: ...

class ScanIter(Iterator[Tuple[bytes, bytes]]):
    """An iterator of ``(key, value)`` pairs from :meth:`Store.scan`."""

    def __iter__(self) -> ScanIter: ...
    def __next__(self) -> Tuple[bytes, bytes]: ...

class Graph:
    """A graph built next to the data (:meth:`Store.graph`)."""

    @property
    def vertices(self) -> int:
        """Vertices."""
    @property
    def edges(self) -> int:
        """Edges."""
    def bc(
        self,
        sources: Optional[int] = None,
        seed: int = 1,
        top: Optional[int] = None,
        threads: Optional[int] = None,
    ) -> pa.Table:
        """Betweenness Centrality (exact, or estimated from ``sources``
        sampled vertices): ``id``, ``betweenness``, most central first."""
    def bfs(self, start: int, depth: int = 2) -> pa.Table:
        """Vertices within ``depth`` hops of ``start``: ``id``, ``depth``."""

class Store:
    """A Sluice store on one or more devices; a context manager."""

    def __init__(
        self,
        path: Union[_Path, Sequence[_Path]],
        create_mib: Optional[int] = None,
        wal_recovery: str = "strict",
        lock_timeout_s: float = 10.0,
        block_cache_mib: Optional[int] = None,
    ) -> None:
        """Opens the store at ``path`` (created and formatted with
        ``create_mib`` MiB when the file does not exist). ``wal_recovery``:
        strict, point-in-time or skip-damaged. A store is open in one
        process at a time: another open waits ``lock_timeout_s``, then fails.
        ``block_cache_mib`` sizes the cache of table blocks (data read with
        direct I/O bypasses the kernel's page cache)."""
    @property
    def paths(self) -> List["os.PathLike[str]"]:
        """The device paths, in order."""
    def close(self) -> None:
        """Closes the store; acknowledged writes are durable already."""
    def __enter__(self) -> Store: ...
    def __exit__(self, *args: Any) -> bool: ...
    def keyspace(self, name: str, format: str = "raw", schema: str = "") -> int:
        """Creates a keyspace (raw, json or record; a schema like
        "name:str,year:u32"), or returns the id of the same one."""
    def keyspaces(self) -> List[str]:
        """The keyspaces' names."""
    def drop_keyspace(self, name: str) -> None:
        """Drops a keyspace and everything in it, durably (its space freed;
        the name may be used again for a new, empty keyspace)."""
    def put(self, key: _Bytes, value: Any, keyspace: str = "default") -> int:
        """Writes one key, durable on return; JSON-serialisable values for
        json and record keyspaces. Returns the write's sequence."""
    def get(self, key: _Bytes, keyspace: str = "default") -> Optional[bytes]:
        """The key's stored value, or None."""
    def delete(self, key: _Bytes, keyspace: str = "default") -> int:
        """Deletes one key, durable on return."""
    def write_batch(self, ops: Iterable[Tuple[_Bytes, Any]], keyspace: str = "default") -> int:
        """Writes ``(key, value)`` pairs atomically; value None deletes."""
    def snapshot(self) -> Snapshot:
        """A consistent view of every write acknowledged so far."""
    def scan(
        self,
        keyspace: str = "default",
        prefix: Optional[_Bytes] = None,
        start: Optional[_Bytes] = None,
        end: Optional[_Bytes] = None,
        reverse: bool = False,
        limit: Optional[int] = None,
        snapshot: Optional[Snapshot] = None,
    ) -> ScanIter:
        """Pairs of a prefix or of ``[start, end)``, in key order, streamed."""
    def query(
        self,
        keyspace: str,
        where: Optional[str] = None,
        select: Optional[Sequence[str]] = None,
        limit: Optional[int] = None,
        threads: int = 1,
        reverse: bool = False,
        prefix: Optional[_Bytes] = None,
        start: Optional[_Bytes] = None,
        end: Optional[_Bytes] = None,
        types: Optional[Dict[str, str]] = None,
        with_value: bool = False,
        batch_rows: int = 65536,
        aggregate: Optional[str] = None,
        group_by: Optional[str] = None,
    ) -> pa.Table:
        """A predicate query run next to the data: ``_key`` and typed field
        columns; with ``aggregate`` (and ``group_by``), the aggregates."""
    def query_batches(
        self,
        keyspace: str,
        where: Optional[str] = None,
        select: Optional[Sequence[str]] = None,
        limit: Optional[int] = None,
        threads: int = 1,
        reverse: bool = False,
        prefix: Optional[_Bytes] = None,
        start: Optional[_Bytes] = None,
        end: Optional[_Bytes] = None,
        types: Optional[Dict[str, str]] = None,
        with_value: bool = False,
        batch_rows: int = 65536,
        aggregate: Optional[str] = None,
        group_by: Optional[str] = None,
    ) -> pa.RecordBatchReader:
        """:meth:`query` as a streaming reader in bounded memory."""
    def aggregate(
        self,
        keyspace: str,
        aggregate: str,
        where: Optional[str] = None,
        group_by: Optional[str] = None,
        threads: int = 1,
    ) -> pa.Table:
        """Aggregates (``count(*),avg(year)``) run next to the data."""
    def graph(
        self,
        keyspace: str = "refs",
        where: Optional[str] = None,
        vertices: str = "papers",
        memory_mib: int = 4096,
    ) -> Graph:
        """The graph of an edge keyspace, optionally the subgraph of the
        vertices whose document matches ``where``."""
    def split_keys(self, keyspace: str, parts: int) -> List[bytes]:
        """Up to ``parts - 1`` keys cutting the keyspace into similar parts."""
    def flush(self) -> None:
        """Writes the memtable to tables."""
    def compact(self) -> None:
        """Compacts each keyspace into one level."""
    def stats(self) -> Dict[str, Any]:
        """The store's counters."""

class ExportRun:
    """An export running on its own threads (see :func:`sluice.export`)."""

    def wait(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s``; whether the export has ended."""
    def progress(self) -> Tuple[int, int]:
        """(documents exported so far, documents expected or 0)."""
    def interrupt(self) -> None:
        """Stops the export after the pages in flight."""
    def result(self) -> Dict[str, Any]:
        """The summary, or the export's error raised."""

def read_export(
    device: _Path,
    columns: Optional[Sequence[str]] = None,
    where: Optional[str] = None,
    with_source: bool = False,
    types: Optional[Dict[str, str]] = None,
    tasks: int = 2,
    queue_depth: int = 8,
    slices: Optional[Sequence[int]] = None,
) -> pa.RecordBatchReader:
    """A complete export as a reader of one batch per page: ``_id`` and the
    ``columns`` (or the whole ``_source`` as JSON text)."""

def export_slices(device: _Path) -> List[Dict[str, int]]:
    """Each slice's ``docs``, ``pages`` and ``bytes``."""

def start_export(
    source: str,
    index: str,
    device: _Path,
    slices: Optional[int] = None,
    query: Optional[str] = None,
    page_docs: int = 2048,
    user: Optional[str] = None,
    password: Optional[str] = None,
    api_key: Optional[str] = None,
    ca_cert: Optional[_Path] = None,
    cursor: str = "pit",
    resume: bool = False,
    device_mib: Optional[int] = None,
    includes: Optional[Sequence[str]] = None,
    excludes: Optional[Sequence[str]] = None,
    keep_alive: str = "5m",
    throttle_docs_per_s: Optional[float] = None,
) -> ExportRun:
    """Starts an export; :func:`sluice.export` watches it."""
