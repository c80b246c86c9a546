//! The active expiry sweep: expired keys that nobody touches again are
//! removed in the background, a bounded slice of the keyspace per tick,
//! at low I/O priority (reads see an expired key as gone either way).

use super::{Shared, TICK};
use std::sync::Arc;

/// Keys looked at per tick.
const KEYS_PER_TICK: usize = 2000;

pub(super) fn start(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-expire".into())
        .spawn(move || {
            let mut cursor = Vec::new();
            while !shared.stopping() {
                std::thread::sleep(TICK);
                let swept =
                    sluice_store::blocks::with_io_priority(sluice_io::Priority::Low, || {
                        shared
                            .db
                            .sweep_expired(&mut cursor, super::now_ms(), KEYS_PER_TICK)
                    });
                match swept {
                    Ok(Some(position)) => shared.committer.wrote(position),
                    Ok(None) => {}
                    Err(e) => log::warn!("the expiry sweep failed: {e}"),
                }
            }
        })
}
