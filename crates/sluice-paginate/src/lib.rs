//! # sluice-paginate
//!
//! Sliced-scroll pagination onto a device of our own, after the paper
//! "Sliced-scroll driven direct NVMe access for huge data pagination":
//!
//! - [`export`]: one task per slice of a search index pulls pages (point in
//!   time + search_after, or scroll) and writes each with direct I/O at the
//!   LBA its slice's extents give; a per-slice checkpoint is made durable
//!   after each page, so `--resume` continues with no gap and no duplicate.
//! - [`read`]: N tasks read the pages back through the io_uring engine with
//!   fixed buffers at deep queue depth and check each page with sluice-json's
//!   validating scan in the completion path, handing the hits (borrowed
//!   slices of the page) to a [`read::Sink`].
//! - [`page`]: a page's bytes, built straight into the pinned buffer it
//!   is written from.
//! - [`buffers`]: recycled buffers for answers and pages (no fresh
//!   megabytes per page).
//! - [`format`]: the device layout, byte by byte as docs/FORMAT.md has it.
//! - [`http`], [`source`]: the client to OpenSearch/Elasticsearch.
//! - [`load`], [`docgen`]: a seeded data set of paper-shaped documents;
//!   [`synthetic`]: pages of them written without a search engine, through
//!   [`export::write_new_export`] (the read benchmark's workload).
//!
//! Data flows one way: sluice-io (device, pool, engine) → this crate → the
//! store's import and the CLI.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod buffers;
pub mod device;
pub mod docgen;
/// What goes wrong, said so that the reader knows what to do next.
pub mod error;
pub mod export;
pub mod format;
pub mod http;
pub mod layout;
pub mod load;
pub mod page;
pub mod plain;
pub mod progress;
pub mod read;
pub mod sinks;
pub mod source;
pub mod synthetic;

pub use error::{Error, Result};
pub use export::{
    export, write_new_export, ExportOptions, ExportSummary, ExportWatch, Layout, PageSource,
    WriteSettings, DEFAULT_CHECKPOINT_INTERVAL,
};
pub use http::{Auth, Client, HttpOptions};
pub use read::{
    read_export, read_pages, Hit, OnCorrupt, PageInfo, PageSink, ReadOptions, ReadSummary, Sink,
};
pub use source::FetchedPage;
