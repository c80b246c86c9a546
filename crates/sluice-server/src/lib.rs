//! # sluice-server
//!
//! The serving half of Sluice (`sluice serve`): connections, the Redis
//! protocol, command dispatch, above the store and the near-data operators
//! and below the CLI. Built in steps; so far:
//!
//! - [`resp`]: reading client requests — RESP multibulk and inline
//!   commands — with Redis 7's limits and its exact protocol error texts,
//!   checked byte for byte against a real `redis-server` in
//!   `tests/resp_redis.rs`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod resp;
