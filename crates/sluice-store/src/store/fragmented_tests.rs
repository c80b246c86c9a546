//! A device whose free space is all in short runs: flushes and
//! compactions cut their tables to fit rather than fail.

use super::*;
use sluice_io::MemoryDevice;

const HOLE_BLOCKS: u64 = crate::manifest::MANIFEST_EXTENT_BLOCKS as u64;

fn config() -> StoreConfig {
    let mut cfg = StoreConfig {
        wal_blocks: 4096,
        write_buffer_bytes: 4 << 20,
        ..StoreConfig::default()
    };
    cfg.compaction.l0_trigger = 2;
    cfg.compaction.level_base_bytes = 4 << 20;
    cfg.compaction.target_file_bytes = 2 << 20;
    cfg
}

/// Takes every free run of the store's allocator in `HOLE_BLOCKS` pieces
/// and gives back every other one: half the free space stays free, in
/// runs of `HOLE_BLOCKS`. The pieces kept are never logged, so reopening
/// the store frees them.
fn fragment(store: &Store) {
    let mut manifest = lock(&store.inner.manifest);
    let mut taken = Vec::new();
    while let Ok(e) = manifest.allocate(HOLE_BLOCKS) {
        taken.push(e);
    }
    for e in taken.iter().step_by(2) {
        manifest.release_unlogged(*e).unwrap();
    }
    assert_eq!(manifest.largest_free_on(0), HOLE_BLOCKS);
}

fn value_of(i: u32) -> Vec<u8> {
    // Distinct bytes, so the values take their room whatever the codec.
    let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn flushes_and_compactions_fit_their_tables_into_a_fragmented_device() {
    let mem = Arc::new(MemoryDevice::new(4096, 32768));
    let store = Store::create(mem.clone() as Arc<dyn Device>, &config()).unwrap();
    let ks = store.keyspace("default").unwrap();
    fragment(&store);
    let keys = 12_000u32;
    // In batches (the log fills as densely as the memtable), keys spread
    // over the whole range by each batch (tables overlap: compactions
    // rewrite them rather than move them down).
    let batches = 48u32;
    for b in 0..batches {
        let mut batch = WriteBatch::new();
        for i in (b..keys).step_by(batches as usize) {
            batch
                .put(ks, format!("k{i:08}").as_bytes(), &value_of(i))
                .unwrap();
        }
        store.write(&batch).unwrap();
    }
    store.flush().unwrap();
    store.compact().unwrap();
    let stats = store.stats();
    assert!(stats.flushes >= 2, "{} flushes", stats.flushes);
    let room_bytes = HOLE_BLOCKS as usize * STORE_BLOCK_BYTES;
    let v = read(&store.inner.version).clone();
    let tables: Vec<&Arc<Table>> = v.keyspaces[&ks].all().collect();
    assert!(tables.len() > 12, "{} tables", tables.len());
    for t in &tables {
        assert!(
            (t.meta.data.block_count as usize) * STORE_BLOCK_BYTES <= room_bytes,
            "a table of {} blocks",
            t.meta.data.block_count
        );
    }
    drop(v);
    for i in (0..keys).step_by(7) {
        let got = store.get(ks, format!("k{i:08}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(value_of(i).as_slice()), "k{i:08}");
    }
    drop(store);
    let store = Store::open(mem as Arc<dyn Device>, &config()).unwrap();
    for i in 0..keys {
        let got = store.get(ks, format!("k{i:08}").as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(value_of(i).as_slice()), "k{i:08}");
    }
}
