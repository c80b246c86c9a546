//! # sluice-http
//!
//! An Elasticsearch/OpenSearch-compatible HTTP API over the store
//! (`sluice serve --http`): unmodified search clients, shippers and
//! Sluice's own exporter read and write Sluice through it.
//!
//! - [`wire`]: HTTP/1.1 requests and responses, with limits, chunked and
//!   gzip bodies;
//! - [`catalog`]: indices as store keyspaces, their mappings and settings;
//! - [`docs`]: document writes checked in order and committed as one store
//!   batch per request; reads; `_source` filtering;
//! - [`columns`]: in-memory columns of the fields counts and aggregations
//!   name, kept current by every write;
//! - [`dsl`]: the query DSL subset that compiles to near-data predicates;
//! - [`search`]: search on a snapshot, sort, `search_after`, slices, and
//!   the scroll and point-in-time contexts;
//! - [`aggs`]: aggregations run by the near-data aggregates;
//! - [`reqcache`]: answers of counts and size-0 searches kept per index
//!   generation;
//! - [`api`]: the routes and Elasticsearch's response and error shapes;
//! - [`native`]: Sluice's own endpoints (`/_sluice/query`, `graph/bc`,
//!   `demo`, `keyspaces`, `stats`) and the web console; [`history`]: the
//!   last ten minutes of figures its charts draw;
//! - the network model: [`serve`] starts the listener with its
//!   [`config`]; `ring` serves connections on network rings
//!   (`sluice_io::net`, as the Redis protocol's are: a connection is a
//!   slot, not a thread), `framing` finds whole requests in what arrived,
//!   `pool` runs them on a fixed few threads, `access` decides who may
//!   come in.
//!
//! docs/HTTP.md lists what is served and how it differs from Elasticsearch.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod access;
pub mod aggs;
pub mod api;
mod bulk;
pub mod catalog;
pub mod columns;
pub mod config;
mod crud;
pub mod docs;
pub mod dsl;
pub mod error;
pub mod framing;
pub mod history;
mod indices;
pub mod native;
mod pool;
pub mod reqcache;
mod ring;
pub mod search;
mod searching;
pub mod serve;
pub mod tombstones;
pub mod wire;

pub use api::Api;
pub use error::{ApiError, ApiResult};
pub use serve::{HttpConfig, HttpServer};
