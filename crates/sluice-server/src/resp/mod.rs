//! The Redis protocol: client requests as Redis 7 frames them
//! ([`request`]), and replies in RESP2 and RESP3 ([`reply`]), each checked
//! byte for byte against a real `redis-server` (tests/resp_redis.rs).

pub mod reply;
pub mod request;

pub use reply::{BulkArray, DecodeError, Protocol, Reply};
pub use request::{
    split_args, string_to_i64, Args, Limits, ProtocolError, RequestReader, DEFAULT_BULK_MAX_BYTES,
    INLINE_MAX_BYTES, MULTIBULK_MAX, UNAUTHENTICATED_BULK_MAX_BYTES, UNAUTHENTICATED_MULTIBULK_MAX,
};
