//! The active expiry sweep: expired keys that nobody touches again are
//! removed in the background, in expiry order from the keyspace's expiry
//! index, a bounded slice per tick, at low I/O priority (reads see an
//! expired key as gone either way). With nothing due it reads one index
//! entry per tick: an idle server stays idle.

use super::{Shared, TICK};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Index entries taken per tick.
const KEYS_PER_TICK: usize = 2000;
/// Pause between slices while more are due.
const BEHIND_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

pub(super) fn start(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-expire".into())
        .spawn(move || {
            let cpu = shared.config.background_cpu;
            if let Err(e) = cpu.apply_to_this_thread() {
                log::warn!(
                    "the expiry sweep stays at normal CPU priority: setting {} failed: {e}",
                    cpu.name()
                );
            }
            let mut behind = false;
            while !shared.stopping() {
                // Behind (a full slice was due): go on after a short pause
                // that leaves the device to foreground work.
                std::thread::sleep(if behind { BEHIND_PAUSE } else { TICK });
                if shared.pause.active() {
                    // CLIENT PAUSE: keys expire logically, none is removed.
                    continue;
                }
                let swept =
                    sluice_store::blocks::with_io_priority(sluice_io::Priority::Low, || {
                        shared.db.sweep_expired(super::now_ms(), KEYS_PER_TICK)
                    });
                behind = match swept {
                    Ok(swept) => {
                        if let Some(position) = swept.position {
                            shared.committer.wrote(position);
                        }
                        super::notify::expired(&shared, &swept.expired);
                        shared
                            .stats
                            .expired_keys
                            .fetch_add(swept.removed as u64, Ordering::Relaxed);
                        swept.seen >= KEYS_PER_TICK
                    }
                    Err(e) => {
                        log::warn!("the expiry sweep failed: {e}");
                        false
                    }
                };
            }
        })
}
