//! NVMe/TCP over TLS 1.3 with a pre-shared key: the node's initiator
//! against the node, and a host on GnuTLS (the library the Linux host's
//! tlshd runs the handshake with) through `gnutls-cli`.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::*;
use sluice_nvmf::command::status;
use sluice_nvmf::initiator::{is_status, QueueConnection};
use sluice_nvmf::pdu::{Digests, Encoder, Framed, Framer, Header, Limits, PFV_1_0};
use sluice_nvmf::target::TargetConfig;
use sluice_nvmf::tls::{ConfiguredPsk, TlsClient, TlsServer};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

fn tls_target(key: &ConfiguredPsk, required: bool) -> Target {
    let server = TlsServer::new(key.clone(), NQN.into()).unwrap();
    let config = TargetConfig {
        tls: Some(Arc::new(server)),
        tls_required: required,
        ..TargetConfig::default()
    };
    start_configured(Vec::new(), |s, _| s, config)
}

fn connect_tls(t: &Target, key: &ConfiguredPsk, host: &str, digests: Digests) -> QueueConnection {
    let client = TlsClient::new(key, host, NQN).unwrap();
    QueueConnection::open_tls(&t.address, digests, &client).unwrap()
}

#[test]
fn io_over_tls_matches_what_was_written() {
    let key = ConfiguredPsk::generate().unwrap();
    let t = tls_target(&key, true);
    for digests in no_digests_then_both() {
        let mut admin = connect_tls(&t, &key, HOST, digests);
        let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
        admin.enable().unwrap();
        admin.set_queue_count(1).unwrap();
        let mut io = connect_tls(&t, &key, HOST, digests);
        io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
        // In-capsule, one R2T, and several H2CData PDUs' worth.
        for (lba, blocks) in [(0u64, 1u32), (8, 4), (64, 32)] {
            let data: Vec<u8> = (0..blocks as usize * BLOCK as usize)
                .map(|i| (i as u64 * 7 + lba) as u8)
                .collect();
            io.write(1, lba, &data, BLOCK).unwrap();
            assert_eq!(io.read(1, lba, blocks, BLOCK).unwrap(), data);
        }
        // Commands in flight at the device, over TLS.
        let payloads: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i ^ 0x5a; BLOCK as usize]).collect();
        let writes = payloads
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    sluice_nvmf::initiator::rw(0x01, 2, i as u64, 1),
                    d.as_slice(),
                )
            })
            .collect();
        for answer in io.commands(writes).unwrap() {
            answer.unwrap();
        }
        for (i, d) in payloads.iter().enumerate() {
            assert_eq!(&io.read(2, i as u64, 1, BLOCK).unwrap(), d);
        }
        // 128 KiB in the capsule: its data comes in TLS records of at most
        // 16 KiB, most of it read straight into the write's pinned buffer.
        io.in_capsule_bytes = admin.in_capsule_limit().unwrap();
        let before = t.subsystem.write_data_bytes();
        let data: Vec<u8> = (0..32 * BLOCK).map(|i| (i % 251) as u8).collect();
        io.write(1, 128, &data, BLOCK).unwrap();
        assert_eq!(io.read(1, 128, 32, BLOCK).unwrap(), data);
        let after = t.subsystem.write_data_bytes();
        assert!(
            after.direct - before.direct >= 96 << 10,
            "{before:?} -> {after:?} ({digests:?})"
        );
    }
}

#[test]
fn wrong_keys_plain_hosts_and_other_hosts_are_refused() {
    let key = ConfiguredPsk::generate().unwrap();
    let t = tls_target(&key, true);
    // Another key: the handshake fails.
    let other = ConfiguredPsk::generate().unwrap();
    let client = TlsClient::new(&other, HOST, NQN).unwrap();
    let e = QueueConnection::open_tls(&t.address, Digests::default(), &client)
        .err()
        .expect("a wrong key must not connect");
    assert!(e.to_string().contains("TLS"), "{e}");
    // TLS required: a plain host gets no ICResp.
    assert!(QueueConnection::open(&t.address, Digests::default()).is_err());
    // The key of host A, Connect as host B: Connect Invalid Host.
    let mut q = connect_tls(&t, &key, HOST, Digests::default());
    let e = q
        .connect(
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:someone-else",
            0,
            0xffff,
            0,
        )
        .unwrap_err();
    assert!(is_status(&e, status::CONNECT_INVALID_HOST), "{e}");
    // An identity naming another subsystem: refused in the handshake.
    let client = TlsClient::new(&key, HOST, "nqn.2026-11.io.sluice:elsewhere").unwrap();
    assert!(QueueConnection::open_tls(&t.address, Digests::default(), &client).is_err());
    // After all that the node still serves.
    let mut q = connect_tls(&t, &key, HOST, Digests::default());
    q.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
}

#[test]
fn tls_on_takes_plain_and_tls_hosts() {
    let key = ConfiguredPsk::generate().unwrap();
    let t = tls_target(&key, false);
    let mut plain = QueueConnection::open(&t.address, Digests::default()).unwrap();
    plain.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
    let mut tls = connect_tls(&t, &key, HOST, Digests::default());
    tls.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
}
/// A TLS connection costs no thread once its handshake is done: the
/// node's workers serve it with the plain ones. 32 connections (16
/// controllers, an admin and an I/O queue each) all doing I/O, and the
/// threads that ran their handshakes are gone.
#[test]
fn tls_connections_are_served_by_the_workers() {
    let key = ConfiguredPsk::generate().unwrap();
    let t = tls_target(&key, true);
    let mut held = Vec::new();
    for i in 0..16u64 {
        let mut admin = connect_tls(&t, &key, HOST, Digests::default());
        let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 0).unwrap();
        admin.enable().unwrap();
        admin.set_queue_count(1).unwrap();
        let mut io = connect_tls(&t, &key, HOST, Digests::default());
        io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
        let data = vec![i as u8 ^ 0xa5; BLOCK as usize];
        io.write(1, 200 + i, &data, BLOCK).unwrap();
        held.push((admin, io, data));
    }
    // The accept path's threads end with their handoff; other tests of
    // this binary hold a few connections at most. (No keep-alive timeout:
    // the connections stay however long this takes.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads_named("nvmf-conn") >= 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let conn_threads = threads_named("nvmf-conn");
    assert!(
        conn_threads < 8,
        "{conn_threads} connection threads for 32 TLS connections"
    );
    for (i, (_admin, io, data)) in held.iter_mut().enumerate() {
        assert_eq!(&io.read(1, 200 + i as u64, 1, BLOCK).unwrap(), data);
    }
}

/// GnuTLS's command-line client, installed by scripts/setup (Debian's
/// gnutls-bin); the test fails, not skips, without it.
fn gnutls_cli() -> &'static str {
    let path = "/usr/bin/gnutls-cli";
    assert!(
        std::path::Path::new(path).exists(),
        "{path} is missing: scripts/setup installs gnutls-bin"
    );
    path
}

#[test]
fn a_gnutls_host_completes_the_handshake_and_gets_its_icresp() {
    let key = ConfiguredPsk::generate().unwrap();
    let t = tls_target(&key, true);
    let (identity, psk) = key.host_identity(HOST, NQN).unwrap();
    let hex: String = psk.iter().map(|b| format!("{b:02x}")).collect();
    let port = t.address.rsplit(':').next().unwrap();
    let mut child = Command::new(gnutls_cli())
        .args([
            "--port",
            port,
            "--pskusername",
            &identity.text(),
            "--pskkey",
            &hex,
            "--priority",
            "NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:+DHE-PSK:+PSK",
            "--logfile",
            "/dev/null",
            "127.0.0.1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut ic_req = Vec::new();
    Encoder::default().encode(
        &Header::IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        },
        0,
        &[],
        &mut ic_req,
    );
    child.stdin.as_mut().unwrap().write_all(&ic_req).unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    let framer = Framer {
        digests: Digests::default(),
        limits: Limits {
            max_data_bytes: 1 << 20,
            max_capsule_data_bytes: 1 << 20,
        },
    };
    let header = loop {
        // gnutls-cli may print lines of its own before the data; the
        // ICResp is the last 128 bytes.
        if got.len() >= 128 {
            if let Ok(Framed::Pdu(pdu, _)) = framer.next(&got[got.len() - 128..]) {
                break pdu.header;
            }
        }
        let n = out.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "gnutls-cli ended before an ICResp: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&chunk[..n]);
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        matches!(header, Header::IcResp { pfv: PFV_1_0, .. }),
        "{header:?}"
    );
}
