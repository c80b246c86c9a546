//! # sluice-paginate
//!
//! Sliced-scroll pagination onto a device of our own, after the paper
//! "Sliced-scroll driven direct NVMe access for huge data pagination": the
//! source side. The export device itself (its format, writer and reader) is
//! sluice-pages', re-exported here under the same names.
//!
//! - [`export`]: one cursor per slice of a search index (point in time +
//!   search_after, or scroll) feeds the device's writer
//!   ([`write::write_new_export`]); `--resume` goes on from the slices'
//!   durable checkpoints with no gap and no duplicate.
//! - [`http`], [`plain`], [`source`]: the client to OpenSearch and
//!   Elasticsearch (TLS, auth, retries on refusals), the cursors, and pages
//!   built straight from the answers.
//! - [`load`]: a seeded data set of paper-shaped documents
//!   ([`docgen`]) bulk-indexed into a search engine.
//!
//! Data flows one way: sluice-io → sluice-pages → this crate → the CLI and
//! the Python package.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod export;
pub mod http;
pub mod load;
pub mod plain;
pub mod source;

// The export device's format, writer and reader (sluice-pages), under the
// names they had here.
pub use sluice_pages::{
    buffers, device, docgen, error, format, layout, page, progress, read, sinks, synthetic, write,
};

pub use error::{Error, Result};
pub use export::{export, ExportOptions};
pub use http::{Auth, Client, HttpOptions};
pub use read::{
    read_export, read_pages, Hit, OnCorrupt, PageInfo, PageSink, ReadOptions, ReadSummary, Sink,
};
pub use write::{
    write_new_export, ExportSummary, ExportWatch, FetchedPage, Layout, PageSource, WriteSettings,
    DEFAULT_CHECKPOINT_INTERVAL,
};
