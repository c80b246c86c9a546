//! Differential test of Redis's ACL: the same sequences of ACL commands and
//! of commands run as restricted users go to a real `redis-server` 7 and to
//! a Sluice server, and every reply must be the same.
//!
//! Where the two differ by design the comparison says so: the single
//! commands of a rule list (`+get +set`) are compared as a set, since Redis
//! lists them in its hash table's order, which changes from run to run;
//! ACL LOG's `age-seconds` and `client-info` (clocks, addresses and ids)
//! are left out; ACL CAT is compared on the commands Sluice has. A rule
//! list that mixes categories with exceptions (`+@all -@write +del`) reads
//! back differently by design: the categories that fit best are chosen
//! over each server's own command table, and Redis's has commands Sluice
//! does not; such users are compared by what they may run (DRYRUN).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::{small_store, start_redis, start_sluice_on, Client, Redis, Sluice};
use sluice_server::resp::Reply;
use sluice_server::server::{Durability, ServerConfig};
use std::sync::{Mutex, OnceLock};

struct Pair {
    redis: Redis,
    sluice: Sluice,
    lock: Mutex<()>,
}

fn pair() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| Pair {
        redis: start_redis(&[]),
        sluice: start_sluice_on(
            small_store(),
            ServerConfig {
                threads: 2,
                durability: Durability::Always,
                ..ServerConfig::default()
            },
        ),
        lock: Mutex::new(()),
    })
}

/// A rule list with its runs of single-command rules sorted.
fn normalize_rules(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Vec<String> = Vec::new();
    let single = |t: &str| {
        let t = t.trim_start_matches('(');
        (t.starts_with('+') || t.starts_with('-')) && !t[1..].starts_with('@')
    };
    for token in text.split(' ') {
        if single(token) && !token.ends_with(')') {
            run.push(token.to_string());
            continue;
        }
        run.sort();
        out.append(&mut run);
        out.push(token.to_string());
    }
    run.sort();
    out.append(&mut run);
    out.join(" ")
}

/// A reply as compared: rule lists normalized, ACL LOG's clock and client
/// fields blanked.
fn normalize(reply: Reply) -> Reply {
    match reply {
        Reply::Bulk(b) => {
            let text = String::from_utf8_lossy(&b).into_owned();
            if text.contains("@all") {
                Reply::Bulk(normalize_rules(&text).into_bytes())
            } else {
                Reply::Bulk(b)
            }
        }
        Reply::Array(items) => {
            let items: Vec<Reply> = items.into_iter().map(normalize).collect();
            // ACL LOG entries in RESP2: flat key, value arrays.
            let mut out = Vec::with_capacity(items.len());
            let mut blank_next = false;
            for item in items {
                if blank_next {
                    out.push(Reply::Bulk(b"-".to_vec()));
                    blank_next = false;
                    continue;
                }
                blank_next =
                    matches!(&item, Reply::Bulk(k) if k == b"age-seconds" || k == b"client-info");
                out.push(item);
            }
            Reply::Array(out)
        }
        other => other,
    }
}

/// Runs `script` (connection index, command) on both servers; each
/// connection starts as the default user. `None` for a closed connection.
fn compare(script: &[(usize, &[&str])]) {
    let p = pair();
    let _one_at_a_time = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let conns = script.iter().map(|(c, _)| *c).max().unwrap_or(0) + 1;
    let mut redis: Vec<Client> = (0..conns)
        .map(|_| Client::connect_port(p.redis.port))
        .collect();
    let mut sluice: Vec<Client> = (0..conns).map(|_| Client::connect(p.sluice.addr)).collect();
    for (side, clients) in [("redis", &mut redis), ("sluice", &mut sluice)] {
        let c = &mut clients[0];
        let users = c.call_reply(&[b"ACL", b"USERS"]);
        let Reply::Array(names) = users else {
            panic!("{side}: ACL USERS {users:?}")
        };
        for n in names {
            let Reply::Bulk(n) = n else { continue };
            if n != b"default" {
                c.call(&[b"ACL", b"DELUSER", &n]);
            }
        }
        c.call(&[b"ACL", b"LOG", b"RESET"]);
        c.call(&[b"FLUSHALL"]);
    }
    for (step, (conn, args)) in script.iter().enumerate() {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let mut got = Vec::new();
        for clients in [&mut redis, &mut sluice] {
            let c = &mut clients[*conn];
            let request = common::request(&args.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
            let sent = std::io::Write::write_all(&mut c.stream, &request).is_ok();
            let reply = if sent { c.read_reply() } else { None };
            got.push(reply.map(|r| normalize(Reply::decode(&r).unwrap().unwrap().0)));
        }
        assert_eq!(
            got[0], got[1],
            "step {step}: {:?} on connection {conn}: redis (left) and sluice (right) differ",
            script[step].1
        );
    }
}

const ALICE: &[&str] = &[
    "ACL", "SETUSER", "alice", "on", ">pw", "~cache:*", "-@all", "+get", "+set", "+multi", "+exec",
];

#[test]
fn a_restricted_user_runs_what_its_rules_allow_and_is_told_what_it_may_not() {
    compare(&[
        (0, ALICE),
        (0, &["ACL", "LIST"]),
        (0, &["ACL", "GETUSER", "alice"]),
        (0, &["ACL", "USERS"]),
        (1, &["AUTH", "alice", "pw"]),
        (1, &["ACL", "WHOAMI"]),
        (1, &["SET", "cache:1", "v"]),
        (1, &["GET", "cache:1"]),
        (1, &["GET", "other"]),
        (1, &["SET", "other", "v"]),
        (1, &["DEL", "cache:1"]),
        (1, &["PING"]),
        (1, &["CLIENT", "GETNAME"]),
        (1, &["GET"]),
        (1, &["NOSUCH"]),
        (0, &["ACL", "DRYRUN", "alice", "get", "other"]),
        (0, &["ACL", "DRYRUN", "alice", "del", "cache:1"]),
        (0, &["ACL", "DRYRUN", "alice", "get", "cache:1"]),
        (0, &["ACL", "DRYRUN", "alice", "client", "kill", "id", "1"]),
        (0, &["ACL", "LOG", "2"]),
        (0, &["ACL", "LOG"]),
    ]);
}

#[test]
fn read_and_write_key_patterns_and_selectors_are_checked_as_redis_checks_them() {
    compare(&[
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "carol",
                "on",
                "nopass",
                "%R~r:*",
                "%W~w:*",
                "%RW~both:*",
                "+@all",
            ],
        ),
        (0, &["ACL", "GETUSER", "carol"]),
        (1, &["AUTH", "carol", "anything"]),
        (1, &["GET", "r:1"]),
        (1, &["SET", "r:1", "x"]),
        (1, &["SET", "w:1", "x"]),
        (1, &["SET", "w:1", "x", "GET"]),
        (1, &["GET", "w:1"]),
        (1, &["COPY", "r:1", "w:2"]),
        (1, &["COPY", "w:1", "r:2"]),
        (1, &["MSET", "w:1", "a", "both:1", "b"]),
        (1, &["MSET", "w:1", "a", "r:1", "b"]),
        (1, &["RENAME", "both:1", "both:2"]),
        (1, &["RENAME", "r:1", "w:3"]),
        (1, &["HSET", "w:h", "f", "v"]),
        (1, &["HGET", "w:h", "f"]),
        (1, &["EXISTS", "w:1", "w:h", "both:2", "r:1"]),
        // SORT's BY and GET name keys by the data: refused to a user who
        // may not read every key; a constant BY is no pattern.
        (0, &["RPUSH", "r:l", "1", "2"]),
        (1, &["SORT", "r:l"]),
        (1, &["SORT", "r:l", "BY", "x:*"]),
        (1, &["SORT", "r:l", "LIMIT", "0", "1", "GET", "#"]),
        (1, &["SORT_RO", "r:l", "BY", "nosort", "GET", "x:*"]),
        (1, &["SORT", "r:l", "BY", "nosort", "DESC"]),
        // SORT's STORE destination is a key written: carol may not write
        // r:*, may write w:*.
        (1, &["SORT", "r:l", "STORE", "r:dst"]),
        (1, &["SORT", "r:l", "LIMIT", "0", "1", "STORE", "w:dst"]),
        (1, &["SORT", "r:l", "STORE", "w:x", "STORE", "r:dst"]),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "dave",
                "on",
                ">p1",
                ">p2",
                "~a*",
                "+get",
                "(~b*",
                "+set)",
                "(%R~c* +@read)",
            ],
        ),
        (0, &["ACL", "LIST"]),
        (0, &["ACL", "GETUSER", "dave"]),
        (2, &["AUTH", "dave", "p2"]),
        (2, &["GET", "a1"]),
        (2, &["GET", "b1"]),
        (2, &["SET", "b1", "x"]),
        (2, &["SET", "a1", "x"]),
        (2, &["HGET", "c1", "f"]),
        (2, &["DEL", "a1"]),
        (0, &["ACL", "SETUSER", "dave", "clearselectors", "<p1"]),
        (0, &["ACL", "GETUSER", "dave"]),
        (0, &["ACL", "LOG"]),
    ]);
}

#[test]
fn categories_first_arguments_and_subcommands_read_back_as_redis_writes_them() {
    compare(&[
        (
            0,
            &[
                "ACL", "SETUSER", "erin", "on", "nopass", "~*", "-@all", "+@read", "+@string",
            ],
        ),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "frank",
                "on",
                "nopass",
                "~*",
                "+@all",
                "-@dangerous",
                "-@write",
                "+del",
            ],
        ),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "gina",
                "on",
                "nopass",
                "allkeys",
                "nocommands",
                "+@hash",
                "-hdel",
                "+client|getname",
                "+select|0",
                "+config|get",
            ],
        ),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "hank",
                "on",
                "nopass",
                "allkeys",
                "allcommands",
                "-client",
                "+client|id",
                "-@keyspace",
                "+@connection",
            ],
        ),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "ivy",
                "reset",
                "on",
                "resetchannels",
                "&news.*",
                "&alerts",
                "~x",
                "+get",
            ],
        ),
        (0, &["ACL", "GETUSER", "erin"]),
        (0, &["ACL", "GETUSER", "gina"]),
        (0, &["ACL", "DRYRUN", "hank", "client", "getname"]),
        (0, &["ACL", "DRYRUN", "hank", "del", "k"]),
        (0, &["ACL", "DRYRUN", "hank", "get", "k"]),
        (0, &["ACL", "GETUSER", "ivy"]),
        (1, &["AUTH", "gina", "x"]),
        (1, &["HSET", "h", "f", "v"]),
        (1, &["HDEL", "h", "f"]),
        (1, &["SELECT", "0"]),
        (1, &["SELECT", "1"]),
        (1, &["CLIENT", "GETNAME"]),
        (1, &["CLIENT", "SETNAME", "x"]),
        (1, &["CONFIG", "SET", "timeout", "0"]),
        (1, &["GET", "h"]),
        (2, &["AUTH", "frank", "x"]),
        (2, &["GET", "k"]),
        (2, &["SET", "k", "v"]),
        (2, &["DEL", "k"]),
        (2, &["FLUSHALL"]),
        (0, &["ACL", "DRYRUN", "frank", "config", "get", "x"]),
        (0, &["ACL", "DRYRUN", "hank", "client", "id"]),
        (0, &["ACL", "DRYRUN", "hank", "client", "list"]),
        (0, &["ACL", "DRYRUN", "hank", "type", "k"]),
    ]);
}

#[test]
fn bad_rules_and_bad_acl_calls_get_redis_errors_and_change_nothing() {
    compare(&[
        (0, &["ACL", "SETUSER", "bob", "on", ">pw", "~k", "+get"]),
        (0, &["ACL", "SETUSER", "bob", "foo"]),
        (0, &["ACL", "SETUSER", "bob", "+nosuch"]),
        (0, &["ACL", "SETUSER", "bob", "+@nosuch"]),
        (0, &["ACL", "SETUSER", "bob", "resetkeys", "~*", "~x"]),
        (0, &["ACL", "SETUSER", "bob", "&*", "&x"]),
        (0, &["ACL", "SETUSER", "bob", "<nope"]),
        (0, &["ACL", "SETUSER", "bob", "#abc"]),
        (
            0,
            &[
                "ACL",
                "SETUSER",
                "bob",
                "!0000000000000000000000000000000000000000000000000000000000000000",
            ],
        ),
        (0, &["ACL", "SETUSER", "bob", "+client|id|x"]),
        (0, &["ACL", "SETUSER", "bob", "+get|"]),
        (0, &["ACL", "SETUSER", "bob", "+client|nosuch"]),
        (0, &["ACL", "SETUSER", "bob", "%X~k"]),
        (0, &["ACL", "SETUSER", "bob", "%~k"]),
        (0, &["ACL", "SETUSER", "bob", "%"]),
        (0, &["ACL", "SETUSER", "bob", "%RR~k"]),
        (
            0,
            &[
                "ACL", "SETUSER", "zed", "%RW", "%R~", "%w~a", "%W~a", "%R~a",
            ],
        ),
        (0, &["ACL", "GETUSER", "zed"]),
        (0, &["ACL", "SETUSER", "bob", "(~x", "+get"]),
        (0, &["ACL", "SETUSER", "bob", "(~x", "+nosuch)"]),
        (0, &["ACL", "SETUSER", "b b"]),
        (0, &["ACL", "GETUSER", "bob"]),
        (0, &["ACL", "DELUSER", "default"]),
        (0, &["ACL", "DELUSER", "nobody", "bob"]),
        (0, &["ACL", "GETUSER", "bob"]),
        (0, &["ACL", "DRYRUN", "nobody", "get", "x"]),
        (0, &["ACL", "DRYRUN", "default", "nosuch"]),
        (0, &["ACL", "DRYRUN", "default", "get"]),
        (0, &["ACL", "DRYRUN", "default", "client", "nosuch"]),
        (0, &["ACL", "CAT", "nosuch"]),
        (0, &["ACL", "CAT"]),
        (0, &["ACL", "GENPASS", "0"]),
        (0, &["ACL", "GENPASS", "5000"]),
        (0, &["ACL", "GENPASS", "x"]),
        (0, &["ACL", "LOG", "x"]),
        (0, &["ACL", "LOG", "-1"]),
        (0, &["ACL", "FOO"]),
        (0, &["ACL", "GETUSER"]),
        (0, &["ACL", "WHOAMI", "x"]),
        (0, &["ACL"]),
        (0, &["ACL", "HELP"]),
    ]);
}

#[test]
fn logins_transactions_and_removed_users_behave_as_in_redis() {
    compare(&[
        (0, ALICE),
        (1, &["AUTH", "alice", "wrong"]),
        (1, &["AUTH", "nobody", "x"]),
        (1, &["HELLO", "2", "AUTH", "alice", "wrong"]),
        (1, &["AUTH", "alice", "wrong"]),
        (0, &["ACL", "LOG"]),
        (1, &["AUTH", "alice", "pw"]),
        (1, &["MULTI"]),
        (1, &["GET", "cache:1"]),
        (1, &["DEL", "cache:1"]),
        (1, &["EXEC"]),
        (1, &["MULTI"]),
        (1, &["GET", "cache:1"]),
        (1, &["SET", "cache:2", "v"]),
        (0, &["ACL", "SETUSER", "alice", "-set"]),
        (1, &["EXEC"]),
        (0, &["ACL", "LOG", "1"]),
        (0, &["ACL", "SETUSER", "alice", "off"]),
        (2, &["AUTH", "alice", "pw"]),
        (1, &["GET", "cache:1"]),
        (0, &["ACL", "SETUSER", "alice", "on", "nopass"]),
        (2, &["AUTH", "alice", "any"]),
        (2, &["ACL", "WHOAMI"]),
        (0, &["ACL", "DELUSER", "alice"]),
        (1, &["PING"]),
        (2, &["PING"]),
        (0, &["PING"]),
    ]);
}

#[test]
fn acl_cat_lists_each_category_as_redis_does_for_the_commands_sluice_has() {
    let p = pair();
    let _one_at_a_time = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut redis = Client::connect_port(p.redis.port);
    let mut sluice = Client::connect(p.sluice.addr);
    let ours: Vec<String> = sluice_server::acl::all_names().map(String::from).collect();
    let names = |r: Reply| -> Vec<String> {
        let Reply::Array(items) = r else {
            panic!("{r:?}")
        };
        let mut v: Vec<String> = items
            .into_iter()
            .map(|i| match i {
                Reply::Bulk(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        v.sort();
        v
    };
    for category in sluice_server::acl::CATEGORY_NAMES {
        let want: Vec<String> = names(redis.call_reply(&[b"ACL", b"CAT", category.as_bytes()]))
            .into_iter()
            .filter(|n| ours.contains(n) && n != "client|setinfo")
            .collect();
        let mut got = names(sluice.call_reply(&[b"ACL", b"CAT", category.as_bytes()]));
        got.retain(|n| n != "client|setinfo");
        assert_eq!(got, want, "ACL CAT {category}");
    }
}

#[test]
fn every_command_sluice_answers_has_its_acl_facts() {
    // Under the pair's lock: another test sets `requirepass` for a moment.
    let p = pair();
    let _one_at_a_time = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let mut sluice = Client::connect(p.sluice.addr);
    let reply = sluice.call_reply(&[b"COMMAND"]);
    let Reply::Array(commands) = reply else {
        panic!("COMMAND: {reply:?}")
    };
    assert!(
        commands.len() > 50,
        "COMMAND lists {} commands",
        commands.len()
    );
    for c in commands {
        let Reply::Array(fields) = c else { panic!() };
        let Reply::Bulk(name) = &fields[0] else {
            panic!()
        };
        assert!(
            sluice_server::acl::lookup(name).is_some(),
            "{} has no ACL facts: add it to scripts/gen-acl-table and run it",
            String::from_utf8_lossy(name)
        );
    }
}

#[test]
fn config_set_requirepass_sets_the_default_users_password_as_in_redis() {
    let p = pair();
    let _one_at_a_time = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    let addrs = [
        std::net::SocketAddr::from(([127, 0, 0, 1], p.redis.port)),
        p.sluice.addr,
    ];
    let mut got: Vec<Vec<Reply>> = Vec::new();
    for addr in addrs {
        let mut admin = Client::connect(addr);
        let mut replies = vec![admin.call_reply(&[b"CONFIG", b"SET", b"requirepass", b"s3cret"])];
        // A connection made before stays in; a new one must authenticate.
        replies.push(admin.call_reply(&[b"PING"]));
        let mut fresh = Client::connect(addr);
        replies.push(fresh.call_reply(&[b"PING"]));
        replies.push(fresh.call_reply(&[b"AUTH", b"wrong"]));
        replies.push(fresh.call_reply(&[b"AUTH", b"s3cret"]));
        replies.push(fresh.call_reply(&[b"ACL", b"WHOAMI"]));
        replies.push(admin.call_reply(&[b"ACL", b"GETUSER", b"default"]));
        replies.push(admin.call_reply(&[b"CONFIG", b"SET", b"requirepass", b""]));
        let mut open = Client::connect(addr);
        replies.push(open.call_reply(&[b"PING"]));
        replies.push(admin.call_reply(&[b"ACL", b"LOG", b"RESET"]));
        got.push(replies);
    }
    assert_eq!(got[0], got[1], "redis (left) and sluice (right) differ");
}
