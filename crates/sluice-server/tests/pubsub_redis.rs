//! Publish/subscribe against a real `redis-server` 7: subscribers on
//! several connections, publishers, patterns, shard channels, RESP3 push
//! messages and RESP2's subscriber context — every reply and message each
//! client reads must be the same bytes, in the same order.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::scenario::{compare, Step::*};

#[test]
fn messages_reach_every_subscriber_as_redis_sends_them() {
    compare(
        4,
        &[
            Call(1, "SUBSCRIBE news"),
            Send(1, "SUBSCRIBE sport weather"),
            Read(1),
            Read(1),
            Call(2, "PSUBSCRIBE n*"),
            Send(2, "PSUBSCRIBE w?ather s*"),
            Read(2),
            Read(2),
            Quiet(3, "HELLO 3"),
            Call(3, "SUBSCRIBE news"),
            Call(0, "PUBLISH news hello"),
            Read(1),
            Read(2),
            Read(3),
            Call(0, "PUBLISH weather rain"),
            Read(1),
            Read(2),
            Call(0, "PUBLISH nothing x"),
            Call(0, "PUBSUB CHANNELS w*"),
            Call(0, "PUBSUB CHANNELS n*"),
            Call(0, "PUBSUB NUMSUB news sport nothing"),
            Call(0, "PUBSUB NUMSUB"),
            Call(0, "PUBSUB NUMPAT"),
            Call(0, "PUBSUB FOO"),
            Call(0, "PUBSUB CHANNELS a b"),
            Call(1, "PING"),
            Call(1, "PING hi"),
            Call(1, "GET x"),
            Call(1, "SET x y"),
            Call(1, "CLIENT ID"),
            Call(1, "FOO"),
            Call(1, "UNSUBSCRIBE news"),
            Send(1, "UNSUBSCRIBE sport weather"),
            Read(1),
            Read(1),
            Call(1, "UNSUBSCRIBE"),
            Call(1, "GET x"),
            Call(2, "PUNSUBSCRIBE n*"),
            Call(3, "GET x"),
            Call(3, "PING"),
            Call(3, "UNSUBSCRIBE news"),
            Call(0, "PUBLISH news bye"),
            Call(2, "PUNSUBSCRIBE w?ather"),
            Call(2, "PUNSUBSCRIBE s*"),
            Call(2, "PUNSUBSCRIBE"),
            Call(1, "SSUBSCRIBE shard"),
            Call(0, "SPUBLISH shard sharded"),
            Read(1),
            Call(0, "PUBSUB SHARDCHANNELS"),
            Call(0, "PUBSUB SHARDNUMSUB shard"),
            Call(1, "SUNSUBSCRIBE shard"),
            Call(1, "SUBSCRIBE again"),
            Call(1, "RESET"),
            Call(0, "PUBLISH again nobody"),
            Call(0, "SUBSCRIBE"),
        ],
    );
}
