//! Superblock, extent allocator and write-ahead log: formats, bad input, and
//! crash safety on the memory device (power cuts that drop or tear every
//! write not yet flushed).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use proptest::prelude::*;
use sluice_io::{Device, MemoryDevice, PowerCutMode};
use sluice_store::alloc::ExtentAllocator;
use sluice_store::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use sluice_store::superblock::{self, Superblock};
use sluice_store::wal::{self, LogPosition, Wal, WalLayout, WalRecovery};
use sluice_store::StoreError;
use std::sync::Arc;

fn memory(blocks: u64, lba_bytes: u32) -> (Arc<MemoryDevice>, BlockDevice) {
    let lbas = blocks * STORE_BLOCK_BYTES as u64 / lba_bytes as u64;
    let mem = Arc::new(MemoryDevice::new(lba_bytes, lbas));
    let dev = BlockDevice::new(mem.clone() as Arc<dyn Device>).unwrap();
    (mem, dev)
}

fn sb(generation: u64) -> Superblock {
    Superblock {
        generation,
        store_id: [7; 16],
        device_blocks: 64,
        device_index: 0,
        device_count: 1,
        created_unix_ms: 1_700_000_000_000,
        manifest: Extent {
            start_block: 2,
            block_count: 4,
        },
        manifest_first_seq: generation * 10,
        member_blocks: vec![64],
    }
}

#[test]
fn superblock_copies_alternate_and_a_torn_copy_falls_back() {
    let (mem, dev) = memory(64, 512);
    let err = superblock::read(&dev).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    assert!(err.to_string().contains("format it first"), "{err}");
    superblock::write(&dev, &sb(1)).unwrap();
    superblock::write(&dev, &sb(2)).unwrap();
    assert_eq!(superblock::read(&dev).unwrap(), sb(2));
    // Generation 3 goes to copy 1 and is torn by a power cut: copy 0 (generation 2) survives.
    let mut block = sluice_io::mem::AlignedMem::new(STORE_BLOCK_BYTES);
    block.as_mut_slice().copy_from_slice(&sb(3).encode());
    dev.write(1, block.as_slice()).unwrap();
    mem.power_cut(PowerCutMode::TornSectors { seed: 3 });
    let got = superblock::read(&dev).unwrap();
    assert!(
        got == sb(2) || got == sb(3),
        "either the old copy or the whole new one: {got:?}"
    );
    // Corrupt both: a clear error.
    let mut junk = sluice_io::mem::AlignedMem::new(STORE_BLOCK_BYTES);
    junk.as_mut_slice()[..8].copy_from_slice(b"SLUICEKV");
    dev.write(0, junk.as_slice()).unwrap();
    dev.write(1, junk.as_slice()).unwrap();
    let err = superblock::read(&dev).unwrap_err();
    assert!(
        err.to_string()
            .contains("both superblock copies are invalid"),
        "{err}"
    );
}

#[test]
fn superblock_of_another_version_is_named() {
    let (_mem, dev) = memory(64, 4096);
    let mut bytes = sb(1).encode();
    bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..STORE_BLOCK_BYTES - 4]);
    bytes[STORE_BLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    let mut block = sluice_io::mem::AlignedMem::new(STORE_BLOCK_BYTES);
    block.as_mut_slice().copy_from_slice(&bytes);
    dev.write(1, block.as_slice()).unwrap();
    let err = superblock::read(&dev).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::UnsupportedVersion {
                found: 9,
                supported: superblock::FORMAT_VERSION
            }
        ),
        "{err}"
    );
}

#[test]
fn superblock_refuses_a_smaller_device() {
    let (_mem, dev) = memory(32, 4096);
    superblock::write(&dev, &sb(1)).unwrap();
    let err = superblock::read(&dev).unwrap_err();
    assert!(err.to_string().contains("formatted with 64"), "{err}");
}

#[derive(Debug, Clone)]
enum AllocOp {
    Alloc(u64),
    Free(usize),
}

proptest! {
    #[test]
    fn allocator_never_overlaps_and_merges_back(ops in prop::collection::vec(
        prop_oneof![(1u64..40).prop_map(AllocOp::Alloc), any::<usize>().prop_map(AllocOp::Free)], 1..200)) {
        let mut a = ExtentAllocator::new(2, 500);
        let mut live: Vec<Extent> = Vec::new();
        for op in ops {
            match op {
                AllocOp::Alloc(n) => match a.allocate(n) {
                    Ok(e) => {
                        prop_assert_eq!(e.block_count as u64, n);
                        for o in &live {
                            prop_assert!(e.end_block() <= o.start_block || o.end_block() <= e.start_block, "{:?} overlaps {:?}", e, o);
                        }
                        live.push(e);
                    }
                    Err(StoreError::DeviceFull { largest_free_blocks, .. }) => prop_assert!(largest_free_blocks < n),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                },
                AllocOp::Free(i) if !live.is_empty() => {
                    let e = live.swap_remove(i % live.len());
                    a.release(e).unwrap();
                }
                AllocOp::Free(_) => {}
            }
            let used: u64 = live.iter().map(|e| e.block_count as u64).sum();
            prop_assert_eq!(a.free_blocks() + used, 498);
            // The persisted free list rebuilds the same allocator.
            let rebuilt = ExtentAllocator::from_free_list(2, 500, &a.free_list()).unwrap();
            prop_assert_eq!(&rebuilt, &a);
        }
        for e in live.drain(..) {
            a.release(e).unwrap();
        }
        prop_assert_eq!(a.free_list(), vec![Extent { start_block: 2, block_count: 498 }]);
    }
}

#[test]
fn allocator_refuses_double_free_reserve_of_used_and_says_when_full() {
    let mut a = ExtentAllocator::new(2, 100);
    let e = a.allocate(10).unwrap();
    assert!(a.reserve(e).is_err(), "reserving an allocated extent");
    a.release(e).unwrap();
    let err = a.release(e).unwrap_err();
    assert!(err.to_string().contains("double free"), "{err}");
    let err = a.allocate(99).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::DeviceFull {
                needed_blocks: 99,
                largest_free_blocks: 98,
                free_blocks: 98
            }
        ),
        "{err}"
    );
    let outside = Extent {
        start_block: 95,
        block_count: 10,
    };
    assert!(a
        .release(outside)
        .unwrap_err()
        .to_string()
        .contains("outside"));
    a.reserve(Extent {
        start_block: 50,
        block_count: 5,
    })
    .unwrap();
    assert!(!a.is_free(52) && a.is_free(49) && a.is_free(55));
}

fn layout(ring: &[(u64, u32)]) -> WalLayout {
    WalLayout {
        ring: ring
            .iter()
            .map(|&(start_block, block_count)| Extent {
                start_block,
                block_count,
            })
            .collect(),
        epoch: 0xE90C,
    }
}

fn record(i: u64, len: usize) -> Vec<u8> {
    let mut r = vec![(i % 251) as u8; len];
    r[..8.min(len)].copy_from_slice(&i.to_le_bytes()[..8.min(len)]);
    r
}

#[test]
fn wal_committed_records_survive_a_power_cut() {
    let (mem, dev) = memory(128, 512);
    let lay = layout(&[(10, 20), (40, 20)]);
    lay.format(&dev).unwrap();
    let wal = Wal::open(dev.clone(), lay.clone(), 0, 0, None).unwrap();
    let sizes = [10, 5000, 0, 4068, 4061, 12000, 33];
    let mut last = LogPosition { end_seq: 0 };
    for (i, &len) in sizes.iter().enumerate() {
        last = wal.append(&record(i as u64, len)).unwrap();
    }
    wal.commit(last).unwrap();
    assert!(wal.is_durable(last));
    assert!(wal.last_written() >= wal.last_durable() && wal.last_durable() > last.end_seq);
    // Appended after the commit and never committed: may be lost.
    let _ = wal.append(&record(99, 100)).unwrap();
    drop(wal);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let got = wal::recover(&dev, &lay, 0, WalRecovery::Strict).unwrap();
    let bodies: Vec<Vec<u8>> = got.records.iter().map(|(_, r)| r.clone()).collect();
    let want: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &l)| record(i as u64, l))
        .collect();
    assert_eq!(bodies, want);
    // Appending resumes after the recovered tail, and recovery sees both.
    let wal = Wal::open(dev.clone(), lay.clone(), 0, got.next_seq, None).unwrap();
    let p = wal.append(&record(100, 7000)).unwrap();
    wal.commit(p).unwrap();
    let again = wal::recover(&dev, &lay, 0, WalRecovery::Strict).unwrap();
    assert_eq!(again.records.len(), sizes.len() + 1);
    assert_eq!(again.records.last().unwrap().1, record(100, 7000));
}

#[test]
fn wal_wraps_around_its_ring_and_refuses_to_overrun_the_tail() {
    let (_mem, dev) = memory(64, 4096);
    // Each commit below takes a log block and its group's parity block.
    let lay = layout(&[(4, 12)]);
    lay.format(&dev).unwrap();
    let wal = Wal::open(dev.clone(), lay.clone(), 0, 0, None).unwrap();
    let mut positions = Vec::new();
    for i in 0..4 {
        let p = wal.append(&record(i, 3000)).unwrap();
        wal.commit(p).unwrap();
        positions.push(p);
    }
    let err = loop {
        match wal.append(&record(50, 3000)) {
            Ok(p) => wal.commit(p).unwrap(),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            StoreError::WalFull {
                ring_blocks: 12,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("flush the memtable"));
    // Tables now hold the first records: their blocks may be reused.
    let tail = positions[2].end_seq;
    wal.release_before(tail);
    for i in 10..12 {
        let p = wal.append(&record(i, 3000)).unwrap();
        wal.commit(p).unwrap();
    }
    let got = wal::recover(&dev, &lay, tail, WalRecovery::Strict).unwrap();
    let ids: Vec<u64> = got
        .records
        .iter()
        .map(|(_, r)| u64::from_le_bytes(r[..8].try_into().unwrap()))
        .collect();
    assert_eq!(&ids[ids.len() - 2..], &[10, 11], "{ids:?}");
    assert_eq!(ids[0], 2, "recovery starts at the released tail: {ids:?}");
}

#[test]
fn wal_rejects_records_over_the_limit_and_blocks_of_another_ring() {
    let (_mem, dev) = memory(64, 4096);
    let lay = layout(&[(4, 8)]);
    lay.format(&dev).unwrap();
    let wal = Wal::open(dev.clone(), lay.clone(), 0, 0, None).unwrap();
    let err = wal
        .append(&vec![0u8; wal::MAX_RECORD_BYTES + 1])
        .unwrap_err();
    assert!(matches!(err, StoreError::RecordTooLarge { .. }), "{err}");
    let p = wal.append(b"kept").unwrap();
    wal.commit(p).unwrap();
    let other = WalLayout {
        epoch: lay.epoch + 1,
        ..lay.clone()
    };
    assert!(
        wal::recover(&dev, &other, 0, WalRecovery::Strict)
            .unwrap()
            .records
            .is_empty(),
        "another epoch never validates"
    );
    assert_eq!(
        wal::recover(&dev, &lay, 0, WalRecovery::Strict)
            .unwrap()
            .records
            .len(),
        1
    );
}

#[test]
fn wal_group_commit_shares_flushes_between_threads() {
    let (mem, dev) = memory(1024, 4096);
    // Room for every commit to take a block and a parity block.
    let lay = layout(&[(2, 800)]);
    lay.format(&dev).unwrap();
    let wal = Arc::new(Wal::open(dev.clone(), lay.clone(), 0, 0, None).unwrap());
    let threads = 8;
    let per_thread = 40u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    let p = wal.append(&record(t * 1000 + i, 200)).unwrap();
                    wal.commit(p).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let commits = threads * per_thread;
    assert!(wal.flush_count() <= commits, "one flush per commit at most");
    mem.power_cut(PowerCutMode::DropUnflushed);
    let got = wal::recover(&dev, &lay, 0, WalRecovery::Strict).unwrap();
    let mut ids: Vec<u64> = got
        .records
        .iter()
        .map(|(_, r)| u64::from_le_bytes(r[..8].try_into().unwrap()))
        .collect();
    ids.sort();
    let mut want: Vec<u64> = (0..threads)
        .flat_map(|t| (0..per_thread).map(move |i| t * 1000 + i))
        .collect();
    want.sort();
    assert_eq!(ids, want, "every committed record, once");
    eprintln!("{commits} commits, {} flushes", wal.flush_count());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random records, commits at random points, then a power cut that
    /// drops or tears every unflushed write: recovery returns a prefix of
    /// what was appended that holds every committed record, and nothing
    /// that was not appended.
    #[test]
    fn wal_recovery_after_random_crash_points(
        sizes in prop::collection::vec(0usize..9000, 1..40),
        commit_every in 1usize..6,
        torn in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (mem, dev) = memory(256, 512);
        let lay = layout(&[(3, 100), (120, 80)]);
        lay.format(&dev).unwrap();
        let wal = Wal::open(dev.clone(), lay.clone(), 0, 0, None).unwrap();
        let mut appended = Vec::new();
        let mut committed = 0usize;
        for (i, &len) in sizes.iter().enumerate() {
            let r = record(i as u64, len);
            let p = wal.append(&r).unwrap();
            appended.push(r);
            if (i + 1) % commit_every == 0 {
                wal.commit(p).unwrap();
                committed = appended.len();
            }
        }
        drop(wal);
        let mode = if torn { PowerCutMode::TornSectors { seed } } else { PowerCutMode::DropUnflushed };
        mem.power_cut(mode);
        let got = wal::recover(&dev, &lay, 0, WalRecovery::Strict).unwrap();
        let bodies: Vec<Vec<u8>> = got.records.into_iter().map(|(_, r)| r).collect();
        prop_assert!(bodies.len() >= committed, "lost committed records: {} < {}", bodies.len(), committed);
        prop_assert!(bodies.len() <= appended.len());
        prop_assert_eq!(&bodies[..], &appended[..bodies.len()], "recovered records must be exactly a prefix");
    }
}
