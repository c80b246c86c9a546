//! What the differential tests share: a real `redis-server` started on a
//! free port, a Sluice server on a memory device, and a client that sends
//! requests and reads whole replies.
#![allow(dead_code)] // each test file uses part of it

pub mod scenario;

use sluice_io::{Device, MemoryDevice};
use sluice_redis::db::Db;
use sluice_server::resp::Reply;
use sluice_server::server::{Durability, Server, ServerConfig};
use sluice_store::{Store, StoreConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A `redis-server` the test started; killed on drop.
pub struct Redis {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills `child` when this test process ends. A `redis-server` kept in a
/// `static` (shared by a file's tests) is never dropped, so without this
/// it outlived every test run. A shell polls this process once a second
/// and stops as soon as the child is gone by other means.
pub fn end_with_this_process(child: &Child) {
    let script = format!(
        "while kill -0 {test} 2>/dev/null; do kill -0 {child} 2>/dev/null || exit 0; sleep 1; done; kill {child} 2>/dev/null",
        test = std::process::id(),
        child = child.id()
    );
    let mut watchdog = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh runs the watchdog");
    // Reaped when it ends, not left a zombie for the run's length.
    std::thread::spawn(move || watchdog.wait());
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `redis-server` with no persistence, plus `extra` flags.
pub fn start_redis(extra: &[&str]) -> Redis {
    let port = free_port();
    // Its own directory: a test's SAVE writes dump.rdb there, not into the
    // source tree (the tests run in the crate's directory).
    let dir = std::env::temp_dir().join(format!("sluice-test-redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting redis-server failed ({e}): scripts/setup installs it (apt-get install redis-server)")
        });
    end_with_this_process(&child);
    wait_listening(port);
    Redis { child, port }
}

pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Sluice server on a memory device; stopped on drop.
pub struct Sluice {
    server: Option<Server>,
    pub addr: SocketAddr,
    pub store: Arc<Store>,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop().unwrap();
        }
    }
}

impl Sluice {
    /// Stops the server (every acknowledged write durable) and hands back
    /// the store.
    pub fn stop(mut self) -> Arc<Store> {
        if let Some(s) = self.server.take() {
            s.stop().unwrap();
        }
        self.store.clone()
    }
}

pub fn small_store() -> Arc<Store> {
    let dev = Arc::new(MemoryDevice::new(4096, 64 << 10)) as Arc<dyn Device>;
    Arc::new(Store::create(dev, &StoreConfig::default()).unwrap())
}

/// Starts a server on `store` with `config` (its address replaced by a
/// free port).
pub fn start_sluice_on(store: Arc<Store>, config: ServerConfig) -> Sluice {
    let db = Arc::new(Db::open(store.clone()).unwrap());
    let server = Server::start(
        db,
        ServerConfig {
            resp_addr: "127.0.0.1:0".parse().unwrap(),
            pin_threads: false,
            ..config
        },
    )
    .unwrap();
    let addr = server.resp_addr();
    Sluice {
        server: Some(server),
        addr,
        store,
    }
}

pub fn start_sluice(durability: Durability) -> Sluice {
    start_sluice_on(
        small_store(),
        ServerConfig {
            threads: 2,
            durability,
            ..ServerConfig::default()
        },
    )
}

/// One request as RESP multibulk.
pub fn request(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A connection that reads whole replies.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn connect_port(port: u16) -> Client {
        Client::connect(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// The next reply's bytes, or None if the server closed.
    pub fn read_reply(&mut self) -> Option<Vec<u8>> {
        let mut chunk = [0u8; 65536];
        loop {
            if let Some((_, used)) = Reply::decode(&self.buf).unwrap() {
                return Some(self.buf.drain(..used).collect());
            }
            let n = self.stream.read(&mut chunk).unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends one command and reads its reply's bytes.
    pub fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        self.stream.write_all(&request(&args)).unwrap();
        self.read_reply().expect("the server closed the connection")
    }

    /// [`Client::call`], decoded.
    pub fn call_reply(&mut self, args: &[&[u8]]) -> Reply {
        Reply::decode(&self.call(args)).unwrap().unwrap().0
    }

    /// Sends a command written as redis-cli takes it (`SET k "a b"`).
    #[allow(dead_code)] // not every test binary uses it
    pub fn send_line(&mut self, line: &str) {
        let args = sluice_server::resp::split_args(line.as_bytes()).unwrap();
        self.stream.write_all(&request(&args)).unwrap();
    }

    /// [`Client::send_line`], and its reply's bytes.
    #[allow(dead_code)]
    pub fn call_line(&mut self, line: &str) -> Vec<u8> {
        self.send_line(line);
        self.read_reply().expect("the server closed the connection")
    }

    /// A reply that arrives within `wait`, or None.
    #[allow(dead_code)]
    pub fn try_read(&mut self, wait: Duration) -> Option<Vec<u8>> {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let reply = self.read_reply();
        self.stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        reply
    }
}
