//! The blocking pops against a real `redis-server` 7: the same scenario —
//! clients that block, writes from others that wake them, timeouts,
//! transactions, type changes, disconnections — runs on both, and every
//! reply each client reads must be the same bytes, in the same order.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::scenario::{args, compare, Step::*};
use common::{request, small_store, start_sluice_on, Client};
use sluice_server::server::ServerConfig;
use std::io::Write;
use std::time::{Duration, Instant};

#[test]
fn blocked_clients_are_woken_in_the_order_they_blocked() {
    compare(
        4,
        &[
            Send(1, "BLPOP q 0"),
            Sleep(50),
            Send(2, "BRPOP other q 0"),
            Sleep(50),
            Send(3, "BLPOP q 0"),
            Sleep(50),
            Call(0, "RPUSH q a b"),
            Read(1),
            Read(2),
            Call(0, "LLEN q"),
            Call(0, "LPUSH q c"),
            Read(3),
            Call(0, "EXISTS q"),
        ],
    );
}

#[test]
fn a_blocking_pop_serves_at_once_times_out_or_answers_errors_as_redis() {
    compare(
        2,
        &[
            Call(0, "RPUSH l x y"),
            Call(0, "BLPOP l 0"),
            Call(0, "BRPOP nothere l 1"),
            Call(0, "BLPOP nothere 0.1"),
            Call(0, "BLPOP nothere -1"),
            Call(0, "BLPOP nothere abc"),
            Call(0, "SET s v"),
            Call(0, "BLPOP s 0"),
            Call(0, "BLMOVE nothere d LEFT MIDDLE 0"),
            Call(0, "BLMOVE nothere d LEFT RIGHT 0.05"),
            Call(0, "BRPOPLPUSH nothere d 0.05"),
            Call(0, "BLMPOP 0.05 2 a b LEFT"),
            Call(0, "BLMPOP 0 0 a LEFT"),
            Call(0, "BZPOPMIN nothere 0.05"),
            Call(0, "BZMPOP 0.05 1 nothere MIN"),
            Call(0, "BZMPOP 0 1 nothere FOO"),
            Call(0, "ZADD z 1 a 2 b"),
            Call(0, "BZPOPMAX z 0"),
            Call(0, "BZMPOP 0 1 z MIN COUNT 5"),
            Call(0, "MULTI"),
            Call(0, "BLPOP nothere 0"),
            Call(0, "BRPOPLPUSH nothere d 0"),
            Call(0, "EXEC"),
            // A pipelined command after a blocked one waits for it.
            Send(1, "BLPOP p 0.2"),
            Send(1, "PING"),
            Read(1),
            Read(1),
        ],
    );
}

/// Pipelined writes while a client waits: Redis serves the waiter right
/// after the write that woke it, before the writer's next pipelined
/// command (the second LPUSH answers 1, not 2), after a MULTI/EXEC as a
/// whole, and a server with two workers does the same whichever worker
/// each client is on.
#[test]
fn pipelined_writes_serve_a_blocked_client_between_them() {
    compare(
        2,
        &[
            Send(0, "BLPOP q 5"),
            Sleep(100),
            Pipeline(1, &["LPUSH q a", "LPUSH q b", "RPUSH q c", "LLEN q"]),
            Read(0),
            Call(1, "LRANGE q 0 -1"),
            Send(0, "BZPOPMIN zq 5"),
            Sleep(100),
            Pipeline(
                1,
                &["ZADD zq 1 a", "ZADD zq 2 b", "ZCARD zq", "ZRANGE zq 0 -1"],
            ),
            Read(0),
            Send(0, "BRPOP q2 5"),
            Sleep(100),
            Pipeline(
                1,
                &[
                    "MULTI",
                    "RPUSH q2 x",
                    "RPUSH q2 y",
                    "EXEC",
                    "RPUSH q2 z",
                    "LRANGE q2 0 -1",
                ],
            ),
            Read(0),
            Pipeline(1, &["LPUSH q d", "LPUSH q e", "RPOP q", "RPOP q"]),
        ],
    );
}

#[test]
fn writes_of_every_kind_wake_the_right_waiters() {
    compare(
        3,
        &[
            // BLMOVE: the pushed destination wakes its own waiter.
            Send(1, "BLMOVE src dst RIGHT LEFT 0"),
            Send(2, "BLPOP dst 0"),
            Sleep(50),
            Call(0, "RPUSH src 1"),
            Read(1),
            Read(2),
            // A transaction's writes wake once it commits; a key that is
            // pushed and deleted in it wakes nobody.
            Send(1, "BLPOP t 0"),
            Sleep(50),
            Call(0, "MULTI"),
            Call(0, "LPUSH t gone"),
            Call(0, "DEL t"),
            Call(0, "EXEC"),
            Sleep(50),
            Call(0, "RPUSH t kept"),
            Read(1),
            // A key made another type leaves its waiter waiting.
            Send(1, "BLPOP w 0"),
            Sleep(50),
            Call(0, "SET w string"),
            Sleep(50),
            Call(0, "DEL w"),
            Call(0, "RPUSH w now"),
            Read(1),
            // A woken BRPOPLPUSH whose destination is another type answers
            // WRONGTYPE and leaves the source as it was.
            Call(0, "SET target nolist"),
            Send(1, "BRPOPLPUSH bl target 0"),
            Sleep(50),
            Call(0, "RPUSH bl foo"),
            Read(1),
            Call(0, "LRANGE bl 0 -1"),
            // A list SORT ... STORE makes wakes.
            Send(1, "BLPOP sorted 0"),
            Sleep(50),
            Call(0, "RPUSH unsorted hello hola aguacate"),
            Call(0, "SORT unsorted ALPHA STORE sorted"),
            Read(1),
            // A list renamed into place wakes.
            Send(1, "BRPOP r 0"),
            Sleep(50),
            Call(0, "RPUSH tmp v"),
            Call(0, "RENAME tmp r"),
            Read(1),
            // Sorted sets.
            Send(1, "BZPOPMIN zz 0"),
            Send(2, "BZMPOP 0 1 zz MAX COUNT 2"),
            Sleep(50),
            Call(0, "ZADD zz 1 a 2 b 3 c"),
            Read(1),
            Read(2),
            // BLMPOP with a count.
            Send(1, "BLMPOP 0 2 m1 m2 RIGHT COUNT 3"),
            Sleep(50),
            Call(0, "RPUSH m2 a b"),
            Read(1),
        ],
    );
}

#[test]
fn xreadgroup_block_waits_for_new_entries_of_its_group() {
    compare(
        3,
        &[
            Call(0, "XGROUP CREATE q g $ MKSTREAM"),
            // Apart, so that they block in this order on both servers.
            Send(1, "XREADGROUP GROUP g w1 BLOCK 0 STREAMS q >"),
            Sleep(50),
            Send(2, "XREADGROUP GROUP g w2 COUNT 1 BLOCK 0 STREAMS q >"),
            Sleep(50),
            Call(0, "XINFO CONSUMERS q g"),
            Call(0, "XADD q 1-1 job 1"),
            Read(1),
            Call(0, "XADD q 2-1 job 2"),
            Read(2),
            Call(0, "XPENDING q g"),
            Call(0, "XREADGROUP GROUP g w1 BLOCK 50 STREAMS q >"),
            Call(0, "XREADGROUP GROUP g w1 BLOCK 0 STREAMS q 0"),
            Call(0, "MULTI"),
            Call(0, "XREADGROUP GROUP g w1 BLOCK 0 STREAMS q >"),
            Call(0, "EXEC"),
        ],
    );
}

#[test]
fn client_unblock_answers_a_blocked_client_as_a_timeout_or_an_error() {
    compare(
        3,
        &[
            Send(1, "BLPOP q 0"),
            Send(2, "XREAD BLOCK 0 STREAMS s $"),
            Sleep(50),
            Unblock(0, 1, "TIMEOUT"),
            Read(1),
            Unblock(0, 2, "ERROR"),
            Read(2),
            Unblock(0, 1, "TIMEOUT"),
            Unblock(0, 1, "NOPE"),
            Call(0, "CLIENT UNBLOCK x"),
            Call(0, "CLIENT UNBLOCK 1 TIMEOUT extra"),
            Call(0, "CLIENT UNBLOCK 999999"),
            // The unblocked client still works, and its old wait is gone.
            Call(0, "RPUSH q a"),
            Call(1, "LLEN q"),
            Send(1, "BRPOP q2 0"),
            Sleep(50),
            Unblock(0, 1, ""),
            Read(1),
        ],
    );
}

#[test]
fn xread_block_waits_for_entries_after_its_ids() {
    compare(
        3,
        &[
            Call(0, "XADD s 1-0 a 1"),
            Call(0, "XREAD BLOCK 0 STREAMS s 0"),
            Send(1, "XREAD BLOCK 0 STREAMS s $"),
            Send(2, "XREAD COUNT 1 BLOCK 0 STREAMS other s 0 1-0"),
            Sleep(50),
            Call(0, "XADD s 2-0 b 2"),
            Read(1),
            Read(2),
            Call(0, "XREAD BLOCK 50 STREAMS s 2-0"),
            Call(0, "XREAD BLOCK -1 STREAMS s 2-0"),
            Call(0, "XREAD BLOCK x STREAMS s 2-0"),
            Call(0, "MULTI"),
            Call(0, "XREAD BLOCK 0 STREAMS s $"),
            Call(0, "EXEC"),
            Send(1, "XREAD BLOCK 0 STREAMS new $"),
            Sleep(50),
            Call(0, "XADD new 5-0 c 3"),
            Read(1),
        ],
    );
}

#[test]
fn a_client_that_leaves_or_times_out_passes_the_item_on() {
    compare(
        3,
        &[
            Send(1, "BLPOP k 0"),
            Sleep(50),
            Send(2, "BLPOP k 0"),
            Sleep(50),
            Reconnect(1),
            Sleep(50),
            Call(0, "RPUSH k one"),
            Read(2),
            Send(1, "BLPOP k 0.1"),
            Send(2, "BLPOP k 0"),
            Sleep(300),
            Read(1),
            Call(0, "RPUSH k two"),
            Read(2),
        ],
    );
}

/// Thousands of blocked clients cost no thread each, and a timeout
/// arrives near its time.
#[test]
fn many_blocked_clients_and_timeouts_near_their_time() {
    let sluice = start_sluice_on(
        small_store(),
        ServerConfig {
            threads: 2,
            ..ServerConfig::default()
        },
    );
    let threads_before = std::fs::read_dir("/proc/self/task").unwrap().count();
    let mut waiting: Vec<Client> = (0..2000).map(|_| Client::connect(sluice.addr)).collect();
    for (i, c) in waiting.iter_mut().enumerate() {
        c.stream
            .write_all(&request(&args(&format!("BLPOP q{} 0", i % 10))))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    // Other tests of this binary start servers meanwhile: a thread per
    // waiter would be 2000 more.
    let threads_after = std::fs::read_dir("/proc/self/task").unwrap().count();
    assert!(
        threads_after < threads_before + 100,
        "blocked clients took threads: {threads_before} before, {threads_after} after"
    );
    let mut c = Client::connect(sluice.addr);
    let info = String::from_utf8(c.call(&[b"INFO", b"clients"])).unwrap();
    assert!(info.contains("blocked_clients:2000\r\n"), "{info}");
    for q in 0..10 {
        let items: String = (0..200).map(|i| format!(" {q}-{i}")).collect();
        c.call_reply(
            &args(&format!("RPUSH q{q}{items}"))
                .iter()
                .map(|a| &a[..])
                .collect::<Vec<_>>(),
        );
    }
    // Each item goes to exactly one of its list's waiters (in which order
    // the 2000 connections blocked is the two workers' to say).
    let mut got = std::collections::BTreeSet::new();
    for (i, w) in waiting.iter_mut().enumerate() {
        let reply = String::from_utf8(w.read_reply().unwrap()).unwrap();
        let item = reply.rsplit("\r\n").nth(1).unwrap().to_string();
        assert!(
            item.starts_with(&format!("{}-", i % 10)),
            "client {i}: {reply:?}"
        );
        assert!(got.insert(item), "client {i}: {reply:?} twice");
    }
    assert_eq!(got.len(), 2000);
    let info = String::from_utf8(c.call(&[b"INFO", b"clients"])).unwrap();
    assert!(info.contains("blocked_clients:0\r\n"), "{info}");
    let started = Instant::now();
    let reply = c.call(&[b"BLPOP", b"empty", b"0.25"]);
    let took = started.elapsed();
    assert_eq!(reply, b"*-1\r\n");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(400),
        "a 250 ms timeout took {took:?}"
    );
}

/// CLIENT PAUSE against a real `redis-server`: WRITE holds writes, scripts
/// not declared `no-writes`, PUBLISH and an EXEC that queued a write,
/// while reads, errors Redis gives at once and read-only scripts go on;
/// UNPAUSE releases them in order; ALL holds everything until its time
/// is up; and CLIENT PAUSE's refusals.
#[test]
fn client_pause_holds_what_redis_holds() {
    compare(
        4,
        &[
            // Each held client writes its own key: the workers release
            // them in no set order among themselves.
            Call(0, "SET a 0"),
            Call(3, "MULTI"),
            Call(3, "INCR c"),
            Call(0, "CLIENT PAUSE 100000 WRITE"),
            Call(1, "GET a"),
            Send(1, "SET a 1"),
            Send(2, "EVAL \"return redis.call('incr', 'b')\" 0"),
            Send(3, "EXEC"),
            Sleep(100),
            Call(0, "MGET a b c"),
            Call(0, "SET b"),
            Call(0, "NOSUCH"),
            Call(
                0,
                "EVAL \"#!lua flags=no-writes\nreturn redis.call('get', 'a')\" 0",
            ),
            Call(0, "EVAL_RO \"return redis.call('get', 'a')\" 0"),
            Call(0, "EVAL_RO \"return redis.call('publish', 'ch', 'm')\" 0"),
            Call(0, "CLIENT PAUSE 10 MAYBE"),
            Call(0, "CLIENT PAUSE soon"),
            Call(0, "CLIENT PAUSE -1"),
            Call(0, "CLIENT PAUSE 1 WRITE ALL"),
            Call(0, "CLIENT UNPAUSE"),
            Read(1),
            Read(2),
            Read(3),
            Call(0, "MGET a b c"),
            Call(0, "CLIENT PAUSE 300 ALL"),
            Send(1, "GET a"),
            Send(2, "PING"),
            Sleep(50),
            Call(3, "CLIENT PAUSE 10 WRITE"),
            Read(1),
            Read(2),
            Call(0, "CLIENT UNPAUSE"),
        ],
    );
}
