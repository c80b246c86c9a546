//! Large values in blob files (docs/FORMAT.md, "Blob files"): read back
//! through every read path, moved by flushes and compactions without
//! their bytes, their files removed once nothing references them, and
//! whole after a crash and a power cut.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::ProcessView;
use sluice_io::{Device, MemoryDevice, PowerCutMode};
use sluice_store::{Store, StoreConfig, WriteBatch};
use std::ops::Bound;
use std::sync::Arc;

fn config() -> StoreConfig {
    let mut cfg = StoreConfig {
        wal_blocks: 1024,
        write_buffer_bytes: 64 << 10,
        block_cache_bytes: 64 << 10,
        blob_threshold_bytes: 8 << 10,
        // Small files, so that records fill them and new ones open.
        blob_file_bytes: 1 << 20,
        background_compaction: false,
        ..StoreConfig::default()
    };
    cfg.compaction.l0_trigger = 2;
    cfg.compaction.target_file_bytes = 64 << 10;
    cfg
}

/// A value of `len` bytes that says which key and version it is.
fn value(key: u32, version: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = (key as u64) << 32 | version as u64 | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:05}").into_bytes()
}

/// Lengths on both sides of the threshold, a file's size and past it.
const LENGTHS: [usize; 7] = [
    100,
    (8 << 10) - 1,
    8 << 10,
    20_000,
    300_000,
    1 << 20,
    3 << 20,
];

fn check_all(store: &Store, version: u32) {
    let snapshot = store.snapshot();
    for (i, &len) in LENGTHS.iter().enumerate() {
        let k = key(i as u32);
        let want = value(i as u32, version, len);
        assert_eq!(
            store.get(0, &k).unwrap().as_deref(),
            Some(&want[..]),
            "get of {len} bytes"
        );
        let latest = store
            .get_latest_with(0, &k, |v| v.map(|v| v.keep().bytes().to_vec()))
            .unwrap();
        assert_eq!(
            latest.as_deref(),
            Some(&want[..]),
            "get_latest of {len} bytes"
        );
        let at = store.get_at(0, &k, &snapshot).unwrap();
        assert_eq!(at.as_deref(), Some(&want[..]), "get_at of {len} bytes");
    }
    // All of them as one run: blob values come after the others.
    let keys: Vec<Vec<u8>> = (0..LENGTHS.len() as u32).map(key).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut each = vec![None; keys.len()];
    store
        .get_each_at(0, &key_refs, &snapshot, |i, v| {
            each[i] = Some(v.map(<[u8]>::to_vec))
        })
        .unwrap();
    for (i, &len) in LENGTHS.iter().enumerate() {
        let want = value(i as u32, version, len);
        assert_eq!(each[i], Some(Some(want)), "get_each_at of {len} bytes");
    }
    for reverse in [false, true] {
        let got: Vec<(Vec<u8>, Vec<u8>)> = store
            .iter(0, (Bound::Unbounded, Bound::Unbounded), &snapshot, reverse)
            .collect::<Result<_, _>>()
            .unwrap();
        let mut want: Vec<(Vec<u8>, Vec<u8>)> = LENGTHS
            .iter()
            .enumerate()
            .map(|(i, &len)| (key(i as u32), value(i as u32, version, len)))
            .collect();
        if reverse {
            want.reverse();
        }
        assert!(
            got == want,
            "a scan (reverse: {reverse}) reads every value whole"
        );
    }
}

fn put_all(store: &Store, version: u32) {
    for (i, &len) in LENGTHS.iter().enumerate() {
        store
            .put(0, &key(i as u32), &value(i as u32, version, len))
            .unwrap();
    }
}

#[test]
fn large_values_read_back_from_memtable_tables_and_after_reopen() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    put_all(&store, 1);
    check_all(&store, 1);
    let stats = store.stats();
    assert!(
        stats.blob_files >= 2,
        "a value past a file's size takes one of its own: {stats:?}"
    );
    store.flush().unwrap();
    check_all(&store, 1);
    store.compact().unwrap();
    check_all(&store, 1);
    drop(store);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    check_all(&store, 1);
}

#[test]
fn tables_hold_references_not_values() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    for i in 0..40u32 {
        store.put(0, &key(i), &value(i, 1, 200_000)).unwrap();
    }
    store.flush().unwrap();
    store.compact().unwrap();
    let stats = store.stats();
    // 8 MB of values; the tables hold 40 keys and references.
    assert!(
        stats.table_data_bytes < 64 << 10,
        "tables of {} bytes",
        stats.table_data_bytes
    );
    assert!(stats.blob_bytes >= 40 * 200_000, "{stats:?}");
}

#[test]
fn overwritten_and_deleted_values_give_their_files_back() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    let free_at_start = store.stats().free_blocks * 4096;
    for round in 1..=4u32 {
        for i in 0..20u32 {
            store.put(0, &key(i), &value(i, round, 100_000)).unwrap();
        }
        store.flush().unwrap();
        store.compact().unwrap();
    }
    for i in 0..20u32 {
        assert_eq!(store.get(0, &key(i)).unwrap(), Some(value(i, 4, 100_000)));
    }
    let live = store.stats();
    // Four rounds of 2 MB went in; about one round's files remain (and
    // the file being appended to).
    assert!(
        live.blob_bytes <= 4 << 20,
        "old rounds' files removed: {live:?}"
    );
    for i in 0..20u32 {
        store.delete(0, &key(i)).unwrap();
    }
    // The file being appended to stays; the rest go once the deletes are
    // in tables and compacted.
    store.flush().unwrap();
    store.compact().unwrap();
    let gone = store.stats();
    assert!(gone.blob_files <= 1, "{gone:?}");
    drop(store);
    // Reopened: the last file is closed and, with nothing referencing it,
    // removed after the first flush.
    let store = Store::open(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    store.put(0, b"small", b"x").unwrap();
    store.flush().unwrap();
    let after = store.stats();
    assert_eq!(after.blob_files, 0, "{after:?}");
    assert!(
        after.free_blocks * 4096 + (256 << 10) >= free_at_start,
        "space comes back: {} free of {free_at_start} at start",
        after.free_blocks * 4096
    );
}

#[test]
fn a_snapshot_keeps_reading_an_overwritten_value() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    store.put(0, b"k", &value(0, 1, 500_000)).unwrap();
    let snapshot = store.snapshot();
    store.put(0, b"k", &value(0, 2, 500_000)).unwrap();
    for _ in 0..3 {
        // Fill files so the old one is closed, then flush and compact.
        for i in 1..4u32 {
            store.put(0, &key(i), &value(i, 9, 400_000)).unwrap();
        }
        store.flush().unwrap();
        store.compact().unwrap();
    }
    assert_eq!(
        store.get_at(0, b"k", &snapshot).unwrap(),
        Some(value(0, 1, 500_000))
    );
    assert_eq!(store.get(0, b"k").unwrap(), Some(value(0, 2, 500_000)));
}

#[test]
fn a_batch_mixes_small_and_large_values_atomically_through_a_power_cut() {
    let cfg = config();
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let view = ProcessView::new(&mem);
    let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
    for round in 0..6u32 {
        let mut b = WriteBatch::new();
        for i in 0..4u32 {
            let len = if i % 2 == 0 { 50 } else { 150_000 };
            b.put(0, &key(round * 4 + i), &value(round * 4 + i, 1, len))
                .unwrap();
        }
        store.write(&b).unwrap();
        if round == 2 {
            store.flush().unwrap();
        }
    }
    // Unsynced large writes after the synced ones: a prefix survives.
    let nosync = sluice_store::WriteOptions { sync: false };
    for i in 100..110u32 {
        let mut b = WriteBatch::new();
        b.put(0, &key(i), &value(i, 1, 120_000)).unwrap();
        store.write_with(&b, nosync).unwrap();
    }
    view.kill();
    std::mem::forget(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    for i in 0..24u32 {
        let len = if i % 2 == 0 { 50 } else { 150_000 };
        assert_eq!(
            store.get(0, &key(i)).unwrap(),
            Some(value(i, 1, len)),
            "key {i}"
        );
    }
    let mut survivors = 0;
    for i in 100..110u32 {
        if let Some(v) = store.get(0, &key(i)).unwrap() {
            assert_eq!(v, value(i, 1, 120_000), "a surviving value is whole");
            assert_eq!(survivors, i - 100, "survivors form a prefix");
            survivors += 1;
        }
    }
    store.flush().unwrap();
    store.compact().unwrap();
    for i in 0..24u32 {
        let len = if i % 2 == 0 { 50 } else { 150_000 };
        assert_eq!(
            store.get(0, &key(i)).unwrap(),
            Some(value(i, 1, len)),
            "key {i}"
        );
    }
}

#[test]
fn a_damaged_blob_is_reported_not_returned() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    let v = value(1, 1, 100_000);
    store.put(0, b"k", &v).unwrap();
    store.flush().unwrap();
    drop(store);
    // Flip one byte of the value where it lies on the device.
    let needle = &v[50_000..50_064];
    let mut image = vec![0u8; 16384 * 4096];
    mem.damage(0, image.len(), |all| image.copy_from_slice(all));
    let at = image
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the value lies on the device");
    mem.damage(at, 1, |b| b[0] ^= 0xff);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    let err = store.get(0, b"k").unwrap_err().to_string();
    assert!(err.contains("blob file") && err.contains("CRC32C"), "{err}");
}

#[test]
fn compaction_moves_the_last_values_out_of_a_mostly_empty_file() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    // One file: a value never overwritten and nine that are, round after
    // round; without moving it, the first file would stay for the one.
    store.put(0, b"keeper", &value(99, 1, 100_000)).unwrap();
    for i in 0..9u32 {
        store.put(0, &key(i), &value(i, 0, 100_000)).unwrap();
    }
    store.flush().unwrap();
    let files_at_start = store.stats().blob_files;
    for round in 1..=6u32 {
        for i in 0..9u32 {
            store.put(0, &key(i), &value(i, round, 100_000)).unwrap();
        }
        store.flush().unwrap();
        store.compact().unwrap();
    }
    let stats = store.stats();
    assert!(stats.blob_relocations >= 1, "{stats:?}");
    assert!(
        stats.blob_files <= files_at_start + 2,
        "emptied files went: {} now, {files_at_start} after the first round",
        stats.blob_files
    );
    assert_eq!(
        store.get(0, b"keeper").unwrap(),
        Some(value(99, 1, 100_000))
    );
    for i in 0..9u32 {
        assert_eq!(store.get(0, &key(i)).unwrap(), Some(value(i, 6, 100_000)));
    }
    drop(store);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    assert_eq!(
        store.get(0, b"keeper").unwrap(),
        Some(value(99, 1, 100_000))
    );
}

/// Small blob records are gathered in memory and written before any log
/// block that may reference them: whatever the log kept after a crash
/// and a power cut reads back whole.
#[test]
fn gathered_records_land_before_the_log_blocks_that_reference_them() {
    let cfg = config();
    for (round, cut) in [(0u32, false), (1, true), (2, true)] {
        let mem = Arc::new(MemoryDevice::new(4096, 16384));
        Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        let view = ProcessView::new(&mem);
        let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
        let total = 300u32;
        for i in 0..total {
            let mut b = WriteBatch::new();
            b.put(0, &key(i), &value(i, round, 20_000)).unwrap();
            let logged = store.write_logged(&b).unwrap();
            // Groups of a few, as a server's committer takes them; one
            // durable point in the middle.
            if i % 5 == 4 {
                store.write_through(logged.position).unwrap();
            }
            if i == 150 {
                store.make_durable(logged.position).unwrap();
            }
        }
        view.kill();
        std::mem::forget(store);
        if cut {
            mem.power_cut(PowerCutMode::DropUnflushed);
        }
        let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        let mut survivors = 0u32;
        for i in 0..total {
            if let Some(v) = store.get(0, &key(i)).unwrap() {
                assert_eq!(v, value(i, round, 20_000), "round {round}: key {i} whole");
                assert_eq!(survivors, i, "round {round}: survivors form a prefix");
                survivors += 1;
            }
        }
        let floor = if cut { 151 } else { 300 };
        assert!(
            survivors >= floor,
            "round {round}: {survivors} of {total} survived, at least {floor} promised"
        );
    }
}

/// A large put written from its caller's pieces (never copied into a
/// batch) lands with the batch it goes with, atomically: read back whole
/// from the memtable, after a flush and after a power cut once durable;
/// one refused for its size leaves nothing of the batch.
#[test]
fn large_puts_from_pieces_land_with_their_batch() {
    let cfg = config();
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let whole = value(1, 1, (2 << 20) + 123);
    let (head, tail) = whole.split_at(9);
    let mut small = WriteBatch::new();
    small.put(0, b"beside", b"small").unwrap();
    let pieces: [&[u8]; 2] = [head, tail];
    let large = [sluice_store::LargePut {
        keyspace: 0,
        key: b"big",
        value: &pieces,
    }];
    let logged = store.write_logged_large(&small, &large).unwrap();
    assert_eq!(store.get(0, b"big").unwrap().as_deref(), Some(&whole[..]));
    assert_eq!(
        store.get(0, b"beside").unwrap().as_deref(),
        Some(&b"small"[..])
    );
    store.make_durable(logged.position).unwrap();
    // A small piece only, and one past the store's value limit: refused,
    // and the batch beside it with it.
    let mut other = WriteBatch::new();
    other.put(0, b"beside", b"changed").unwrap();
    let huge = vec![0u8; sluice_store::batch::MAX_VALUE_BYTES + 1];
    let too_big: [&[u8]; 1] = [&huge];
    let refused = store.write_logged_large(
        &other,
        &[sluice_store::LargePut {
            keyspace: 0,
            key: b"huge",
            value: &too_big,
        }],
    );
    assert!(refused.is_err());
    drop(huge);
    assert_eq!(
        store.get(0, b"beside").unwrap().as_deref(),
        Some(&b"small"[..])
    );
    assert_eq!(store.get(0, b"huge").unwrap(), None);
    store.flush().unwrap();
    assert_eq!(store.get(0, b"big").unwrap().as_deref(), Some(&whole[..]));
    drop(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    assert_eq!(store.get(0, b"big").unwrap().as_deref(), Some(&whole[..]));
    assert_eq!(
        store.get(0, b"beside").unwrap().as_deref(),
        Some(&b"small"[..])
    );
}
