//! Differential test of the request reader against a real `redis-server`
//! (Debian's, installed by scripts/setup): the same bytes go to Redis and
//! to `RequestReader`; the replies Redis sends must be exactly the replies
//! the framed requests call for (PING and ECHO, whose replies follow from
//! their arguments alone), then the protocol error and the closed
//! connection if there is one. Hand-written cases for every error text and
//! limit, then generated streams (proptest) of well-formed, malformed and
//! cut requests, inline and multibulk, without and with a password. And
//! replies: every RESP3 type Redis sends (DEBUG PROTOCOL, and commands
//! whose replies are maps, sets, doubles, nulls) decodes into a `Reply`
//! that encodes back to Redis's exact bytes in RESP3 and, down-converted,
//! to the exact bytes Redis sends a RESP2 client.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use proptest::prelude::*;
use sluice_server::resp::{Args, Limits, Protocol, Reply, RequestReader};
use sluice_server::session::unknown_command;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const PASSWORD: &str = "sluice-test-password";

struct Redis {
    child: Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_redis(password: Option<&str>) -> Redis {
    let port = free_port();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        // DEBUG PROTOCOL sends one reply of each RESP3 type.
        .args(["--enable-debug-command", "yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(p) = password {
        cmd.args(["--requirepass", p]);
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!("starting redis-server failed ({e}): scripts/setup installs it (apt-get install redis-server)")
    });
    common::end_with_this_process(&child);
    let redis = Redis { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    redis
}

fn open_redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(|| start_redis(None))
}

fn locked_redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(|| start_redis(Some(PASSWORD)))
}

fn bulk(b: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

/// The reply Redis gives a request: PING and ECHO (the commands the cases
/// send) by their arguments; any other name, which a malformed stream can
/// frame, is unknown. Unknown commands and ECHO's arity are checked before
/// authentication, the rest after.
fn reply_to(args: &Args, unauthenticated: bool) -> Vec<u8> {
    let name = args[0].to_ascii_lowercase();
    let wrong_arity = |name: &str| {
        format!("-ERR wrong number of arguments for '{name}' command\r\n").into_bytes()
    };
    match (&name[..], args.len()) {
        (b"ping", _) if unauthenticated => b"-NOAUTH Authentication required.\r\n".to_vec(),
        (b"echo", 2) if unauthenticated => b"-NOAUTH Authentication required.\r\n".to_vec(),
        (b"ping", 1) => b"+PONG\r\n".to_vec(),
        (b"ping", 2) | (b"echo", 2) => bulk(&args[1]),
        (b"ping", _) => wrong_arity("ping"),
        (b"echo", _) => wrong_arity("echo"),
        _ => unknown_command(args).encode(Protocol::Resp2),
    }
}

/// What Redis should send for `input`, and whether it then closes.
fn expected(input: &[u8], unauthenticated: bool) -> (Vec<u8>, bool) {
    let mut reader = RequestReader::new(Limits::default());
    reader.feed(input);
    let mut out = Vec::new();
    loop {
        match reader.next(unauthenticated) {
            Ok(Some(args)) => out.extend(reply_to(&args, unauthenticated)),
            Ok(None) => return (out, false),
            Err(e) => {
                out.extend(e.reply());
                return (out, true);
            }
        }
    }
}

/// Sends `input` to Redis and reads what it answers: until it closes the
/// connection when `closes`, else until `want` bytes came and nothing more
/// follows for a moment.
fn ask_redis(redis: &Redis, input: &[u8], want: usize, closes: bool) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(input).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut closed = false;
    loop {
        let settle = got.len() >= want && !closes;
        s.set_read_timeout(Some(if settle {
            Duration::from_millis(40)
        } else {
            Duration::from_millis(250)
        }))
        .unwrap();
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(_) if settle => break,
            Err(_) if Instant::now() > deadline => break,
            Err(_) => {}
        }
    }
    (got, closed)
}

fn check(redis: &Redis, input: &[u8], unauthenticated: bool) -> Result<(), TestCaseError> {
    let (want, closes) = expected(input, unauthenticated);
    let (got, closed) = ask_redis(redis, input, want.len(), closes);
    prop_assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want),
        "input {:?}",
        String::from_utf8_lossy(input)
    );
    prop_assert_eq!(
        closed,
        closes,
        "closed? input {:?}",
        String::from_utf8_lossy(input)
    );
    Ok(())
}

#[test]
fn every_error_text_and_limit_matches_redis() {
    let long = |prefix: &[u8]| {
        let mut v = prefix.to_vec();
        v.extend(vec![b'1'; 65 * 1024]);
        v
    };
    let cases: Vec<Vec<u8>> = vec![
        b"PING\r\n".to_vec(),
        b"ping\n".to_vec(),
        b"\r\n\r\nPING\r\n".to_vec(),
        b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n".to_vec(),
        b"*0\r\n*-1\r\n*-10\r\nPING\r\n".to_vec(),
        b"*3000000000\r\n".to_vec(),
        b"*01\r\n".to_vec(),
        b"*+1\r\n".to_vec(),
        b"*1x\r\n".to_vec(),
        b"*1\r\nfoo\r\n".to_vec(),
        b"*1\r\n\r\n".to_vec(),
        b"*1\r\n$-1\r\n".to_vec(),
        b"*1\r\n$01\r\n".to_vec(),
        b"*1\r\n$600000000\r\n".to_vec(),
        b"*2\r\n$4\r\nECHO\r\n$3\r\nabcXY".to_vec(),
        b"ECHO \"a\\x41\\n\\tb\" \r\n".to_vec(),
        b"ECHO 'it\\'s'\r\n".to_vec(),
        b"ECHO \"\\a\\b\\r\\q\\x4g\"\r\n".to_vec(),
        b"ECHO \"a\"b\r\n".to_vec(),
        b"ECHO \"unterminated\r\n".to_vec(),
        b"ECHO a\0b\r\n".to_vec(),
        long(b"ECHO "),
        long(b"*"),
        long(b"*1\r\n$"),
    ];
    for input in &cases {
        check(open_redis(), input, false).unwrap();
    }
    // Before AUTH the limits are tighter.
    for input in [
        &b"*11\r\n"[..],
        b"*10\r\n",
        b"*1\r\n$16385\r\n",
        b"*2\r\n$4\r\nPING\r\n$16384\r\n",
        b"PING\r\n",
    ] {
        check(locked_redis(), input, true).unwrap();
    }
}

/// Pieces a generated stream is made of.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    let arg = prop::collection::vec(
        prop::sample::select(b"ab x\"'\\\t\r\n\x0b0159$*-".to_vec()),
        0..8,
    );
    let count = prop_oneof![
        (0i64..4).prop_map(|n| n.to_string()),
        Just("-1".to_string()),
        Just("01".to_string()),
        Just("+2".to_string()),
        Just("".to_string()),
        Just("x".to_string()),
    ];
    prop_oneof![
        // A well-formed multibulk ECHO or PING.
        (prop::bool::ANY, prop::collection::vec(arg.clone(), 0..3)).prop_map(|(echo, args)| {
            let mut all = vec![if echo {
                b"ECHO".to_vec()
            } else {
                b"PING".to_vec()
            }];
            all.extend(args);
            let mut out = format!("*{}\r\n", all.len()).into_bytes();
            for a in all {
                out.extend(bulk(&a));
            }
            out
        }),
        // An inline ECHO with whatever quoting the bytes make.
        arg.clone()
            .prop_map(|a| [b"ECHO ".to_vec(), a, b"\r\n".to_vec()].concat()),
        // Headers of any shape, and a marker that is not '$'.
        count.clone().prop_map(|c| format!("*{c}\r\n").into_bytes()),
        count.prop_map(|c| format!("${c}\r\n").into_bytes()),
        Just(b"#3\r\n".to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A stream of pieces, cut at a random point: Redis and the reader
    /// agree on every reply, the error and whether the connection closes.
    #[test]
    fn generated_streams_get_the_replies_redis_gives(
        pieces in prop::collection::vec(piece(), 1..5),
        cut in 0usize..1000,
        locked in prop::bool::weighted(0.2),
    ) {
        let mut input = pieces.concat();
        input.truncate(input.len().saturating_sub(cut % 4));
        if input.is_empty() {
            return Ok(());
        }
        let redis = if locked { locked_redis() } else { open_redis() };
        check(redis, &input, locked)?;
    }
}

/// Reads whole replies from `s` until `n` have arrived.
fn read_replies(s: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let mut out = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while out.len() < n {
        match Reply::decode(&buf).unwrap() {
            Some((_, used)) => {
                out.push(buf.drain(..used).collect());
                continue;
            }
            None => {
                let k = s.read(&mut chunk).unwrap();
                assert!(k > 0, "redis closed the connection");
                buf.extend_from_slice(&chunk[..k]);
            }
        }
    }
    out
}

fn connection(resp3: bool) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", open_redis().port)).unwrap();
    if resp3 {
        s.write_all(b"HELLO 3\r\n").unwrap();
        read_replies(&mut s, 1);
    }
    s
}

#[test]
fn replies_encode_to_the_bytes_redis_sends_in_resp2_and_resp3() {
    let mut setup = connection(false);
    setup
        .write_all(
            b"DEL h s z l\r\nHSET h f1 v1 f2 v2\r\nSADD s a b c\r\nZADD z 1.5 m 2 n\r\nRPUSH l x y\r\n",
        )
        .unwrap();
    read_replies(&mut setup, 5);
    let commands: Vec<(&str, usize)> = [
        "string", "integer", "double", "bignum", "null", "array", "set", "map", "attrib",
        "verbatim", "true", "false",
    ]
    .iter()
    .map(|t| (*t, 1))
    .collect();
    let mut cases: Vec<(String, usize, bool)> = commands
        .iter()
        .map(|(t, n)| (format!("DEBUG PROTOCOL {t}"), *n, true))
        .collect();
    // A push message is followed by the command's own reply; RESP2
    // clients get an error from this command instead.
    cases.push(("DEBUG PROTOCOL push".into(), 2, false));
    for cmd in [
        "PING",
        "ECHO hi",
        "GET missing",
        "HGETALL h",
        "SMEMBERS s",
        "ZSCORE z m",
        "ZSCORE z n",
        "LRANGE l 0 -1",
        "CONFIG GET maxmemory",
        "EXISTS h",
        "SET k v",
        "INCR h",
        "NOSUCHCOMMAND a",
    ] {
        cases.push((cmd.into(), 1, true));
    }
    let (mut two, mut three) = (connection(false), connection(true));
    for (cmd, replies, compare_resp2) in cases {
        three.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
        let got3 = read_replies(&mut three, replies);
        for bytes in &got3 {
            let (reply, used) = Reply::decode(bytes).unwrap().unwrap();
            assert_eq!(used, bytes.len(), "{cmd}");
            assert_eq!(
                String::from_utf8_lossy(&reply.encode(Protocol::Resp3)),
                String::from_utf8_lossy(bytes),
                "{cmd}: RESP3"
            );
        }
        if !compare_resp2 {
            continue;
        }
        two.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
        let got2 = read_replies(&mut two, 1);
        let (reply, _) = Reply::decode(&got3[0]).unwrap().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&reply.encode(Protocol::Resp2)),
            String::from_utf8_lossy(&got2[0]),
            "{cmd}: RESP2 down-conversion"
        );
    }
}
