//! `sluice serve` as its users run it: the binary on a device file, used by
//! the real `redis-cli`, `redis-benchmark` and redis-py (unmodified);
//! kill -9 under load with `--durability always` and `everysec`; SIGTERM;
//! ten thousand idle connections.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, stop_with_sigterm, Serve};

/// Starts `sluice serve` on `dir/serve.dev` on loopback.
fn serve(dir: &Path, extra: &[&str]) -> Serve {
    common::serve(dir, "127.0.0.1", extra)
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("redis-cli failed to start ({e}): scripts/setup installs it"));
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn request(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one reply line-ish: enough for +OK, :n, $n payloads.
fn read_simple(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            _ => return None,
        }
    }
    if got[0] == b'$' && got != b"$-1\r\n" {
        let len: usize = std::str::from_utf8(&got[1..got.len() - 2])
            .unwrap()
            .parse()
            .unwrap();
        let mut payload = vec![0u8; len + 2];
        s.read_exact(&mut payload).ok()?;
        got.extend(payload);
    }
    Some(got)
}

/// Reads one whole reply: [`read_simple`]'s, or an array of them.
fn read_reply(s: &mut TcpStream) -> Vec<u8> {
    let mut got = read_simple(s).expect("a reply");
    if got[0] == b'*' {
        let n: i64 = std::str::from_utf8(&got[1..got.len() - 2])
            .unwrap()
            .parse()
            .unwrap();
        for _ in 0..n.max(0) {
            got.extend(read_reply(s));
        }
    }
    got
}

#[test]
fn redis_cli_and_redis_benchmark_work_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &[]);
    let p = s.port;
    assert_eq!(redis_cli(p, &["PING"]), "PONG\n");
    assert_eq!(redis_cli(p, &["SET", "greeting", "hello world"]), "OK\n");
    assert_eq!(redis_cli(p, &["GET", "greeting"]), "hello world\n");
    assert_eq!(redis_cli(p, &["INCRBY", "n", "41"]), "41\n");
    assert_eq!(
        redis_cli(p, &["HSET", "user:1", "name", "ada", "born", "1815"]),
        "2\n"
    );
    assert_eq!(redis_cli(p, &["HGET", "user:1", "born"]), "1815\n");
    assert_eq!(
        redis_cli(p, &["-3", "HGETALL", "user:1"]),
        "name ada\nborn 1815\n",
        "a small hash answers in the order its fields were set, as Redis's"
    );
    assert_eq!(
        redis_cli(p, &["NOSUCH"]),
        "ERR unknown command 'NOSUCH', with args beginning with: \n\n"
    );
    // --pipe: mass insertion from a file of raw requests.
    let mut raw = Vec::new();
    for i in 0..5000 {
        raw.extend(request(&[b"SET", format!("bulk:{i}").as_bytes(), b"v"]));
    }
    let mut pipe = Command::new("redis-cli")
        .args(["-p", &p.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    pipe.stdin.take().unwrap().write_all(&raw).unwrap();
    let out = pipe.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("errors: 0, replies: 5000"),
        "redis-cli --pipe: {text}"
    );
    assert_eq!(redis_cli(p, &["GET", "bulk:4999"]), "v\n");
    // redis-benchmark, as the benchmarks run it but short.
    let bench = Command::new("redis-benchmark")
        .args([
            "-p",
            &p.to_string(),
            "-t",
            "set,get,incr,hset",
            "-n",
            "20000",
            "-c",
            "20",
            "-P",
            "8",
            "-q",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&bench.stdout);
    assert!(bench.status.success(), "redis-benchmark: {text}");
    for test in ["SET", "GET", "INCR", "HSET"] {
        assert!(
            text.contains(&format!("{test}: ")),
            "no {test} result: {text}"
        );
    }
    assert!(
        !text.to_lowercase().contains("error"),
        "redis-benchmark saw errors: {text}"
    );
}

/// This checkout's redis-py connection over the shared-memory rings
/// (python/sluice/shm.py), loaded from its file as `sluice_shm` before a
/// script runs: it needs redis-py only, not the package's compiled part,
/// and the test runs this checkout's, not whatever package is installed.
const LOAD_SLUICE_SHM: &str = r#"
import importlib.util, os
_spec = importlib.util.spec_from_file_location("sluice_shm", os.environ["SLUICE_SHM_PY"])
sluice_shm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sluice_shm)
"#;

fn sluice_shm_py() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/sluice/shm.py")
}

/// Runs a redis-py script against `target`: a port, or `shm:PATH`.
fn python_ok(script: &str, target: &str) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!("{LOAD_SLUICE_SHM}{script}"))
        .arg(target)
        .env("SLUICE_SHM_PY", sluice_shm_py())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "redis-py script failed (scripts/setup installs redis-py):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const REDIS_PY: &str = r#"
import sys, time, redis
target = sys.argv[1]
def connect(protocol):
    if target.startswith("shm:"):
        pool = sluice_shm.shm_pool(target[4:], protocol=protocol, decode_responses=True)
        return redis.Redis(connection_pool=pool)
    return redis.Redis(port=int(target), protocol=protocol, decode_responses=True)
for protocol in (2, 3):
    r = connect(protocol)
    r.flushdb()
    assert r.ping()
    assert r.set("a", "1") and r.get("a") == "1"
    assert r.set("a", "2", nx=True) is None
    assert r.set("e", "x", ex=100) and 99 <= r.ttl("e") <= 100
    assert r.incr("n") == 1 and r.incrbyfloat("f", 1.5) == 1.5
    assert r.mset({"m1": "x", "m2": "y"}) and r.mget("m1", "m2", "zz") == ["x", "y", None]
    assert r.hset("h", mapping={"f1": "1", "f2": "2"}) == 2
    assert r.hgetall("h") == {"f1": "1", "f2": "2"}, r.hgetall("h")
    assert r.hincrby("h", "f1", 5) == 6
    assert sorted(r.keys("*")) == ["a", "e", "f", "h", "m1", "m2", "n"], r.keys("*")
    assert sorted(r.scan_iter(match="m*")) == ["m1", "m2"]
    assert r.type("h") == "hash" and r.exists("a", "h", "nope") == 2
    try:
        r.incr("h")
        raise SystemExit("INCR on a hash did not fail")
    except redis.ResponseError as e:
        assert str(e).startswith("WRONGTYPE"), e
    # A pipeline without a transaction, then one with (MULTI/EXEC).
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.set(f"p{i}", i)
    assert all(p.execute())
    p = r.pipeline()
    p.incr("counter").incr("counter").get("counter")
    assert p.execute() == [1, 2, "2"]
    # WATCH: a concurrent change aborts the transaction.
    other = connect(protocol)
    with r.pipeline() as p:
        p.watch("w")
        other.set("w", "changed")
        p.multi()
        p.set("w", "mine")
        try:
            p.execute()
            raise SystemExit("EXEC ran although a watched key changed")
        except redis.WatchError:
            pass
    assert r.get("w") == "changed"
    r.client_setname("tester")
    assert r.client_getname() == "tester"
    info = r.info("sluice")
    assert info["group_commits"] >= 1, info
print("redis-py ok")
"#;

#[test]
fn redis_py_in_resp2_and_resp3() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &[]);
    python_ok(REDIS_PY, &s.port.to_string());
}

/// The same redis-py script, unmodified but for its connection pool, over
/// the shared-memory rings (python/sluice/shm.py), plus big values that
/// stream through the rings in pieces.
#[test]
fn redis_py_over_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("shm.sock");
    let s = serve(
        dir.path(),
        &["--shm", sock.to_str().unwrap(), "--shm-ring-kib", "64"],
    );
    let target = format!("shm:{}", sock.display());
    python_ok(REDIS_PY, &target);
    python_ok(
        r#"
import sys, redis
r = redis.Redis(connection_pool=sluice_shm.shm_pool(sys.argv[1][4:]))
big = bytes(range(256)) * (12 << 10)
assert r.set("big", big) and r.get("big") == big
assert r.client_list()[0]["addr"].endswith("shm.sock:0"), r.client_list()
"#,
        &target,
    );
    // A TCP client sees the same data.
    assert_eq!(redis_cli(s.port, &["GET", "counter"]), "2\n");
}

/// Shared-memory clients killed with SIGKILL in the middle of pipelined
/// batches: every SET a client saw acknowledged is there, the server frees
/// their rings and keeps serving, and its memory stays bounded.
#[test]
fn shm_clients_killed_mid_batch_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("shm.sock");
    let s = serve(dir.path(), &["--shm", sock.to_str().unwrap()]);
    let writer = r#"
import sys, redis
r = redis.Redis(connection_pool=sluice_shm.shm_pool(sys.argv[1]))
name, i = sys.argv[2], 0
while True:
    p = r.pipeline(transaction=False)
    for j in range(50):
        p.set(f"{name}:{i + j}", "v" * 100)
    assert all(p.execute())
    print(f"{name}:{i + 49}", flush=True)
    i += 50
"#;
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap()
            .to_string();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let mut rss_after_first = 0;
    for round in 0..6 {
        let name = format!("w{round}");
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(format!("{LOAD_SLUICE_SHM}{writer}"))
            .args([sock.to_str().unwrap(), &name])
            .env("SLUICE_SHM_PY", sluice_shm_py())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut last = String::new();
        let mut line = String::new();
        // Let it write a while, then kill it mid-flight.
        while last.is_empty() || !last.ends_with(":2049") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "writer {name} died");
            last = line.trim().to_string();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        if let Some(l) = rest.lines().last() {
            last = l.to_string();
        }
        let acked: usize = last.rsplit(':').next().unwrap().parse().unwrap();
        for i in (0..=acked).step_by(7).chain([acked]) {
            assert_eq!(
                redis_cli(s.port, &["EXISTS", &format!("{name}:{i}")]),
                "1\n",
                "{name}:{i}"
            );
        }
        if round == 0 {
            rss_after_first = rss();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis_cli(s.port, &["INFO", "clients"]).contains("connected_clients:1\r") {
        assert!(
            Instant::now() < deadline,
            "the killed clients were never reclaimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let grown = rss().saturating_sub(rss_after_first);
    assert!(
        grown < 64 << 20,
        "the server grew {grown} bytes over five killed clients"
    );
}

/// Writers that record each acknowledged SET with when it was acknowledged.
fn load(port: u16, stop: &Arc<AtomicBool>) -> Arc<Mutex<Vec<(String, Instant)>>> {
    let acked = Arc::new(Mutex::new(Vec::new()));
    for t in 0..4 {
        let (stop, acked) = (stop.clone(), acked.clone());
        std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                return;
            };
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let key = format!("k{t}-{i}");
                if s.write_all(&request(&[b"SET", key.as_bytes(), key.as_bytes()]))
                    .is_err()
                {
                    return;
                }
                match read_simple(&mut s) {
                    Some(r) if r == b"+OK\r\n" => acked.lock().unwrap().push((key, Instant::now())),
                    _ => return,
                }
            }
        });
    }
    acked
}

fn kill_9_under_load(durability: &str, keep_older_than: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path(), &["--durability", durability]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = load(s.port, &stop);
    std::thread::sleep(Duration::from_millis(2500));
    // SIGKILL: no shutdown path runs.
    s.child.kill().unwrap();
    let killed_at = Instant::now();
    s.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "only {} writes were acknowledged",
        acked.len()
    );
    let s = serve(dir.path(), &[]);
    let persistence = redis_cli(s.port, &["INFO", "persistence"]);
    if durability == "everysec" {
        // Answered before their log block reached the device: the last
        // writes come back from the log mirror in /dev/shm.
        let replayed = info_field(&persistence, "sluice_log_mirror_replayed_records");
        assert!(
            replayed > 0,
            "nothing replayed from the log mirror: {persistence}"
        );
    }
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut checked = 0;
    for (key, at) in &acked {
        if killed_at.duration_since(*at) < keep_older_than {
            continue;
        }
        c.write_all(&request(&[b"GET", key.as_bytes()])).unwrap();
        let want = format!("${}\r\n{key}\r\n", key.len()).into_bytes();
        assert_eq!(
            read_simple(&mut c).unwrap(),
            want,
            "acknowledged {key} lost after kill -9 ({durability})"
        );
        checked += 1;
    }
    assert!(
        checked > 50,
        "only {checked} writes were old enough to check"
    );
}

/// The number an INFO field gives.
fn info_field(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .trim()
        .parse()
        .unwrap()
}

/// What the collection writers of [`kill_9_in_list_and_set_writes`] had
/// acknowledged: pushes (each of three items, with a set add of two) and
/// moves, per writer.
#[derive(Default)]
struct CollectionAcks {
    pushed: Vec<u64>,
    moved: u64,
}

fn collection_writer(port: u16, t: usize, stop: Arc<AtomicBool>, acks: Arc<Mutex<CollectionAcks>>) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    for i in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let (q, set) = (format!("q{t}"), format!("s{t}"));
        let items: Vec<String> = ["a", "b", "c"].iter().map(|x| format!("{i}-{x}")).collect();
        let push = request(&[
            b"RPUSH",
            q.as_bytes(),
            items[0].as_bytes(),
            items[1].as_bytes(),
            items[2].as_bytes(),
        ]);
        let add = request(&[
            b"SADD",
            set.as_bytes(),
            items[0].as_bytes(),
            items[1].as_bytes(),
        ]);
        for (step, req) in [push, add].iter().enumerate() {
            if s.write_all(req).is_err() {
                return;
            }
            match read_simple(&mut s) {
                Some(r) if r.starts_with(b":") => {
                    if step == 1 {
                        acks.lock().unwrap().pushed.push(i);
                    }
                }
                _ => return,
            }
        }
        if i % 3 == 0 {
            let moved = format!("m{t}");
            let req = request(&[b"LMOVE", q.as_bytes(), moved.as_bytes(), b"LEFT", b"RIGHT"]);
            if s.write_all(&req).is_err() {
                return;
            }
            match read_simple(&mut s) {
                Some(r) if r.starts_with(b"$") => acks.lock().unwrap().moved += 1,
                _ => return,
            }
        }
    }
}

fn lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// kill -9 with `--durability always` in the middle of list and set
/// writes: each acknowledged RPUSH of three items, SADD of two and LMOVE
/// is there whole after the restart, nothing is there in part or twice,
/// and every collection's size agrees with its members.
#[test]
fn kill_9_in_list_and_set_writes_keeps_every_acknowledged_change_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (s, acks) = kill_9_under_writers::<CollectionAcks>(dir.path(), collection_writer);
    for (t, a) in acks.iter().enumerate() {
        let a = a.lock().unwrap();
        assert!(
            a.pushed.len() > 50,
            "writer {t}: only {} pushes acknowledged",
            a.pushed.len()
        );
        let q = lines(&redis_cli(s.port, &["LRANGE", &format!("q{t}"), "0", "-1"]));
        let m = lines(&redis_cli(s.port, &["LRANGE", &format!("m{t}"), "0", "-1"]));
        let members = lines(&redis_cli(s.port, &["SMEMBERS", &format!("s{t}")]));
        let len = |cmd: &str, key: String| {
            redis_cli(s.port, &[cmd, &key])
                .trim()
                .parse::<usize>()
                .unwrap()
        };
        assert_eq!(len("LLEN", format!("q{t}")), q.len(), "q{t}'s length");
        assert_eq!(len("LLEN", format!("m{t}")), m.len(), "m{t}'s length");
        assert_eq!(len("SCARD", format!("s{t}")), members.len(), "s{t}'s size");
        assert!(
            m.len() as u64 >= a.moved,
            "writer {t}: {} moves acknowledged, {} moved",
            a.moved,
            m.len()
        );
        // The moved items then the list are the pushes in order, each
        // push's three items together.
        let all: Vec<String> = m.iter().chain(q.iter()).cloned().collect();
        assert_eq!(all.len() % 3, 0, "writer {t}: a push survived in part");
        let pushes = all.len() / 3;
        assert!(
            pushes >= a.pushed.len(),
            "writer {t}: {} pushes acknowledged, {pushes} found",
            a.pushed.len()
        );
        for (i, item) in all.iter().enumerate() {
            let want = format!("{}-{}", i / 3, ["a", "b", "c"][i % 3]);
            assert_eq!(item, &want, "writer {t}: item {i}");
        }
        // Each acknowledged SADD is whole; an unacknowledged one is whole
        // or absent.
        let mut sorted = members.clone();
        sorted.sort();
        for i in &a.pushed {
            for x in ["a", "b"] {
                assert!(
                    sorted.binary_search(&format!("{i}-{x}")).is_ok(),
                    "writer {t}: {i}-{x} lost"
                );
            }
        }
        assert_eq!(members.len() % 2, 0, "writer {t}: a SADD survived in part");
    }
}

/// What a pipelining writer had acknowledged: pushes (by number) and
/// increments.
#[derive(Default)]
struct PipelinedAcks {
    pushed: u64,
    counted: i64,
    /// RPUSH replies that were not the length the pushes so far make.
    wrong_lengths: u64,
}

/// Rounds of 16 `RPUSH p<t> <n>` then 16 `INCR c<t>`, each round in one
/// write (a serving thread runs each run of one kind as one group).
fn pipelined_writer(port: u16, t: usize, stop: Arc<AtomicBool>, acks: Arc<Mutex<PipelinedAcks>>) {
    const RUN: u64 = 16;
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let (list, counter) = (format!("p{t}"), format!("c{t}"));
    for round in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut bytes = Vec::new();
        for n in round * RUN..(round + 1) * RUN {
            bytes.extend(request(&[
                b"RPUSH",
                list.as_bytes(),
                n.to_string().as_bytes(),
            ]));
        }
        for _ in 0..RUN {
            bytes.extend(request(&[b"INCR", counter.as_bytes()]));
        }
        if s.write_all(&bytes).is_err() {
            return;
        }
        for step in 0..2 * RUN {
            let Some(reply) = read_simple(&mut s).filter(|r| r.starts_with(b":")) else {
                return;
            };
            let value: i64 = std::str::from_utf8(&reply[1..reply.len() - 2])
                .unwrap()
                .parse()
                .unwrap();
            let mut a = acks.lock().unwrap();
            if step < RUN {
                if value as u64 != round * RUN + step + 1 {
                    a.wrong_lengths += 1;
                }
                a.pushed = value as u64;
            } else {
                a.counted = value;
            }
        }
    }
}

/// kill -9 with `--durability always` in the middle of pipelined pushes
/// and increments (run in groups, each group one batch): after the
/// restart every acknowledged push is there, in order, with nothing in
/// between, and the counter holds at least every acknowledged increment.
#[test]
fn kill_9_in_pipelined_writes_keeps_every_acknowledged_one() {
    let dir = tempfile::tempdir().unwrap();
    let (s, acks) = kill_9_under_writers::<PipelinedAcks>(dir.path(), pipelined_writer);
    for (t, a) in acks.iter().enumerate() {
        let a = a.lock().unwrap();
        assert!(
            a.pushed > 100,
            "writer {t}: only {} pushes acknowledged",
            a.pushed
        );
        assert_eq!(
            a.wrong_lengths, 0,
            "writer {t}: RPUSH answered lengths out of order"
        );
        let items = lines(&redis_cli(s.port, &["LRANGE", &format!("p{t}"), "0", "-1"]));
        assert!(
            items.len() as u64 >= a.pushed,
            "writer {t}: {} pushes acknowledged, {} found",
            a.pushed,
            items.len()
        );
        for (i, item) in items.iter().enumerate() {
            assert_eq!(item, &i.to_string(), "writer {t}: item {i}");
        }
        let counter = redis_cli(s.port, &["GET", &format!("c{t}")]);
        let counter: i64 = counter.trim().parse().unwrap_or(0);
        assert!(
            counter >= a.counted,
            "writer {t}: {} increments acknowledged, counter {counter}",
            a.counted
        );
    }
}

/// A writer thread's acknowledgements.
type Acks<A> = Arc<Mutex<A>>;

/// Two `writer` threads against `sluice serve --durability always` in
/// `dir`, the server killed with SIGKILL after 2.5 s, then started again:
/// the restarted server and what each writer saw acknowledged.
fn kill_9_under_writers<A: Default + Send + 'static>(
    dir: &Path,
    writer: fn(u16, usize, Arc<AtomicBool>, Acks<A>),
) -> (Serve, Vec<Acks<A>>) {
    let mut s = serve(dir, &["--durability", "always"]);
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Vec<Acks<A>> = (0..2).map(|_| Arc::default()).collect();
    for (t, a) in acks.iter().enumerate() {
        let (port, stop, a) = (s.port, stop.clone(), a.clone());
        std::thread::spawn(move || writer(port, t, stop, a));
    }
    std::thread::sleep(Duration::from_millis(2500));
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    (serve(dir, &[]), acks)
}

/// One writer of scripts: each EVAL adds member `i` to a sorted set,
/// entry `i` to a stream and one to a counter; the acknowledged `i`s.
fn script_writer(port: u16, t: usize, stop: Arc<AtomicBool>, acks: Arc<Mutex<Vec<u64>>>) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let script = b"redis.call('ZADD', KEYS[1], ARGV[1], 'm' .. ARGV[1]) \
        redis.call('XADD', KEYS[2], ARGV[1] .. '-1', 'i', ARGV[1]) \
        return redis.call('INCR', KEYS[3])";
    let keys = [format!("z{t}"), format!("x{t}"), format!("n{t}")];
    for i in 1u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let i_text = i.to_string();
        let req = request(&[
            b"EVAL",
            script,
            b"3",
            keys[0].as_bytes(),
            keys[1].as_bytes(),
            keys[2].as_bytes(),
            i_text.as_bytes(),
        ]);
        if s.write_all(&req).is_err() {
            return;
        }
        match read_simple(&mut s) {
            Some(r) if r.starts_with(b":") => acks.lock().unwrap().push(i),
            _ => return,
        }
    }
}

/// kill -9 with `--durability always` in the middle of scripts that write
/// a sorted set, a stream and a counter: after the restart each
/// acknowledged script's three writes are there, and no script's writes
/// are there in part (the three agree on how many ran).
#[test]
fn kill_9_in_script_writes_keeps_every_acknowledged_script_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (s, acks) = kill_9_under_writers::<Vec<u64>>(dir.path(), script_writer);
    for (t, a) in acks.iter().enumerate() {
        let acked = a.lock().unwrap().clone();
        assert!(
            acked.len() > 20,
            "writer {t}: only {} scripts acknowledged",
            acked.len()
        );
        let count = |args: &[&str]| redis_cli(s.port, args).trim().parse::<u64>().unwrap();
        let members = count(&["ZCARD", &format!("z{t}")]);
        let entries = count(&["XLEN", &format!("x{t}")]);
        let counter = count(&["GET", &format!("n{t}")]);
        assert_eq!(members, entries, "writer {t}: a script survived in part");
        assert_eq!(members, counter, "writer {t}: a script survived in part");
        assert!(
            members >= acked.len() as u64,
            "writer {t}: {} scripts acknowledged, {members} found",
            acked.len()
        );
        // Scripts ran in order: the first `members` of them, each whole.
        let last = format!("m{members}");
        assert_eq!(
            redis_cli(s.port, &["ZSCORE", &format!("z{t}"), &last]).trim(),
            members.to_string(),
            "writer {t}: the last script's member"
        );
        let tail = lines(&redis_cli(
            s.port,
            &["XREVRANGE", &format!("x{t}"), "+", "-", "COUNT", "1"],
        ));
        assert_eq!(
            tail.first().map(String::as_str),
            Some(&format!("{members}-1")[..])
        );
    }
}

#[test]
fn kill_9_with_always_loses_no_acknowledged_write() {
    kill_9_under_load("always", Duration::ZERO);
}

#[test]
fn kill_9_with_everysec_loses_no_acknowledged_write() {
    // As Redis's appendfsync everysec: a reply goes out once its write is
    // on the device, so the process's death loses nothing acknowledged
    // (only a power cut may take the last second). It lost the last
    // fraction of a second before.
    kill_9_under_load("everysec", Duration::ZERO);
}

/// A device filled by SETs: they are answered `-MISCONF` (never left
/// waiting), reads and deletes go on, FLUSHALL brings the room back and
/// writes resume, SIGTERM stops the server, and after a restart exactly
/// what was acknowledged is there.
#[test]
fn a_full_device_answers_misconf_takes_deletes_and_resumes_once_room_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--create-mib",
        "64",
        "--write-buffer-mib",
        "4",
        "--table-mib",
        "4",
    ];
    let s = serve(dir.path(), &args);
    let mut c = patient_client(s.port);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let value = vec![b'v'; 16 << 10];
    let started = Instant::now();
    let mut acknowledged = 0u32;
    let refusal = loop {
        // 32 SETs a round trip.
        let mut out = Vec::new();
        for i in acknowledged..acknowledged + 32 {
            out.extend(request(&[b"SET", format!("k{i:06}").as_bytes(), &value]));
        }
        c.write_all(&out).unwrap();
        let mut refused = None;
        for _ in 0..32 {
            let reply = read_simple(&mut c).expect("a reply within 30 s, not a write left waiting");
            match (&refused, reply.as_slice()) {
                (None, b"+OK\r\n") => acknowledged += 1,
                (None, _) => refused = Some(String::from_utf8_lossy(&reply).into_owned()),
                (Some(_), _) => {}
            }
        }
        if let Some(r) = refused {
            break r;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no refusal after {acknowledged} SETs of 16 KiB on a 64 MiB device"
        );
    };
    assert!(
        refusal.starts_with("-MISCONF Errors writing to the device: device nearly full"),
        "{refusal}"
    );
    assert!(acknowledged > 500, "{acknowledged} SETs before the refusal");
    let persistence = redis_cli(s.port, &["INFO", "persistence"]);
    assert!(
        persistence.contains("aof_last_write_status:err\r\n"),
        "{persistence}"
    );
    // Reads and deletes go on.
    c.write_all(&request(&[b"GET", b"k000000"])).unwrap();
    assert_eq!(read_reply(&mut c).len(), (16 << 10) + 10);
    c.write_all(&request(&[b"DEL", b"k000000"])).unwrap();
    assert_eq!(read_reply(&mut c), b":1\r\n");
    c.write_all(&request(&[b"FLUSHALL"])).unwrap();
    assert_eq!(read_reply(&mut c), b"+OK\r\n");
    let flushed = Instant::now();
    let resumed = loop {
        c.write_all(&request(&[b"SET", b"after", b"room"])).unwrap();
        let reply = read_reply(&mut c);
        if reply == b"+OK\r\n" {
            break flushed.elapsed();
        }
        assert!(
            reply.starts_with(b"-MISCONF"),
            "{:?}",
            String::from_utf8_lossy(&reply)
        );
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "writes did not resume after FLUSHALL"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{acknowledged} SETs, then MISCONF; writes resumed {resumed:?} after FLUSHALL");
    let persistence = redis_cli(s.port, &["INFO", "persistence"]);
    assert!(
        persistence.contains("aof_last_write_status:ok\r\n"),
        "{persistence}"
    );
    for i in 0..100 {
        c.write_all(&request(&[b"SET", format!("post{i}").as_bytes(), &value]))
            .unwrap();
        assert_eq!(read_reply(&mut c), b"+OK\r\n");
    }
    drop(c);
    stop_with_sigterm(s);
    let s = serve(dir.path(), &args);
    assert_eq!(redis_cli(s.port, &["DBSIZE"]), "101\n");
    assert_eq!(redis_cli(s.port, &["GET", "after"]), "room\n");
    assert_eq!(redis_cli(s.port, &["STRLEN", "post99"]), "16384\n");
}

#[test]
fn the_first_start_makes_the_devices_directory() {
    // As on a fresh checkout: `--device data/serve.dev` with no data/ yet.
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("data").join("serve");
    let s = serve(&nested, &[]);
    assert_eq!(redis_cli(s.port, &["SET", "k", "v"]), "OK\n");
    stop_with_sigterm(s);
    assert!(nested.join("serve.dev").is_file());
    let s = serve(&nested, &[]);
    assert_eq!(redis_cli(s.port, &["GET", "k"]), "v\n");
    stop_with_sigterm(s);
}

#[test]
fn sigterm_stops_gracefully_and_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &["--durability", "none"]);
    for i in 0..200 {
        assert_eq!(redis_cli(s.port, &["SET", &format!("t{i}"), "v"]), "OK\n");
    }
    assert_eq!(redis_cli(s.port, &["SET", "t0", "v", "EX", "1000"]), "OK\n");
    assert_eq!(redis_cli(s.port, &["HSET", "h", "f", "1"]), "1\n");
    assert_eq!(redis_cli(s.port, &["EXPIRE", "h", "2000"]), "1\n");
    stop_with_sigterm(s);
    let s = serve(dir.path(), &[]);
    assert_eq!(redis_cli(s.port, &["GET", "t199"]), "v\n");
    assert_eq!(redis_cli(s.port, &["DBSIZE"]), "201\n");
    // TTLs survive the restart.
    let ttl: i64 = redis_cli(s.port, &["TTL", "t0"]).trim().parse().unwrap();
    assert!((990..=1000).contains(&ttl), "TTL after restart: {ttl}");
    let ttl: i64 = redis_cli(s.port, &["TTL", "h"]).trim().parse().unwrap();
    assert!(
        (1990..=2000).contains(&ttl),
        "hash TTL after restart: {ttl}"
    );
    assert_eq!(redis_cli(s.port, &["HGET", "h", "f"]), "1\n");
}

#[test]
fn ten_thousand_idle_connections_and_the_server_still_serves() {
    // This process holds one end of every connection.
    let limit = sluice_io::net::raise_fd_limit(10_500).unwrap();
    assert!(
        limit >= 10_300,
        "the open-file hard limit here is {limit}: raise it to run this test"
    );
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &["--max-clients", "10100"]);
    let mut idle = Vec::new();
    for _ in 0..10_000 {
        idle.push(TcpStream::connect(("127.0.0.1", s.port)).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = redis_cli(s.port, &["INFO", "clients"]);
        let connected: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if connected >= 10_001 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {connected} clients connected"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(redis_cli(s.port, &["SET", "busy", "yes"]), "OK\n");
    assert_eq!(redis_cli(s.port, &["GET", "busy"]), "yes\n");
    drop(idle);
    assert_eq!(redis_cli(s.port, &["PING"]), "PONG\n");
}

/// A self-signed certificate for 127.0.0.1, made with openssl.
fn certificate(dir: &Path) -> (String, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ])
        .args([
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ])
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("openssl failed to start ({e}): scripts/setup installs it"));
    assert!(made.success());
    (
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    )
}

#[test]
fn tls_with_redis_cli_redis_py_and_redis_benchmark() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let tls_port = free_port();
    let tls_addr = format!("127.0.0.1:{tls_port}");
    let s = serve(
        dir.path(),
        &[
            "--resp-tls",
            &tls_addr,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let tls_cli = |args: &[&str]| {
        let mut all = vec!["--tls", "--cacert", &cert];
        all.extend_from_slice(args);
        redis_cli(tls_port, &all)
    };
    assert_eq!(tls_cli(&["PING"]), "PONG\n");
    assert_eq!(tls_cli(&["SET", "secret", "kept"]), "OK\n");
    // The same store behind both listeners.
    assert_eq!(redis_cli(s.port, &["GET", "secret"]), "kept\n");
    let script = format!(
        r#"
import sys, redis
r = redis.Redis(port=int(sys.argv[1]), ssl=True, ssl_ca_certs={cert:?}, protocol=3)
big = b"x" * 300000
assert r.set("big", big) and r.get("big") == big
p = r.pipeline()
for i in range(500):
    p.incr("n")
assert p.execute()[-1] == 500
print("ok")
"#
    );
    python_ok(&script, &tls_port.to_string());
    let bench = Command::new("redis-benchmark")
        .args(["--tls", "--cacert", &cert, "-p", &tls_port.to_string()])
        .args(["-t", "set,get", "-n", "5000", "-c", "10", "-P", "4", "-q"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&bench.stdout);
    assert!(bench.status.success() && text.contains("GET: "), "{text}");
    // A client speaking plaintext to the TLS port is dropped; the server serves on.
    let mut plain = TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    plain.write_all(&request(&[b"PING"])).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"+PONG"),
        "plaintext got an answer on the TLS port"
    );
    assert_eq!(tls_cli(&["GET", "secret"]), "kept\n");
}

#[test]
fn tls_flags_are_checked_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", dir.path().join("s.dev").to_str().unwrap()])
        .args(["--resp", "127.0.0.1:0", "--resp-tls", "127.0.0.1:0"])
        .args([
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
    assert!(
        !dir.path().join("s.dev").exists(),
        "a device was made for a server that could not start"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", dir.path().join("s.dev").to_str().unwrap()])
        .args(["--resp", "127.0.0.1:0", "--resp-tls", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--tls-cert"), "{err}");
}

/// The scheduling policy (`/proc/PID/task/TID/stat` field 41) of each of
/// the process's threads, by name.
fn thread_policies(pid: u32) -> Vec<(String, i32)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (head, rest) = stat.rsplit_once(')').unwrap();
        let name = head.split_once('(').unwrap().1.to_string();
        // Fields after the name start at field 3.
        let policy = rest
            .split_whitespace()
            .nth(41 - 3)
            .unwrap()
            .parse()
            .unwrap();
        threads.push((name, policy));
    }
    threads
}

/// Waits until every thread named in `names` is there and has `policy`.
fn wait_for_policies(pid: u32, names: &[&str], policy: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let threads = thread_policies(pid);
        let ok = names
            .iter()
            .all(|n| threads.iter().any(|(t, p)| t == n && *p == policy));
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "want {names:?} at policy {policy}: {threads:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn background_threads_run_at_idle_cpu_priority_and_workers_do_not() {
    const SCHED_OTHER: i32 = 0;
    const SCHED_IDLE: i32 = 5;
    let dir = tempfile::tempdir().unwrap();
    // `always` (the default): the write below outlives the kill.
    let s = serve(dir.path(), &[]);
    let pid = s.child.id();
    wait_for_policies(pid, &["sluice-compacti", "sluice-expire"], SCHED_IDLE);
    let threads = thread_policies(pid);
    for (name, policy) in &threads {
        if name.starts_with("sluice-serve") {
            assert_eq!(*policy, SCHED_OTHER, "{threads:?}");
        }
    }
    assert!(
        threads.iter().any(|(n, _)| n.starts_with("sluice-serve")),
        "{threads:?}"
    );
    assert_eq!(redis_cli(s.port, &["SET", "k", "v"]), "OK\n");
    drop(s);
    let s = serve(dir.path(), &["--background-cpu", "normal"]);
    wait_for_policies(
        s.child.id(),
        &["sluice-compacti", "sluice-expire"],
        SCHED_OTHER,
    );
    assert_eq!(redis_cli(s.port, &["GET", "k"]), "v\n");
}

/// A plain connection that waits up to a minute for a reply (cold reads
/// under load).
fn patient_client(port: u16) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c
}

fn sluice_info(port: u16, field: &str) -> u64 {
    let info = redis_cli(port, &["INFO", "sluice"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO sluice: {info}"))
        .trim()
        .parse()
        .unwrap()
}

/// A server whose data soon outgrows its memtable and 1 MiB block cache:
/// after a restart, reads go to the device.
const SMALL_CACHES: [&str; 8] = [
    "--durability",
    "none",
    "--write-buffer-mib",
    "1",
    "--table-mib",
    "1",
    "--block-cache-mib",
    "1",
];

/// GETs whose data is on the device only (a block cache of 1 MiB, data
/// several times that, a restart before reading) leave their reads to the
/// worker's fill queue: pipelined GETs and SETs on many connections get
/// their own answers in order, a client that leaves with GETs waiting
/// breaks nothing, and the reads were queued, not waited for.
#[test]
fn gets_that_read_the_device_wait_off_the_worker_and_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let value = |i: u32| format!("value-{i:06}-{}", "v".repeat(90)).into_bytes();
    let keys = 30_000u32;
    {
        let s = serve(dir.path(), &SMALL_CACHES);
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
            let mut batch = Vec::new();
            for &i in chunk {
                batch.extend(request(&[b"SET", format!("k{i}").as_bytes(), &value(i)]));
            }
            c.write_all(&batch).unwrap();
            for _ in chunk {
                assert_eq!(read_simple(&mut c).unwrap(), b"+OK\r\n");
            }
        }
        assert!(sluice_info(s.port, "memtable_flushes") >= 1);
        stop_with_sigterm(s);
    }
    // Cold caches: the tables' blocks are on the device only.
    let s = serve(dir.path(), &SMALL_CACHES);
    let port = s.port;
    let mut clients = Vec::new();
    for t in 0..6u32 {
        clients.push(std::thread::spawn(move || {
            let mut c = patient_client(port);
            let mut rng = t * 7919 + 1;
            for round in 0..40u32 {
                let mut batch = Vec::new();
                let mut want: Vec<Vec<u8>> = Vec::new();
                for j in 0..50u32 {
                    rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    let i = (rng >> 8) % (keys + keys / 10); // a tenth absent
                    batch.extend(request(&[b"GET", format!("k{i}").as_bytes()]));
                    want.push(if i < keys {
                        let v = value(i);
                        let mut r = format!("${}\r\n", v.len()).into_bytes();
                        r.extend(v);
                        r.extend(b"\r\n");
                        r
                    } else {
                        b"$-1\r\n".to_vec()
                    });
                    if j % 10 == 0 {
                        // A write between reads: the GET after it sees it.
                        let own = format!("own-{t}-{round}-{j}");
                        batch.extend(request(&[b"SET", own.as_bytes(), own.as_bytes()]));
                        batch.extend(request(&[b"GET", own.as_bytes()]));
                        want.push(b"+OK\r\n".to_vec());
                        want.push(format!("${}\r\n{own}\r\n", own.len()).into_bytes());
                    }
                }
                c.write_all(&batch).unwrap();
                for (n, w) in want.iter().enumerate() {
                    let got = read_simple(&mut c).expect("a reply");
                    assert_eq!(
                        String::from_utf8_lossy(&got),
                        String::from_utf8_lossy(w),
                        "client {t}, round {round}, reply {n}"
                    );
                }
            }
        }));
    }
    // One client sends GETs and leaves without reading a reply.
    for _ in 0..5 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut batch = Vec::new();
        for i in (0..keys).step_by(97) {
            batch.extend(request(&[b"GET", format!("k{i}").as_bytes()]));
        }
        c.write_all(&batch).unwrap();
        drop(c);
    }
    for c in clients {
        c.join().unwrap();
    }
    assert!(sluice_info(port, "reads_queued") > 100);
    assert_eq!(redis_cli(port, &["PING"]), "PONG\n");
    assert_eq!(
        redis_cli(port, &["GET", "k12345"]),
        format!("{}\n", String::from_utf8(value(12345)).unwrap())
    );
}

#[test]
fn commands_that_read_keys_wait_off_the_worker_too_and_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let value = |i: u32| format!("value-{i:06}-{}", "v".repeat(90));
    let keys = 20_000u32;
    let hashes = 2_000u32;
    let field = |i: u32, f: u32| format!("field-{f}-of-{i}-{}", "w".repeat(40));
    {
        let s = serve(dir.path(), &SMALL_CACHES);
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let mut batch = Vec::new();
        let mut sent = 0;
        let flush = |batch: &mut Vec<u8>, sent: &mut usize, c: &mut TcpStream| {
            c.write_all(batch).unwrap();
            for _ in 0..*sent {
                let r = read_simple(c).unwrap();
                assert!(
                    r == b"+OK\r\n" || r == b":3\r\n",
                    "{}",
                    String::from_utf8_lossy(&r)
                );
            }
            batch.clear();
            *sent = 0;
        };
        for i in 0..keys {
            batch.extend(request(&[
                b"SET",
                format!("k{i}").as_bytes(),
                value(i).as_bytes(),
            ]));
            sent += 1;
            if i < hashes {
                let name = format!("h{i}");
                let mut args: Vec<Vec<u8>> = vec![b"HSET".to_vec(), name.into_bytes()];
                for f in 0..3 {
                    args.push(format!("f{f}").into_bytes());
                    args.push(field(i, f).into_bytes());
                }
                let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
                batch.extend(request(&args));
                sent += 1;
            }
            if sent >= 500 {
                flush(&mut batch, &mut sent, &mut c);
            }
        }
        flush(&mut batch, &mut sent, &mut c);
        assert!(sluice_info(s.port, "memtable_flushes") >= 1);
        stop_with_sigterm(s);
    }
    // Cold caches, and no plain GET: every read queued is another command's.
    let s = serve(dir.path(), &SMALL_CACHES);
    let port = s.port;
    // redis-cli, unmodified, first of all.
    assert_eq!(
        redis_cli(port, &["MGET", "k3", "nope", "k19999"]),
        format!("{}\n\n{}\n", value(3), value(19999))
    );
    assert!(sluice_info(port, "reads_queued") > 0);
    let bulk = |v: &str| format!("${}\r\n{v}\r\n", v.len());
    let mut clients = Vec::new();
    for t in 0..4u32 {
        clients.push(std::thread::spawn(move || {
            let mut c = patient_client(port);
            let mut rng = t * 104_729 + 7;
            let mut next = |n: u32| {
                rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (rng >> 8) % n
            };
            let mut counter = 0u32;
            for round in 0..30u32 {
                let mut batch = Vec::new();
                let mut want: Vec<String> = Vec::new();
                // MGET of 8 keys, a tenth of them absent.
                let picks: Vec<u32> = (0..8).map(|_| next(keys + keys / 10)).collect();
                let mut args = vec![b"MGET".to_vec()];
                args.extend(picks.iter().map(|i| format!("k{i}").into_bytes()));
                let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
                batch.extend(request(&refs));
                let mut reply = format!("*{}\r\n", picks.len());
                for &i in &picks {
                    reply += &if i < keys {
                        bulk(&value(i))
                    } else {
                        "$-1\r\n".into()
                    };
                }
                want.push(reply);
                let i = next(keys);
                batch.extend(request(&[b"STRLEN", format!("k{i}").as_bytes()]));
                want.push(format!(":{}\r\n", value(i).len()));
                let (a, b) = (next(keys), next(keys) + keys);
                batch.extend(request(&[
                    b"EXISTS",
                    format!("k{a}").as_bytes(),
                    format!("k{b}").as_bytes(),
                ]));
                want.push(":1\r\n".into());
                let h = next(hashes);
                batch.extend(request(&[b"HGET", format!("h{h}").as_bytes(), b"f1"]));
                want.push(bulk(&field(h, 1)));
                let h = next(hashes);
                batch.extend(request(&[
                    b"HMGET",
                    format!("h{h}").as_bytes(),
                    b"f2",
                    b"nope",
                    b"f0",
                ]));
                want.push(format!(
                    "*3\r\n{}$-1\r\n{}",
                    bulk(&field(h, 2)),
                    bulk(&field(h, 0))
                ));
                let i = next(keys);
                batch.extend(request(&[
                    b"GETRANGE",
                    format!("k{i}").as_bytes(),
                    b"0",
                    b"11",
                ]));
                want.push(bulk(&value(i)[..12]));
                // A write and reads of it in the same pipeline.
                let own = format!("own-{t}");
                batch.extend(request(&[b"INCR", own.as_bytes()]));
                counter += 1;
                want.push(format!(":{counter}\r\n"));
                batch.extend(request(&[
                    b"MGET",
                    own.as_bytes(),
                    format!("k{i}").as_bytes(),
                ]));
                want.push(format!(
                    "*2\r\n{}{}",
                    bulk(&counter.to_string()),
                    bulk(&value(i))
                ));
                // A type error is still the right error.
                batch.extend(request(&[b"HGET", format!("k{i}").as_bytes(), b"f"]));
                want.push(
                    "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n".into(),
                );
                c.write_all(&batch).unwrap();
                for (n, w) in want.iter().enumerate() {
                    let got = read_reply(&mut c);
                    assert_eq!(
                        String::from_utf8_lossy(&got),
                        *w,
                        "client {t}, round {round}, reply {n}"
                    );
                }
            }
        }));
    }
    // Clients that leave with reads waiting.
    for _ in 0..5 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut batch = Vec::new();
        for i in (0..keys).step_by(499) {
            batch.extend(request(&[
                b"MGET",
                format!("k{i}").as_bytes(),
                format!("k{}", i + 1).as_bytes(),
            ]));
        }
        c.write_all(&batch).unwrap();
        drop(c);
    }
    for c in clients {
        c.join().unwrap();
    }
    assert!(sluice_info(port, "reads_queued") > 50);
    // EXEC brings in what its queued commands read before it runs them.
    let before = sluice_info(port, "reads_queued");
    let mut c = patient_client(port);
    let picks: Vec<u32> = (0..20u32).map(|j| (j * 997 + 13) % keys).collect();
    let mut batch = request(&[b"MULTI"]);
    let mut mget = vec![b"MGET".to_vec()];
    mget.extend(picks.iter().map(|i| format!("k{i}").into_bytes()));
    let refs: Vec<&[u8]> = mget.iter().map(|a| a.as_slice()).collect();
    batch.extend(request(&refs));
    batch.extend(request(&[b"HGET", b"h1234", b"f2"]));
    batch.extend(request(&[b"EXEC"]));
    c.write_all(&batch).unwrap();
    assert_eq!(read_reply(&mut c), b"+OK\r\n");
    assert_eq!(read_reply(&mut c), b"+QUEUED\r\n");
    assert_eq!(read_reply(&mut c), b"+QUEUED\r\n");
    let mut want = format!("*2\r\n*{}\r\n", picks.len());
    for &i in &picks {
        want += &bulk(&value(i));
    }
    want += &bulk(&field(1234, 2));
    assert_eq!(String::from_utf8_lossy(&read_reply(&mut c)), want);
    assert!(
        sluice_info(port, "reads_queued") > before,
        "EXEC read its cold keys on the worker"
    );
    assert_eq!(redis_cli(port, &["PING"]), "PONG\n");
    assert_eq!(
        redis_cli(port, &["HGET", "h77", "f0"]),
        format!("{}\n", field(77, 0))
    );
}

/// `sluice serve --config FILE`: its keys act as the options they name, a
/// `[redis]` table's parameters are set at start, CONFIG REWRITE writes
/// what CONFIG SET changed back into the file (keeping the rest of it), and
/// a restart from the rewritten file comes up with those values.
#[test]
fn a_config_file_is_read_at_start_and_rewritten_by_config_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(
        &file,
        "# the team's server\ntimeout = 7\nmax-clients = 123\n\n\
         [redis]\nnotify-keyspace-events = \"KEA\"\n",
    )
    .unwrap();
    let config = ["--config", file.to_str().unwrap()];
    let s = serve(dir.path(), &config);
    assert_eq!(
        redis_cli(s.port, &["CONFIG", "GET", "timeout"]),
        "timeout\n7\n"
    );
    assert_eq!(
        redis_cli(s.port, &["CONFIG", "GET", "maxclients"]),
        "maxclients\n123\n"
    );
    assert_eq!(
        redis_cli(s.port, &["CONFIG", "GET", "notify-keyspace-events"]),
        "notify-keyspace-events\nAKE\n"
    );
    assert_eq!(
        redis_cli(s.port, &["CONFIG", "SET", "timeout", "9", "hz", "20"]),
        "OK\n"
    );
    assert_eq!(redis_cli(s.port, &["CONFIG", "REWRITE"]), "OK\n");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("# the team's server\ntimeout = 7\n"),
        "{text}"
    );
    for line in [
        "hz = \"20\"",
        "timeout = \"9\"",
        "notify-keyspace-events = \"AKE\"",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    stop_with_sigterm(s);
    let s = serve(dir.path(), &config);
    assert_eq!(
        redis_cli(s.port, &["CONFIG", "GET", "timeout"]),
        "timeout\n9\n"
    );
    assert_eq!(redis_cli(s.port, &["CONFIG", "GET", "hz"]), "hz\n20\n");
    stop_with_sigterm(s);
    // Without a file, Redis's answer.
    let s = serve(dir.path(), &[]);
    let out = redis_cli(s.port, &["CONFIG", "REWRITE"]);
    assert!(out.contains("without a config file"), "{out}");
    drop(s);
    // A parameter Redis would refuse stops the start, named.
    std::fs::write(&file, "[redis]\nhz = \"fast\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", dir.path().join("serve.dev").to_str().unwrap()])
        .args(["--resp", "127.0.0.1:0"])
        .args(config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("'hz'"), "{err}");
    // An unknown key is named with its file.
    std::fs::write(&file, "port = 6380\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown key `port`") && err.contains("sluice.toml"),
        "{err}"
    );
}

/// The examples in docs/examples are what `--config-example` prints now:
/// every option of the build, with its help and default.
#[test]
fn the_shipped_config_examples_are_current() {
    for command in ["serve", "node"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([command, "--config-example"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../docs/examples/sluice-{command}.toml"));
        let shipped = std::fs::read_to_string(&path).unwrap();
        assert!(
            shipped == String::from_utf8_lossy(&out.stdout),
            "{} is out of date: `sluice {command} --config-example > docs/examples/sluice-{command}.toml`",
            path.display()
        );
    }
}

const METRICS_PY: &str = r#"
import sys, urllib.request, urllib.error, redis
from prometheus_client.parser import text_string_to_metric_families
port, metrics_port, http_port = (int(a) for a in sys.argv[1:4])
r = redis.Redis(port=port, decode_responses=True)
r.set("a", "x"); r.get("a"); r.get("a")
try:
    r.incr("a")
    raise SystemExit("INCR of a non-number did not fail")
except redis.ResponseError:
    pass
urllib.request.urlopen(f"http://127.0.0.1:{http_port}/").read()
def scrape(url):
    with urllib.request.urlopen(url) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4"), answer.headers
        text = answer.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {}
    for f in families.values():
        for s in f.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples
families, samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
assert families["sluice_resp_command_calls"].type == "counter", families["sluice_resp_command_calls"]
assert samples[("sluice_resp_command_calls_total", (("command", "get"),))] == 2, samples
assert samples[("sluice_resp_command_calls_total", (("command", "set"),))] == 1
# redis-py sends INCR as INCRBY.
assert samples[("sluice_resp_command_failed_total", (("command", "incrby"),))] == 1
hist = families["sluice_resp_command_duration_seconds"]
assert hist.type == "histogram", hist
calls = sum(v for (n, _), v in samples.items() if n == "sluice_resp_command_calls_total")
count = samples[("sluice_resp_command_duration_seconds_count", ())]
assert count == calls, (count, calls)
assert samples[("sluice_resp_command_duration_seconds_bucket", (("le", "+Inf"),))] == count
assert samples[("sluice_resp_connected_clients", ())] >= 1
assert samples[("sluice_http_requests_total", ())] >= 1
assert families["sluice_http_request_duration_seconds"].type == "summary"
assert samples[("sluice_store_device_bytes", ())] == 64 << 20
writes = samples[("sluice_device_write_bytes_total", (("device", "0"), ("priority", "high")))]
assert writes > 0, "the log's writes are high-priority device writes"
# The HTTP API serves the same families at /_sluice/metrics.
http_families, _ = scrape(f"http://127.0.0.1:{http_port}/_sluice/metrics")
assert set(http_families) == set(families), set(families) ^ set(http_families)
try:
    urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/other")
    raise SystemExit("a path other than /metrics was answered")
except urllib.error.HTTPError as e:
    assert e.code == 404, e
print("metrics ok")
"#;

/// `--metrics`: Prometheus's text format, read by Prometheus's own Python
/// parser, with counters that follow the commands run; the HTTP API's
/// `/_sluice/metrics` serves the same; beyond loopback the listener is
/// refused before anything starts.
#[test]
fn metrics_are_served_in_prometheus_format() {
    let dir = tempfile::tempdir().unwrap();
    let (metrics_port, http_port) = (free_port(), free_port());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let http = format!("127.0.0.1:{http_port}");
    let s = serve(
        dir.path(),
        &["--create-mib", "64", "--metrics", &metrics, "--http", &http],
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(METRICS_PY)
        .args([
            s.port.to_string(),
            metrics_port.to_string(),
            http_port.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "metrics check failed (scripts/setup installs prometheus-client and redis-py):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(s);
    let device = dir.path().join("other.dev");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--device", device.to_str().unwrap()])
        .args(["--resp", "127.0.0.1:0", "--metrics", "0.0.0.0:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("loopback"), "{err}");
    assert!(
        !device.exists(),
        "a device was made for a server that could not start"
    );
}
