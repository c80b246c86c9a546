//! Exports from Python: a search index paginated onto a device (run on a
//! Rust thread the Python side watches for progress and Ctrl-C), and an
//! export read back as Arrow.

use crate::errors::{self, QueryError};
use crate::handover;
use crate::store::column_types;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_arrow::ExportReadOptions;
use sluice_io::{Device, FileDevice, FileOptions};
use sluice_paginate::format::CursorKind;
use sluice_paginate::progress::ProgressMode;
use sluice_paginate::source::SourceSpec;
use sluice_paginate::{Auth, Client, ExportOptions, ExportSummary, ExportWatch, HttpOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn open_export(path: &std::path::Path) -> PyResult<Arc<dyn Device>> {
    if !path.exists() {
        return Err(errors::NotFoundError::new_err(format!(
            "no export device at {}: export to it first (sluice.export or `sluice export`)",
            path.display()
        )));
    }
    let dev =
        FileDevice::open(path, &FileOptions::default()).map_err(|e| errors::device(path, e))?;
    Ok(Arc::new(dev))
}

/// Reads a complete export back as a `pyarrow.RecordBatchReader`, one
/// batch per page: `_id`, then the `columns` (paths into `_source`, typed:
/// `types` or inferred from the first page), or the whole `_source` as
/// JSON text when no columns are named. `where` filters with the predicate
/// language of `Store.query`; `slices` reads only those slices.
#[pyfunction]
#[pyo3(signature = (device, columns=None, r#where=None, with_source=false, types=None, tasks=2, queue_depth=8, slices=None))]
#[allow(clippy::too_many_arguments)]
pub fn read_export<'py>(
    py: Python<'py>,
    device: PathBuf,
    columns: Option<Vec<String>>,
    r#where: Option<String>,
    with_source: bool,
    types: Option<HashMap<String, String>>,
    tasks: usize,
    queue_depth: usize,
    slices: Option<Vec<u32>>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = ExportReadOptions {
        columns,
        with_source,
        predicate: r#where,
        tasks,
        queue_depth,
        slices,
        types: column_types(types)?,
    };
    let dev = open_export(&device)?;
    let stream = py
        .detach(|| sluice_arrow::export_stream(dev, &options))
        .map_err(errors::arrow)?;
    handover::reader(py, stream)
}

/// Each slice of a complete export: a list of dicts with `docs`, `pages`
/// and `bytes`, read from its manifest (no page is read).
#[pyfunction]
pub fn export_slices<'py>(py: Python<'py>, device: PathBuf) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let dev = open_export(&device)?;
    let counts = py
        .detach(|| sluice_paginate::read::slice_counts(dev))
        .map_err(errors::pages)?;
    counts
        .iter()
        .map(|c| {
            let d = PyDict::new(py);
            d.set_item("docs", c.docs)?;
            d.set_item("pages", c.pages)?;
            d.set_item("bytes", c.bytes)?;
            Ok(d)
        })
        .collect()
}

/// An export running on its own threads; `sluice.export` watches it.
#[pyclass(module = "sluice")]
pub struct ExportRun {
    watch: Arc<ExportWatch>,
    handle: Mutex<Option<JoinHandle<sluice_paginate::Result<ExportSummary>>>>,
}

#[pymethods]
impl ExportRun {
    /// Waits up to `timeout_s` seconds; whether the export has ended.
    fn wait(&self, py: Python<'_>, timeout_s: f64) -> bool {
        let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
        py.detach(|| loop {
            let finished = self
                .handle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_none_or(|h| h.is_finished());
            if finished || Instant::now() >= deadline {
                return finished;
            }
            std::thread::sleep(Duration::from_millis(20));
        })
    }

    /// `(documents exported so far, documents expected or 0)`.
    fn progress(&self) -> (u64, u64) {
        (
            self.watch.docs.load(Ordering::Relaxed),
            self.watch.total_docs.load(Ordering::Relaxed),
        )
    }

    /// Asks the export to stop after the pages in flight.
    fn interrupt(&self) {
        self.watch.interrupt.store(true, Ordering::Relaxed);
    }

    /// Waits for the end; the summary as a dict, or the export's error.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| errors::Error::new_err("the export's result was taken already"))?;
        let summary = py
            .detach(|| handle.join())
            .map_err(|_| errors::Error::new_err("the export thread panicked"))?
            .map_err(errors::pages)?;
        let d = PyDict::new(py);
        d.set_item("docs", summary.docs)?;
        d.set_item("pages", summary.pages)?;
        d.set_item("bytes", summary.bytes)?;
        d.set_item("docs_this_run", summary.docs_this_run)?;
        d.set_item("elapsed_s", summary.elapsed.as_secs_f64())?;
        d.set_item("device_bytes_used", summary.device_bytes_used)?;
        d.set_item("sort", summary.sort)?;
        d.set_item("page_refusals", summary.page_refusals)?;
        let slices: Vec<(u64, u64)> = summary.slices.iter().map(|s| (s.docs, s.pages)).collect();
        d.set_item("slices", slices)?;
        Ok(d)
    }
}

/// Starts an export of `index` at `source` onto `device`; see
/// `sluice.export` for the arguments.
#[pyfunction]
#[pyo3(signature = (source, index, device, slices=None, query=None, page_docs=2048, page_mib=8, user=None, password=None, api_key=None, ca_cert=None, cursor="pit", resume=false, device_mib=None, includes=None, excludes=None, keep_alive="5m", throttle_docs_per_s=None))]
#[allow(clippy::too_many_arguments)]
pub fn start_export(
    source: String,
    index: String,
    device: PathBuf,
    slices: Option<u32>,
    query: Option<String>,
    page_docs: u32,
    page_mib: u64,
    user: Option<String>,
    password: Option<String>,
    api_key: Option<String>,
    ca_cert: Option<PathBuf>,
    cursor: &str,
    resume: bool,
    device_mib: Option<u64>,
    includes: Option<Vec<String>>,
    excludes: Option<Vec<String>>,
    keep_alive: &str,
    throttle_docs_per_s: Option<f64>,
) -> PyResult<ExportRun> {
    if throttle_docs_per_s.is_some_and(|t| t.is_nan() || t <= 0.0) {
        return Err(QueryError::new_err(
            "throttle_docs_per_s must be above 0 (leave it out for no limit)",
        ));
    }
    let auth = match (user, api_key) {
        (Some(_), Some(_)) => {
            return Err(QueryError::new_err(
                "give user/password or api_key, not both",
            ))
        }
        (Some(user), None) => Auth::Basic {
            user,
            password: password.unwrap_or_default(),
        },
        (None, Some(key)) => Auth::ApiKey(key),
        (None, None) => Auth::None,
    };
    let cursor = match cursor {
        "pit" => CursorKind::Pit,
        "scroll" => CursorKind::Scroll,
        other => {
            return Err(QueryError::new_err(format!(
                "cursor {other:?}: use \"pit\" (resumable) or \"scroll\""
            )))
        }
    };
    let client = Client::new(&HttpOptions {
        url: source,
        auth,
        ca_cert,
        ..HttpOptions::default()
    })
    .map_err(errors::pages)?;
    let watch = Arc::new(ExportWatch::default());
    let options = ExportOptions {
        device,
        device_size_bytes: device_mib.map(|m| m << 20),
        spec: SourceSpec {
            index,
            query,
            source_includes: includes.unwrap_or_default(),
            source_excludes: excludes.unwrap_or_default(),
            keep_alive: keep_alive.into(),
        },
        slices,
        page_docs,
        page_bytes: page_mib.max(1) << 20,
        cursor,
        resume,
        throttle_docs_per_s,
        progress: ProgressMode::Off,
        watch: Some(watch.clone()),
        ..ExportOptions::default()
    };
    let handle = std::thread::Builder::new()
        .name("sluice-export".into())
        .spawn(move || sluice_paginate::export(&client, &options))
        .map_err(|e| errors::Error::new_err(format!("starting the export thread: {e}")))?;
    Ok(ExportRun {
        watch,
        handle: Mutex::new(Some(handle)),
    })
}
