//! The node's memory across many connections, alone in its test binary so
//! that no other test's allocations move the figure.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;
use common::*;
use sluice_nvmf::pdu::Digests;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// Each connection that does I/O takes an engine (pinned buffers: a 4 MiB
/// chunk for an 8 KiB read) and gives it back when it ends: 200 of them in
/// a row leave the node's memory where 20 left it.
#[test]
fn connections_that_do_io_and_leave_give_their_engines_back() {
    let t = start(Vec::new());
    let round = || {
        let (_admin, mut io) = connect(&t, Digests::default());
        let got = io.read(1, 8, 2, BLOCK).unwrap();
        assert_eq!(got.len(), 2 * BLOCK as usize);
    };
    for _ in 0..20 {
        round();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after_20 = rss_bytes();
    for _ in 0..200 {
        round();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let grown = rss_bytes().saturating_sub(after_20);
    assert!(
        grown < 64 << 20,
        "{} MiB more after 200 more connections",
        grown >> 20
    );
}
