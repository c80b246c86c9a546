//! # sluice-ndp
//!
//! Sluice's near-data operators: work that runs next to the data, inside
//! the engine, so that only results leave it.
//!
//! - [`expr`]: the predicate language of Sluice (comparisons, ranges, IN,
//!   prefix, contains, exists, AND/OR/NOT), with errors that name the
//!   column;
//! - [`format`]: the declared value formats (JSON with or without declared
//!   fields, typed records) and the checks a query passes before it runs;
//! - [`fields`]: projected paths read out of values as typed field values
//!   (what Arrow result sets are built from);
//! - [`predicate`]: predicates evaluated on stored values in place, only
//!   the fields they name decoded;
//! - [`query`]: a query as text checked and compiled against a keyspace's
//!   format (what `sluice query` runs);
//! - [`scan`]: SCAN with predicate, projection and limit, on worker threads
//!   over disjoint key ranges, into 4 KiB-multiple result batches of a
//!   documented encoding;
//! - [`aggregate`]: COUNT/SUM/MIN/MAX/AVG with GROUP BY, on worker threads;
//! - [`graph`]: an adjacency built by one scan of an edge keyspace,
//!   neighbours, BFS, Betweenness Centrality exact and sampled on worker
//!   threads, and the SCAN → BC pipeline;
//! - [`pages`]: the same predicates over an export's pages (`sluice read
//!   --where`);
//! - [`papers`]: the seeded research-paper data set of the nKV
//!   demonstration, and [`demo`]: its scenario.
//!
//! The operators read pairs through the store's merged iterator, which
//! walks the SST data blocks in place (prefix-compressed entries decoded
//! from the cached block) and hands each visible pair over by reference;
//! the pair is copied once from the block into the iterator's head buffer,
//! never parsed whole.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod aggregate;
pub mod demo;
pub mod expr;
pub mod fields;
pub mod format;
pub mod graph;
mod json_value;
pub mod pages;
pub mod papers;
pub mod predicate;
pub mod query;
pub mod scan;

pub use expr::{parse, ParseError, Predicate};
pub use format::{check_definition, encode_value, FormatError, Layout, Schema};
pub use predicate::{FieldPredicate, MalformedValue};
