//! # sluice-pages
//!
//! The export device of sliced-scroll pagination, after the paper
//! "Sliced-scroll driven direct NVMe access for huge data pagination":
//! pages of search hits written with direct I/O at LBAs computed from their
//! slice's extents, and read back at device speed. This crate is the format
//! with its writer and reader, and nothing of where the pages come from: no
//! network, no search-engine client (that side is sluice-paginate's).
//!
//! - [`format`]: the device layout, byte by byte as docs/FORMAT.md has it;
//!   [`layout`]: loading an export's header, checkpoints and manifests, and
//!   the extent allocator.
//! - [`write`]: one task per slice pulls pages from a [`write::PageSource`]
//!   and writes each at its LBA; a per-slice checkpoint is made durable
//!   after it, so a resumed export continues with no gap and no duplicate.
//! - [`read`]: N tasks read the pages back through the io_uring engine with
//!   fixed buffers at deep queue depth and check each page with sluice-json's
//!   validating scan in the completion path, handing the hits (borrowed
//!   slices of the page) to a [`read::Sink`]; [`sinks`]: common sinks.
//! - [`page`]: a page's bytes, built straight into the pinned buffer it
//!   is written from; [`buffers`]: recycled buffers for answers and pages.
//! - [`device`]: the blocking device I/O the writer and loader use.
//! - [`docgen`]: seeded paper-shaped documents; [`synthetic`]: pages of
//!   them written without a search engine (the read benchmark's workload).
//! - [`progress`]: bars or lines for long work.
//!
//! Data flows one way: sluice-io (device, pool, engine) → this crate → the
//! exporter (sluice-paginate), the near-data operators, Arrow and the CLI.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod buffers;
pub mod device;
pub mod docgen;
/// What goes wrong, said so that the reader knows what to do next.
pub mod error;
pub mod format;
pub mod layout;
pub mod page;
pub mod progress;
pub mod read;
pub mod sinks;
pub mod synthetic;
pub mod write;

pub use error::{Error, Result};
pub use read::{
    read_export, read_pages, Hit, OnCorrupt, PageInfo, PageSink, ReadOptions, ReadSummary, Sink,
};
pub use write::{
    continue_export, write_new_export, ExportSummary, ExportWatch, FetchedPage, Layout, PageSource,
    WriteSettings, DEFAULT_CHECKPOINT_INTERVAL,
};
