//! DeviceIo (blocking I/O through leased engines) and the ordered flush it
//! makes writes durable with.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_io::engine::{open_engine, EngineConfig, EngineKind, Priority, Request};
use sluice_io::pool::Direction;
use sluice_io::{Device, DeviceIo, FileDevice, FileOptions, MemoryDevice, PowerCutMode};
use std::sync::Arc;

mod common;
use common::pattern;

fn config(kind: EngineKind) -> EngineConfig {
    let mut c = EngineConfig {
        kind,
        queue_depth: 16,
        posix_threads: 4,
        ..EngineConfig::default()
    };
    c.pool.max_pinned_bytes = 64 << 20;
    c
}

/// A file device of `size_bytes` in a directory removed when dropped.
fn file_device(size_bytes: u64) -> (tempfile::TempDir, Arc<dyn Device>) {
    let dir = tempfile::tempdir_in(common::disk_dir()).unwrap();
    let path = dir.path().join("dev");
    let dev = FileDevice::create(&path, size_bytes, &FileOptions::default()).unwrap();
    (dir, Arc::new(dev))
}

/// Writes submitted before an ordered flush are durable once it completes,
/// even on the posix engine whose workers run requests in parallel.
#[test]
fn ordered_flush_covers_every_write_submitted_before_it() {
    for round in 0..3u64 {
        // Writes long enough that workers are still copying when the
        // flush could be picked up.
        let dev = Arc::new(MemoryDevice::new(4096, 12 * 256));
        let mut engine = open_engine(dev.clone(), &config(EngineKind::Posix)).unwrap();
        for i in 0..12u64 {
            let mut buf = engine.pool().alloc(1 << 20, Direction::Write).unwrap();
            buf.write_at(0, &pattern(1 << 20, round * 100 + i));
            engine.submit(Request::write(i * 256, buf, i)).unwrap();
        }
        engine.submit(Request::flush_after_prior(99)).unwrap();
        let mut done = Vec::new();
        while engine.in_flight() > 0 {
            engine.reap(1, &mut done).unwrap();
        }
        assert!(done.iter().all(|c| c.result.is_ok()));
        let flush_at = done.iter().position(|c| c.user_data == 99).unwrap();
        assert_eq!(
            flush_at, 12,
            "the flush completed before a write it orders after"
        );
        dev.power_cut(PowerCutMode::DropUnflushed);
        let mut got = sluice_io::mem::AlignedMem::new(1 << 20);
        for i in 0..12u64 {
            dev.read_at(i * 256, got.as_mut_slice()).unwrap();
            let lost = got.as_slice() != pattern(1 << 20, round * 100 + i);
            assert!(!lost, "round {round}: write {i} lost");
        }
    }
}

#[test]
fn write_durable_survives_a_power_cut() {
    let dev = Arc::new(MemoryDevice::new(4096, 2048));
    let io = DeviceIo::open(dev.clone(), config(EngineKind::Posix)).unwrap();
    // Longer than one request and than the queue: pieces in flight together.
    let long = pattern(5 << 20, 7);
    let short = pattern(8192, 8);
    io.write_durable(&[(0, &long), (1500, &short)], Priority::High)
        .unwrap();
    io.write(1600, &pattern(4096, 9), Priority::Low).unwrap();
    dev.power_cut(PowerCutMode::DropUnflushed);
    let mut got = vec![0u8; long.len()];
    io.read(0, &mut got, Priority::High).unwrap();
    assert!(got == long, "a durable write was lost");
    let mut got = vec![0u8; short.len()];
    io.read(1500, &mut got, Priority::High).unwrap();
    assert_eq!(got, short);
    let mut got = vec![0u8; 4096];
    io.read(1600, &mut got, Priority::High).unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "an unflushed write survived a power cut"
    );
}

/// Threads share one DeviceIo on a real file: each its own region, long
/// runs cut into pieces, every byte read back.
#[test]
fn threads_share_a_device_io_on_a_file() {
    let (_dir, dev) = file_device(64 << 20);
    for kind in [EngineKind::Uring, EngineKind::Posix] {
        let io = Arc::new(DeviceIo::open(dev.clone(), config(kind)).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let io = io.clone();
                std::thread::spawn(move || {
                    let data = pattern(3 << 20, t + 1);
                    let lba = t * (8 << 20) / 4096;
                    let prio = if t % 2 == 0 {
                        Priority::High
                    } else {
                        Priority::Low
                    };
                    io.write_durable(&[(lba, &data)], prio).unwrap();
                    let mut got = vec![0u8; data.len()];
                    io.read(lba, &mut got, prio).unwrap();
                    assert_eq!(got, data, "{kind} thread {t}");
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        io.flush(Priority::High).unwrap();
    }
}

#[test]
fn reads_past_the_end_are_refused_with_the_device_named() {
    let dev = Arc::new(MemoryDevice::new(4096, 16));
    let io = DeviceIo::open(dev, config(EngineKind::Posix)).unwrap();
    let mut got = vec![0u8; 8192];
    let err = io.read(15, &mut got, Priority::High).unwrap_err();
    assert!(err.to_string().contains("16"), "{err}");
}

/// A read started ahead returns at once and gives the bytes at `finish`,
/// also when longer than one request; one dropped unfinished is waited
/// for and its engine reused.
#[test]
fn reads_started_ahead_give_their_bytes_at_finish() {
    let (_dir, dev) = file_device(16 << 20);
    for kind in [EngineKind::Uring, EngineKind::Posix] {
        let io = Arc::new(DeviceIo::open(dev.clone(), config(kind)).unwrap());
        let data = pattern(3 << 20, 5);
        io.write_durable(&[(64, &data)], Priority::High).unwrap();
        for len in [4096, 256 << 10, 3 << 20] {
            let pending = io.start_read(64, len, Priority::Low).unwrap();
            assert_eq!(pending.len(), len);
            let got = pending.finish(|bytes| bytes.to_vec()).unwrap();
            assert!(got == data[..len], "{kind}: {len} bytes read ahead differ");
        }
        for _ in 0..20 {
            drop(io.start_read(64, 256 << 10, Priority::Low).unwrap());
        }
        // Held past the pool's 64 MiB: buffers are kept only while the pool
        // has room, copies after that, so no read waits for a holder.
        let held: Vec<_> = (0..400)
            .map(|_| {
                let pending = io.start_read(64, 256 << 10, Priority::Low).unwrap();
                pending.finish_owned().unwrap()
            })
            .collect();
        assert!(held.iter().all(|r| r.as_slice() == &data[..256 << 10]));
        let kept = held
            .iter()
            .filter(|r| matches!(r, sluice_io::ReadBytes::Io(_)))
            .count();
        assert!((1..400).contains(&kept), "{kept} I/O buffers kept");
        drop(held);
        let mut got = vec![0u8; 8192];
        io.read(64, &mut got, Priority::High).unwrap();
        assert_eq!(got, data[..8192]);
        let err = io.start_read(4090, 64 << 10, Priority::Low);
        let err = match err {
            Err(e) => e,
            Ok(p) => p.finish(|_| ()).unwrap_err(),
        };
        assert!(err.to_string().contains("beyond"), "{err}");
    }
}

/// Buffers filled on another thread from a clone of the engine's pool are
/// written where they lie and made durable with their writes (survive a
/// power cut); on io_uring, a chunk pinned off the ring's thread is
/// registered at the next reap and later buffers carry its table index.
#[test]
fn buffers_filled_elsewhere_are_written_without_a_copy() {
    let (_dir, file) = file_device(32 << 20);
    let memory = Arc::new(MemoryDevice::new(4096, 8192));
    let memory_dyn: Arc<dyn Device> = memory.clone();
    for (kind, dev) in [
        (EngineKind::Uring, file.clone()),
        (EngineKind::Posix, memory_dyn),
    ] {
        let mut engine = open_engine(dev.clone(), &config(kind)).unwrap();
        for round in 0..3u64 {
            let pool = engine.pool().clone();
            let filled = std::thread::spawn(move || {
                let mut page = pool.alloc(3 << 20, Direction::Write).unwrap();
                page.as_mut_slice()
                    .unwrap()
                    .copy_from_slice(&pattern(3 << 20, round));
                let mut block = pool.alloc(4096, Direction::Write).unwrap();
                block.write_at(0, &pattern(4096, round + 10));
                (page, block)
            })
            .join()
            .unwrap();
            let (page, block) = filled;
            let page_lba = round * 1024;
            let block_lba = 4000 + round;
            sluice_io::write_bufs_on(
                &mut *engine,
                vec![(page_lba, page), (block_lba, block)],
                Priority::High,
                Some(sluice_io::DurableWrites::OrderedFlush),
            )
            .unwrap();
            if kind == EngineKind::Posix {
                memory.power_cut(PowerCutMode::DropUnflushed);
            }
            let mut got = sluice_io::mem::AlignedMem::new(3 << 20);
            dev.read_at(page_lba, got.as_mut_slice()).unwrap();
            assert!(
                got.as_slice() == pattern(3 << 20, round),
                "{kind} round {round}: page"
            );
            let mut got = sluice_io::mem::AlignedMem::new(4096);
            dev.read_at(block_lba, got.as_mut_slice()).unwrap();
            assert_eq!(
                got.as_slice(),
                pattern(4096, round + 10),
                "{kind} round {round}"
            );
        }
        if kind == EngineKind::Uring && engine.pool().is_registered() {
            let again = engine.pool().alloc(3 << 20, Direction::Write).unwrap();
            assert!(
                again.segments()[0].buf_index().is_some(),
                "the chunk pinned on another thread was never registered"
            );
        }
    }
}

/// A registered buffer is only meaningful to the ring whose pool handed it
/// out: another engine refuses it instead of writing some other memory.
#[test]
fn a_registered_buffer_of_another_engine_is_refused() {
    let (_dir, dev) = file_device(8 << 20);
    let first = open_engine(dev.clone(), &config(EngineKind::Uring)).unwrap();
    let mut second = open_engine(dev.clone(), &config(EngineKind::Uring)).unwrap();
    if !first.pool().is_registered() {
        common::skipped(
            "a_registered_buffer_of_another_engine_is_refused",
            "this kernel gives io_uring no fixed buffers, so no buffer carries a table index",
        );
        return;
    }
    let foreign = first.pool().alloc(4096, Direction::Write).unwrap();
    assert!(foreign.segments()[0].buf_index().is_some());
    let err = second
        .submit(Request::write(0, foreign, 1))
        .map_err(|r| r.error)
        .unwrap_err();
    assert!(err.to_string().contains("another engine's pool"), "{err}");
    let own = second.pool().alloc(4096, Direction::Write).unwrap();
    second.run(Request::write(0, own, 2)).result.unwrap();
    drop(first);
}
