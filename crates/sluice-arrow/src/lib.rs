//! # sluice-arrow
//!
//! Sluice's result sets in Apache Arrow, the columnar format of the data
//! ecosystem (pyarrow, pandas, Polars, DuckDB, Dask):
//!
//! - [`query`]: the near-data SCAN operator's matching rows as record
//!   batches of typed columns (a keyspace's declared types, or inferred
//!   from the first documents), and aggregates as one batch;
//! - [`export`]: an export's documents (`_id` and projected `_source`
//!   fields) read back with direct I/O as record batches, one per page;
//! - [`stream`]: the bounded hand-over from the producing thread to an
//!   Arrow `RecordBatchReader`, so memory stays at a few batches;
//! - [`ipc`]: an Arrow IPC stream writer (`sluice query --format arrow`);
//! - [`types`] and [`build`]: column types and the row-to-column builders.
//!
//! The store's own result batch encoding stays as it is (4 KiB-aligned,
//! written and read with direct I/O, see `sluice_ndp::scan`); Arrow is
//! built from it at the edge, where a consumer asks for columns.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod build;
pub mod export;
pub mod ipc;
pub mod query;
pub mod stream;
pub mod types;

pub use export::{export_stream, ExportReadOptions};
pub use query::{aggregate_batch, query_stream, QueryOptions};
pub use stream::BatchStream;
pub use types::ColumnType;

/// What building an Arrow result set can fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value its column's type cannot hold.
    #[error(
        "column {column}: {row} holds {value}, which its {column_type} column ({origin}) cannot hold; \
         give the column a type that does, e.g. {column}:json (types={{'{column}': 'json'}} in Python)"
    )]
    Mismatch {
        /// The column (a field path).
        column: String,
        /// The row (key or document id).
        row: String,
        /// The value found.
        value: String,
        /// The column's type.
        column_type: String,
        /// Where the type came from.
        origin: &'static str,
    },
    /// The store failed or refused.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// The query text is wrong.
    #[error(transparent)]
    Query(#[from] sluice_ndp::query::QueryError),
    /// The query does not fit the keyspace's format.
    #[error(transparent)]
    Format(#[from] sluice_ndp::FormatError),
    /// The scan failed.
    #[error(transparent)]
    Scan(#[from] sluice_ndp::scan::ScanError),
    /// Reading the export failed.
    #[error(transparent)]
    Export(#[from] sluice_pages::Error),
    /// A stored value that is not of its format.
    #[error("{0}")]
    Malformed(String),
    /// Arrow refused a batch.
    #[error("Arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A request out of range or inconsistent.
    #[error("{0}")]
    Usage(String),
    /// The consumer stopped the stream.
    #[error("interrupted")]
    Cancelled,
    /// The reader was interrupted while it waited (Ctrl-C in Python).
    #[error("interrupted (Ctrl-C): the stream was stopped")]
    Interrupted,
}

impl From<sluice_ndp::MalformedValue> for Error {
    fn from(e: sluice_ndp::MalformedValue) -> Self {
        Error::Malformed(e.to_string())
    }
}
