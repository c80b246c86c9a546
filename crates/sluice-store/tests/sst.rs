//! Tables: build, write, open, point reads at snapshots, ranges, bloom, and
//! corruption reported with its place.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use proptest::prelude::*;
use sluice_io::{Device, MemoryDevice};
use sluice_store::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use sluice_store::sst::{
    write_table, Entry, EntryKind, RangeTombstone, TableBuilder, TablePlace, TableReader,
};
use sluice_store::StoreError;
use std::collections::BTreeMap;
use std::sync::Arc;

fn device() -> BlockDevice {
    BlockDevice::new(Arc::new(MemoryDevice::new(4096, 8192)) as Arc<dyn Device>).unwrap()
}

fn build(dev: &BlockDevice, entries: &[Entry], ranges: &[RangeTombstone]) -> TableReader {
    build_at(dev, entries, ranges).0
}

fn build_at(
    dev: &BlockDevice,
    entries: &[Entry],
    ranges: &[RangeTombstone],
) -> (TableReader, Extent) {
    let mut b = TableBuilder::new();
    for e in entries {
        b.add(e);
    }
    for r in ranges {
        b.add_range_tombstone(r.clone());
    }
    let t = b.finish();
    let extent = Extent {
        start_block: 10,
        block_count: (t.bytes.len() / STORE_BLOCK_BYTES) as u32,
    };
    write_table(dev, extent, &t).unwrap();
    (
        TableReader::open(
            dev,
            extent,
            TablePlace {
                keyspace: "t",
                file_no: 7,
            },
        )
        .unwrap(),
        extent,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn point_reads_match_the_newest_version_at_each_snapshot(
        versions in prop::collection::btree_map((0u16..400, 1u64..50), (any::<bool>(), 0usize..6000), 1..400)
    ) {
        let dev = device();
        // Internal order: key asc, sequence desc.
        let mut entries: Vec<Entry> = versions
            .iter()
            .map(|(&(k, seq), &(del, vlen))| Entry::new(
                format!("k{k:05}").into_bytes(),
                seq,
                if del { EntryKind::Delete } else { EntryKind::Put },
                if del { Vec::new() } else { vec![(k % 251) as u8; vlen] },
            ))
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key).then(b.seq.cmp(&a.seq)));
        let t = build(&dev, &entries, &[]);
        prop_assert_eq!(t.entries(&dev).unwrap(), entries.clone());
        let mut by_key: BTreeMap<Vec<u8>, Vec<&Entry>> = BTreeMap::new();
        for e in &entries { by_key.entry(e.key.clone()).or_default().push(e); }
        for k in (0u16..400).step_by(7) {
            let key = format!("k{k:05}").into_bytes();
            for snap in [0u64, 1, 10, 25, 49, u64::MAX >> 8] {
                let want = by_key.get(&key).and_then(|vs| vs.iter().find(|e| e.seq <= snap)).map(|e| (*e).clone());
                prop_assert_eq!(t.get(&dev, &key, snap).unwrap(), want.clone());
                // The borrowed point read finds the same version, value in place.
                let borrowed = t
                    .get_with(&dev, &key, snap, |hit| hit.map(|(h, v)| (h.seq, h.kind, v.bytes().to_vec())))
                    .unwrap();
                prop_assert_eq!(borrowed, want.map(|e| (e.seq, e.kind, e.value().to_vec())));
            }
        }
        let lo = b"k00100".to_vec();
        let hi = b"k00200".to_vec();
        let want: Vec<Entry> = entries.iter().filter(|e| e.key >= lo && e.key < hi).cloned().collect();
        prop_assert_eq!(t.range(&dev, &lo, Some(&hi)).unwrap(), want);
    }
}

#[test]
fn range_tombstones_and_absent_keys() {
    let dev = device();
    let entries: Vec<Entry> = (0..1000u32)
        .map(|i| {
            Entry::new(
                format!("{i:06}").into_bytes(),
                i as u64 + 1,
                EntryKind::Put,
                i.to_le_bytes().to_vec(),
            )
        })
        .collect();
    let r = RangeTombstone {
        start: b"000100".to_vec(),
        end: b"000200".to_vec(),
        seq: 5000,
    };
    let t = build(&dev, &entries, std::slice::from_ref(&r));
    assert_eq!(t.range_tombstones, vec![r]);
    assert_eq!(t.get(&dev, b"zzz", u64::MAX >> 8).unwrap(), None);
    assert_eq!(
        t.get(&dev, b"000999", 999).unwrap(),
        None,
        "written at 1000, not visible at 999"
    );
    assert!(
        t.pinned_bytes() < 1000 * 20,
        "index + filter stay small: {}",
        t.pinned_bytes()
    );
}

#[test]
fn a_corrupt_data_block_is_reported_with_table_block_and_lba() {
    let dev = device();
    let entries: Vec<Entry> = (0..500u32)
        .map(|i| {
            Entry::new(
                format!("{i:06}").into_bytes(),
                1,
                EntryKind::Put,
                vec![1; 50],
            )
        })
        .collect();
    let (t, extent) = build_at(&dev, &entries, &[]);
    // Flip a byte in the second store block of the table (a data block).
    let mut buf = sluice_io::mem::AlignedMem::new(STORE_BLOCK_BYTES);
    dev.read(11, buf.as_mut_slice()).unwrap();
    buf.as_mut_slice()[100] ^= 1;
    dev.write(11, buf.as_slice()).unwrap();
    let err = t.entries(&dev).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            StoreError::Corrupt {
                what: "SST data block",
                block: 11,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("keyspace t, table 7") && msg.contains("LBA"),
        "{msg}"
    );
    // A damaged footer is refused at open, naming the footer block.
    let footer = extent.end_block() - 1;
    dev.read(footer, buf.as_mut_slice()).unwrap();
    buf.as_mut_slice()[0] ^= 1;
    dev.write(footer, buf.as_slice()).unwrap();
    let err = TableReader::open(
        &dev,
        extent,
        TablePlace {
            keyspace: "t",
            file_no: 7,
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!("store block {footer}"))
            && err.to_string().contains("footer"),
        "{err}"
    );
}

#[test]
fn the_block_cache_serves_repeated_reads_and_stays_within_budget() {
    use sluice_store::cache::BlockCache;
    let dev = device();
    let entries: Vec<Entry> = (0..3000u32)
        .map(|i| {
            Entry::new(
                format!("{i:06}").into_bytes(),
                1,
                EntryKind::Put,
                vec![3; 60],
            )
        })
        .collect();
    let cache = Arc::new(BlockCache::new(8 * STORE_BLOCK_BYTES));
    let t = build(&dev, &entries, &[]).with_cache(cache.clone());
    for _ in 0..3 {
        assert!(t.get(&dev, b"000010", 5).unwrap().is_some());
    }
    assert_eq!((cache.misses(), cache.hits()), (1, 2));
    // A full pass touches every block: the cache never holds more than its budget.
    assert_eq!(t.entries(&dev).unwrap().len(), 3000);
    assert!(
        cache.used_bytes() <= 8 * STORE_BLOCK_BYTES,
        "{}",
        cache.used_bytes()
    );
    assert!(t.get(&dev, b"002999", 5).unwrap().is_some());
}

/// Data blocks are filled close to one store block each and never spill
/// into a second one for want of a few bytes: for entries up to a quarter
/// of a block the data region is within 10% of the entries' encoded size.
/// (Entries over half a block get a block each, so slack grows past that.)
#[test]
fn data_blocks_fill_their_store_block_without_spilling() {
    for value_bytes in [1usize, 50, 200, 1000] {
        let mut b = TableBuilder::new();
        let mut raw = 0usize;
        for i in 0..5000u32 {
            let e = Entry::new(
                format!("key{i:08}").into_bytes(),
                9,
                EntryKind::Put,
                vec![i as u8; value_bytes],
            );
            // Three one-byte varints, the trailer, whole key and value.
            raw += 3 + 8 + e.key.len() + e.value().len();
            b.add(&e);
        }
        let t = b.finish();
        let data = t.index_offset_blocks as usize * STORE_BLOCK_BYTES;
        assert!(
            data * 10 <= raw * 11 + 10 * STORE_BLOCK_BYTES,
            "{value_bytes}-byte values: {data} bytes of data blocks for {raw} bytes of entries"
        );
    }
}

/// A long walk reads each run while the one before is walked: forward and
/// reverse give every entry in order, damage far into the table (met by
/// a read made ahead) is reported with its block, and a cursor dropped
/// with a read in flight leaves the device usable.
#[test]
fn long_walks_read_ahead_and_report_damage_met_ahead() {
    let dev = device();
    let entries: Vec<Entry> = (0..6000u32)
        .map(|i| {
            Entry::new(
                format!("{i:06}").into_bytes(),
                1,
                EntryKind::Put,
                vec![(i % 251) as u8; 300],
            )
        })
        .collect();
    let (t, extent) = build_at(&dev, &entries, &[]);
    let t = Arc::new(t);
    assert!(extent.block_count > 400, "{} blocks", extent.block_count);
    let walk = |reverse: bool| {
        let spec = sluice_store::sst::CursorSpec {
            reverse,
            ..Default::default()
        };
        let mut c = t.cursor(&dev, spec).unwrap();
        let mut e = Entry::empty();
        let mut keys = Vec::new();
        while c.next_into(&mut e)? {
            assert_eq!(e.value().len(), 300);
            keys.push(e.key.clone());
        }
        Ok::<_, StoreError>(keys)
    };
    let mut want: Vec<Vec<u8>> = entries.iter().map(|e| e.key.clone()).collect();
    assert_eq!(walk(false).unwrap(), want);
    want.reverse();
    assert_eq!(walk(true).unwrap(), want);

    // Dropped after the second run, with the third in flight.
    let mut c = t.cursor(&dev, Default::default()).unwrap();
    let mut e = Entry::empty();
    for _ in 0..200 {
        assert!(c.next_into(&mut e).unwrap());
    }
    drop(c);

    // A block 300 data blocks in: only ever read ahead.
    let damaged = extent.start_block + 300;
    let mut buf = sluice_io::mem::AlignedMem::new(STORE_BLOCK_BYTES);
    dev.read(damaged, buf.as_mut_slice()).unwrap();
    buf.as_mut_slice()[200] ^= 1;
    dev.write(damaged, buf.as_slice()).unwrap();
    let t = Arc::new(
        TableReader::open(
            &dev,
            extent,
            TablePlace {
                keyspace: "t",
                file_no: 8,
            },
        )
        .unwrap(),
    );
    let mut c = t.cursor(&dev, Default::default()).unwrap();
    let err = loop {
        match c.next_into(&mut e) {
            Ok(true) => continue,
            Ok(false) => panic!("the damaged block was not noticed"),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(err, StoreError::Corrupt { block, .. } if block == damaged),
        "{err}"
    );
}

/// A table built in a buffer kept from an earlier table (dirty bytes past
/// its length, room to spare) is byte for byte the one a fresh builder
/// makes, blocks of several store blocks included; the kept buffer is
/// handed out again only when it is large enough.
#[test]
fn a_kept_buffer_builds_the_same_table_as_a_fresh_one() {
    use sluice_store::sst::TableBuffers;
    let entries: Vec<Entry> = (0..3000u32)
        .map(|i| {
            let len = if i % 500 == 7 {
                9000
            } else {
                (i % 300) as usize
            };
            Entry::new(
                format!("key{i:08}").into_bytes(),
                5,
                EntryKind::Put,
                vec![(i % 251) as u8; len],
            )
        })
        .collect();
    let build = |mut b: TableBuilder| {
        for e in &entries {
            b.add(e);
        }
        b.finish().bytes
    };
    let fresh = build(TableBuilder::new());
    let buffers = TableBuffers::default();
    let mut dirty = buffers.take(1 << 20);
    dirty.resize(1 << 20, 0xAA);
    buffers.give(dirty);
    let kept = buffers.take(1 << 20);
    assert!(kept.capacity() >= 1 << 20 && kept.is_empty());
    let reused = build(TableBuilder::with_buffer(kept));
    assert_eq!(fresh.len(), reused.len());
    assert!(fresh == reused, "a table built in a kept buffer differs");
    buffers.give(reused);
    assert!(buffers.take(64 << 20).capacity() >= 64 << 20);
    buffers.release();
}

/// A footer that passes its checksum yet describes regions that are not
/// there (a bug, a forged device) is refused as corruption before any
/// arithmetic or allocation: once, a region length near `u32::MAX`
/// overflowed or asked for terabytes.
#[test]
fn a_footer_whose_regions_do_not_fit_is_refused_not_followed() {
    let dev = device();
    let entries: Vec<Entry> = (0..100u32)
        .map(|i| {
            Entry::new(
                format!("k{i:04}").into_bytes(),
                1,
                EntryKind::Put,
                b"v".to_vec(),
            )
        })
        .collect();
    let mut b = TableBuilder::new();
    for e in &entries {
        b.add(e);
    }
    let t = b.finish();
    let extent = Extent {
        start_block: 10,
        block_count: (t.bytes.len() / STORE_BLOCK_BYTES) as u32,
    };
    let footer_at = t.bytes.len() - STORE_BLOCK_BYTES;
    // (field, value): index length, filter offset, range length, index
    // offset — each forged, the footer sealed again.
    for (field, value) in [
        (1usize, u32::MAX),
        (2, 0),
        (5, u32::MAX - 2),
        (0, 0),
        (3, 0),
    ] {
        let mut bytes = t.bytes.clone();
        let footer = &mut bytes[footer_at..];
        footer[field * 4..field * 4 + 4].copy_from_slice(&value.to_le_bytes());
        let crc = crc32c::crc32c(&footer[..STORE_BLOCK_BYTES - 4]);
        footer[STORE_BLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        let mut aligned = sluice_io::mem::AlignedMem::new(bytes.len());
        aligned.as_mut_slice().copy_from_slice(&bytes);
        dev.write(extent.start_block, aligned.as_slice()).unwrap();
        let place = TablePlace {
            keyspace: "k",
            file_no: 1,
        };
        let err = TableReader::open(&dev, extent, place)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { .. }) && err.to_string().contains("footer"),
            "field {field} = {value}: {err}"
        );
    }
}
