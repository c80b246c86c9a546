//! Differential test of the connection commands against a real
//! `redis-server` 7 (one database, as Sluice has; once without a password,
//! once with one): the same commands go to Redis and to a `Session` whose
//! id is the one Redis gives the connection, and every reply must be the
//! same bytes, in whichever protocol the connection speaks by then.
//! Hand-written scripts, then generated ones (proptest).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use proptest::prelude::*;
use sluice_server::resp::{Args, Reply};
use sluice_server::session::{unknown_command, Handled, Session, Users};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const PASSWORD: &str = "pw";

struct Redis {
    child: Child,
    port: u16,
    users: Users,
    /// Connections are made one at a time, so the next client id is known.
    lock: Mutex<()>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(password: Option<&str>) -> Redis {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut users = Vec::new();
    if let Some(p) = password {
        cmd.args(["--requirepass", p]);
        users.push(("default".to_string(), p.to_string()));
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!("starting redis-server failed ({e}): scripts/setup installs it (apt-get install redis-server)")
    });
    common::end_with_this_process(&child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Redis {
        child,
        port,
        users: Users::from_pairs(&users),
        lock: Mutex::new(()),
    }
}

fn open_redis() -> &'static Redis {
    static R: OnceLock<Redis> = OnceLock::new();
    R.get_or_init(|| start(None))
}

fn locked_redis() -> &'static Redis {
    static R: OnceLock<Redis> = OnceLock::new();
    R.get_or_init(|| start(Some(PASSWORD)))
}

fn request(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One reply from Redis, or None if it closed the connection.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 65536];
    loop {
        if let Some((_, used)) = Reply::decode(buf).unwrap() {
            return Some(buf.drain(..used).collect());
        }
        let n = s.read(&mut chunk).unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Runs `script` on Redis and on a Session; the replies must match.
fn compare(redis: &Redis, script: &[Args]) -> Result<(), TestCaseError> {
    let _one_at_a_time = redis.lock.lock().unwrap_or_else(|p| p.into_inner());
    // The id Redis will give the next connection: one more than this one's.
    let mut admin = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    admin
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut abuf = Vec::new();
    if redis.users.clone().default_needs_password() {
        admin
            .write_all(&request(&[b"AUTH".to_vec(), PASSWORD.into()]))
            .unwrap();
        read_reply(&mut admin, &mut abuf).unwrap();
    }
    admin
        .write_all(&request(&[b"CLIENT".to_vec(), b"ID".to_vec()]))
        .unwrap();
    let id = match Reply::decode(&read_reply(&mut admin, &mut abuf).unwrap()).unwrap() {
        Some((Reply::Integer(n), _)) => n as u64 + 1,
        other => panic!("CLIENT ID answered {other:?}"),
    };
    let mut s = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    drop(admin);
    let mut session = Session::new(id, &redis.users);
    let mut buf = Vec::new();
    for args in script {
        s.write_all(&request(args)).unwrap();
        let got = read_reply(&mut s, &mut buf);
        let (ours, closes) = match session.handle(args, &redis.users) {
            Handled::Reply(r) => (r, false),
            Handled::Close(r) => (r, true),
            Handled::Other => (unknown_command(args), false),
        };
        let want = ours.encode(session.protocol());
        let shown: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8_lossy(a).into())
            .collect();
        prop_assert_eq!(
            got.as_deref().map(String::from_utf8_lossy),
            Some(String::from_utf8_lossy(&want)),
            "{:?} (script {:?})",
            shown,
            script
                .iter()
                .map(|a| a
                    .iter()
                    .map(|x| String::from_utf8_lossy(x).into_owned())
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        if closes {
            prop_assert_eq!(read_reply(&mut s, &mut buf), None, "QUIT closes");
            break;
        }
    }
    Ok(())
}

fn script(lines: &[&str]) -> Vec<Args> {
    lines
        .iter()
        .map(|l| sluice_server::resp::split_args(l.as_bytes()).unwrap())
        .collect()
}

#[test]
fn connection_commands_answer_as_redis_does() {
    for s in [
        &[
            "PING",
            "PING hello",
            "PING a b",
            "ECHO",
            "ECHO x y",
            "ECHO hi",
            "HELLO",
            "HELLO 3",
            "PING",
            "ECHO hi",
            "CLIENT GETNAME",
            "HELLO 2 SETNAME conn-1",
            "CLIENT GETNAME",
            "CLIENT ID",
            "CLIENT SETNAME \"a b\"",
            "CLIENT SETNAME",
            "CLIENT",
            "CLIENT FOO bar",
            "CLIENT SETNAME \"\"",
            "CLIENT GETNAME",
            "HELLO 4",
            "HELLO x",
            "HELLO 03",
            "HELLO 3 SETNAME a b",
            "HELLO 3 AUTH default anything",
            "SELECT 0",
            "SELECT 1",
            "SELECT -1",
            "SELECT x",
            "SELECT 99999999999",
            "SELECT",
            "AUTH pw",
            "AUTH u pw",
            "AUTH a b c",
            "AUTH",
            "NOSUCH a b",
            "RESET",
            "CLIENT GETNAME",
            "QUIT",
        ][..],
        &["HELLO 3", "RESET", "PING", "QUIT now"],
    ] {
        compare(open_redis(), &script(s)).unwrap();
    }
    for s in [
        &[
            "PING",
            "ECHO hi",
            "ECHO",
            "SELECT 0",
            "CLIENT ID",
            "CLIENT GETNAME",
            "CLIENT FOO",
            "NOSUCH",
            "HELLO",
            "HELLO 3",
            "HELLO 3 AUTH default wrong",
            "AUTH wrong",
            "AUTH default wrong",
            "HELLO 3 AUTH default pw SETNAME n",
            "PING",
            "CLIENT GETNAME",
            "RESET",
            "PING",
            "AUTH pw",
            "PING",
            "AUTH default pw",
            "QUIT",
        ][..],
        &["HELLO 2 AUTH default pw", "CLIENT ID", "QUIT"],
    ] {
        compare(locked_redis(), &script(s)).unwrap();
    }
}

fn command() -> impl Strategy<Value = Args> {
    let word = prop::sample::select(vec![
        "", "a", "a b", "default", "pw", "x", "2", "3", "4", "0", "1", "-1", "AUTH", "SETNAME",
    ]);
    let words = prop::collection::vec(word, 0..5);
    let name = prop::sample::select(vec![
        "PING", "ECHO", "HELLO", "AUTH", "SELECT", "RESET", "CLIENT", "ping", "hello",
    ]);
    let sub = prop::sample::select(vec!["ID", "GETNAME", "SETNAME", "getname", "NOPE"]);
    prop_oneof![
        (name, words.clone()).prop_map(|(n, w)| {
            std::iter::once(n)
                .chain(w)
                .map(|s| s.as_bytes().to_vec())
                .collect()
        }),
        (sub, words).prop_map(|(s, w)| {
            ["CLIENT", s]
                .into_iter()
                .chain(w)
                .map(|s| s.as_bytes().to_vec())
                .collect()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn generated_scripts_get_the_replies_redis_gives(
        commands in prop::collection::vec(command(), 1..12),
        locked in prop::bool::ANY,
    ) {
        compare(if locked { locked_redis() } else { open_redis() }, &commands)?;
    }
}
