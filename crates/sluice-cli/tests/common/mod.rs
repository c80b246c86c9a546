//! What the tests of `sluice serve` share: starting it, stopping it.
#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Serve {
    pub child: Child,
    pub port: u16,
    /// What it printed before it was ready.
    pub banner: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Stops a server as an operator would, with SIGTERM: it makes its log
/// durable and deletes its log mirror (8 MiB of memory in /dev/shm that a
/// kill -9 would leave behind); killed if it has not stopped in 10 s. A
/// server the test killed already is only reaped.
pub fn stop(child: &mut Child) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `sluice serve` on `dir/serve.dev`, its Redis protocol on `host`,
/// and waits for its ready line.
pub fn serve(dir: &Path, host: &str, extra: &[&str]) -> Serve {
    let port = free_port();
    let device = dir.join("serve.dev");
    // 256 MiB unless the test gives its own size.
    let size: &[&str] = if extra.contains(&"--create-mib") {
        &[]
    } else {
        &["--create-mib", "256"]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", device.to_str().unwrap()])
        .args(size)
        .args(["--resp", &format!("{host}:{port}"), "--threads", "2"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut banner = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "sluice serve ended before it was ready"
        );
        banner.push_str(&line);
        if line.contains("ready to accept connections") {
            break;
        }
        assert!(Instant::now() < deadline, "sluice serve did not get ready");
    }
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = out.read_to_string(&mut sink);
    });
    Serve {
        child,
        port,
        banner,
    }
}

/// Sends SIGTERM and waits up to 30 s for a clean exit.
pub fn stop_with_sigterm(mut s: Serve) {
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "sluice serve ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "sluice serve exited with {status}");
}

/// Runs openssl with `args` in `dir`; a failure names the call and what
/// openssl said.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl failed to start ({e}): scripts/setup installs it"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
