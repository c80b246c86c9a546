//! `sluice node` as its users run it: the binary serving device files to the
//! Linux kernel's own NVMe/TCP host (Debian's kernel booted in QEMU by
//! scripts/nvmf-linux-host), and refusing bad options.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::process::Command;

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn the_linux_kernel_host_writes_reads_and_mounts_a_filesystem_over_nvme_tcp() {
    let root = repo_root();
    let work = root.join("target/tmp/nvmf-host-test");
    let out = Command::new(root.join("scripts/nvmf-linux-host"))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .env("NVMF_HOST_DIR", &work)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
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
    assert!(
        stdout.contains("RESULT discarded bytes 1048576 nonzero 0"),
        "{stdout}"
    );
}

#[test]
fn bad_options_are_refused_before_anything_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["node", "--nqn", "not-an-nqn", "--device"])
        .arg(dir.path().join("a.dev"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("an NQN starts with \"nqn.\""), "{err}");
    assert!(!dir.path().join("a.dev").exists(), "nothing created");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["node", "--create-mib", "4", "--listen"])
        .arg(busy.local_addr().unwrap().to_string())
        .arg("--device")
        .arg(dir.path().join("b.dev"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is another target there?"), "{err}");
    assert!(!dir.path().join("b.dev").exists(), "nothing created");
}
