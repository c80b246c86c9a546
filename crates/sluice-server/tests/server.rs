//! The server as a client sees it: durability of acknowledged writes
//! across a power cut in each mode, pipelining order, limits (clients,
//! idle time, output held for a client that does not read), bad input
//! and dropped connections, SHUTDOWN.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::{request, start_sluice, start_sluice_on, Client};
use sluice_io::device::ProcessView;
use sluice_io::{Device, MemoryDevice, PowerCutMode};
use sluice_server::resp::Reply;
use sluice_server::server::{Durability, ServerConfig};
use sluice_store::{Store, StoreConfig};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A server with one worker (every client on the same thread), `none`.
fn one_worker() -> common::Sluice {
    start_sluice_on(
        common::small_store(),
        ServerConfig {
            threads: 1,
            ..config(Durability::None)
        },
    )
}

fn config(durability: Durability) -> ServerConfig {
    ServerConfig {
        threads: 2,
        durability,
        ..ServerConfig::default()
    }
}

/// Writers on several connections until told to stop; returns every
/// (key, value) whose SET was acknowledged.
fn write_until_stopped(
    addr: std::net::SocketAddr,
    stop: &Arc<AtomicBool>,
) -> Vec<(String, String)> {
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (k, v) = (format!("k{t}-{i}"), format!("v{t}-{i}"));
                    // Every fifth round a pipelined batch of twenty.
                    if i % 5 == 0 {
                        let mut batch = Vec::new();
                        for j in 0..20 {
                            batch.extend(request(&[
                                b"SET".to_vec(),
                                format!("{k}-{j}").into_bytes(),
                                v.clone().into_bytes(),
                            ]));
                        }
                        c.stream.write_all(&batch).unwrap();
                        for j in 0..20 {
                            assert_eq!(c.read_reply().unwrap(), b"+OK\r\n");
                            acked.push((format!("{k}-{j}"), v.clone()));
                        }
                    } else {
                        assert_eq!(c.call(&[b"SET", k.as_bytes(), v.as_bytes()]), b"+OK\r\n");
                        acked.push((k, v));
                    }
                    i += 1;
                }
                acked
            })
        })
        .collect();
    writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect()
}

/// Runs writers for a while on a store over a killable device view, stops
/// them, waits `settle`, then kills the process view and cuts the power;
/// returns the device and what was acknowledged.
fn load_then_power_cut(
    durability: Durability,
    settle: Duration,
) -> (Arc<MemoryDevice>, Vec<(String, String)>) {
    let mem = Arc::new(MemoryDevice::new(4096, 64 << 10));
    let view = ProcessView::new(&mem);
    let store =
        Arc::new(Store::create(view.clone() as Arc<dyn Device>, &StoreConfig::default()).unwrap());
    let server = start_sluice_on(store, config(durability));
    let stop = Arc::new(AtomicBool::new(false));
    let addr = server.addr;
    let writers = {
        let stop = stop.clone();
        std::thread::spawn(move || write_until_stopped(addr, &stop))
    };
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    let acked = writers.join().unwrap();
    std::thread::sleep(settle);
    view.kill();
    mem.power_cut(PowerCutMode::DropUnflushed);
    // The dead process's server goes away without touching the device.
    drop(server);
    (mem, acked)
}

fn reopen(mem: &Arc<MemoryDevice>) -> Arc<Store> {
    Arc::new(Store::open(mem.clone() as Arc<dyn Device>, &StoreConfig::default()).unwrap())
}

fn assert_all_present(mem: &Arc<MemoryDevice>, acked: &[(String, String)]) {
    assert!(
        acked.len() > 40,
        "the load acknowledged only {} writes",
        acked.len()
    );
    let server = start_sluice_on(reopen(mem), config(Durability::Always));
    let mut c = Client::connect(server.addr);
    for (k, v) in acked {
        let got = c.call(&[b"GET", k.as_bytes()]);
        let want = Reply::Bulk(v.clone().into_bytes()).encode(sluice_server::resp::Protocol::Resp2);
        assert_eq!(
            got,
            want,
            "acknowledged {k} = {v} is gone after the power cut ({} writes acknowledged)",
            acked.len()
        );
    }
}

/// A device whose flushes take `delay`: the window in which a reply sent
/// before its write is durable would be lost by a power cut.
#[derive(Debug)]
struct SlowFlush {
    inner: Arc<dyn Device>,
    delay: Duration,
}

impl Device for SlowFlush {
    fn geometry(&self) -> sluice_io::Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> sluice_io::Result<()> {
        self.inner.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> sluice_io::Result<()> {
        self.inner.write_at(lba, buf)
    }
    fn flush(&self) -> sluice_io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.flush()
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[test]
fn always_keeps_every_acknowledged_write_through_a_power_cut() {
    // Flushes take 20 ms and the process dies the moment a reply arrives:
    // a reply sent before its group commit finished would name a lost write.
    let mem = Arc::new(MemoryDevice::new(4096, 64 << 10));
    let view = ProcessView::new(&mem);
    let slow = Arc::new(SlowFlush {
        inner: view.clone() as Arc<dyn Device>,
        delay: Duration::from_millis(20),
    });
    let store = Arc::new(Store::create(slow as Arc<dyn Device>, &StoreConfig::default()).unwrap());
    let server = start_sluice_on(store, config(Durability::Always));
    let killed = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let (killed, view, addr) = (killed.clone(), view.clone(), server.addr);
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut acked = Vec::new();
                for i in 0.. {
                    let (k, v) = (format!("k{t}-{i}"), format!("v{t}-{i}"));
                    let reply = c.call(&[b"SET", k.as_bytes(), v.as_bytes()]);
                    if killed.load(Ordering::SeqCst) {
                        break;
                    }
                    assert_eq!(reply, b"+OK\r\n");
                    acked.push((k, v));
                    if t == 0 && i == 40 {
                        killed.store(true, Ordering::SeqCst);
                        view.kill();
                        break;
                    }
                }
                acked
            })
        })
        .collect();
    let acked: Vec<(String, String)> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    mem.power_cut(PowerCutMode::DropUnflushed);
    drop(server);
    assert_all_present(&mem, &acked);
}

/// An acknowledged SWAPDB and MOVE are durable: the process dies the
/// moment their replies arrive (flushes are slow), and after the power
/// cut the databases hold what they held when it died.
#[test]
fn an_acknowledged_swapdb_and_move_outlive_a_power_cut() {
    let mem = Arc::new(MemoryDevice::new(4096, 64 << 10));
    let view = ProcessView::new(&mem);
    let slow = Arc::new(SlowFlush {
        inner: view.clone() as Arc<dyn Device>,
        delay: Duration::from_millis(20),
    });
    let store = Arc::new(Store::create(slow as Arc<dyn Device>, &StoreConfig::default()).unwrap());
    let server = start_sluice_on(store, config(Durability::Always));
    let mut c = Client::connect(server.addr);
    for (line, want) in [
        ("SELECT 1", "+OK\r\n"),
        ("RPUSH q a b", ":2\r\n"),
        ("SET s one", "+OK\r\n"),
        ("SWAPDB 0 1", "+OK\r\n"),
        ("DBSIZE", ":0\r\n"),
        ("SELECT 0", "+OK\r\n"),
        ("MOVE s 6", ":1\r\n"),
    ] {
        assert_eq!(String::from_utf8_lossy(&c.call_line(line)), want, "{line}");
    }
    view.kill();
    mem.power_cut(PowerCutMode::DropUnflushed);
    drop(server);
    let server = start_sluice_on(reopen(&mem), config(Durability::Always));
    let mut c = Client::connect(server.addr);
    for (line, want) in [
        ("LRANGE q 0 -1", "*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
        ("EXISTS s", ":0\r\n"),
        ("SELECT 1", "+OK\r\n"),
        ("DBSIZE", ":0\r\n"),
        ("SELECT 6", "+OK\r\n"),
        ("GET s", "$3\r\none\r\n"),
    ] {
        assert_eq!(String::from_utf8_lossy(&c.call_line(line)), want, "{line}");
    }
}

#[test]
fn everysec_keeps_writes_older_than_a_second() {
    let (mem, acked) = load_then_power_cut(Durability::Everysec, Duration::from_millis(1500));
    assert_all_present(&mem, &acked);
}

#[test]
fn none_opens_cleanly_after_a_power_cut() {
    let (mem, acked) = load_then_power_cut(Durability::None, Duration::ZERO);
    assert!(!acked.is_empty());
    // Nothing is promised about the writes; the store opens and serves.
    let server = start_sluice_on(reopen(&mem), config(Durability::Always));
    let mut c = Client::connect(server.addr);
    assert_eq!(c.call(&[b"SET", b"after", b"1"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"GET", b"after"]), b"$1\r\n1\r\n");
}

#[test]
fn pipelined_replies_keep_request_order() {
    let server = start_sluice(Durability::Always);
    let mut c = Client::connect(server.addr);
    let mut batch = Vec::new();
    let n = 5000;
    for i in 0..n {
        if i % 3 == 2 {
            batch.extend(request(&[b"GET".to_vec(), b"counter".to_vec()]));
        } else {
            batch.extend(request(&[b"INCR".to_vec(), b"counter".to_vec()]));
        }
    }
    c.stream.write_all(&batch).unwrap();
    let mut counter = 0;
    for i in 0..n {
        let reply = c.read_reply().unwrap();
        if i % 3 == 2 {
            assert_eq!(
                reply,
                format!("${}\r\n{counter}\r\n", counter.to_string().len()).into_bytes()
            );
        } else {
            counter += 1;
            assert_eq!(reply, format!(":{counter}\r\n").into_bytes(), "reply {i}");
        }
    }
}

/// Plain SETs and GETs (framed where they lie) pipelined with requests
/// the general path frames (a key too long for the plain GET, SET with an
/// option, lower case, inline): each GET sees every SET before it on its
/// connection, and replies keep request order.
#[test]
fn pipelined_plain_sets_and_gets_see_each_other_in_order() {
    let server = start_sluice(Durability::None);
    let mut c = Client::connect(server.addr);
    let long_key = vec![b'k'; 300];
    let mut batch = Vec::new();
    let mut want: Vec<Vec<u8>> = Vec::new();
    for i in 0..400u32 {
        let value = format!("v{i}").into_bytes();
        let key = if i % 4 == 3 {
            long_key.clone()
        } else {
            format!("key{}", i % 7).into_bytes()
        };
        match i % 5 {
            0 => batch.extend(request(&[b"SET".to_vec(), key.clone(), value.clone()])),
            1 => batch.extend(request(&[
                b"set".to_vec(),
                key.clone(),
                value.clone(),
                b"KEEPTTL".to_vec(),
            ])),
            2 => batch.extend(request(&[b"sEt".to_vec(), key.clone(), value.clone()])),
            3 => batch.extend(
                format!(
                    "SET {} {}\r\n",
                    String::from_utf8_lossy(&key),
                    String::from_utf8_lossy(&value)
                )
                .into_bytes(),
            ),
            _ => batch.extend(request(&[b"SET".to_vec(), key.clone(), value.clone()])),
        }
        want.push(b"+OK\r\n".to_vec());
        let get = if i % 2 == 0 {
            b"GET".to_vec()
        } else {
            b"get".to_vec()
        };
        batch.extend(request(&[get, key]));
        want.push(
            format!(
                "${}\r\n{}\r\n",
                value.len(),
                String::from_utf8_lossy(&value)
            )
            .into_bytes(),
        );
    }
    batch.extend(request(&[b"GET".to_vec(), b"never-set".to_vec()]));
    want.push(b"$-1\r\n".to_vec());
    c.stream.write_all(&batch).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&c.read_reply().unwrap(), w, "reply {i}");
    }
}

/// Values of megabytes pipelined among small requests: a plain SET of one
/// is committed from the request buffer it arrived in, a GET of one goes
/// out as a send of its own from where the store read it; each reply is
/// whole and in request order, over both paths (plain and general SET)
/// and with an empty value and a value just under the size that streams.
#[test]
fn large_values_go_in_and_out_whole_among_pipelined_requests() {
    let server = start_sluice(Durability::None);
    let mut c = Client::connect(server.addr);
    let big = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    };
    let (a, b, just_under) = (
        big(1, 3 << 20),
        big(2, (1 << 20) + 7),
        big(3, (1 << 20) - 1),
    );
    let bulk = |v: &[u8]| [format!("${}\r\n", v.len()).as_bytes(), v, b"\r\n"].concat();
    let mut batch = Vec::new();
    let mut want: Vec<Vec<u8>> = Vec::new();
    let mut ask = |args: &[&[u8]], reply: Vec<u8>| {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        batch.extend(request(&args));
        want.push(reply);
    };
    for round in 0..3 {
        ask(&[b"SET", b"a", &a], b"+OK\r\n".to_vec());
        ask(&[b"SET", b"small", b"s"], b"+OK\r\n".to_vec());
        ask(&[b"GET", b"a"], bulk(&a));
        ask(&[b"PING"], b"+PONG\r\n".to_vec());
        ask(&[b"set", b"b", &b, b"KEEPTTL"], b"+OK\r\n".to_vec());
        ask(&[b"GET", b"b"], bulk(&b));
        ask(&[b"GET", b"small"], bulk(b"s"));
        ask(&[b"SET", b"under", &just_under], b"+OK\r\n".to_vec());
        ask(&[b"GET", b"under"], bulk(&just_under));
        ask(&[b"SET", b"empty", b""], b"+OK\r\n".to_vec());
        ask(&[b"GET", b"empty"], bulk(b""));
        ask(&[b"GET", b"a"], bulk(&a));
        ask(&[b"STRLEN", b"a"], format!(":{}\r\n", a.len()).into_bytes());
        ask(
            &[b"ECHO", format!("round {round}").as_bytes()],
            bulk(format!("round {round}").as_bytes()),
        );
    }
    c.stream.write_all(&batch).unwrap();
    for (i, w) in want.iter().enumerate() {
        let got = c.read_reply().unwrap();
        assert!(
            &got == w,
            "reply {i}: {} bytes, {} wanted",
            got.len(),
            w.len()
        );
    }
}

fn read_until_closed(stream: &mut std::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[test]
fn bad_input_closes_only_that_client() {
    let server = start_sluice(Durability::Always);
    let mut other = Client::connect(server.addr);
    assert_eq!(other.call(&[b"SET", b"k", b"v"]), b"+OK\r\n");
    let cases: &[(&[u8], &[u8])] = &[
        (
            b"*1\r\n$2147483648\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$-5\r\n",
            b"-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*-1\r\n*x\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*3000000000\r\n",
            b"-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            b"*1\r\nfoo\r\n",
            b"-ERR Protocol error: expected '$', got 'f'\r\n",
        ),
        (
            b"SET \"a b\r\n",
            b"-ERR Protocol error: unbalanced quotes in request\r\n",
        ),
    ];
    for (input, want) in cases {
        let mut c = Client::connect(server.addr);
        c.stream.write_all(input).unwrap();
        let (got, closed) = read_until_closed(&mut c.stream, Duration::from_secs(10));
        assert_eq!(
            &got[..],
            *want,
            "reply to {:?}",
            String::from_utf8_lossy(input)
        );
        assert!(
            closed,
            "the connection stays open after {:?}",
            String::from_utf8_lossy(input)
        );
    }
    // Pipelined SETs, then bad input in the same read: the SETs are
    // applied and answered, in order, before the error.
    let mut c = Client::connect(server.addr);
    c.stream
        .write_all(b"*3\r\n$3\r\nSET\r\n$2\r\np1\r\n$1\r\n1\r\nSET p2 2\r\n*1\r\n$-5\r\n")
        .unwrap();
    let (got, closed) = read_until_closed(&mut c.stream, Duration::from_secs(10));
    assert_eq!(
        String::from_utf8_lossy(&got),
        "+OK\r\n+OK\r\n-ERR Protocol error: invalid bulk length\r\n"
    );
    assert!(closed);
    assert_eq!(
        other.call(&[b"MGET", b"p1", b"p2"]),
        b"*2\r\n$1\r\n1\r\n$1\r\n2\r\n"
    );
    // Half-sent requests, then the client vanishes: nothing is applied.
    for _ in 0..200 {
        let mut c = Client::connect(server.addr);
        c.stream
            .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nlo")
            .unwrap();
        drop(c);
    }
    assert_eq!(other.call(&[b"GET", b"k"]), b"$1\r\nv\r\n");
    assert_eq!(other.call(&[b"PING"]), b"+PONG\r\n");
}

#[test]
fn clients_past_the_limit_get_redis_error() {
    let server = start_sluice_on(
        common::small_store(),
        ServerConfig {
            max_clients: 3,
            ..config(Durability::Always)
        },
    );
    let mut held: Vec<Client> = (0..3).map(|_| Client::connect(server.addr)).collect();
    for c in &mut held {
        assert_eq!(c.call(&[b"PING"]), b"+PONG\r\n");
    }
    let mut refused = Client::connect(server.addr);
    let (got, closed) = read_until_closed(&mut refused.stream, Duration::from_secs(10));
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
    assert!(closed);
    // A freed place is taken again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = Client::connect(server.addr);
        c.stream.write_all(&request(&[b"PING".to_vec()])).unwrap();
        if c.read_reply() == Some(b"+PONG\r\n".to_vec()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed client place was not reused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_clients_are_closed_after_the_timeout() {
    let server = start_sluice_on(
        common::small_store(),
        ServerConfig {
            idle_timeout_secs: 1,
            ..config(Durability::Always)
        },
    );
    let mut idle = Client::connect(server.addr);
    assert_eq!(idle.call(&[b"PING"]), b"+PONG\r\n");
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut idle.stream, Duration::from_secs(10));
    assert!(closed, "an idle client outlived --timeout 1");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[test]
fn a_client_that_does_not_read_is_cut_off_at_the_output_limit() {
    let server = start_sluice_on(
        common::small_store(),
        ServerConfig {
            max_output_bytes: 1 << 20,
            ..config(Durability::Always)
        },
    );
    let mut setter = Client::connect(server.addr);
    let value = vec![b'x'; 100 << 10];
    assert_eq!(setter.call(&[b"SET", b"big", &value]), b"+OK\r\n");
    let mut greedy = Client::connect(server.addr);
    let mut batch = Vec::new();
    for _ in 0..2000 {
        batch.extend(request(&[b"GET".to_vec(), b"big".to_vec()]));
    }
    // 200 MB of replies asked for; the client reads none of them.
    let _ = greedy.stream.write_all(&batch);
    std::thread::sleep(Duration::from_secs(1));
    let (got, closed) = read_until_closed(&mut greedy.stream, Duration::from_secs(20));
    assert!(closed, "the server kept a client that reads nothing");
    assert!(got.len() < 100 << 20, "{} bytes were delivered", got.len());
    assert_eq!(setter.call(&[b"PING"]), b"+PONG\r\n");
}

#[test]
fn shutdown_stops_the_server_with_writes_durable() {
    let mem = Arc::new(MemoryDevice::new(4096, 64 << 10));
    let store =
        Arc::new(Store::create(mem.clone() as Arc<dyn Device>, &StoreConfig::default()).unwrap());
    let server = start_sluice_on(store, config(Durability::None));
    let mut c = Client::connect(server.addr);
    for i in 0..100 {
        assert_eq!(
            c.call(&[b"SET", format!("k{i}").as_bytes(), b"v"]),
            b"+OK\r\n"
        );
    }
    assert_eq!(c.call(&[b"SHUTDOWN", b"BOGUS"]), b"-ERR syntax error\r\n");
    c.stream
        .write_all(&request(&[b"SHUTDOWN".to_vec()]))
        .unwrap();
    let (got, closed) = read_until_closed(&mut c.stream, Duration::from_secs(10));
    assert!(
        got.is_empty() && closed,
        "SHUTDOWN replied {:?}",
        String::from_utf8_lossy(&got)
    );
    let store = server.stop();
    drop(store);
    // Durability none, yet SHUTDOWN made everything durable: power cut.
    mem.power_cut(PowerCutMode::DropUnflushed);
    let server = start_sluice_on(reopen(&mem), config(Durability::Always));
    let mut c = Client::connect(server.addr);
    for i in 0..100 {
        assert_eq!(
            c.call(&[b"GET", format!("k{i}").as_bytes()]),
            b"$1\r\nv\r\n"
        );
    }
}

#[test]
fn transactions_are_seen_whole_or_not_at_all() {
    let server = start_sluice(Durability::Always);
    let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("t{i}").into_bytes()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, keys, addr) = (stop.clone(), keys.clone(), server.addr);
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut args: Vec<&[u8]> = vec![b"MGET"];
                args.extend(keys.iter().map(|k| &k[..]));
                let Reply::Array(values) = c.call_reply(&args) else {
                    panic!("MGET did not answer an array")
                };
                let first = &values[0];
                assert!(
                    values.iter().all(|v| v == first),
                    "a transaction was seen half applied: {values:?}"
                );
                reads += 1;
            }
            reads
        })
    };
    let mut w = Client::connect(server.addr);
    for round in 0..200 {
        let value = format!("{round}").into_bytes();
        assert_eq!(w.call(&[b"MULTI"]), b"+OK\r\n");
        for k in &keys {
            assert_eq!(w.call(&[b"SET", k, &value]), b"+QUEUED\r\n");
        }
        let Reply::Array(replies) = w.call_reply(&[b"EXEC"]) else {
            panic!("EXEC did not answer an array")
        };
        assert_eq!(replies.len(), keys.len());
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 10);
}

/// WATCH across connections: a write by another connection aborts the
/// watcher's EXEC, writes made while nobody watched do not, and a watcher
/// that leaves without UNWATCH stops being counted.
#[test]
fn watch_sees_other_connections_writes_and_leaving_watchers_are_uncounted() {
    let server = start_sluice(Durability::None);
    let (mut a, mut b) = (Client::connect(server.addr), Client::connect(server.addr));
    let watching = |c: &mut Client| info_fields(c, b"clients")["watching_clients"].clone();
    let tx = |c: &mut Client, value: &[u8]| -> Reply {
        assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
        assert_eq!(c.call(&[b"SET", b"k", value]), b"+QUEUED\r\n");
        c.call_reply(&[b"EXEC"])
    };
    // Written while nobody watches: no count is kept, and a WATCH after
    // it sees the key unchanged.
    assert_eq!(b.call(&[b"SET", b"k", b"0"]), b"+OK\r\n");
    assert_eq!(watching(&mut b), "0");
    assert_eq!(a.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    assert_eq!(watching(&mut b), "1");
    assert!(matches!(tx(&mut a, b"1"), Reply::Array(_)));
    assert_eq!(watching(&mut b), "0", "EXEC ends the WATCH");
    // Another connection's write after the WATCH aborts the transaction.
    assert_eq!(a.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    assert_eq!(b.call(&[b"SET", b"k", b"2"]), b"+OK\r\n");
    assert_eq!(tx(&mut a, b"3"), Reply::NullArray);
    assert_eq!(b.call_reply(&[b"GET", b"k"]), Reply::Bulk(b"2".to_vec()));
    // A watcher that disconnects is no longer counted; the next one still
    // sees writes made after its WATCH.
    assert_eq!(a.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while watching(&mut b) != "0" {
        assert!(
            Instant::now() < deadline,
            "a closed connection still counts as watching"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::connect(server.addr);
    assert_eq!(c.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    assert_eq!(b.call(&[b"SET", b"k", b"4"]), b"+OK\r\n");
    assert_eq!(tx(&mut c, b"5"), Reply::NullArray);
    // UNWATCH, a write, WATCH again: nothing changed since, EXEC runs.
    assert_eq!(c.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"UNWATCH"]), b"+OK\r\n");
    assert_eq!(b.call(&[b"SET", b"k", b"6"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"WATCH", b"k"]), b"+OK\r\n");
    assert!(matches!(tx(&mut c, b"7"), Reply::Array(_)));
    assert_eq!(b.call_reply(&[b"GET", b"k"]), Reply::Bulk(b"7".to_vec()));
}

#[test]
fn expired_keys_nobody_reads_are_swept_from_the_store() {
    let server = start_sluice(Durability::Always);
    let mut c = Client::connect(server.addr);
    for i in 0..300 {
        let key = format!("short{i}");
        assert_eq!(
            c.call(&[b"SET", key.as_bytes(), b"v", b"PX", b"50"]),
            b"+OK\r\n"
        );
    }
    assert_eq!(c.call(&[b"SET", b"kept", b"v"]), b"+OK\r\n");
    // Keys whose expiry changed after it was indexed: the sweep reaches
    // their old time and must leave them alone.
    assert_eq!(
        c.call(&[b"SET", b"rewritten", b"v", b"PX", b"50"]),
        b"+OK\r\n"
    );
    assert_eq!(c.call(&[b"SET", b"rewritten", b"new"]), b"+OK\r\n");
    assert_eq!(
        c.call(&[b"SET", b"extended", b"v", b"PX", b"50"]),
        b"+OK\r\n"
    );
    assert_eq!(c.call(&[b"PEXPIRE", b"extended", b"600000"]), b":1\r\n");
    let long_key = vec![b'L'; 8190];
    assert_eq!(c.call(&[b"SET", &long_key, b"v", b"PX", b"50"]), b"+OK\r\n");
    let db = sluice_redis::db::Db::open(server.store.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = db.keys_from(db.space_used(0), b"", 1000).unwrap();
        let names: Vec<&[u8]> = stored.iter().map(|(k, _)| k.as_slice()).collect();
        if names == [&b"extended"[..], b"kept", b"rewritten"] {
            assert_eq!(c.call(&[b"GET", b"rewritten"]), b"$3\r\nnew\r\n");
            assert!(
                !db.expiry_index_is_empty().unwrap(),
                "extended's new expiry is indexed"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} keys are stored, expected 3 (extended, kept, rewritten)",
            stored.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn client_list_info_setinfo_and_kill() {
    let server = start_sluice(Durability::Always);
    let mut alice = Client::connect(server.addr);
    let mut bob = Client::connect(server.addr);
    assert_eq!(alice.call(&[b"CLIENT", b"SETNAME", b"alice"]), b"+OK\r\n");
    let Reply::Integer(alice_id) = alice.call_reply(&[b"CLIENT", b"ID"]) else {
        panic!("CLIENT ID is not an integer")
    };
    assert_eq!(
        bob.call(&[b"CLIENT", b"SETINFO", b"lib-name", b"mylib"]),
        b"+OK\r\n"
    );
    assert_eq!(
        bob.call(&[b"CLIENT", b"SETINFO", b"lib-color", b"red"]),
        b"-ERR Unrecognized option 'lib-color'\r\n"
    );
    let Reply::Bulk(list) = bob.call_reply(&[b"CLIENT", b"LIST"]) else {
        panic!("CLIENT LIST is not a bulk string")
    };
    let list = String::from_utf8(list).unwrap();
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.contains(&format!("id={alice_id} ")) && list.contains("name=alice"),
        "{list}"
    );
    let Reply::Bulk(me) = bob.call_reply(&[b"CLIENT", b"INFO"]) else {
        panic!("CLIENT INFO is not a bulk string")
    };
    assert!(String::from_utf8(me).unwrap().contains("lib-name=mylib"));
    assert_eq!(
        bob.call(&[b"CLIENT", b"KILL", b"ADDR", b"1.2.3.4:5"]),
        b":0\r\n"
    );
    assert_eq!(
        bob.call(&[b"CLIENT", b"KILL", b"1.2.3.4:5"]),
        b"-ERR No such client\r\n"
    );
    assert_eq!(
        bob.call(&[b"CLIENT", b"KILL", b"ID", b"0"]),
        b"-ERR client-id should be greater than 0\r\n"
    );
    let id = alice_id.to_string();
    assert_eq!(
        bob.call(&[b"CLIENT", b"KILL", b"ID", id.as_bytes()]),
        b":1\r\n"
    );
    let (_, closed) = read_until_closed(&mut alice.stream, Duration::from_secs(10));
    assert!(closed, "CLIENT KILL left the client connected");
    assert_eq!(bob.call(&[b"PING"]), b"+PONG\r\n");
    // Skipped by default: a client does not kill itself.
    assert_eq!(
        bob.call(&[b"CLIENT", b"KILL", b"USER", b"default"]),
        b":0\r\n"
    );
}

#[test]
fn config_set_changes_the_client_limit_and_timeout() {
    let server = start_sluice(Durability::Always);
    let mut admin = Client::connect(server.addr);
    assert_eq!(
        admin.call(&[b"CONFIG", b"SET", b"maxclients", b"2", b"timeout", b"1"]),
        b"+OK\r\n"
    );
    let Reply::Array(got) = admin.call_reply(&[b"CONFIG", b"GET", b"maxclients"]) else {
        panic!("CONFIG GET is not an array in RESP2")
    };
    assert_eq!(
        got,
        vec![
            Reply::Bulk(b"maxclients".to_vec()),
            Reply::Bulk(b"2".to_vec())
        ]
    );
    assert_eq!(
        admin.call(&[b"CONFIG", b"SET", b"proto-max-bulk-len", b"1000000"]),
        b"-ERR CONFIG SET failed (possibly related to argument 'proto-max-bulk-len') - Sluice sets it only at start: restart `sluice serve` with its flag\r\n"
    );
    let bind = admin.call(&[b"CONFIG", b"GET", b"proto-max-bulk-len"]);
    let now = String::from_utf8_lossy(&bind)
        .lines()
        .nth(4)
        .unwrap()
        .to_string();
    assert_eq!(
        admin.call(&[b"CONFIG", b"SET", b"proto-max-bulk-len", now.as_bytes()]),
        b"+OK\r\n",
        "set to what it is, a start-only setting is taken"
    );
    assert_eq!(
        admin.call(&[b"CONFIG", b"SET", b"nosuch", b"1"]),
        b"-ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'\r\n"
    );
    assert_eq!(
        admin.call(&[b"CONFIG", b"SET", b"timeout", b"soon"]),
        b"-ERR CONFIG SET failed (possibly related to argument 'timeout') - argument couldn't be parsed into an integer\r\n"
    );
    let mut second = Client::connect(server.addr);
    assert_eq!(second.call(&[b"PING"]), b"+PONG\r\n");
    let mut third = Client::connect(server.addr);
    let (got, closed) = read_until_closed(&mut third.stream, Duration::from_secs(10));
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
    assert!(closed);
    // timeout 1: the idle ones go.
    let (_, closed) = read_until_closed(&mut second.stream, Duration::from_secs(10));
    assert!(closed, "an idle client outlived CONFIG SET timeout 1");
}

#[test]
fn writes_wait_out_write_pressure_and_all_land() {
    // A write buffer of 64 KiB: the load outruns flushes and compactions
    // over and over, and the workers hold writes back rather than flush
    // on their own threads.
    let dev = Arc::new(MemoryDevice::new(4096, 64 << 10)) as Arc<dyn Device>;
    let store_config = StoreConfig {
        write_buffer_bytes: 64 << 10,
        background_compaction: true,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::create(dev, &store_config).unwrap());
    let server = start_sluice_on(store, config(Durability::None));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut batch = Vec::new();
                for i in 0..6000 {
                    batch.extend(request(&[
                        b"SET".to_vec(),
                        format!("w{t}-{i}").into_bytes(),
                        vec![b'v'; 200],
                    ]));
                }
                c.stream.write_all(&batch).unwrap();
                for _ in 0..6000 {
                    assert_eq!(c.read_reply().unwrap(), b"+OK\r\n");
                }
            })
        })
        .collect();
    // Reads go on meanwhile.
    let mut reader = Client::connect(server.addr);
    for _ in 0..50 {
        assert_eq!(reader.call(&[b"PING"]), b"+PONG\r\n");
        std::thread::sleep(Duration::from_millis(5));
    }
    for w in writers {
        w.join().unwrap();
    }
    let Reply::Array(values) = reader.call_reply(&[b"MGET", b"w0-0", b"w1-5999", b"w2-3000"])
    else {
        panic!("MGET did not answer an array")
    };
    assert!(
        values.iter().all(|v| *v == Reply::Bulk(vec![b'v'; 200])),
        "{values:?}"
    );
    assert_eq!(reader.call(&[b"DBSIZE"]), b":18000\r\n");
    let stats = server.store.stats();
    assert!(
        stats.flushes > 10,
        "only {} flushes: the load did not press",
        stats.flushes
    );
    // The workers held writes back instead of flushing on their threads.
    let info = info_fields(&mut reader, b"sluice");
    assert!(
        info["write_pressure_waits"].parse::<u64>().unwrap() > 0,
        "{info:?}"
    );
    assert_eq!(
        info["write_stalls"], "0",
        "a worker flushed on its own thread"
    );
    assert!(
        info["io_low_writes"].parse::<u64>().unwrap() > 0,
        "{info:?}"
    );
    assert!(
        info["io_high_writes"].parse::<u64>().unwrap() > 0,
        "{info:?}"
    );
    for key in [
        "compaction_debt_bytes",
        "block_cache_hit_rate",
        "io_high_reads",
        "io_low_flushes",
    ] {
        assert!(info.contains_key(key), "INFO sluice lacks {key}: {info:?}");
    }
}

/// INFO's `section` as field → value.
fn info_fields(c: &mut Client, section: &[u8]) -> std::collections::HashMap<String, String> {
    let text = match c.call_reply(&[b"INFO", section]) {
        Reply::Bulk(b) => b,
        Reply::Verbatim { text, .. } => text,
        other => panic!("INFO answered {other:?}"),
    };
    String::from_utf8(text)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Runs one data command on `db` as a connection would (name in lower
/// case, arity checked by the caller's choice of commands).
fn run_on(db: &sluice_redis::db::Db, args: &[&str]) -> Reply {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut ctx = sluice_server::commands::Ctx::new(db, now_ms);
    let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
    let name = args[0].to_ascii_lowercase();
    sluice_server::commands::execute(&mut ctx, &name, &args)
}

/// SET skips reading a key's old record when the filter of collection
/// keys says it holds none; hashes stored before the keyspace was opened
/// are put in that filter by the scan at open, so a SET over one still
/// removes its fields.
#[test]
fn set_over_a_hash_stored_before_open_removes_its_fields() {
    let store = common::small_store();
    {
        let db = sluice_redis::db::Db::open(store.clone()).unwrap();
        for i in 0..40 {
            let key = format!("hash{i}");
            assert_eq!(
                run_on(&db, &["HSET", &key, "f1", "a", "f2", "b"]),
                Reply::Integer(2)
            );
        }
        assert_eq!(
            run_on(&db, &["SET", "plain", "v"]),
            Reply::Simple("OK".into())
        );
    }
    let db = sluice_redis::db::Db::open(store.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !db.collection_filter_complete() {
        assert!(Instant::now() < deadline, "the scan of stored hashes ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..40 {
        assert!(db.may_hold_collection(format!("hash{i}").as_bytes()));
    }
    assert!(
        !db.may_hold_collection(b"plain"),
        "a string is not in the filter"
    );
    for i in 0..40 {
        let key = format!("hash{i}");
        assert_eq!(
            run_on(&db, &["SET", &key, "now a string"]),
            Reply::Simple("OK".into())
        );
        assert_eq!(run_on(&db, &["TYPE", &key]), Reply::Simple("string".into()));
        assert_eq!(run_on(&db, &["DEL", &key]), Reply::Integer(1));
        assert_eq!(run_on(&db, &["HSET", &key, "f3", "c"]), Reply::Integer(1));
        assert_eq!(
            run_on(&db, &["HGETALL", &key]),
            Reply::Map(vec![(
                Reply::Bulk(b"f3".to_vec()),
                Reply::Bulk(b"c".to_vec())
            )]),
            "{key}: the old fields went with the SET"
        );
    }
    // A hash made after open marks itself.
    assert_eq!(run_on(&db, &["HSET", "late", "f", "v"]), Reply::Integer(1));
    assert!(db.may_hold_collection(b"late"));
    assert_eq!(
        run_on(&db, &["SET", "late", "s"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(run_on(&db, &["DEL", "late"]), Reply::Integer(1));
    assert_eq!(run_on(&db, &["HLEN", "late"]), Reply::Integer(0));
    // Only the 40 new hashes' one field each is left: every field a SET
    // replaced went with it (a new object id alone would hide them).
    let members = store.keyspace(sluice_redis::db::MEMBERS_KEYSPACE).unwrap();
    let all = (
        std::ops::Bound::Unbounded::<&[u8]>,
        std::ops::Bound::Unbounded,
    );
    let left = store.iter(members, all, &store.snapshot(), false).count();
    assert_eq!(left, 40, "member entries left");
}

/// A script that never ends: past `lua-time-limit` every other client
/// gets BUSY (PING too) but for SCRIPT KILL, which stops it with Redis's
/// error; its writes are dropped whole; everyone is served again. One
/// worker serves them all: the script runs on the script thread, so the
/// worker that received it goes on answering. A script that wrote is
/// UNKILLABLE, as in Redis, and a shutdown still stops the server (the
/// script is stopped, its writes dropped).
#[test]
fn a_runaway_script_answers_busy_and_is_stopped_by_script_kill_or_a_shutdown() {
    let s = one_worker();
    let mut admin = Client::connect(s.addr);
    admin.call(&[b"CONFIG", b"SET", b"lua-time-limit", b"10"]);
    let mut runner = Client::connect(s.addr);
    let script = b"redis.call('SET', 'half', 'done') ; while true do end";
    let read_only = b"while true do end";
    for (body, killable) in [(&read_only[..], true), (&script[..], false)] {
        runner
            .stream
            .write_all(&request(&[b"EVAL".to_vec(), body.to_vec(), b"0".to_vec()]))
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // The only worker answers at once: BUSY.
        let mut killer = Client::connect(s.addr);
        killer
            .stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let busy = killer.call(&[b"PING"]);
        assert!(
            busy.starts_with(
                b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL"
            ),
            "{}",
            String::from_utf8_lossy(&busy)
        );
        // FUNCTION KILL does not stop an EVAL script (Redis's BUSY), but
        // says UNKILLABLE first for one that wrote.
        let wrong_kill = killer.call(&[b"FUNCTION", b"KILL"]);
        let want: &[u8] = if killable { b"-BUSY" } else { b"-UNKILLABLE" };
        assert!(
            wrong_kill.starts_with(want),
            "{}",
            String::from_utf8_lossy(&wrong_kill)
        );
        let kill = killer.call(&[b"SCRIPT", b"KILL"]);
        if killable {
            assert_eq!(kill, b"+OK\r\n");
            let ended = String::from_utf8_lossy(&runner.read_reply().unwrap()).into_owned();
            assert!(
                ended.contains("Script killed by user with SCRIPT KILL"),
                "{ended}"
            );
            assert_eq!(killer.call(&[b"PING"]), b"+PONG\r\n");
            assert_eq!(
                killer.call(&[b"SCRIPT", b"KILL"]),
                b"-NOTBUSY No scripts in execution right now.\r\n"
            );
        } else {
            assert!(
                kill.starts_with(b"-UNKILLABLE Sorry the script already executed write commands")
            );
            // SHUTDOWN stops it (allowed while busy): the server ends, the
            // script's SET never lands.
            killer
                .stream
                .write_all(&request(&[b"SHUTDOWN".to_vec(), b"NOSAVE".to_vec()]))
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::net::TcpStream::connect(s.addr).is_ok() {
                assert!(Instant::now() < deadline, "the server did not stop");
                std::thread::sleep(Duration::from_millis(50));
            }
            let db = sluice_redis::Db::open(s.store.clone()).unwrap();
            let ctx = sluice_redis::Ctx::new(&db, 0);
            assert_eq!(
                ctx.get_string(b"half").unwrap(),
                None,
                "a stopped script's write landed"
            );
        }
    }
}

/// A write that arrives while a script runs waits for it without stopping
/// its worker: the script holds every stripe lock, and a worker waiting
/// for one would serve none of its clients — SCRIPT KILL included — until
/// the script ended (a runaway one: never). With one worker: writes sent
/// during a runaway script get BUSY once it passes busy-reply-threshold
/// and SCRIPT KILL stops it; during a script that ends by itself, a write
/// waits for it while another client's PING is answered meanwhile.
#[test]
fn a_write_during_a_script_waits_without_stopping_its_worker() {
    let s = one_worker();
    let mut admin = Client::connect(s.addr);
    admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"1000"]);
    admin.call(&[b"SET", b"a", b"1"]);
    // Expired by the time it is read: its removal would take a lock.
    admin.call(&[b"SET", b"gone", b"x", b"PX", b"1"]);
    let connect = || {
        let c = Client::connect(s.addr);
        c.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        c
    };
    let (mut runner, mut writer, mut killer) = (connect(), connect(), connect());
    let mut getter = connect();
    runner
        .stream
        .write_all(&request(&[
            b"EVAL".to_vec(),
            b"while true do end".to_vec(),
            b"0".to_vec(),
        ]))
        .unwrap();
    // Time for the script to start (the writes below must find it
    // running), well inside the threshold.
    std::thread::sleep(Duration::from_millis(300));
    // Sent before the threshold: they wait, then get BUSY past it — a
    // GET of an expired key first, alone on its connection.
    getter
        .stream
        .write_all(&request(&[b"GET".to_vec(), b"gone".to_vec()]))
        .unwrap();
    let writes: Vec<Vec<Vec<u8>>> = [
        &["SET", "a", "2"][..],
        &["INCR", "n"],
        &["HSET", "h", "f", "v"],
        &["GET", "a"],
    ]
    .iter()
    .map(|args| args.iter().map(|a| a.as_bytes().to_vec()).collect())
    .collect();
    for args in &writes {
        writer.stream.write_all(&request(args)).unwrap();
    }
    for args in &writes {
        let reply = writer.read_reply().expect("a reply past the threshold");
        assert!(
            reply.starts_with(b"-BUSY Redis is busy running a script"),
            "{:?}: {}",
            args,
            String::from_utf8_lossy(&reply)
        );
    }
    let reply = getter.read_reply().expect("a reply past the threshold");
    assert!(
        reply.starts_with(b"-BUSY Redis is busy running a script"),
        "GET gone: {}",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(killer.call(&[b"SCRIPT", b"KILL"]), b"+OK\r\n");
    let ended = String::from_utf8_lossy(&runner.read_reply().unwrap()).into_owned();
    assert!(
        ended.contains("Script killed by user with SCRIPT KILL"),
        "{ended}"
    );
    assert_eq!(
        writer.call(&[b"GET", b"a"]),
        b"$1\r\n1\r\n",
        "nothing was written"
    );
    // A script that ends by itself after 1.5 s, reading `a` at its end.
    admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"60000"]);
    let timed = "local t = redis.call('TIME') local start = t[1] * 1e6 + t[2] \
                 repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - start > 1500000 \
                 return redis.call('GET', 'a')";
    let sent = Instant::now();
    runner
        .stream
        .write_all(&request(&[
            b"EVAL".to_vec(),
            timed.as_bytes().to_vec(),
            b"0".to_vec(),
        ]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    writer
        .stream
        .write_all(&request(&[b"SET".to_vec(), b"a".to_vec(), b"3".to_vec()]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // The worker is not stuck behind the SET: another client is served.
    let mut reader = connect();
    let asked = Instant::now();
    assert_eq!(reader.call(&[b"PING"]), b"+PONG\r\n");
    assert!(
        asked.elapsed() < Duration::from_millis(1000),
        "a PING waited {:?} behind a write waiting for the script",
        asked.elapsed()
    );
    assert_eq!(writer.read_reply().unwrap(), b"+OK\r\n");
    assert!(
        sent.elapsed() >= Duration::from_millis(1400),
        "the SET did not wait"
    );
    // The script read `a` as it was: the SET came after it.
    assert_eq!(runner.read_reply().unwrap(), b"$1\r\n1\r\n");
    assert_eq!(reader.call(&[b"GET", b"a"]), b"$1\r\n3\r\n");
}

/// A function that never ends, even one that catches the kill in a
/// `pcall` loop: FUNCTION KILL stops it (SCRIPT KILL refuses, as Redis).
#[test]
fn function_kill_stops_a_runaway_function_even_inside_pcall() {
    let s = one_worker();
    let mut admin = Client::connect(s.addr);
    admin.call(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"10"]);
    let library = b"#!lua name=spin\nredis.register_function('spin', function() \
        local f = function() while true do redis.call('ping') end end \
        while true do pcall(f) end end)";
    assert_eq!(
        admin.call(&[b"FUNCTION", b"LOAD", library]),
        b"$4\r\nspin\r\n"
    );
    let mut runner = Client::connect(s.addr);
    runner
        .stream
        .write_all(&request(&[
            b"FCALL".to_vec(),
            b"spin".to_vec(),
            b"0".to_vec(),
        ]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(admin
        .call(&[b"PING"])
        .starts_with(b"-BUSY Redis is busy running a script. You can only call FUNCTION KILL"));
    assert!(admin.call(&[b"SCRIPT", b"KILL"]).starts_with(b"-BUSY"));
    let stats = String::from_utf8_lossy(&admin.call(&[b"FUNCTION", b"STATS"])).into_owned();
    assert!(
        stats.contains("spin") && stats.contains("duration_ms"),
        "{stats}"
    );
    assert_eq!(admin.call(&[b"FUNCTION", b"KILL"]), b"+OK\r\n");
    runner
        .stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let ended =
        String::from_utf8_lossy(&runner.read_reply().expect("the function ends")).into_owned();
    assert!(ended.contains("Script killed by user"), "{ended}");
    assert_eq!(admin.call(&[b"PING"]), b"+PONG\r\n");
    assert_eq!(runner.call(&[b"PING"]), b"+PONG\r\n");
}

/// FUNCTION LOAD keeps a library in the store: after a restart its
/// functions answer as before; FUNCTION DELETE and FLUSH last too.
#[test]
fn function_libraries_outlive_a_restart() {
    let store = common::small_store();
    let start = |store: Arc<Store>| start_sluice_on(store, config(Durability::Always));
    let s = start(store.clone());
    let mut c = Client::connect(s.addr);
    let one = b"#!lua name=one\nredis.register_function('seven', function() return 7 end)";
    let two = b"#!lua name=two\nredis.register_function{function_name='echo', callback=function(keys, args) return args[1] end, flags={'no-writes'}}";
    assert_eq!(c.call(&[b"FUNCTION", b"LOAD", one]), b"$3\r\none\r\n");
    assert_eq!(c.call(&[b"FUNCTION", b"LOAD", two]), b"$3\r\ntwo\r\n");
    let store = s.stop();
    let s = start(store);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.call(&[b"FCALL", b"seven", b"0"]), b":7\r\n");
    assert_eq!(
        c.call(&[b"FCALL_RO", b"echo", b"0", b"hi"]),
        b"$2\r\nhi\r\n"
    );
    assert_eq!(c.call(&[b"FUNCTION", b"DELETE", b"one"]), b"+OK\r\n");
    let store = s.stop();
    let s = start(store);
    let mut c = Client::connect(s.addr);
    assert_eq!(
        c.call(&[b"FCALL", b"seven", b"0"]),
        b"-ERR Function not found\r\n"
    );
    assert_eq!(
        c.call(&[b"FCALL_RO", b"echo", b"0", b"hi"]),
        b"$2\r\nhi\r\n"
    );
    assert_eq!(c.call(&[b"FUNCTION", b"FLUSH"]), b"+OK\r\n");
    let store = s.stop();
    let s = start(store);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.call(&[b"FUNCTION", b"LIST"]), b"*0\r\n");
}

/// Keys of databases other than 0, SWAPDB's map and MOVE's moves are in
/// the store: after a restart each database holds what it held, and a
/// FLUSHDB of one while others hold keys leaves the others whole.
#[test]
fn databases_outlive_a_restart() {
    let store = common::small_store();
    let start = |store: Arc<Store>| start_sluice_on(store, config(Durability::Always));
    let s = start(store.clone());
    let mut c = Client::connect(s.addr);
    for line in [
        "SET k zero",
        "SELECT 4",
        "SET k four",
        "RPUSH l a b c",
        "HSET h f v",
        "SET e v EX 1000",
        "SWAPDB 4 5",
        "SELECT 0",
        "MOVE k 9",
    ] {
        let reply = c.call_line(line);
        assert!(
            !reply.starts_with(b"-"),
            "{line}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    let store = s.stop();
    let s = start(store);
    let mut c = Client::connect(s.addr);
    let expect = [
        ("DBSIZE", ":0\r\n".as_bytes()),
        ("SELECT 9", b"+OK\r\n"),
        ("GET k", b"$4\r\nzero\r\n"),
        ("SELECT 4", b"+OK\r\n"),
        ("DBSIZE", b":0\r\n"),
        ("SELECT 5", b"+OK\r\n"),
        ("GET k", b"$4\r\nfour\r\n"),
        ("LRANGE l 0 -1", b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"),
        ("HGET h f", b"$1\r\nv\r\n"),
        ("TTL e", b":1000\r\n"),
        ("SELECT 9", b"+OK\r\n"),
        ("FLUSHDB", b"+OK\r\n"),
        ("DBSIZE", b":0\r\n"),
        ("SELECT 5", b"+OK\r\n"),
        ("DBSIZE", b":4\r\n"),
        ("FLUSHDB", b"+OK\r\n"),
        ("EXISTS l h", b":0\r\n"),
        ("RPUSH l x", b":1\r\n"),
        ("LRANGE l 0 -1", b"*1\r\n$1\r\nx\r\n"),
    ];
    for (line, want) in expect {
        let got = c.call_line(line);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "{line}"
        );
    }
}

/// INFO commandstats counts each command's calls, microseconds, refusals
/// and errors — the fast paths' GET and SET, subcommands, what EXEC runs
/// (counted when it runs, not when queued) — and only `all` and
/// `everything` show it, as Redis does; CONFIG RESETSTAT clears it.
#[test]
fn info_commandstats_counts_calls_refusals_and_errors() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    for line in [
        "SET k v",
        "GET k",
        "GET",
        "INCR n",
        "INCR k",
        "MULTI",
        "INCR n",
        "EXEC",
        "CLIENT ID",
        // A script's commands count as Redis counts them: two INCRs (one
        // of them failing) and a GET, beside the EVAL.
        "EVAL \"redis.call('incr', 'n'); redis.pcall('incr', 'k'); return redis.call('get', 'n')\" 0",
    ] {
        c.call_line(line);
    }
    let info = |c: &mut Client, section: &str| -> String {
        match c.call_reply(&[b"INFO", section.as_bytes()]) {
            Reply::Bulk(b) => String::from_utf8(b).unwrap(),
            other => panic!("INFO {section}: {other:?}"),
        }
    };
    let stats = info(&mut c, "commandstats");
    let line = |name: &str| -> String {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .unwrap_or_else(|| panic!("no cmdstat_{name} in {stats}"))
            .to_string()
    };
    let fields = |name: &str| -> (u64, u64, u64) {
        let l = line(name);
        let get = |f: &str| -> u64 {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .unwrap_or_else(|| panic!("{f} missing in {l}"))
                .parse()
                .unwrap()
        };
        (get("calls"), get("rejected_calls"), get("failed_calls"))
    };
    assert_eq!(fields("set"), (1, 0, 0), "{stats}");
    assert_eq!(fields("get"), (2, 1, 0), "{stats}");
    assert_eq!(fields("incr"), (5, 0, 2), "{stats}");
    assert_eq!(fields("eval"), (1, 0, 0), "{stats}");
    assert_eq!(fields("multi"), (1, 0, 0), "{stats}");
    assert_eq!(fields("exec"), (1, 0, 0), "{stats}");
    assert_eq!(fields("client|id"), (1, 0, 0), "{stats}");
    assert!(line("incr").contains("usec_per_call="), "{stats}");
    assert!(!info(&mut c, "default").contains("rejected_calls"));
    assert!(!info(&mut c, "").contains("cmdstat_"));
    assert!(info(&mut c, "all").contains("cmdstat_incr:"));
    assert!(info(&mut c, "everything").contains("cmdstat_incr:"));
    assert_eq!(c.call_line("CONFIG RESETSTAT"), b"+OK\r\n");
    let after = info(&mut c, "commandstats");
    assert!(!after.contains("cmdstat_incr"), "{after}");
}

/// RANDOMKEY gives every key a chance however their names fall: with
/// "bar" and "foo" alone, a random place in the key space lands between
/// them one time in 64, yet 200 calls must see both (Redis's keyspace
/// unit asks the same of 100).
#[test]
fn randomkey_gives_each_of_few_keys_its_chance() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.call_line("SET foo x"), b"+OK\r\n");
    assert_eq!(c.call_line("SET bar y"), b"+OK\r\n");
    let mut seen = std::collections::HashMap::new();
    for _ in 0..200 {
        *seen.entry(c.call_line("RANDOMKEY")).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.values().all(|&n| n >= 40), "{seen:?}");
}

/// A client blocked in one database is woken by a push to its key in that
/// database only: a push to the same key in another leaves it waiting,
/// and a MOVE into its database serves it.
#[test]
fn a_blocked_client_waits_on_its_own_database() {
    let s = start_sluice(Durability::None);
    let mut waiter = Client::connect(s.addr);
    let mut other = Client::connect(s.addr);
    assert_eq!(waiter.call_line("SELECT 2"), b"+OK\r\n");
    waiter.send_line("BLPOP q 5");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(other.call_line("LPUSH q in-zero"), b":1\r\n");
    assert!(
        waiter.try_read(Duration::from_millis(300)).is_none(),
        "a push in database 0 answered a client waiting in database 2"
    );
    assert_eq!(other.call_line("SELECT 2"), b"+OK\r\n");
    assert_eq!(other.call_line("LPUSH q in-two"), b":1\r\n");
    assert_eq!(
        waiter.read_reply().unwrap(),
        b"*2\r\n$1\r\nq\r\n$6\r\nin-two\r\n"
    );
    waiter.send_line("BLPOP q 5");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(other.call_line("SELECT 0"), b"+OK\r\n");
    assert_eq!(other.call_line("MOVE q 2"), b":1\r\n");
    assert_eq!(
        waiter.read_reply().unwrap(),
        b"*2\r\n$1\r\nq\r\n$7\r\nin-zero\r\n"
    );
}

/// A WATCHed key that expires before EXEC aborts it, even before the
/// sweep removes it (Redis 7's rule); one already gone when watched does
/// not.
#[test]
fn a_watched_key_that_expires_aborts_the_transaction() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.call(&[b"SET", b"x", b"foo", b"PX", b"100"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"WATCH", b"x"]), b"+OK\r\n");
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"PING"]), b"+QUEUED\r\n");
    assert_eq!(c.call(&[b"EXEC"]), b"*-1\r\n");
    // Watched once expired, it aborts nothing.
    assert_eq!(c.call(&[b"WATCH", b"x"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"MULTI"]), b"+OK\r\n");
    assert_eq!(c.call(&[b"PING"]), b"+QUEUED\r\n");
    assert_eq!(c.call(&[b"EXEC"]), b"*1\r\n+PONG\r\n");
}

/// Every error reply is counted by its code, as Redis's INFO errorstats
/// and `total_error_replies` count them (those inside EXEC's reply too);
/// CONFIG RESETSTAT starts the counts again.
#[test]
fn error_replies_are_counted_by_code() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    c.call(&[b"SET", b"s", b"text"]);
    assert!(c.call(&[b"INCR", b"s"]).starts_with(b"-ERR"));
    assert!(c.call(&[b"LPUSH", b"s", b"x"]).starts_with(b"-WRONGTYPE"));
    assert!(c
        .call(&[b"EVAL", b"return redis.error_reply('MY_CODE custom')", b"0"])
        .starts_with(b"-MY_CODE"));
    c.call(&[b"MULTI"]);
    c.call(&[b"INCR", b"s"]);
    c.call(&[b"EXEC"]);
    let errors = info_fields(&mut c, b"errorstats");
    assert_eq!(
        errors.get("errorstat_ERR").map(String::as_str),
        Some("count=2")
    );
    assert_eq!(
        errors.get("errorstat_WRONGTYPE").map(String::as_str),
        Some("count=1")
    );
    assert_eq!(
        errors.get("errorstat_MY_CODE").map(String::as_str),
        Some("count=1")
    );
    let stats = info_fields(&mut c, b"stats");
    assert_eq!(
        stats.get("total_error_replies").map(String::as_str),
        Some("4")
    );
    assert_eq!(c.call(&[b"CONFIG", b"RESETSTAT"]), b"+OK\r\n");
    assert!(info_fields(&mut c, b"errorstats").is_empty());
    let stats = info_fields(&mut c, b"stats");
    assert_eq!(
        stats.get("total_error_replies").map(String::as_str),
        Some("0")
    );
}

/// INFO's cpu section (the process's CPU seconds, growing as it works)
/// and memory fields, in the sections Redis puts them.
#[test]
fn info_reports_cpu_and_memory_in_their_sections() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    let cpu = info_fields(&mut c, b"cpu");
    let user: f64 = cpu["used_cpu_user"].parse().unwrap();
    let system: f64 = cpu["used_cpu_sys"].parse().unwrap();
    assert!(user >= 0.0 && system >= 0.0);
    assert!(!cpu.contains_key("used_memory"));
    for i in 0..20_000u32 {
        c.call(&[b"SET", format!("k{i}").as_bytes(), b"v"]);
    }
    let later = info_fields(&mut c, b"cpu");
    let busy: f64 = later["used_cpu_user"].parse::<f64>().unwrap()
        + later["used_cpu_sys"].parse::<f64>().unwrap();
    assert!(
        busy > user + system,
        "{busy} after 20,000 SETs, {} before",
        user + system
    );
    let memory = info_fields(&mut c, b"memory");
    assert!(memory["used_memory"].parse::<u64>().unwrap() > 0);
    assert!(memory["used_memory_rss"].parse::<u64>().unwrap() > 0);
    let all = info_fields(&mut c, b"default");
    assert!(all.contains_key("used_cpu_user") && all.contains_key("used_memory"));
    // A master without replicas, its replication id made at start.
    let replication = info_fields(&mut c, b"replication");
    assert_eq!(replication["role"], "master");
    assert_eq!(replication["connected_slaves"], "0");
    let id = &replication["master_replid"];
    assert!(
        id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
}

/// A worker runs its clients' requests in the order they came, not by
/// the slots the clients hold: two BRPOPLPUSH then an LPUSH, sent back to
/// back, serve the first waiter first (WRONGTYPE: its target is a string)
/// and the element goes to the second, as Redis's one event loop does.
/// The clients take slots in the reverse of their sending order.
#[test]
fn requests_of_different_clients_run_in_the_order_they_came() {
    let s = one_worker();
    for _ in 0..20 {
        let mut writer = Client::connect(s.addr);
        let mut second = Client::connect(s.addr);
        let mut first = Client::connect(s.addr);
        writer.call(&[b"DEL", b"blist", b"target1", b"target2"]);
        writer.call(&[b"SET", b"target1", b"nolist"]);
        let send = |c: &mut Client, args: &[&[u8]]| {
            let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
            c.stream.write_all(&request(&args)).unwrap();
        };
        send(&mut first, &[b"BRPOPLPUSH", b"blist", b"target1", b"0"]);
        send(&mut second, &[b"BRPOPLPUSH", b"blist", b"target2", b"0"]);
        send(&mut writer, &[b"LPUSH", b"blist", b"foo"]);
        for c in [&mut first, &mut second, &mut writer] {
            c.stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
        }
        assert_eq!(writer.read_reply().as_deref(), Some(&b":1\r\n"[..]));
        let wrong = first.read_reply().expect("the first waiter is answered");
        assert!(
            wrong.starts_with(b"-WRONGTYPE"),
            "{}",
            String::from_utf8_lossy(&wrong)
        );
        assert_eq!(second.read_reply().as_deref(), Some(&b"$3\r\nfoo\r\n"[..]));
    }
}

/// SLOWLOG keeps the commands slower than `slowlog-log-slower-than`
/// (a script timed where it runs), newest first, cut as Redis cuts them;
/// LATENCY keeps the `command` event past `latency-monitor-threshold`.
#[test]
fn slowlog_and_latency_keep_the_slow_commands() {
    let s = start_sluice(Durability::None);
    let mut c = Client::connect(s.addr);
    let reply = |c: &mut Client, args: &[&[u8]]| match c.call_reply(args) {
        Reply::Array(items) => items,
        other => panic!("{other:?}"),
    };
    c.call(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"-1"]);
    c.call(&[b"SLOWLOG", b"RESET"]);
    c.call(&[b"SET", b"a", b"b"]);
    assert!(reply(&mut c, &[b"SLOWLOG", b"GET"]).is_empty());
    c.call(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"0"]);
    let long = vec![b'x'; 300];
    c.call(&[b"SET", b"a", &long]);
    let newest = reply(&mut c, &[b"SLOWLOG", b"GET", b"1"]);
    let Reply::Array(entry) = &newest[0] else {
        panic!("{newest:?}")
    };
    assert_eq!(entry.len(), 6);
    let Reply::Array(args) = &entry[3] else {
        panic!("{entry:?}")
    };
    assert_eq!(args[0], Reply::Bulk(b"SET".to_vec()));
    let Reply::Bulk(cut) = &args[2] else {
        panic!("{args:?}")
    };
    assert!(
        cut.ends_with(b"... (172 more bytes)"),
        "{}",
        String::from_utf8_lossy(cut)
    );
    // A script's time is its run on the script thread.
    c.call(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"50000"]);
    c.call(&[b"CONFIG", b"SET", b"latency-monitor-threshold", b"50"]);
    let spin = b"local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
        repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 80000 return 1";
    assert_eq!(c.call(&[b"EVAL", spin, b"0"]), b":1\r\n");
    let newest = reply(&mut c, &[b"SLOWLOG", b"GET", b"1"]);
    let Reply::Array(entry) = &newest[0] else {
        panic!("{newest:?}")
    };
    let Reply::Integer(us) = entry[2] else {
        panic!("{entry:?}")
    };
    assert!(us >= 80_000, "the script took {us} µs");
    let latest = reply(&mut c, &[b"LATENCY", b"LATEST"]);
    let Reply::Array(event) = &latest[0] else {
        panic!("{latest:?}")
    };
    assert_eq!(event[0], Reply::Bulk(b"command".to_vec()));
    let Reply::Integer(ms) = event[2] else {
        panic!("{event:?}")
    };
    assert!(ms >= 80, "{ms} ms");
    assert_eq!(
        reply(&mut c, &[b"LATENCY", b"HISTORY", b"command"]).len(),
        1
    );
    assert_eq!(c.call(&[b"LATENCY", b"RESET"]), b":1\r\n");
    assert!(reply(&mut c, &[b"LATENCY", b"LATEST"]).is_empty());
}

/// CLIENT KILL TYPE pubsub closes the subscribed clients only; TYPE normal
/// the others (the caller spared, as SKIPME yes is the default).
#[test]
fn client_kill_by_type_tells_subscribers_from_the_others() {
    let s = start_sluice(Durability::None);
    let mut admin = Client::connect(s.addr);
    let mut subscriber = Client::connect(s.addr);
    let mut plain = Client::connect(s.addr);
    subscriber.call(&[b"SUBSCRIBE", b"news"]);
    assert_eq!(plain.call(&[b"PING"]), b"+PONG\r\n");
    assert_eq!(
        admin.call(&[b"CLIENT", b"KILL", b"TYPE", b"pubsub"]),
        b":1\r\n"
    );
    subscriber
        .stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(subscriber.read_reply(), None, "the subscriber was closed");
    assert_eq!(plain.call(&[b"PING"]), b"+PONG\r\n");
    assert_eq!(
        admin.call(&[b"CLIENT", b"KILL", b"TYPE", b"normal"]),
        b":1\r\n"
    );
    plain
        .stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(plain.read_reply(), None, "the other client was closed");
    assert_eq!(admin.call(&[b"PING"]), b"+PONG\r\n");
}

/// CONFIG SET appendfsync changes when writes are acknowledged from the
/// next one on: with `no` no reply waits for the log, with `always` each
/// write's does (INFO sluice's `durable_reply_waits`).
#[test]
fn config_set_appendfsync_changes_when_replies_wait() {
    let server = start_sluice(Durability::Always);
    let mut c = Client::connect(server.addr);
    let waits = |c: &mut Client| -> u64 {
        info_fields(c, b"sluice")["durable_reply_waits"]
            .parse()
            .unwrap()
    };
    assert_eq!(c.call(&[b"SET", b"a", b"1"]), b"+OK\r\n");
    let before = waits(&mut c);
    assert!(before >= 1, "with always a write's reply waits");
    assert_eq!(
        c.call(&[b"CONFIG", b"SET", b"appendfsync", b"no"]),
        b"+OK\r\n"
    );
    assert_eq!(info_fields(&mut c, b"persistence")["appendfsync"], "none");
    for i in 0..20 {
        assert_eq!(
            c.call(&[b"SET", b"a", i.to_string().as_bytes()]),
            b"+OK\r\n"
        );
    }
    assert_eq!(waits(&mut c), before, "with no, replies do not wait");
    assert_eq!(
        c.call(&[b"CONFIG", b"SET", b"appendfsync", b"sometimes"]),
        b"-ERR CONFIG SET failed (possibly related to argument 'appendfsync') - argument(s) must be one of the following: everysec, always, no\r\n"
    );
    assert_eq!(
        c.call(&[b"CONFIG", b"SET", b"appendfsync", b"always"]),
        b"+OK\r\n"
    );
    assert_eq!(c.call(&[b"SET", b"a", b"last"]), b"+OK\r\n");
    assert!(
        waits(&mut c) > before,
        "back to always, the reply waits again"
    );
    assert_eq!(c.call(&[b"GET", b"a"]), b"$4\r\nlast\r\n");
}

/// CLIENT LIST and CLIENT INFO carry every field of Redis 7.0's line, in
/// its order; `cmd`, `sub`, `multi` and `flags` follow what each client
/// does (a subscriber on another connection, a transaction here).
#[test]
fn client_list_shows_what_each_client_does() {
    let server = start_sluice(Durability::Always);
    let mut me = Client::connect(server.addr);
    let mut sub = Client::connect(server.addr);
    assert!(sub.call(&[b"SUBSCRIBE", b"news"]).starts_with(b"*3"));
    let line = String::from_utf8(me.call(&[b"CLIENT", b"INFO"])).unwrap();
    let fields: Vec<&str> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.split('=').next().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "id",
            "addr",
            "laddr",
            "fd",
            "name",
            "age",
            "idle",
            "flags",
            "db",
            "sub",
            "psub",
            "ssub",
            "multi",
            "qbuf",
            "qbuf-free",
            "argv-mem",
            "multi-mem",
            "rbs",
            "rbp",
            "obl",
            "oll",
            "omem",
            "tot-mem",
            "events",
            "cmd",
            "user",
            "redir",
            "resp",
            "lib-name",
            "lib-ver"
        ]
    );
    // Its own request is in its query buffer as Redis counts it.
    assert!(line.contains(" qbuf=26 "), "{line}");
    assert!(line.contains(" cmd=client|info "), "{line}");
    assert!(line.contains(" flags=N "), "{line}");
    assert_eq!(me.call(&[b"MULTI"]), b"+OK\r\n");
    assert_eq!(me.call(&[b"GET", b"x"]), b"+QUEUED\r\n");
    assert_eq!(me.call(&[b"DISCARD"]), b"+OK\r\n");
    let list = String::from_utf8(me.call(&[b"CLIENT", b"LIST"])).unwrap();
    let sub_line = list
        .lines()
        .find(|l| l.contains(" cmd=subscribe "))
        .unwrap();
    assert!(
        sub_line.contains(" flags=P ") && sub_line.contains(" sub=1 "),
        "{sub_line}"
    );
    assert_eq!(me.call(&[b"CLIENT", b"TRACKING", b"on"]), b"+OK\r\n");
    assert_eq!(me.call(&[b"MULTI"]), b"+OK\r\n");
    assert_eq!(me.call(&[b"GET", b"x"]), b"+QUEUED\r\n");
    let listed = me.call(&[b"CLIENT", b"LIST", b"ID", b"1", b"2", b"3"]);
    assert_eq!(listed, b"+QUEUED\r\n", "CLIENT LIST inside MULTI is queued");
    let Reply::Array(replies) = me.call_reply(&[b"EXEC"]) else {
        panic!("EXEC is an array")
    };
    let Reply::Bulk(text) = &replies[1] else {
        panic!("CLIENT LIST is a bulk string in RESP2")
    };
    let text = String::from_utf8_lossy(text);
    // As Redis shows a client inside EXEC: its command is EXEC, still in
    // MULTI with two queued, tracking without a redirect.
    let mine = text.lines().find(|l| l.contains(" cmd=exec ")).unwrap();
    for field in [" flags=xt ", " multi=2 ", " redir=0 "] {
        assert!(mine.contains(field), "{field} in {mine}");
    }
}

/// SPOP of a set past the size it seeks in (128 members) takes each member
/// once: with the first and last members remembered between pops, members
/// added later below the first or above the last are still popped, and
/// the set empties exactly.
#[test]
fn spop_takes_every_member_once_while_members_come_and_go() {
    let server = start_sluice(Durability::Always);
    let mut c = Client::connect(server.addr);
    let mut added = std::collections::BTreeSet::new();
    let mut sadd = |c: &mut Client, member: String| {
        assert_eq!(c.call(&[b"SADD", b"s", member.as_bytes()]), b":1\r\n");
        added.insert(member);
    };
    for i in 0..600 {
        sadd(&mut c, format!("m{i:04}"));
    }
    let mut popped = std::collections::BTreeSet::new();
    let mut pop = |c: &mut Client| {
        let reply = c.call(&[b"SPOP", b"s"]);
        let text = String::from_utf8(reply).unwrap();
        let member = text.lines().nth(1).unwrap().to_string();
        assert!(popped.insert(member.clone()), "{member} popped twice");
    };
    for _ in 0..300 {
        pop(&mut c);
    }
    // Outside the remembered ends, and inside them.
    sadd(&mut c, "a-before-all".into());
    sadd(&mut c, "z-after-all".into());
    sadd(&mut c, "m0300x".into());
    while c.call(&[b"SCARD", b"s"]) != b":0\r\n" {
        pop(&mut c);
    }
    assert_eq!(popped, added);
    assert_eq!(c.call(&[b"SPOP", b"s"]), b"$-1\r\n");
}
