//! Engine tests: every engine on a real file, on a loop device, and on the
//! memory device with each injected fault.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_io::engine::{
    open_engine, Completion, Engine, EngineConfig, EngineKind, Op, Priority, Request,
};
use sluice_io::pool::{Direction, OnExhausted, Tier};
use sluice_io::{Device, FileDevice, FileOptions, IoBuf, IoError, MemoryDevice, PowerCutMode};
use std::sync::Arc;

mod common;
use common::{pattern, LoopDevice};

fn config(kind: EngineKind) -> EngineConfig {
    let mut c = EngineConfig {
        kind,
        queue_depth: 32,
        allow_fallback: false,
        ..EngineConfig::default()
    };
    c.pool.max_pinned_bytes = 64 << 20;
    c.pool.on_exhausted = OnExhausted::Fail;
    c
}

fn file_device(dir: &tempfile::TempDir, size: u64) -> Arc<dyn Device> {
    Arc::new(FileDevice::create(&dir.path().join("dev"), size, &FileOptions::default()).unwrap())
}

fn write_buf(engine: &dyn Engine, len: usize, seed: u64) -> IoBuf {
    let mut buf = engine.pool().alloc(len, Direction::Write).unwrap();
    buf.write_at(0, &pattern(len, seed));
    buf
}

fn ok(c: Completion) -> Completion {
    if let Err(e) = &c.result {
        panic!("I/O {:?} at LBA {} failed: {e}", c.op, c.lba);
    }
    c
}

/// Writes many buffers of mixed sizes (all three tiers, scatter/gather when
/// the pool is fragmented), flushes, reads each back and compares.
fn write_read_roundtrip(engine: &mut dyn Engine) {
    let bs = engine.device().geometry().block_size_bytes as usize;
    let sizes = [bs, 4096, 8192, 64 << 10, 1 << 20, 3 << 20, 4 << 20, 6 << 20];
    let mut lba = 0u64;
    let mut placed = Vec::new();
    let mut out = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let buf = write_buf(engine, len, i as u64);
        engine.submit(Request::write(lba, buf, i as u64)).unwrap();
        placed.push((lba, len, i as u64));
        lba += (len / bs) as u64;
    }
    while engine.in_flight() > 0 {
        engine.reap(1, &mut out).unwrap();
    }
    for c in out.drain(..) {
        let c = ok(c);
        assert_eq!(c.result.unwrap(), sizes[c.user_data as usize]);
    }
    ok(engine.run(Request::flush(99)));
    for &(lba, len, seed) in &placed {
        let buf = engine.pool().alloc(len, Direction::Read).unwrap();
        let c = ok(engine.run(Request::read(lba, buf, seed)));
        let got = c.buf.unwrap().to_vec();
        assert!(
            got == pattern(len, seed),
            "data read back at LBA {lba} differs from what was written"
        );
    }
}

#[test]
fn uring_roundtrip_on_file() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut engine = open_engine(file_device(&dir, 64 << 20), &config(EngineKind::Uring)).unwrap();
    assert_eq!(engine.kind(), EngineKind::Uring);
    assert!(
        engine.pool().is_registered(),
        "uring engine should use fixed buffers here"
    );
    write_read_roundtrip(engine.as_mut());
    let stats = engine.pool().stats();
    assert!(
        stats.small_allocs > 0 && stats.medium_allocs > 0 && stats.big_allocs > 0,
        "{stats:?}"
    );
}

#[test]
fn uring_sqpoll_roundtrip_on_file() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut cfg = config(EngineKind::Uring);
    cfg.sqpoll_idle_ms = Some(50);
    let mut engine = open_engine(file_device(&dir, 64 << 20), &cfg).unwrap();
    assert!(
        engine.describe().contains("SQPOLL"),
        "{}",
        engine.describe()
    );
    write_read_roundtrip(engine.as_mut());
}

#[test]
fn uring_spin_wait_roundtrip_on_file() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut cfg = config(EngineKind::Uring);
    cfg.spin_wait_us = 2000;
    let mut engine = open_engine(file_device(&dir, 64 << 20), &cfg).unwrap();
    write_read_roundtrip(engine.as_mut());
    // One request at a time, as a storage node's connection waits: each
    // wait polls for the completion first (or sleeps when another thread
    // of this test binary holds the polling slots), and every read is whole.
    for i in 0..200u64 {
        let buf = engine.pool().alloc(4096, Direction::Read).unwrap();
        let c = ok(engine.run(Request::read(i % 16, buf, i)));
        assert_eq!(c.result.unwrap(), 4096);
    }
    assert!(sluice_io::spin::SpinSlot::taken() <= sluice_io::spin::max_pollers());
}

#[test]
fn uring_spin_wait_issues_what_the_gate_holds_after_the_kernel_empties() {
    // Low requests wait in the gate while high ones hold their share; a
    // poll that sees every request in the kernel complete must issue them
    // before it waits again (waiting with nothing in the kernel never ends).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
        let mut cfg = config(EngineKind::Uring);
        cfg.spin_wait_us = 5000;
        cfg.queue_depth = 8;
        cfg.high_share = 0.5;
        let mut engine = open_engine(file_device(&dir, 1 << 20), &cfg).unwrap();
        for round in 0..50u64 {
            for ud in 0..7u64 {
                let p = if ud < 4 {
                    Priority::High
                } else {
                    Priority::Low
                };
                let buf = engine.pool().alloc(4096, Direction::Read).unwrap();
                engine
                    .submit(Request::read(ud, buf, round * 10 + ud).with_priority(p))
                    .unwrap();
            }
            let mut out = Vec::new();
            while out.len() < 7 {
                engine.reap(7 - out.len(), &mut out).unwrap();
            }
            assert!(out.iter().all(|c| c.result.is_ok()));
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the reaps finished (a reap waited with nothing in the kernel)");
}

#[test]
fn posix_roundtrip_direct_and_buffered() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut engine = open_engine(file_device(&dir, 64 << 20), &config(EngineKind::Posix)).unwrap();
    write_read_roundtrip(engine.as_mut());
    let opts = FileOptions {
        direct: false,
        ..FileOptions::default()
    };
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&dir.path().join("dev"), &opts).unwrap());
    let mut engine = open_engine(dev, &config(EngineKind::Posix)).unwrap();
    assert!(engine.describe().contains("buffered"));
    write_read_roundtrip(engine.as_mut());
}

#[test]
fn uring_and_posix_see_each_others_writes() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let dev = file_device(&dir, 16 << 20);
    let mut uring = open_engine(dev.clone(), &config(EngineKind::Uring)).unwrap();
    let mut posix = open_engine(dev, &config(EngineKind::Posix)).unwrap();
    let buf = write_buf(uring.as_ref(), 128 << 10, 7);
    ok(uring.run(Request::write(10, buf, 1)));
    let c = ok(posix.run(Request::read(
        10,
        posix.pool().alloc(128 << 10, Direction::Read).unwrap(),
        2,
    )));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(128 << 10, 7));
}

#[test]
fn loop_device_geometry_and_io() {
    let Some(lo) = LoopDevice::attach("loop_device_geometry_and_io", 32 << 20) else {
        return;
    };
    let opts = FileOptions::default();
    let dev = FileDevice::open(&lo.path, &opts).unwrap();
    assert!(dev.is_block_device());
    let g = dev.geometry();
    assert_eq!(
        g.size_bytes(),
        32 << 20,
        "BLKGETSIZE64 should report the backing file's size"
    );
    assert_eq!(
        g.block_size_bytes, 512,
        "loop devices default to 512-byte logical blocks"
    );
    let dev: Arc<dyn Device> = Arc::new(dev);
    for kind in [EngineKind::Uring, EngineKind::Posix] {
        let mut engine = open_engine(dev.clone(), &config(kind)).unwrap();
        write_read_roundtrip(engine.as_mut());
        // The last block is addressable, the one after it is not.
        let last = g.block_count - 1;
        let buf = engine.pool().alloc(512, Direction::Read).unwrap();
        ok(engine.run(Request::read(last, buf, 1)));
        let buf = engine.pool().alloc(512, Direction::Read).unwrap();
        let c = engine.run(Request::read(last + 1, buf, 2));
        assert!(
            matches!(c.result, Err(IoError::OutOfRange { .. })),
            "{:?}",
            c.result
        );
    }
}

#[test]
fn memory_device_read_and_write_errors() {
    let dev = Arc::new(MemoryDevice::new(4096, 256));
    dev.inject_read_error(10);
    dev.inject_write_error(20);
    let mut engine = open_engine(dev.clone(), &config(EngineKind::Posix)).unwrap();
    let buf = write_buf(engine.as_ref(), 8192, 1);
    let c = engine.run(Request::write(19, buf, 1));
    match c.result {
        Err(IoError::Media { lba: 20, .. }) => {}
        other => panic!("expected media error at LBA 20, got {other:?}"),
    }
    assert!(
        c.buf.is_some(),
        "the buffer comes back with a failed completion"
    );
    // Writes elsewhere still work; reads of the faulty LBA fail, neighbours succeed.
    ok(engine.run(Request::write(9, write_buf(engine.as_ref(), 4096, 2), 2)));
    let c = engine.run(Request::read(
        9,
        engine.pool().alloc(8192, Direction::Read).unwrap(),
        3,
    ));
    assert!(
        matches!(c.result, Err(IoError::Media { lba: 10, .. })),
        "{:?}",
        c.result
    );
    let c = ok(engine.run(Request::read(
        9,
        engine.pool().alloc(4096, Direction::Read).unwrap(),
        4,
    )));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(4096, 2));
    dev.clear_faults();
    ok(engine.run(Request::read(
        10,
        engine.pool().alloc(4096, Direction::Read).unwrap(),
        5,
    )));
}

#[test]
fn memory_device_power_cut_drops_unflushed_writes() {
    let dev = Arc::new(MemoryDevice::new(4096, 64));
    let mut engine = open_engine(dev.clone(), &config(EngineKind::Posix)).unwrap();
    ok(engine.run(Request::write(0, write_buf(engine.as_ref(), 4096, 1), 1)));
    ok(engine.run(Request::flush(2)));
    ok(engine.run(Request::write(1, write_buf(engine.as_ref(), 4096, 2), 3)));
    ok(engine.run(Request::write(0, write_buf(engine.as_ref(), 4096, 3), 4)));
    assert_eq!(dev.unflushed_writes(), 2);
    dev.power_cut(PowerCutMode::DropUnflushed);
    let c = ok(engine.run(Request::read(
        0,
        engine.pool().alloc(8192, Direction::Read).unwrap(),
        5,
    )));
    let got = c.buf.unwrap().to_vec();
    assert_eq!(
        &got[..4096],
        &pattern(4096, 1)[..],
        "flushed block survives"
    );
    assert!(
        got[4096..].iter().all(|&b| b == 0),
        "unflushed block is gone"
    );
}

#[test]
fn memory_device_power_cut_tears_at_sector_granularity() {
    let dev = Arc::new(MemoryDevice::new(4096, 64));
    let mut engine = open_engine(dev.clone(), &config(EngineKind::Posix)).unwrap();
    let len = 64 << 10;
    ok(engine.run(Request::write(0, write_buf(engine.as_ref(), len, 9), 1)));
    dev.power_cut(PowerCutMode::TornSectors { seed: 42 });
    let c = ok(engine.run(Request::read(
        0,
        engine.pool().alloc(len, Direction::Read).unwrap(),
        2,
    )));
    let got = c.buf.unwrap().to_vec();
    let want = pattern(len, 9);
    let (mut kept, mut lost) = (0, 0);
    for (g, w) in got.chunks(512).zip(want.chunks(512)) {
        if g == w {
            kept += 1;
        } else {
            assert!(
                g.iter().all(|&b| b == 0),
                "a sector is either whole or absent, never mixed"
            );
            lost += 1;
        }
    }
    assert!(
        kept > 0 && lost > 0,
        "torn write should keep some sectors and lose others ({kept}/{lost})"
    );
}

#[test]
fn priorities_low_waits_while_high_holds_its_share() {
    let dev = Arc::new(MemoryDevice::new(4096, 1024));
    let mut cfg = config(EngineKind::Posix);
    cfg.queue_depth = 8;
    cfg.high_share = 0.5; // low waits while 4 or more high are in flight
    cfg.posix_threads = 1;
    let mut engine = open_engine(dev, &cfg).unwrap();
    let submit = |engine: &mut Box<dyn Engine>, ud: u64, p: Priority| {
        let buf = engine.pool().alloc(4096, Direction::Read).unwrap();
        engine
            .submit(Request::read(ud % 64, buf, ud).with_priority(p))
            .unwrap();
    };
    let drain = |engine: &mut Box<dyn Engine>| {
        let mut out = Vec::new();
        while engine.in_flight() > 0 {
            engine.reap(1, &mut out).unwrap();
        }
        assert!(out.iter().all(|c| c.result.is_ok()));
        out.iter().map(|c| c.user_data).collect::<Vec<u64>>()
    };
    // Three high in flight, below the share: a low request goes straight out.
    for ud in 0..3 {
        submit(&mut engine, ud, Priority::High);
    }
    submit(&mut engine, 100, Priority::Low);
    submit(&mut engine, 3, Priority::High);
    assert_eq!(drain(&mut engine), vec![0, 1, 2, 100, 3]);
    // Four high in flight hold the share: low requests wait for them.
    for ud in 0..4 {
        submit(&mut engine, ud, Priority::High);
    }
    for ud in 100..103 {
        submit(&mut engine, ud, Priority::Low);
    }
    submit(&mut engine, 4, Priority::High);
    assert_eq!(drain(&mut engine), vec![0, 1, 2, 3, 4, 100, 101, 102]);
}

#[test]
fn uring_kernel_ioprio_is_accepted() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut engine = open_engine(file_device(&dir, 8 << 20), &config(EngineKind::Uring)).unwrap();
    let buf = write_buf(engine.as_ref(), 4096, 3);
    ok(engine.run(Request::write(0, buf, 1).with_priority(Priority::Low)));
    let buf = engine.pool().alloc(4096, Direction::Read).unwrap();
    let c = ok(engine.run(Request::read(0, buf, 2).with_priority(Priority::Low)));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(4096, 3));
}

#[test]
fn bad_requests_are_rejected_with_the_buffer_back() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    for kind in [EngineKind::Uring, EngineKind::Posix] {
        let mut engine = open_engine(file_device(&dir, 1 << 20), &config(kind)).unwrap();
        // Length not a multiple of the block size.
        let mut buf = engine.pool().alloc(4096, Direction::Read).unwrap();
        buf.set_len(1000);
        let r = engine.submit(Request::read(0, buf, 1)).unwrap_err();
        assert!(
            matches!(r.error, IoError::Misaligned { value: 1000, .. }),
            "{}",
            r.error
        );
        assert!(r.error.to_string().contains("1000") && r.error.to_string().contains("4096"));
        assert!(r.request.buf.is_some());
        // LBA beyond the end.
        let buf = engine.pool().alloc(8192, Direction::Read).unwrap();
        let r = engine.submit(Request::read(255, buf, 2)).unwrap_err();
        assert!(
            matches!(
                r.error,
                IoError::OutOfRange {
                    lba: 255,
                    block_count: 256,
                    ..
                }
            ),
            "{}",
            r.error
        );
        assert_eq!(engine.in_flight(), 0);
        let c = engine.run(Request {
            op: Op::Read,
            lba: 0,
            buf: None,
            priority: Priority::High,
            user_data: 3,
            after_prior: false,
            dsync: false,
        });
        assert!(
            matches!(c.result, Err(IoError::Config(_))),
            "read without buffer: {:?}",
            c.result
        );
    }
}

#[test]
fn misaligned_memory_is_refused_by_devices() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let dev = FileDevice::create(&dir.path().join("d"), 1 << 20, &FileOptions::default()).unwrap();
    let mut backing = IoBuf::unpooled(8192);
    let slice = &mut backing.as_mut_slice().unwrap()[1..4097];
    let err = dev.read_at(0, slice).unwrap_err();
    assert!(
        matches!(
            err,
            IoError::MisalignedBuffer {
                alignment_bytes: 4096,
                ..
            }
        ),
        "{err}"
    );
    let err = dev.write_at(0, &[0u8; 100]).unwrap_err();
    assert!(
        matches!(err, IoError::Misaligned { value: 100, .. }),
        "{err}"
    );
}

#[test]
fn queue_depth_is_a_hard_limit() {
    let dev = Arc::new(MemoryDevice::new(4096, 64));
    let mut cfg = config(EngineKind::Posix);
    cfg.queue_depth = 2;
    let mut engine = open_engine(dev, &cfg).unwrap();
    for i in 0..2 {
        let b = engine.pool().alloc(4096, Direction::Read).unwrap();
        engine.submit(Request::read(i, b, i)).unwrap();
    }
    let b = engine.pool().alloc(4096, Direction::Read).unwrap();
    let r = engine.submit(Request::read(5, b, 5)).unwrap_err();
    assert!(matches!(r.error, IoError::QueueFull { queue_depth: 2 }));
    let mut out = Vec::new();
    engine.reap(2, &mut out).unwrap();
    assert_eq!(out.len(), 2);
    engine.submit(r.request).unwrap();
}

#[test]
fn scatter_gather_buffer_roundtrips_through_uring() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut cfg = config(EngineKind::Uring);
    cfg.pool.max_pinned_bytes = cfg.pool.small_tier_bytes() + (4 << 20);
    let mut engine = open_engine(file_device(&dir, 16 << 20), &cfg).unwrap();
    // Fill the single chunk with 64 KiB pieces, free every other one: 2 MiB
    // free, no run longer than 64 KiB.
    let mut held: Vec<IoBuf> = (0..64)
        .map(|_| engine.pool().alloc(64 << 10, Direction::Read).unwrap())
        .collect();
    let mut i = 0;
    held.retain(|_| {
        i += 1;
        i % 2 == 0
    });
    let mut buf = engine.pool().alloc(512 << 10, Direction::Write).unwrap();
    assert_eq!(buf.tier(), Tier::Scattered);
    assert_eq!(buf.segments().len(), 8);
    buf.write_at(0, &pattern(512 << 10, 5));
    ok(engine.run(Request::write(100, buf, 1)));
    let rb = engine.pool().alloc(512 << 10, Direction::Read).unwrap();
    assert_eq!(rb.tier(), Tier::Scattered);
    let c = ok(engine.run(Request::read(100, rb, 2)));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(512 << 10, 5));
    drop(held);
}

#[test]
fn uring_falls_back_to_posix_for_a_memory_device() {
    let dev = Arc::new(MemoryDevice::new(4096, 64));
    let mut cfg = config(EngineKind::Uring);
    cfg.allow_fallback = true;
    let engine = open_engine(dev.clone(), &cfg).unwrap();
    assert_eq!(engine.kind(), EngineKind::Posix);
    assert_eq!(engine.notes().len(), 1);
    assert!(
        engine.notes()[0].contains("uring -> posix"),
        "{:?}",
        engine.notes()
    );
    cfg.allow_fallback = false;
    let err = open_engine(dev, &cfg).err().expect("no fallback allowed");
    assert!(
        matches!(
            err,
            IoError::FeatureMissing {
                feature: "a file descriptor",
                ..
            }
        ),
        "{err}"
    );
}

/// Real IOPOLL needs a block device with poll queues (NVMe with poll_queues,
/// null_blk): this project's machines have a virtio disk without them and a
/// kernel without null_blk, so the test covers the probe and the fallback;
/// on a disk with poll queues it says so and checks nothing more.
#[test]
fn iopoll_without_poll_queues_falls_back_with_a_note() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let dev = file_device(&dir, 1 << 20);
    let (maj, min) = dev.backing_dev().unwrap();
    if sluice_io::probe::device_has_poll_queues(maj, min) {
        common::skipped(
            "iopoll_without_poll_queues_falls_back_with_a_note",
            "this disk has poll queues: IOPOLL is used, there is no fallback to check",
        );
        return;
    }
    let mut cfg = config(EngineKind::Uring);
    cfg.iopoll = true;
    let err = open_engine(dev.clone(), &cfg)
        .err()
        .expect("IOPOLL unavailable and fallback off");
    assert!(
        matches!(
            err,
            IoError::FeatureMissing {
                feature: "IOPOLL",
                ..
            }
        ),
        "{err}"
    );
    cfg.allow_fallback = true;
    let mut engine = open_engine(dev, &cfg).unwrap();
    assert!(
        engine.notes().iter().any(|n| n.contains("IOPOLL")),
        "{:?}",
        engine.notes()
    );
    write_read_roundtrip_small(engine.as_mut());
}

fn write_read_roundtrip_small(engine: &mut dyn Engine) {
    ok(engine.run(Request::write(3, write_buf(engine, 8192, 4), 1)));
    let c = ok(engine.run(Request::read(
        3,
        engine.pool().alloc(8192, Direction::Read).unwrap(),
        2,
    )));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(8192, 4));
}

#[test]
fn device_too_small_and_bad_paths_are_clear() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let path = dir.path().join("small");
    FileDevice::create(&path, 1 << 20, &FileOptions::default()).unwrap();
    let opts = FileOptions {
        min_size_bytes: 8 << 20,
        ..FileOptions::default()
    };
    let err = FileDevice::open(&path, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            IoError::DeviceTooSmall {
                size_bytes: 1048576,
                needed_bytes: 8388608,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("8388608"));
    let err = FileDevice::open(&dir.path().join("missing"), &FileOptions::default()).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    let err =
        FileDevice::create(&dir.path().join("odd"), 1000, &FileOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            IoError::Misaligned {
                what: "device size",
                ..
            }
        ),
        "{err}"
    );
    let odd_bs = FileOptions {
        block_size_bytes: 3000,
        ..FileOptions::default()
    };
    let err = FileDevice::create(&dir.path().join("bs"), 1 << 20, &odd_bs).unwrap_err();
    assert!(err.to_string().contains("3000"), "{err}");
}

#[test]
fn registered_chunks_are_unregistered_when_idle_and_slots_reused() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let mut cfg = config(EngineKind::Uring);
    cfg.pool.table_slots = 8; // 3 small lists + 5 chunks or big buffers
    let mut engine = open_engine(file_device(&dir, 32 << 20), &cfg).unwrap();
    for round in 0..4u64 {
        let bufs: Vec<IoBuf> = (0..5)
            .map(|i| write_buf(engine.as_ref(), (4 << 20) - 4096, round * 10 + i))
            .collect();
        assert_eq!(engine.pool().stats().chunks, 5);
        // Table full: the next chunk cannot be registered.
        assert!(engine.pool().alloc(3 << 20, Direction::Read).is_err());
        for (i, b) in bufs.into_iter().enumerate() {
            ok(engine.run(Request::write(i as u64 * 1024, b, 0)));
        }
        let released = engine.pool().release_idle_at(
            std::time::Instant::now() + std::time::Duration::from_millis(cfg.pool.idle_release_ms),
        );
        assert_eq!(released, 5, "round {round}: {:?}", engine.pool().stats());
        let s = engine.pool().stats();
        assert_eq!(s.chunks, 0);
        assert_eq!(s.pinned_bytes, cfg.pool.small_tier_bytes());
        // The slots came back: the data written from re-registered memory reads back.
        let c = ok(engine.run(Request::read(
            1024,
            engine
                .pool()
                .alloc((4 << 20) - 4096, Direction::Read)
                .unwrap(),
            1,
        )));
        assert_eq!(
            c.buf.unwrap().to_vec(),
            pattern((4 << 20) - 4096, round * 10 + 1)
        );
    }
}

#[test]
fn pool_buffers_from_other_threads_work_with_a_single_issuer_ring() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let dev = file_device(&dir, 16 << 20);
    let mut cfg = config(EngineKind::Uring);
    cfg.defer_taskrun = true;
    let mut engine = open_engine(dev.clone(), &cfg).unwrap();
    assert!(
        engine.describe().contains("DEFER_TASKRUN"),
        "{}",
        engine.describe()
    );
    ok(engine.run(Request::write(0, write_buf(engine.as_ref(), 4096, 1), 1)));
    let pool = engine.pool().clone();
    let before = pool.stats();
    // A new chunk and a big buffer pinned on a thread that is not the issuer.
    let (medium, big) = std::thread::spawn(move || {
        let mut m = pool.alloc(256 << 10, Direction::Write).unwrap();
        m.write_at(0, &pattern(256 << 10, 8));
        let b = pool.alloc(4 << 20, Direction::Read).unwrap();
        (m, b)
    })
    .join()
    .unwrap();
    assert!(
        medium.segments()[0].buf_index().is_none(),
        "not registered yet: plain I/O"
    );
    ok(engine.run(Request::write(64, medium, 2)));
    // The reap registered the chunk: the next buffer from it is a fixed buffer.
    let again = engine.pool().alloc(256 << 10, Direction::Read).unwrap();
    assert!(
        again.segments()[0].buf_index().is_some(),
        "chunk registered by the issuer"
    );
    let c = ok(engine.run(Request::read(64, again, 3)));
    assert_eq!(c.buf.unwrap().to_vec(), pattern(256 << 10, 8));
    let c = ok(engine.run(Request::read(64, big, 4)));
    // Dropped on another thread: unregistered at the next reap, accounting exact.
    let big = c.buf.unwrap();
    std::thread::spawn(move || drop(big)).join().unwrap();
    let mid = engine.pool().stats();
    assert!(
        mid.pinned_bytes >= before.pinned_bytes + (4 << 20),
        "kept until the issuer unregisters it"
    );
    ok(engine.run(Request::read(
        0,
        engine.pool().alloc(4096, Direction::Read).unwrap(),
        5,
    )));
    let after = engine.pool().stats();
    assert_eq!(
        after.pinned_bytes,
        before.pinned_bytes + after.chunks * (4 << 20)
    );
    assert_eq!(after.pins - after.unpins, 3 + after.chunks);
    // Using the engine itself from another thread is refused clearly.
    let err = std::thread::spawn(move || {
        let mut engine = engine;
        let buf = IoBuf::unpooled(4096);
        engine.run(Request::read(0, buf, 6)).result.unwrap_err()
    })
    .join()
    .unwrap();
    assert!(err.to_string().contains("one thread"), "{err}");
}

#[test]
fn invalid_engine_configs_are_named() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(4096, 16));
    let mut cfg = config(EngineKind::Posix);
    cfg.submit_batch = 33;
    let err = open_engine(dev.clone(), &cfg).err().unwrap();
    assert!(
        err.to_string().contains("submit_batch 33") && err.to_string().contains("queue_depth 32"),
        "{err}"
    );
    let mut cfg = config(EngineKind::Posix);
    cfg.queue_depth = 0;
    let err = open_engine(dev.clone(), &cfg).err().unwrap();
    assert!(err.to_string().contains("queue_depth 0"), "{err}");
    let mut cfg = config(EngineKind::Posix);
    cfg.high_share = 1.5;
    let err = open_engine(dev.clone(), &cfg).err().unwrap();
    assert!(err.to_string().contains("high_share 1.5"), "{err}");
    let mut cfg = config(EngineKind::Posix);
    cfg.spin_wait_us = 20_000;
    let err = open_engine(dev, &cfg).err().unwrap();
    assert!(err.to_string().contains("spin_wait_us 20000"), "{err}");
}

/// Waits up to `timeout_ms` for `fd` to be readable.
fn readable_within(fd: std::os::fd::RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, its count 1.
    unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
}

#[test]
fn a_single_issuer_ring_signals_its_completions_to_an_eventfd() {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let dev = file_device(&dir, 16 << 20);
    let mut cfg = config(EngineKind::Uring);
    cfg.defer_taskrun = true;
    let mut engine = open_engine(dev.clone(), &cfg).unwrap();
    // SAFETY: eventfd takes no pointers; the result is checked.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(efd >= 0);
    engine.notify_completions(efd).unwrap();
    ok(engine.run(Request::write(0, write_buf(engine.as_ref(), 8192, 3), 1)));
    let mut count = [0u8; 8];
    // SAFETY: reads 8 bytes into a live local (clears what the write signalled).
    unsafe { libc::read(efd, count.as_mut_ptr().cast(), 8) };
    for round in 0..20u64 {
        let buf = engine.pool().alloc(8192, Direction::Read).unwrap();
        engine.submit(Request::read(0, buf, 10 + round)).unwrap();
        let mut out = Vec::new();
        // Submitted by a reap that does not wait.
        engine.reap(0, &mut out).unwrap();
        // The kernel signals when the completion is ready to be taken,
        // without this thread entering the kernel first (and also when
        // completions are posted: a signal may be one already taken).
        let mut signals = 0;
        while out.is_empty() {
            assert!(readable_within(efd, 5000), "round {round}: no signal");
            signals += 1;
            assert!(
                signals <= 3,
                "round {round}: signalled with nothing to reap"
            );
            // SAFETY: as above.
            unsafe { libc::read(efd, count.as_mut_ptr().cast(), 8) };
            // A reap that does not wait takes it.
            engine.reap(0, &mut out).unwrap();
        }
        assert_eq!(out.len(), 1, "round {round}");
        assert_eq!(out[0].user_data, 10 + round);
        assert_eq!(out[0].buf.as_ref().unwrap().to_vec(), pattern(8192, 3));
    }
    drop(engine);
    // SAFETY: our own descriptor, closed once after the engine is gone.
    unsafe { libc::close(efd) };
    // A ring other threads may use cannot (its completions wait for the
    // thread to enter the kernel).
    cfg.defer_taskrun = false;
    let mut shared = open_engine(dev, &cfg).unwrap();
    assert!(shared.notify_completions(0).is_err());
}
