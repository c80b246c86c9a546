//! The store against an in-memory ordered map: puts, deletes, range deletes,
//! batches, snapshots, scans, reopen and power cuts. Plus bad input.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::ProcessView;
use proptest::prelude::*;
use sluice_io::{Device, FileDevice, FileOptions, MemoryDevice, PowerCutMode};
use sluice_store::batch::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use sluice_store::{
    Snapshot, Store, StoreConfig, StoreError, ValueFormat, WriteBatch, WritesRefused,
};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Small buffers and tables, so that flushes and compactions happen often.
fn small_config() -> StoreConfig {
    let mut cfg = StoreConfig {
        wal_blocks: 2048,
        write_buffer_bytes: 48 << 10,
        // Small enough that blocks are evicted all the time.
        block_cache_bytes: 24 << 10,
        // A few tables keep their index pinned; the rest go through an
        // index cache that evicts too.
        pinned_index_bytes: 4 << 10,
        index_cache_bytes: 8 << 10,
        // Values up to 1 MiB stay in tables (these tests are about
        // tables; tests/blobs.rs covers blob files).
        blob_threshold_bytes: sluice_store::blob::MAX_THRESHOLD_BYTES,
        ..StoreConfig::default()
    };
    cfg.compaction.l0_trigger = 3;
    cfg.compaction.level_base_bytes = 256 << 10;
    cfg.compaction.multiplier = 4;
    cfg.compaction.target_file_bytes = 64 << 10;
    cfg
}

fn memory_store(blocks: u64) -> (Arc<MemoryDevice>, Store) {
    let mem = Arc::new(MemoryDevice::new(4096, blocks));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &small_config()).unwrap();
    (mem, store)
}

fn reopen(mem: &Arc<MemoryDevice>) -> Store {
    Store::open(mem.clone() as Arc<dyn Device>, &small_config()).unwrap()
}

fn devices(mems: &[Arc<MemoryDevice>]) -> Vec<Arc<dyn Device>> {
    mems.iter().map(|m| m.clone() as Arc<dyn Device>).collect()
}

/// A store over `n` memory devices of `blocks` store blocks each.
fn memory_set(n: usize, blocks: u64) -> (Vec<Arc<MemoryDevice>>, Store) {
    let mems: Vec<_> = (0..n)
        .map(|_| Arc::new(MemoryDevice::new(4096, blocks)))
        .collect();
    let store = Store::create_on(devices(&mems), &small_config()).unwrap();
    (mems, store)
}

fn reopen_set(mems: &[Arc<MemoryDevice>]) -> Store {
    Store::open_on(devices(mems), &small_config()).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    Delete(u8),
    DeleteRange(u8, u8),
    Batch(Vec<(u8, Option<u16>)>),
    Snapshot,
    Flush,
    Compact,
    Reopen,
    PowerCut(bool, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => any::<u8>().prop_map(Op::Delete),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::DeleteRange(a.min(b), a.max(b).saturating_add(1))),
        2 => prop::collection::vec((any::<u8>(), prop::option::of(any::<u16>())), 1..6).prop_map(Op::Batch),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Flush),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
        1 => (any::<bool>(), any::<u64>()).prop_map(|(t, s)| Op::PowerCut(t, s)),
    ]
}

fn key(k: u8) -> Vec<u8> {
    format!("key{k:03}").into_bytes()
}

fn value(k: u8, v: u16) -> Vec<u8> {
    // Values of varied length, some spanning WAL blocks.
    let len = (v as usize % 7) * 900 + 1;
    let mut out = vec![k; len];
    out[0] = (v >> 8) as u8;
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn store_matches_an_ordered_map(
        ops in prop::collection::vec(op(), 1..80),
        ranges in prop::collection::vec((any::<u8>(), any::<u8>(), 0u8..9, any::<bool>(), 0usize..40), 4),
        device_count in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let (mems, mut store) = memory_set(device_count, 8192);
        let ks = store.keyspace("default").unwrap();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut snapshots = Vec::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    store.put(ks, &key(k), &value(k, v)).unwrap();
                    model.insert(key(k), value(k, v));
                }
                Op::Delete(k) => {
                    store.delete(ks, &key(k)).unwrap();
                    model.remove(&key(k));
                }
                Op::DeleteRange(a, b) => {
                    store.delete_range(ks, &key(a), &key(b)).unwrap();
                    let doomed: Vec<_> = model.range(key(a)..key(b)).map(|(k, _)| k.clone()).collect();
                    for k in doomed { model.remove(&k); }
                }
                Op::Batch(entries) => {
                    let mut b = WriteBatch::new();
                    for (k, v) in &entries {
                        match v {
                            Some(v) => { b.put(ks, &key(*k), &value(*k, *v)).unwrap(); }
                            None => { b.delete(ks, &key(*k)).unwrap(); }
                        }
                    }
                    store.write(&b).unwrap();
                    for (k, v) in entries {
                        match v {
                            Some(v) => { model.insert(key(k), value(k, v)); }
                            None => { model.remove(&key(k)); }
                        }
                    }
                }
                Op::Snapshot => snapshots.push((store.snapshot(), model.clone())),
                Op::Flush => store.flush().unwrap(),
                Op::Compact => store.compact().unwrap(),
                Op::Reopen => {
                    snapshots.clear();
                    drop(store);
                    store = reopen_set(&mems);
                }
                Op::PowerCut(torn, seed) => {
                    snapshots.clear();
                    drop(store);
                    // Every device of the set loses power at once.
                    for (i, mem) in mems.iter().enumerate() {
                        let seed = seed.wrapping_add(i as u64);
                        let mode = if torn { PowerCutMode::TornSectors { seed } } else { PowerCutMode::DropUnflushed };
                        mem.power_cut(mode);
                    }
                    store = reopen_set(&mems);
                }
            }
        }
        // Point reads and full scans, forward and reverse, at the latest state.
        let snap = store.snapshot();
        for k in 0..=255u8 {
            prop_assert_eq!(store.get(ks, &key(k)).unwrap(), model.get(&key(k)).cloned());
        }
        // The same keys as one run (several holds of the memtables' locks),
        // each shown once with its place.
        let keys: Vec<Vec<u8>> = (0..=255u8).rev().map(key).collect();
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut each: Vec<Option<Option<Vec<u8>>>> = vec![None; keys.len()];
        store.get_each_at(ks, &key_refs, &snap, |i, v| {
            assert!(each[i].is_none(), "key {i} shown twice");
            each[i] = Some(v.map(<[u8]>::to_vec));
        }).unwrap();
        for (k, got) in keys.iter().zip(each) {
            prop_assert_eq!(got, Some(model.get(k).cloned()));
        }
        let all = store.scan(ks, (Bound::Unbounded, Bound::Unbounded), &snap, false, usize::MAX).unwrap();
        let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        prop_assert_eq!(&all, &want);
        let mut rev = store.scan(ks, (Bound::Unbounded, Bound::Unbounded), &snap, true, usize::MAX).unwrap();
        rev.reverse();
        prop_assert_eq!(&rev, &want);
        // Ranges with every kind of bound, both directions, with limits.
        for &(a, b, kinds, reverse, limit) in &ranges {
            let bound = |k: u8, kind: u8| match kind {
                0 => Bound::Included(key(k)),
                1 => Bound::Excluded(key(k)),
                _ => Bound::Unbounded,
            };
            let (lo, hi) = (bound(a, kinds % 3), bound(b, kinds / 3));
            let mut want: Vec<_> = model
                .iter()
                .filter(|(k, _)| std::ops::RangeBounds::contains(&(lo.clone(), hi.clone()), *k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if reverse {
                want.reverse();
            }
            want.truncate(limit);
            let range = (lo.as_ref().map(Vec::as_slice), hi.as_ref().map(Vec::as_slice));
            let got = store.scan(ks, range, &snap, reverse, limit).unwrap();
            prop_assert_eq!(&got, &want, "range {:?}..{:?} reverse {}", lo, hi, reverse);
            let visited = visit_pairs(&store, ks, range, &snap, reverse, limit);
            prop_assert_eq!(&visited, &want, "visited {:?}..{:?} reverse {}", lo, hi, reverse);
        }
        // Old snapshots still read what they saw, in both directions.
        for (s, m) in &snapshots {
            let mut rev = store.scan(ks, (Bound::Unbounded, Bound::Unbounded), s, true, usize::MAX).unwrap();
            rev.reverse();
            let want: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(rev, want);
            let got = store.scan(ks, (Bound::Unbounded, Bound::Unbounded), s, false, usize::MAX).unwrap();
            for k in (0..=255u8).step_by(17) {
                prop_assert_eq!(store.get_at(ks, &key(k), s).unwrap(), m.get(&key(k)).cloned());
            }
            let keys: Vec<Vec<u8>> = (0..=255u8).step_by(3).map(key).collect();
            let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let mut each = vec![None; keys.len()];
            store.get_each_at(ks, &key_refs, s, |i, v| each[i] = Some(v.map(<[u8]>::to_vec))).unwrap();
            for (k, got) in keys.iter().zip(each) {
                prop_assert_eq!(got, Some(m.get(k).cloned()));
            }
            let want: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(got, want.clone());
            let visited = visit_pairs(&store, ks, (Bound::Unbounded, Bound::Unbounded), s, false, usize::MAX);
            prop_assert_eq!(visited, want);
        }
    }
}

/// The pairs `StoreIter::for_each_ref` visits, up to `limit`; the iterator
/// has ended after it (it is checked to give nothing more).
fn visit_pairs(
    store: &Store,
    ks: u32,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    snapshot: &Snapshot,
    reverse: bool,
    limit: usize,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    if limit == 0 {
        return out;
    }
    let mut it = store.iter_expecting(ks, range, snapshot, reverse, limit);
    it.for_each_ref(|k, v| {
        out.push((k.to_vec(), v.to_vec()));
        out.len() < limit
    })
    .unwrap();
    assert!(
        it.next_ref().unwrap().is_none(),
        "the iterator ends with the visit"
    );
    out
}

/// An iterator keeps reading what its snapshot saw while another thread
/// overwrites, deletes, flushes and compacts underneath it; once it is
/// dropped, the tables it held are freed.
#[test]
fn iterators_stream_a_consistent_snapshot_under_writes_and_compaction() {
    let (_mem, store) = memory_store(16384);
    let ks = store.keyspace("default").unwrap();
    let k = |i: u32| format!("k{i:05}").into_bytes();
    for i in 0..3000u32 {
        store.put(ks, &k(i), format!("old{i}").as_bytes()).unwrap();
    }
    store.compact().unwrap();
    for i in (0..3000u32).step_by(3) {
        store.put(ks, &k(i), format!("mid{i}").as_bytes()).unwrap();
    }
    let snap = store.snapshot();
    let want: Vec<(Vec<u8>, Vec<u8>)> = (0..3000u32)
        .map(|i| {
            let v = if i % 3 == 0 {
                format!("mid{i}")
            } else {
                format!("old{i}")
            };
            (k(i), v.into_bytes())
        })
        .collect();
    let mut forward = store.iter(ks, (Bound::Unbounded, Bound::Unbounded), &snap, false);
    let mut reverse = store.iter(ks, (Bound::Unbounded, Bound::Unbounded), &snap, true);
    let mut got_forward: Vec<_> = forward.by_ref().take(500).map(Result::unwrap).collect();
    let mut got_reverse: Vec<_> = reverse.by_ref().take(500).map(Result::unwrap).collect();
    let mut hold = store.iter(ks, (Bound::Unbounded, Bound::Unbounded), &snap, false);
    assert!(hold.next().is_some());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for i in 0..3000u32 {
                store.put(ks, &k(i), format!("new{i}").as_bytes()).unwrap();
                if i % 7 == 6 {
                    store.delete(ks, &k(i - 1)).unwrap();
                }
            }
            store.delete_range(ks, &k(1000), &k(2000)).unwrap();
            store.compact().unwrap();
        });
        // Interleaved with the writer.
        for _ in 0..20 {
            got_forward.extend(forward.by_ref().take(50).map(Result::unwrap));
            got_reverse.extend(reverse.by_ref().take(50).map(Result::unwrap));
        }
    });
    got_forward.extend(forward.map(Result::unwrap));
    got_reverse.extend(reverse.map(Result::unwrap));
    assert_eq!(got_forward, want);
    got_reverse.reverse();
    assert_eq!(got_reverse, want);
    // The new state is what a fresh iterator sees.
    let now: Vec<_> = store
        .iter(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &store.snapshot(),
            false,
        )
        .map(Result::unwrap)
        .collect();
    assert!(now
        .iter()
        .all(|(key, v)| v.starts_with(b"new") && (key < &k(1000) || key >= &k(2000))));
    let deleted = (0..3000u32)
        .filter(|i| i % 7 == 6 && !(1000..2000).contains(&(i - 1)))
        .count();
    assert_eq!(now.len(), 3000 - 1000 - deleted);
    // The replaced tables are held by `hold`; once it is gone they are freed.
    let free_held = store.stats().free_blocks;
    drop(hold);
    store.compact().unwrap();
    let free_after = store.stats().free_blocks;
    assert!(free_after > free_held, "{free_after} <= {free_held}");
}

/// Pinned index and filter memory stays within its bound; tables past it
/// are read through the index cache; a bound of zero pins nothing and
/// every read still answers right, also after reopening.
#[test]
fn pinned_index_memory_is_bounded_and_unpinned_tables_read_right() {
    for limit in [0usize, 6 << 10] {
        let mem = Arc::new(MemoryDevice::new(4096, 16384));
        let cfg = StoreConfig {
            pinned_index_bytes: limit,
            index_cache_bytes: 4 << 10,
            ..small_config()
        };
        let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        let ks = store.keyspace("default").unwrap();
        let k = |i: u32| format!("key{i:06}").into_bytes();
        for round in 0..3u32 {
            for i in (0..4000u32).filter(|i| i % 3 == round) {
                store.put(ks, &k(i), &i.to_le_bytes().repeat(10)).unwrap();
            }
            store.flush().unwrap();
        }
        let check = |store: &Store| {
            let st = store.stats();
            assert!(
                st.pinned_index_bytes <= limit,
                "{} > {limit}",
                st.pinned_index_bytes
            );
            assert!(st.unpinned_tables > 0, "{st:?}");
            assert!(st.index_cache_used_bytes <= 4 << 10);
            for i in (0..4000u32).step_by(37) {
                assert_eq!(
                    store.get(ks, &k(i)).unwrap(),
                    Some(i.to_le_bytes().repeat(10))
                );
            }
            assert_eq!(store.get(ks, b"key999999").unwrap(), None);
            let all = store
                .scan(
                    ks,
                    (Bound::Unbounded, Bound::Unbounded),
                    &store.snapshot(),
                    true,
                    usize::MAX,
                )
                .unwrap();
            assert_eq!(all.len(), 4000);
            assert_eq!(all[0].0, k(3999));
        };
        check(&store);
        if limit > 0 {
            assert!(store.stats().pinned_index_bytes > 0);
        }
        drop(store);
        let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        check(&store);
        // Compaction replaces the tables: their pins are given back and
        // the new tables take them within the same bound.
        store.compact().unwrap();
        let st = store.stats();
        assert!(st.pinned_index_bytes <= limit);
        assert_eq!(count_of(&store, ks), 4000);
    }
}

/// On three devices, table data is striped over the second and third and
/// every index, the WAL and the manifest stay on the first; frees return
/// blocks to the device they came from.
#[test]
fn a_device_set_places_index_and_data_apart() {
    // Compactions only when asked: block counts are compared below.
    let cfg = StoreConfig {
        background_compaction: false,
        ..small_config()
    };
    let mems: Vec<_> = (0..3)
        .map(|_| Arc::new(MemoryDevice::new(4096, 8192)))
        .collect();
    let store = Store::create_on(devices(&mems), &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let free_at_start = store.stats().device_free_blocks;
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for round in 0..4u32 {
        for i in (0..6000u32).filter(|i| i % 4 == round) {
            store.put(ks, &k(i), &[round as u8; 90]).unwrap();
        }
        store.flush().unwrap();
    }
    let placed = store.table_placement();
    assert!(placed.len() >= 4, "{placed:?}");
    assert!(
        placed
            .iter()
            .all(|p| p.index_device == 0 && p.data_device != 0),
        "{placed:?}"
    );
    for d in [1, 2] {
        assert!(
            placed.iter().any(|p| p.data_device == d),
            "nothing on device {d}: {placed:?}"
        );
    }
    // Data blocks on the data devices add up to what those devices lost.
    let st = store.stats();
    let data_blocks: u64 = placed.iter().map(|p| p.data_blocks as u64).sum();
    let used_on_data: u64 = (1..3)
        .map(|d| free_at_start[d] - st.device_free_blocks[d])
        .sum();
    assert_eq!(data_blocks, used_on_data);
    store.compact().unwrap();
    drop(store);
    let store = Store::open_on(devices(&mems), &cfg).unwrap();
    assert!(store
        .table_placement()
        .iter()
        .all(|p| p.index_device == 0 && p.data_device != 0));
    for i in (0..6000u32).step_by(29) {
        assert_eq!(store.get(ks, &k(i)).unwrap(), Some(vec![(i % 4) as u8; 90]));
    }
    // Everything deleted and compacted away: the data devices are free again.
    store.delete_range(ks, &k(0), &k(6000)).unwrap();
    store.compact().unwrap();
    let st = store.stats();
    for d in [1, 2] {
        assert_eq!(st.device_free_blocks[d], free_at_start[d], "device {d}");
    }
}

/// Opening a device set checks every device before reading anything.
#[test]
fn a_device_set_refuses_missing_swapped_and_foreign_devices() {
    let (mems, store) = memory_set(3, 4096);
    drop(store);
    let err = |devs: Vec<Arc<dyn Device>>| {
        Store::open_on(devs, &small_config())
            .unwrap_err()
            .to_string()
    };
    let e = err(devices(&mems[..2]));
    assert!(e.contains("spans 3 devices but got 2"), "{e}");
    let e = err(devices(&[
        mems[0].clone(),
        mems[2].clone(),
        mems[1].clone(),
    ]));
    assert!(
        e.contains("cannot be device 1") && e.contains("it is device 2") && e.contains("order"),
        "{e}"
    );
    let (others, other_store) = memory_set(3, 4096);
    drop(other_store);
    let e = err(devices(&[
        mems[0].clone(),
        others[1].clone(),
        mems[2].clone(),
    ]));
    assert!(e.contains("belongs to another store"), "{e}");
    let blank = Arc::new(MemoryDevice::new(4096, 4096));
    let e = err(devices(&[mems[0].clone(), mems[1].clone(), blank]));
    assert!(
        e.contains("cannot be device 2") && e.contains("no valid store label"),
        "{e}"
    );
    // Given right, it opens.
    assert!(Store::open_on(devices(&mems), &small_config()).is_ok());
}

/// Tables of disjoint key ranges with nothing under them move down a
/// level without being rewritten (same file numbers); overlapping ones
/// are merged into new tables. Either way every key reads back, also
/// after reopening.
#[test]
fn sequential_tables_move_down_without_a_rewrite() {
    let cfg = StoreConfig {
        background_compaction: false,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for batch in 0..4u32 {
        for i in batch * 500..(batch + 1) * 500 {
            store.put(0, &k(i), &[7; 100]).unwrap();
        }
        store.flush().unwrap();
    }
    let before: Vec<u64> = store.table_placement().iter().map(|t| t.file_no).collect();
    assert!(before.len() >= 4, "{before:?}");
    store.compact().unwrap();
    let after = store.table_placement();
    let mut moved: Vec<u64> = after.iter().map(|t| t.file_no).collect();
    moved.sort_unstable();
    let mut want = before.clone();
    want.sort_unstable();
    assert_eq!(moved, want, "sequential tables were rewritten: {after:?}");
    assert!(after.iter().all(|t| t.level > 0));
    // An overlapping table now: it is merged, not moved.
    for i in (0..2000u32).step_by(100) {
        store.put(0, &k(i), &[8; 100]).unwrap();
    }
    store.compact().unwrap();
    assert!(store
        .table_placement()
        .iter()
        .any(|t| !before.contains(&t.file_no)));
    drop(store);
    let store = Store::open(mem as Arc<dyn Device>, &cfg).unwrap();
    for i in 0..2000u32 {
        let v = if i % 100 == 0 { 8 } else { 7 };
        assert_eq!(store.get(0, &k(i)).unwrap(), Some(vec![v; 100]), "key {i}");
    }
}

#[test]
fn keyspaces_persist_and_scans_take_ranges_prefixes_and_limits() {
    let (mem, store) = memory_store(4096);
    let papers = store
        .create_keyspace("papers", ValueFormat::Json, "")
        .unwrap();
    let other = store
        .create_keyspace("authors", ValueFormat::Record, "name:str,h:u32")
        .unwrap();
    for i in 0..50u32 {
        store
            .put(
                papers,
                format!("p/{i:04}").as_bytes(),
                format!("{{\"n\":{i}}}").as_bytes(),
            )
            .unwrap();
        store
            .put(other, format!("p/{i:04}").as_bytes(), b"x")
            .unwrap();
    }
    let snap = store.snapshot();
    let range = store
        .scan(
            papers,
            (
                Bound::Included(b"p/0010".as_slice()),
                Bound::Excluded(b"p/0020".as_slice()),
            ),
            &snap,
            false,
            100,
        )
        .unwrap();
    assert_eq!(range.len(), 10);
    assert_eq!(range[0].0, b"p/0010");
    let rev = store
        .scan(papers, (Bound::Unbounded, Bound::Unbounded), &snap, true, 3)
        .unwrap();
    let keys: Vec<_> = rev
        .iter()
        .map(|(k, _)| String::from_utf8(k.clone()).unwrap())
        .collect();
    assert_eq!(keys, ["p/0049", "p/0048", "p/0047"]);
    assert_eq!(
        store
            .scan_prefix(papers, b"p/003", &snap, 100)
            .unwrap()
            .len(),
        10
    );
    drop(snap);
    drop(store);
    let store = reopen(&mem);
    let def = store.keyspace_def("authors").unwrap();
    assert_eq!(
        (def.format, def.schema.as_str()),
        (ValueFormat::Record, "name:str,h:u32")
    );
    assert_eq!(store.stats().keyspaces, ["authors", "default", "papers"]);
    assert_eq!(
        store.get(papers, b"p/0042").unwrap().unwrap(),
        b"{\"n\":42}"
    );
}

/// Synced and unsynced writers at once: each write is visible when it
/// returns (its writer reads it back at once), what a snapshot sees is a
/// prefix of the writes in sequence order, and nobody is left waiting.
#[test]
fn synced_and_unsynced_writers_see_their_writes_in_order() {
    use sluice_store::WriteOptions;
    let (_mem, store) = memory_store(8192);
    let ks = store.keyspace("default").unwrap();
    let writers = 4u32;
    let per_writer = 300u32;
    let logs: Vec<Vec<(u64, u32)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                let store = &store;
                scope.spawn(move || {
                    let key = format!("writer{t}");
                    let mut log = Vec::new();
                    for i in 0..per_writer {
                        // Mostly unsynced, as a server's writes are, with
                        // synced ones among them.
                        let sync = (i + t) % 5 == 0;
                        let mut b = WriteBatch::new();
                        b.put(ks, key.as_bytes(), &i.to_le_bytes()).unwrap();
                        let seq = store.write_with(&b, WriteOptions { sync }).unwrap();
                        let back = store.get(ks, key.as_bytes()).unwrap();
                        assert_eq!(
                            back,
                            Some(i.to_le_bytes().to_vec()),
                            "writer {t}, write {i}"
                        );
                        log.push((seq, i));
                    }
                    log
                })
            })
            .collect();
        // A reader: each snapshot shows, for every writer, a write no older
        // than the last one it saw.
        let mut seen = vec![None::<u32>; writers as usize];
        for _ in 0..200 {
            let snap = store.snapshot();
            for (t, last) in seen.iter_mut().enumerate() {
                let key = format!("writer{t}");
                let now = store
                    .get_at(ks, key.as_bytes(), &snap)
                    .unwrap()
                    .map(|v| u32::from_le_bytes(v.try_into().unwrap()));
                assert!(now >= *last, "writer {t}: {now:?} after {last:?}");
                *last = now;
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Sequence numbers are given in each writer's order and never twice.
    let mut all: Vec<u64> = logs.iter().flatten().map(|&(seq, _)| seq).collect();
    for log in &logs {
        assert!(log.windows(2).all(|w| w[0].0 < w[1].0));
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), (writers * per_writer) as usize);
    assert_eq!(store.stats().last_sequence, u64::from(writers * per_writer));
}

/// Writers, synced and unsynced, racing on the visible mark, in many short
/// rounds so that many writes are the last one in flight (whose wake-up
/// nobody else's write would bring): every write returns (a watchdog fails
/// the test instead of letting it hang) and the mark ends at the last
/// sequence.
#[test]
fn mixed_writers_all_return_and_the_mark_reaches_the_last_write() {
    use sluice_store::WriteOptions;
    let (_mem, store) = memory_store(16384);
    let store = Arc::new(store);
    let ks = store.keyspace("default").unwrap();
    let (rounds, writers, per_writer) = (200u32, 6u32, 8u32);
    for round in 0..rounds {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for t in 0..writers {
            let store = store.clone();
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    let sync = (i * 7 + t + round) % 3 == 0;
                    let mut b = WriteBatch::new();
                    b.put(ks, format!("{round}/{t}/{i}").as_bytes(), b"v")
                        .unwrap();
                    store.write_with(&b, WriteOptions { sync }).unwrap();
                }
                done_tx.send(()).unwrap();
            });
        }
        for _ in 0..writers {
            done_rx
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!("round {round}: a writer still waits after 30 s, a wake-up was lost")
                });
        }
    }
    let total = rounds * writers * per_writer;
    assert_eq!(store.stats().last_sequence, u64::from(total));
    assert_eq!(count_of(&store, ks), total as usize);
}

#[test]
fn concurrent_writers_share_flushes_and_lose_nothing() {
    let (mem, store) = memory_store(8192);
    let store = Arc::new(store);
    let ks = store.keyspace("default").unwrap();
    let handles: Vec<_> = (0..8u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..100u32 {
                    store
                        .put(ks, format!("{t}/{i:03}").as_bytes(), &i.to_le_bytes())
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.last_sequence, 800);
    assert!(stats.wal_flushes <= 800);
    drop(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = reopen(&mem);
    assert_eq!(
        count_of(&store, ks),
        800,
        "every acknowledged write survives"
    );
}

#[test]
fn bad_input_gets_clear_errors_and_loses_nothing() {
    let (mem, store) = memory_store(12288);
    let ks = store.keyspace("default").unwrap();
    store.put(ks, b"kept", b"1").unwrap();
    let err = store
        .put(ks, &vec![0u8; MAX_KEY_BYTES + 1], b"v")
        .unwrap_err();
    assert!(
        err.to_string().contains("exceeds the limit of 8192"),
        "{err}"
    );
    let err = store
        .put(ks, b"k", &vec![0u8; MAX_VALUE_BYTES + 1])
        .unwrap_err();
    assert!(err.to_string().contains("value of"), "{err}");
    let err = store.keyspace("nope").unwrap_err();
    assert!(
        matches!(err, StoreError::UnknownKeyspace { .. }) && err.to_string().contains("default"),
        "{err}"
    );
    let err = store.put(77, b"k", b"v").unwrap_err();
    assert!(err.to_string().contains("unknown keyspace"), "{err}");
    let err = store.delete_range(ks, b"b", b"a").unwrap_err();
    assert!(err.to_string().contains("start < end"), "{err}");
    let err = store
        .create_keyspace("default", ValueFormat::Raw, "")
        .unwrap_err();
    assert!(err.to_string().contains("exists already"), "{err}");
    // A batch larger than the whole WAL ring: a clear error, earlier writes
    // intact. (Values of 1 MiB and more are logged as blob references:
    // these stay in the record.)
    let mut huge = WriteBatch::new();
    for i in 0..12u8 {
        huge.put(ks, &[b'h', i], &vec![i; 1023 << 10]).unwrap();
    }
    let err = store.write(&huge).unwrap_err();
    assert!(matches!(err, StoreError::WalFull { .. }), "{err}");
    // Writing far more than the ring and the device hold works as long as
    // keys are overwritten: flushes free the ring, compactions the space.
    let big = vec![7u8; 1 << 20];
    for i in 0..40u8 {
        store.put(ks, &[b'b', i % 4], &big).unwrap();
    }
    // Distinct keys until the device is nearly full: a clear error before
    // the store is too full to flush or compact, and every acknowledged
    // write is still there after reopening.
    let (acknowledged, err) = put_until_refused(&store, ks, "fill", &big);
    assert_space_low(&err);
    assert!(acknowledged > 10, "{acknowledged}");
    drop(store);
    let store = reopen(&mem);
    assert_eq!(store.get(ks, b"kept").unwrap().unwrap(), b"1");
    assert_eq!(store.get(ks, &[b'b', 3]).unwrap().unwrap(), big);
    for i in 0..acknowledged {
        assert!(
            store
                .get(ks, format!("fill{i:05}").as_bytes())
                .unwrap()
                .is_some(),
            "fill{i} lost"
        );
    }
    assert!(
        store.get(ks, b"h\x00").unwrap().is_none(),
        "the refused batch left nothing"
    );
}

#[test]
fn a_device_of_another_format_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("not-a-store");
    let dev = FileDevice::create(&path, 64 << 20, &FileOptions::default()).unwrap();
    let err = Store::open(Arc::new(dev), &StoreConfig::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    assert!(err.to_string().contains("format it first"), "{err}");
    // And a real file-backed store works end to end.
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&path, &FileOptions::default()).unwrap());
    let cfg = StoreConfig {
        wal_blocks: 256,
        ..StoreConfig::default()
    };
    let store = Store::create(dev.clone(), &cfg).unwrap();
    store.put(0, b"on", b"disk").unwrap();
    drop(store);
    let store = Store::open(dev, &cfg).unwrap();
    assert_eq!(store.get(0, b"on").unwrap().unwrap(), b"disk");
}

#[test]
fn unsynced_writes_survive_a_clean_close_and_a_crash_keeps_a_prefix() {
    use sluice_store::WriteOptions;
    // No background thread: the simulated crash below leaks the store.
    let cfg = StoreConfig {
        background_compaction: false,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 8192));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let nosync = WriteOptions { sync: false };
    for i in 0..500u32 {
        let mut b = WriteBatch::new();
        b.put(0, format!("k{i:04}").as_bytes(), &[1u8; 100])
            .unwrap();
        store.write_with(&b, nosync).unwrap();
    }
    drop(store);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    assert_eq!(count_of(&store, 0), 500);
    // Unsynced writes then a crash and a power cut: whatever survives is a
    // prefix, and the synced write before them is there. The store runs on
    // a process's view of the device, so the crash stops its I/O (early
    // log writes still queued on its engines never land).
    drop(store);
    let view = ProcessView::new(&mem);
    let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
    store.put(0, b"synced", b"1").unwrap();
    for i in 0..300u32 {
        let mut b = WriteBatch::new();
        b.put(0, format!("u{i:04}").as_bytes(), &[2u8; 100])
            .unwrap();
        store.write_with(&b, nosync).unwrap();
    }
    view.kill(); // a crash: no clean close, no I/O after it
    std::mem::forget(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = reopen(&mem);
    assert!(store.get(0, b"synced").unwrap().is_some());
    let got = store
        .scan_prefix(0, b"u", &store.snapshot(), usize::MAX)
        .unwrap();
    for (i, (k, _)) in got.iter().enumerate() {
        assert_eq!(k, format!("u{i:04}").as_bytes(), "survivors form a prefix");
    }
}

/// `everysec` as Redis means it: a write put on the device with
/// `write_through` (no flush) survives the process's death; a power cut
/// may take what no flush covered, never more, and never a hole.
#[test]
fn written_through_records_survive_a_crash_and_flushed_ones_a_power_cut() {
    let cfg = StoreConfig {
        background_compaction: false,
        ..small_config()
    };
    for (round, torn) in [(0u64, false), (1, true), (2, false), (3, true)] {
        let mem = Arc::new(MemoryDevice::new(4096, 8192));
        Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        let view = ProcessView::new(&mem);
        let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
        let (flushed_at, total) = (150 + 40 * round as u32, 400u32);
        for i in 0..total {
            let mut b = WriteBatch::new();
            b.put(0, format!("w{i:04}").as_bytes(), &[3u8; 120])
                .unwrap();
            let logged = store.write_logged(&b).unwrap();
            // Groups of a few records, as a server's committer takes them.
            if i % 3 == 2 || i + 1 == total {
                store.write_through(logged.position).unwrap();
                assert!(store.is_written_through(logged.position));
            }
            if i + 1 == flushed_at {
                store.write_through(logged.position).unwrap();
                store.make_durable(logged.position).unwrap();
            }
        }
        view.kill(); // the process dies: no close, no I/O after it
        std::mem::forget(store);
        // The process's death alone loses nothing written through.
        let store = reopen(&mem);
        assert_eq!(count_of(&store, 0), total as usize, "round {round}");
        drop(store);
        // A crash of the machine: the flushed part stays, the rest is a
        // prefix of what was written.
        let view = ProcessView::new(&mem);
        let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
        for i in total..total + 200 {
            let mut b = WriteBatch::new();
            b.put(0, format!("w{i:04}").as_bytes(), &[4u8; 120])
                .unwrap();
            let logged = store.write_logged(&b).unwrap();
            store.write_through(logged.position).unwrap();
        }
        view.kill();
        std::mem::forget(store);
        mem.power_cut(if torn {
            PowerCutMode::TornSectors { seed: round }
        } else {
            PowerCutMode::DropUnflushed
        });
        let store = reopen(&mem);
        let got = store
            .scan_prefix(0, b"w", &store.snapshot(), usize::MAX)
            .unwrap();
        assert!(
            got.len() >= total as usize,
            "round {round}: {} of the {total} the reopen made durable",
            got.len()
        );
        for (i, (k, _)) in got.iter().enumerate() {
            assert_eq!(k, format!("w{i:04}").as_bytes(), "survivors form a prefix");
        }
    }
}

/// A thousand power cuts, each at a random point of a random workload
/// (puts, deletes and batches acknowledged synced, written through, or
/// not at all; flushes to tables; compactions), half of them tearing
/// every unflushed write: the store opens every time, and holds exactly
/// the state after some prefix of the operations, a prefix that holds
/// every operation acknowledged durable.
#[test]
fn a_thousand_power_cuts_at_random_points_keep_every_durable_write() {
    use rand::{Rng, SeedableRng};
    // A small log and device, so that a round costs milliseconds.
    let cfg = StoreConfig {
        background_compaction: false,
        wal_blocks: 128,
        ..small_config()
    };
    let key = |k: u8| format!("key{k:03}").into_bytes();
    let mut torn_cuts = 0;
    for point in 0..1000u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(point);
        let mem = Arc::new(MemoryDevice::new(4096, 1024));
        Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
        let view = ProcessView::new(&mem);
        let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
        // The model after each operation; `durable`: how many operations
        // a power cut may not take.
        let mut states = vec![BTreeMap::<Vec<u8>, Vec<u8>>::new()];
        let mut durable = 0usize;
        let ops = rng.gen_range(1..60);
        for _ in 0..ops {
            let mut state = states.last().unwrap().clone();
            let mut b = WriteBatch::new();
            for _ in 0..rng.gen_range(1..4) {
                let k = rng.gen_range(0..24u8);
                if rng.gen_bool(0.2) {
                    b.delete(0, &key(k)).unwrap();
                    state.remove(&key(k));
                } else {
                    let v = vec![rng.gen::<u8>(); rng.gen_range(1..600)];
                    b.put(0, &key(k), &v).unwrap();
                    state.insert(key(k), v);
                }
            }
            match rng.gen_range(0..10) {
                0..=3 => {
                    store.write(&b).unwrap();
                    states.push(state);
                    durable = states.len() - 1;
                }
                4..=6 => {
                    let logged = store.write_logged(&b).unwrap();
                    store.write_through(logged.position).unwrap();
                    states.push(state);
                }
                _ => {
                    store.write_logged(&b).unwrap();
                    states.push(state);
                }
            }
            match rng.gen_range(0..20) {
                0 => store.flush().unwrap(),
                1 => store.compact().unwrap(),
                _ => {}
            }
        }
        view.kill();
        // Its close reaches nothing: the view is dead. Dropped, not
        // leaked, so that a thousand rounds keep one device's memory.
        drop(store);
        let torn = rng.gen_bool(0.5);
        torn_cuts += torn as usize;
        mem.power_cut(if torn {
            PowerCutMode::TornSectors { seed: point }
        } else {
            PowerCutMode::DropUnflushed
        });
        let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg)
            .unwrap_or_else(|e| panic!("point {point}: the store did not open: {e}"));
        let got: BTreeMap<Vec<u8>, Vec<u8>> = store
            .scan(
                0,
                (Bound::Unbounded, Bound::Unbounded),
                &store.snapshot(),
                false,
                usize::MAX,
            )
            .unwrap()
            .into_iter()
            .collect();
        assert!(
            states[durable..].contains(&got),
            "point {point}: the state after the cut is no prefix holding the {durable} durable operations"
        );
    }
    eprintln!("1000 power cuts, {torn_cuts} of them torn");
    assert!(torn_cuts > 400, "{torn_cuts} torn cuts");
}

/// On a real file the first reads of a scan's tables go to the device in
/// one io_uring batch; the results must be the same as reading in turn.
#[test]
fn batched_scan_reads_on_a_file_match_the_model() {
    // One file, then three: a scan's first reads then go to three engines.
    for files in [1usize, 3] {
        batched_scan_reads_match_the_model_on(files);
    }
}

fn batched_scan_reads_match_the_model_on(files: usize) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let devs: Vec<Arc<dyn Device>> = (0..files)
        .map(|i| {
            Arc::new(
                FileDevice::create(
                    &dir.path().join(format!("scan{i}.dev")),
                    64 << 20,
                    &FileOptions::default(),
                )
                .unwrap(),
            ) as Arc<dyn Device>
        })
        .collect();
    let mut cfg = small_config();
    cfg.background_compaction = false;
    cfg.compaction.l0_trigger = 100;
    let store = Store::create_on(devs, &cfg).unwrap();
    let mut model = BTreeMap::new();
    let mut x = 17u64;
    for round in 0..6u64 {
        for i in 0..400u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = format!("k{:05}", x % 3000).into_bytes();
            let v = format!("r{round}i{i}").into_bytes();
            store.put(0, &k, &v).unwrap();
            model.insert(k, v);
        }
        store.flush().unwrap();
    }
    assert!(
        store.stats().tables_per_level[0] >= 6,
        "{:?}",
        store.stats().tables_per_level
    );
    let snap = store.snapshot();
    for start in (0..3000).step_by(137) {
        let s = format!("k{start:05}").into_bytes();
        let got = store
            .scan(
                0,
                (Bound::Included(s.as_slice()), Bound::Unbounded),
                &snap,
                false,
                50,
            )
            .unwrap();
        let want: Vec<_> = model
            .range(s.clone()..)
            .take(50)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(got, want, "scan from {start}");
    }
}

/// Formatting over a device that held a store starts an empty store: the
/// old store's manifest blocks (same places, fitting sequence numbers)
/// never replay into the new one.
#[test]
fn formatting_over_an_old_store_leaves_nothing_of_it() {
    let (mem, store) = memory_store(8192);
    let ks = store
        .create_keyspace("papers", ValueFormat::Json, "")
        .unwrap();
    for i in 0..3000u32 {
        store
            .put(ks, &i.to_be_bytes(), format!("{{\"n\":{i}}}").as_bytes())
            .unwrap();
    }
    store.flush().unwrap();
    drop(store);
    let fresh = Store::create(mem.clone() as Arc<dyn Device>, &small_config()).unwrap();
    drop(fresh);
    let fresh = reopen(&mem);
    assert!(
        matches!(
            fresh.keyspace("papers"),
            Err(StoreError::UnknownKeyspace { .. })
        ),
        "the old keyspace came back"
    );
    let stats = fresh.stats();
    assert_eq!(stats.last_sequence, 0, "{stats:?}");
    assert!(stats.tables_per_level.iter().all(|&n| n == 0), "{stats:?}");
}

/// Synced writes from several threads on a store whose log runs on SQPOLL
/// rings with polled completions (no system call per commit while the
/// kernel threads are awake): every acknowledged write is there after a
/// reopen, and the commits grouped.
#[test]
fn synced_writes_on_sqpoll_log_engines_survive_a_reopen() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("sqpoll.dev");
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&path, 64 << 20, &FileOptions::default()).unwrap());
    let config = StoreConfig {
        wal_sqpoll_idle_ms: Some(5),
        wal_blocks: 256,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::create(dev.clone(), &config).unwrap());
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let key = format!("t{t}-{i:04}");
                    store.put(0, key.as_bytes(), &i.to_le_bytes()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let flushes = store.stats().wal_flushes;
    assert!(
        flushes > 0 && flushes <= 800,
        "{flushes} WAL flushes for 800 writes"
    );
    drop(store);
    let store = Store::open(dev, &config).unwrap();
    for t in 0..4u32 {
        for i in 0..200u32 {
            let key = format!("t{t}-{i:04}");
            assert_eq!(
                store.get(0, key.as_bytes()).unwrap(),
                Some(i.to_le_bytes().to_vec()),
                "{key}"
            );
        }
    }
}

/// The store reports its device I/O by priority class (log writes high,
/// memtable flushes and compactions low, reads high), its compaction debt,
/// and writers that had to flush on their own thread.
#[test]
fn stats_count_io_by_priority_compaction_debt_and_stalls() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let mut cfg = small_config();
    // No background thread: every flush and compaction happens on a writer.
    cfg.background_compaction = false;
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let start = store.stats();
    assert_eq!(start.device_io.len(), 1);
    for i in 0..3000u32 {
        store
            .put(ks, format!("k{i:05}").as_bytes(), &[7; 100])
            .unwrap();
    }
    let wrote = store.stats();
    let io = wrote.device_io[0];
    assert!(io.high.writes > start.device_io[0].high.writes, "{io:?}");
    assert!(
        io.low.writes > 0,
        "memtable flushes write at low priority: {io:?}"
    );
    assert!(wrote.write_stalls > 0, "{wrote:?}");
    assert!(wrote.write_stall_us > 0);
    let before_reads = io.high.reads;
    for i in (0..3000u32).step_by(97) {
        assert!(store
            .get(ks, format!("k{i:05}").as_bytes())
            .unwrap()
            .is_some());
    }
    assert!(store.stats().device_io[0].high.reads > before_reads);
    // Level 0 past its trigger is debt; compaction pays it off.
    for round in 0..cfg.compaction.l0_trigger as u32 {
        for i in 0..200u32 {
            store
                .put(ks, format!("d{round}-{i}").as_bytes(), &[1; 10])
                .unwrap();
        }
        store.flush().unwrap();
    }
    let st = store.stats();
    assert!(
        st.tables_per_level[0] >= cfg.compaction.l0_trigger,
        "{st:?}"
    );
    assert!(st.compaction_debt_bytes > 0, "{st:?}");
    store.compact().unwrap();
    assert_eq!(store.stats().compaction_debt_bytes, 0);
}

/// A writer that honours `write_pressure` (a server's event loop) never
/// flushes on its own thread, even when the log's ring is much smaller
/// than the write buffer: the memtable goes to a table once its records
/// fill half the ring.
#[test]
fn logged_writes_flush_early_when_the_ring_fills_first() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let cfg = StoreConfig {
        wal_blocks: 256,
        write_buffer_bytes: 8 << 20,
        ..StoreConfig::default()
    };
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    for i in 0..20_000u32 {
        let held = std::time::Instant::now();
        while store.write_pressure() {
            assert!(held.elapsed().as_secs() < 20, "write pressure never ends");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let mut b = WriteBatch::new();
        b.put(ks, format!("k{i:06}").as_bytes(), &[3; 200]).unwrap();
        store.write_logged(&b).unwrap();
    }
    let st = store.stats();
    assert_eq!(st.write_stalls, 0, "a writer flushed: {st:?}");
    assert!(
        st.flushes >= 3,
        "the ring (1 MiB) took 4 MB in {} flushes",
        st.flushes
    );
    for i in (0..20_000u32).step_by(501) {
        assert!(store
            .get(ks, format!("k{i:06}").as_bytes())
            .unwrap()
            .is_some());
    }
}

/// Full log blocks go to the device in batches of consecutive blocks; the
/// ring wraps many times, a batch never runs past the ring's end, and every
/// write reads back exact after a clean close and after the log is replayed
/// at open.
#[test]
fn batched_log_blocks_wrap_the_ring_and_read_back_exact() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let cfg = StoreConfig {
        wal_blocks: 256,
        write_buffer_bytes: 8 << 20,
        ..StoreConfig::default()
    };
    let value = |i: u32| format!("{i:08}").repeat(1 + (i % 37) as usize).into_bytes();
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let keys = 12_000u32;
    for i in 0..keys {
        while store.write_pressure() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let mut b = WriteBatch::new();
        b.put(ks, format!("k{i:06}").as_bytes(), &value(i)).unwrap();
        if i % 1000 == 999 {
            // Now and then a synced one: a commit sends the batch early.
            store.write(&b).unwrap();
        } else {
            store.write_logged(&b).unwrap();
        }
    }
    assert!(store.stats().flushes >= 2, "the ring never wrapped");
    drop(store);
    let store = reopen(&mem);
    for i in 0..keys {
        let got = store.get(ks, format!("k{i:06}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&value(i)[..]), "key {i}");
    }
    drop(store);
    // Then a crash after a synced write: everything before it comes back
    // from the log, replayed from batched blocks.
    let view = ProcessView::new(&mem);
    let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
    let more = 3_000u32;
    for i in keys..keys + more {
        while store.write_pressure() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let mut b = WriteBatch::new();
        b.put(ks, format!("k{i:06}").as_bytes(), &value(i)).unwrap();
        store.write_logged(&b).unwrap();
    }
    store.put(ks, b"last", b"synced").unwrap();
    view.kill();
    std::mem::forget(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = reopen(&mem);
    assert_eq!(
        store.get(ks, b"last").unwrap().as_deref(),
        Some(&b"synced"[..])
    );
    for i in 0..keys + more {
        let got = store.get(ks, format!("k{i:06}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&value(i)[..]), "key {i}");
    }
}

/// Write pressure follows the memtable and the level-0 table count as they
/// change (both are kept aside for the write path, not looked up): a
/// writer without a background thread flushes at the write buffer, and
/// level 0 at three times its trigger holds writes until a compaction.
#[test]
fn write_pressure_follows_the_memtable_and_level_0() {
    let cfg = StoreConfig {
        background_compaction: false,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let put = |i: u32| {
        let mut b = WriteBatch::new();
        b.put(ks, format!("k{i:06}").as_bytes(), &[5u8; 1000])
            .unwrap();
        store.write(&b).unwrap();
    };
    // Four write buffers' worth: the writer flushes each time it is full.
    let per_buffer = cfg.write_buffer_bytes as u32 / 1000;
    for i in 0..4 * per_buffer {
        put(i);
        assert!(store.stats().memtable_bytes < cfg.write_buffer_bytes + 4096);
    }
    assert!(store.stats().flushes >= 3, "{:?}", store.stats());
    store.compact().unwrap();
    assert!(!store.write_pressure());
    // Level 0 at three times its trigger: pressure until a compaction.
    let trigger = cfg.compaction.l0_trigger as u32;
    for i in 0..3 * trigger {
        assert!(!store.write_pressure(), "{i} tables in level 0");
        put(i);
        store.flush().unwrap();
    }
    assert!(
        store.write_pressure(),
        "level 0 holds {} tables",
        3 * trigger
    );
    store.compact().unwrap();
    assert!(!store.write_pressure(), "compacted");
}

/// Values kept from the memtable (as a server keeps one it streams) stay
/// whole after the memtable is flushed and freed and its value chunks are
/// reused by no one: a value is a slice of a shared chunk.
#[test]
fn values_kept_from_the_memtable_outlive_its_flush() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &small_config()).unwrap();
    let ks = store.keyspace("default").unwrap();
    let value = |i: u32| {
        format!("v{i:05}-")
            .repeat(1 + (i % 700) as usize)
            .into_bytes()
    };
    // Values up to 4,900 bytes: in filled chunks, in the chunk still being
    // filled, and in chunks of their own.
    let keys = 400u32;
    for i in 0..keys {
        store
            .put(ks, format!("k{i:05}").as_bytes(), &value(i))
            .unwrap();
    }
    let kept: Vec<_> = (0..keys)
        .map(|i| {
            store
                .get_latest_with(ks, format!("k{i:05}").as_bytes(), |v| v.map(|v| v.keep()))
                .unwrap()
                .expect("written")
        })
        .collect();
    store.flush().unwrap();
    for i in 0..keys {
        store
            .put(ks, format!("k{i:05}").as_bytes(), b"newer")
            .unwrap();
    }
    store.compact().unwrap();
    for (i, k) in kept.iter().enumerate() {
        assert_eq!(k.bytes(), &value(i as u32)[..], "kept value {i}");
    }
}

/// A memtable flush puts the new table's data blocks in the block cache:
/// reading the newest data right after a flush needs no device read.
#[test]
fn a_flushed_table_is_read_from_the_cache_without_device_reads() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let cfg = StoreConfig {
        block_cache_bytes: 16 << 20,
        wal_blocks: 2048,
        ..StoreConfig::default()
    };
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let mut b = WriteBatch::new();
    for i in 0..20_000u32 {
        b.put(ks, format!("k{i:06}").as_bytes(), &[5; 100]).unwrap();
    }
    store.write(&b).unwrap();
    store.flush().unwrap();
    let before = store.stats();
    assert_eq!(before.memtable_entries, 0);
    for i in (0..20_000u32).step_by(7) {
        let v = store.get(ks, format!("k{i:06}").as_bytes()).unwrap();
        assert_eq!(v.as_deref(), Some(&[5u8; 100][..]));
    }
    let after = store.stats();
    assert_eq!(
        after.device_io[0].high.reads, before.device_io[0].high.reads,
        "reads after the flush went to the device"
    );
    assert!(after.block_cache_hits > before.block_cache_hits);
}

/// A point read with no snapshot never goes back in time and never misses
/// a key, while writes, memtable flushes and compactions run under it:
/// each value it sees is at least the last one a put returned before the
/// read began.
#[test]
fn latest_reads_without_a_snapshot_stay_current_across_flushes() {
    let (_mem, store) = memory_store(16384);
    let store = Arc::new(store);
    let ks = store.keyspace("default").unwrap();
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    store.put(ks, b"counter", &0u64.to_le_bytes()).unwrap();
    let writer = {
        let (store, acked) = (store.clone(), acked.clone());
        std::thread::spawn(move || {
            for i in 1..=4000u64 {
                // Filler keys fill memtables, so flushes and compactions
                // happen all the while.
                store
                    .put(ks, format!("fill/{i:05}").as_bytes(), &[7; 64])
                    .unwrap();
                store.put(ks, b"counter", &i.to_le_bytes()).unwrap();
                acked.store(i, std::sync::atomic::Ordering::Release);
            }
        })
    };
    let mut last = 0;
    // Reads through one cache kept across them all, as a server's thread
    // does, alternate with uncached ones: the cached view must follow
    // every memtable switch, flush and compaction.
    let mut cache = sluice_store::ReadCache::default();
    let mut reads = 0u64;
    while !writer.is_finished() {
        let floor = acked.load(std::sync::atomic::Ordering::Acquire);
        reads += 1;
        let got = match reads % 3 {
            0 => store.get_latest(ks, b"counter").unwrap(),
            1 => store
                .get_latest_cached(&mut cache, ks, b"counter", |v| {
                    v.map(|v| v.bytes().to_vec())
                })
                .unwrap(),
            // Remembered in the cache: the next cached read may answer
            // from it, which must be as current.
            _ => match store
                .get_latest_remembered(&mut cache, ks, b"counter", |v| {
                    v.map(|v| v.bytes().to_vec())
                })
                .unwrap()
            {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let got = got.expect("the counter is always there");
        let got = u64::from_le_bytes(got.try_into().unwrap());
        assert!(got >= floor, "read {got} after {floor} was acknowledged");
        assert!(got >= last, "went back from {last} to {got}");
        last = got;
    }
    writer.join().unwrap();
    assert!(
        store.stats().flushes > 3,
        "too few flushes to test anything"
    );
    assert_eq!(
        store.get_latest(ks, b"counter").unwrap(),
        Some(4000u64.to_le_bytes().to_vec())
    );
}

/// A read remembered in a thread's cache answers the next read of its key
/// through that cache until anything is written or the view changes, and
/// never after: a write of the key, of another key, a delete, a flush and
/// a dropped keyspace each end it.
#[test]
fn a_remembered_read_answers_until_the_next_write() {
    let (_mem, store) = memory_store(16384);
    let ks = store.keyspace("default").unwrap();
    let other = store
        .create_keyspace("other", ValueFormat::Raw, "")
        .unwrap();
    store.put(ks, b"a", b"1").unwrap();
    let mut cache = sluice_store::ReadCache::default();
    let value = |v: Option<sluice_store::Found<'_>>| v.map(|v| v.bytes().to_vec());
    let remember = |cache: &mut sluice_store::ReadCache, ks: u32, key: &[u8]| {
        store
            .get_latest_remembered(cache, ks, key, value)
            .unwrap()
            .expect("in memory")
    };
    let cached = |cache: &mut sluice_store::ReadCache, ks: u32, key: &[u8]| {
        store.get_latest_cached(cache, ks, key, value).unwrap()
    };
    assert_eq!(remember(&mut cache, ks, b"a"), Some(b"1".to_vec()));
    assert_eq!(remember(&mut cache, ks, b"b"), None, "never written");
    assert_eq!(cached(&mut cache, ks, b"a"), Some(b"1".to_vec()));
    assert_eq!(cached(&mut cache, ks, b"b"), None);
    // Each change below follows a fresh remembered read of both keys.
    let steps = [
        "a put of the key",
        "a put of a key never read",
        "a delete",
        "a put in another keyspace",
        "a flush",
    ];
    for what in steps {
        let before = (
            remember(&mut cache, ks, b"a"),
            remember(&mut cache, ks, b"b"),
        );
        match what {
            "a put of the key" => _ = store.put(ks, b"a", b"2").unwrap(),
            "a put of a key never read" => _ = store.put(ks, b"b", b"3").unwrap(),
            "a delete" => _ = store.delete(ks, b"a").unwrap(),
            "a put in another keyspace" => _ = store.put(other, b"a", b"x").unwrap(),
            _ => store.flush().unwrap(),
        }
        let now = (
            store.get_latest(ks, b"a").unwrap(),
            store.get_latest(ks, b"b").unwrap(),
        );
        let through_cache = (cached(&mut cache, ks, b"a"), cached(&mut cache, ks, b"b"));
        assert_eq!(through_cache, now, "after {what} (before it: {before:?})");
    }
    // A keyspace dropped: what a fresh read answers (the memtables may
    // still hold its keys), not what was remembered before.
    store.put(other, b"k", b"v").unwrap();
    assert_eq!(remember(&mut cache, other, b"k"), Some(b"v".to_vec()));
    store.drop_keyspace("other").unwrap();
    let fresh = store
        .get_latest_cached(&mut Default::default(), other, b"k", value)
        .ok();
    assert_eq!(
        store.get_latest_cached(&mut cache, other, b"k", value).ok(),
        fresh,
        "a dropped keyspace's key answered from memory"
    );
}

/// A flush writes only the newest version of each key in each snapshot
/// stripe: a hot key overwritten many times is one table entry, while a
/// live snapshot keeps the version it sees, before and after a reopen.
#[test]
fn a_flush_keeps_only_the_versions_a_snapshot_can_see() {
    let (mem, store) = memory_store(16384);
    let ks = store.keyspace("default").unwrap();
    store.put(ks, b"hot", b"v1").unwrap();
    store.put(ks, b"cold", b"c").unwrap();
    let snap = store.snapshot();
    for i in 2..=100 {
        store.put(ks, b"hot", format!("v{i}").as_bytes()).unwrap();
    }
    store.delete(ks, b"cold").unwrap();
    store.flush().unwrap();
    // hot: v100 and, for the snapshot, v1; cold: the delete and, for the
    // snapshot, c.
    assert_eq!(store.stats().table_entries, 4);
    assert_eq!(store.get(ks, b"hot").unwrap(), Some(b"v100".to_vec()));
    assert_eq!(store.get(ks, b"cold").unwrap(), None);
    assert_eq!(
        store.get_at(ks, b"hot", &snap).unwrap(),
        Some(b"v1".to_vec())
    );
    assert_eq!(
        store.get_at(ks, b"cold", &snap).unwrap(),
        Some(b"c".to_vec())
    );
    drop(snap);
    for i in 101..=150 {
        store.put(ks, b"hot", format!("v{i}").as_bytes()).unwrap();
    }
    store.flush().unwrap();
    // No snapshot: one more entry, the newest (fewer if a compaction
    // merged the two tables meanwhile).
    assert!(
        store.stats().table_entries <= 5,
        "{}",
        store.stats().table_entries
    );
    drop(store);
    let store = reopen(&mem);
    assert_eq!(store.get(ks, b"hot").unwrap(), Some(b"v150".to_vec()));
    assert_eq!(store.get(ks, b"cold").unwrap(), None);
}

/// Snapshots taken while hot keys are overwritten and flushed (each flush
/// keeping only the versions live snapshots can see) read the same values
/// for as long as they live.
#[test]
fn snapshots_taken_during_flushes_keep_their_versions() {
    let (_mem, store) = memory_store(16384);
    let store = Arc::new(store);
    let ks = store.keyspace("default").unwrap();
    let keys: Vec<Vec<u8>> = (0..8).map(|k| format!("hot/{k}").into_bytes()).collect();
    for k in &keys {
        store.put(ks, k, &0u64.to_le_bytes()).unwrap();
    }
    let writer = {
        let (store, keys) = (store.clone(), keys.clone());
        std::thread::spawn(move || {
            for i in 1..=3000u64 {
                store
                    .put(ks, &keys[i as usize % keys.len()], &i.to_le_bytes())
                    .unwrap();
                // Filler, so memtables fill and flush all the while.
                store
                    .put(ks, format!("fill/{i:05}").as_bytes(), &[1; 48])
                    .unwrap();
            }
        })
    };
    let read_all = |snap: &sluice_store::Snapshot| -> Vec<Option<Vec<u8>>> {
        keys.iter()
            .map(|k| store.get_at(ks, k, snap).unwrap())
            .collect()
    };
    // Each snapshot lives across several flushes: the last 20 are read
    // again at every round.
    let mut live: std::collections::VecDeque<(sluice_store::Snapshot, Vec<Option<Vec<u8>>>)> =
        Default::default();
    let mut checked = 0;
    while !writer.is_finished() {
        let snap = store.snapshot();
        let first = read_all(&snap);
        live.push_back((snap, first));
        if live.len() > 20 {
            live.pop_front();
        }
        for (snap, first) in &live {
            assert_eq!(&read_all(snap), first, "a snapshot's reads changed");
        }
        checked += 1;
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    writer.join().unwrap();
    assert!(
        store.stats().flushes > 3,
        "too few flushes to test anything"
    );
    assert!(checked >= 5, "only {checked} rounds of reads");
}

#[test]
fn a_store_is_open_in_one_place_at_a_time() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("locked.dev");
    FileDevice::create(&path, 64 << 20, &FileOptions::default()).unwrap();
    let open_dev = || -> Arc<dyn Device> {
        Arc::new(FileDevice::open(&path, &FileOptions::default()).unwrap())
    };
    let cfg = StoreConfig {
        wal_blocks: 256,
        lock_wait_ms: 0,
        ..StoreConfig::default()
    };
    let store = Store::create(open_dev(), &cfg).unwrap();
    // A second open of the same file (as another process would do) is refused, naming why.
    let err = Store::open(open_dev(), &cfg).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    // One that may wait gets the store once the first closes.
    let waiting = std::thread::spawn({
        let dev = open_dev();
        let cfg = StoreConfig {
            lock_wait_ms: 10_000,
            ..cfg.clone()
        };
        move || Store::open(dev, &cfg).map(|s| s.get(0, b"k").unwrap())
    });
    store.put(0, b"k", b"v").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(store);
    assert_eq!(waiting.join().unwrap().unwrap().unwrap(), b"v");
}

/// A scan of more than the block cache holds does not fill it (it would
/// only evict what point reads use); a long walk driven page by page adds
/// at most its share per table; a scan that fits fills it, so a repeat is
/// served from memory.
#[test]
fn long_scans_do_not_flood_the_block_cache() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let cfg = StoreConfig {
        block_cache_bytes: 256 << 10,
        ..small_config()
    };
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let big = store.create_keyspace("big", ValueFormat::Raw, "").unwrap();
    let small = store
        .create_keyspace("small", ValueFormat::Raw, "")
        .unwrap();
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..6000u32 {
        store.put(big, &k(i), &[i as u8; 400]).unwrap();
    }
    for i in 0..100u32 {
        store.put(small, &k(i), &[i as u8; 400]).unwrap();
    }
    store.flush().unwrap();
    store.compact().unwrap();
    let all = (Bound::Unbounded, Bound::Unbounded);
    let scan = |ks, expecting: usize| {
        let snap = store.snapshot();
        let n = store
            .iter_expecting(ks, all, &snap, false, expecting)
            .inspect(|r| assert!(r.is_ok(), "{r:?}"))
            .count();
        (n, store.stats().block_cache_used_bytes)
    };
    let misses = || store.stats().block_cache_misses;
    // A scan that fits is cached: the second one misses nothing.
    scan(small, 0);
    let m = misses();
    assert_eq!(scan(small, 0).0, 100);
    assert_eq!(misses(), m, "a repeated small scan read the device");
    // A 2.4 MB scan through a 256 KiB cache adds nothing to it: the small
    // keyspace's blocks are still there.
    let before = store.stats().block_cache_used_bytes;
    assert_eq!(scan(big, 0), (6000, before), "a long scan filled the cache");
    let m = misses();
    scan(small, 0);
    assert_eq!(misses(), m, "a long scan evicted what a short one cached");
    // Driven by pages: each table cursor adds at most an eighth of it.
    let (n, used) = scan(big, 100);
    assert_eq!(n, 6000);
    let tables = store.stats().tables_per_level.iter().sum::<usize>();
    assert!(
        used <= before + tables * (256 << 10) / 8 + 8192,
        "{used} bytes cached by {tables} tables"
    );
}

/// Dropping a keyspace removes it and its data for good: its tables' space
/// comes back, writes left in the log are not replayed into it or into a
/// keyspace created after it (ids are never given twice), a crash right
/// after the drop keeps it dropped, and keyspaces can be created and
/// dropped far more often than a store holds at once.
#[test]
fn dropped_keyspaces_free_their_space_and_never_come_back() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let cfg = small_config();
    drop(Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap());
    let view = ProcessView::new(&mem);
    let store = Store::open(view.clone() as Arc<dyn Device>, &cfg).unwrap();
    let free_at_start = store.stats().free_blocks;
    // The dropped keyspace has the highest id: the one a new keyspace
    // would take if ids were given again.
    let keep = store.create_keyspace("keep", ValueFormat::Raw, "").unwrap();
    let a = store.create_keyspace("a", ValueFormat::Raw, "").unwrap();
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..3000u32 {
        store.put(a, &k(i), &[7; 300]).unwrap();
        if i % 10 == 0 {
            store.put(keep, &k(i), b"kept").unwrap();
        }
    }
    store.compact().unwrap();
    // Some writes only in the memtable and the log.
    for i in 0..50u32 {
        store.put(a, &k(i), b"late").unwrap();
    }
    store.put(keep, b"late", b"kept").unwrap();
    let snap = store.snapshot();
    let old = store.iter(a, (Bound::Unbounded, Bound::Unbounded), &snap, false);
    store.drop_keyspace("a").unwrap();
    assert!(store.keyspace("a").is_err());
    assert!(
        store.put(a, b"x", b"y").is_err(),
        "a write to a dropped keyspace"
    );
    // A batch with one of its puts there is refused whole.
    let mut mixed = WriteBatch::new();
    mixed.put(keep, b"mixed", b"1").unwrap();
    mixed.put(a, b"mixed", b"2").unwrap();
    let err = store.write(&mixed).unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownKeyspace { name, known } if name == &format!("#{a}") && known.contains("keep")),
        "{err}"
    );
    assert_eq!(store.get(keep, b"mixed").unwrap(), None);
    // An iterator opened before reads on.
    assert_eq!(old.count(), 3000);
    drop(snap);
    let again = store.create_keyspace("a", ValueFormat::Raw, "").unwrap();
    assert!(again > a, "id {again} given twice");
    // A crash: no clean close; the log still holds the late writes.
    view.kill();
    std::mem::forget(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = reopen(&mem);
    let again = store.keyspace("a").unwrap();
    assert_eq!(
        count_of(&store, again),
        0,
        "a dropped keyspace's data came back"
    );
    assert_eq!(count_of(&store, keep), 301);
    store.compact().unwrap();
    let free = store.stats().free_blocks;
    assert!(
        free + 200 > free_at_start,
        "{free} blocks free after the drop, {free_at_start} before anything"
    );
    // Far more keyspaces over time than a store holds at once.
    for round in 0..1100u32 {
        let name = format!("t{round}");
        let t = store.create_keyspace(&name, ValueFormat::Raw, "").unwrap();
        store.put(t, b"k", b"v").unwrap();
        store.drop_keyspace(&name).unwrap();
    }
    store.compact().unwrap();
    drop(store);
    let store = reopen(&mem);
    assert_eq!(
        store.stats().keyspaces,
        vec!["a".to_string(), "default".into(), "keep".into()]
    );
    assert_eq!(count_of(&store, keep), 301);
}

fn count_of(store: &Store, ks: u32) -> usize {
    store
        .scan(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &store.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap()
        .len()
}

/// `split_keys` cuts where the tables' bytes reach each share: many tiny
/// tables at the start of the range (level 0, not compacted) do not take
/// cuts of their own, and the parts hold similar numbers of keys.
#[test]
fn split_keys_cut_parts_of_similar_size() {
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let mut cfg = small_config();
    cfg.compaction.l0_trigger = 1000;
    let store = Store::create(mem as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.create_keyspace("s", ValueFormat::Raw, "").unwrap();
    for i in 0..20000u32 {
        store
            .put(ks, format!("k{i:08}").as_bytes(), &[1; 100])
            .unwrap();
    }
    store.compact().unwrap();
    for j in 0..40u32 {
        store
            .put(ks, format!("k00000000-{j:02}").as_bytes(), b"x")
            .unwrap();
        store.flush().unwrap();
    }
    let levels = store.stats().tables_per_level;
    assert!(levels[0] >= 40, "{levels:?}");
    let cuts = store.split_keys(ks, 4);
    assert_eq!(cuts.len(), 3, "{cuts:?}");
    let mut bounds: Vec<Bound<&[u8]>> = vec![Bound::Unbounded];
    bounds.extend(cuts.iter().map(|c| Bound::Excluded(c.as_slice())));
    bounds.push(Bound::Unbounded);
    let snap = store.snapshot();
    for w in 0..4 {
        let start = match bounds[w] {
            Bound::Excluded(k) => Bound::Included(k),
            other => other,
        };
        let n = store.iter(ks, (start, bounds[w + 1]), &snap, false).count();
        assert!(
            (3000..7000).contains(&n),
            "part {w} holds {n} of 20040 keys"
        );
    }
}

/// A flushed memtable a reader's cached view still holds waits in the
/// store, and is freed there (not by the reader) once the reader lets
/// go: nothing accumulates.
#[test]
fn a_flushed_memtable_a_reader_holds_is_freed_once_it_lets_go() {
    let (_mem, store) = memory_store(16384);
    let ks = store.create_keyspace("k", ValueFormat::Raw, "").unwrap();
    let put = |i: u32| {
        let mut b = WriteBatch::new();
        b.put(ks, format!("key{i}").as_bytes(), b"value").unwrap();
        store.write(&b).unwrap();
    };
    put(0);
    let mut reader = sluice_store::ReadCache::default();
    let seen = store
        .get_latest_cached(&mut reader, ks, b"key0", |v| v.map(|v| v.bytes().to_vec()))
        .unwrap();
    assert_eq!(seen.as_deref(), Some(&b"value"[..]));
    store.flush().unwrap();
    assert_eq!(store.stats().retired_memtables, 1, "the reader holds it");
    reader.clear();
    put(1);
    store.flush().unwrap();
    assert_eq!(store.stats().retired_memtables, 0, "both freed");
    assert_eq!(
        store.get(ks, b"key0").unwrap().as_deref(),
        Some(&b"value"[..])
    );
}

/// The scheduling policy (`/proc/.../stat` field 41) of each of this
/// process's threads named `name`.
fn thread_policies(name: &str) -> Vec<i32> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (head, rest) = stat.rsplit_once(')').unwrap();
        if head.split_once('(').unwrap().1 != name {
            continue;
        }
        // Fields after the name start at field 3.
        policies.push(
            rest.split_whitespace()
                .nth(41 - 3)
                .unwrap()
                .parse()
                .unwrap(),
        );
    }
    policies
}

#[test]
fn the_background_thread_runs_at_idle_cpu_priority_when_asked() {
    const SCHED_IDLE: i32 = 5;
    let cfg = StoreConfig {
        background_cpu: sluice_io::cpu::BackgroundCpu::Idle,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 4096));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    // Other tests' stores run their threads at the normal policy at the
    // same time: this store's thread is the idle one among them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !thread_policies("sluice-compacti").contains(&SCHED_IDLE) {
        assert!(
            std::time::Instant::now() < deadline,
            "no idle background thread: {:?}",
            thread_policies("sluice-compacti")
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // It still does its work: writes past the buffer are flushed.
    let ks = store.keyspace("default").unwrap();
    for i in 0..2000u32 {
        store.put(ks, &i.to_be_bytes(), &[7u8; 100]).unwrap();
    }
    store.flush().unwrap();
    assert!(store.stats().flushes >= 1);
    assert_eq!(
        store.get(ks, &7u32.to_be_bytes()).unwrap().unwrap(),
        vec![7u8; 100]
    );
}

/// A point read that may not wait names what it misses instead of reading
/// it; once that is read and filled in, asking again answers as a waiting
/// read does: for values in the memtable, in tables, deleted and absent,
/// with indexes and blocks evicted between reads.
#[test]
fn point_reads_that_may_not_wait_name_their_misses_and_answer_after_a_fill() {
    // No index pinned, and room for only a few in the index cache.
    let cfg = StoreConfig {
        pinned_index_bytes: 0,
        index_cache_bytes: 4 << 10,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..6000u32 {
        store
            .put(
                ks,
                &k(i),
                format!("value-{i}-{}", "x".repeat(40)).as_bytes(),
            )
            .unwrap();
        if i % 7 == 3 {
            store.delete(ks, &k(i - 3)).unwrap();
        }
    }
    store.flush().unwrap();
    store.compact().unwrap();
    store.put(ks, &k(5), b"in the memtable").unwrap();
    drop(store);
    // Reopened: every cache starts empty.
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    assert!(store.stats().tables_per_level.iter().sum::<usize>() >= 4);
    let mut cache = sluice_store::ReadCache::default();
    let mut queue = store.fill_queue();
    let (mut index_misses, mut block_misses) = (0, 0);
    for i in (0..6100u32).step_by(3) {
        let key = k(i);
        let mut fills = 0;
        let got = loop {
            let answered = store
                .get_latest_or_miss(&mut cache, ks, &key, false, |v| {
                    v.map(|v| v.bytes().to_vec())
                })
                .unwrap();
            match answered {
                Ok(v) => break v,
                Err(miss) => {
                    match miss.at() {
                        sluice_store::sst::MissAt::Index => index_misses += 1,
                        sluice_store::sst::MissAt::Block(_) => block_misses += 1,
                    }
                    fills += 1;
                    assert!(fills <= 16, "key {i}: still missing after {fills} fills");
                    assert!(queue.has_room());
                    queue.start(miss, u64::from(i)).unwrap();
                    assert_eq!(queue.in_flight(), 1);
                    let mut ready = Vec::new();
                    while ready.is_empty() {
                        queue.reap(&mut ready).unwrap();
                    }
                    assert_eq!(ready.len(), 1);
                    let (token, filled) = ready.pop().unwrap();
                    assert_eq!(token, u64::from(i));
                    filled.unwrap();
                }
            }
        };
        assert_eq!(got, store.get(ks, &key).unwrap(), "key {i}");
    }
    assert!(block_misses > 10, "{block_misses} block misses");
    assert!(index_misses > 0, "{index_misses} index misses");
}

#[test]
fn misses_of_one_extent_share_one_read_and_each_gets_its_token_back() {
    let cfg = StoreConfig {
        pinned_index_bytes: 0,
        ..small_config()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 16384));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let ks = store.keyspace("default").unwrap();
    let k = |i: u32| format!("key{i:06}").into_bytes();
    for i in 0..2000u32 {
        store
            .put(ks, &k(i), format!("value-{i}").as_bytes())
            .unwrap();
    }
    store.flush().unwrap();
    drop(store);
    let store = Store::open(mem.clone() as Arc<dyn Device>, &cfg).unwrap();
    let mut cache = sluice_store::ReadCache::default();
    let mut queue = store.fill_queue();
    let mut miss_of = |key: &[u8]| {
        store
            .get_latest_or_miss(&mut cache, ks, key, false, |_| ())
            .unwrap()
            .expect_err("nothing is cached after a reopen")
    };
    // Neighbouring keys: the same index first, then (after it is in) the
    // same data block.
    let (a, b) = (miss_of(&k(10)), miss_of(&k(11)));
    assert_eq!(a.at(), b.at());
    let room = queue.room();
    queue.start(a, 1).unwrap();
    queue.start(b, 2).unwrap();
    assert_eq!(
        queue.in_flight(),
        1,
        "the second miss joined the first read"
    );
    assert_eq!(queue.room(), room - 1);
    let mut ready = Vec::new();
    while ready.len() < 2 {
        queue.reap(&mut ready).unwrap();
    }
    let mut tokens: Vec<u64> = ready.iter().map(|(t, _)| *t).collect();
    tokens.sort();
    assert_eq!(tokens, [1, 2]);
    assert!(ready.iter().all(|(_, r)| r.is_ok()));
    assert_eq!(queue.in_flight(), 0);
    assert_eq!(queue.room(), room);
    // Both keys answer from what the one read brought in, or name the next
    // thing to read: never the extent just read.
    for key in [k(10), k(11)] {
        let mut fills = 0;
        loop {
            match store
                .get_latest_or_miss(&mut cache, ks, &key, false, |v| {
                    v.map(|v| v.bytes().to_vec())
                })
                .unwrap()
            {
                Ok(v) => {
                    assert_eq!(v, store.get(ks, &key).unwrap());
                    break;
                }
                Err(miss) => {
                    fills += 1;
                    assert!(fills <= 4, "still missing after {fills} fills");
                    queue.start(miss, 3).unwrap();
                    let mut ready = Vec::new();
                    while ready.is_empty() {
                        queue.reap(&mut ready).unwrap();
                    }
                    ready.pop().unwrap().1.unwrap();
                }
            }
        }
    }
    // One read takes at most MAX_JOINED_PER_READ others; the next miss of
    // the same extent reads on its own.
    let far = k(1999);
    let miss = store
        .get_latest_or_miss(&mut cache, ks, &far, false, |_| ())
        .unwrap()
        .expect_err("a block not read yet");
    let joiners = sluice_store::store::MAX_JOINED_PER_READ as u64;
    for token in 0..=joiners + 1 {
        queue.start(miss.clone(), 100 + token).unwrap();
    }
    assert_eq!(queue.in_flight(), 2);
    let mut ready = Vec::new();
    while ready.len() < joiners as usize + 2 {
        queue.reap(&mut ready).unwrap();
    }
    assert!(ready.iter().all(|(_, r)| r.is_ok()));
    let mut tokens: Vec<u64> = ready.iter().map(|(t, _)| *t).collect();
    tokens.sort();
    assert_eq!(tokens, (100..=100 + joiners + 1).collect::<Vec<_>>());
}

/// Puts `{prefix}{n:05}` = `value` for n = 0, 1, ... until a put is
/// refused: how many were acknowledged, and the refusal.
fn put_until_refused(store: &Store, ks: u32, prefix: &str, value: &[u8]) -> (u32, StoreError) {
    let mut acknowledged = 0u32;
    loop {
        match store.put(ks, format!("{prefix}{acknowledged:05}").as_bytes(), value) {
            Ok(_) => acknowledged += 1,
            Err(e) => return (acknowledged, e),
        }
        assert!(acknowledged < 100_000, "writes never refused");
    }
}

fn assert_space_low(err: &StoreError) {
    assert!(
        matches!(
            err,
            StoreError::WritesRefused(WritesRefused::SpaceLow { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("only deletes are taken"), "{err}");
}

/// Polls `ok` every 50 ms for up to 30 s.
fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "not within 30 s: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_full_device_takes_deletes_and_writes_resume_once_compaction_frees_room() {
    let (mem, store) = memory_store(12288);
    let ks = store.keyspace("default").unwrap();
    let value = vec![3u8; 256 << 10];
    let (acknowledged, err) = put_until_refused(&store, ks, "k", &value);
    assert_space_low(&err);
    assert!(
        store.writes_refused(false).is_some() && store.writes_refused(true).is_none(),
        "deletes are taken while writes that add data are not"
    );
    // Reads go on.
    assert_eq!(store.get(ks, b"k00000").unwrap().unwrap(), value);
    // Deleting the older half frees room: the store flushes the deletes
    // and compacts on its own, and writes resume.
    let half = acknowledged / 2;
    let mut deletes = WriteBatch::new();
    for i in 0..half {
        deletes.delete(ks, format!("k{i:05}").as_bytes()).unwrap();
    }
    store.write(&deletes).unwrap();
    eventually("writes resume once the deletes are compacted", || {
        store.writes_refused(false).is_none()
    });
    store.put(ks, b"after", b"room").unwrap();
    drop(store);
    let store = reopen(&mem);
    for i in 0..acknowledged {
        let got = store.get(ks, format!("k{i:05}").as_bytes()).unwrap();
        assert_eq!(got.is_some(), i >= half, "k{i:05}");
    }
    assert_eq!(store.get(ks, b"after").unwrap().unwrap(), b"room");
}

#[test]
fn writes_refused_for_room_resume_only_past_half_the_reserve_again() {
    // A compaction writes its outputs before it frees its inputs: without
    // a margin, free space hovering at the reserve would refuse and take
    // writes by turns (a bulk refused, the next write taken).
    let (_mem, store) = memory_store(12288);
    let ks = store.keyspace("default").unwrap();
    let value = vec![9u8; 256 << 10];
    let (acknowledged, err) = put_until_refused(&store, ks, "k", &value);
    assert_space_low(&err);
    let (mut deleted, mut refused_above_reserve) = (0, 0);
    loop {
        store
            .delete(ks, format!("k{deleted:05}").as_bytes())
            .unwrap();
        deleted += 1;
        store.compact().unwrap();
        let free_bytes = store.stats().free_blocks * 4096;
        match store.writes_refused(false) {
            Some(WritesRefused::SpaceLow {
                reserve_bytes,
                resume_bytes,
                ..
            }) => {
                assert_eq!(resume_bytes, reserve_bytes + reserve_bytes / 2);
                assert!(free_bytes < resume_bytes, "{free_bytes} free, refused");
                if free_bytes >= reserve_bytes {
                    refused_above_reserve += 1;
                    let err = store.put(ks, b"between", b"x").unwrap_err();
                    assert!(err.to_string().contains("writes resume above"), "{err}");
                }
            }
            Some(other) => panic!("{other}"),
            None => break,
        }
        assert!(deleted < acknowledged, "writes never resumed");
    }
    assert!(
        refused_above_reserve > 0,
        "no delete left free space between the reserve and the resume level"
    );
    store.put(ks, b"after", b"room").unwrap();
}

#[test]
fn a_failed_flush_keeps_its_memtable_readable_and_is_retried_until_it_lands() {
    // Tables' data on the second device, whose writes all fail: the log
    // (first device) takes writes, the flushes fail.
    let (mems, store) = memory_set(2, 8192);
    let ks = store.keyspace("default").unwrap();
    for lba in 0..mems[1].geometry().block_count {
        mems[1].inject_write_error(lba);
    }
    let value = vec![5u8; 4 << 10];
    let (acknowledged, err) = put_until_refused(&store, ks, "k", &value);
    // The device's own error, as the write's flush met it or as the
    // refusal that follows repeats it.
    assert!(err.to_string().contains("injected write error"), "{err}");
    assert!(
        acknowledged > 12,
        "more than one write buffer: {acknowledged}"
    );
    // Every acknowledged write is read, from the memtable that could not
    // be flushed as from the one after it.
    for i in 0..acknowledged {
        assert!(
            store
                .get(ks, format!("k{i:05}").as_bytes())
                .unwrap()
                .is_some(),
            "k{i:05} unreadable while flushes fail"
        );
    }
    mems[1].clear_faults();
    eventually(
        "the background thread flushes once the device takes writes",
        || store.writes_refused(false).is_none() && store.stats().flushes > 0,
    );
    for i in 0..200u32 {
        store
            .put(ks, format!("m{i:05}").as_bytes(), &value)
            .unwrap();
    }
    drop(store);
    let store = reopen_set(&mems);
    for i in 0..acknowledged {
        assert!(
            store
                .get(ks, format!("k{i:05}").as_bytes())
                .unwrap()
                .is_some(),
            "k{i:05} lost"
        );
    }
    assert!(store.get(ks, b"m00199").unwrap().is_some());
}

/// Keys up to the store's limit are a table's bounds in the manifest:
/// one whose bounds are the longest keys flushes, compacts and reopens.
#[test]
fn tables_bounded_by_the_longest_keys_are_logged_and_reopen() {
    let (mem, store) = memory_store(16384);
    let ks = store.keyspace("default").unwrap();
    let low = vec![0x01u8; MAX_KEY_BYTES];
    let high = vec![0xffu8; MAX_KEY_BYTES];
    store.put(ks, &low, b"low").unwrap();
    store.put(ks, &high, b"high").unwrap();
    store.delete_range(ks, &[0x02], &high[..6000]).unwrap();
    store.put(ks, &high[..5000], b"mid").unwrap();
    store.flush().unwrap();
    store.compact().unwrap();
    drop(store);
    let store = reopen(&mem);
    assert_eq!(store.get(ks, &low).unwrap().as_deref(), Some(&b"low"[..]));
    assert_eq!(store.get(ks, &high).unwrap().as_deref(), Some(&b"high"[..]));
    assert_eq!(
        store.get(ks, &high[..5000]).unwrap().as_deref(),
        Some(&b"mid"[..])
    );
}

/// A device that fails reads: the read answers the device's error (no
/// panic, nothing changed), writes go on, and once the device reads
/// again so does the store.
#[test]
fn read_errors_of_the_device_are_answered_as_errors_and_pass() {
    let (mems, store) = memory_set(2, 8192);
    let ks = store.keyspace("default").unwrap();
    for i in 0..2000u32 {
        store
            .put(ks, format!("k{i:05}").as_bytes(), &[7u8; 200])
            .unwrap();
    }
    store.flush().unwrap();
    drop(store);
    let store = reopen_set(&mems);
    for lba in 0..mems[1].geometry().block_count {
        mems[1].inject_read_error(lba);
    }
    let err = store.get(ks, b"k00042").unwrap_err();
    assert!(err.to_string().contains("injected read error"), "{err}");
    let snapshot = store.snapshot();
    let err = store
        .scan(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &snapshot,
            false,
            10,
        )
        .unwrap_err();
    assert!(err.to_string().contains("injected read error"), "{err}");
    store.put(ks, b"new", b"write").unwrap();
    mems[1].clear_faults();
    assert_eq!(store.get(ks, b"k00042").unwrap().unwrap(), vec![7u8; 200]);
    assert_eq!(store.get(ks, b"new").unwrap().unwrap(), b"write");
}
