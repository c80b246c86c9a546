//! Damage in the write-ahead log: one damaged block is rebuilt from its
//! group's parity; damage parity cannot mend, where later blocks prove the
//! block was durable, refuses the open until the caller chooses a recovery;
//! no block written before a recovery is ever replayed after newer writes.
//! And a property test: single-byte and whole-block damage anywhere in the
//! ring, at random moments, against an ordered map.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::ProcessView;
use proptest::prelude::*;
use sluice_io::{Device, MemoryDevice, PowerCutMode};
use sluice_store::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use sluice_store::manifest::Manifest;
use sluice_store::wal::WalRecovery;
use sluice_store::{Store, StoreConfig, StoreError, WriteBatch, WriteOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

const DEVICE_BLOCKS: u64 = 4096;
const KEYS: u32 = 3000;

fn config(recovery: WalRecovery) -> StoreConfig {
    StoreConfig {
        wal_blocks: 1024,
        // Everything stays in the WAL: no flush, no compaction.
        write_buffer_bytes: 256 << 20,
        background_compaction: false,
        wal_recovery: recovery,
        ..StoreConfig::default()
    }
}

fn open(mem: &Arc<MemoryDevice>, recovery: WalRecovery) -> sluice_store::Result<Store> {
    Store::open(mem.clone() as Arc<dyn Device>, &config(recovery))
}

fn key(i: u32) -> Vec<u8> {
    format!("wal-key-{i:05}").into_bytes()
}

fn value(i: u32, round: u32) -> Vec<u8> {
    let mut v = format!("value {i} of round {round} ").into_bytes();
    v.resize(180, b'.');
    v
}

/// `KEYS` writes, only in the WAL, acknowledged as durable in groups of 50.
fn store_with_keys_in_the_wal() -> Arc<MemoryDevice> {
    store_with_batches_in_the_wal(KEYS, |ks, i, b| {
        b.put(ks, &key(i), &value(i, 0)).unwrap();
    })
}

/// `records` batches (`fill` adds batch `i`'s writes), only in the WAL,
/// acknowledged as durable in groups of 50, then a crash right after the
/// last acknowledged write.
fn store_with_batches_in_the_wal(
    records: u32,
    fill: impl Fn(u32, u32, &mut WriteBatch),
) -> Arc<MemoryDevice> {
    let mem = Arc::new(MemoryDevice::new(4096, DEVICE_BLOCKS));
    let store =
        Store::create(mem.clone() as Arc<dyn Device>, &config(WalRecovery::Strict)).unwrap();
    let ks = store.keyspace("default").unwrap();
    for i in 0..records {
        let mut b = WriteBatch::new();
        fill(ks, i, &mut b);
        let sync = i % 50 == 49 || i == records - 1;
        store.write_with(&b, WriteOptions { sync }).unwrap();
    }
    assert_eq!(
        store.stats().flushes,
        0,
        "the writes must be in the WAL only"
    );
    drop(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    mem
}

fn wal_ring(mem: &Arc<MemoryDevice>) -> Vec<Extent> {
    let dev = BlockDevice::new(mem.clone() as Arc<dyn Device>).unwrap();
    let m = Manifest::open(dev).unwrap();
    m.state().wal.as_ref().unwrap().ring.clone()
}

/// Reads `blocks` store blocks from `block` on, as the store would.
fn read_blocks(mem: &Arc<MemoryDevice>, block: u64, blocks: usize) -> Vec<u8> {
    let dev = BlockDevice::new(mem.clone() as Arc<dyn Device>).unwrap();
    let mut buf = sluice_io::mem::AlignedMem::new(blocks * STORE_BLOCK_BYTES);
    dev.read(block, buf.as_mut_slice()).unwrap();
    buf.as_slice().to_vec()
}

fn read_block(mem: &Arc<MemoryDevice>, block: u64) -> Vec<u8> {
    read_blocks(mem, block, 1)
}

fn flip_byte(mem: &Arc<MemoryDevice>, block: u64, at: usize) {
    mem.damage(block as usize * STORE_BLOCK_BYTES + at, 1, |b| b[0] ^= 0x5a);
}

/// The keys whose text appears in a block.
fn keys_in(block: &[u8]) -> Vec<u32> {
    let pat = b"wal-key-";
    block
        .windows(pat.len() + 5)
        .filter(|w| &w[..pat.len()] == pat)
        .filter_map(|w| std::str::from_utf8(&w[pat.len()..]).ok()?.parse().ok())
        .collect()
}

/// The ring's log blocks in log order (format: magic, then the sequence at
/// offset 8), as (store block, magic, sequence).
fn log_blocks(mem: &Arc<MemoryDevice>) -> Vec<(u64, [u8; 4], u64)> {
    let mut out = Vec::new();
    for e in wal_ring(mem) {
        for block in e.start_block..e.end_block() {
            let b = read_block(mem, block);
            let magic: [u8; 4] = b[0..4].try_into().unwrap();
            if &magic == b"WALB" || &magic == b"WALP" {
                out.push((
                    block,
                    magic,
                    u64::from_le_bytes(b[8..16].try_into().unwrap()),
                ));
            }
        }
    }
    out.sort_by_key(|&(_, _, seq)| seq);
    out
}

/// A data block early in the log holding `key(i)` for a small i, and the
/// parity block of its group.
fn early_block_and_its_parity(mem: &Arc<MemoryDevice>) -> (u64, u64, Vec<u32>) {
    let blocks = log_blocks(mem);
    let (at, &(block, _, _)) = blocks
        .iter()
        .enumerate()
        .find(|(_, (b, magic, _))| {
            magic == b"WALB"
                && keys_in(&read_block(mem, *b))
                    .iter()
                    .any(|&k| (200..600).contains(&k))
        })
        .expect("a block holding an early key");
    let parity = blocks[at..]
        .iter()
        .find(|(_, magic, _)| magic == b"WALP")
        .expect("its group's parity")
        .0;
    (block, parity, keys_in(&read_block(mem, block)))
}

fn device_bytes(mem: &Arc<MemoryDevice>) -> Vec<u8> {
    read_blocks(mem, 0, DEVICE_BLOCKS as usize)
}

fn present(store: &Store) -> Vec<u32> {
    let ks = store.keyspace("default").unwrap();
    (0..KEYS)
        .filter(|&i| match store.get(ks, &key(i)).unwrap() {
            Some(v) => {
                assert_eq!(v, value(i, 0), "key {i}: a value never written");
                true
            }
            None => false,
        })
        .collect()
}

#[test]
fn one_flipped_byte_in_an_early_block_is_rebuilt_from_parity() {
    let mem = store_with_keys_in_the_wal();
    let (block, _, keys) = early_block_and_its_parity(&mem);
    assert!(!keys.is_empty());
    flip_byte(&mem, block, 1000);
    let store = open(&mem, WalRecovery::Strict).unwrap();
    assert_eq!(
        present(&store).len(),
        KEYS as usize,
        "every acknowledged key"
    );
    drop(store);
    // The rebuilt block was written back: a second open needs no parity.
    let store = open(&mem, WalRecovery::Strict).unwrap();
    assert_eq!(present(&store).len(), KEYS as usize);
}

#[test]
fn damage_parity_cannot_mend_is_refused_with_the_block_named_and_nothing_changed() {
    let mem = store_with_keys_in_the_wal();
    let (block, parity, _) = early_block_and_its_parity(&mem);
    flip_byte(&mem, block, 1000);
    flip_byte(&mem, parity, 2000);
    let before = device_bytes(&mem);
    let err = open(&mem, WalRecovery::Strict).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::WalDamaged { .. }), "{msg}");
    assert!(msg.contains(&format!("store block {block}")), "{msg}");
    assert!(msg.contains("LBA"), "{msg}");
    assert!(msg.contains("--recover-wal point-in-time"), "{msg}");
    assert!(msg.contains("--recover-wal skip-damaged"), "{msg}");
    assert!(
        before == device_bytes(&mem),
        "a refused open wrote to the device"
    );
}

#[test]
fn point_in_time_keeps_a_prefix_and_old_blocks_never_come_back() {
    let mem = store_with_keys_in_the_wal();
    let (block, parity, keys) = early_block_and_its_parity(&mem);
    let first_lost = *keys.iter().min().unwrap();
    flip_byte(&mem, block, 1000);
    flip_byte(&mem, parity, 2000);
    let store = open(&mem, WalRecovery::PointInTime).unwrap();
    let kept = present(&store);
    // A prefix of the writes, ending where the damaged block starts.
    assert_eq!(kept, (0..kept.len() as u32).collect::<Vec<_>>());
    assert!(
        kept.len() as u32 <= first_lost && kept.len() as u32 + 1 >= first_lost,
        "{} {first_lost}",
        kept.len()
    );
    // A few new writes after the recovery, over keys whose old records are
    // still on the device after the damaged block (far more of them than
    // the new writes overwrite).
    let ks = store.keyspace("default").unwrap();
    let newer: Vec<u32> = (first_lost + 5..first_lost + 8).collect();
    for &i in &newer {
        store.put(ks, &key(i), b"newer").unwrap();
    }
    drop(store);
    mem.power_cut(PowerCutMode::DropUnflushed);
    let store = open(&mem, WalRecovery::Strict).unwrap();
    for i in 0..KEYS {
        let got = store.get(ks, &key(i)).unwrap();
        if newer.contains(&i) {
            assert_eq!(got.as_deref(), Some(&b"newer"[..]), "key {i}");
        } else if (i as usize) < kept.len() {
            assert_eq!(got, Some(value(i, 0)), "key {i}");
        } else {
            assert_eq!(got, None, "key {i}: a record dropped at recovery came back");
        }
    }
}

#[test]
fn skip_damaged_loses_only_the_damaged_block_and_opens_cleanly_after() {
    let mem = store_with_keys_in_the_wal();
    let (block, parity, keys) = early_block_and_its_parity(&mem);
    flip_byte(&mem, block, 1000);
    flip_byte(&mem, parity, 2000);
    let store = open(&mem, WalRecovery::SkipDamaged).unwrap();
    let kept = present(&store);
    let lost: Vec<u32> = (0..KEYS).filter(|i| !kept.contains(i)).collect();
    assert!(!lost.is_empty());
    for i in &lost {
        assert!(
            keys.contains(i) || keys.contains(&(i + 1)) || keys.contains(&(i - 1)),
            "key {i} lost, but the damaged block holds {keys:?}"
        );
    }
    drop(store);
    // The damaged block became an empty one: a strict open now succeeds.
    let store = open(&mem, WalRecovery::Strict).unwrap();
    assert_eq!(present(&store), kept);
}

#[test]
fn format_writes_both_superblock_copies() {
    let mem = Arc::new(MemoryDevice::new(4096, DEVICE_BLOCKS));
    let store =
        Store::create(mem.clone() as Arc<dyn Device>, &config(WalRecovery::Strict)).unwrap();
    let ks = store.keyspace("default").unwrap();
    store.put(ks, b"k", b"v").unwrap();
    drop(store);
    for copy in 0..2u64 {
        let b = read_block(&mem, copy);
        assert_eq!(&b[0..8], b"SLUICEKV", "copy {copy} written");
    }
    // Either copy alone opens the store.
    for copy in 0..2u64 {
        let saved = read_block(&mem, copy);
        mem.damage(copy as usize * STORE_BLOCK_BYTES + 100, 1, |b| b[0] ^= 1);
        let store = open(&mem, WalRecovery::Strict).unwrap();
        assert_eq!(store.get(ks, b"k").unwrap().as_deref(), Some(&b"v"[..]));
        drop(store);
        mem.damage(copy as usize * STORE_BLOCK_BYTES, STORE_BLOCK_BYTES, |b| {
            b.copy_from_slice(&saved)
        });
    }
}

#[test]
fn a_damaged_last_manifest_block_is_rebuilt_and_one_in_the_middle_is_reported() {
    let mem = Arc::new(MemoryDevice::new(4096, DEVICE_BLOCKS));
    let store =
        Store::create(mem.clone() as Arc<dyn Device>, &config(WalRecovery::Strict)).unwrap();
    for name in ["a", "b", "c"] {
        store
            .create_keyspace(name, sluice_store::ValueFormat::Raw, "")
            .unwrap();
    }
    drop(store);
    let sb = {
        let dev = BlockDevice::new(mem.clone() as Arc<dyn Device>).unwrap();
        Manifest::open(dev).unwrap().superblock().clone()
    };
    let blocks: Vec<u64> = (sb.manifest.start_block..sb.manifest.end_block())
        .filter(|&b| &read_block(&mem, b)[0..4] == b"MANB")
        .collect();
    let last = *blocks.last().unwrap();
    // The last group's block: its parity mends it.
    flip_byte(&mem, last, 60);
    let store = open(&mem, WalRecovery::Strict).unwrap();
    assert!(store.keyspace("c").is_ok(), "the last group's keyspace");
    drop(store);
    // A block in the middle and its parity: later groups prove it durable.
    let middle = blocks[blocks.len() / 2];
    let parity = (middle + 1..sb.manifest.end_block())
        .find(|&b| &read_block(&mem, b)[0..4] == b"MANP")
        .unwrap();
    flip_byte(&mem, middle, 60);
    flip_byte(&mem, parity, 60);
    let err = open(&mem, WalRecovery::Strict).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("manifest block")
            && msg.contains(&format!("store block {middle}"))
            && msg.contains("durable"),
        "{msg}"
    );
}

#[test]
fn a_manifest_group_whose_parity_was_lost_gets_it_back_and_survives_later_damage() {
    let mem = Arc::new(MemoryDevice::new(4096, DEVICE_BLOCKS));
    let store =
        Store::create(mem.clone() as Arc<dyn Device>, &config(WalRecovery::Strict)).unwrap();
    for name in ["a", "b"] {
        store
            .create_keyspace(name, sluice_store::ValueFormat::Raw, "")
            .unwrap();
    }
    drop(store);
    let sb = {
        let dev = BlockDevice::new(mem.clone() as Arc<dyn Device>).unwrap();
        Manifest::open(dev).unwrap().superblock().clone()
    };
    let kind = |b: u64| read_block(&mem, b)[0..4].to_vec();
    let last_parity = (sb.manifest.start_block..sb.manifest.end_block())
        .rev()
        .find(|&b| kind(b) == b"MANP")
        .unwrap();
    let group_block = last_parity - 1;
    assert_eq!(kind(group_block), b"MANB");
    // A crash took the last group's parity block (its data blocks landed).
    mem.damage(last_parity as usize * 4096, 4096, |b| b.fill(0));
    let store = open(&mem, WalRecovery::Strict).unwrap();
    assert!(store.keyspace("b").is_ok());
    store
        .create_keyspace("c", sluice_store::ValueFormat::Raw, "")
        .unwrap();
    drop(store);
    // Later, one block of that group is damaged; groups after it prove it
    // durable. Its parity, written back at open, mends it.
    flip_byte(&mem, group_block, 60);
    let store = open(&mem, WalRecovery::Strict)
        .unwrap_or_else(|e| panic!("a group that lost its parity stayed unprotected: {e}"));
    for name in ["a", "b", "c"] {
        assert!(store.keyspace(name).is_ok(), "keyspace {name}");
    }
}

#[derive(Debug, Clone)]
enum Step {
    Put(u8, u16),
    Delete(u8),
    Unsynced(u8, u16),
    /// Crash, damage one byte (or a whole block) at a place in the ring
    /// (fractions of its size), reopen.
    Damage {
        at: u32,
        whole_block: bool,
        torn: bool,
        seed: u64,
    },
    Flush,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::Put(k, v)),
        2 => any::<u8>().prop_map(Step::Delete),
        3 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::Unsynced(k, v)),
        2 => (any::<u32>(), any::<bool>(), any::<bool>(), any::<u64>())
            .prop_map(|(at, whole_block, torn, seed)| Step::Damage { at, whole_block, torn, seed }),
        1 => Just(Step::Flush),
    ]
}

fn pkey(k: u8) -> Vec<u8> {
    format!("p{k:03}").into_bytes()
}

fn pvalue(k: u8, v: u16) -> Vec<u8> {
    let mut out = vec![k; (v as usize % 5) * 1500 + 3];
    out[..2].copy_from_slice(&v.to_le_bytes());
    out
}

/// Flips one bit, or fills one whole block with garbage, at a place in the
/// WAL ring picked by `at`.
fn damage_the_ring(mem: &Arc<MemoryDevice>, at: u32, whole_block: bool, seed: u64) {
    let ring = wal_ring(mem);
    let ring_bytes: u64 =
        ring.iter().map(|e| e.block_count as u64).sum::<u64>() * STORE_BLOCK_BYTES as u64;
    let mut pos = at as u64 % ring_bytes;
    let mut offset = 0;
    for e in &ring {
        let len = e.block_count as u64 * STORE_BLOCK_BYTES as u64;
        if pos < len {
            offset = (e.start_block * STORE_BLOCK_BYTES as u64 + pos) as usize;
            break;
        }
        pos -= len;
    }
    if whole_block {
        let start = offset / STORE_BLOCK_BYTES * STORE_BLOCK_BYTES;
        mem.damage(start, STORE_BLOCK_BYTES, |b| {
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i as u64).wrapping_mul(seed | 1).to_le_bytes()[0];
            }
        });
    } else {
        mem.damage(offset, 1, |b| b[0] ^= 1 << (seed % 8));
    }
}

/// Runs `steps` against a store on one memory device and a model of what
/// was acknowledged: after each crash with one damage, the store must open
/// and hold every acknowledged write plus a prefix of the unsynced ones.
fn run_steps(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let small = StoreConfig {
        wal_blocks: 256,
        write_buffer_bytes: 256 << 10,
        background_compaction: false,
        ..StoreConfig::default()
    };
    let mem = Arc::new(MemoryDevice::new(4096, 8192));
    let mut view = ProcessView::new(&mem);
    let mut store = Store::create(view.clone() as Arc<dyn Device>, &small).unwrap();
    let ks = store.keyspace("default").unwrap();
    // Acknowledged durable state, and unsynced writes since, which a
    // crash may or may not keep (only whole, in order).
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut unsynced: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for s in steps {
        match s {
            Step::Put(k, v) => {
                store.put(ks, &pkey(k), &pvalue(k, v)).unwrap();
                for (uk, uv) in unsynced.drain(..) {
                    model.insert(uk, uv);
                }
                model.insert(pkey(k), pvalue(k, v));
            }
            Step::Delete(k) => {
                store.delete(ks, &pkey(k)).unwrap();
                for (uk, uv) in unsynced.drain(..) {
                    model.insert(uk, uv);
                }
                model.remove(&pkey(k));
            }
            Step::Unsynced(k, v) => {
                let mut b = WriteBatch::new();
                b.put(ks, &pkey(k), &pvalue(k, v)).unwrap();
                store.write_with(&b, WriteOptions { sync: false }).unwrap();
                unsynced.push((pkey(k), pvalue(k, v)));
            }
            Step::Flush => {
                store.flush().unwrap();
                for (uk, uv) in unsynced.drain(..) {
                    model.insert(uk, uv);
                }
            }
            Step::Damage {
                at,
                whole_block,
                torn,
                seed,
            } => {
                // A crash: no clean close (dropping would flush), and
                // the device loses or tears what was not flushed.
                std::mem::forget(store);
                view.kill();
                let mode = if torn {
                    PowerCutMode::TornSectors { seed }
                } else {
                    PowerCutMode::DropUnflushed
                };
                mem.power_cut(mode);
                damage_the_ring(&mem, at, whole_block, seed);
                view = ProcessView::new(&mem);
                store = Store::open(view.clone() as Arc<dyn Device>, &small)
                    .map_err(|e| TestCaseError::fail(format!("open after a single damage: {e}")))?;
                // Of the unsynced writes, exactly a prefix survives.
                let survived = (0..=unsynced.len()).rev().find(|&n| {
                    let mut m = model.clone();
                    for (uk, uv) in &unsynced[..n] {
                        m.insert(uk.clone(), uv.clone());
                    }
                    (0..=255u8)
                        .all(|k| store.get(ks, &pkey(k)).unwrap() == m.get(&pkey(k)).cloned())
                });
                let Some(n) = survived else {
                    return Err(TestCaseError::fail("the store holds neither the acknowledged state nor it plus a prefix of the unsynced writes"));
                };
                for (uk, uv) in unsynced.drain(..).take(n) {
                    model.insert(uk, uv);
                }
            }
        }
    }
    // The open store shows its unsynced writes too.
    for (uk, uv) in unsynced.drain(..) {
        model.insert(uk, uv);
    }
    for k in 0..=255u8 {
        prop_assert_eq!(
            store.get(ks, &pkey(k)).unwrap(),
            model.get(&pkey(k)).cloned(),
            "key {}",
            k
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// One damaged byte or block anywhere in the WAL ring after a crash:
    /// the store opens with every acknowledged write and no other value.
    #[test]
    fn single_damage_anywhere_in_the_ring_loses_no_acknowledged_write(
        steps in prop::collection::vec(step(), 1..120),
    ) {
        run_steps(steps)?;
    }
}

/// The property test's case found by CI: acknowledged writes, two flushes,
/// then two crashes in a row, each with one flipped bit in the ring. The
/// first recovery found a group whose parity block was lost (not damage)
/// and left it unprotected; the second damage then hit that group and the
/// store refused to open (or, at the log's end, dropped acknowledged
/// records as a torn tail). Recovery now rewrites lost parity blocks.
#[test]
fn two_crashes_each_with_one_damage_keep_every_acknowledged_write() {
    use Step::*;
    let steps = vec![
        Put(0, 940),
        Put(0, 7250),
        Put(1, 55377),
        Put(107, 19),
        Put(78, 48093),
        Delete(104),
        Put(193, 6394),
        Unsynced(63, 27733),
        Put(113, 39400),
        Put(84, 55274),
        Delete(248),
        Unsynced(232, 57572),
        Put(207, 39196),
        Put(176, 2800),
        Put(78, 60955),
        Put(237, 31022),
        Put(170, 25649),
        Put(48, 20192),
        Put(5, 40324),
        Delete(235),
        Delete(230),
        Unsynced(176, 2417),
        Put(74, 62564),
        Unsynced(234, 61506),
        Flush,
        Put(15, 28295),
        Put(236, 40819),
        Put(224, 14587),
        Delete(204),
        Unsynced(43, 41957),
        Unsynced(11, 35064),
        Flush,
        Put(96, 19374),
        Put(166, 40545),
        Put(111, 45214),
        Put(31, 35492),
        Put(209, 49400),
        Put(107, 3538),
        Put(132, 56856),
        Damage {
            at: 1829043695,
            whole_block: false,
            torn: true,
            seed: 12629076451367122877,
        },
        Damage {
            at: 2845107581,
            whole_block: false,
            torn: false,
            seed: 13584028483318806570,
        },
    ];
    run_steps(steps).unwrap();
}

/// A record goes into the log as its batch's header and entries, not
/// joined first: records of every size, starting anywhere in a log block
/// (a header cut between two blocks among them), replay exactly after a
/// power cut.
#[test]
fn records_cut_anywhere_across_log_blocks_replay_exactly() {
    let value_of = |i: u32, j: u32| -> Vec<u8> {
        let len = 1 + ((i * 37 + j * 11) % 700) as usize;
        (0..len).map(|b| (i as usize * 7 + b) as u8).collect()
    };
    let records = 1500u32;
    let mem = store_with_batches_in_the_wal(records, |ks, i, b| {
        for j in 0..1 + i % 3 {
            b.put(ks, format!("cut-{i:05}-{j}").as_bytes(), &value_of(i, j))
                .unwrap();
        }
    });
    let store = open(&mem, WalRecovery::Strict).unwrap();
    let ks = store.keyspace("default").unwrap();
    for i in 0..records {
        for j in 0..1 + i % 3 {
            let got = store.get(ks, format!("cut-{i:05}-{j}").as_bytes()).unwrap();
            assert_eq!(got, Some(value_of(i, j)), "record {i}, put {j}");
        }
    }
}
