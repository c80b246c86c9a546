//! `sluice node` as its users run it: the binary serving device files to the
//! Linux kernel's own NVMe/TCP host (Debian's kernel booted in QEMU by
//! scripts/nvmf-linux-host), and refusing bad options.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Runs one of the Linux host scripts against this build's `sluice` and
/// returns what it printed; fails the test when the script fails.
fn linux_host(script: &str, work_dir: &str) -> String {
    let root = repo_root();
    let out = Command::new(root.join("scripts").join(script))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .env("NVMF_HOST_DIR", root.join("target/tmp").join(work_dir))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

#[test]
fn the_linux_kernel_host_writes_reads_and_mounts_a_filesystem_over_nvme_tcp() {
    let stdout = linux_host("nvmf-linux-host", "nvmf-host-test");
    // What the guest saw: our controller, 64 MiB of 4 KiB blocks, the
    // same checksum written and read, the files back after a remount.
    assert!(
        stdout.contains("RESULT model Sluice storage node"),
        "{stdout}"
    );
    assert!(
        stdout.contains("RESULT size1 67108864 lbs 4096"),
        "{stdout}"
    );
    let sum = |what: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(what))
            .map(str::to_string)
    };
    let wrote = sum("RESULT wrote ").expect("a written checksum");
    assert_eq!(wrote.len(), 64);
    assert_eq!(sum("RESULT read "), Some(wrote));
    assert!(stdout.contains("RESULT files ok 4"), "{stdout}");
    for want in [
        "RESULT discarded bytes 1048576 nonzero 0",
        "RESULT fio ok",
        "RESULT discovery nqn.2014-08.org.nvmexpress.discovery discovery",
        "RESULT discover lists the subsystem",
    ] {
        assert!(stdout.contains(want), "{want} missing from {stdout}");
    }
    let copied = sum("RESULT copied ").expect("nvme copy's checksums");
    let (got, want) = copied.split_once(" of ").unwrap();
    assert_eq!(got, want, "nvme copy through passthrough");
}

#[test]
fn the_linux_kernel_host_connects_over_tls_with_a_pre_shared_key_and_authenticates_in_band() {
    // Debian 13's kernel, nvme-cli and tlshd in QEMU against `sluice node
    // --nvme-tls-key` (scripts/nvmf-linux-host-tls says what it checks).
    let stdout = linux_host("nvmf-linux-host-tls", "nvmf-host-tls-test");
    assert!(stdout.contains("RESULT tls connect ok"), "{stdout}");
    assert!(stdout.contains("RESULT plain connect refused"), "{stdout}");
    // The kernel says which key its TLS session used: one from its keyring.
    let key = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT tls_key "))
        .unwrap_or_default();
    assert!(
        !key.is_empty() && key != "none" && !key.trim_start_matches('0').is_empty(),
        "{stdout}"
    );
    // In-band authentication (DH-HMAC-CHAP), both ways, on a second node.
    for want in [
        "RESULT dhchap connect ok",
        "RESULT dhchap wrong secret refused",
        "RESULT dhchap no secret refused",
    ] {
        assert!(stdout.contains(want), "{want} missing from {stdout}");
    }
}

#[test]
fn bad_options_are_refused_before_anything_is_served() {
    let dir = tempfile::tempdir().unwrap();
    refused_before_serving(
        &["--nqn", "not-an-nqn"],
        &dir.path().join("a.dev"),
        "an NQN starts with \"nqn.\"",
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    refused_before_serving(
        &["--listen", &busy],
        &dir.path().join("b.dev"),
        "is another target there?",
    );
    // Beyond loopback, a node must be told who may connect.
    refused_before_serving(
        &["--listen", "0.0.0.0:0"],
        &dir.path().join("d.dev"),
        "--allow-host NQN",
    );
    refused_before_serving(
        &["--listen", "127.0.0.1:0", "--discovery", "0.0.0.0:0"],
        &dir.path().join("d.dev"),
        "--allow-any-host",
    );
    refused_before_serving(
        &[
            "--listen",
            "127.0.0.1:0",
            "--allow-host",
            "nqn.2014-08.org.nvmexpress:uuid:x",
            "--nbd",
            "0.0.0.0:0",
        ],
        &dir.path().join("d.dev"),
        "NBD names no host",
    );
    // A TLS key with one character changed: its CRC-32 says so.
    let key = run(Command::new(env!("CARGO_BIN_EXE_sluice")).args(["nvmf", "gen-tls-key"]));
    let mut bad = key.trim().to_string().into_bytes();
    bad[20] = if bad[20] == b'A' { b'B' } else { b'A' };
    let key_file = dir.path().join("bad.key");
    std::fs::write(&key_file, &bad).unwrap();
    refused_before_serving(
        &[
            "--listen",
            "127.0.0.1:0",
            "--nvme-tls-key",
            key_file.to_str().unwrap(),
        ],
        &dir.path().join("c.dev"),
        "CRC-32 does not match",
    );
    // A DH-HMAC-CHAP secret with one character changed, on line 2: the
    // error names the line and the fault, never the secret.
    let secret = run(Command::new(env!("CARGO_BIN_EXE_sluice")).args(["nvmf", "gen-dhchap-key"]));
    let mut bad = secret.trim().to_string().into_bytes();
    bad[14] = if bad[14] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).unwrap();
    let secrets = dir.path().join("dhchap");
    std::fs::write(
        &secrets,
        format!("# hosts\nnqn.2014-08.org.nvmexpress:uuid:x {bad}\n"),
    )
    .unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--dhchap-secrets-file",
        secrets.to_str().unwrap(),
    ];
    refused_before_serving(
        &args,
        &dir.path().join("e.dev"),
        "line 2: a DH-HMAC-CHAP secret",
    );
    std::fs::write(&secrets, "nqn.2014-08.org.nvmexpress:uuid:x\n").unwrap();
    refused_before_serving(
        &args,
        &dir.path().join("e.dev"),
        "HOSTNQN SECRET [CONTROLLER_SECRET]",
    );
}

/// `sluice node` with `args` on `device` fails, says `says`, and has made
/// no device.
fn refused_before_serving(args: &[&str], device: &std::path::Path, says: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["node", "--create-mib", "4"])
        .args(args)
        .arg("--device")
        .arg(device)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was taken");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{err}");
    assert!(!device.exists(), "nothing created");
}

#[test]
fn sluice_nvmf_reaches_a_node_that_requires_tls_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = run(Command::new(env!("CARGO_BIN_EXE_sluice")).args(["nvmf", "gen-tls-key"]));
    assert!(key.starts_with("NVMeTLSkey-1:01:"), "{key}");
    let key_file = dir.path().join("tls.key");
    std::fs::write(&key_file, &key).unwrap();
    let node = node_with_nbd_and(&["--nvme-tls-key".as_ref(), key_file.as_os_str()]);
    let nvmf = |tls: bool, args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["nvmf", "--target", &node.nvme]);
        if tls {
            cmd.arg("--tls-key").arg(&key_file);
        }
        cmd.args(args);
        cmd.output().unwrap()
    };
    let out = nvmf(true, &["identify"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("2 namespace(s)"), "{text}");
    let data = dir.path().join("in.bin");
    std::fs::write(&data, vec![0xa5u8; 8192]).unwrap();
    let back = dir.path().join("out.bin");
    assert!(nvmf(
        true,
        &["write", "--lba", "3", "--in", data.to_str().unwrap()]
    )
    .status
    .success());
    assert!(nvmf(
        true,
        &[
            "read",
            "--lba",
            "3",
            "--blocks",
            "2",
            "--out",
            back.to_str().unwrap()
        ]
    )
    .status
    .success());
    assert_eq!(std::fs::read(&back).unwrap(), vec![0xa5u8; 8192]);
    // Without the key: refused, and the error says what to try.
    let out = nvmf(false, &["identify"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-key"), "{err}");
}

#[test]
fn beyond_loopback_only_the_hosts_named_are_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = "nqn.2014-08.org.nvmexpress:uuid:allowed-host";
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["node", "--create-mib", "16", "--listen", "0.0.0.0:0"])
        .args(["--allow-host", allowed])
        .arg("--device")
        .arg(dir.path().join("a.dev"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut node = Node {
        child,
        nbd: String::new(),
        nvme: String::new(),
        _dir: dir,
    };
    let mut lines = BufReader::new(node.child.stdout.take().unwrap()).lines();
    while node.nvme.is_empty() {
        let line = lines.next().unwrap().unwrap();
        if let Some(rest) = line.split(" on nvme-tcp ").nth(1) {
            node.nvme = rest.split_whitespace().next().unwrap().to_string();
        }
    }
    let port = node.nvme.rsplit(':').next().unwrap().to_string();
    let identify = |host: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["nvmf", "--target", &format!("127.0.0.1:{port}")])
            .args(["--host-nqn", host, "identify"])
            .output()
            .unwrap()
    };
    let out = identify(allowed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = identify("nqn.2014-08.org.nvmexpress:uuid:someone-else");
    assert!(!out.status.success(), "an unnamed host was admitted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not admit this host") && err.contains("--allow-host"),
        "{err}"
    );
}

struct Node {
    child: Child,
    nbd: String,
    nvme: String,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sluice node` on two 16 MiB device files with NBD, on free ports.
fn node_with_nbd() -> Node {
    node_with_nbd_and(&[])
}

/// As [`node_with_nbd`], with more options.
fn node_with_nbd_and(extra: &[&std::ffi::OsStr]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "node",
            "--create-mib",
            "16",
            "--listen",
            "127.0.0.1:0",
            "--nbd",
            "127.0.0.1:0",
        ])
        .arg("--device")
        .arg(dir.path().join("a.dev"))
        .arg("--device")
        .arg(dir.path().join("b.dev"))
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut nbd, mut nvme) = (None, None);
    while nbd.is_none() || nvme.is_none() {
        let line = lines.next().unwrap().unwrap();
        if let Some(at) = line.strip_prefix("sluice node: NBD on ") {
            nbd = at.split_whitespace().next().map(str::to_string);
        } else if let Some(rest) = line.split(" on nvme-tcp ").nth(1) {
            nvme = rest.split_whitespace().next().map(str::to_string);
        }
    }
    Node {
        child,
        nbd: nbd.unwrap(),
        nvme: nvme.unwrap(),
        _dir: dir,
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

#[test]
fn nbd_clients_copy_inspect_and_verify_through_the_node() {
    let node = node_with_nbd();
    let uri = |export: &str| format!("nbd://{}/{export}", node.nbd);
    let info = run(Command::new("nbdinfo").args(["--json", &uri("2")]));
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    let export = &v["exports"][0];
    assert_eq!(export["export-size"], 16 << 20, "{info}");
    assert_eq!(export["can_trim"], true, "{info}");
    assert_eq!(export["can_flush"], true, "{info}");
    let list = run(Command::new("nbdinfo").args(["--list", &uri("")]));
    assert!(
        list.contains("export=\"1\"") && list.contains("export=\"2\""),
        "{list}"
    );
    // nbdcopy in and out, a size that is not whole blocks.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let data: Vec<u8> = (0..10_000_003u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(&input, &data).unwrap();
    run(Command::new("nbdcopy").arg(&input).arg(uri("2")));
    let output = dir.path().join("out.bin");
    run(Command::new("nbdcopy").arg(uri("2")).arg(&output));
    let back = std::fs::read(&output).unwrap();
    assert!(back[..data.len()] == data[..], "nbdcopy round trip");
    assert!(back[data.len()..].iter().all(|&b| b == 0));
    let device = std::fs::read(node._dir.path().join("b.dev")).unwrap();
    assert!(device[..data.len()] == data[..], "the device file holds it");
    // qemu-img reads the export's size.
    let img = run(Command::new("qemu-img").args(["info", "--output=json", &uri("1")]));
    assert!(img.contains("\"virtual-size\": 16777216"), "{img}");
    // fio's nbd engine writes random 4 KiB blocks and verifies them.
    let fio = run(Command::new("fio").args([
        "--name=nbd",
        "--ioengine=nbd",
        &format!("--uri={}", uri("1")),
        "--rw=randwrite",
        "--bs=4k",
        "--size=4m",
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        // No verify state file left in the working directory.
        "--verify_state_save=0",
    ]));
    assert!(!fio.contains("verify: bad"), "{fio}");
}

#[test]
fn bench_node_runs_every_side_and_prints_the_ratios() {
    let tgtd_count = || {
        let out = Command::new("pgrep")
            .args(["-c", "-x", "tgtd"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u32>()
            .unwrap_or(0)
    };
    let tgtd_before = tgtd_count();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("node.json");
    let out = run(Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "node",
            "--seconds",
            "0.5",
            "--repeat",
            "1",
            "--size-mib",
            "64",
            "--move-mib",
            "8",
        ])
        .args(["--only", "randread-4k-qd1,seqwrite-128k-qd8", "--device"])
        .arg(dir.path().join("bench-node.dev"))
        .arg("--json")
        .arg(&json));
    assert!(out.contains("vs nbdkit") && out.contains("vs tgt"), "{out}");
    // Each row's tails of ours against nbdkit's and tgt's.
    let tails = out
        .lines()
        .filter(|l| l.contains(" ours ") && l.contains("; nbdkit ") && l.contains("; tgt "))
        .count();
    assert_eq!(tails, 2, "{out}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 10, "two rows, five sides");
    for c in cells {
        assert!(c["iops"].as_f64().unwrap() > 0.0, "{c}");
    }
    for side in ["local", "sluice_nbd", "nbdkit", "tgt", "sluice_nvme_tcp"] {
        assert!(cells.iter().any(|c| c["side"] == side), "{side}");
    }
    // The benchmark's tgtd is gone with it.
    assert_eq!(tgtd_count(), tgtd_before, "a tgtd is left running");
    // Inside the node, almost nothing crosses the network; through the
    // initiator, the data does (twice for a copy: read, then written back).
    let moved = report["movements"].as_array().unwrap();
    assert_eq!(moved.len(), 4);
    let bytes = |i: usize| moved[i]["network_bytes"].as_u64().unwrap();
    assert!(bytes(0) < 4096, "{}", moved[0]);
    assert!(bytes(1) > 2 * (8 << 20), "{}", moved[1]);
    assert!(bytes(2) > (8 << 20) && bytes(2) < (9 << 20), "{}", moved[2]);
    assert!(bytes(3) > 2 * (8 << 20), "{}", moved[3]);
}

#[test]
fn sluice_nvmf_identifies_writes_reads_and_copies_inside_the_node() {
    // One worker serves every connection of the node.
    let node = node_with_nbd_and(&["--threads".as_ref(), "1".as_ref()]);
    let nvmf = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["nvmf", "--target", &node.nvme]).args(args);
        cmd
    };
    let id = run(&mut nvmf(&["identify"]));
    assert!(id.contains("Sluice storage node"), "{id}");
    assert!(id.contains("2 namespace(s)"), "{id}");
    assert!(
        id.contains("namespace 2: 4096 blocks of 4096 bytes (16 MiB)"),
        "{id}"
    );
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    let wrote = run(&mut nvmf(&[
        "write",
        "--nsid",
        "1",
        "--lba",
        "9",
        "--in",
        input.to_str().unwrap(),
    ]));
    assert!(wrote.contains("wrote 3 blocks"), "{wrote}");
    let copied = run(&mut nvmf(&[
        "copy",
        "--from-nsid",
        "1",
        "--from-lba",
        "9",
        "--blocks",
        "3",
        "--to-nsid",
        "2",
        "--to-lba",
        "100",
    ]));
    assert!(copied.contains("inside the node"), "{copied}");
    let out = dir.path().join("out.bin");
    run(&mut nvmf(&[
        "read",
        "--nsid",
        "2",
        "--lba",
        "100",
        "--blocks",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(&out).unwrap(), data);
    // More than one transfer each way (kept in flight together): 300
    // blocks, 128 KiB at a time with a shorter last one, back in order.
    let big: Vec<u8> = (0..300 * 4096u32)
        .map(|i| (i / 4096 + i % 7) as u8)
        .collect();
    std::fs::write(&input, &big).unwrap();
    let lba = ["--nsid", "2", "--lba", "1000"];
    run(nvmf(&["write", "--in", input.to_str().unwrap()]).args(lba));
    run(nvmf(&["read", "--blocks", "300", "--out", out.to_str().unwrap()]).args(lba));
    assert!(
        std::fs::read(&out).unwrap() == big,
        "300 blocks back in order"
    );
    // Bad input: a file that is not whole blocks, a copy of nothing.
    std::fs::write(&input, b"short").unwrap();
    let bad = nvmf(&["write", "--lba", "0", "--in", input.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("write whole blocks of 4096 bytes"));
    let bad = nvmf(&["copy", "--from-lba", "0", "--blocks", "0", "--to-lba", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("between 1 and 65536"));
    // The load generator: reads, then writes once they are allowed to
    // overwrite; what it wrote is the pattern, read back.
    let bench = |rw: &str, extra: &[&str]| {
        let mut cmd = nvmf(&["bench", "--nsid", "2", "--rw", rw, "--qd", "16"]);
        cmd.args(["--queues", "2", "--seconds", "0.5", "--bs", "8192"])
            .args(extra);
        cmd
    };
    let read = run(&mut bench("randread", &[]));
    assert!(
        read.contains("QD16 over 2 queue(s)") && read.contains("IOPS"),
        "{read}"
    );
    let refused = bench("write", &[]).output().unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("add --overwrite"),
        "{refused:?}"
    );
    let wrote = run(&mut bench("write", &["--overwrite"]));
    let iops: f64 = wrote
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(iops > 0.0, "{wrote}");
    run(&mut nvmf(&[
        "read",
        "--nsid",
        "2",
        "--lba",
        "0",
        "--blocks",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&out).unwrap().iter().all(|&b| b == 0x5a));
}

/// A CA and a certificate for 127.0.0.1 made with openssl: the node's
/// files, and a directory as libnbd wants it (`ca-cert.pem`).
fn certificates(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let openssl = |args: &[&str]| common::openssl(dir, args);
    let client = dir.join("client");
    std::fs::create_dir_all(&client).unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "client/ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=Sluice test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "req.pem",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "req.pem",
        "-CA",
        "client/ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    // A client certificate from the same CA, where libnbd looks for one
    // (tls-certificates=DIR: client-cert.pem, client-key.pem).
    std::fs::write(
        dir.join("client.cnf"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client/client-key.pem",
        "-out",
        "client-req.pem",
        "-subj",
        "/CN=nbd client",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "client-req.pem",
        "-CA",
        "client/ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "client/client-cert.pem",
        "-days",
        "2",
        "-extfile",
        "client.cnf",
    ]);
    (dir.join("cert.pem"), dir.join("key.pem"), client)
}

#[test]
fn nbd_clients_must_show_a_certificate_the_ca_signed_and_may_then_come_from_anywhere() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, client) = certificates(certs.path());
    let ca = client.join("ca-cert.pem");
    // Trusts the node, shows no certificate of its own.
    let anonymous = certs.path().join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(&ca, anonymous.join("ca-cert.pem")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["node", "--create-mib", "16", "--listen", "127.0.0.1:0"])
        .args(["--nbd", "0.0.0.0:0"])
        .arg("--nbd-tls-cert")
        .arg(&cert)
        .arg("--nbd-tls-key")
        .arg(&key)
        .arg("--nbd-tls-ca-cert")
        .arg(&ca)
        .arg("--device")
        .arg(dir.path().join("a.dev"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut node = Node {
        child,
        nbd: String::new(),
        nvme: String::new(),
        _dir: dir,
    };
    while node.nbd.is_empty() {
        let line = lines.next().unwrap().unwrap();
        if let Some(at) = line.strip_prefix("sluice node: NBD on ") {
            node.nbd = at.split_whitespace().next().unwrap().to_string();
        }
    }
    let port = node.nbd.rsplit(':').next().unwrap().to_string();
    let uri = |certs: &std::path::Path| {
        format!(
            "nbds://127.0.0.1:{port}/1?tls-certificates={}",
            certs.display()
        )
    };
    let info = run(Command::new("nbdinfo").arg(uri(&client)));
    assert!(info.contains("with TLS"), "{info}");
    let refused = Command::new("nbdinfo")
        .arg(uri(&anonymous))
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "a client without a certificate was served"
    );
}

#[test]
fn nbd_clients_reach_the_node_over_tls_and_plain_clients_are_refused() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key, client) = certificates(certs.path());
    let node = node_with_nbd_and(&[
        "--nbd-tls-cert".as_ref(),
        cert.as_os_str(),
        "--nbd-tls-key".as_ref(),
        key.as_os_str(),
    ]);
    let tls_uri = |export: &str| {
        format!(
            "nbds://{}/{export}?tls-certificates={}",
            node.nbd,
            client.display()
        )
    };
    let info = run(Command::new("nbdinfo").arg(tls_uri("2")));
    assert!(info.contains("with TLS"), "{info}");
    assert!(info.contains("export-size: 16777216"), "{info}");
    // nbdcopy in and out over TLS, a size that is not whole blocks.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    let data: Vec<u8> = (0..3_000_001u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    run(Command::new("nbdcopy").arg(&input).arg(tls_uri("2")));
    let output = dir.path().join("out.bin");
    run(Command::new("nbdcopy").arg(tls_uri("2")).arg(&output));
    assert!(std::fs::read(&output).unwrap()[..data.len()] == data[..]);
    let device = std::fs::read(node._dir.path().join("b.dev")).unwrap();
    assert!(device[..data.len()] == data[..], "the device file holds it");
    // Without TLS: refused, nothing served.
    let plain = Command::new("nbdinfo")
        .arg(format!("nbd://{}/1", node.nbd))
        .output()
        .unwrap();
    assert!(!plain.status.success(), "a plain client must be refused");
    // A client that does not trust the certificate's CA gives up.
    let stranger = tempfile::tempdir().unwrap();
    let (_, _, other_ca) = certificates(stranger.path());
    let untrusted = Command::new("nbdinfo")
        .arg(format!(
            "nbds://{}/1?tls-certificates={}",
            node.nbd,
            other_ca.display()
        ))
        .output()
        .unwrap();
    assert!(!untrusted.status.success());
    // `--nbd-tls on`: both kinds of client.
    let both = node_with_nbd_and(&[
        "--nbd-tls-cert".as_ref(),
        cert.as_os_str(),
        "--nbd-tls-key".as_ref(),
        key.as_os_str(),
        "--nbd-tls".as_ref(),
        "on".as_ref(),
    ]);
    let plain = run(Command::new("nbdinfo").arg(format!("nbd://{}/1", both.nbd)));
    assert!(plain.contains("without TLS"), "{plain}");
    let tls = run(Command::new("nbdinfo").arg(format!(
        "nbds://{}/1?tls-certificates={}",
        both.nbd,
        client.display()
    )));
    assert!(tls.contains("with TLS"), "{tls}");
    // A key that is not one: a clear error before anything is served.
    std::fs::write(certs.path().join("bad.pem"), "not a key").unwrap();
    let bad_key = certs.path().join("bad.pem");
    refused_before_serving(
        &[
            "--listen",
            "127.0.0.1:0",
            "--nbd",
            "127.0.0.1:0",
            "--nbd-tls-cert",
            cert.to_str().unwrap(),
            "--nbd-tls-key",
            bad_key.to_str().unwrap(),
        ],
        &dir.path().join("never.dev"),
        "bad.pem",
    );
}

#[test]
fn sluice_nvmf_authenticates_in_band_to_a_node_that_names_its_secret() {
    let dir = tempfile::tempdir().unwrap();
    let sluice = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_sluice")).args(args));
    let host_secret = sluice(&["nvmf", "gen-dhchap-key"]);
    let ctrl_secret = sluice(&["nvmf", "gen-dhchap-key", "--bytes", "64"]);
    assert!(host_secret.starts_with("DHHC-1:00:"), "{host_secret}");
    let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:sluice-nvmf-cli";
    let secrets = dir.path().join("secrets");
    std::fs::write(
        &secrets,
        format!("{host_nqn} {} {}\n", host_secret.trim(), ctrl_secret.trim()),
    )
    .unwrap();
    let (host_file, ctrl_file) = (dir.path().join("host"), dir.path().join("ctrl"));
    std::fs::write(&host_file, &host_secret).unwrap();
    std::fs::write(&ctrl_file, &ctrl_secret).unwrap();
    let node = node_with_nbd_and(&["--dhchap-secrets-file".as_ref(), secrets.as_os_str()]);
    let identify = |extra: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["nvmf", "--target", &node.nvme])
            .args(extra)
            .arg("identify")
            .output()
            .unwrap()
    };
    let out = identify(&[
        "--dhchap-secret-file".as_ref(),
        host_file.as_os_str(),
        "--dhchap-ctrl-secret-file".as_ref(),
        ctrl_file.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 namespace(s)"));
    // Without the secret: refused, and told what to give.
    let out = identify(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--dhchap-secret-file"), "{err}");
    // The node's secret given as the host's: refused by the node.
    let out = identify(&["--dhchap-secret-file".as_ref(), ctrl_file.as_os_str()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AUTH_Failure1"));
}

const NODE_METRICS_PY: &str = r#"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
samples = {}
for f in text_string_to_metric_families(text):
    for s in f.samples:
        samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
assert samples[("sluice_node_namespace_size_bytes", (("nsid", "2"),))] == 16 << 20, samples
written = sum(v for (n, l), v in samples.items()
              if n == "sluice_node_namespace_write_bytes_total" and ("nsid", "1") in l)
assert written >= 4 * 4096, written
received = sum(v for (n, _), v in samples.items() if n == "sluice_node_write_data_bytes_total")
assert received == 4 * 4096, received  # three blocks by `sluice nvmf write`, one by the connected host
assert ("sluice_node_controllers", (("kind", "io"),)) in samples
cntlid = sys.argv[2]
io = {}
for (n, labels), v in samples.items():
    l = dict(labels)
    if n == "sluice_node_queue_commands_total" and l["controller"] == cntlid and l["qid"] == "1":
        io[l["kind"]] = v
assert io == {"read": 2, "write": 1, "flush": 1, "other_io": 0, "admin": 0}, io
assert samples[("sluice_node_queue_errors_total", (("controller", cntlid), ("qid", "1")))] == 1, samples
admin = samples[("sluice_node_queue_commands_total", (("controller", cntlid), ("kind", "admin"), ("qid", "0")))]
assert admin >= 2, admin
print("node metrics ok")
"#;

/// `sluice node --metrics`: Prometheus's text format, read by its own
/// Python parser, counting what an initiator wrote.
#[test]
fn node_metrics_count_what_hosts_write() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let node = node_with_nbd_and(&["--metrics".as_ref(), metrics.as_ref()]);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, vec![7u8; 3 * 4096]).unwrap();
    run(Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["nvmf", "--target", &node.nvme])
        .args(["write", "--nsid", "1", "--lba", "5", "--in"])
        .arg(&input));
    // A host that stays connected: its queues' commands are counted.
    use sluice_nvmf::initiator::QueueConnection;
    use sluice_nvmf::pdu::Digests;
    let (nqn, host) = (
        "nqn.2026-11.io.sluice:node",
        "nqn.2014-08.org.nvmexpress:uuid:metrics",
    );
    let mut admin = QueueConnection::open(&node.nvme, Digests::default()).unwrap();
    let cntlid = admin.connect(nqn, host, 0, 0xffff, 5000).unwrap();
    admin.enable().unwrap();
    admin.set_queue_count(1).unwrap();
    let mut io = QueueConnection::open(&node.nvme, Digests::default()).unwrap();
    io.connect(nqn, host, 1, cntlid, 0).unwrap();
    assert_eq!(io.read(1, 5, 3, 4096).unwrap(), vec![7u8; 3 * 4096]);
    io.write(1, 9, &[1u8; 4096], 4096).unwrap();
    io.flush(1).unwrap();
    // Past the namespace's end: answered with an error, and counted so.
    assert!(io.read(1, u64::MAX / 8192, 1, 4096).is_err());
    let out = Command::new("python3")
        .args([
            "-c",
            NODE_METRICS_PY,
            &port.to_string(),
            &cntlid.to_string(),
        ])
        .output()
        .unwrap();
    drop((io, admin));
    assert!(
        out.status.success(),
        "node metrics check failed (scripts/setup installs prometheus-client):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
