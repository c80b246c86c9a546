//! The node's memory across many connections, alone in its test binary so
//! that no other test's allocations move the figure.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;
use common::*;
use sluice_nvmf::pdu::Digests;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// One test at a time: the tests of a binary run on threads of one
/// process, and each reads the process's RSS.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What 200 more rounds left behind after 20 warmed up: bytes of RSS
/// gained, and descriptors open after the 20 and after the 200.
fn left_by_200_more(mut round: impl FnMut()) -> (u64, usize, usize) {
    for _ in 0..20 {
        round();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (after_20, fds_after_20) = (rss_bytes(), open_fds());
    for _ in 0..200 {
        round();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let grown = rss_bytes().saturating_sub(after_20);
    (grown, fds_after_20, open_fds())
}

/// Each connection that does I/O takes an engine (pinned buffers: a 4 MiB
/// chunk for an 8 KiB read) and gives it back when it ends: 200 of them in
/// a row leave the node's memory where 20 left it.
#[test]
fn connections_that_do_io_and_leave_give_their_engines_back() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = start(Vec::new());
    let round = || {
        let (_admin, mut io) = connect(&t, Digests::default());
        let got = io.read(1, 8, 2, BLOCK).unwrap();
        assert_eq!(got.len(), 2 * BLOCK as usize);
    };
    let (grown, _, _) = left_by_200_more(round);
    assert!(
        grown < 64 << 20,
        "{} MiB more after 200 more connections",
        grown >> 20
    );
}

/// The same over TLS with a pre-shared key, failed handshakes among them:
/// OpenSSL's sessions and the connections' engines are given back.
#[test]
fn tls_connections_and_failed_handshakes_leave_nothing_behind() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use sluice_nvmf::initiator::QueueConnection;
    use sluice_nvmf::target::TargetConfig;
    use sluice_nvmf::tls::{ConfiguredPsk, TlsClient, TlsServer};
    use std::sync::Arc;
    let key = ConfiguredPsk::generate().unwrap();
    let config = TargetConfig {
        tls: Some(Arc::new(TlsServer::new(key.clone(), NQN.into()).unwrap())),
        tls_required: true,
        ..TargetConfig::default()
    };
    let t = start_configured(Vec::new(), |s, _| s, config);
    let good = TlsClient::new(&key, HOST, NQN).unwrap();
    let wrong = TlsClient::new(&ConfiguredPsk::generate().unwrap(), HOST, NQN).unwrap();
    let round = || {
        let mut admin = QueueConnection::open_tls(&t.address, Digests::default(), &good).unwrap();
        let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
        admin.enable().unwrap();
        admin.set_queue_count(1).unwrap();
        let mut io = QueueConnection::open_tls(&t.address, Digests::default(), &good).unwrap();
        io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
        assert_eq!(io.read(1, 8, 2, BLOCK).unwrap().len(), 2 * BLOCK as usize);
        assert!(QueueConnection::open_tls(&t.address, Digests::default(), &wrong).is_err());
    };
    let (grown, fds_after_20, fds) = left_by_200_more(round);
    assert!(
        grown < 64 << 20,
        "{} MiB more after 200 more rounds over TLS",
        grown >> 20
    );
    // A session kept past its connection keeps its socket.
    assert!(
        fds <= fds_after_20 + 8,
        "{fds} descriptors open after 200 more rounds, {fds_after_20} before"
    );
}

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Connections are served by the workers, not by a thread each: 400 idle
/// connections (and a host doing I/O among them) leave the thread count
/// where it was.
#[test]
fn idle_connections_take_no_thread_each() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use sluice_nvmf::target::TargetConfig;
    let config = TargetConfig {
        max_connections: 1000,
        workers: 2,
        ..TargetConfig::default()
    };
    let t = start_configured(Vec::new(), |s, _| s, config);
    let (_admin, mut io) = connect(&t, Digests::default());
    io.write(1, 3, &vec![7u8; BLOCK as usize], BLOCK).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = threads();
    let idle: Vec<std::net::TcpStream> = (0..400)
        .map(|_| std::net::TcpStream::connect(&t.address).unwrap())
        .collect();
    // The accept path's short-lived threads have handed them over.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let during = threads();
    assert_eq!(io.read(1, 3, 1, BLOCK).unwrap(), vec![7u8; BLOCK as usize]);
    assert!(
        during <= before + 8,
        "{during} threads with 400 idle connections, {before} before"
    );
    drop(idle);
}

/// A host that sends read after read and takes none of the data: the node
/// stops reading its commands once 4 MiB of answers wait, so its memory
/// stays bounded (1000 reads of 128 KiB would be 125 MiB of answers).
#[test]
fn a_host_that_takes_no_answers_is_not_read_past_its_limit() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use sluice_nvmf::initiator::read_sqe;
    use sluice_nvmf::pdu::{Encoder, Header};
    let t = start(Vec::new());
    let (_admin, mut io) = connect(&t, Digests::default());
    // Warm: the engine's pool is there before the figure is taken.
    io.read(1, 0, 32, BLOCK).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = rss_bytes();
    let mut out = Vec::new();
    for k in 0..1000u32 {
        let sqe = read_sqe(1, (k as u64 * 32) % 4000, 32, BLOCK).with_cid(k as u16 + 100);
        Encoder::default().encode(&Header::CapsuleCmd(sqe), 0, &[], &mut out);
    }
    io.send_raw(&out).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "{} MiB more while 1000 reads' answers wait",
        grown >> 20
    );
    // Once the host reads, every answer comes: the commands held back are
    // handled as the answers before them go out.
    // (This host disabled SQ flow control: a read's success comes in its
    // data PDU.)
    let mut completions = 0;
    while completions < 1000 {
        match io.receive_with_flags().unwrap() {
            (Header::CapsuleResp(c), _, _) => {
                assert!(c.status.is_success(), "{c:?}");
                completions += 1;
            }
            (Header::C2hData(_), f, _) if f & sluice_nvmf::pdu::flags::SUCCESS != 0 => {
                completions += 1;
            }
            _ => {}
        }
    }
}
