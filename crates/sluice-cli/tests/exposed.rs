//! `sluice serve` bound beyond loopback, as a client from elsewhere sees it:
//! Redis's protected mode byte for byte against a real `redis-server`,
//! secrets never taken from the command line. A client "from elsewhere"
//! is a socket bound to 127.0.0.2 (Redis counts only 127.0.0.1 and ::1 as
//! local); test traffic never leaves the loopback range.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, serve, stop_with_sigterm};

/// A TCP connection to 127.0.0.1:`port` from source address `source`.
fn connect_from(source: &str, port: u16) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    socket.bind(&from.into()).unwrap();
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    socket.connect(&to.into()).unwrap();
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Sends `request` from `source` and reads until the server closes or
/// `reply_bytes` have come (whichever is first).
fn exchange(source: &str, port: u16, request: &[u8], reply_bytes: usize) -> Vec<u8> {
    let mut s = connect_from(source, port);
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < reply_bytes {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// A server process, killed when the test ends (however it ends).
struct Process {
    child: Child,
    port: u16,
}

impl Drop for Process {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

/// A real `redis-server` on every IPv4 address, protected mode as it
/// comes, with `extra` flags.
fn redis(extra: &[&str]) -> Process {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "0.0.0.0"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("redis-server failed to start ({e}): scripts/setup installs it")
        });
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Process { child, port }
}

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

fn config_set_protected_mode(port: u16, value: &str) -> Vec<u8> {
    let request = format!(
        "*4\r\n$6\r\nCONFIG\r\n$3\r\nSET\r\n$14\r\nprotected-mode\r\n${}\r\n{value}\r\n",
        value.len()
    );
    exchange("127.0.0.1", port, request.as_bytes(), 5)
}

fn config_get_protected_mode(port: u16) -> Vec<u8> {
    let request = b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$14\r\nprotected-mode\r\n";
    exchange("127.0.0.1", port, request, 38)
}

#[test]
fn protected_mode_answers_clients_from_elsewhere_as_redis_does() {
    let dir = tempfile::tempdir().unwrap();
    let real = redis(&[]);
    let ours = serve(dir.path(), "0.0.0.0", &[]);
    assert!(
        ours.banner.contains("protected mode"),
        "no word at start about protected mode: {}",
        ours.banner
    );
    // From 127.0.0.2: Redis's -DENIED text, then the connection closes.
    let denied = exchange("127.0.0.2", real.port, PING, usize::MAX);
    assert!(denied.starts_with(b"-DENIED Redis is running in protected mode"));
    assert_eq!(exchange("127.0.0.2", ours.port, PING, usize::MAX), denied);
    // From 127.0.0.1 both serve.
    assert_eq!(exchange("127.0.0.1", real.port, PING, 7), b"+PONG\r\n");
    assert_eq!(exchange("127.0.0.1", ours.port, PING, 7), b"+PONG\r\n");
    // CONFIG GET and SET protected-mode, as Redis answers them.
    for port in [real.port, ours.port] {
        assert_eq!(
            config_get_protected_mode(port),
            b"*2\r\n$14\r\nprotected-mode\r\n$3\r\nyes\r\n"
        );
    }
    let bad_real = config_set_protected_mode(real.port, "maybe");
    assert_eq!(config_set_protected_mode(ours.port, "maybe"), bad_real);
    for port in [real.port, ours.port] {
        assert_eq!(config_set_protected_mode(port, "no"), b"+OK\r\n");
        assert_eq!(exchange("127.0.0.2", port, PING, 7), b"+PONG\r\n");
        assert_eq!(config_set_protected_mode(port, "yes"), b"+OK\r\n");
    }
    assert_eq!(exchange("127.0.0.2", ours.port, PING, usize::MAX), denied);
}

#[test]
fn with_a_password_clients_from_elsewhere_must_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("requirepass");
    std::fs::write(&secret_file, "hunter2\n").unwrap();
    let real = redis(&["--requirepass", "hunter2"]);
    let ours = serve(
        dir.path(),
        "0.0.0.0",
        &["--requirepass-file", secret_file.to_str().unwrap()],
    );
    assert!(!ours.banner.contains("protected mode"), "{}", ours.banner);
    let noauth = exchange("127.0.0.2", real.port, PING, 33);
    assert_eq!(noauth, b"-NOAUTH Authentication required.\r\n");
    assert_eq!(exchange("127.0.0.2", ours.port, PING, 33), noauth);
    let auth_ping = b"*2\r\n$4\r\nAUTH\r\n$7\r\nhunter2\r\n*1\r\n$4\r\nPING\r\n";
    for port in [real.port, ours.port] {
        assert_eq!(
            exchange("127.0.0.2", port, auth_ping, 12),
            b"+OK\r\n+PONG\r\n"
        );
    }
    let wrong = b"*2\r\n$4\r\nAUTH\r\n$7\r\nhunter3\r\n";
    let refused = exchange("127.0.0.2", real.port, wrong, 64);
    assert!(refused.starts_with(b"-WRONGPASS"));
    assert_eq!(exchange("127.0.0.2", ours.port, wrong, 64), refused);
}

fn serve_fails(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", dir.join("s.dev").to_str().unwrap()])
        .args(["--resp", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "sluice serve {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn secrets_are_refused_on_the_command_line_and_taken_from_files_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, instead) in [
        ("--requirepass", "hunter2", "--requirepass-file"),
        ("--user", "ann:hunter2", "--users-file"),
        ("--http-user", "ann:hunter2", "--http-users-file"),
        ("--http-api-key", "k:hunter2", "--http-api-keys-file"),
    ] {
        let err = serve_fails(dir.path(), &[flag, value], &[]);
        assert!(err.contains("ps") && err.contains(instead), "{err}");
        assert!(
            !err.contains("hunter2"),
            "the error repeats the secret: {err}"
        );
    }
    assert!(
        !dir.path().join("s.dev").exists(),
        "a device was made for a server that could not start"
    );
    let users = dir.path().join("users");
    std::fs::write(&users, "ann one\n").unwrap();
    let err = serve_fails(dir.path(), &["--users-file", users.to_str().unwrap()], &[]);
    assert!(
        err.contains(":1:") && err.contains("NAME:PASSWORD"),
        "{err}"
    );
    // SLUICE_REQUIREPASS: the environment, which `ps` does not show.
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--device", dir.path().join("e.dev").to_str().unwrap()])
        .args(["--create-mib", "256", "--threads", "1"])
        .args(["--resp", &format!("127.0.0.1:{port}")])
        .env("SLUICE_REQUIREPASS", "from-env")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let server = Process { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sluice serve did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        exchange("127.0.0.1", port, PING, 33),
        b"-NOAUTH Authentication required.\r\n"
    );
    let cli = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "PING"])
        .env("REDISCLI_AUTH", "from-env")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "PONG\n");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("from-env"));
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both
/// signed by it, made with openssl in `dir`: `ca.pem`, `server.pem` /
/// `server.key`, `client.pem` / `client.key`; and `stranger.pem` /
/// `stranger.key`, a client certificate signed by another CA.
fn pki(dir: &Path) {
    let openssl = |args: &[&str]| common::openssl(dir, args);
    for (ca, name) in [("ca", "Sluice test CA"), ("other-ca", "Another CA")] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
            "-subj",
            &format!("/CN={name}"),
        ]);
    }
    std::fs::write(
        dir.join("server.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.cnf"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for (name, ca, ext) in [
        ("server", "ca", "server.cnf"),
        ("client", "ca", "client.cnf"),
        ("stranger", "other-ca", "client.cnf"),
    ] {
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            ext,
        ]);
    }
}

#[test]
fn tls_clients_must_show_a_certificate_the_ca_signed_on_resp_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    pki(d);
    let file = |name: &str| d.join(name).to_str().unwrap().to_string();
    let (tls_port, http_port) = (free_port(), free_port());
    let tls_flags = [
        "--tls-cert".to_string(),
        file("server.pem"),
        "--tls-key".to_string(),
        file("server.key"),
        "--tls-ca-cert".to_string(),
        file("ca.pem"),
    ];
    // The server's certificate and the CA its clients' must chain to,
    // after `first`.
    let serve_tls = |first: &[String]| {
        let args: Vec<String> = first.iter().chain(&tls_flags).cloned().collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        serve(d, "127.0.0.1", &args)
    };
    let ours = serve_tls(&[
        "--resp-tls".into(),
        format!("127.0.0.1:{tls_port}"),
        "--http".into(),
        format!("0.0.0.0:{http_port}"),
        "--http-tls".into(),
    ]);
    let cli = |cert: Option<&str>| {
        let mut c = Command::new("redis-cli");
        c.args([
            "-p",
            &tls_port.to_string(),
            "--tls",
            "--cacert",
            &file("ca.pem"),
        ]);
        if let Some(name) = cert {
            c.args(["--cert", &file(&format!("{name}.pem"))])
                .args(["--key", &file(&format!("{name}.key"))]);
        }
        let out = c.arg("PING").output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(cli(Some("client")), "PONG\n");
    assert_ne!(
        cli(None),
        "PONG\n",
        "a TLS client without a certificate was served"
    );
    assert_ne!(
        cli(Some("stranger")),
        "PONG\n",
        "a certificate of another CA was taken"
    );
    // The HTTP API: the same rule; a client with a certificate is nobody
    // anonymous, so protected mode lets it in from 127.0.0.2 as well.
    let curl = |cert: Option<&str>, source: &str| {
        let mut c = Command::new("curl");
        c.args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
            &file("ca.pem"),
        ])
        .args(["--interface", source]);
        if let Some(name) = cert {
            c.args(["--cert", &file(&format!("{name}.pem"))])
                .args(["--key", &file(&format!("{name}.key"))]);
        }
        let out = c
            .arg(format!("https://127.0.0.1:{http_port}/"))
            .output()
            .unwrap_or_else(|e| panic!("curl failed to start ({e}): scripts/setup installs it"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(Some("client"), "127.0.0.1"), "200");
    assert_eq!(curl(Some("client"), "127.0.0.2"), "200");
    assert_eq!(curl(None, "127.0.0.1"), "000", "no certificate, no answer");
    assert_eq!(curl(Some("stranger"), "127.0.0.1"), "000");
    // elasticsearch-py and redis-py, unmodified, with their certificate.
    let script = format!(
        r#"
import elasticsearch, redis
es = elasticsearch.Elasticsearch("https://127.0.0.1:{http_port}", ca_certs="{ca}",
                                 client_cert="{cert}", client_key="{key}")
es.index(index="mtls", id="1", document={{"a": 1}}, refresh=True)
assert es.get(index="mtls", id="1")["_source"] == {{"a": 1}}
r = redis.Redis(port={tls_port}, ssl=True, ssl_ca_certs="{ca}", ssl_certfile="{cert}", ssl_keyfile="{key}")
assert r.set("mtls", "yes") and r.get("mtls") == b"yes"
print("ok")
"#,
        ca = file("ca.pem"),
        cert = file("client.pem"),
        key = file("client.key"),
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(ours);
    // optional: no certificate is let in, a bad one still is not.
    let ours = serve_tls(&[
        "--resp-tls".into(),
        format!("127.0.0.1:{tls_port}"),
        "--tls-auth-clients".into(),
        "optional".into(),
    ]);
    assert_eq!(cli(None), "PONG\n");
    assert_eq!(cli(Some("client")), "PONG\n");
    assert_ne!(cli(Some("stranger")), "PONG\n");
    drop(ours);
}

/// Redis-py's ACL calls, unmodified, against users from `--users-file`.
const ACL_PY: &str = r#"
import sys, redis
port = int(sys.argv[1])
phase = sys.argv[2]
admin = redis.Redis(port=port, username="admin", password="adminpw", decode_responses=True)
anon = redis.Redis(port=port, decode_responses=True)
try:
    anon.ping()
    raise SystemExit("the disabled default user ran PING")
except redis.AuthenticationError:
    pass
if phase == "first":
    assert admin.acl_whoami() == "admin"
    assert admin.acl_users() == ["admin", "default", "reader", "writer"], admin.acl_users()
    assert admin.acl_setuser("app", enabled=True, passwords=["+apppw"], keys=["app:*"],
                             commands=["+get", "+set"], reset=True)
    got = admin.acl_getuser("app")
    assert got["enabled"] and got["keys"] == ["~app:*"] and "+get" in got["commands"], got
    assert len(admin.acl_genpass()) == 64
    assert "get" in admin.acl_cat("read")
    assert admin.acl_dryrun("app", "get", "other") == "This user has no permissions to access the 'other' key"
    app = redis.Redis(port=port, username="app", password="apppw", decode_responses=True)
    assert app.set("app:1", "x") and app.get("app:1") == "x"
    for denied in (lambda: app.get("other"), lambda: app.delete("app:1")):
        try:
            denied()
            raise SystemExit("a denied command ran")
        except redis.exceptions.NoPermissionError:
            pass
    log = admin.acl_log()
    assert [e["reason"] for e in log[:2]] == ["command", "key"], log
    assert log[0]["username"] == "app" and log[0]["object"] == "del", log
    reader = redis.Redis(port=port, username="reader", password="r", decode_responses=True)
    assert reader.get("pub:x") is None
    try:
        reader.set("pub:x", "1")
        raise SystemExit("the reader wrote")
    except redis.exceptions.NoPermissionError:
        pass
    writer = redis.Redis(port=port, username="writer", password="wpw", decode_responses=True)
    assert writer.set("w", "1") and writer.flushall()
    assert admin.acl_save()
    assert admin.acl_deluser("reader") == 1
    try:
        reader.ping()
        raise SystemExit("the removed user's connection ran PING")
    except redis.ConnectionError:
        pass
    # Back as the file has it: ACL LOAD undoes the change since the save.
    assert admin.acl_load()
    assert "reader" in admin.acl_users()
    assert admin.acl_deluser("reader") == 1 and admin.acl_save()
else:
    assert admin.acl_users() == ["admin", "app", "default", "writer"], admin.acl_users()
    app = redis.Redis(port=port, username="app", password="apppw", decode_responses=True)
    assert app.set("app:2", "y") and app.get("app:2") == "y"
    try:
        app.get("other")
        raise SystemExit("a denied command ran after the restart")
    except redis.exceptions.NoPermissionError:
        pass
print("acl ok")
"#;

#[test]
fn acl_users_from_the_users_file_are_enforced_for_redis_py_and_acl_save_outlives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.acl");
    std::fs::write(
        &users,
        "# Redis ACL lines and NAME:PASSWORD lines\nuser admin on >adminpw ~* &* +@all\nuser default off\nuser reader on >r ~pub:* -@all +@read\nwriter:wpw\n",
    )
    .unwrap();
    let flags = ["--users-file", users.to_str().unwrap()];
    let run = |port: u16, phase: &str| {
        let out = Command::new("python3")
            .args(["-c", ACL_PY, &port.to_string(), phase])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-py ACL script ({phase}) failed (scripts/setup installs redis-py):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let first = serve(dir.path(), "127.0.0.1", &flags);
    run(first.port, "first");
    let saved = std::fs::read_to_string(&users).unwrap();
    assert!(
        saved.contains("user app on sanitize-payload #")
            && saved.contains(" ~app:* resetchannels -@all +get +set\n"),
        "{saved}"
    );
    assert!(
        !saved.contains("apppw") && !saved.contains("user reader"),
        "{saved}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&users).unwrap().permissions().mode() & 0o777,
        0o600
    );
    stop_with_sigterm(first);
    let second = serve(dir.path(), "127.0.0.1", &flags);
    run(second.port, "second");
    stop_with_sigterm(second);
}
