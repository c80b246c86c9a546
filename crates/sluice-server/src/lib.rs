//! # sluice-server
//!
//! The serving half of Sluice (`sluice serve`): connections, the Redis
//! protocol, command dispatch, above the store and below the CLI.
//!
//! - [`resp`]: client requests as Redis 7 frames them (multibulk and
//!   inline, its limits and exact protocol error texts) and replies of
//!   every RESP3 type, encoded in RESP3 or down-converted to RESP2;
//! - [`acl`]: Redis's ACL users — command, category and key rules,
//!   selectors, the check before each command, ACL LOG, the ACL file;
//! - [`session`]: a connection's own commands (PING, ECHO, HELLO, AUTH,
//!   SELECT, QUIT, RESET, CLIENT ID/SETNAME/GETNAME);
//! - [`commands`]: strings, keys and expiry, hashes, lists, sets, with
//!   Redis 7's checks and texts, over the data model of `sluice-redis`
//!   (records, members, expiry, the transaction overlay EXEC runs in);
//! - [`server`]: the thread-per-core server on `sluice_io::net` rings,
//!   durability modes, limits, MULTI/EXEC, INFO, shutdown.
//!
//! Every reply is checked byte for byte against a real `redis-server`
//! (tests/resp_redis.rs, tests/session_redis.rs, tests/commands_redis.rs).
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod acl;
pub mod commands;
pub mod resp;
pub mod server;
pub mod session;
