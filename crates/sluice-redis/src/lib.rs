//! # sluice-redis
//!
//! Redis's data model over Sluice's store, with no networking: what a key
//! holds and how each type's members are laid out (docs/FORMAT.md,
//! "Serving keyspace"), expiry, stripe locks and WATCH counters, and the
//! transaction overlay a MULTI/EXEC reads its own writes through. The
//! server (`sluice-server`) keeps the protocol, connections and dispatch;
//! tests and tools open a keyspace here without a socket.
//!
//! - [`record`]: a key's record — type, expiry, a string's bytes or a
//!   collection's object id, size and type fields;
//! - [`databases`]: the 16 databases SELECT picks, their keyspaces and
//!   the map SWAPDB changes;
//! - [`db`]: the keyspace on the store — its store keyspaces, object ids,
//!   stripe locks, WATCH, SCAN cursors, the expiry sweep, write batches;
//! - [`ctx`]: one command's run — its snapshot, its reads (through a
//!   transaction's [`overlay`]), its batch;
//! - one module per type over them, in Kvrocks's manner: [`hash`],
//!   [`list`], [`set`], [`zset`] (with [`number`]: doubles as Redis
//!   reads and prints them), and [`hyperloglog`]'s representation of the
//!   strings PFADD writes;
//! - [`dump`]: DUMP and RESTORE payloads in Redis's RDB serialization;
//! - [`upgrade`]: hashes of the layout before object ids, rewritten at open.
//!
//! Every operation of a type checks the key's type first
//! (`WRONGTYPE ...`), and every change it makes is one store batch.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod ctx;
pub mod databases;
pub mod db;
pub mod dump;
pub mod dump_stream;
pub mod error;
pub mod hash;
pub mod hyperloglog;
pub mod list;
pub mod number;
pub mod overlay;
mod rdb;
pub mod record;
pub mod set;
pub mod stream;
pub mod stream_group;
pub mod upgrade;
pub mod zset;

pub use ctx::Ctx;
pub use databases::{Space, DATABASES};
pub use db::Db;
pub use error::Failure;
pub use record::{Collection, Entry, Read, StreamId, StreamMeta, Value};
