//! Property and unit tests of the pinned buffer pool.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use proptest::prelude::*;
use sluice_io::pool::region::{Region, RegionAllocator};
use sluice_io::pool::{BufferPool, Direction, OnExhausted, Pinning, PoolConfig, Tier};
use sluice_io::probe::{check_memlock, MemlockLimits};
use sluice_io::{IoBuf, IoError};
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;
const UNIT: usize = 4096;

#[derive(Debug, Clone)]
enum RegionOp {
    Alloc(usize),
    Scatter(usize),
    Free(usize),
    AddChunk,
}

fn region_op() -> impl Strategy<Value = RegionOp> {
    prop_oneof![
        4 => (1usize..=CHUNK).prop_map(RegionOp::Alloc),
        1 => (1usize..=2 * CHUNK).prop_map(RegionOp::Scatter),
        4 => any::<usize>().prop_map(RegionOp::Free),
        1 => Just(RegionOp::AddChunk),
    ]
}

/// Live regions never overlap each other or a free run, and live + free
/// covers every chunk exactly.
fn check_regions(a: &RegionAllocator, live: &[Region]) {
    for id in a.chunk_ids() {
        let mut spans: Vec<(usize, usize, bool)> = a
            .free_runs(id)
            .into_iter()
            .map(|(o, l)| (o, l, true))
            .collect();
        spans.extend(
            live.iter()
                .filter(|r| r.chunk == id)
                .map(|r| (r.offset_bytes, r.len_bytes, false)),
        );
        spans.sort();
        let mut at = 0;
        let mut prev_free = false;
        for (off, len, free) in spans {
            assert_eq!(off, at, "gap or overlap at offset {off} in chunk {id}");
            assert!(
                !(free && prev_free),
                "two adjacent free runs at {off} in chunk {id}: not merged"
            );
            prev_free = free;
            at += len;
        }
        assert_eq!(at, CHUNK, "chunk {id} not covered exactly");
    }
    let live_bytes: usize = live.iter().map(|r| r.len_bytes).sum();
    assert_eq!(a.free_bytes() + live_bytes, a.total_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn regions_never_overlap_and_free_restores_whole_chunks(ops in prop::collection::vec(region_op(), 1..200)) {
        let t0 = Instant::now();
        let mut a = RegionAllocator::new(CHUNK, UNIT);
        a.add_chunk(t0);
        let mut live: Vec<Region> = Vec::new();
        for op in ops {
            match op {
                RegionOp::Alloc(len) => {
                    if let Some(r) = a.alloc_contiguous(len) {
                        prop_assert!(r.len_bytes >= len && r.len_bytes % UNIT == 0);
                        live.push(r);
                    }
                }
                RegionOp::Scatter(len) => {
                    let free_before = a.free_bytes();
                    match a.alloc_scattered(len, 8) {
                        Some(rs) => {
                            let got: usize = rs.iter().map(|r| r.len_bytes).sum();
                            prop_assert_eq!(got, a.round(len));
                            prop_assert!(rs.len() <= 8);
                            live.extend(rs);
                        }
                        None => prop_assert_eq!(a.free_bytes(), free_before, "failed scatter took memory"),
                    }
                }
                RegionOp::Free(i) if !live.is_empty() => {
                    let r = live.swap_remove(i % live.len());
                    a.free(r, t0).unwrap();
                }
                RegionOp::Free(_) => {}
                RegionOp::AddChunk => { a.add_chunk(t0); }
            }
            check_regions(&a, &live);
        }
        for r in live.drain(..) {
            a.free(r, t0).unwrap();
        }
        for id in a.chunk_ids() {
            prop_assert_eq!(a.free_runs(id), vec![(0, CHUNK)], "chunk {} not whole after freeing all", id);
        }
        prop_assert_eq!(a.fragmentation(), if a.chunk_count() > 1 { 1.0 - 1.0 / a.chunk_count() as f64 } else { 0.0 });
    }
}

#[test]
fn freeing_a_region_not_allocated_is_refused() {
    let t0 = Instant::now();
    let mut a = RegionAllocator::new(CHUNK, UNIT);
    let id = a.add_chunk(t0);
    let r = a.alloc_contiguous(8192).unwrap();
    a.free(r, t0).unwrap();
    assert!(a.free(r, t0).is_err(), "double free must be caught");
    let bogus = Region {
        chunk: id + 9,
        offset_bytes: 0,
        len_bytes: 4096,
    };
    assert!(a.free(bogus, t0).is_err());
}

#[test]
fn idle_chunks_are_released_only_after_the_idle_time() {
    let t0 = Instant::now();
    let mut a = RegionAllocator::new(CHUNK, UNIT);
    a.add_chunk(t0);
    let r = a.alloc_contiguous(4096).unwrap();
    a.free(r, t0 + Duration::from_secs(1)).unwrap();
    let idle = Duration::from_secs(2);
    assert!(a
        .idle_chunks(t0 + Duration::from_millis(2999), idle)
        .is_empty());
    assert_eq!(a.idle_chunks(t0 + Duration::from_secs(3), idle).len(), 1);
}

fn small_config(max_pinned_bytes: u64) -> PoolConfig {
    PoolConfig {
        small_block_size_bytes: 4096,
        small_read_blocks: 4,
        small_write_blocks: 2,
        chunk_size_bytes: 1 << 20,
        max_pinned_bytes,
        idle_release_ms: 1000,
        on_exhausted: OnExhausted::Fail,
        max_segments: 8,
        table_slots: 64,
    }
}

#[derive(Debug, Clone)]
enum PoolOp {
    Alloc(usize, bool),
    Drop(usize),
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    let size = prop_oneof![
        3 => 1usize..=4096,
        4 => 4097usize..(1 << 20),
        1 => (1usize << 20)..(3 << 20),
    ];
    prop_oneof![
        3 => (size, any::<bool>()).prop_map(|(s, w)| PoolOp::Alloc(s, w)),
        2 => any::<usize>().prop_map(PoolOp::Drop),
    ]
}

/// Address ranges of every live buffer are pairwise disjoint.
fn check_disjoint(live: &[IoBuf]) {
    let mut spans: Vec<(usize, usize)> = live
        .iter()
        .flat_map(|b| {
            b.segments()
                .iter()
                .map(|s| (s.ptr() as usize, s.len_bytes()))
                .collect::<Vec<_>>()
        })
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "two live buffers overlap: {w:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn pool_accounting_is_exact_and_never_exceeds_max(ops in prop::collection::vec(pool_op(), 1..120)) {
        let cfg = small_config(8 << 20);
        let small = cfg.small_tier_bytes();
        let pool = BufferPool::new(cfg.clone(), Pinning::Unpinned).unwrap();
        let mut live: Vec<IoBuf> = Vec::new();
        for op in ops {
            match op {
                PoolOp::Alloc(len, write) => {
                    let dir = if write { Direction::Write } else { Direction::Read };
                    match pool.alloc(len, dir) {
                        Ok(mut b) => {
                            prop_assert_eq!(b.len(), len);
                            prop_assert!(b.capacity() >= len);
                            // Every byte is writable and reads back.
                            let fill = vec![(len % 251) as u8; len];
                            b.write_at(0, &fill);
                            prop_assert_eq!(b.to_vec(), fill);
                            live.push(b);
                        }
                        Err(IoError::PoolExhausted { pinned_bytes, max_pinned_bytes, .. }) => {
                            prop_assert!(pinned_bytes <= max_pinned_bytes);
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
                    }
                }
                PoolOp::Drop(i) if !live.is_empty() => { live.swap_remove(i % live.len()); }
                PoolOp::Drop(_) => {}
            }
            check_disjoint(&live);
            let s = pool.stats();
            let big: u64 = live.iter().filter(|b| b.tier() == Tier::Big).map(|b| b.capacity() as u64).sum();
            prop_assert!(s.pinned_bytes <= cfg.max_pinned_bytes, "pinned {} > M", s.pinned_bytes);
            prop_assert!(s.peak_pinned_bytes <= cfg.max_pinned_bytes);
            prop_assert_eq!(s.pinned_bytes, small + s.chunks * cfg.chunk_size_bytes as u64 + big);
            prop_assert_eq!(s.pins - s.unpins, 3 + s.chunks + live.iter().filter(|b| b.tier() == Tier::Big).count() as u64);
        }
        drop(live);
        prop_assert_eq!(pool.small_blocks_in_use(), 0);
        for (id, runs) in pool.medium_free_map() {
            prop_assert_eq!(runs, vec![(0, cfg.chunk_size_bytes)], "chunk {} not whole", id);
        }
        // After the idle time every chunk goes, and only the small tier stays pinned.
        pool.release_idle_at(Instant::now() + Duration::from_millis(cfg.idle_release_ms));
        let s = pool.stats();
        prop_assert_eq!(s.chunks, 0);
        prop_assert_eq!(s.pinned_bytes, small);
    }
}

#[test]
fn tiers_are_chosen_by_size() {
    let pool = BufferPool::new(small_config(16 << 20), Pinning::Unpinned).unwrap();
    assert_eq!(
        pool.alloc(100, Direction::Read).unwrap().tier(),
        Tier::Small
    );
    assert_eq!(
        pool.alloc(4096, Direction::Write).unwrap().tier(),
        Tier::Small
    );
    assert_eq!(
        pool.alloc(4097, Direction::Read).unwrap().tier(),
        Tier::Medium
    );
    assert_eq!(
        pool.alloc((1 << 20) - 1, Direction::Read).unwrap().tier(),
        Tier::Medium
    );
    assert_eq!(
        pool.alloc(1 << 20, Direction::Read).unwrap().tier(),
        Tier::Big
    );
    let s = pool.stats();
    assert_eq!((s.small_allocs, s.medium_allocs, s.big_allocs), (2, 2, 1));
}

#[test]
fn write_lists_alternate_and_return_when_drained() {
    let pool = BufferPool::new(small_config(16 << 20), Pinning::Unpinned).unwrap();
    assert_eq!(pool.active_write_list(), 0);
    let a: Vec<IoBuf> = (0..2)
        .map(|_| pool.alloc(512, Direction::Write).unwrap())
        .collect();
    // List 0 is full: the next write block comes from list 1.
    let b: Vec<IoBuf> = (0..2)
        .map(|_| pool.alloc(512, Direction::Write).unwrap())
        .collect();
    assert_eq!(pool.active_write_list(), 1);
    assert!(b.iter().all(|x| x.tier() == Tier::Small));
    // Both lists are out (list 0 sealed, being written): a fifth small write
    // spills to the medium tier rather than reuse a block in flight.
    let spill = pool.alloc(512, Direction::Write).unwrap();
    assert_eq!(spill.tier(), Tier::Medium);
    drop(a);
    // List 0 drained: it serves again once list 1 runs out.
    drop(b);
    let c = pool.alloc(512, Direction::Write).unwrap();
    assert_eq!(c.tier(), Tier::Small);
    // Reads have their own list.
    let r: Vec<IoBuf> = (0..4)
        .map(|_| pool.alloc(4096, Direction::Read).unwrap())
        .collect();
    assert!(r.iter().all(|x| x.tier() == Tier::Small));
    assert_eq!(
        pool.alloc(4096, Direction::Read).unwrap().tier(),
        Tier::Medium
    );
}

#[test]
fn pool_limit_fails_with_a_clear_error() {
    let cfg = small_config(small_config(0).small_tier_bytes() + (2 << 20));
    let pool = BufferPool::new(cfg, Pinning::Unpinned).unwrap();
    let _a = pool.alloc(900 << 10, Direction::Read).unwrap();
    let _b = pool.alloc(900 << 10, Direction::Read).unwrap();
    let err = pool.alloc(1 << 20, Direction::Read).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            IoError::PoolExhausted {
                requested_bytes: 1048576,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("max_pinned_bytes"), "{msg}");
    assert_eq!(pool.stats().failures, 1);
}

#[test]
fn pool_waits_for_a_buffer_to_come_back() {
    let mut cfg = small_config(small_config(0).small_tier_bytes() + (1 << 20));
    cfg.on_exhausted = OnExhausted::Wait { timeout_ms: 5000 };
    let pool = BufferPool::new(cfg, Pinning::Unpinned).unwrap();
    let held = pool.alloc(1 << 20, Direction::Read).unwrap();
    assert_eq!(held.tier(), Tier::Big);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    let started = Instant::now();
    let got = pool.alloc(1 << 20, Direction::Read).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(90));
    assert!(pool.stats().waits >= 1);
    drop(got);
    releaser.join().unwrap();
    // And a wait that times out says how long it waited.
    let mut cfg = small_config(small_config(0).small_tier_bytes() + (1 << 20));
    cfg.on_exhausted = OnExhausted::Wait { timeout_ms: 50 };
    let pool = BufferPool::new(cfg, Pinning::Unpinned).unwrap();
    let _held = pool.alloc(1 << 20, Direction::Read).unwrap();
    let err = pool.alloc(1 << 20, Direction::Read).unwrap_err();
    assert!(err.to_string().contains("after waiting"), "{err}");
    // A request larger than the ceiling fails at once instead of waiting.
    let err = pool.alloc(64 << 20, Direction::Read).unwrap_err();
    assert!(matches!(err, IoError::PoolExhausted { .. }), "{err}");
    assert!(!err.to_string().contains("after waiting"), "{err}");
}

#[test]
fn big_request_reclaims_free_chunks_before_failing() {
    let cfg = small_config(small_config(0).small_tier_bytes() + (2 << 20));
    let pool = BufferPool::new(cfg, Pinning::Unpinned).unwrap();
    let a = pool.alloc(512 << 10, Direction::Read).unwrap();
    let b = pool.alloc(900 << 10, Direction::Read).unwrap();
    assert_eq!(pool.stats().chunks, 2);
    drop(a);
    drop(b);
    // Two free (not yet idle) chunks hold all of M; a big request releases them.
    let big = pool.alloc(2 << 20, Direction::Read).unwrap();
    assert_eq!(big.tier(), Tier::Big);
    assert_eq!(pool.stats().chunks, 0);
}

#[test]
fn invalid_pool_configs_are_named() {
    let mut cfg = small_config(1 << 20);
    let err = BufferPool::new(cfg.clone(), Pinning::Unpinned).unwrap_err();
    assert!(err.to_string().contains("max_pinned_bytes"), "{err}");
    cfg.max_pinned_bytes = 64 << 20;
    cfg.chunk_size_bytes = 5000;
    let err = BufferPool::new(cfg.clone(), Pinning::Unpinned).unwrap_err();
    assert!(err.to_string().contains("chunk_size_bytes 5000"), "{err}");
    cfg.chunk_size_bytes = 3 << 20;
    let err = BufferPool::new(cfg, Pinning::Unpinned).unwrap_err();
    assert!(err.to_string().contains("huge pages"), "{err}");
    let pool = BufferPool::new(small_config(16 << 20), Pinning::Unpinned).unwrap();
    assert!(matches!(
        pool.alloc(0, Direction::Read),
        Err(IoError::BadLength { .. })
    ));
}

#[test]
fn memlock_limit_is_checked_before_pinning() {
    let low = MemlockLimits {
        limit_bytes: 8 << 20,
        cap_ipc_lock: false,
    };
    let err = check_memlock(256 << 20, &low).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(
        err,
        IoError::MemlockTooLow {
            requested_bytes: 268435456,
            limit_bytes: 8388608
        }
    ));
    assert!(msg.contains("ulimit -l"), "{msg}");
    check_memlock(4 << 20, &low).unwrap();
    let privileged = MemlockLimits {
        limit_bytes: 8 << 20,
        cap_ipc_lock: true,
    };
    check_memlock(256 << 20, &privileged).unwrap();
}

#[test]
fn memlock_too_low_in_a_real_process() {
    // Lower this process's limit in a child so the check meets a real
    // RLIMIT_MEMLOCK. As root CAP_IPC_LOCK lifts the limit, so the child also
    // drops that capability with setpriv (util-linux).
    let exe = std::env::current_exe().unwrap();
    if std::env::var("SLUICE_MEMLOCK_CHILD").is_ok() {
        return;
    }
    let status = std::process::Command::new("setpriv")
        .args([
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
            "prlimit",
            "--memlock=1048576:1048576",
        ])
        .arg(&exe)
        .args(["--exact", "memlock_child_probe", "--nocapture"])
        .env("SLUICE_MEMLOCK_CHILD", "1")
        .output();
    let out = match status {
        Ok(o) => o,
        Err(e) => panic!("setpriv/prlimit (util-linux) must be installed: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("MEMLOCK-REFUSED"), "child output: {text}");
}

#[test]
fn memlock_child_probe() {
    if std::env::var("SLUICE_MEMLOCK_CHILD").is_err() {
        return;
    }
    let limits = sluice_io::probe::memlock();
    assert_eq!(limits.limit_bytes, 1 << 20);
    assert!(
        !limits.cap_ipc_lock,
        "CAP_IPC_LOCK should have been dropped"
    );
    let err = BufferPool::new(PoolConfig::default(), Pinning::Mlock).unwrap_err();
    assert!(matches!(err, IoError::MemlockTooLow { .. }), "{err}");
    println!("MEMLOCK-REFUSED: {err}");
}
