//! Shared-memory clients: polling their request rings, how much of a
//! reply ring a turn may fill, and when the worker may sleep on them.

use super::Worker;
use crate::server::conn::Transport;
use crate::server::WorkerStats;
use std::sync::atomic::Ordering;

/// Most bytes taken from a shared-memory client's request ring at once.
const SHM_READ_BYTES: usize = 256 << 10;

impl Worker {
    /// Takes what the shared-memory clients published into the readers,
    /// and looks again at those with replies waiting for ring space;
    /// whether any requests came.
    pub(super) fn poll_shm(&mut self) -> bool {
        let mut any = false;
        let out_limit = self.shm_out_limit();
        let max_query = self.shared.max_query_bytes.load(Ordering::Relaxed);
        for &id in &self.shm_conns {
            let Some(c) = self.conns[id as usize].as_mut() else {
                continue;
            };
            if c.dead || !c.stream.is_shm() {
                continue;
            }
            if c.has_backlog() {
                self.events.touched.push(id);
            }
            // Back-pressure: requests already taken wait to run first, and
            // a client that does not read its replies gets no more run. A
            // request bigger than the ring is read on until it is whole.
            if c.closing || c.more_input || c.backlog_bytes() >= out_limit {
                continue;
            }
            let Transport::Shm(link) = &mut c.stream else {
                continue;
            };
            match c
                .reader
                .feed_with(|buf| link.channel.read(buf, SHM_READ_BYTES))
            {
                Ok(0) => {}
                Ok(n) => {
                    // A client whose ring was full may be parked for room.
                    if link.channel.take_peer_sleeping() {
                        link.channel.wake_client();
                    }
                    WorkerStats::add(
                        &self.shared.stats.by_worker[self.index].net_input_bytes,
                        n as u64,
                    );
                    c.last_active = self.now;
                    c.more_input = true;
                    self.events.touched.push(id);
                    any = true;
                    if c.reader.pending_bytes() > max_query {
                        log::warn!(
                            "closing client {}: its query buffer passed {max_query} bytes",
                            c.addr
                        );
                        c.dead = true;
                    }
                }
                Err(e) => {
                    log::warn!("closing shared-memory client {}: {e}", c.session.id());
                    c.dead = true;
                    self.events.touched.push(id);
                }
            }
        }
        any
    }

    /// Most reply bytes a shared-memory client may have waiting before its
    /// requests stop running: one response ring.
    pub(super) fn shm_out_limit(&self) -> usize {
        self.shared
            .config
            .shm
            .as_ref()
            .map_or(usize::MAX, |s| s.response_ring_bytes)
    }

    /// Before the thread blocks: tells every shared-memory client it is
    /// about to sleep, then looks once more (a client that published in
    /// between sees the flag and wakes the thread, or is seen here).
    /// Whether the thread may block.
    pub(super) fn shm_may_sleep(&mut self) -> bool {
        let out_limit = self.shm_out_limit();
        for &id in &self.shm_conns {
            if let Some(Transport::Shm(link)) =
                self.conns[id as usize].as_mut().map(|c| &mut c.stream)
            {
                link.channel.announce_sleeping();
            }
        }
        let busy = self.shm_conns.iter().any(|&id| {
            let Some(c) = self.conns[id as usize].as_ref() else {
                return false;
            };
            let Transport::Shm(link) = &c.stream else {
                return false;
            };
            if c.dead {
                return false;
            }
            let wants_in = !c.closing
                && !c.more_input
                && c.backlog_bytes() < out_limit
                && link.channel.in_pending().map_or(true, |n| n > 0);
            let can_out = c.has_backlog() && link.channel.out_free().map_or(true, |n| n > 0);
            wants_in || can_out
        });
        if busy {
            self.shm_awake();
        }
        !busy
    }

    /// After a wait: the clients need not wake the thread any more.
    pub(super) fn shm_awake(&mut self) {
        for &id in &self.shm_conns {
            if let Some(Transport::Shm(link)) = self.conns[id as usize].as_ref().map(|c| &c.stream)
            {
                link.channel.clear_sleeping();
            }
        }
    }
}
