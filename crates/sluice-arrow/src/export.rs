//! An export's documents as Arrow: `_id`, then the projected `_source`
//! fields as typed columns (or the whole `_source` as JSON text), read
//! with the export reader's direct I/O tasks, one record batch per page.

use crate::build::{ColumnsSpec, KeyColumn, Plan as ColumnsPlan, RowBuilder, WholeColumn};
use crate::stream::{BatchStream, Emitter};
use crate::types::ColumnType;
use crate::Error;
use sluice_io::Device;
use sluice_ndp::fields::FieldReader;
use sluice_ndp::format::Layout;
use sluice_ndp::pages::PageFilter;
use sluice_ndp::query::parse_paths;
use sluice_pages::sinks::SourceFilter;
use sluice_pages::{Hit, PageInfo, ReadOptions, Sink};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How an export is read into Arrow.
#[derive(Debug, Clone)]
pub struct ExportReadOptions {
    /// `_source` field paths to return as typed columns; none = the whole
    /// `_source` as a JSON text column.
    pub columns: Option<Vec<String>>,
    /// Also return the whole `_source` (when `columns` are given).
    pub with_source: bool,
    /// Only documents matching this predicate (the language of `sluice query`).
    pub predicate: Option<String>,
    /// Reading tasks.
    pub tasks: usize,
    /// Pages in flight per task.
    pub queue_depth: usize,
    /// Only these slices; none = all.
    pub slices: Option<Vec<u32>>,
    /// Column types chosen by the caller, by field name.
    pub types: HashMap<String, ColumnType>,
}

impl Default for ExportReadOptions {
    fn default() -> Self {
        ExportReadOptions {
            columns: None,
            with_source: false,
            predicate: None,
            tasks: 2,
            queue_depth: 8,
            slices: None,
            types: HashMap::new(),
        }
    }
}

/// Shared by the reading tasks of one export read.
struct Shared {
    columns: ColumnsSpec,
    plan: Mutex<Option<ColumnsPlan>>,
    filter: Option<PageFilter>,
    emit: Emitter,
    failed: Mutex<Option<Error>>,
}

impl Shared {
    fn fail(&self, e: Error) -> sluice_pages::Error {
        let msg = e.to_string();
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(e);
        sluice_pages::Error::Config(msg)
    }

    /// The plan, decided by the first page any task reads.
    fn plan_for(&self, hits: &[Hit<'_>]) -> Result<ColumnsPlan, Error> {
        let mut plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = plan.as_ref() {
            return Ok(p.clone());
        }
        let sample: Vec<&[u8]> = hits.iter().map(|h| h.source.as_bytes()).collect();
        let p = self.columns.plan(&sample)?;
        self.emit.schema(p.schema())?;
        Ok(plan.insert(p).clone())
    }
}

struct ArrowSink {
    shared: Arc<Shared>,
    builder: Option<RowBuilder>,
}

impl Sink for ArrowSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> sluice_pages::Result<()> {
        if self.shared.emit.cancelled() {
            return Err(self.shared.fail(Error::Cancelled));
        }
        if self.builder.is_none() {
            let plan = self
                .shared
                .plan_for(hits)
                .map_err(|e| self.shared.fail(e))?;
            self.builder = Some(plan.builder());
        }
        let Some(b) = self.builder.as_mut() else {
            return Ok(());
        };
        for hit in hits {
            if let Some(f) = &self.shared.filter {
                if !f.keep(hit.source)? {
                    continue;
                }
            }
            if let Err(e) = b.append(hit.id.as_bytes(), hit.source.as_bytes()) {
                return Err(self.shared.fail(e));
            }
        }
        if b.rows() > 0 {
            let sent = b.finish().and_then(|batch| self.shared.emit.batch(batch));
            if let Err(e) = sent {
                return Err(self.shared.fail(e));
            }
        }
        Ok(())
    }
}

/// Starts reading a complete export and returns its documents as a
/// stream of record batches.
pub fn export_stream(
    device: Arc<dyn Device>,
    options: &ExportReadOptions,
) -> Result<BatchStream, Error> {
    let fields =
        match &options.columns {
            Some(cols) if cols.is_empty() => return Err(Error::Usage(
                "columns is empty: name some _source fields, or leave it out for the whole _source"
                    .into(),
            )),
            Some(cols) => Some(Arc::new(FieldReader::new(
                &Layout::json_undeclared(),
                &parse_paths(&cols.join(","), "columns")?,
            )?)),
            None => None,
        };
    if fields.is_none() && !options.types.is_empty() {
        return Err(Error::Usage(
            "types were given without columns: name the _source fields to type".into(),
        ));
    }
    let filter = match &options.predicate {
        Some(p) => Some(PageFilter::parse(std::slice::from_ref(p))?),
        None => None,
    };
    let columns = ColumnsSpec {
        key: KeyColumn::DocumentId,
        whole: (fields.is_none() || options.with_source).then(|| WholeColumn {
            name: "_source".into(),
            binary: false,
        }),
        fields,
        types: options.types.clone(),
    };
    let read = ReadOptions {
        tasks: options.tasks,
        queue_depth: options.queue_depth,
        slices: options.slices.clone(),
        ..ReadOptions::default()
    };
    BatchStream::spawn("sluice-read-export", move |emit| {
        let shared = Arc::new(Shared {
            columns,
            plan: Mutex::new(None),
            filter,
            emit: emit.clone(),
            failed: Mutex::new(None),
        });
        let result = sluice_pages::read_export(device, &read, |_| ArrowSink {
            shared: shared.clone(),
            builder: None,
        });
        if let Some(e) = shared
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return Err(e);
        }
        result?;
        if !emit.schema_sent() {
            emit.schema(shared.columns.plan(&[])?.schema())?;
        }
        Ok(())
    })
}
