//! Differential test of the data commands: the same command sequences go
//! to a real `redis-server` 7 and to a Sluice server (through the whole
//! server: framing, dispatch, the store, durability), and every reply must
//! be the same bytes — in RESP2 and after `HELLO 3` in RESP3. Each
//! sequence runs twice, with Sluice reached over TCP and then over its
//! shared-memory rings (`--shm`).
//!
//! Where the two may differ by design the comparison says so: replies
//! listing KEYS, a set's members or a large hash's fields are compared as
//! sets (Redis lists in hash-table order, Sluice in key order; a small
//! hash, which Redis keeps as a listpack, must list its fields in the same
//! order), and PTTL / EXPIRETIME / PEXPIRETIME within the time the two
//! servers' clocks are read apart.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::{small_store, start_redis, start_sluice_on, Client, Redis, Sluice};
use proptest::prelude::*;
use sluice_server::resp::Reply;
use sluice_server::server::{Durability, ServerConfig, ShmSettings};
use std::io::Write;
use std::sync::{Mutex, OnceLock};

struct Pair {
    redis: Redis,
    sluice: Sluice,
    shm_path: std::path::PathBuf,
    /// One sequence at a time: each starts from empty databases.
    lock: Mutex<()>,
}

fn pair() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| {
        let shm_path =
            std::env::temp_dir().join(format!("sluice-commands-redis-{}.sock", std::process::id()));
        let sluice = start_sluice_on(
            small_store(),
            ServerConfig {
                threads: 2,
                durability: Durability::Always,
                shm: Some(ShmSettings::at(&shm_path)),
                ..ServerConfig::default()
            },
        );
        Pair {
            redis: start_redis(&[]),
            sluice,
            shm_path,
            lock: Mutex::new(()),
        }
    })
}

/// Sluice, reached one of two ways.
enum Via {
    Tcp(Client),
    Shm(sluice_client::Client),
}

impl Via {
    fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        match self {
            Via::Tcp(c) => c.call(args),
            Via::Shm(c) => c.call_raw(args).unwrap(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Via::Tcp(_) => "tcp",
            Via::Shm(_) => "shm",
        }
    }
}

fn decode(bytes: &[u8]) -> Reply {
    Reply::decode(bytes).unwrap().unwrap().0
}

fn sorted(items: &[Reply]) -> Vec<String> {
    let mut v: Vec<String> = items.iter().map(|r| format!("{r:?}")).collect();
    v.sort();
    v
}

fn sorted_pairs(items: &[Reply]) -> Vec<String> {
    let mut v: Vec<String> = items.chunks(2).map(|p| format!("{p:?}")).collect();
    v.sort();
    v
}

/// Whether a hash whose fields (and values) a reply lists, `per_field`
/// items each, is one Redis keeps as a hash table (more than 512 fields or
/// an item longer than 64 bytes, its defaults), whose order is its own.
fn hash_table_sized(items: &[Reply], per_field: usize) -> bool {
    items.len() / per_field > 512
        || items
            .iter()
            .any(|r| matches!(r, Reply::Bulk(b) if b.len() > 64))
}

/// Whether two replies to `args` agree, by the rules in the module docs;
/// `queued`: the commands an EXEC runs.
fn agree(args: &[Vec<u8>], redis: &[u8], sluice: &[u8], queued: &[Vec<Vec<u8>>]) -> bool {
    redis == sluice || agree_reply(args, &decode(redis), &decode(sluice), queued)
}

fn agree_reply(args: &[Vec<u8>], r: &Reply, s: &Reply, queued: &[Vec<Vec<u8>>]) -> bool {
    if r == s {
        return true;
    }
    let name = args[0].to_ascii_lowercase();
    match (&name[..], r, s) {
        (b"exec", Reply::Array(a), Reply::Array(b)) => {
            a.len() == b.len()
                && a.len() == queued.len()
                && (0..a.len()).all(|i| agree_reply(&queued[i], &a[i], &b[i], &[]))
        }
        (b"keys", Reply::Array(a), Reply::Array(b)) => sorted(a) == sorted(b),
        (b"hkeys" | b"hvals", Reply::Array(a), Reply::Array(b)) => {
            hash_table_sized(a, 1) && sorted(a) == sorted(b)
        }
        // Sets: Redis lists members in hash order, Sluice in byte order.
        (
            b"smembers" | b"sinter" | b"sunion" | b"sdiff",
            Reply::Array(a) | Reply::Set(a),
            Reply::Array(b) | Reply::Set(b),
        ) => sorted(a) == sorted(b),
        (b"sscan", Reply::Array(a), Reply::Array(b)) if a.len() == 2 && b.len() == 2 => {
            match (&a[1], &b[1]) {
                (Reply::Array(x), Reply::Array(y)) => a[0] == b[0] && sorted(x) == sorted(y),
                _ => false,
            }
        }
        (b"hgetall", Reply::Array(a), Reply::Array(b)) => {
            hash_table_sized(a, 2) && sorted_pairs(a) == sorted_pairs(b)
        }
        (b"hgetall", Reply::Map(a), Reply::Map(b)) => {
            let flat = |m: &Vec<(Reply, Reply)>| {
                let mut v: Vec<String> = m.iter().map(|p| format!("{p:?}")).collect();
                v.sort();
                v
            };
            let items: Vec<Reply> = a.iter().flat_map(|(f, v)| [f.clone(), v.clone()]).collect();
            hash_table_sized(&items, 2) && flat(a) == flat(b)
        }
        (b"hscan", Reply::Array(a), Reply::Array(b)) if a.len() == 2 && b.len() == 2 => {
            match (&a[1], &b[1]) {
                (Reply::Array(x), Reply::Array(y)) => {
                    a[0] == b[0] && hash_table_sized(x, 2) && sorted_pairs(x) == sorted_pairs(y)
                }
                _ => false,
            }
        }
        (b"pttl" | b"pexpiretime", Reply::Integer(a), Reply::Integer(b)) => {
            *a >= 0 && *b >= 0 && (a - b).abs() <= 2000
        }
        (b"expiretime", Reply::Integer(a), Reply::Integer(b)) => *a >= 0 && (a - b).abs() <= 2,
        // The connection ids are the two servers' own.
        (b"hello", Reply::Map(a), Reply::Map(b)) => without_id(a) == without_id(b),
        (b"hello", Reply::Array(a), Reply::Array(b)) => {
            let pairs = |v: &[Reply]| {
                v.chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect::<Vec<_>>()
            };
            without_id(&pairs(a)) == without_id(&pairs(b))
        }
        _ => false,
    }
}

fn without_id(map: &[(Reply, Reply)]) -> Vec<(Reply, Reply)> {
    map.iter()
        .filter(|(k, _)| *k != Reply::Bulk(b"id".to_vec()))
        .cloned()
        .collect()
}

fn show(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `script` on both servers from empty databases, Sluice over TCP
/// and then over shared memory; the first reply that differs fails the
/// test with the script up to it.
fn compare(script: &[Vec<Vec<u8>>]) -> Result<(), TestCaseError> {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let url = format!("shm://{}", p.shm_path.display());
    let tcp = Via::Tcp(Client::connect(p.sluice.addr));
    let shm = Via::Shm(sluice_client::Client::connect(&url).unwrap());
    for sluice in [tcp, shm] {
        compare_via(script, p, sluice)?;
    }
    Ok(())
}

fn compare_via(script: &[Vec<Vec<u8>>], p: &Pair, mut sluice: Via) -> Result<(), TestCaseError> {
    let mut redis = Client::connect_port(p.redis.port);
    redis.call(&[b"FLUSHALL"]);
    sluice.call(&[b"FLUSHALL"]);
    let mut queued: Option<Vec<Vec<Vec<u8>>>> = None;
    for (i, args) in script.iter().enumerate() {
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let r = redis.call(&refs);
        let s = sluice.call(&refs);
        let in_tx = queued.clone().unwrap_or_default();
        let name = args[0].to_ascii_lowercase();
        if r == b"+QUEUED\r\n" {
            queued.get_or_insert_with(Vec::new).push(args.clone());
        } else if name == b"multi" && r == b"+OK\r\n" {
            queued = Some(Vec::new());
        } else if name == b"exec" || name == b"discard" || name == b"reset" {
            queued = None;
        }
        prop_assert!(
            agree(args, &r, &s, &in_tx),
            "command {i} `{}` differs (sluice over {}):\n  redis:  {:?}\n  sluice: {:?}\nscript so far:\n  {}",
            show(args),
            sluice.name(),
            String::from_utf8_lossy(&r),
            String::from_utf8_lossy(&s),
            script[..=i]
                .iter()
                .map(|a| show(a))
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    Ok(())
}

fn script(lines: &[&str]) -> Vec<Vec<Vec<u8>>> {
    lines
        .iter()
        .map(|l| sluice_server::resp::split_args(l.as_bytes()).unwrap())
        .collect()
}

#[test]
fn strings_match_redis() {
    compare(&script(&[
        "SET a 1",
        "GET a",
        "GET missing",
        "SET a 2 NX",
        "SET a 3 XX GET",
        "SET b 1 XX",
        "SET b 1 NX GET",
        "SET a 1 NX XX",
        "SET a 1 EX",
        "SET a 1 EX 0",
        "SET a 1 EX -5",
        "SET a 1 EX abc",
        "SET a 1 PX 9223372036854775807",
        "SET a 1 EX 100 PX 100",
        "SET a 1 EX 100 EX 200",
        "SET a 1 KEEPTTL EX 5",
        "SET a 1 EX 100",
        "TTL a",
        "SET a 2 KEEPTTL",
        "TTL a",
        "SET a 3",
        "TTL a",
        "SET a 1 EXAT 1",
        "GET a",
        "EXISTS a",
        "SET a 1 PXAT 99999999999999",
        "TTL a",
        "SETNX a 5",
        "SETNX n 5",
        "SETEX e 100 v",
        "SETEX e 0 v",
        "SETEX e x v",
        "PSETEX e 100000 v",
        "GETSET e w",
        "TTL e",
        "GETSET nothere w",
        "GETDEL e",
        "GETDEL e",
        "SET g v EX 100",
        "GETEX g",
        "GETEX g PERSIST",
        "TTL g",
        "GETEX g EX 50",
        "TTL g",
        "GETEX g EX 50 PERSIST",
        "GETEX g KEEPTTL",
        "GETEX nothere EX 5",
        "GETEX g EX 0",
        "MSET x 1 y 2 z",
        "MSET x 1 y 2",
        "MGET x y nothere",
        "MSETNX x 5 w 6",
        "MSETNX v 5 w 6",
        "MGET v w",
        "APPEND s hello",
        "APPEND s \" world\"",
        "GET s",
        "STRLEN s",
        "STRLEN nothere",
        "GETRANGE s 0 4",
        "GETRANGE s -5 -1",
        "GETRANGE s -1 -5",
        "GETRANGE s 5 1",
        "GETRANGE s 0 100",
        "GETRANGE s -100 2",
        "GETRANGE s a 1",
        "GETRANGE nothere 0 1",
        "SUBSTR s 1 3",
        "SETRANGE s 6 there",
        "GET s",
        "SETRANGE s 20 x",
        "GET s",
        "SETRANGE r 3 abc",
        "GET r",
        "SETRANGE q 3 \"\"",
        "EXISTS q",
        "SETRANGE s -1 x",
        "SETRANGE s 536870912 x",
        "INCR i",
        "INCRBY i 10",
        "DECR i",
        "DECRBY i 5",
        "INCRBY i abc",
        "DECRBY i -9223372036854775808",
        "SET i 9223372036854775807",
        "INCR i",
        "SET i -9223372036854775808",
        "DECR i",
        "INCR s",
        "SET f 10.5",
        "INCRBYFLOAT f 0.1",
        "INCRBYFLOAT f -5",
        "INCRBYFLOAT f 1e3",
        "INCRBYFLOAT f abc",
        "INCRBYFLOAT f inf",
        "INCRBYFLOAT nf 3",
        "INCRBYFLOAT s 1",
        "SET f 3.0",
        "INCRBYFLOAT f 0",
        "GET f",
        "SET a",
        "GET",
        "MGET",
        "GETRANGE s 1",
    ]))
    .unwrap();
}

#[test]
fn keys_and_expiry_match_redis() {
    compare(&script(&[
        "MSET a 1 b 2 c 3",
        "HSET h f v",
        "DEL a a b nothere",
        "EXISTS a b c c h",
        "TYPE c",
        "TYPE h",
        "TYPE nothere",
        "UNLINK c",
        "RENAME nothere x",
        "SET a 1",
        "EXPIRE a 100",
        "RENAME a b",
        "TTL b",
        "GET a",
        "RENAME b b",
        "RENAMENX b b",
        "SET c 3",
        "RENAMENX b c",
        "RENAMENX b d",
        "RENAME h h2",
        "HGET h2 f",
        "COPY d e",
        "COPY d e",
        "COPY d e REPLACE",
        "COPY d d",
        "COPY d e DB 1",
        "COPY d e DB x",
        "COPY d e FOO",
        "COPY h2 h3",
        "HGETALL h3",
        "COPY nothere e",
        "EXPIRE c 100",
        "EXPIRE c 100 NX",
        "EXPIRE c 200 XX",
        "EXPIRE c 100 GT",
        "EXPIRE c 300 GT",
        "EXPIRE c 400 LT",
        "EXPIRE c 200 LT",
        "TTL c",
        "EXPIRE c 100 NX XX",
        "EXPIRE c 100 GT LT",
        "EXPIRE c 100 FOO",
        "EXPIRE c abc",
        "EXPIRE c 9223372036854775807",
        "PEXPIRE c 9223372036854775807",
        "EXPIRE nothere 100",
        "PERSIST c",
        "PERSIST c",
        "TTL c",
        "PTTL nothere",
        "TTL nothere",
        "EXPIRE d 5 GT",
        "EXPIRE d 5 XX",
        "EXPIRE d 5 LT",
        "TTL d",
        "EXPIREAT d 1",
        "EXISTS d",
        "SET d v",
        "PEXPIREAT d 99999999999999",
        "PEXPIRETIME d",
        "EXPIRETIME d",
        "EXPIRETIME c",
        "EXPIRETIME nothere",
        "EXPIRE d -1",
        "GET d",
        "SET e v",
        "EXPIRE e 0",
        "GET e",
        "KEYS *",
        "KEYS h*",
        "KEYS ?",
        "KEYS [bc]",
        "DBSIZE",
        "FLUSHDB",
        "DBSIZE",
        "FLUSHDB ASYNC",
        "FLUSHDB FOO",
        "FLUSHALL SYNC",
        "DEL",
        "EXPIRE a",
        "TTL",
    ]))
    .unwrap();
}

#[test]
fn hashes_match_redis() {
    compare(&script(&[
        "HSET h a 1 b 2",
        "HSET h a 3 c 4",
        "HSET h a 1 a 2",
        "HSET h a",
        "HGET h a",
        "HGET h nothere",
        "HGET nothere a",
        "HMGET h a b nothere",
        "HMGET nothere a",
        "HLEN h",
        "HLEN nothere",
        "HEXISTS h a",
        "HEXISTS h z",
        "HSTRLEN h a",
        "HSTRLEN h z",
        "HKEYS h",
        "HVALS h",
        "HGETALL h",
        "HGETALL nothere",
        "HSETNX h a 5",
        "HSETNX h z 5",
        "HMSET h x 1 y 2",
        "HMSET h x",
        "HDEL h a a b nothere",
        "HDEL nothere a",
        "HINCRBY h n 5",
        "HINCRBY h n -10",
        "HINCRBY h n x",
        "HSET h big 9223372036854775807",
        "HINCRBY h big 1",
        "HINCRBY h x 1",
        "HSET h s abc",
        "HINCRBY h s 1",
        "HINCRBYFLOAT h fl 1.5",
        "HINCRBYFLOAT h fl 0.25",
        "HINCRBYFLOAT h s 1",
        "HINCRBYFLOAT h fl x",
        "HINCRBYFLOAT h fl inf",
        "HSCAN h 0",
        "HSCAN h 0 MATCH f*",
        "HSCAN h x",
        "HSCAN nothere 0",
        "HSCAN h 0 COUNT 0",
        "SET str v",
        "HSET str a 1",
        "HGET str a",
        "HGETALL str",
        "HLEN str",
        "GET h",
        "APPEND h x",
        "INCR h",
        "HDEL h c fl n x y z s big",
        "EXISTS h",
        "HSET h a 1",
        "EXPIRE h 100",
        "HSET h b 2",
        "TTL h",
        "EXPIRE h 0",
        "HGETALL h",
        "HSET h c 3",
        "HGETALL h",
        "SET h v",
        "HSET h c 3",
        "GET h",
    ]))
    .unwrap();
}

#[test]
fn big_and_small_hashes_go_whole() {
    // Small hashes are removed field by field, big ones (over 64 fields)
    // with one range delete: both must leave nothing behind.
    for fields in [3usize, 70, 200] {
        let mut hset = String::from("HSET h");
        for i in 0..fields {
            hset.push_str(&format!(" f{i} v{i}"));
        }
        let mset = hset.replacen("HSET h", "HSET g", 1);
        compare(&script(&[
            &hset,
            "HLEN h",
            "DEL h",
            "HSET h f0 again",
            "HGETALL h",
            "HLEN h",
            &mset,
            "RENAME g h",
            "HLEN h",
            "HGET h f1",
            "EXPIRE h 0",
            "HSET h only 1",
            "HGETALL h",
            "FLUSHALL",
            "HGETALL h",
        ]))
        .unwrap();
    }
}

/// A small hash lists its fields in the order first set, as Redis lists a
/// listpack: replies compared byte for byte (the comparison accepts
/// another order only for a hash Redis keeps as a hash table). Overwrites
/// keep a field's place, a field deleted and set again goes last, DUMP
/// and RESTORE keep the order, and past either threshold the hash becomes
/// a hash table for good. The thresholds are set back at the end.
#[test]
fn small_hashes_keep_the_order_fields_were_set_in() {
    compare(&script(&[
        "HSET h zebra 1 apple 2 mango 3",
        "HGETALL h",
        "OBJECT ENCODING h",
        "HSET h apple 9 kiwi 4",
        "HDEL h zebra",
        "HSET h zebra 5",
        "HINCRBY h counter 1",
        "HSETNX h first 1",
        "HKEYS h",
        "HVALS h",
        "HSCAN h 0",
        "HSCAN h 0 MATCH *a*",
        "EVAL \"return redis.call('HGETALL', KEYS[1])\" 1 h",
        "COPY h copied",
        "HGETALL copied",
        "RENAME copied renamed",
        "HKEYS renamed",
        "CONFIG SET hash-max-listpack-entries 4",
        "HSET small b 1 a 2 c 3",
        "HGETALL small",
        "HSET small d 4 e 5",
        "OBJECT ENCODING small",
        "HDEL small e d",
        "OBJECT ENCODING small",
        "CONFIG SET hash-max-listpack-entries 512",
        "CONFIG SET hash-max-listpack-value 3",
        "HSET short y 1 x 22 w 333",
        "OBJECT ENCODING short",
        "HSET short v 4444",
        "OBJECT ENCODING short",
        "CONFIG SET hash-max-listpack-value 64",
        "HSET long y 1 x 2",
        "HSET long w 0123456789012345678901234567890123456789012345678901234567890123456789",
        "OBJECT ENCODING long",
        "HSET restored y 1 x 2 w 3",
        "FLUSHALL",
    ]))
    .unwrap();
    // DUMP's payload is Redis's own encoding, so the two payloads differ;
    // each server restores its own and must read it back in order.
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Client::connect_port(p.redis.port);
    let mut s = Client::connect(p.sluice.addr);
    for c in [&mut r, &mut s] {
        c.call(&[b"FLUSHALL"]);
        c.call(&[b"HSET", b"h", b"y", b"1", b"x", b"2", b"w", b"3"]);
    }
    let payload = |c: &mut Client| -> Vec<u8> {
        match decode(&c.call(&[b"DUMP", b"h"])) {
            Reply::Bulk(b) => b,
            other => panic!("DUMP: {other:?}"),
        }
    };
    let (rp, sp) = (payload(&mut r), payload(&mut s));
    // Each server restores the other's payload too: Sluice reads Redis's
    // listpack in its order, Redis reads Sluice's in its.
    for (c, own, other) in [(&mut r, &rp, &sp), (&mut s, &sp, &rp)] {
        c.call(&[b"RESTORE", b"own", b"0", own]);
        c.call(&[b"RESTORE", b"other", b"0", other]);
    }
    for key in [&b"h"[..], b"own", b"other"] {
        let expected = r.call(&[b"HGETALL", key]);
        assert_eq!(
            s.call(&[b"HGETALL", key]),
            expected,
            "{}",
            String::from_utf8_lossy(key)
        );
        assert_eq!(
            expected,
            b"*6\r\n$1\r\ny\r\n$1\r\n1\r\n$1\r\nx\r\n$1\r\n2\r\n$1\r\nw\r\n$1\r\n3\r\n"
        );
    }
    for c in [&mut r, &mut s] {
        c.call(&[b"FLUSHALL"]);
    }
}

/// Streams go through DUMP and RESTORE with their consumer groups both
/// ways: a stream built alike on both servers (entries over three nodes,
/// changing fields, a deleted entry, groups with pending entries of two
/// consumers and an idle one), each server's payload restored on both,
/// and every restored copy reads as the original does on Redis: entries,
/// ids and counters, groups, pending entries by consumer. (Delivery and
/// seen times are the servers' clocks, so replies that show them are
/// left out; the node layout shows in XINFO's radix-tree fields, also
/// left out.)
#[test]
fn streams_dump_and_restore_with_their_groups_both_ways() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Client::connect_port(p.redis.port);
    let mut s = Client::connect(p.sluice.addr);
    let mut build = vec!["FLUSHALL".to_string()];
    for i in 0..250u32 {
        let extra = if i % 7 == 0 {
            format!(" extra {i}")
        } else {
            String::new()
        };
        build.push(format!(
            "XADD s {}-{} field v{i}{extra}",
            1000 + i / 3,
            i % 3
        ));
    }
    build.extend(
        [
            "XDEL s 1001-1",
            "XGROUP CREATE s g1 0",
            "XGROUP CREATE s g2 $",
            "XGROUP CREATE s g3 1010-0 ENTRIESREAD 9",
            "XREADGROUP GROUP g1 alice COUNT 3 STREAMS s >",
            "XREADGROUP GROUP g1 bob COUNT 2 STREAMS s >",
            "XGROUP CREATECONSUMER s g1 idle",
            "XACK s g1 1000-1",
            "XADD empty 5-5 f v",
            "XDEL empty 5-5",
        ]
        .map(String::from),
    );
    for line in &build {
        let args = sluice_server::resp::split_args(line.as_bytes()).unwrap();
        let args: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let (a, b) = (r.call(&args), s.call(&args));
        if !line.starts_with("XREADGROUP") {
            assert_eq!(b, a, "{line}");
        }
    }
    for key in [&b"s"[..], b"empty"] {
        let payload = |c: &mut Client| -> Vec<u8> {
            match decode(&c.call(&[b"DUMP", key])) {
                Reply::Bulk(b) => b,
                other => panic!("DUMP: {other:?}"),
            }
        };
        let (rp, sp) = (payload(&mut r), payload(&mut s));
        for c in [&mut r, &mut s] {
            // Redis checks every node and group of a payload it restores.
            let sanitize: &[&[u8]] = &[b"CONFIG", b"SET", b"sanitize-dump-payload", b"yes"];
            assert_eq!(c.call(sanitize), b"+OK\r\n");
            for (name, p) in [(&b"from-redis"[..], &rp), (b"from-sluice", &sp)] {
                let copy = [key, b"-", name].concat();
                assert_eq!(c.call(&[b"RESTORE", &copy, b"0", p]), b"+OK\r\n");
            }
        }
    }
    let fields = |reply: Reply| -> Vec<(String, String)> {
        let Reply::Array(items) = reply else {
            panic!("XINFO STREAM: {reply:?}")
        };
        let wanted = [
            "length",
            "last-generated-id",
            "max-deleted-entry-id",
            "entries-added",
            "recorded-first-entry-id",
            "groups",
            "first-entry",
            "last-entry",
        ];
        items
            .chunks(2)
            .filter_map(|p| match &p[0] {
                Reply::Bulk(n) if wanted.contains(&std::str::from_utf8(n).unwrap()) => Some((
                    String::from_utf8_lossy(n).into_owned(),
                    format!("{:?}", p[1]),
                )),
                _ => None,
            })
            .collect()
    };
    for key in [
        "s",
        "s-from-redis",
        "s-from-sluice",
        "empty",
        "empty-from-redis",
        "empty-from-sluice",
    ] {
        // Each copy on each server answers as the original on Redis.
        let original = if key.starts_with('s') { "s" } else { "empty" };
        let k = key.as_bytes();
        let o = original.as_bytes();
        let expected = |r: &mut Client, args: &[&[u8]]| {
            let args: Vec<&[u8]> = args.iter().map(|a| if *a == k { o } else { *a }).collect();
            r.call(&args)
        };
        let mut calls: Vec<Vec<&[u8]>> = vec![
            vec![b"XLEN", k],
            vec![b"XINFO", b"GROUPS", k],
            vec![b"XRANGE", k, b"1005", b"1006", b"COUNT", b"4"],
            vec![b"XRANGE", k, b"-", b"+"],
        ];
        if original == "s" {
            // An empty stream has no group: the error names the key.
            calls.push(vec![b"XPENDING", k, b"g1"]);
        }
        for args in &calls {
            let want = expected(&mut r, args);
            for (side, c) in [("redis", &mut r), ("sluice", &mut s)] {
                assert_eq!(
                    String::from_utf8_lossy(&c.call(args)),
                    String::from_utf8_lossy(&want),
                    "{side}: {key}: {:?}",
                    String::from_utf8_lossy(&args.concat())
                );
            }
        }
        let want = fields(decode(&expected(&mut r, &[b"XINFO", b"STREAM", k])));
        assert_eq!(want.len(), 8, "{want:?}");
        for (side, c) in [("redis", &mut r), ("sluice", &mut s)] {
            assert_eq!(
                fields(decode(&c.call(&[b"XINFO", b"STREAM", k]))),
                want,
                "{side}: {key}"
            );
        }
    }
    for c in [&mut r, &mut s] {
        c.call(&[b"CONFIG", b"SET", b"sanitize-dump-payload", b"no"]);
        c.call(&[b"FLUSHALL"]);
    }
}

#[test]
fn lists_match_redis() {
    compare(&script(&[
        "LPUSH l a b c",
        "RPUSH l d e",
        "LRANGE l 0 -1",
        "LRANGE l -2 -1",
        "LRANGE l 3 1",
        "LRANGE l -100 100",
        "LRANGE l x 1",
        "LRANGE nothere 0 -1",
        "LLEN l",
        "LLEN nothere",
        "LINDEX l 0",
        "LINDEX l -1",
        "LINDEX l 5",
        "LINDEX l x",
        "LINDEX nothere x",
        "LSET l 1 B",
        "LSET l -1 E",
        "LSET l 9 z",
        "LSET l x z",
        "LSET nothere 0 z",
        "LRANGE l 0 -1",
        "LPUSHX nothere a",
        "RPUSHX l f",
        "EXISTS nothere",
        "LPOP l",
        "RPOP l",
        "LPOP l 2",
        "RPOP l 0",
        "LPOP l -1",
        "LPOP l x",
        "LPOP l 1 2",
        "LPOP nothere",
        "LPOP nothere 2",
        "RPOP nothere 0",
        "LRANGE l 0 -1",
        "RPUSH r 1 2 3 2 1 2 3",
        "LREM r 2 2",
        "LRANGE r 0 -1",
        "LREM r -1 3",
        "LRANGE r 0 -1",
        "LREM r 0 1",
        "LRANGE r 0 -1",
        "LREM r 0 zz",
        "LREM r x 1",
        "LREM nothere 0 a",
        "RPUSH i a b c",
        "LINSERT i BEFORE b x",
        "LINSERT i AFTER c y",
        "LINSERT i AFTER a z",
        "LINSERT i BEFORE nothere q",
        "LINSERT i MIDDLE a q",
        "LINSERT nothere BEFORE a q",
        "LRANGE i 0 -1",
        "RPUSH p a b c a b c a",
        "LPOS p a",
        "LPOS p a RANK 2",
        "LPOS p a RANK -1",
        "LPOS p a COUNT 0",
        "LPOS p a COUNT 2 RANK -1",
        "LPOS p a MAXLEN 3 COUNT 0",
        "LPOS p z",
        "LPOS p z COUNT 1",
        "LPOS p a RANK 0",
        "LPOS p a COUNT -1",
        "LPOS p a MAXLEN -1",
        "LPOS p a FOO 1",
        "LPOS nothere a",
        "LPOS nothere a COUNT 1",
        "RPUSH t 1 2 3 4 5 6",
        "LTRIM t 1 -2",
        "LRANGE t 0 -1",
        "LTRIM t 5 10",
        "EXISTS t",
        "LTRIM nothere 0 1",
        "LTRIM t x 1",
        "RPUSH m 1 2 3",
        "LMOVE m m RIGHT LEFT",
        "LRANGE m 0 -1",
        "LMOVE m n LEFT RIGHT",
        "LMOVE m n LEFT UP",
        "RPOPLPUSH m n",
        "RPOPLPUSH m n",
        "RPOPLPUSH m n",
        "EXISTS m",
        "LRANGE n 0 -1",
        "LMPOP 2 nothere n LEFT",
        "LMPOP 2 nothere n RIGHT COUNT 5",
        "LMPOP 1 n LEFT",
        "LMPOP 0 n LEFT",
        "LMPOP x n LEFT",
        "LMPOP 2 n LEFT",
        "LMPOP 1 n MIDDLE",
        "LMPOP 1 n LEFT COUNT 0",
        "LMPOP 1 n LEFT COUNT 1 COUNT 1",
        "SET s v",
        "LPUSH s a",
        "LRANGE s 0 1",
        "LPOP s",
        "LMOVE s n LEFT LEFT",
        "RPUSH n a",
        "LMOVE n s LEFT LEFT",
        "LMPOP 2 nothere s LEFT",
        "TYPE n",
        "RPUSH e 1",
        "EXPIRE e 100",
        "RPUSH e 2",
        "TTL e",
        "RENAME e e2",
        "LRANGE e2 0 -1",
        "TTL e2",
        "COPY e2 e3",
        "RPUSH e3 3",
        "LRANGE e2 0 -1",
        "LRANGE e3 0 -1",
        "DEL e2 e3",
        "LRANGE e3 0 -1",
        "LPUSH h2 x",
        "SET h2 now-a-string",
        "GET h2",
    ]))
    .unwrap();
}

#[test]
fn sets_match_redis() {
    compare(&script(&[
        "SADD s a b c",
        "SADD s a d a",
        "SCARD s",
        "SCARD nothere",
        "SISMEMBER s a",
        "SISMEMBER s z",
        "SISMEMBER nothere a",
        "SMISMEMBER s a z b",
        "SMISMEMBER nothere a",
        "SMEMBERS s",
        "SMEMBERS nothere",
        "SREM s a z",
        "SREM nothere a",
        "SMEMBERS s",
        "SADD t c d e",
        "SINTER s t",
        "SINTER s nothere",
        "SUNION s t nothere",
        "SDIFF s t",
        "SDIFF t s",
        "SDIFF nothere s",
        "SINTERCARD 2 s t",
        "SINTERCARD 2 s t LIMIT 1",
        "SINTERCARD 1 s LIMIT 0",
        "SINTERCARD 0 s",
        "SINTERCARD x s",
        "SINTERCARD 3 s t",
        "SINTERCARD 2 s t LIMIT -1",
        "SINTERCARD 2 s t FOO 1",
        "SINTERSTORE d s t",
        "SMEMBERS d",
        "SUNIONSTORE d s t",
        "SMEMBERS d",
        "SDIFFSTORE d s t",
        "SMEMBERS d",
        "SINTERSTORE d s nothere",
        "EXISTS d",
        "SMOVE s t b",
        "SMOVE s t z",
        "SMOVE nothere t a",
        "SMOVE s s c",
        "SMEMBERS s",
        "SMEMBERS t",
        "SMOVE s u c",
        "EXISTS s",
        "SMEMBERS u",
        "SET str v",
        "SADD str a",
        "SMEMBERS str",
        "SINTER u str",
        "SMOVE u str c",
        "SMOVE nothere str c",
        "SMOVE str u c",
        "SUNIONSTORE str u",
        "TYPE str",
        "SPOP nothere",
        "SPOP nothere 3",
        "SPOP u 0",
        "SPOP u -1",
        "SPOP u 1 2",
        "SADD one x",
        "SPOP one",
        "EXISTS one",
        "SADD one x",
        "SPOP one 5",
        "SRANDMEMBER nothere",
        "SRANDMEMBER nothere 3",
        "SRANDMEMBER u 0",
        "SRANDMEMBER u -9223372036854775808",
        "SRANDMEMBER u x",
        "SRANDMEMBER u",
        "SRANDMEMBER u 3",
        "SRANDMEMBER u -3",
        "SRANDMEMBER u 1 2",
        "SSCAN t 0",
        "SSCAN t 0 MATCH c*",
        "SSCAN nothere 0",
        "SSCAN t x",
    ]))
    .unwrap();
}

#[test]
fn sorted_sets_match_redis() {
    compare(&script(&[
        "ZADD z 1 a 2 b 3 c",
        "ZADD z 1.5 a 2 b",
        "ZADD z CH 1 a 5 b 4 d",
        "ZADD z NX 9 a 7 e",
        "ZADD z XX 8 a 8 f",
        "ZADD z GT 1 a 10 b",
        "ZADD z LT CH 0 a 20 b",
        "ZADD z XX NX 1 a",
        "ZADD z GT LT 1 a",
        "ZADD z NX GT 1 a",
        "ZADD z INCR 1 a 2 b",
        "ZADD z 1",
        "ZADD z x a",
        "ZADD z nan a",
        "ZADD z INCR 2.5 a",
        "ZADD z INCR XX 1 nothere",
        "ZADD z INCR GT -100 a",
        "ZADD nothere XX 1 a",
        "ZADD nothere XX INCR 1 a",
        "ZINCRBY z 1.1 c",
        "ZINCRBY z x c",
        "ZINCRBY z 1 new",
        "ZADD inf +inf a -inf b",
        "ZINCRBY inf -inf a",
        "ZADD z 0.1 g -0 h 0 i 1e300 j -1e-5 k",
        "ZSCORE z a",
        "ZSCORE z g",
        "ZSCORE z h",
        "ZSCORE z nothere",
        "ZSCORE nothere a",
        "ZMSCORE z a g nothere",
        "ZMSCORE nothere a",
        "ZCARD z",
        "ZCARD nothere",
        "ZRANK z a",
        "ZREVRANK z a",
        "ZRANK z nothere",
        "ZRANK nothere a",
        "ZRANGE z 0 -1",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZRANGE z 2 4 REV WITHSCORES",
        "ZRANGE z 0 -1 LIMIT 0 1",
        "ZRANGE z (1 +inf BYSCORE",
        "ZRANGE z +inf (1 BYSCORE REV WITHSCORES",
        "ZRANGE z -inf +inf BYSCORE LIMIT 1 2",
        "ZRANGE z -inf +inf BYSCORE LIMIT -1 2",
        "ZRANGE z -inf +inf BYSCORE LIMIT 1 -1",
        "ZRANGE z -inf +inf BYSCORE LIMIT 100 1",
        "ZRANGE z - + BYLEX WITHSCORES",
        "ZRANGE z x y BYSCORE",
        "ZRANGE z 0 1 BYSCORE BYLEX",
        "ZRANGE z 0 1 FOO",
        "ZRANGE nothere 0 -1",
        "ZREVRANGE z 0 2 WITHSCORES",
        "ZREVRANGE z 0 2 REV",
        "ZRANGEBYSCORE z 1 5",
        "ZRANGEBYSCORE z (1 (5 WITHSCORES",
        "ZRANGEBYSCORE z -inf +inf LIMIT 2 3",
        "ZRANGEBYSCORE z 5 1",
        "ZRANGEBYSCORE z ( 5",
        "ZRANGEBYSCORE z a 5",
        "ZREVRANGEBYSCORE z 5 1 WITHSCORES",
        "ZCOUNT z 1 5",
        "ZCOUNT z (1 +inf",
        "ZCOUNT z x 1",
        "ZCOUNT nothere 0 1",
        "ZADD lex 0 a 0 b 0 c 0 d 0 e 0 foo",
        "ZRANGEBYLEX lex - +",
        "ZRANGEBYLEX lex [b (e",
        "ZRANGEBYLEX lex (b [foo LIMIT 1 2",
        "ZRANGEBYLEX lex + -",
        "ZRANGEBYLEX lex [e [b",
        "ZRANGEBYLEX lex b e",
        "ZREVRANGEBYLEX lex + -",
        "ZREVRANGEBYLEX lex [e [b",
        "ZLEXCOUNT lex - +",
        "ZLEXCOUNT lex [b [d",
        "ZLEXCOUNT lex x y",
        "ZRANGESTORE dst z 0 2",
        "ZRANGE dst 0 -1 WITHSCORES",
        "ZRANGESTORE dst lex [b [d BYLEX",
        "ZRANGE dst 0 -1",
        "ZRANGESTORE dst nothere 0 -1",
        "EXISTS dst",
        "ZRANGESTORE dst z 0 1 WITHSCORES",
        "ZREMRANGEBYRANK lex 0 1",
        "ZREMRANGEBYLEX lex [c [d",
        "ZREMRANGEBYSCORE z (1 5",
        "ZREMRANGEBYSCORE z x 5",
        "ZREMRANGEBYRANK nothere 0 1",
        "ZRANGE lex 0 -1",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZPOPMIN z",
        "ZPOPMAX z 2",
        "ZPOPMIN z 0",
        "ZPOPMIN z -1",
        "ZPOPMIN nothere",
        "ZPOPMIN nothere 2",
        "ZPOPMIN z 1 2",
        "ZMPOP 2 nothere z MIN",
        "ZMPOP 1 z MAX COUNT 10",
        "ZMPOP 1 z MAX",
        "ZMPOP 0 z MAX",
        "ZMPOP 1 z MIDDLE",
        "ZADD u1 1 a 2 b 3 c",
        "ZADD u2 4 b 5 c 6 d",
        "SADD plain c d e",
        "ZUNION 2 u1 u2",
        "ZUNION 2 u1 u2 WITHSCORES",
        "ZUNION 3 u1 u2 plain WEIGHTS 1 2 3 WITHSCORES",
        "ZUNION 2 u1 u2 AGGREGATE MIN WITHSCORES",
        "ZUNION 2 u1 u2 AGGREGATE MAX WITHSCORES",
        "ZINTER 2 u1 u2 WITHSCORES",
        "ZINTER 3 u1 u2 plain WITHSCORES",
        "ZINTER 2 u1 nothere",
        "ZDIFF 2 u1 u2 WITHSCORES",
        "ZDIFF 2 u1 u2 WEIGHTS 1 2",
        "ZINTERCARD 2 u1 u2",
        "ZINTERCARD 2 u1 u2 LIMIT 1",
        "ZINTERCARD 2 u1 u2 LIMIT -1",
        "ZINTERCARD 0 u1",
        "ZINTERCARD x u1",
        "ZUNION 3 u1 u2",
        "ZUNION 2 u1 u2 WEIGHTS 1 x",
        "ZUNION 2 u1 u2 AGGREGATE AVG",
        "ZUNIONSTORE out 2 u1 u2 WEIGHTS 2 3",
        "ZRANGE out 0 -1 WITHSCORES",
        "ZINTERSTORE out 2 u1 u2",
        "ZRANGE out 0 -1 WITHSCORES",
        "ZDIFFSTORE out 2 u1 u2",
        "ZRANGE out 0 -1 WITHSCORES",
        "ZINTERSTORE out 2 u1 nothere",
        "EXISTS out",
        "ZUNIONSTORE out 2 u1 u2 WITHSCORES",
        "SET str v",
        "ZADD str 1 a",
        "ZUNION 2 u1 str",
        "ZRANGE str 0 -1",
        "ZSCORE str a",
        "ZRANDMEMBER nothere",
        "ZRANDMEMBER nothere 2",
        "ZADD one 5 only",
        "ZRANDMEMBER one",
        "ZRANDMEMBER one 3 WITHSCORES",
        "ZRANDMEMBER one -2 WITHSCORES",
        "ZRANDMEMBER one 0",
        "ZRANDMEMBER one x",
        "ZRANDMEMBER one 1 FOO",
        "ZRANDMEMBER one 9223372036854775807 WITHSCORES",
        "ZSCAN u1 0",
        "ZSCAN u1 0 MATCH a*",
        "ZSCAN nothere 0",
        "ZREM u1 a nothere a",
        "ZREM u1 b c",
        "EXISTS u1",
        "ZREM nothere a",
        "ZADD e 1 a",
        "EXPIRE e 100",
        "ZADD e 2 b",
        "TTL e",
        "RENAME e e2",
        "ZRANGE e2 0 -1 WITHSCORES",
        "COPY e2 e3",
        "ZADD e3 3 c",
        "ZCARD e2",
        "ZCARD e3",
        "TYPE e3",
    ]))
    .unwrap();
}

#[test]
fn sorted_sets_answer_resp3_as_redis_does() {
    compare(&script(&[
        "HELLO 3",
        "ZADD z 1 a 2.5 b -0 c",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZSCORE z b",
        "ZMSCORE z a c x",
        "ZPOPMIN z",
        "ZPOPMIN z 1",
        "ZADD z 1 a",
        "ZMPOP 1 z MAX COUNT 2",
        "ZADD z 1 a",
        "ZRANDMEMBER z 1 WITHSCORES",
        "ZUNION 1 z WITHSCORES",
        "ZINCRBY z 1 a",
        "ZADD z INCR 1 a",
    ]))
    .unwrap();
}

#[test]
fn streams_match_redis() {
    compare(&script(&[
        "XADD s 1-1 a 1",
        "XADD s 1-1 a 1",
        "XADD s 1-* b 2",
        "XADD s 2 c 3 d 4",
        "XADD s 0-0 a 1",
        "XADD s 5-5 a",
        "XADD s x a 1",
        "XADD s 3-x a 1",
        "XADD s NOMKSTREAM 6-0 e 5",
        "XADD nothere NOMKSTREAM 1-0 a 1",
        "EXISTS nothere",
        "XADD s MAXLEN 3 7-0 f 6",
        "XLEN s",
        "XADD s MAXLEN = 2 8-0 g 7",
        "XADD s MAXLEN ~ 1 9-0 h 8",
        "XLEN s",
        "XADD s MAXLEN -1 10-0 i 9",
        "XADD s MAXLEN 1 MINID 1 10-0 i 9",
        "XADD s LIMIT 5 10-0 i 9",
        "XADD s MAXLEN 5 LIMIT 5 10-0 i 9",
        "XADD s MAXLEN ~ 5 LIMIT -1 10-0 i 9",
        "XRANGE s - +",
        "XRANGE s 8 9",
        "XRANGE s (8-0 +",
        "XRANGE s - (9-0",
        "XRANGE s - + COUNT 1",
        "XRANGE s - + COUNT 0",
        "XRANGE s - + COUNT -5",
        "XRANGE s x +",
        "XRANGE s - + FOO",
        "XRANGE s (18446744073709551615-18446744073709551615 +",
        "XRANGE nothere - +",
        "XREVRANGE s + -",
        "XREVRANGE s + - COUNT 1",
        "XREVRANGE s 8 -",
        "XDEL s 8-0 100-0 8-0",
        "XDEL s x",
        "XDEL nothere 1-0",
        "XLEN s",
        "XADD s 20-0 j 10 k 11",
        "XADD s 21-0 l 12",
        "XTRIM s MAXLEN 2",
        "XRANGE s - +",
        "XTRIM s MINID 21",
        "XRANGE s - +",
        "XTRIM s",
        "XTRIM s FOO 1",
        "XTRIM nothere MAXLEN 0",
        "XTRIM s MAXLEN 0",
        "XLEN s",
        "EXISTS s",
        "TYPE s",
        "XADD s 20-0 a 1",
        "XADD s 22-0 a 1",
        "XREAD STREAMS s 0",
        "XREAD COUNT 1 STREAMS s nothere 0 0",
        "XREAD STREAMS s 22-0",
        "XREAD STREAMS s $",
        "XREAD STREAMS s",
        "XREAD COUNT x STREAMS s 0",
        "XREAD GROUP g c STREAMS s 0",
        "XREAD STREAMS s >",
        "XREAD FOO STREAMS s 0",
        "SET str v",
        "XADD str 1-0 a 1",
        "XLEN str",
        "XRANGE str - +",
        "XREAD STREAMS s str 0 0",
        "HELLO 3",
        "XREAD STREAMS s 0",
        "XRANGE s - + COUNT 1",
        "XREAD STREAMS nothere 0",
    ]))
    .unwrap();
}

#[test]
fn bitmaps_match_redis() {
    compare(&script(&[
        "SETBIT b 7 1",
        "SETBIT b 7 1",
        "SETBIT b 100 1",
        "SETBIT b 100 0",
        "SETBIT b 3 2",
        "SETBIT b -1 1",
        "SETBIT b x 1",
        "SETBIT b 4294967296 1",
        "SETBIT nb 0 0",
        "GET nb",
        "GETBIT b 7",
        "GETBIT b 6",
        "GETBIT b 1000000",
        "GETBIT nothere 3",
        "GETBIT b -1",
        "GET b",
        "SET s foobar",
        "BITCOUNT s",
        "BITCOUNT s 0 0",
        "BITCOUNT s 1 1",
        "BITCOUNT s 1 -2",
        "BITCOUNT s -1 -2",
        "BITCOUNT s 5 30 BIT",
        "BITCOUNT s 3 -5 BIT",
        "BITCOUNT s 0 -1 BYTE",
        "BITCOUNT s 0 1 WORD",
        "BITCOUNT s 0",
        "BITCOUNT s x 1",
        "BITCOUNT nothere 0 x",
        "SET p \"\\xff\\xf0\\x00\"",
        "BITPOS p 0",
        "BITPOS p 1",
        "BITPOS p 0 2 -1 BYTE",
        "BITPOS p 1 2",
        "BITPOS p 0 7 15 BIT",
        "BITPOS p 1 7 15 BIT",
        "BITPOS p 0 0 7 BIT",
        "BITPOS p 0 0 0",
        "BITPOS p 2",
        "BITPOS p 0 0 1 NOPE",
        "BITPOS nothere 0",
        "BITPOS nothere 1",
        "SET ones \"\\xff\\xff\"",
        "BITPOS ones 0",
        "BITPOS ones 0 0",
        "BITPOS ones 0 0 -1",
        "SET x1 \"abc\"",
        "SET x2 \"\\x01\\x02\"",
        "BITOP AND d x1 x2",
        "GET d",
        "BITOP OR d x1 x2 nothere",
        "GET d",
        "BITOP XOR d x1 x2",
        "GET d",
        "BITOP NOT d x1",
        "GET d",
        "BITOP NOT d x1 x2",
        "BITOP NAND d x1",
        "BITOP AND d nothere1 nothere2",
        "EXISTS d",
        "RPUSH l a",
        "BITOP AND d x1 l",
        "BITOP OR l x1",
        "TYPE l",
        "BITFIELD bf SET u8 0 255 GET u8 0",
        "BITFIELD bf INCRBY u8 0 10",
        "BITFIELD bf OVERFLOW SAT INCRBY u8 0 300 OVERFLOW FAIL INCRBY u8 0 1",
        "BITFIELD bf SET i5 #2 -9 GET i5 #2 GET u5 10",
        "BITFIELD bf INCRBY i8 100 -200 OVERFLOW SAT INCRBY i8 100 -200",
        "BITFIELD bf SET i64 0 -1 INCRBY i64 0 1",
        "BITFIELD bf OVERFLOW FAIL SET u2 0 7",
        "BITFIELD bf SET u64 0 1",
        "BITFIELD bf SET x8 0 1",
        "BITFIELD bf GET u8",
        "BITFIELD bf OVERFLOW NONE GET u8 0",
        "BITFIELD bf GET u8 -1",
        "BITFIELD bf SET u8 0 x",
        "BITFIELD bf FOO u8 0",
        "BITFIELD bf",
        "GET bf",
        "BITFIELD_RO bf GET u8 0 GET i16 4",
        "BITFIELD_RO bf SET u8 0 1",
        "BITFIELD_RO nothere GET u8 0",
        "BITFIELD l GET u8 0",
        "BITFIELD nf OVERFLOW FAIL SET u2 0 7",
        "GET nf",
        "GETBIT l 0",
        "SETBIT l 0 1",
        "BITCOUNT l",
    ]))
    .unwrap();
}

#[test]
fn lcs_and_hrandfield_match_redis() {
    compare(&script(&[
        "SET a ohmytext",
        "SET b mynewtext",
        "LCS a b",
        "LCS a b LEN",
        "LCS a b IDX",
        "LCS a b IDX WITHMATCHLEN",
        "LCS a b IDX MINMATCHLEN 4 WITHMATCHLEN",
        "LCS a b IDX MINMATCHLEN -3",
        "LCS a b LEN IDX",
        "LCS a b MINMATCHLEN",
        "LCS a b MINMATCHLEN x",
        "LCS a b FOO",
        "LCS a nothere",
        "LCS nothere1 nothere2 IDX",
        "RPUSH l x",
        "LCS a l",
        "SET v1 GCTAGCTAGCTAGCAT",
        "SET v2 TAGCATAGCATCGATCG",
        "LCS v1 v2 IDX WITHMATCHLEN",
        "HSET h f1 v1",
        "HRANDFIELD h",
        "HRANDFIELD h 5",
        "HRANDFIELD h -3 WITHVALUES",
        "HRANDFIELD h 1 WITHVALUES",
        "HRANDFIELD h 0",
        "HRANDFIELD h x",
        "HRANDFIELD h 1 FOO",
        "HRANDFIELD h -9223372036854775808",
        "HRANDFIELD h -9223372036854775807 WITHVALUES",
        "HRANDFIELD nothere",
        "HRANDFIELD nothere 3",
        "HRANDFIELD l",
    ]))
    .unwrap();
}

#[test]
fn stream_consumer_groups_match_redis() {
    compare(&script(&[
        "XGROUP CREATE s g $",
        "XGROUP CREATE s g $ MKSTREAM",
        "XGROUP CREATE s g $ MKSTREAM",
        "XGROUP CREATE s g2 0 ENTRIESREAD 0",
        "XGROUP CREATE s g3 0 ENTRIESREAD -2",
        "XGROUP CREATE s g3 x",
        "XGROUP CREATE s g3 0 FOO",
        "XGROUP CREATE s",
        "XGROUP NOPE s g",
        "XGROUP HELP",
        "XADD s 1-1 a 1",
        "XADD s 2-1 b 2",
        "XADD s 3-1 c 3",
        "XINFO GROUPS s",
        "XREADGROUP GROUP g alice STREAMS s >",
        "XREADGROUP GROUP g2 bob COUNT 2 STREAMS s >",
        "XINFO GROUPS s",
        "XREADGROUP GROUP g2 bob COUNT 2 STREAMS s >",
        "XREADGROUP GROUP g2 bob STREAMS s >",
        "XREADGROUP GROUP g2 carol NOACK STREAMS s >",
        "XADD s 4-1 d 4",
        "XREADGROUP GROUP g2 carol NOACK STREAMS s >",
        "XREADGROUP GROUP g2 bob STREAMS s 0",
        "XREADGROUP GROUP g2 bob COUNT 1 STREAMS s 1-1",
        "XREADGROUP GROUP g2 carol STREAMS s 0",
        "XREADGROUP GROUP g2 nobody STREAMS s 0",
        "XREADGROUP GROUP nogroup bob STREAMS s >",
        "XREADGROUP GROUP g2 bob STREAMS nothere >",
        "XREADGROUP GROUP g2 bob STREAMS s $",
        "XREADGROUP STREAMS s >",
        "XREADGROUP GROUP g2 bob STREAMS s",
        "XREAD GROUP g2 bob STREAMS s 0",
        "XREAD STREAMS s >",
        "XPENDING s g2",
        "XPENDING s g",
        "XPENDING s g3",
        "XPENDING nothere g",
        "XPENDING s g2 - + 0",
        "XPENDING s g2 - + 10 nobody",
        "XPENDING s g2 x + 10",
        "XPENDING s g2 - +",
        "XPENDING s g2 IDLE 0 - +",
        "XACK s g2 1-1 1-1 9-9",
        "XACK s g2 x",
        "XACK s nogroup 1-1",
        "XACK nothere g 1-1",
        "XPENDING s g2",
        "XDEL s 2-1",
        "XREADGROUP GROUP g2 bob STREAMS s 0",
        "XINFO GROUPS s",
        "XGROUP CREATECONSUMER s g2 dave",
        "XGROUP CREATECONSUMER s g2 dave",
        "XGROUP CREATECONSUMER s nogroup dave",
        "XGROUP DELCONSUMER s g2 bob",
        "XGROUP DELCONSUMER s g2 nobody",
        "XPENDING s g2",
        "XGROUP SETID s g2 0 ENTRIESREAD 1",
        "XGROUP SETID s g2 $",
        "XGROUP SETID s g2 - ",
        "XGROUP SETID s nogroup 0",
        "XINFO GROUPS s",
        "XGROUP DESTROY s g2",
        "XGROUP DESTROY s g2",
        "XINFO GROUPS s",
        "XINFO CONSUMERS s nogroup",
        "XINFO GROUPS nothere",
        "XINFO NOPE s",
        "XINFO HELP",
        "SET str x",
        "XGROUP CREATE str g $",
        "XREADGROUP GROUP g a STREAMS str >",
        "XINFO GROUPS str",
        "DEL s",
        "XGROUP CREATE s g $",
        "EXISTS s",
    ]))
    .unwrap();
}

#[test]
fn stream_claims_match_redis() {
    compare(&script(&[
        "XGROUP CREATE s g $ MKSTREAM",
        "XADD s 1-1 a 1",
        "XADD s 2-1 b 2",
        "XADD s 3-1 c 3",
        "XADD s 4-1 d 4",
        "XREADGROUP GROUP g alice STREAMS s >",
        "XCLAIM s g bob 0 1-1 2-1",
        "XPENDING s g",
        "XCLAIM s g bob 0 1-1 JUSTID",
        "XCLAIM s g carol 3600000 3-1",
        "XCLAIM s g carol 0 3-1 RETRYCOUNT 7 IDLE 10 JUSTID",
        "XCLAIM s g carol 0 9-9 5-1",
        "XCLAIM s g carol 0 9-9 FORCE",
        "XADD s 5-1 e 5",
        "XCLAIM s g carol 0 5-1",
        "XCLAIM s g carol 0 5-1 FORCE",
        "XCLAIM s g carol 0 5-1 LASTID 9-0 JUSTID",
        "XINFO GROUPS s",
        "XCLAIM s g carol x 1-1",
        "XCLAIM s g carol 0 1-1 IDLE x",
        "XCLAIM s g carol 0 1-1 TIME x",
        "XCLAIM s g carol 0 1-1 RETRYCOUNT x",
        "XCLAIM s g carol 0 1-1 NOPE",
        "XCLAIM s nogroup carol 0 1-1",
        "XCLAIM nothere g carol 0 1-1",
        "XDEL s 2-1",
        "XCLAIM s g dave 0 2-1 4-1",
        "XPENDING s g",
        "XAUTOCLAIM s g erin 0 0-0 COUNT 2",
        "XAUTOCLAIM s g erin 0 0-0 COUNT 2 JUSTID",
        "XAUTOCLAIM s g erin 0 (3-1",
        "XAUTOCLAIM s g erin 3600000 0-0",
        "XAUTOCLAIM s g erin 0 0-0 COUNT 0",
        "XAUTOCLAIM s g erin 0 0-0 COUNT x",
        "XAUTOCLAIM s g erin 0 0-0 FOO",
        "XAUTOCLAIM s g erin x 0-0",
        "XAUTOCLAIM s g erin 0 x",
        "XAUTOCLAIM s nogroup erin 0 0-0",
        "XADD s 6-1 f 6",
        "XREADGROUP GROUP g alice STREAMS s >",
        "XDEL s 6-1",
        "XAUTOCLAIM s g frank 0 0-0 COUNT 10",
        "XPENDING s g",
        "XINFO CONSUMERS s nogroup",
        "XSETID s 5-0",
        "XSETID s 7-0 ENTRIESADDED 1",
        "XSETID s 7-0 ENTRIESADDED -1",
        "XSETID s 7-0 MAXDELETEDID 8-0",
        "XSETID s 9-0 ENTRIESADDED 20 MAXDELETEDID 8-0",
        "XINFO GROUPS s",
        "XADD s 9-0 z 1",
        "XADD s 9-5 z 1",
        "XSETID s x",
        "XSETID s 9-0 FOO 1",
        "XSETID nothere 1-1",
        "SET str x",
        "XSETID str 1-1",
        "XCLAIM str g a 0 1-1",
        "XAUTOCLAIM str g a 0 0-0",
    ]))
    .unwrap();
}

/// XINFO STREAM as Redis answers it, but for what cannot match: its two
/// counts of Redis's radix tree, and times in ms since the epoch (seen and
/// delivery times, taken a few ms apart on the two servers).
#[test]
fn xinfo_stream_matches_redis_but_for_radix_counts_and_clocks() {
    fn normalized(r: Reply) -> Reply {
        match r {
            Reply::Map(pairs) | Reply::Pairs(pairs) => Reply::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| {
                        let radix = matches!(&k, Reply::Bulk(b) if b.starts_with(b"radix-tree"));
                        (k, if radix { Reply::Null } else { normalized(v) })
                    })
                    .collect(),
            ),
            Reply::Array(items) => {
                // RESP2 maps come as flat arrays: name, value, name, value.
                let mut out = Vec::new();
                let mut skip_next = false;
                for item in items {
                    let radix = matches!(&item, Reply::Bulk(b) if b.starts_with(b"radix-tree"));
                    out.push(if skip_next {
                        Reply::Null
                    } else {
                        normalized(item)
                    });
                    skip_next = radix;
                }
                Reply::Array(out)
            }
            Reply::Integer(n) if n > 1_000_000_000_000 => Reply::Integer(0),
            other => other,
        }
    }
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut redis = Client::connect_port(p.redis.port);
    let mut sluice = Client::connect(p.sluice.addr);
    let setup = script(&[
        "FLUSHALL",
        "XADD s 1-1 a 1",
        "XADD s 2-1 b 2",
        "XADD s 3-1 c 3",
        "XDEL s 2-1",
        "XGROUP CREATE s g 0",
        "XGROUP CREATE s h $",
        "XREADGROUP GROUP g alice COUNT 1 STREAMS s >",
        "XREADGROUP GROUP g bob STREAMS s >",
        "XGROUP CREATECONSUMER s g carol",
        "XADD empty 1-1 x 1",
        "XDEL empty 1-1",
        "XADD trimmed MAXLEN 0 5-1 a b",
    ]);
    for args in &setup {
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        redis.call(&refs);
        sluice.call(&refs);
    }
    for line in [
        "XINFO STREAM s",
        "XINFO STREAM s FULL",
        "XINFO STREAM s FULL COUNT 1",
        "XINFO STREAM s FULL COUNT 0",
        "XINFO STREAM empty",
        "XINFO STREAM trimmed",
        "XINFO STREAM s FULL COUNT",
        "XINFO STREAM s FOO",
        "XINFO STREAM nothere",
    ] {
        let args = sluice_server::resp::split_args(line.as_bytes()).unwrap();
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let (r, s) = (decode(&redis.call(&refs)), decode(&sluice.call(&refs)));
        assert_eq!(normalized(s), normalized(r), "{line}");
    }
}

/// XPENDING's ranges and XINFO CONSUMERS carry idle times, which differ
/// between two servers by the time between two calls: checked here on
/// Sluice alone.
#[test]
fn pending_entries_count_deliveries_and_idle_time() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Client::connect(p.sluice.addr);
    c.call(&[b"FLUSHALL"]);
    c.call(&[b"XGROUP", b"CREATE", b"s", b"g", b"$", b"MKSTREAM"]);
    c.call(&[b"XADD", b"s", b"1-1", b"f", b"v"]);
    c.call(&[b"XREADGROUP", b"GROUP", b"g", b"w", b"STREAMS", b"s", b">"]);
    std::thread::sleep(std::time::Duration::from_millis(30));
    c.call(&[b"XREADGROUP", b"GROUP", b"g", b"w", b"STREAMS", b"s", b"0"]);
    let row = |c: &mut Client| match decode(&c.call(&[b"XPENDING", b"s", b"g", b"-", b"+", b"10"]))
    {
        Reply::Array(rows) => match &rows[..] {
            [Reply::Array(fields)] => fields.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let fields = row(&mut c);
    assert_eq!(fields[0], Reply::Bulk(b"1-1".to_vec()));
    assert_eq!(fields[1], Reply::Bulk(b"w".to_vec()));
    assert!(matches!(fields[2], Reply::Integer(idle) if (0..1000).contains(&idle)));
    assert_eq!(fields[3], Reply::Integer(2), "read twice: delivered twice");
    std::thread::sleep(std::time::Duration::from_millis(60));
    let idle_filtered =
        decode(&c.call(&[b"XPENDING", b"s", b"g", b"IDLE", b"50", b"-", b"+", b"10"]));
    assert!(
        matches!(&idle_filtered, Reply::Array(rows) if rows.len() == 1),
        "{idle_filtered:?}"
    );
    let none_idle_enough = decode(&c.call(&[
        b"XPENDING",
        b"s",
        b"g",
        b"IDLE",
        b"100000",
        b"-",
        b"+",
        b"10",
    ]));
    assert_eq!(none_idle_enough, Reply::Array(Vec::new()));
    match decode(&c.call(&[b"XINFO", b"CONSUMERS", b"s", b"g"])) {
        Reply::Array(consumers) => match &consumers[..] {
            [Reply::Array(kv)] => {
                assert_eq!(kv[0], Reply::Bulk(b"name".to_vec()));
                assert_eq!(kv[3], Reply::Integer(1), "one pending");
                assert!(
                    matches!(kv[5], Reply::Integer(idle) if (50..5000).contains(&idle)),
                    "{kv:?}"
                );
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn command_getkeys_matches_redis() {
    compare(&script(&[
        "COMMAND GETKEYS GET k",
        "COMMAND GETKEYS MSET a 1 b 2",
        "COMMAND GETKEYS SORT abc STORE def",
        "COMMAND GETKEYS SORT abc LIMIT 0 1 GET # STORE x STORE y",
        "COMMAND GETKEYS ZUNIONSTORE dst 2 a b",
        "COMMAND GETKEYS LMPOP 2 a b LEFT",
        "COMMAND GETKEYS XREADGROUP GROUP g c STREAMS s1 s2 > >",
        "COMMAND GETKEYS XGROUP CREATE s g $",
        "COMMAND GETKEYS EVAL \"return 1\" 2 a b",
        "COMMAND GETKEYS PING",
        "COMMAND GETKEYS PING x",
        "COMMAND GETKEYS NOSUCH a",
        "COMMAND GETKEYS GET",
        "COMMAND GETKEYS",
    ]))
    .unwrap();
}

/// `~` trims whole nodes where Redis's nodes begin: every
/// `stream-node-max-entries` entries added, so an exact trim that cut a
/// node leaves its rest to go whole.
#[test]
fn approximate_trims_remove_the_nodes_redis_removes() {
    compare(&script(&[
        "EVAL \"for i = 1, 1000 do redis.call('XADD', 's', i .. '-0', 'f', i) end\" 0",
        "XTRIM s MAXLEN 666",
        "XLEN s",
        "XTRIM s MAXLEN = 555",
        "XLEN s",
        "XTRIM s MAXLEN ~ 444",
        "XLEN s",
        "XTRIM s MAXLEN ~ 400",
        "XLEN s",
        "XTRIM s MAXLEN ~ 0 LIMIT 1",
        "XTRIM s MAXLEN ~ 0 LIMIT 150",
        "XLEN s",
        "XTRIM s MINID ~ 950",
        "XLEN s",
        "XADD s MAXLEN ~ 10 2000-0 f x",
        "XLEN s",
        "EVAL \"for i = 1, 250 do redis.call('XADD', 't', i .. '-0', 'f', i) end\" 0",
        "XDEL t 150-0",
        "XTRIM t MAXLEN ~ 60",
        "XLEN t",
        "XADD e MAXLEN 0 5-1 a b",
        "XLEN e",
        "XRANGE e - +",
        "XADD e MAXLEN 0 6-1 a b",
        "XADD e 7-1 c d",
        "XRANGE e - +",
        "XADD e MAXLEN 1 8-1 c d",
        "XRANGE e - +",
        "XADD e MINID 9 9-1 c d",
        "XRANGE e - +",
    ]))
    .unwrap();
}

#[test]
fn sort_matches_redis() {
    compare(&script(&[
        "RPUSH l 3 1 2 10 -1.5 1e2",
        "SORT l",
        "SORT l DESC",
        "SORT l LIMIT 1 2",
        "SORT l LIMIT -5 2",
        "SORT l LIMIT 10 2",
        "SORT l LIMIT 2 -1",
        "SORT l LIMIT 0 0",
        "SORT l ALPHA",
        "SORT l ALPHA DESC LIMIT 0 3",
        "SORT l LIMIT x 1",
        "SORT l LIMIT 1",
        "SORT l FOO",
        "SORT_RO l STORE d",
        "SORT_RO l DESC",
        "RPUSH words b a c",
        "SORT words",
        "SORT words ALPHA",
        "SET w_a 3",
        "SET w_b 1",
        "SET w_c 2",
        "HSET h_a f 30 name x",
        "HSET h_b f 10",
        "SORT words BY w_*",
        "SORT words BY w_* DESC GET # GET h_*->name GET h_*->f",
        "SORT words BY h_*->f",
        "SORT words BY nosort",
        "SORT words BY nosort DESC",
        "SORT words BY nosort LIMIT 1 1",
        "SORT words BY missing_* ALPHA",
        "SORT words BY w_* ALPHA",
        "SORT words GET w_* GET nopattern",
        "SORT words GET w_* STORE dst",
        "LRANGE dst 0 -1",
        "SORT words BY w_* STORE dst",
        "LRANGE dst 0 -1",
        "SORT nothere STORE dst",
        "EXISTS dst",
        "SADD s 5 3 9 1",
        "SORT s",
        "SORT s DESC LIMIT 1 2",
        "SORT s BY nosort STORE sd",
        "LRANGE sd 0 -1",
        "ZADD z 1 c 2 a 3 b",
        "SORT z ALPHA",
        "SORT z BY nosort",
        "SORT z BY nosort DESC LIMIT 1 5",
        "SORT z",
        "SET str v",
        "SORT str",
        "SORT nothere",
        "RPUSH nums 1 2 3 ''",
        "SORT nums",
        "RPUSH bad 1 x",
        "SORT bad",
        "SORT bad ALPHA",
        "SORT bad STORE dst",
        "TYPE dst",
        "SET w_c notanumber",
        "SORT words BY w_*",
        "SORT words BY w_* ALPHA",
    ]))
    .unwrap();
}

#[test]
fn object_touch_and_memory_errors_match_redis() {
    compare(&script(&[
        "SET small 12345",
        "SET lead 0123",
        "SET short hello",
        "SET long 123456789012345678901234567890123456789012345",
        "OBJECT ENCODING small",
        "OBJECT ENCODING lead",
        "OBJECT ENCODING short",
        "OBJECT ENCODING long",
        "OBJECT ENCODING nothere",
        "OBJECT REFCOUNT short",
        "OBJECT REFCOUNT nothere",
        "OBJECT FREQ short",
        "OBJECT ENCODING",
        "OBJECT ENCODING a b",
        "OBJECT NOPE short",
        "OBJECT HELP",
        "OBJECT HELP more",
        "RPUSH l a",
        "OBJECT ENCODING l",
        "XADD st 1-1 a 1",
        "OBJECT ENCODING st",
        "TOUCH small l nothere small",
        "MEMORY USAGE nothere",
        "MEMORY USAGE small SAMPLES",
        "MEMORY USAGE small SAMPLES -1",
        "MEMORY USAGE small SAMPLES x",
        "MEMORY USAGE small FOO 1",
        "MEMORY USAGE",
        "MEMORY HELP",
        "MEMORY NOPE",
    ]))
    .unwrap();
}

/// MEMORY USAGE counts a key's entries in the store: more members, more
/// bytes; a sample of every member counts each.
#[test]
fn memory_usage_grows_with_what_a_key_holds() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Client::connect(p.sluice.addr);
    c.call(&[b"FLUSHALL"]);
    let usage = |c: &mut Client, args: &[&[u8]]| -> i64 {
        let reply = String::from_utf8(c.call(args)).unwrap();
        reply.trim_start_matches(':').trim_end().parse().unwrap()
    };
    c.call(&[b"SET", b"s", &[b'x'; 1000]]);
    let string = usage(&mut c, &[b"MEMORY", b"USAGE", b"s"]);
    assert!((1000..1100).contains(&string), "{string}");
    for i in 0..200u32 {
        c.call(&[
            b"HSET",
            b"h",
            format!("field{i:04}").as_bytes(),
            &[b'v'; 50],
        ]);
    }
    let sampled = usage(&mut c, &[b"MEMORY", b"USAGE", b"h"]);
    let every = usage(&mut c, &[b"MEMORY", b"USAGE", b"h", b"SAMPLES", b"0"]);
    // 200 entries of 8 + 9 + 50 bytes each, and the record with its field
    // order (2 + 9 bytes a field).
    let entries = 200 * 67 + 200 * 11;
    assert!((entries..entries + 200).contains(&every), "{every}");
    assert_eq!(sampled, every, "fields of one size: the sample is exact");
    // A value past hash-max-listpack-value: one more entry, no field order.
    c.call(&[b"HSET", b"h", b"big", &[b'v'; 5000]]);
    let grown = usage(&mut c, &[b"MEMORY", b"USAGE", b"h", b"SAMPLES", b"0"]);
    assert_eq!(grown, every + 8 + 3 + 5000 - 200 * 11);
}

/// Redis's tuning parameters: checked with Redis's bounds and texts, kept,
/// reported under both names; `stream-node-max-entries` sets the node
/// `~` trims by. Every value is set back at the end (the servers are
/// shared by the tests).
#[test]
fn tuning_parameters_match_redis() {
    compare(&script(&[
        "CONFIG SET hash-max-ziplist-entries 16",
        "CONFIG GET hash-max-ziplist-entries",
        "CONFIG GET hash-max-listpack-entries",
        "CONFIG GET HASH-MAX-LISTPACK-ENTRIES",
        "CONFIG GET hash-max-listpack-ent*",
        "CONFIG SET zset-max-ziplist-value 1kb list-max-ziplist-size -3",
        "CONFIG GET zset-max-listpack-value",
        "CONFIG GET list-max-listpack-size",
        "CONFIG SET zset-max-listpack-value 2M",
        "CONFIG GET zset-max-ziplist-value",
        "CONFIG SET hash-max-listpack-entries -1",
        "CONFIG SET list-max-ziplist-size x",
        "CONFIG SET zset-max-listpack-value -5",
        "CONFIG SET active-expire-effort 11",
        "CONFIG SET loglevel loud",
        "CONFIG SET loglevel WARNING",
        "CONFIG GET loglevel",
        "CONFIG SET activedefrag maybe",
        "CONFIG SET save \"900 1 60 10\"",
        "CONFIG GET save",
        "CONFIG SET save \"900\"",
        "CONFIG SET save \"\"",
        "CONFIG GET save",
        "CONFIG SET hz 5 hz 6",
        "CONFIG SET hz 5 lua-time-limit 100",
        "CONFIG GET hz",
        "CONFIG GET busy-reply-threshold",
        "CONFIG SET notify-keyspace-events \"\"",
        "CONFIG GET notify-keyspace-events",
        "CONFIG SET stream-node-max-entries 10",
        "EVAL \"for i = 1, 25 do redis.call('XADD', 's', i .. '-0', 'f', i) end\" 0",
        "XTRIM s MAXLEN ~ 12",
        "XLEN s",
        "XTRIM s MINID ~ 23",
        "XLEN s",
        "CONFIG SET stream-node-max-entries 100 hash-max-listpack-entries 512",
        "CONFIG SET zset-max-listpack-value 64 list-max-listpack-size -2 loglevel notice",
        "CONFIG SET hz 10 busy-reply-threshold 5000",
    ]))
    .unwrap();
}

/// The settings `sluice serve` has flags for, through CONFIG SET: the ones
/// that change while serving (appendfsync, client-query-buffer-limit),
/// the immutable ones, and parameters kept for Redis's clients. Set back
/// at the end (the servers are shared by the tests).
#[test]
fn served_settings_match_redis() {
    compare(&script(&[
        "CONFIG SET appendfsync no",
        "CONFIG GET appendfsync",
        "CONFIG SET appendfsync sometimes",
        "CONFIG SET appendfsync EVERYSEC",
        "CONFIG GET appendfsync",
        "CONFIG SET daemonize yes",
        "CONFIG GET daemonize",
        "CONFIG GET databases",
        "CONFIG SET databases 4",
        "CONFIG SET io-threads 4",
        "CONFIG SET client-query-buffer-limit 10mb",
        "CONFIG GET client-query-buffer-limit",
        "CONFIG SET client-query-buffer-limit 1k",
        "CONFIG SET client-query-buffer-limit lots",
        "CONFIG SET maxmemory-clients 200%",
        "CONFIG SET maxmemory-clients 10%",
        "CONFIG GET maxmemory-clients",
        "CONFIG SET maxmemory-clients 0",
        "CONFIG SET repl-backlog-size 2mb",
        "CONFIG GET repl-backlog-size",
        "CONFIG SET repl-backlog-size 1mb",
        "CONFIG GET key-load-delay",
        "CONFIG GET replicaof",
        "CONFIG SET replicaof x",
        "CONFIG REWRITE",
        "CONFIG REWRITE now",
        "CONFIG SET client-query-buffer-limit 1gb appendfsync always",
    ]))
    .unwrap();
}

/// HyperLogLogs byte for byte: the sparse and dense forms GET shows,
/// counts, merges, PFDEBUG's views, the promotion to dense, and the
/// errors for strings that are not one and for broken ones.
#[test]
fn hyperloglogs_match_redis() {
    compare(&script(&[
        "PFADD h",
        "PFCOUNT h",
        "GET h",
        "PFADD h a b c d e",
        "PFADD h a",
        "GET h",
        "PFCOUNT h",
        "GET h",
        "PFDEBUG DECODE h",
        "PFDEBUG ENCODING h",
        "PFADD h2 x y z a \"\"",
        "PFMERGE m h h2",
        "GET m",
        "PFCOUNT m",
        "PFCOUNT h h2 nothere",
        "PFMERGE h2 nothere",
        "GET h2",
        "EVAL \"for i=1,2000 do redis.call('PFADD', KEYS[1], 'e' .. i) end return redis.call('PFCOUNT', KEYS[1])\" 1 big",
        "PFDEBUG ENCODING big",
        "GET big",
        "PFDEBUG DECODE big",
        "PFMERGE both big h",
        "PFDEBUG ENCODING both",
        "PFCOUNT both",
        "GET both",
        "PFDEBUG GETREG h",
        "PFDEBUG ENCODING h",
        "PFDEBUG TODENSE h",
        "PFDEBUG TODENSE h2",
        "PFDEBUG ENCODING h2",
        "PFDEBUG NOPE h",
        "PFDEBUG GETREG h extra",
        "PFDEBUG GETREG nothere",
        "PFDEBUG",
        "CONFIG SET hll-sparse-max-bytes 30",
        "PFADD small a b c d e f g h i j k l m n o p",
        "PFDEBUG ENCODING small",
        "GET small",
        "CONFIG SET hll-sparse-max-bytes 3000",
        "SET s notanhll",
        "PFADD s a",
        "PFCOUNT s",
        "PFCOUNT h s",
        "PFMERGE s h",
        "PFMERGE h s",
        "PFDEBUG ENCODING s",
        "LPUSH l a",
        "PFADD l a",
        "PFCOUNT l",
        "PFCOUNT h l",
        "PFMERGE l h",
        "SET broken HYLL",
        "PFCOUNT broken",
        "PFADD tail a b c",
        "APPEND tail abc",
        "PFADD tail d",
        "PFCOUNT tail",
        "PFADD magic a",
        "SETRANGE magic 0 HYLX",
        "PFCOUNT magic",
        "PFADD enc a",
        "SETRANGE enc 4 \\x02",
        "PFCOUNT enc",
        "SET dense x",
        "PFDEBUG TODENSE h2",
        "SETRANGE h2 12304 x",
        "PFCOUNT h2",
        "PFSELFTEST",
        "PFADD",
        "PFCOUNT",
        "PFMERGE",
        "PFSELFTEST x",
    ]))
    .unwrap();
}

/// DUMP and RESTORE across the two servers: a payload Redis made
/// restores in Sluice and one Sluice made restores in Redis, each giving
/// back the same value (Redis writes its compact encodings — listpacks,
/// intsets, quicklists — and LZF-compressed strings; Sluice the plain
/// ones); then RESTORE's options and errors, answered alike.
#[test]
fn dump_and_restore_cross_between_the_servers() {
    let setup = [
        "SET s hello",
        "SET n 12345",
        "SET big xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "RPUSH l a b 3 -40000 c",
        "HSET h f v n 7",
        "SADD si 1 2 -3 100000",
        "SADD ss x y z",
        "ZADD z 1.5 a -2 b 3 c",
        "EVAL \"for i=1,300 do redis.call('RPUSH', KEYS[1], 'item' .. i) redis.call('HSET', KEYS[2], 'f' .. i, i) redis.call('ZADD', KEYS[3], i / 3, 'm' .. i) end\" 3 bl bh bz",
    ];
    let reads: &[(&str, &str)] = &[
        ("s", "GET"),
        ("n", "GET"),
        ("big", "GET"),
        ("l", "LRANGE * 0 -1"),
        ("h", "HGETALL"),
        ("si", "SMEMBERS"),
        ("ss", "SMEMBERS"),
        ("z", "ZRANGE * 0 -1 WITHSCORES"),
        ("bl", "LRANGE * 0 -1"),
        ("bh", "HGETALL"),
        ("bz", "ZRANGE * 0 -1 WITHSCORES"),
    ];
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut redis = Client::connect_port(p.redis.port);
    let mut sluice = Client::connect(p.sluice.addr);
    for c in [&mut redis, &mut sluice] {
        c.call(&[b"FLUSHALL"]);
        for line in setup {
            let args = sluice_server::resp::split_args(line.as_bytes()).unwrap();
            let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
            let reply = c.call(&refs);
            assert!(
                !reply.starts_with(b"-"),
                "{line}: {}",
                String::from_utf8_lossy(&reply)
            );
        }
    }
    let read = |c: &mut Client, key: &str, how: &str| -> Reply {
        let line = if how.contains('*') {
            how.replace('*', key)
        } else {
            format!("{how} {key}")
        };
        let args = sluice_server::resp::split_args(line.as_bytes()).unwrap();
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let reply = c.call_reply(&refs);
        match reply {
            Reply::Array(items) if how.starts_with("SMEMBERS") || how.starts_with("HGETALL") => {
                let mut v: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
                v.sort();
                Reply::Array(v.into_iter().map(|s| Reply::Bulk(s.into_bytes())).collect())
            }
            other => other,
        }
    };
    for &(key, how) in reads {
        for (from_redis, name) in [(true, "redis"), (false, "sluice")] {
            let (src, dst) = if from_redis {
                (&mut redis, &mut sluice)
            } else {
                (&mut sluice, &mut redis)
            };
            let payload = match src.call_reply(&[b"DUMP", key.as_bytes()]) {
                Reply::Bulk(b) => b,
                other => panic!("DUMP {key} on {name}: {other:?}"),
            };
            let copy = format!("{key}-from-{name}");
            let restored = dst.call(&[b"RESTORE", copy.as_bytes(), b"0", &payload]);
            assert_eq!(restored, b"+OK\r\n", "RESTORE of {name}'s DUMP of {key}");
            let want = read(src, key, how);
            let got = read(dst, &copy, how);
            assert_eq!(got, want, "{key} dumped by {name} and restored");
        }
    }
    drop(_one);
    compare(&script(&[
        "SET k v",
        "DUMP nothere",
        "RESTORE k 0 garbage",
        "RESTORE fresh 0 garbage",
        "RESTORE fresh -1 garbage",
        "RESTORE fresh x garbage",
        "RESTORE fresh 0 garbage NOPE",
        "RESTORE fresh 0 garbage IDLETIME -1",
        "RESTORE fresh 0 garbage FREQ 256",
        "RESTORE fresh 0 garbage FREQ 1 IDLETIME 5",
        "RESTORE fresh 0 \"\\x00\\x03abc\\x0a\\x00\\xde\\xad\\xbe\\xef\\xde\\xad\\xbe\\xef\"",
        "RESTORE fresh 0 \"\\x00\\x03abc\\x0a\\x00\\xd9\\xac\\x30\\x3d\\x41\\x72\\xa2\\xe2\"",
        "GET fresh",
        "RESTORE fresh 0 \"\\x00\\x03abc\\x0a\\x00\\xd9\\xac\\x30\\x3d\\x41\\x72\\xa2\\xe2\"",
        "RESTORE fresh 0 \"\\x00\\x03abc\\x0a\\x00\\xd9\\xac\\x30\\x3d\\x41\\x72\\xa2\\xe2\" REPLACE",
        "RESTORE ttl 100000 \"\\x00\\x03abc\\x0a\\x00\\xd9\\xac\\x30\\x3d\\x41\\x72\\xa2\\xe2\"",
        "PTTL ttl",
        "RESTORE abs 1 \"\\x00\\x03abc\\x0a\\x00\\xd9\\xac\\x30\\x3d\\x41\\x72\\xa2\\xe2\" ABSTTL",
        "EXISTS abs",
        "DUMP fresh",
    ]))
    .unwrap();
}

#[test]
fn databases_match_redis() {
    compare(&script(&[
        "SELECT 16",
        "SELECT -1",
        "SELECT x",
        "SELECT 2147483648",
        "SET k zero",
        "RPUSH l a b c",
        "HSET h f v",
        "SET e v EX 1000",
        "SELECT 3",
        "GET k",
        "DBSIZE",
        "SET k three",
        "GET k",
        "KEYS *",
        "SELECT 0",
        "GET k",
        "DBSIZE",
        "MOVE k 3",
        "MOVE l 3",
        "EXISTS l",
        "MOVE e 3",
        "MOVE nothere 3",
        "MOVE k 0",
        "MOVE k 16",
        "MOVE k -1",
        "MOVE k x",
        "MOVE k 2147483648",
        "SELECT 3",
        "LRANGE l 0 -1",
        "TYPE l",
        "TTL e",
        "RPUSH l d",
        "LRANGE l 0 -1",
        "SELECT 0",
        "COPY h h",
        "COPY h h DB 0",
        "COPY h h DB 3",
        "COPY h h2 DB 16",
        "COPY h h2 DB x",
        "COPY h h2 DB 2147483648",
        "COPY h k DB 3",
        "COPY h k DB 3 REPLACE",
        "SELECT 3",
        "HGETALL h",
        "HGETALL k",
        "DBSIZE",
        "SWAPDB 0 3",
        "DBSIZE",
        "HGETALL k",
        "SWAPDB 0 16",
        "SWAPDB x 1",
        "SWAPDB 1 x",
        "SWAPDB 2147483648 1",
        "SWAPDB 1 2147483648",
        "SWAPDB 16 x",
        "SWAPDB 1 1",
        "SWAPDB 3 0",
        "FLUSHDB",
        "DBSIZE",
        "SELECT 0",
        "DBSIZE",
        "HGETALL h",
        "MULTI",
        "SELECT 7",
        "SET m 1",
        "EXEC",
        "GET m",
        "SELECT 0",
        "GET m",
        "EVAL \"redis.call('SELECT', 9); redis.call('SET', 's', 1); return redis.call('GET', 's')\" 0",
        "GET s",
        "EVAL \"return redis.pcall('SELECT', 99)\" 0",
        "SELECT 9",
        "GET s",
        "FLUSHALL",
        "DBSIZE",
        "SELECT 7",
        "DBSIZE",
    ]))
    .unwrap();
}

/// WATCH against the other databases: a write of the same key in another
/// database does not touch it, FLUSHDB and SWAPDB do (Redis's multi.tcl).
#[test]
fn watch_across_databases_matches_redis() {
    compare(&script(&[
        "SELECT 5",
        "SET x 30",
        "WATCH x",
        "SELECT 1",
        "SET x 10",
        "SELECT 5",
        "MULTI",
        "PING",
        "EXEC",
        "SELECT 0",
        "SET x 30",
        "WATCH x",
        "SWAPDB 0 1",
        "MULTI",
        "PING",
        "EXEC",
        "FLUSHALL",
        "SELECT 1",
        "SET x 30",
        "SELECT 0",
        "WATCH x",
        "SWAPDB 0 1",
        "MULTI",
        "PING",
        "EXEC",
        "FLUSHALL",
        "WATCH x",
        "SWAPDB 0 1",
        "MULTI",
        "PING",
        "EXEC",
        "SET x 1",
        "SELECT 2",
        "SET y 1",
        "SELECT 0",
        "WATCH x",
        "SELECT 2",
        "FLUSHDB",
        "MULTI",
        "PING",
        "EXEC",
        "SELECT 0",
        "WATCH x",
        "FLUSHDB",
        "MULTI",
        "PING",
        "EXEC",
        "SWAPDB 0 1",
    ]))
    .unwrap();
}

#[test]
fn scripts_match_redis() {
    compare(&script(&[
        "EVAL \"return 1\" 0",
        "EVAL \"return {1, 2, 'x', false, 3}\" 0",
        "EVAL \"return {1, 2, nil, 4}\" 0",
        "EVAL \"return 3.99\" 0",
        "EVAL \"return -2.5\" 0",
        "EVAL \"return true\" 0",
        "EVAL \"return false\" 0",
        "EVAL \"return nil\" 0",
        "EVAL \"return 'text'\" 0",
        "EVAL \"return redis.call('SET', KEYS[1], ARGV[1])\" 1 k v",
        "EVAL \"return redis.call('GET', KEYS[1])\" 1 k",
        "EVAL \"return redis.call('GET', 'nothere')\" 0",
        "EVAL \"redis.call('RPUSH', 'l', 'a', 'b'); return redis.call('LRANGE', 'l', 0, -1)\" 0",
        "EVAL \"return redis.call('INCRBY', 'n', 5)\" 0",
        "EVAL \"return redis.call('HGETALL', 'nothere')\" 0",
        "EVAL \"return redis.pcall('INCR', KEYS[1])\" 1 k",
        "EVAL \"return redis.call('INCR', KEYS[1])\" 1 k",
        "EVAL \"return redis.call('nosuch')\" 0",
        "EVAL \"return redis.call('SET', 'a')\" 0",
        "EVAL \"return 1 +\" 0",
        "EVAL \"error('boom')\" 0",
        "EVAL \"error({err='MY custom'})\" 0",
        "EVAL \"return redis.error_reply('MY err')\" 0",
        "EVAL \"return redis.status_reply('FINE')\" 0",
        "EVAL \"return redis.sha1hex('abc')\" 0",
        "EVAL \"return {KEYS[1], KEYS[2], ARGV[1], #ARGV}\" 2 a b c",
        "EVAL \"return 1\" -1",
        "EVAL \"return 1\" 3 a b",
        "EVAL \"return 1\" x",
        "SCRIPT LOAD \"return 'loaded'\"",
        "EVALSHA 6f4ac0d5c0d8b0f4c9f6b3e7b0c6c7c1f0b4c4a1 0",
        "EVALSHA fd3d91d1a0c6a0e3c2e5e30fb7e0dbf4a3a9eb01 0",
        "SCRIPT EXISTS fd3d91d1a0c6a0e3c2e5e30fb7e0dbf4a3a9eb01 nosuch",
        "EVAL_RO \"return redis.call('GET', 'k')\" 0",
        "EVAL_RO \"return redis.call('SET', 'k', 'v')\" 0",
        "SCRIPT FLUSH",
        "SCRIPT FLUSH FOO",
        "SCRIPT FOO",
        "SCRIPT KILL",
        "FUNCTION FLUSH",
        "FUNCTION FLUSH SYNC",
        "FUNCTION LIST",
        "FUNCTION FOO",
        "MULTI",
        "EVAL \"return redis.call('SET', 'm', 'in-multi')\" 0",
        "GET m",
        "EXEC",
        "GET m",
    ]))
    .unwrap();
}

#[test]
fn functions_match_redis() {
    let lib = "\"#!lua name=mylib\nredis.register_function('get_it', function(keys, args) return redis.call('GET', keys[1]) end)\nredis.register_function{function_name='ro', callback=function(keys, args) return args[1] end, flags={'no-writes'}, description='reads'}\"";
    compare(&script(&[
        "FUNCTION FLUSH",
        &format!("FUNCTION LOAD {lib}"),
        &format!("FUNCTION LOAD {lib}"),
        &format!("FUNCTION LOAD REPLACE {lib}"),
        &format!("FUNCTION LOAD FOO {lib}"),
        "SET k v",
        "FCALL get_it 1 k",
        "FCALL get_it 1",
        "FCALL get_it x",
        "FCALL get_it -1",
        "FCALL nosuch 0",
        "FCALL_RO get_it 1 k",
        "FCALL_RO ro 0 arg",
        "FUNCTION DELETE mylib",
        "FUNCTION LOAD \"#!lua name=one\nredis.register_function{function_name='ro', callback=function(keys, args) return args[1] end, flags={'no-writes', 'allow-oom'}, description='reads'}\"",
        "FUNCTION LIST",
        "FUNCTION LIST WITHCODE LIBRARYNAME o*",
        "FUNCTION LIST LIBRARYNAME nomatch*",
        "FUNCTION LIST LIBRARYNAME",
        "FUNCTION LIST BAD",
        "FUNCTION STATS",
        "FUNCTION KILL",
        "FUNCTION LOAD \"no shebang\"",
        "FUNCTION LOAD \"#!lua\nreturn 1\"",
        "FUNCTION LOAD \"#!lua name=a name=b\nreturn 1\"",
        "FUNCTION LOAD \"#!lua name=a foo=b\nreturn 1\"",
        "FUNCTION LOAD \"#!lua name=bad-name\nreturn 1\"",
        "FUNCTION LOAD \"#!nosuch name=a\nreturn 1\"",
        "FUNCTION LOAD \"#!lua name=a\nreturn 1\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function('get_it', function() return 1 end)\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function('f')\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function('f', 1)\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function{function_name='f', callback=function() end, flags={'bad'}}\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function{function_name='f'}\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.register_function('f', function() return 1 end)\nredis.register_function('f', function() return 1 end)\"",
        "FUNCTION LOAD \"#!lua name=a\nredis.call('ping')\"",
        "FUNCTION LOAD \"#!lua name=a\nx = 1\"",
        "FUNCTION LOAD \"#!lua name=a\nlocal n = string.len('x')\"",
        "FUNCTION LOAD \"#!lua name=a\nreturn +\"",
        "FUNCTION DELETE nosuch",
        "FUNCTION DELETE one",
        "FCALL ro 0",
        "FUNCTION LIST",
    ]))
    .unwrap();
}

#[test]
fn script_libraries_and_protection_match_redis() {
    compare(&script(&[
        "EVAL \"return cjson.encode({1, 2, {a = 1.5, b = 'x/y\\n'}})\" 0",
        "EVAL \"return cjson.encode({})\" 0",
        "EVAL \"return cjson.encode({[1] = 1, [20] = 2})\" 0",
        "EVAL \"return cjson.encode(0.1)\" 0",
        "EVAL \"return cjson.encode(1e20)\" 0",
        "EVAL \"return table.concat(cjson.decode('[0.0, -5e3, -1, 0.3e-3, 1023.2, 0e10]'), ' ')\" 0",
        "EVAL \"local t = cjson.decode('{\\\"a\\\": [1, \\\"\\\\u00e9\\\"], \\\"b\\\": null}') return {t.a[1], t.a[2], type(t.b)}\" 0",
        "EVAL \"return {pcall(cjson.decode, '{\\\"a\\\":')}\" 0",
        "EVAL \"return cjson.decode('[1,')\" 0",
        "EVAL \"local s = cmsgpack.pack({1, 2, 3}, 'x', 300, -33, 1.5, 0.1, true, {a = 1}) local h = '' for i = 1, #s do h = h .. string.format('%02x', string.byte(s, i)) end return h\" 0",
        "EVAL \"local t = cmsgpack.unpack(cmsgpack.pack({10, {y = 'z'}})) return {t[1], t[2].y}\" 0",
        "EVAL \"return {cmsgpack.unpack_one(cmsgpack.pack(1, 2), 0)}\" 0",
        "EVAL \"return cmsgpack.unpack('\\\\xc1')\" 0",
        "EVAL \"return {pcall(cmsgpack.unpack, string.rep(string.char(0x91), 100000))}\" 0",
        "EVAL \"return {pcall(cjson.decode, string.rep('[', 100000))}\" 0",
        "EVAL \"return {bit.band(7, 3), bit.bor(1, 2, 4), bit.bxor(5, 1), bit.lshift(1, 4), bit.rshift(-1, 28), bit.arshift(-16, 2), bit.tohex(255), bit.tohex(-1, -4), bit.tobit(4294967297)}\" 0",
        "EVAL \"return a\" 0",
        "EVAL \"a = 1\" 0",
        "EVAL \"redis.call = nil\" 0",
        "EVAL \"cjson.encode = nil\" 0",
        "EVAL \"setmetatable(_G, {})\" 0",
        "EVAL \"print(1)\" 0",
        "EVAL \"return loadstring(string.dump(function() return 1 end))()\" 0",
        "EVAL \"return redis.call('blpop', 'x', 0)\" 0",
        "EVAL \"return redis.pcall('xread', 'BLOCK', 0, 'STREAMS', 's', '$')\" 0",
        "EVAL \"return redis.sha1hex()\" 0",
        "EVAL \"return redis.error_reply('MY_CODE text')\" 0",
        "EVAL \"return redis.error_reply('plain')\" 0",
        "EVAL \"return redis.setresp(4)\" 0",
        "HSET h f v",
        "EVAL \"redis.setresp(3) return redis.call('HGETALL', 'h')\" 0",
        "EVAL \"redis.setresp(3) return {redis.call('GET', 'nothere') == nil, redis.call('EXISTS', 'h')}\" 0",
        "EVAL \"return {double = 3.5}\" 0",
        "EVAL \"return {map = {a = 1}}\" 0",
        "EVAL \"#!lua flags=no-writes\nreturn redis.call('SET', 'a', 1)\" 0",
        "EVAL \"#!lua flags=bogus\nreturn 1\" 0",
        "EVAL \"#!lua foo=bar\nreturn 1\" 0",
        "EVAL \"#!other\nreturn 1\" 0",
        "EVAL_RO \"#!lua\nreturn 1\" 0",
        "EVAL_RO \"#!lua flags=no-writes\nreturn 1\" 0",
        "EVAL \"return redis.call('ping')\" 0",
        "EVAL \"local ok, e = pcall(redis.call, 'nosuch') return e\" 0",
        "EVAL \"return {pcall(error, {err = 'MINE x'})}\" 0",
        "EVAL \"return {pcall(function() return a end)}\" 0",
        "EVAL \"local a = {} local b = {a} a[1] = b return 1\" 0",
        "EVAL \"return redis.call('cluster', 'reset', 'hard')\" 0",
        "EVAL \"return {struct.pack('>i2Hb', 1, 2, -3):byte(1, -1)}\" 0",
        "EVAL \"local a, b, c, n = struct.unpack('<hHs', struct.pack('<hHs', -2, 65535, 'hi')) return {a, b, c, n}\" 0",
        "EVAL \"return {struct.size('!4bi'), struct.size('<bhld'), struct.size('!bhld')}\" 0",
        "EVAL \"return struct.size('s')\" 0",
        "EVAL \"return struct.pack('z')\" 0",
        "EVAL \"return struct.unpack('i', 'ab')\" 0",
        "EVAL \"return {struct.unpack('Bc0', struct.pack('Bc0', 3, 'abc'))}\" 0",
        "EVAL \"return {struct.pack('>d', 1.5):byte(1, -1)}\" 0",
        "EVAL \"return {struct.pack('!8bd', 1, 2.5):len(), struct.unpack('>I3', 'abc')}\" 0",
        "EVAL \"struct.pack = nil\" 0",
        "CLUSTER INFO",
        "CLUSTER INFO x",
        "CLUSTER FOO",
        "CLUSTER KEYSLOT a",
        "CLIENT KILL TYPE wrong_type",
        "CLIENT KILL TYPE master",
        "CLIENT KILL TYPE replica SKIPME yes",
        "CLIENT KILL TYPE pubsub",
        "CLIENT KILL ID 10 wrong_arg",
        "CLIENT KILL ID str",
        "ROLE",
        "ROLE x",
        "WAIT 0 0",
        "WAIT x 0",
        "WAIT 1 -1",
        "WAIT 1 x",
        "WAIT 1 50",
        "MULTI",
        "WAIT 1 0",
        "EXEC",
        "SLOWLOG GET x",
        "SLOWLOG GET -2",
        "SLOWLOG FOO",
        "SLOWLOG HELP",
        "SLOWLOG LEN extra",
        "LATENCY HELP",
        "LATENCY LATEST",
        "LATENCY HISTORY command",
        "LATENCY RESET",
        "LATENCY FOO",
        "CLIENT NO-EVICT on",
        "CLIENT NO-EVICT OFF",
        "CLIENT NO-EVICT maybe",
        "CLIENT NO-EVICT",
    ]))
    .unwrap();
}

#[test]
fn big_lists_and_sets_go_whole() {
    // Over 64 members a collection's members go with one range delete.
    for members in [3usize, 70, 200] {
        let items: String = (0..members).map(|i| format!(" m{i}")).collect();
        let scored: String = (0..members).map(|i| format!(" {} m{i}", i % 7)).collect();
        compare(&script(&[
            &format!("ZADD z{scored}"),
            "ZCARD z",
            "ZRANGE z 30 35 WITHSCORES",
            "ZRANK z m5",
            "DEL z",
            "ZADD z 1 again",
            "ZRANGE z 0 -1 WITHSCORES",
            &format!("ZADD z{scored}"),
            "ZREMRANGEBYRANK z 0 10",
            "ZPOPMAX z 3",
            "EXPIRE z 0",
            "ZCARD z",
            &format!("RPUSH l{items}"),
            &format!("SADD s{items}"),
            "LLEN l",
            "SCARD s",
            "LRANGE l 60 65",
            "LINDEX l -1",
            "DEL l s",
            "RPUSH l again",
            "SADD s again",
            "LRANGE l 0 -1",
            "SMEMBERS s",
            &format!("RPUSH l{items}"),
            "LTRIM l 2 -3",
            "LLEN l",
            "LRANGE l 0 2",
            "EXPIRE l 0",
            "LLEN l",
        ]))
        .unwrap();
    }
}

#[test]
fn transactions_read_their_own_list_and_set_writes() {
    compare(&script(&[
        "RPUSH tl old1 old2 old3",
        "SADD ts old",
        "MULTI",
        "RPUSH tl a b",
        "LPOP tl",
        "LRANGE tl 0 -1",
        "LREM tl 0 old3",
        "LINSERT tl AFTER a mid",
        "LRANGE tl 0 -1",
        "LMOVE tl tl2 RIGHT LEFT",
        "LRANGE tl2 0 -1",
        "SADD ts x y",
        "SREM ts old",
        "SMEMBERS ts",
        "DEL ts",
        "SADD ts z",
        "SMEMBERS ts",
        "SCARD ts",
        "ZADD tz 1 a 2 b",
        "ZINCRBY tz 5 a",
        "ZRANGE tz 0 -1 WITHSCORES",
        "ZPOPMIN tz",
        "ZRANGE tz 0 -1 WITHSCORES",
        "RENAME tl tl3",
        "LRANGE tl3 0 -1",
        "EXEC",
        "LRANGE tl3 0 -1",
        "SMEMBERS ts",
        "MULTI",
        "FLUSHALL",
        "RPUSH tl 1",
        "LRANGE tl 0 -1",
        "EXEC",
        "DBSIZE",
    ]))
    .unwrap();
}

#[test]
fn transactions_match_redis() {
    compare(&script(&[
        "EXEC",
        "DISCARD",
        "MULTI",
        "MULTI",
        "SET a 1",
        "INCR a",
        "GET a",
        "HSET h f 1",
        "HGETALL h",
        "RENAME a b",
        "KEYS *",
        "DEL b",
        "EXISTS b",
        "EXEC",
        "MULTI",
        "SET a 2",
        "DISCARD",
        "GET a",
        "MULTI",
        "SET a",
        "SET a 3",
        "NOSUCHCOMMAND",
        "EXEC",
        "GET a",
        "MULTI",
        "WATCH a",
        "INCR a",
        "EXEC",
        "MULTI",
        "SET s abc",
        "INCR s",
        "SET t 1",
        "EXEC",
        "GET t",
        "WATCH a b",
        "SET a changed",
        "MULTI",
        "SET b from-tx",
        "EXEC",
        "GET b",
        "WATCH a",
        "UNWATCH",
        "SET a again",
        "MULTI",
        "SET b from-tx",
        "EXEC",
        "WATCH a",
        "MULTI",
        "PING",
        "ECHO hi",
        "EXEC",
        "MULTI",
        "FLUSHDB",
        "SET after-flush 1",
        "KEYS *",
        "DBSIZE",
        "EXEC",
        "KEYS *",
        "EXEC",
        "WATCH",
        "UNWATCH x",
        // A flush aborts a WATCH only of keys it removed.
        "DEL x",
        "WATCH x",
        "FLUSHALL",
        "MULTI",
        "PING",
        "EXEC",
        "SET x 30",
        "WATCH x",
        "FLUSHDB",
        "MULTI",
        "PING",
        "EXEC",
        "MSET a a b b",
        "WATCH b a",
        "FLUSHALL",
        "MULTI",
        "PING",
        "EXEC",
        // SAVE and SHUTDOWN are refused inside MULTI.
        "SAVE",
        "SAVE now",
        "MULTI",
        "SET foo bar",
        "SAVE",
        "SHUTDOWN",
        "EXEC",
        "GET foo",
    ]))
    .unwrap();
}

#[test]
fn resp3_replies_match_redis() {
    compare(&script(&[
        "HELLO 3",
        "SET a 1",
        "GET a",
        "GET nothere",
        "MGET a nothere",
        "HSET h a 1 b 2",
        "HGETALL h",
        "HGETALL nothere",
        "HMGET h a x",
        "INCRBYFLOAT f 1.5",
        "HINCRBYFLOAT h f 2.5",
        "KEYS *",
        "TTL a",
        "HELLO 2",
        "HGETALL h",
    ]))
    .unwrap();
}

fn word(options: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    proptest::sample::select(options).prop_map(|s| s.as_bytes().to_vec())
}

fn generated_command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let key = || word(&["k1", "k2", "k3", "h1", "h2"]);
    let field = || word(&["f1", "f2", "f3"]);
    let value = || {
        word(&[
            "v",
            "",
            "0",
            "10",
            "-5",
            "3.5",
            "1e3",
            "abc",
            " 1",
            "1.0",
            "9223372036854775807",
            "-9223372036854775808",
        ])
    };
    let seconds = || word(&["-1", "0", "100", "10000", "abc"]);
    let name = word(&[
        "GET",
        "SET",
        "SETNX",
        "SETEX",
        "GETSET",
        "GETDEL",
        "GETEX",
        "MGET",
        "MSET",
        "MSETNX",
        "APPEND",
        "STRLEN",
        "GETRANGE",
        "SETRANGE",
        "INCR",
        "DECR",
        "INCRBY",
        "DECRBY",
        "INCRBYFLOAT",
        "DEL",
        "EXISTS",
        "TYPE",
        "RENAME",
        "RENAMENX",
        "COPY",
        "EXPIRE",
        "PEXPIRE",
        "EXPIREAT",
        "TTL",
        "PERSIST",
        "HSET",
        "HSETNX",
        "HGET",
        "HMGET",
        "HGETALL",
        "HDEL",
        "HLEN",
        "HEXISTS",
        "HSTRLEN",
        "HINCRBY",
        "HINCRBYFLOAT",
        "HKEYS",
        "HVALS",
        "KEYS",
        "DBSIZE",
        "LPUSH",
        "RPUSH",
        "LPUSHX",
        "LPOP",
        "RPOP",
        "LRANGE",
        "LLEN",
        "LINDEX",
        "LSET",
        "LREM",
        "LTRIM",
        "LINSERT",
        "LPOS",
        "LMOVE",
        "RPOPLPUSH",
        "SADD",
        "SREM",
        "SISMEMBER",
        "SCARD",
        "SMEMBERS",
        "SMOVE",
        "SINTERSTORE",
        "SUNIONSTORE",
        "SDIFF",
        "ZADD",
        "ZINCRBY",
        "ZREM",
        "ZSCORE",
        "ZRANK",
        "ZCARD",
        "ZCOUNT",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREVRANGE",
        "ZPOPMIN",
        "ZREMRANGEBYSCORE",
    ]);
    let option = word(&[
        "NX",
        "XX",
        "GET",
        "KEEPTTL",
        "EX",
        "PX",
        "PERSIST",
        "GT",
        "LT",
        "LEFT",
        "RIGHT",
        "BEFORE",
        "AFTER",
        "RANK",
        "COUNT",
        "CH",
        "INCR",
        "WITHSCORES",
        "BYSCORE",
        "REV",
        "(1",
        "-inf",
        "+inf",
    ]);
    let arg = prop_oneof![key(), field(), value(), seconds(), option];
    (name, key(), proptest::collection::vec(arg, 0..5)).prop_map(|(name, key, rest)| {
        let mut args = vec![name, key];
        args.extend(rest);
        args
    })
}

/// A command of the pipelined test: mostly plain SETs (which a serving
/// thread commits in groups), mixed with reads of what they wrote, SETs
/// with options, read-modify-writes and hashes under the same keys (a
/// grouped SET over a hash must remove its fields). Replies of these are
/// the same bytes in Redis whatever the order of hash fields.
fn pipelined_command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let key = || word(&["k1", "k2", "k3", "h1"]);
    let value = || word(&["v", "", "7", "abc"]);
    let field = || word(&["f1", "f2"]);
    prop_oneof![
        6 => (key(), value()).prop_map(|(k, v)| vec![b"SET".to_vec(), k, v]),
        2 => key().prop_map(|k| vec![b"GET".to_vec(), k]),
        1 => (key(), key()).prop_map(|(a, b)| vec![b"MGET".to_vec(), a, b]),
        1 => (key(), value()).prop_map(|(k, v)| vec![b"SET".to_vec(), k, v, b"NX".to_vec()]),
        1 => key().prop_map(|k| vec![b"INCR".to_vec(), k]),
        1 => (key(), value()).prop_map(|(k, v)| vec![b"APPEND".to_vec(), k, v]),
        1 => key().prop_map(|k| vec![b"DEL".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"TYPE".to_vec(), k]),
        1 => (key(), field(), value()).prop_map(|(k, f, v)| vec![b"HSET".to_vec(), k, f, v]),
        1 => (key(), field()).prop_map(|(k, f)| vec![b"HGET".to_vec(), k, f]),
        1 => key().prop_map(|k| vec![b"HLEN".to_vec(), k]),
    ]
}

/// Sends `script` as one pipeline and reads a reply per command.
fn pipelined(
    send: &mut dyn FnMut(&[u8]),
    read: &mut dyn FnMut() -> Vec<u8>,
    script: &[Vec<Vec<u8>>],
) -> Vec<Vec<u8>> {
    let mut bytes = Vec::new();
    for args in script {
        bytes.extend(common::request(args));
    }
    send(&bytes);
    script.iter().map(|_| read()).collect()
}

/// [`pipelined`] over a TCP connection, after FLUSHALL.
fn pipelined_tcp(mut c: Client, commands: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    c.call(&[b"FLUSHALL"]);
    let stream = c.stream.try_clone().unwrap();
    let mut send = |b: &[u8]| (&stream).write_all(b).unwrap();
    let mut read = || c.read_reply().unwrap();
    pipelined(&mut send, &mut read, commands)
}

/// Sends `commands` as one pipeline to Redis and to Sluice (over TCP and
/// over shared memory): the replies must be the same bytes.
fn compare_pipelined(commands: &[Vec<Vec<u8>>]) -> Result<(), TestCaseError> {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let want = pipelined_tcp(Client::connect_port(p.redis.port), commands);
    let over_tcp = pipelined_tcp(Client::connect(p.sluice.addr), commands);
    let url = format!("shm://{}", p.shm_path.display());
    let shm = std::cell::RefCell::new(sluice_client::Client::connect(&url).unwrap());
    shm.borrow_mut().call_raw(&[b"FLUSHALL"]).unwrap();
    let over_shm = {
        let mut send = |b: &[u8]| shm.borrow_mut().send_raw(b).unwrap();
        let mut read = || shm.borrow_mut().read_reply_raw().unwrap();
        pipelined(&mut send, &mut read, commands)
    };
    let show_all = || {
        commands
            .iter()
            .map(|a| show(a))
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    for (via, got) in [("tcp", over_tcp), ("shm", over_shm)] {
        for (i, (r, s)) in want.iter().zip(&got).enumerate() {
            prop_assert_eq!(
                String::from_utf8_lossy(r),
                String::from_utf8_lossy(s),
                "command {} `{}` over {}; pipeline:\n  {}",
                i,
                show(&commands[i]),
                via,
                show_all()
            );
        }
    }
    Ok(())
}

/// Pipelined LRANGEs over lists written before (their writes durable, so
/// each reply is framed straight onto the connection's queue): every
/// reply the bytes Redis sends — whole lists, parts, negative and past-end
/// indexes, an empty range, no such key, a wrong type, a bad index, items
/// of each length width, inside MULTI and in RESP3 — over TCP and shared
/// memory, with the commands between them answered in order.
#[test]
fn pipelined_lranges_answer_as_redis_does() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let setup = script(&[
        "FLUSHALL",
        "RPUSH L a bb ccc",
        "SET str hello",
        "RPUSH empty x",
        "LPOP empty",
    ]);
    let mut items = vec![b"RPUSH".to_vec(), b"W".to_vec()];
    for len in [0, 1, 9, 10, 99, 100, 999, 1000, 5000] {
        items.push(vec![b'x'; len]);
    }
    let reads = script(&[
        "LRANGE L 0 -1",
        "LRANGE L 1 1",
        "LRANGE L -2 100",
        "LRANGE L 5 10",
        "LRANGE L 2 1",
        "LRANGE nothing 0 -1",
        "LRANGE str 0 -1",
        "LRANGE L x 1",
        "LRANGE L 0 99999999999999999999",
        "GET str",
        "LRANGE W 0 -1",
        "LRANGE W -3 -1",
        "MULTI",
        "LRANGE L 0 0",
        "LRANGE W 1 2",
        "EXEC",
        "HELLO 3",
        "LRANGE L 0 -1",
        "LRANGE nothing 0 -1",
        "HELLO 2",
        "LRANGE L 0 -1",
    ]);
    let run = |c: Client| {
        let mut c = c;
        for args in &setup {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            c.call(&args);
        }
        let args: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        c.call(&args);
        let stream = c.stream.try_clone().unwrap();
        let mut send = |b: &[u8]| (&stream).write_all(b).unwrap();
        let mut read = || c.read_reply().unwrap();
        pipelined(&mut send, &mut read, &reads)
    };
    let want = run(Client::connect_port(p.redis.port));
    let got = run(Client::connect(p.sluice.addr));
    let over_shm = {
        let url = format!("shm://{}", p.shm_path.display());
        let shm = std::cell::RefCell::new(sluice_client::Client::connect(&url).unwrap());
        for args in setup.iter().chain([&items]) {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            shm.borrow_mut().call_raw(&args).unwrap();
        }
        let mut send = |b: &[u8]| shm.borrow_mut().send_raw(b).unwrap();
        let mut read = || shm.borrow_mut().read_reply_raw().unwrap();
        pipelined(&mut send, &mut read, &reads)
    };
    for (via, got) in [("tcp", got), ("shm", over_shm)] {
        assert_eq!(got.len(), want.len());
        for (i, (r, s)) in want.iter().zip(&got).enumerate() {
            if reads[i][0] == b"HELLO" {
                // Its map names the client's id, which differs.
                assert_eq!(r[..3], s[..3], "HELLO over {via}");
                continue;
            }
            assert_eq!(
                String::from_utf8_lossy(r),
                String::from_utf8_lossy(s),
                "command {i} `{}` over {via}",
                show(&reads[i])
            );
        }
    }
}

/// Pipelined PINGs, which a serving thread answers where they lie in its
/// read buffer: the bytes Redis sends, in order with the writes before
/// them (whose replies wait for the log here), inside MULTI, with a
/// message, in any case — and each counted in INFO commandstats.
#[test]
fn pipelined_pings_answer_as_redis_does_and_are_counted() {
    let commands = script(&[
        "PING",
        "ping",
        "SET k1 v",
        "PING",
        "PING hello",
        "GET k1",
        "MULTI",
        "PING",
        "EXEC",
        "PiNg",
        "INCR n",
        "PING",
    ]);
    {
        let p = pair();
        let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
        Client::connect(p.sluice.addr).call(&[b"CONFIG", b"RESETSTAT"]);
    }
    compare_pipelined(&commands).unwrap();
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let info = Client::connect(p.sluice.addr).call(&[b"INFO", b"commandstats"]);
    let info = String::from_utf8_lossy(&info);
    let calls = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse::<u64>().ok());
    // Seven PINGs each over TCP and shared memory (the one inside MULTI
    // counted when EXEC runs it).
    assert_eq!(calls, Some(14), "{info}");
}

/// A SET over a hash, among other SETs of one pipeline, removes the hash's
/// fields: a hash made again at that key has only its new ones.
#[test]
fn pipelined_set_over_a_hash_removes_its_fields() {
    compare_pipelined(&script(&[
        "HSET h1 f1 a f2 b",
        "SET k1 x",
        "SET h1 y",
        "SET k2 z",
        "TYPE h1",
        "DEL h1",
        "HSET h1 f1 c",
        "HLEN h1",
        "HGET h1 f2",
        "SET h1 w",
        "GET h1",
        "MGET k1 k2 h1",
    ]))
    .unwrap();
}

/// Pipelined LPUSH, RPUSH, LPOP, RPOP, INCR, DECR, SADD, HSET and ZADD,
/// which a serving thread runs per key in groups of one kind: each reply
/// is what the command answers run alone — lengths counted per command,
/// pops past the end, type errors, an INCR that would overflow among
/// others that do not, keys that expired, two databases — and what they
/// leave is the same.
#[test]
fn pipelined_collection_writes_answer_as_one_by_one() {
    compare_pipelined(&script(&[
        "SET str hello",
        "SET big 9223372036854775805",
        "SET gone 5 PXAT 1",
        "RPUSH old x",
        "PEXPIREAT old 1",
        "LPUSH L a b",
        "RPUSH L c",
        "LPUSH L2 d",
        "LPUSH str x",
        "LPUSH L e",
        "LPUSH L2 f g",
        "LPUSH old y",
        "RPUSH L2 h i j",
        "RPOP L",
        "RPOP L",
        "RPOP L",
        "RPOP L",
        "RPOP L",
        "LPOP L2",
        "LPOP nothing",
        "LPOP str",
        "LPOP L2",
        "INCR big",
        "INCR big",
        "INCR big",
        "INCR big",
        "DECR big",
        "INCR gone",
        "INCR fresh",
        "INCR fresh",
        "INCR str",
        "DECR fresh",
        "DECR L2",
        "SADD s a b",
        "SADD s b c c",
        "SADD s2 x",
        "SADD str x",
        "SADD s a",
        "HSET h a 1 b 2",
        "HSET h b 3 c 4",
        "HSET h2 f v",
        "HSET h a 5 a 6",
        "HSET str f v",
        "ZADD z 2 a 3 b",
        "ZADD z 3 b 4 c",
        "ZADD z2 1 x",
        "ZADD z 5 a 5 a",
        "ZADD str 1 x",
        "ZADD z inf d -inf e",
        "LPUSH L k",
        "RPOP L",
        "LPUSH L m",
        "SELECT 1",
        "LPUSH L other",
        "INCR big",
        "SADD s db1",
        "SELECT 0",
        "LPUSH L n",
        "LRANGE L 0 -1",
        "LRANGE L2 0 -1",
        "LRANGE old 0 -1",
        "MGET big fresh gone str",
        "SCARD s",
        "SMISMEMBER s a b c d",
        "HGETALL h",
        "ZRANGE z 0 -1 WITHSCORES",
        "SELECT 1",
        "LRANGE L 0 -1",
        "GET big",
        "SMISMEMBER s db1 a",
        "FLUSHDB",
        "SELECT 0",
    ]))
    .unwrap();
}

/// Several clients pipelining pushes and increments to the same keys at
/// once (a serving thread groups commands of several connections): every
/// push and increment is counted once, each client sees its own replies
/// rise, and the list holds each client's items in the order it sent
/// them.
#[test]
fn concurrent_pipelined_pushes_to_one_key_are_each_counted_once() {
    const CLIENTS: usize = 6;
    const EACH: usize = 300;
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    Client::connect(p.sluice.addr).call(&[b"FLUSHALL"]);
    let replies: Vec<Vec<(i64, i64)>> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..CLIENTS)
            .map(|n| {
                scope.spawn(move || {
                    let mut c = Client::connect(p.sluice.addr);
                    // Runs of one kind, as a serving thread groups them.
                    let mut bytes = Vec::new();
                    for i in 0..EACH {
                        let item = format!("{n}:{i}").into_bytes();
                        bytes.extend(common::request(&[b"RPUSH".to_vec(), b"q".to_vec(), item]));
                    }
                    for _ in 0..EACH {
                        bytes.extend(common::request(&[b"INCR".to_vec(), b"n".to_vec()]));
                    }
                    c.stream.write_all(&bytes).unwrap();
                    let mut int = || match decode(&c.read_reply().unwrap()) {
                        Reply::Integer(i) => i,
                        other => panic!("not an integer: {other:?}"),
                    };
                    let pushed: Vec<i64> = (0..EACH).map(|_| int()).collect();
                    let counted: Vec<i64> = (0..EACH).map(|_| int()).collect();
                    pushed.into_iter().zip(counted).collect()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let total = (CLIENTS * EACH) as i64;
    for column in [0, 1] {
        let mut all: Vec<i64> = replies
            .iter()
            .flatten()
            .map(|r| if column == 0 { r.0 } else { r.1 })
            .collect();
        for client in &replies {
            let mine: Vec<i64> = client
                .iter()
                .map(|r| if column == 0 { r.0 } else { r.1 })
                .collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "a client's replies rise"
            );
        }
        all.sort_unstable();
        assert_eq!(all, (1..=total).collect::<Vec<_>>(), "each counted once");
    }
    let mut c = Client::connect(p.sluice.addr);
    let Reply::Array(items) = c.call_reply(&[b"LRANGE", b"q", b"0", b"-1"]) else {
        panic!("LRANGE answers an array");
    };
    assert_eq!(items.len(), CLIENTS * EACH);
    let mut next = [0usize; CLIENTS];
    for item in items {
        let Reply::Bulk(b) = item else {
            panic!("an item is a bulk")
        };
        let text = String::from_utf8(b).unwrap();
        let (n, i) = text.split_once(':').unwrap();
        let (n, i): (usize, usize) = (n.parse().unwrap(), i.parse().unwrap());
        assert_eq!(i, next[n], "client {n}'s items in the order sent");
        next[n] += 1;
    }
    c.call(&[b"FLUSHALL"]);
}

/// Pipelined SPOPs (a serving thread draws a group's members in one
/// pop): each member comes out once, then nil, in RESP2 and RESP3; a key
/// of another type answers WRONGTYPE to each.
#[test]
fn pipelined_spops_take_each_member_once() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    for protocol in [b"2", b"3"] {
        let mut c = Client::connect(p.sluice.addr);
        c.call(&[b"FLUSHALL"]);
        c.call(&[b"HELLO", protocol]);
        let members: Vec<Vec<u8>> = (0..150).map(|i| format!("m{i}").into_bytes()).collect();
        let mut sadd = vec![b"SADD".to_vec(), b"s".to_vec()];
        sadd.extend(members.iter().cloned());
        c.call(&[b"SET", b"str", b"x"]);
        let refs: Vec<&[u8]> = sadd.iter().map(|a| &a[..]).collect();
        c.call(&refs);
        let mut bytes = Vec::new();
        for _ in 0..170 {
            bytes.extend(common::request(&[b"SPOP".to_vec(), b"s".to_vec()]));
        }
        bytes.extend(common::request(&[b"SPOP".to_vec(), b"str".to_vec()]));
        c.stream.write_all(&bytes).unwrap();
        let mut popped = Vec::new();
        let mut nils = 0;
        for _ in 0..170 {
            match decode(&c.read_reply().unwrap()) {
                Reply::Bulk(m) => popped.push(m),
                Reply::Null => nils += 1,
                other => panic!("SPOP answered {other:?}"),
            }
        }
        assert_eq!(
            c.read_reply().unwrap(),
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        );
        assert_eq!(nils, 20, "nil once the set is empty");
        popped.sort();
        let mut want = members.clone();
        want.sort();
        assert_eq!(popped, want, "each member once");
        assert_eq!(c.call(&[b"EXISTS", b"s"]), b":0\r\n");
    }
}

/// Pipelined XADDs with automatic ids (run together per stream): the ids
/// rise, each entry holds its own fields, XLEN counts them all, and a key
/// of another type answers WRONGTYPE in its place among them.
#[test]
fn pipelined_xadds_get_rising_ids_and_their_own_fields() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Client::connect(p.sluice.addr);
    c.call(&[b"FLUSHALL"]);
    c.call(&[b"SET", b"str", b"x"]);
    let mut bytes = Vec::new();
    for i in 0..300 {
        let n = i.to_string().into_bytes();
        bytes.extend(common::request(&[
            b"XADD".to_vec(),
            b"x".to_vec(),
            b"*".to_vec(),
            b"n".to_vec(),
            n.clone(),
            b"half".to_vec(),
            (i / 2).to_string().into_bytes(),
        ]));
        if i == 150 {
            bytes.extend(common::request(&[
                b"XADD".to_vec(),
                b"str".to_vec(),
                b"*".to_vec(),
                b"f".to_vec(),
                b"v".to_vec(),
            ]));
        }
    }
    c.stream.write_all(&bytes).unwrap();
    let parse = |id: &[u8]| -> (u64, u64) {
        let text = std::str::from_utf8(id).unwrap();
        let (ms, seq) = text.split_once('-').unwrap();
        (ms.parse().unwrap(), seq.parse().unwrap())
    };
    let mut ids = Vec::new();
    for i in 0..301 {
        let reply = c.read_reply().unwrap();
        if i == 151 {
            assert_eq!(
                reply,
                b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
            );
            continue;
        }
        match decode(&reply) {
            Reply::Bulk(id) => ids.push(id),
            other => panic!("XADD answered {other:?}"),
        }
    }
    assert!(
        ids.windows(2).all(|w| parse(&w[0]) < parse(&w[1])),
        "ids rise"
    );
    assert_eq!(c.call(&[b"XLEN", b"x"]), b":300\r\n");
    let Reply::Array(entries) = c.call_reply(&[b"XRANGE", b"x", b"-", b"+"]) else {
        panic!("XRANGE answers an array");
    };
    for (i, entry) in entries.iter().enumerate() {
        let want = Reply::Array(vec![
            Reply::Bulk(ids[i].clone()),
            Reply::Array(
                [
                    b"n".to_vec(),
                    i.to_string().into_bytes(),
                    b"half".to_vec(),
                    (i / 2).to_string().into_bytes(),
                ]
                .into_iter()
                .map(Reply::Bulk)
                .collect(),
            ),
        ]);
        assert_eq!(entry, &want, "entry {i}");
    }
    c.call(&[b"FLUSHALL"]);
}

/// MSET over keys that hold a string with a TTL, a list, a hash and
/// nothing: each becomes a plain string with no TTL, and what the others
/// held is gone (Sluice replaces a key that holds no collection unread).
#[test]
fn mset_replaces_whatever_each_key_held() {
    compare(&script(&[
        "SET t old EX 100",
        "RPUSH l a b c",
        "HSET h f v",
        "MSET t 1 l 2 h 3 n 4 t 5",
        "MGET t l h n",
        "TTL t",
        "TYPE l",
        "LRANGE l 0 -1",
        "HGETALL h",
        "RPUSH l x",
        "HSET h g w",
        "LRANGE l 0 -1",
        "HGETALL h",
        "MSETNX l 9 fresh 1",
        "MSET l 8 h 7",
        "MGET l h fresh",
    ]))
    .unwrap();
}

/// A command of the pipelined collection test: the writes a serving
/// thread groups, on keys that hold one type or another, among reads and
/// writes it does not group.
fn pipelined_collection_command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let key = || word(&["a", "b", "c"]);
    let item = || word(&["x", "y", "z", "1"]);
    let score = || word(&["1", "2", "-0.5", "inf"]);
    let items = || proptest::collection::vec(item(), 1..4);
    let with = |name: &'static [u8], k: Vec<u8>, rest: Vec<Vec<u8>>| {
        let mut args = vec![name.to_vec(), k];
        args.extend(rest);
        args
    };
    prop_oneof![
        3 => (key(), items()).prop_map(move |(k, v)| with(b"LPUSH", k, v)),
        3 => (key(), items()).prop_map(move |(k, v)| with(b"RPUSH", k, v)),
        2 => key().prop_map(|k| vec![b"LPOP".to_vec(), k]),
        2 => key().prop_map(|k| vec![b"RPOP".to_vec(), k]),
        2 => key().prop_map(|k| vec![b"INCR".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"DECR".to_vec(), k]),
        3 => (key(), items()).prop_map(move |(k, m)| with(b"SADD", k, m)),
        3 => (key(), proptest::collection::vec((item(), item()), 1..3)).prop_map(
            move |(k, pairs)| with(b"HSET", k, pairs.into_iter().flat_map(|(f, v)| [f, v]).collect())
        ),
        3 => (key(), proptest::collection::vec((score(), item()), 1..3)).prop_map(
            move |(k, pairs)| with(b"ZADD", k, pairs.into_iter().flat_map(|(s, m)| [s, m]).collect())
        ),
        2 => key().prop_map(|k| vec![b"ZPOPMIN".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"ZPOPMAX".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"TYPE".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"DEL".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"LRANGE".to_vec(), k, b"0".to_vec(), b"-1".to_vec()]),
        1 => key().prop_map(|k| vec![b"ZRANGE".to_vec(), k, b"0".to_vec(), b"-1".to_vec(), b"WITHSCORES".to_vec()]),
        1 => key().prop_map(|k| vec![b"HGETALL".to_vec(), k]),
        1 => key().prop_map(|k| vec![b"SCARD".to_vec(), k]),
        1 => word(&["0", "1"]).prop_map(|d| vec![b"SELECT".to_vec(), d]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// Pipelines of the writes a serving thread groups get the replies
    /// Redis gives, byte for byte, and leave what Redis leaves.
    #[test]
    fn pipelined_collection_writes_match_redis(
        commands in proptest::collection::vec(pipelined_collection_command(), 1..100),
    ) {
        let mut commands = commands;
        for db in ["0", "1"] {
            commands.push(vec![b"SELECT".to_vec(), db.as_bytes().to_vec()]);
            for k in ["a", "b", "c"] {
                let k = k.as_bytes().to_vec();
                commands.push(vec![b"TYPE".to_vec(), k.clone()]);
                commands.push(vec![b"LRANGE".to_vec(), k.clone(), b"0".to_vec(), b"-1".to_vec()]);
                commands.push(vec![b"HGETALL".to_vec(), k.clone()]);
                commands.push(vec![b"SMISMEMBER".to_vec(), k.clone(), b"x".to_vec(), b"y".to_vec(), b"z".to_vec(), b"1".to_vec()]);
                commands.push(vec![b"ZRANGE".to_vec(), k.clone(), b"0".to_vec(), b"-1".to_vec(), b"WITHSCORES".to_vec()]);
                commands.push(vec![b"GET".to_vec(), k]);
            }
            commands.push(vec![b"FLUSHDB".to_vec()]);
        }
        commands.push(vec![b"SELECT".to_vec(), b"0".to_vec()]);
        compare_pipelined(&commands)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// The same commands sent as one pipeline to Redis and to Sluice get
    /// the same replies, byte for byte.
    #[test]
    fn pipelined_sequences_match_redis(
        commands in proptest::collection::vec(pipelined_command(), 1..120),
    ) {
        compare_pipelined(&commands)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn generated_sequences_match_redis(
        resp3 in any::<bool>(),
        commands in proptest::collection::vec(generated_command(), 1..60),
    ) {
        let mut script = Vec::new();
        if resp3 {
            script.push(vec![b"HELLO".to_vec(), b"3".to_vec()]);
        }
        script.extend(commands);
        compare(&script)?;
    }
}

/// Everything a client reads over one connection, to the reply of a
/// closing `ECHO end`, after sending `commands` as one pipeline.
fn read_to_end_marker(mut c: Client, commands: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut all = commands.to_vec();
    all.push(vec![b"ECHO".to_vec(), b"end".to_vec()]);
    let bytes: Vec<u8> = all.iter().flat_map(|a| common::request(a)).collect();
    c.stream.write_all(&bytes).unwrap();
    let mut replies = Vec::new();
    loop {
        let reply = c.read_reply().expect("the server closed the connection");
        let done = reply == b"$3\r\nend\r\n";
        replies.push(reply);
        if done {
            return replies;
        }
    }
}

/// CLIENT REPLY OFF silences replies but not pub/sub confirmations and
/// messages, SKIP silences the next reply only, ON answers OK: the same
/// bytes as Redis.
#[test]
fn client_reply_modes_match_redis() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let commands = script(&[
        "CLIENT REPLY OFF",
        "SET a 1",
        "GET a",
        "INCR a",
        "CLIENT REPLY SKIP",
        "GET a",
        "CLIENT REPLY ON",
        "GET a",
        "CLIENT REPLY SKIP",
        "GET a",
        "INCR a",
        "CLIENT REPLY SKIP",
        "SET b 2",
        "MGET a b",
        "CLIENT REPLY FOO",
        "CLIENT REPLY",
        "CLIENT REPLY OFF",
        "SUBSCRIBE ch",
        "PING",
        "UNSUBSCRIBE ch",
        "CLIENT REPLY ON",
    ]);
    let mut redis = Client::connect_port(p.redis.port);
    redis.call(&[b"FLUSHALL"]);
    let mut sluice = Client::connect(p.sluice.addr);
    sluice.call(&[b"FLUSHALL"]);
    let want = read_to_end_marker(redis, &commands);
    let got = read_to_end_marker(sluice, &commands);
    let show = |r: &[Vec<u8>]| {
        r.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(show(&got), show(&want));
}

/// What a MONITOR connection shows while `commands` run on another
/// connection, up to `ECHO end`: each line without its time, the client's
/// address as `client`.
fn monitored(monitor_port: Client, mut runner: Client, commands: &[Vec<Vec<u8>>]) -> Vec<String> {
    let mut monitor = monitor_port;
    assert_eq!(monitor.call(&[b"MONITOR"]), b"+OK\r\n");
    for args in commands {
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        runner.call(&refs);
    }
    runner.call(&[b"ECHO", b"end"]);
    let mut lines = Vec::new();
    loop {
        let reply = monitor
            .read_reply()
            .expect("the monitor's connection stays");
        let text = String::from_utf8_lossy(&reply).into_owned();
        let (_, rest) = text.split_once(" [0 ").expect("a monitor line");
        let (source, args) = rest.split_once("] ").expect("a monitor line");
        let source = if source == "lua" { "lua" } else { "client" };
        let line = format!("[{source}] {}", args.trim_end());
        let done = line == "[client] \"ECHO\" \"end\"";
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// MONITOR shows what Redis shows: commands as sent (quoted and escaped),
/// a script's commands as `lua` after the script, MULTI and EXEC around
/// a transaction's commands, passwords redacted, administrative commands
/// left out.
#[test]
fn monitor_matches_redis() {
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let commands = script(&[
        "SET foo \"a b\\\"c\\n\"",
        "GET foo",
        "EVAL \"redis.call('set', KEYS[1], ARGV[1])\" 1 foo bar",
        "MULTI",
        "SET x 1",
        "INCR x",
        "EXEC",
        "multi",
        "NOSUCH",
        "exec",
        "AUTH nobody wrong",
        "HELLO 2 AUTH nobody wrong",
        "CONFIG GET maxmemory",
        "FUNCTION LOAD REPLACE \"#!lua name=m\nredis.register_function('m', function() return redis.call('get', 'x') end)\"",
        "FCALL m 0",
        "FUNCTION DELETE m",
    ]);
    let want = monitored(
        Client::connect_port(p.redis.port),
        Client::connect_port(p.redis.port),
        &commands,
    );
    let got = monitored(
        Client::connect(p.sluice.addr),
        Client::connect(p.sluice.addr),
        &commands,
    );
    assert_eq!(got, want);
}

/// FUNCTION DUMP and RESTORE: payloads redis-server made restore here
/// with each policy and Redis's refusals (a library or a function of the
/// same name, a key's DUMP payload, a broken one), and what Sluice dumps
/// restores in redis-server (checked by calling the function there).
#[test]
fn function_dump_and_restore_match_redis() {
    compare(&script(&[
        "FUNCTION FLUSH",
        "FUNCTION RESTORE garbage",
        "FUNCTION RESTORE garbage NOPE",
        "FUNCTION RESTORE a b c",
        "FUNCTION RESTORE \"\\x00\\x01\\x76\\x0a\\x00\\x91\\x08\\xce\\xb2\\x19\\x38\\x8a\\xce\"",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6d\\x79\\x6c\\x69\\x62\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x31\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x07\\x50\\x04\\x04\\xcd\\x92\\xd1\\xb3\"",
        "FCALL f1 0",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6d\\x79\\x6c\\x69\\x62\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x31\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x07\\x50\\x04\\x04\\xcd\\x92\\xd1\\xb3\"",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6d\\x79\\x6c\\x69\\x62\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x31\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x07\\x50\\x04\\x04\\xcd\\x92\\xd1\\xb3\" APPEND",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6d\\x79\\x6c\\x69\\x62\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x31\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x07\\x50\\x04\\x04\\xcd\\x92\\xd1\\xb3\" REPLACE",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6f\\x74\\x68\\x65\\x72\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x32\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x31\\x0a\\xe7\\xec\\x27\\x82\\x23\\x40\" REPLACE",
        "FUNCTION RESTORE \"\\xf5\\x40\\x47\\x23\\x21\\x6c\\x75\\x61\\x20\\x6e\\x61\\x6d\\x65\\x3d\\x6f\\x74\\x68\\x65\\x72\\x0a\\x72\\x65\\x64\\x69\\x73\\x2e\\x72\\x65\\x67\\x69\\x73\\x74\\x65\\x72\\x5f\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x27\\x66\\x31\\x27\\x2c\\x20\\x66\\x75\\x6e\\x63\\x74\\x69\\x6f\\x6e\\x28\\x29\\x20\\x72\\x65\\x74\\x75\\x72\\x6e\\x20\\x32\\x20\\x65\\x6e\\x64\\x29\\x0a\\x00\\x31\\x0a\\xe7\\xec\\x27\\x82\\x23\\x40\" FLUSH",
        "FCALL f1 0",
        "FUNCTION LIST",
        "FUNCTION DUMP",
        "FUNCTION FLUSH",
        "FUNCTION DUMP",
    ]))
    .unwrap();
    let p = pair();
    let _one = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut redis = Client::connect_port(p.redis.port);
    let mut sluice = Client::connect(p.sluice.addr);
    sluice.call(&[b"FUNCTION", b"FLUSH"]);
    redis.call(&[b"FUNCTION", b"FLUSH"]);
    let code = b"#!lua name=made_here\nredis.register_function('seven', function() return 7 end)";
    assert_eq!(
        sluice.call(&[b"FUNCTION", b"LOAD", code]),
        b"$9\r\nmade_here\r\n"
    );
    let payload = match sluice.call_reply(&[b"FUNCTION", b"DUMP"]) {
        Reply::Bulk(b) => b,
        other => panic!("FUNCTION DUMP: {other:?}"),
    };
    assert_eq!(redis.call(&[b"FUNCTION", b"RESTORE", &payload]), b"+OK\r\n");
    assert_eq!(redis.call(&[b"FCALL", b"seven", b"0"]), b":7\r\n");
    sluice.call(&[b"FUNCTION", b"FLUSH"]);
    redis.call(&[b"FUNCTION", b"FLUSH"]);
}
