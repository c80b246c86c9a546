//! `sluice.Store`: the embedded key/value store with its near-data
//! operators, and its snapshots, scans and graphs.

use crate::errors::{self, QueryError};
use crate::handover;
use arrow_array::builder::{Float64Builder, UInt32Builder, UInt64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use sluice_arrow::{ColumnType, QueryOptions};
use sluice_ndp::graph::{matching_ids, Csr};
use sluice_ndp::{parse, FieldPredicate, Layout};
use sluice_store::{StoreConfig, StoreIter, ValueFormat, WriteBatch};
use std::collections::HashMap;
use std::ops::Bound as KeyBound;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

type Inner = sluice_store::Store;

/// A key range: first key (inclusive), end key (exclusive); None = open.
type KeyRange = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Bytes of a key or value given as `bytes` or `str` (UTF-8).
fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be bytes or str, not {}",
        obj.get_type().name()?
    )))
}

/// A value for a keyspace: bytes or str as given, anything else (a dict,
/// a list) as JSON; JSON and record keyspaces check and encode it.
fn value_for(
    py: Python<'_>,
    def: &sluice_store::KeyspaceDef,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Vec<u8>> {
    let raw = if obj.cast::<PyBytes>().is_ok() || obj.cast::<PyString>().is_ok() {
        bytes_of(obj, "value")?
    } else if def.format == ValueFormat::Raw {
        return Err(PyTypeError::new_err(format!(
            "keyspace {} holds raw values: give bytes or str, not {}",
            def.name,
            obj.get_type().name()?
        )));
    } else {
        let json = py.import("json")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("ensure_ascii", false)?;
        kwargs.set_item("separators", (",", ":"))?;
        let text = json.call_method("dumps", (obj,), Some(&kwargs))?;
        text.extract::<String>()?.into_bytes()
    };
    if def.format == ValueFormat::Raw {
        return Ok(raw);
    }
    let text = std::str::from_utf8(&raw).map_err(|_| {
        QueryError::new_err(format!(
            "keyspace {} holds {} values, which are UTF-8 JSON; these bytes are not UTF-8",
            def.name,
            if def.format == ValueFormat::Json {
                "json"
            } else {
                "record"
            }
        ))
    })?;
    sluice_ndp::encode_value(def, text).map_err(|e| QueryError::new_err(e.to_string()))
}

/// Column types given from Python as `{"name": "int64", ...}`.
pub fn column_types(
    types: Option<HashMap<String, String>>,
) -> PyResult<HashMap<String, ColumnType>> {
    let mut out = HashMap::new();
    for (name, t) in types.unwrap_or_default() {
        let parsed = ColumnType::parse(&t).ok_or_else(|| {
            QueryError::new_err(format!(
                "types[{name:?}] = {t:?}: use bool, int64, uint64, uint32, float64, string, json or list<...>"
            ))
        })?;
        out.insert(name, parsed);
    }
    Ok(out)
}

/// A Sluice store on one or more devices (files or block devices).
///
/// `Store("data/kv.dev")` opens a store; `Store("data/kv.dev",
/// create_mib=512)` creates and formats the file first when it does not
/// exist (an existing store is opened, never erased). A store is open in
/// one process at a time: another open waits up to `lock_timeout_s` for
/// it to close, then fails. Use it as a context manager, or call
/// `close()`.
#[pyclass(module = "sluice")]
pub struct Store {
    inner: Mutex<Option<Arc<Inner>>>,
    paths: Vec<PathBuf>,
}

impl Store {
    fn open_store(&self) -> PyResult<Arc<Inner>> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| errors::Error::new_err("the store is closed"))
    }

    fn keyspace_def(&self, name: &str) -> PyResult<sluice_store::KeyspaceDef> {
        self.open_store()?.keyspace_def(name).map_err(errors::store)
    }

    /// `query(..., aggregate="count(*)", group_by=...)`: the aggregates
    /// as a table; None when no aggregate was asked for.
    fn aggregate_if_asked<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        keyspace: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(kwargs) = kwargs else {
            return Ok(None);
        };
        let Some(aggregate) = kwargs.get_item("aggregate")?.filter(|v| !v.is_none()) else {
            return Ok(None);
        };
        let (mut predicate, mut group_by, mut threads) = (None, None, 1usize);
        for (key, value) in kwargs.iter() {
            let key: String = key.extract()?;
            match key.as_str() {
                "aggregate" => {}
                _ if value.is_none() => {}
                "where" => predicate = Some(value.extract::<String>()?),
                "group_by" => group_by = Some(value.extract::<String>()?),
                "threads" => threads = value.extract()?,
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "{method}() with aggregate takes where, group_by and threads, not {other:?}"
                    )))
                }
            }
        }
        let aggregate: String = aggregate.extract()?;
        let store = self.open_store()?;
        let batch = py
            .detach(|| {
                sluice_arrow::aggregate_batch(
                    &store,
                    keyspace,
                    predicate.as_deref(),
                    &aggregate,
                    group_by.as_deref(),
                    threads,
                )
            })
            .map_err(errors::arrow)?;
        let schema = batch.schema();
        handover::one_table(py, vec![batch], schema).map(Some)
    }

    /// A query's stream, checked and started (the GIL released meanwhile).
    fn start_query(
        &self,
        py: Python<'_>,
        method: &str,
        keyspace: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<sluice_arrow::BatchStream> {
        let options = query_options(method, kwargs)?;
        let store = self.open_store()?;
        py.detach(|| sluice_arrow::query_stream(store, keyspace, &options))
            .map_err(errors::arrow)
    }
}

fn paths_of(path: &Bound<'_, PyAny>) -> PyResult<Vec<PathBuf>> {
    if let Ok(p) = path.extract::<PathBuf>() {
        return Ok(vec![p]);
    }
    let paths: Vec<PathBuf> = path.extract().map_err(|_| {
        PyTypeError::new_err("path must be a path (str or os.PathLike) or a list of paths")
    })?;
    if paths.is_empty() {
        return Err(QueryError::new_err("no device given"));
    }
    Ok(paths)
}

fn range_of(
    prefix: Option<&Bound<'_, PyAny>>,
    start: Option<&Bound<'_, PyAny>>,
    end: Option<&Bound<'_, PyAny>>,
) -> PyResult<KeyRange> {
    match prefix {
        Some(p) => {
            if start.is_some() || end.is_some() {
                return Err(QueryError::new_err(
                    "give prefix, or start and end, not both",
                ));
            }
            let p = bytes_of(p, "prefix")?;
            let end = sluice_store::store::prefix_end(&p);
            Ok((Some(p), end))
        }
        None => Ok((
            start.map(|s| bytes_of(s, "start")).transpose()?,
            end.map(|e| bytes_of(e, "end")).transpose()?,
        )),
    }
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (path, create_mib=None, wal_recovery="strict", lock_timeout_s=10.0, block_cache_mib=None))]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        create_mib: Option<u64>,
        wal_recovery: &str,
        lock_timeout_s: f64,
        block_cache_mib: Option<usize>,
    ) -> PyResult<Self> {
        let paths = paths_of(path)?;
        let recovery: sluice_store::wal::WalRecovery = wal_recovery
            .parse()
            .map_err(|e: String| QueryError::new_err(e))?;
        if !(0.0..=86_400.0).contains(&lock_timeout_s) {
            return Err(QueryError::new_err(format!(
                "lock_timeout_s {lock_timeout_s}: use 0 to 86400 seconds"
            )));
        }
        let defaults = StoreConfig::default();
        let config = StoreConfig {
            wal_recovery: recovery,
            lock_wait_ms: (lock_timeout_s * 1000.0) as u64,
            block_cache_bytes: block_cache_mib.map_or(defaults.block_cache_bytes, |m| m << 20),
            ..defaults
        };
        let mut files = sluice_store::StoreFiles::new(&paths)
            .config(config)
            .when_missing("give create_mib=N to create one there");
        if let Some(mib) = create_mib {
            files = files.create_bytes(mib << 20);
        }
        let inner = py.detach(|| files.open()).map_err(errors::store)?;
        Ok(Store {
            inner: Mutex::new(Some(Arc::new(inner))),
            paths,
        })
    }

    /// The device paths, in order.
    #[getter]
    fn paths(&self) -> Vec<PathBuf> {
        self.paths.clone()
    }

    /// Closes the store; every write acknowledged so far is durable already.
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || drop(inner));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.lock().map(|g| g.is_some()).unwrap_or(false) {
            "open"
        } else {
            "closed"
        };
        let names: Vec<String> = self.paths.iter().map(|p| p.display().to_string()).collect();
        format!("<sluice.Store {} ({state})>", names.join(" + "))
    }

    /// Creates a keyspace: `format` raw, json or record; `schema` like
    /// "name:str,year:u32" (required for record, optional for json).
    /// Returns its id. An existing keyspace of the same definition is
    /// returned as it is.
    #[pyo3(signature = (name, format="raw", schema=""))]
    fn keyspace(&self, py: Python<'_>, name: &str, format: &str, schema: &str) -> PyResult<u32> {
        let store = self.open_store()?;
        let format: ValueFormat = format.parse().map_err(|e: String| QueryError::new_err(e))?;
        if let Ok(def) = store.keyspace_def(name) {
            if def.format == format && def.schema == schema {
                return Ok(def.id);
            }
            return Err(QueryError::new_err(format!(
                "keyspace {name} exists with format {:?} and schema {:?}",
                def.format, def.schema
            )));
        }
        sluice_ndp::check_definition(format, schema)
            .map_err(|e| QueryError::new_err(e.to_string()))?;
        py.detach(|| store.create_keyspace(name, format, schema))
            .map_err(errors::store)
    }

    /// The keyspaces' names.
    fn keyspaces(&self) -> PyResult<Vec<String>> {
        Ok(self.open_store()?.stats().keyspaces)
    }

    /// Drops a keyspace and everything in it, durably: its space is freed
    /// and its name may be used again (a new, empty keyspace). Iterators
    /// already open on it read on from what they started with.
    fn drop_keyspace(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let store = self.open_store()?;
        py.detach(|| store.drop_keyspace(name))
            .map_err(errors::store)
    }

    /// Writes one key; durable when it returns. Values: bytes or str, or
    /// for json and record keyspaces any JSON-serialisable object.
    #[pyo3(signature = (key, value, keyspace="default"))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        keyspace: &str,
    ) -> PyResult<u64> {
        let def = self.keyspace_def(keyspace)?;
        let key = bytes_of(key, "key")?;
        let value = value_for(py, &def, value)?;
        let store = self.open_store()?;
        py.detach(|| store.put(def.id, &key, &value))
            .map_err(errors::store)
    }

    /// The key's value as stored (bytes), or None.
    #[pyo3(signature = (key, keyspace="default"))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'_, PyAny>,
        keyspace: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let def = self.keyspace_def(keyspace)?;
        let key = bytes_of(key, "key")?;
        let store = self.open_store()?;
        let v = py
            .detach(|| store.get(def.id, &key))
            .map_err(errors::store)?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// Deletes one key (absent keys are fine); durable when it returns.
    #[pyo3(signature = (key, keyspace="default"))]
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>, keyspace: &str) -> PyResult<u64> {
        let def = self.keyspace_def(keyspace)?;
        let key = bytes_of(key, "key")?;
        let store = self.open_store()?;
        py.detach(|| store.delete(def.id, &key))
            .map_err(errors::store)
    }

    /// Writes `(key, value)` pairs atomically, in one log record; a value
    /// of None deletes its key. Returns the batch's sequence.
    #[pyo3(signature = (ops, keyspace="default"))]
    fn write_batch(&self, py: Python<'_>, ops: &Bound<'_, PyAny>, keyspace: &str) -> PyResult<u64> {
        let def = self.keyspace_def(keyspace)?;
        let mut batch = WriteBatch::new();
        for op in ops.try_iter()? {
            let op = op?;
            let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                op.extract().map_err(|_| {
                    PyTypeError::new_err("write_batch takes (key, value) pairs; value None deletes")
                })?;
            let key = bytes_of(&key, "key")?;
            if value.is_none() {
                batch.delete(def.id, &key).map_err(errors::store)?;
            } else {
                let value = value_for(py, &def, &value)?;
                batch.put(def.id, &key, &value).map_err(errors::store)?;
            }
        }
        let store = self.open_store()?;
        py.detach(|| store.write(&batch)).map_err(errors::store)
    }

    /// A consistent view of every write acknowledged so far.
    fn snapshot(&self) -> PyResult<Snapshot> {
        let store = self.open_store()?;
        Ok(Snapshot {
            snap: Mutex::new(Some(store.snapshot())),
            store,
        })
    }

    /// Pairs `(key, value)` in key order (or `reverse`), of a prefix or a
    /// range [start, end), streamed: memory stays bounded however many
    /// match. Reads as of `snapshot` when given, else as of now.
    #[pyo3(signature = (keyspace="default", prefix=None, start=None, end=None, reverse=false, limit=None, snapshot=None))]
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        keyspace: &str,
        prefix: Option<&Bound<'_, PyAny>>,
        start: Option<&Bound<'_, PyAny>>,
        end: Option<&Bound<'_, PyAny>>,
        reverse: bool,
        limit: Option<usize>,
        snapshot: Option<PyRef<'_, Snapshot>>,
    ) -> PyResult<ScanIter> {
        let store = self.open_store()?;
        let def = self.keyspace_def(keyspace)?;
        let (lo, hi) = range_of(prefix, start, end)?;
        let snap = match snapshot {
            Some(s) => s.take_clone()?,
            None => store.snapshot(),
        };
        let iter = store.iter(
            def.id,
            (
                lo.as_deref()
                    .map_or(KeyBound::Unbounded, KeyBound::Included),
                hi.as_deref()
                    .map_or(KeyBound::Unbounded, KeyBound::Excluded),
            ),
            &snap,
            reverse,
        );
        Ok(ScanIter {
            iter: Mutex::new(Some(iter)),
            remaining: limit,
            _snapshot: snap,
        })
    }

    /// Runs a predicate query next to the data and returns the matching
    /// rows as a `pyarrow.Table`: `_key` (binary), then one typed column
    /// per selected field (every declared field by default; the whole
    /// `value` where none are declared). Ctrl-C stops it. Options (by
    /// keyword): where, select, limit, threads, reverse, prefix, start,
    /// end, types, with_value, batch_rows (see the stubs); or
    /// aggregate="count(*),avg(year)" with where, group_by and threads for
    /// aggregates (as `aggregate`).
    #[pyo3(signature = (keyspace, **options))]
    fn query<'py>(
        &self,
        py: Python<'py>,
        keyspace: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(table) = self.aggregate_if_asked(py, "query", keyspace, options)? {
            return Ok(table);
        }
        let stream = self.start_query(py, "query", keyspace, options)?;
        handover::table(py, stream)
    }

    /// `query` as a `pyarrow.RecordBatchReader`: batches of `batch_rows`
    /// rows, produced while they are read, so memory stays bounded.
    #[pyo3(signature = (keyspace, **options))]
    fn query_batches<'py>(
        &self,
        py: Python<'py>,
        keyspace: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(table) = self.aggregate_if_asked(py, "query_batches", keyspace, options)? {
            return table.call_method0("to_reader");
        }
        let stream = self.start_query(py, "query_batches", keyspace, options)?;
        handover::reader(py, stream)
    }

    /// Aggregates computed next to the data, e.g.
    /// `aggregate("papers", "count(*),avg(year)", group_by="venue")`, as a
    /// `pyarrow.Table`: the group column, then one column per aggregate.
    #[pyo3(signature = (keyspace, aggregate, r#where=None, group_by=None, threads=1))]
    fn aggregate<'py>(
        &self,
        py: Python<'py>,
        keyspace: &str,
        aggregate: &str,
        r#where: Option<&str>,
        group_by: Option<&str>,
        threads: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.open_store()?;
        let batch = py
            .detach(|| {
                sluice_arrow::aggregate_batch(
                    &store, keyspace, r#where, aggregate, group_by, threads,
                )
            })
            .map_err(errors::arrow)?;
        let schema = batch.schema();
        handover::one_table(py, vec![batch], schema)
    }

    /// The graph of an edge keyspace (keys: source id ++ target id, 8
    /// bytes big-endian each), built next to the data by one scan;
    /// `where` keeps the vertices whose document in `vertices` matches.
    #[pyo3(signature = (keyspace="refs", r#where=None, vertices="papers", memory_mib=4096))]
    fn graph(
        &self,
        py: Python<'_>,
        keyspace: &str,
        r#where: Option<&str>,
        vertices: &str,
        memory_mib: u64,
    ) -> PyResult<Graph> {
        let store = self.open_store()?;
        let ks = store.keyspace(keyspace).map_err(errors::store)?;
        let keep = match r#where {
            Some(text) => {
                let def = store.keyspace_def(vertices).map_err(errors::store)?;
                let layout = Layout::of(&def).map_err(|e| QueryError::new_err(e.to_string()))?;
                let pred = parse(text).map_err(|e| QueryError::new_err(e.to_string()))?;
                let pred = FieldPredicate::compile_for(&pred, &layout)
                    .map_err(|e| QueryError::new_err(e.to_string()))?;
                Some((def.id, pred))
            }
            None => None,
        };
        let csr = py.detach(|| -> Result<Csr, sluice_ndp::graph::GraphError> {
            match keep {
                Some((id, pred)) => {
                    let keep = matching_ids(&store, id, &pred)?;
                    Csr::build(&store, ks, memory_mib << 20, &mut |s, t| {
                        keep.contains(&s) && keep.contains(&t)
                    })
                }
                None => Csr::build(&store, ks, memory_mib << 20, &mut |_, _| true),
            }
        });
        Ok(Graph {
            csr: csr.map_err(graph_error)?,
        })
    }

    /// Up to `parts - 1` keys that cut a keyspace into parts of similar
    /// size (from its tables' first keys; empty while all of it is in the
    /// memtable), in order.
    fn split_keys<'py>(
        &self,
        py: Python<'py>,
        keyspace: &str,
        parts: usize,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let store = self.open_store()?;
        let id = store.keyspace(keyspace).map_err(errors::store)?;
        Ok(store
            .split_keys(id, parts)
            .iter()
            .map(|k| PyBytes::new(py, k))
            .collect())
    }

    /// Writes the memtable to tables.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.open_store()?;
        py.detach(|| store.flush()).map_err(errors::store)
    }

    /// Flushes and compacts until each keyspace's data sits in one level.
    fn compact(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.open_store()?;
        py.detach(|| store.compact()).map_err(errors::store)
    }

    /// Counters of the store, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.open_store()?.stats();
        let d = PyDict::new(py);
        d.set_item("last_sequence", s.last_sequence)?;
        d.set_item("memtable_entries", s.memtable_entries)?;
        d.set_item("memtable_bytes", s.memtable_bytes)?;
        d.set_item("free_blocks", s.free_blocks)?;
        d.set_item("device_blocks", s.device_blocks)?;
        d.set_item("keyspaces", s.keyspaces)?;
        d.set_item("tables_per_level", s.tables_per_level)?;
        d.set_item("table_entries", s.table_entries)?;
        d.set_item("table_data_bytes", s.table_data_bytes)?;
        d.set_item("flushes", s.flushes)?;
        d.set_item("compactions", s.compactions)?;
        Ok(d)
    }
}

/// The keyword options of `query` and `query_batches`, checked.
fn query_options(method: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<QueryOptions> {
    let mut o = QueryOptions::default();
    let (mut prefix, mut start, mut end) = (None, None, None);
    let mut types = None;
    for (key, value) in kwargs.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        match key.as_str() {
            "where" => o.predicate = Some(value.extract()?),
            "select" => o.select = Some(value.extract()?),
            "limit" => o.limit = Some(value.extract()?),
            "threads" => o.threads = value.extract()?,
            "reverse" => o.reverse = value.extract()?,
            "with_value" => o.with_value = value.extract()?,
            "batch_rows" => o.batch_rows = value.extract()?,
            "group_by" => {
                return Err(QueryError::new_err(
                    "group_by goes with aggregate=, e.g. aggregate=\"count(*)\", group_by=\"venue\"",
                ))
            }
            "types" => types = Some(value.extract::<HashMap<String, String>>()?),
            "prefix" => prefix = Some(value),
            "start" => start = Some(value),
            "end" => end = Some(value),
            other => {
                return Err(PyTypeError::new_err(format!(
                    "{method}() got an unexpected keyword argument {other:?}; it takes where, \
                     select, limit, threads, reverse, prefix, start, end, types, with_value, batch_rows"
                )))
            }
        }
    }
    if o.select.as_ref().is_some_and(|s| s.is_empty()) {
        return Err(QueryError::new_err(
            "select is empty: name some fields, or leave it out for all of them",
        ));
    }
    (o.start, o.end) = range_of(prefix.as_ref(), start.as_ref(), end.as_ref())?;
    o.types = column_types(types)?;
    Ok(o)
}

fn graph_error(e: sluice_ndp::graph::GraphError) -> PyErr {
    use sluice_ndp::graph::GraphError as G;
    match &e {
        G::Scan(sluice_ndp::scan::ScanError::Store(_)) => match e {
            G::Scan(sluice_ndp::scan::ScanError::Store(s)) => errors::store(s),
            _ => unreachable!("matched above"),
        },
        G::UnknownVertex(_) => errors::NotFoundError::new_err(e.to_string()),
        G::Scan(_) | G::BadEdgeKey(_) => errors::CorruptError::new_err(e.to_string()),
        G::TooLarge { .. } => errors::Error::new_err(e.to_string()),
        G::BadSampleSize(_) | G::BadThreads(_) => QueryError::new_err(e.to_string()),
    }
}

/// A consistent view of a store as of one moment; reads through it see
/// nothing written later. Release it with `close()` or a `with` block.
#[pyclass(module = "sluice")]
pub struct Snapshot {
    snap: Mutex<Option<sluice_store::Snapshot>>,
    store: Arc<Inner>,
}

impl Snapshot {
    /// The same view for a scan that outlives this object's `close()`.
    fn take_clone(&self) -> PyResult<sluice_store::Snapshot> {
        let guard = self.snap.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .cloned()
            .ok_or_else(|| errors::Error::new_err("the snapshot is closed"))
    }
}

#[pymethods]
impl Snapshot {
    /// The sequence of the last write it sees.
    #[getter]
    fn seq(&self) -> PyResult<u64> {
        let guard = self.snap.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .map(|s| s.seq())
            .ok_or_else(|| errors::Error::new_err("the snapshot is closed"))
    }

    /// The key's value as of the snapshot, or None.
    #[pyo3(signature = (key, keyspace="default"))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'_, PyAny>,
        keyspace: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = bytes_of(key, "key")?;
        let ks = self.store.keyspace(keyspace).map_err(errors::store)?;
        let guard = self.snap.lock().unwrap_or_else(|p| p.into_inner());
        let snap = guard
            .as_ref()
            .ok_or_else(|| errors::Error::new_err("the snapshot is closed"))?;
        let store = &self.store;
        let v = py
            .detach(|| store.get_at(ks, &key, snap))
            .map_err(errors::store)?;
        Ok(v.map(|v| PyBytes::new(py, &v)))
    }

    /// Releases the view (the store may then drop what only it kept).
    fn close(&self) {
        self.snap.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }
}

/// An iterator of `(key, value)` pairs from `Store.scan`.
#[pyclass(module = "sluice")]
pub struct ScanIter {
    iter: Mutex<Option<StoreIter>>,
    remaining: Option<usize>,
    _snapshot: sluice_store::Snapshot,
}

#[pymethods]
impl ScanIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        if self.remaining == Some(0) {
            self.iter.lock().unwrap_or_else(|p| p.into_inner()).take();
            return Ok(None);
        }
        let mut guard = self.iter.lock().unwrap_or_else(|p| p.into_inner());
        let Some(iter) = guard.as_mut() else {
            return Ok(None);
        };
        match py.detach(|| iter.next()) {
            Some(Ok((k, v))) => {
                if let Some(r) = self.remaining.as_mut() {
                    *r -= 1;
                }
                Ok(Some((PyBytes::new(py, &k), PyBytes::new(py, &v))))
            }
            Some(Err(e)) => {
                guard.take();
                Err(errors::store(e))
            }
            None => {
                guard.take();
                Ok(None)
            }
        }
    }
}

/// A graph built next to the data (`Store.graph`).
#[pyclass(module = "sluice")]
pub struct Graph {
    csr: Csr,
}

#[pymethods]
impl Graph {
    /// Vertices.
    #[getter]
    fn vertices(&self) -> usize {
        self.csr.vertices()
    }

    /// Edges.
    #[getter]
    fn edges(&self) -> usize {
        self.csr.edges()
    }

    /// Betweenness Centrality (Brandes): exact, or estimated from
    /// `sources` sampled vertices. A `pyarrow.Table` of `id` and
    /// `betweenness`, most central first (the first `top` rows, or all).
    #[pyo3(signature = (sources=None, seed=1, top=None, threads=None))]
    fn bc<'py>(
        &self,
        py: Python<'py>,
        sources: Option<usize>,
        seed: u64,
        top: Option<usize>,
        threads: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let threads = threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let csr = &self.csr;
        let bc = py
            .detach(|| match sources {
                Some(k) => csr.betweenness_sampled(k, seed, threads),
                None => csr.betweenness(threads),
            })
            .map_err(graph_error)?;
        let mut order: Vec<usize> = (0..bc.len()).collect();
        order.sort_by(|&a, &b| bc[b].total_cmp(&bc[a]).then(a.cmp(&b)));
        order.truncate(top.unwrap_or(order.len()));
        let mut ids = UInt64Builder::new();
        let mut scores = Float64Builder::new();
        for &v in &order {
            ids.append_value(csr.ids[v]);
            scores.append_value(bc[v]);
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("betweenness", DataType::Float64, false),
        ]));
        let arrays: Vec<ArrayRef> = vec![Arc::new(ids.finish()), Arc::new(scores.finish())];
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .map_err(|e| errors::Error::new_err(e.to_string()))?;
        handover::one_table(py, vec![batch], schema)
    }

    /// Vertices reached from vertex `start` within `depth` hops: a
    /// `pyarrow.Table` of `id` and `depth`.
    #[pyo3(signature = (start, depth=2))]
    fn bfs<'py>(&self, py: Python<'py>, start: u64, depth: u32) -> PyResult<Bound<'py, PyAny>> {
        let v = self.csr.vertex(start).map_err(graph_error)?;
        let reached = py.detach(|| self.csr.bfs(v, depth));
        let mut ids = UInt64Builder::new();
        let mut depths = UInt32Builder::new();
        for (v, d) in reached {
            ids.append_value(self.csr.ids[v as usize]);
            depths.append_value(d);
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("depth", DataType::UInt32, false),
        ]));
        let arrays: Vec<ArrayRef> = vec![Arc::new(ids.finish()), Arc::new(depths.finish())];
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .map_err(|e| errors::Error::new_err(e.to_string()))?;
        handover::one_table(py, vec![batch], schema)
    }
}
