//! Stores for the operator tests: a memory device, small buffers so that
//! tables are written, and the paper data set when asked.
#![allow(dead_code)]

use sluice_io::{Device, MemoryDevice};
use sluice_ndp::papers::{self, PaperConfig};
use sluice_store::{Store, StoreConfig};
use std::sync::Arc;

/// An empty store whose memtable flushes every `write_buffer_bytes`.
pub fn store_with_buffer(write_buffer_bytes: usize) -> Store {
    let cfg = StoreConfig {
        wal_blocks: 4096,
        write_buffer_bytes,
        ..StoreConfig::default()
    };
    Store::create(
        Arc::new(MemoryDevice::new(4096, 65536)) as Arc<dyn Device>,
        &cfg,
    )
    .unwrap()
}

pub fn store() -> Store {
    store_with_buffer(1 << 20)
}

/// A store holding `papers` papers of the data set, seeded.
pub fn paper_store(papers: u64, seed: u64) -> Store {
    let s = store();
    papers::generate(&s, &PaperConfig::demo(papers, seed), &mut |_| {}).unwrap();
    s
}
