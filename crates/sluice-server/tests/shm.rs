//! The shared-memory transport end to end: sluice-client over `shm://`
//! against a server with `--shm`, and raw rings (sluice_io::shm) for the
//! clients a well-behaved library never is: one that stops reading, one
//! that writes garbage, one that lies about its ring counters.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::{small_store, start_sluice_on, Client as TcpClient, Sluice};
use sluice_client::{Client, Error, Value};
use sluice_io::shm::{self, ShmChannel, ShmRegion, Side};
use sluice_server::server::{Durability, ServerConfig, ShmSettings};
use sluice_server::session::Users;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The memory test measures the whole process: it runs alone.
static MEMORY: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.sock"))
}

fn start(name: &str, tweak: impl FnOnce(&mut ServerConfig)) -> (Sluice, PathBuf) {
    let path = socket_path(name);
    let mut settings = ShmSettings::at(&path);
    settings.request_ring_bytes = 64 << 10;
    settings.response_ring_bytes = 64 << 10;
    let mut config = ServerConfig {
        threads: 2,
        durability: Durability::Always,
        shm: Some(settings),
        ..ServerConfig::default()
    };
    tweak(&mut config);
    (start_sluice_on(small_store(), config), path)
}

fn url(path: &std::path::Path) -> String {
    format!("shm://{}", path.display())
}

/// Process memory in use now (resident set), in bytes.
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A raw client: the handshake by hand, then the rings.
fn raw_connect(path: &std::path::Path) -> (ShmChannel, shm::Notifier, UnixStream) {
    let mut sock = UnixStream::connect(path).unwrap();
    sock.write_all(&shm::hello()).unwrap();
    let mut answer = [0u8; 600];
    let (n, fds) = shm::recv_with_fds(&sock, &mut answer).unwrap();
    assert!(matches!(
        shm::parse_answer(&answer[..n]),
        Ok(shm::Answer::Admitted(_))
    ));
    let mut fds = fds.into_iter();
    let region = ShmRegion::open(fds.next().unwrap()).unwrap();
    let notifier = shm::Notifier::new(fds.next().unwrap());
    (ShmChannel::new(region, Side::Client), notifier, sock)
}

fn cmd(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

#[test]
fn commands_batches_and_big_values_work_over_shm() {
    let _shared = MEMORY.read();
    let (server, path) = start("basic", |_| {});
    let mut c = Client::connect(&url(&path)).unwrap();
    assert!(c.is_shm());
    c.ping().unwrap();
    c.set(b"k", b"v").unwrap();
    assert_eq!(c.get(b"k").unwrap(), Some(b"v".to_vec()));
    assert_eq!(c.get(b"missing").unwrap(), None);
    // A batch of 50 is published at once; replies come back in order.
    let replies = c.batch(&vec![cmd(&["INCR", "n"]); 50]).unwrap();
    let want: Vec<Value> = (1..=50).map(Value::Int).collect();
    assert_eq!(replies, want);
    // A value 48 times the rings streams through them in pieces, both ways.
    let big: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i * 7 + i / 4096) as u8)
        .collect();
    c.set(b"big", &big).unwrap();
    assert_eq!(c.get(b"big").unwrap().as_deref(), Some(&big[..]));
    // RESP3 after HELLO 3, and errors as Redis words them.
    match c.call(&[b"HELLO", b"3"]).unwrap() {
        Value::Map(m) => assert!(m.contains(&(Value::Bulk(b"proto".to_vec()), Value::Int(3)))),
        other => panic!("HELLO 3 answered {other:?}"),
    }
    assert_eq!(
        c.call(&[b"INCR", b"k"]).unwrap(),
        Value::Error("ERR value is not an integer or out of range".into())
    );
    // A TCP client sees what the shm client wrote, and CLIENT LIST shows
    // the shm client at the socket's path, as Redis shows Unix sockets.
    let mut tcp = TcpClient::connect(server.addr);
    assert_eq!(tcp.call(&[b"GET", b"n"]), b"$2\r\n50\r\n");
    let list = String::from_utf8(tcp.call(&[b"CLIENT", b"LIST"])).unwrap();
    assert!(
        list.contains(&format!("addr={}:0", path.display())),
        "{list}"
    );
    let info = String::from_utf8(tcp.call(&[b"INFO", b"sluice"])).unwrap();
    assert!(info.contains("shm_clients:1\r\n"), "{info}");
    // GETs answered straight in the ring are counted like any command
    // and any reply bytes.
    let stat = |tcp: &mut TcpClient, name: &str| -> u64 {
        let info = String::from_utf8(tcp.call(&[b"INFO", b"stats"])).unwrap();
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {info}"));
        line.parse().unwrap()
    };
    let commands_before = stat(&mut tcp, "total_commands_processed");
    let output_before = stat(&mut tcp, "total_net_output_bytes");
    c.set(b"v100", &[b'x'; 100]).unwrap();
    let replies = c.batch(&vec![cmd(&["GET", "v100"]); 100]).unwrap();
    assert_eq!(replies, vec![Value::Bulk(vec![b'x'; 100]); 100]);
    // Since the first INFO: the second, the SET, the GETs, the INFO
    // below and the one that counts (each INFO counts itself).
    let _ = stat(&mut tcp, "total_commands_processed");
    assert_eq!(
        stat(&mut tcp, "total_commands_processed") - commands_before,
        1 + 1 + 100 + 1 + 1
    );
    assert!(stat(&mut tcp, "total_net_output_bytes") - output_before >= 100 * 107);
    // QUIT: +OK, then the channel is closed.
    assert_eq!(c.call(&[b"QUIT"]).unwrap(), Value::Status("OK".into()));
    assert!(matches!(c.ping(), Err(Error::Closed)));
}

#[test]
fn auth_is_asked_for_as_on_tcp_and_the_socket_mode_is_set() {
    let _shared = MEMORY.read();
    let (_server, path) = start("auth", |c| {
        c.users = Users::from_pairs(&[("default".to_string(), "secret".to_string())]);
    });
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660);
    let mut c = Client::connect(&url(&path)).unwrap();
    assert_eq!(
        c.call(&[b"GET", b"k"]).unwrap(),
        Value::Error("NOAUTH Authentication required.".into())
    );
    assert!(matches!(c.auth("default", "wrong"), Err(Error::Server(_))));
    c.auth("default", "secret").unwrap();
    c.set(b"k", b"v").unwrap();
}

#[test]
fn clients_past_the_shm_limit_are_refused_with_redis_error() {
    let _shared = MEMORY.read();
    let (_server, path) = start("limit", |c| {
        c.shm.as_mut().unwrap().max_clients = 2;
    });
    let mut a = Client::connect(&url(&path)).unwrap();
    let _b = Client::connect(&url(&path)).unwrap();
    match Client::connect(&url(&path)) {
        Err(Error::Refused(why)) => assert_eq!(why, "ERR max number of clients reached"),
        Err(e) => panic!("refused with {e}"),
        Ok(_) => panic!("a third client was admitted"),
    }
    a.ping().unwrap();
    drop(a);
    // The slot comes back once the server sees the client gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Client::connect(&url(&path)) {
            Ok(mut c) => break c.ping().unwrap(),
            Err(Error::Refused(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_second_server_on_a_live_socket_is_refused_and_a_stale_one_replaced() {
    let _shared = MEMORY.read();
    let (server, path) = start("twice", |_| {});
    let config = ServerConfig {
        shm: Some(ShmSettings::at(&path)),
        ..ServerConfig::default()
    };
    let db = std::sync::Arc::new(sluice_redis::db::Db::open(small_store()).unwrap());
    let err = sluice_server::server::Server::start(
        db,
        ServerConfig {
            resp_addr: "127.0.0.1:0".parse().unwrap(),
            pin_threads: false,
            ..config
        },
    )
    .err()
    .expect("a second server on the same socket");
    assert!(
        err.to_string().contains("already has a server listening"),
        "{err}"
    );
    drop(server);
    // The stopped server removed its socket; a leftover file is replaced.
    std::fs::write(&path, b"stale").unwrap();
    let (_again, path) = start("twice", |_| {});
    Client::connect(&url(&path)).unwrap().ping().unwrap();
}

#[test]
fn clients_that_connect_and_say_nothing_hold_up_no_other_client() {
    // The acceptor read each hello in turn with a 2 s timeout: one silent
    // connection made every client behind it wait.
    let _shared = MEMORY.read();
    let (_server, path) = start("silent", |_| {});
    let silent: Vec<UnixStream> = (0..5)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    // One that trickles its hello, a byte at a time.
    let mut trickle = UnixStream::connect(&path).unwrap();
    trickle.write_all(&shm::hello()[..3]).unwrap();
    let started = Instant::now();
    let mut good = Client::connect(&url(&path)).unwrap();
    good.set(b"k", b"v").unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a client waited {:?} behind silent ones",
        started.elapsed()
    );
    // The trickler finishes its hello and is admitted; the silent ones are
    // dropped after the hello timeout.
    trickle.write_all(&shm::hello()[3..]).unwrap();
    let mut answer = [0u8; 600];
    let (n, fds) = shm::recv_with_fds(&trickle, &mut answer).unwrap();
    assert!(matches!(
        shm::parse_answer(&answer[..n]),
        Ok(shm::Answer::Admitted { .. })
    ));
    assert_eq!(fds.len(), 2);
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 16];
        assert!(
            matches!(std::io::Read::read(&mut s, &mut b), Ok(0)),
            "a silent client was kept"
        );
    }
}

#[test]
fn a_client_of_another_transport_version_is_told_both_versions() {
    let _shared = MEMORY.read();
    let (_server, path) = start("version", |_| {});
    let mut sock = UnixStream::connect(&path).unwrap();
    let mut hello = shm::hello();
    hello[8..12].copy_from_slice(&1u32.to_le_bytes());
    sock.write_all(&hello).unwrap();
    let mut answer = [0u8; 600];
    let (n, fds) = shm::recv_with_fds(&sock, &mut answer).unwrap();
    assert!(fds.is_empty(), "no region for a client that cannot read it");
    match shm::parse_answer(&answer[..n]) {
        Ok(shm::Answer::Refused(text)) => assert_eq!(
            text,
            format!(
                "ERR the client speaks version 1 of the shared-memory transport; this server speaks {}",
                shm::HANDSHAKE_VERSION
            )
        ),
        other => panic!("not a refusal: {other:?}"),
    }
    // The server goes on admitting clients of its own version.
    let mut good = Client::connect(&url(&path)).unwrap();
    good.set(b"k", b"v").unwrap();
}

#[test]
fn bad_frames_and_lying_counters_close_only_that_client() {
    let _shared = MEMORY.read();
    let (server, path) = start("bad", |_| {});
    let mut good = Client::connect(&url(&path)).unwrap();
    // A malformed frame: Redis's protocol error, then the channel closes.
    let mut bad = Client::connect(&url(&path)).unwrap();
    bad.send_raw(b"*1\r\n$x\r\n").unwrap();
    assert_eq!(
        bad.read_reply_raw().unwrap(),
        b"-ERR Protocol error: invalid bulk length\r\n"
    );
    assert!(matches!(bad.read_reply_raw(), Err(Error::Closed)));
    // A client whose first frame claims more bytes than its ring holds:
    // its memfd is a file, so the claim is a plain write of a frame header
    // (lap 1, 1 GiB) at the request ring's start.
    let (liar, _notifier, _sock) = raw_connect(&path);
    let file = std::fs::File::from(liar.region().fd().try_clone_to_owned().unwrap());
    let lie = (1u64 << 32 | 1 << 30).to_ne_bytes();
    std::os::unix::fs::FileExt::write_at(&file, &lie, shm::CONTROL_BYTES as u64).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !liar.closed() {
        assert!(
            Instant::now() < deadline,
            "the server never closed the lying client"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut tcp = TcpClient::connect(server.addr);
    good.set(b"still", b"here").unwrap();
    assert_eq!(tcp.call(&[b"GET", b"still"]), b"$4\r\nhere\r\n");
}

#[test]
fn a_client_that_never_reads_is_held_back_and_memory_stays_bounded() {
    let _alone = MEMORY.write();
    let (_server, path) = start("noread", |_| {});
    let mut c = Client::connect(&url(&path)).unwrap();
    let value = vec![b'v'; 60 << 10];
    c.set(b"big", &value).unwrap();
    // Raw: publish GETs of 60 KiB (64 KiB rings) as long as the request
    // ring takes them, and never read a reply.
    let (mut raw, notifier, _sock) = raw_connect(&path);
    let get = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n";
    let before = rss_bytes();
    let mut published_bytes = 0usize;
    let stream = get.repeat(1000);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let at = published_bytes % stream.len();
        let n = raw.write(&stream[at..]).unwrap();
        notifier.notify();
        if n == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        published_bytes += n;
    }
    // Far more replies were asked for than the server may hold for it...
    let asked_bytes = published_bytes / get.len() * value.len();
    assert!(
        asked_bytes > 64 << 20,
        "only {published_bytes} request bytes went in"
    );
    // ...but it holds about one ring of them, and serves the others.
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "the server grew by {grown} bytes for a client that never reads"
    );
    assert_eq!(c.get(b"big").unwrap().map(|v| v.len()), Some(value.len()));
}

#[test]
fn many_clients_come_and_go_and_the_server_keeps_serving() {
    let _shared = MEMORY.read();
    let (server, path) = start("churn", |_| {});
    let mut tcp = TcpClient::connect(server.addr);
    for round in 0..100 {
        let mut c = Client::connect(&url(&path)).unwrap();
        let key = format!("churn-{round}");
        c.set(key.as_bytes(), b"x").unwrap();
        if round % 3 == 0 {
            // Leave mid-batch: requests published, replies never read.
            c.send_raw(&b"*1\r\n$4\r\nPING\r\n".repeat(100)).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = String::from_utf8(tcp.call(&[b"INFO", b"clients"])).unwrap();
        if info.contains("connected_clients:1\r\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "clients never reclaimed:\n{info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for round in 0..100 {
        let key = format!("churn-{round}");
        assert_eq!(tcp.call(&[b"EXISTS", key.as_bytes()]), b":1\r\n", "{key}");
    }
}

#[test]
fn shutdown_answers_what_was_published_then_closes_the_channel() {
    let _shared = MEMORY.read();
    let (server, path) = start("stop", |_| {});
    let mut c = Client::connect(&url(&path)).unwrap();
    c.set(b"a", b"1").unwrap();
    let store = server.stop();
    assert!(matches!(c.ping(), Err(Error::Closed)));
    assert!(!path.exists(), "the socket file is removed at shutdown");
    drop(store);
}

/// Values bigger than the 64 KiB response ring, read from the memtable and
/// (after a flush) from table blocks, stream into the ring from where the
/// store holds them, in order with the small replies around them; a value
/// overwritten while it streams arrives whole as it was when read.
#[test]
fn big_values_stream_from_the_store_in_order_with_other_replies() {
    let _shared = MEMORY.read();
    let (server, path) = start("stream", |_| {});
    let mut c = Client::connect(&url(&path)).unwrap();
    let pattern = |seed: u32, len: usize| -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
            .collect()
    };
    let a = pattern(1, 200 << 10);
    let b = pattern(2, 300 << 10);
    let check = |c: &mut Client, a: &[u8], b: &[u8]| {
        let replies = c
            .batch(&[
                cmd(&["GET", "a"]),
                cmd(&["GET", "small"]),
                cmd(&["GET", "b"]),
                cmd(&["PING"]),
                cmd(&["GET", "a"]),
                cmd(&["GET", "missing"]),
            ])
            .unwrap();
        assert_eq!(replies.len(), 6);
        assert!(replies[0] == Value::Bulk(a.to_vec()), "first big value");
        assert_eq!(replies[1], Value::Bulk(b"s".to_vec()));
        assert!(replies[2] == Value::Bulk(b.to_vec()), "second big value");
        assert_eq!(replies[3], Value::Status("PONG".into()));
        assert!(replies[4] == Value::Bulk(a.to_vec()), "first again");
        assert_eq!(replies[5], Value::Nil);
    };
    c.set(b"a", &a).unwrap();
    c.set(b"b", &b).unwrap();
    c.set(b"small", b"s").unwrap();
    check(&mut c, &a, &b);
    // From table blocks.
    server.store.flush().unwrap();
    check(&mut c, &a, &b);
    // Overwritten while its reply streams: the reader gets one version whole.
    let a2 = pattern(3, 200 << 10);
    let mut writer = Client::connect(&url(&path)).unwrap();
    c.send_raw(&{
        let mut frames = Vec::new();
        sluice_client::encode(&mut frames, &[b"GET", b"a"]);
        frames
    })
    .unwrap();
    writer.set(b"a", &a2).unwrap();
    let got = c.read_reply().unwrap();
    assert!(
        got == Value::Bulk(a.clone()) || got == Value::Bulk(a2.clone()),
        "a torn value"
    );
    assert_eq!(c.get(b"a").unwrap(), Some(a2));
}
