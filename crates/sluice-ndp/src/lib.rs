//! # sluice-ndp
//!
//! Sluice's near-data operators: work that runs next to the data, inside
//! the engine, so that only results leave it.
//!
//! Built so far: the predicate language ([`expr`]: comparisons, ranges,
//! IN, prefix, exists, AND/OR/NOT, with errors that name the column), its
//! evaluation on JSON documents in place ([`json`]: only the fields a
//! predicate names are decoded), SCAN with predicate, projection and limit
//! over the store's iterator without copying non-matching pairs out, into
//! 4 KiB-multiple result batches of a documented encoding ([`scan`]), and
//! the seeded research-paper data set of the nKV demonstration
//! ([`papers`]), COUNT/SUM/MIN/MAX/AVG with GROUP BY on worker threads
//! over disjoint key ranges ([`aggregate`]), the demo scenario ([`demo`]), and
//! graph operators on an adjacency built by one scan of an edge keyspace
//! ([`graph`]: neighbours, BFS, Betweenness Centrality exact and sampled).
//! Accessors over raw SST blocks, pipelines and parallel scans come next
//! (issue 5).

pub mod aggregate;
pub mod demo;
pub mod expr;
pub mod format;
pub mod graph;
pub mod papers;
pub mod predicate;
pub mod scan;

pub use expr::{parse, ParseError, Predicate};
pub use format::{FormatError, Layout, Schema};
pub use predicate::{FieldPredicate, MalformedValue};
