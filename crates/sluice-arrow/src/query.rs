//! Near-data queries as Arrow: the SCAN operator's matching rows cut into
//! record batches of typed columns, and aggregates as one batch.

use crate::build::{ColumnsSpec, KeyColumn, WholeColumn};
use crate::stream::{BatchStream, Emitter};
use crate::types::ColumnType;
use crate::Error;
use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use sluice_ndp::aggregate::{aggregate, AggValue};
use sluice_ndp::fields::FieldReader;
use sluice_ndp::query::{parse_paths, Query, QueryText};
use sluice_ndp::scan::{self, ScanError, ScanSpec};
use sluice_store::{Store, ValueFormat};
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

/// Most rows per record batch.
pub const MAX_BATCH_ROWS: usize = 1 << 20;

/// A query as asked.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// Predicate text, e.g. `year >= 2010 AND venue = 'VLDB'`.
    pub predicate: Option<String>,
    /// Field paths to return as columns; none = every declared field (or
    /// the whole value where none are declared).
    pub select: Option<Vec<String>>,
    /// Also return the whole value as a `value` column.
    pub with_value: bool,
    /// First key (inclusive).
    pub start: Option<Vec<u8>>,
    /// End key (exclusive).
    pub end: Option<Vec<u8>>,
    /// Descending key order.
    pub reverse: bool,
    /// Most rows; none = all.
    pub limit: Option<usize>,
    /// Scan threads over disjoint key ranges.
    pub threads: usize,
    /// Rows per record batch.
    pub batch_rows: usize,
    /// Column types chosen by the caller, by field name.
    pub types: HashMap<String, ColumnType>,
}

impl Default for QueryOptions {
    fn default() -> Self {
        QueryOptions {
            predicate: None,
            select: None,
            with_value: false,
            start: None,
            end: None,
            reverse: false,
            limit: None,
            threads: 1,
            batch_rows: 65536,
            types: HashMap::new(),
        }
    }
}

/// Result batches of the scan operator are this big (bytes).
const SCAN_BATCH_BYTES: usize = 1 << 20;

/// Starts a query of `keyspace` and returns its rows as a stream of record
/// batches; the query is checked against the keyspace before this returns.
pub fn query_stream(
    store: Arc<Store>,
    keyspace: &str,
    options: &QueryOptions,
) -> Result<BatchStream, Error> {
    check_batch_rows(options.batch_rows)?;
    if options.threads == 0 || options.threads > 256 {
        return Err(Error::Usage(format!(
            "threads {} out of range: use 1 to 256",
            options.threads
        )));
    }
    let select = options.select.as_ref().map(|s| s.join(","));
    let query = Query::parse(&QueryText {
        predicate: options.predicate.as_deref(),
        select: select.as_deref(),
        ..QueryText::default()
    })?;
    let def = store.keyspace_def(keyspace)?;
    let plan = query.plan(&def)?;
    let fields = match (&query.select, &plan.layout) {
        (Some(paths), Some(layout)) => Some(FieldReader::new(layout, paths)?),
        (Some(_), None) => unreachable!("a raw keyspace's plan refuses a selection"),
        (None, Some(layout)) => FieldReader::declared_fields(layout),
        (None, None) => None,
    };
    let whole = (fields.is_none() || options.with_value).then(|| WholeColumn {
        name: "value".into(),
        binary: def.format == ValueFormat::Raw || def.format == ValueFormat::Record,
    });
    let columns = ColumnsSpec {
        key: KeyColumn::StoreKey,
        whole,
        fields: fields.map(Arc::new),
        types: options.types.clone(),
    };
    if columns.fields.is_none() && !columns.types.is_empty() {
        return Err(Error::Usage(
            "types were given, but the query returns no field columns (select some)".into(),
        ));
    }
    let options = options.clone();
    BatchStream::spawn("sluice-query", move |emit| {
        let spec = ScanSpec {
            keyspace: plan.keyspace,
            range: (
                options
                    .start
                    .as_deref()
                    .map_or(Bound::Unbounded, Bound::Included),
                options
                    .end
                    .as_deref()
                    .map_or(Bound::Unbounded, Bound::Excluded),
            ),
            reverse: options.reverse,
            predicate: plan.predicate.as_ref(),
            projection: None,
            limit: options.limit.unwrap_or(usize::MAX),
            batch_bytes: SCAN_BATCH_BYTES,
            threads: options.threads,
        };
        run_scan(&store, &spec, &columns, options.batch_rows, emit)
    })
}

/// Checks a batch size in rows.
pub fn check_batch_rows(rows: usize) -> Result<(), Error> {
    if rows == 0 || rows > MAX_BATCH_ROWS {
        return Err(Error::Usage(format!(
            "batch_rows {rows} out of range: use 1 to {MAX_BATCH_ROWS}"
        )));
    }
    Ok(())
}

/// The scan, its rows into batches of `batch_rows`.
fn run_scan(
    store: &Store,
    spec: &ScanSpec<'_>,
    columns: &ColumnsSpec,
    batch_rows: usize,
    emit: &Emitter,
) -> Result<(), Error> {
    let mut builder = None;
    let mut failed: Option<Error> = None;
    let stopped = || ScanError::Sink("stopped".into());
    let result = scan::scan(store, spec, &mut |batch| {
        if emit.cancelled() {
            failed = Some(Error::Cancelled);
            return Err(stopped());
        }
        let b = match &mut builder {
            Some(b) => b,
            None => {
                let sample: Vec<&[u8]> = batch.rows().map(|(_, v)| v).collect();
                let p = columns.plan(&sample).map_err(|e| {
                    let msg = e.to_string();
                    failed = Some(e);
                    ScanError::Sink(msg)
                })?;
                if let Err(e) = emit.schema(p.schema()) {
                    failed = Some(e);
                    return Err(stopped());
                }
                builder.insert(p.builder())
            }
        };
        for (k, v) in batch.rows() {
            if let Err(e) = b.append(k, v) {
                failed = Some(e);
                return Err(stopped());
            }
            if b.rows() >= batch_rows {
                let out = b.finish().and_then(|batch| emit.batch(batch));
                if let Err(e) = out {
                    failed = Some(e);
                    return Err(stopped());
                }
            }
        }
        Ok(())
    });
    if let Some(e) = failed {
        return Err(e);
    }
    result?;
    let b = match builder.as_mut() {
        Some(b) => b,
        None => {
            let p = columns.plan(&[])?;
            emit.schema(p.schema())?;
            builder.insert(p.builder())
        }
    };
    if b.rows() > 0 {
        emit.batch(b.finish()?)?;
    }
    Ok(())
}

/// An aggregate query (`count(*),avg(year)`, optionally grouped) as one
/// record batch: the group column (named by the field; utf8, strings
/// unquoted and other values as their JSON text) then one column per
/// aggregate, named as written (`avg(year)`).
pub fn aggregate_batch(
    store: &Store,
    keyspace: &str,
    predicate: Option<&str>,
    aggregates: &str,
    group_by: Option<&str>,
    threads: usize,
) -> Result<RecordBatch, Error> {
    let query = Query::parse(&QueryText {
        predicate,
        aggregate: Some(aggregates),
        group_by,
        ..QueryText::default()
    })?;
    let def = store.keyspace_def(keyspace)?;
    let plan = query.plan(&def)?;
    let spec = plan.aggregate_spec(threads.max(1)).ok_or_else(|| {
        Error::Usage(format!(
            "keyspace {keyspace} holds raw values: nothing to aggregate"
        ))
    })?;
    let (rows, _stats) = aggregate(store, &spec)?;
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    if let Some(g) = group_by {
        let name = parse_paths(g, "group_by")?
            .first()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let mut b = StringBuilder::new();
        // Groups are the field's JSON text: strings unquoted, other
        // values (numbers, booleans) as written.
        for r in &rows {
            match r.group.as_deref() {
                Some(g) => match sonic_rs::from_str::<String>(g) {
                    Ok(s) => b.append_value(s),
                    Err(_) => b.append_value(g),
                },
                None => b.append_null(),
            }
        }
        fields.push(Field::new(name, DataType::Utf8, true));
        arrays.push(Arc::new(b.finish()));
    }
    for (i, a) in spec.aggregates.iter().enumerate() {
        let column: Vec<&AggValue> = rows.iter().map(|r| &r.values[i]).collect();
        let all_int = column.iter().all(|v| {
            matches!(v, AggValue::Int(n) if i64::try_from(*n).is_ok())
                || matches!(v, AggValue::Null)
        }) && column.iter().any(|v| matches!(v, AggValue::Int(_)));
        if all_int {
            let mut b = Int64Builder::new();
            for v in column {
                match v {
                    AggValue::Int(n) => b.append_value(*n as i64),
                    _ => b.append_null(),
                }
            }
            fields.push(Field::new(a.to_string(), DataType::Int64, true));
            arrays.push(Arc::new(b.finish()));
        } else {
            let mut b = Float64Builder::new();
            for v in column {
                match v {
                    AggValue::Int(n) => b.append_value(*n as f64),
                    AggValue::Float(x) => b.append_value(*x),
                    AggValue::Null => b.append_null(),
                }
            }
            fields.push(Field::new(a.to_string(), DataType::Float64, true));
            arrays.push(Arc::new(b.finish()));
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}
