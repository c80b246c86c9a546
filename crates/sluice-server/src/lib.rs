//! # sluice-server
//!
//! The serving half of Sluice (`sluice serve`): connections, the Redis
//! protocol, command dispatch, above the store and the near-data operators
//! and below the CLI. Built in steps; so far:
//!
//! - [`resp`]: reading client requests — RESP multibulk and inline
//!   commands — with Redis 7's limits and its exact protocol error texts,
//!   and replies of every RESP3 type, encoded in RESP3 or down-converted
//!   to RESP2 as Redis does; both checked byte for byte against a real
//!   `redis-server` in `tests/resp_redis.rs`;
//! - [`session`]: a connection's state and the commands about it (PING,
//!   ECHO, HELLO, AUTH, SELECT, QUIT, RESET, CLIENT ID/SETNAME/GETNAME),
//!   answered as Redis 7 answers them, checked against a real
//!   `redis-server` in `tests/session_redis.rs`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod commands;
pub mod db;
pub mod resp;
pub mod server;
pub mod session;
