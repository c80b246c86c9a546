//! # sluice-ndp
//!
//! Sluice's near-data operators: work that runs next to the data, inside
//! the engine, so that only results leave it.
//!
//! Built so far: the predicate language ([`expr`]: comparisons, ranges,
//! IN, prefix, exists, AND/OR/NOT, with errors that name the column) and
//! its evaluation on JSON documents in place ([`json`]: only the fields a
//! predicate names are decoded), and the seeded research-paper data set of
//! the nKV demonstration ([`papers`]). Scans over the store's blocks,
//! aggregates, graph operators and result batches come next (issue 5).

pub mod expr;
pub mod json;
pub mod papers;

pub use expr::{parse, ParseError, Predicate};
pub use json::{JsonPredicate, MalformedJson};
