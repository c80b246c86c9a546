//! Connections leaving: finished, idle past `timeout`, or held at a stop
//! until their replies are sent and their writes committed.

use super::Worker;
use crate::server::conn::Transport;
use sluice_io::net::ConnId;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a stopping worker waits for its connections to finish what
/// they hold (replies to send, held writes to commit) before it drops
/// those left, saying which and in what state.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(10);

impl Worker {
    /// Frees connections with nothing left in flight.
    pub(super) fn close_finished(&mut self) {
        for &id in &self.work {
            let id = id as usize;
            let sending = self.ring.sending(id as ConnId);
            let Some(c) = self.conns[id].as_mut() else {
                continue;
            };
            let drained =
                !c.has_backlog() && c.held.is_empty() && !c.more_input && !c.script_pending;
            if !(c.dead || (c.closing && drained)) || sending {
                continue;
            }
            if c.recv_armed {
                // Ends the armed recv (it completes with 0); the slot is
                // freed after, so no late completion reaches a new client.
                let _ = c.stream.shutdown(Shutdown::Both);
                continue;
            }
            self.shared.registry.remove(c.session.id());
            if let Some(b) = c.blocked.take().or_else(|| c.retry.take()) {
                self.shared.blocking.leave(&b.keys, b.ticket);
            }
            self.shared.pubsub.leave_all(c);
            self.shared.monitors.remove(c.session.id());
            if c.postponed {
                self.shared.pause.postponed.fetch_sub(1, Ordering::Relaxed);
            }
            if c.tracking {
                self.shared.tracking.disable(c.session.id());
                self.shared.refresh_change_recording();
            }
            if let Transport::Shm(link) = &c.stream {
                // Wakes a client parked on its futex: it reads what is
                // left in its ring, then sees the channel closed.
                link.channel.close();
                self.shm_conns.retain(|&s| s as usize != id);
                self.inbox.load.fetch_sub(1, Ordering::Relaxed);
            }
            self.conns[id] = None;
            self.free.push(id as ConnId);
            self.shared.clients.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Connections to look at next turn even if no completion names them.
    pub(super) fn keep_pending(&mut self) {
        for &id in &self.work {
            if let Some(c) = self.conns[id as usize].as_ref() {
                if c.more_input || c.hold_until.is_some() || c.closing || c.dead {
                    self.pending.push(id);
                }
            }
        }
    }

    pub(super) fn close_idle(&mut self) {
        let timeout_secs = self.shared.idle_timeout_secs.load(Ordering::Relaxed);
        if timeout_secs == 0 {
            return;
        }
        let limit = Duration::from_secs(timeout_secs);
        for (id, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            // Redis's `timeout` spares blocked clients.
            let waiting = c.hold_until.is_some() || c.blocked.is_some() || c.script_pending;
            if !waiting && c.last_active.elapsed() > limit {
                c.dead = true;
                self.pending.push(id as ConnId);
            }
        }
    }

    /// Shutdown: accept no more, read no more; what was received is run,
    /// its replies made durable and sent, then the connections close.
    /// Past [`STOP_GRACE`]: logs each connection still open with what
    /// kept it (a shutdown must end; what it shows is a bug to find), and
    /// leaves them to be dropped with the worker.
    pub(super) fn drop_unfinished(&self) {
        for c in self.conns.iter().flatten() {
            log::warn!(
                "stopping: client {} still open after {STOP_GRACE:?} (closing {}, dead {}, recv armed {}, more input {}, backlog {}, held {} bytes, deferred {}, blocked {}, script {}); dropped",
                c.addr,
                c.closing,
                c.dead,
                c.recv_armed,
                c.more_input,
                c.has_backlog(),
                c.held.len(),
                c.deferred.is_some(),
                c.blocked.is_some(),
                c.script_pending,
            );
        }
    }

    pub(super) fn begin_stop(&mut self) {
        if let Some(listeners) = self.listeners.take() {
            self.ring.stop_accepting();
            drop(listeners);
        }
        for (id, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            if !c.closing {
                c.closing = true;
                // A shared-memory client's socket stays open: its end
                // would read as the client's death, dropping its replies.
                if !c.stream.is_shm() {
                    let _ = c.stream.shutdown(Shutdown::Read);
                }
                self.pending.push(id as ConnId);
            }
        }
        // The committer thread may have stopped: commit here.
        let furthest = self
            .conns
            .iter()
            .flatten()
            .filter_map(|c| c.hold_until)
            .max();
        if let Some(at) = furthest {
            if let Err(e) = self.shared.db.store().make_durable(at) {
                log::error!("a commit at shutdown failed: {e}; held replies are dropped");
                for c in self.conns.iter_mut().flatten() {
                    if c.hold_until.is_some() {
                        c.dead = true;
                    }
                }
            }
        }
    }
}
