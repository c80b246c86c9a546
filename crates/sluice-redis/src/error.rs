//! Why an operation on the keyspace failed: a Redis error text, or the
//! store's error.

use sluice_store::StoreError;

/// Why a command failed: a Redis error text, or the store's.
#[derive(Debug)]
pub enum Failure {
    /// An error reply, already in Redis's words (`WRONGTYPE ...`, `ERR ...`).
    Reply(String),
    /// The store failed under the command.
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// A [`Failure::Reply`] of `text`.
pub fn fail(text: &str) -> Failure {
    Failure::Reply(text.to_string())
}

/// Redis's reply to a command on a key of another type.
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Redis's reply to an argument that is not an integer in range.
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
/// Redis's reply to a malformed option list.
pub const SYNTAX: &str = "ERR syntax error";
/// Redis's reply to an argument that is not a float.
pub const NOT_FLOAT: &str = "ERR value is not a valid float";
/// Redis's reply to INCR past i64.
pub const OVERFLOW: &str = "ERR increment or decrement would overflow";
/// Redis's reply to an index past a list's end (LSET).
pub const NO_SUCH_KEY: &str = "ERR no such key";
/// Redis's `proto-max-bulk-len` default: the longest string a command may make.
pub const STRING_MAX_BYTES: u64 = 512 << 20;
