//! What other threads hand a worker between turns: blocked clients to
//! wake, pushes to send, scripts' replies, and blocked commands' timeouts.

use super::Worker;
use crate::server::{dispatch, WorkerStats};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What a blocked command answers when its time is up: WAIT the replicas
/// that acknowledged (none: Sluice has no replicas yet), the others
/// Redis's null.
fn timeout_reply_of(args: &crate::resp::Args) -> crate::resp::Reply {
    if args[0].eq_ignore_ascii_case(b"wait") {
        return crate::resp::Reply::Integer(0);
    }
    crate::commands::blocking::timeout_reply()
}

impl Worker {
    /// Blocked connections a write woke: their blocking command runs again
    /// this turn, keeping its place in the registry should it find
    /// nothing.
    #[expect(
        clippy::expect_used,
        reason = "each expect follows the check of the same value just before it"
    )]
    pub(super) fn take_wakes(&mut self) {
        for (slot, ticket, wake) in self.wakes.take() {
            let c = self.conns.get_mut(slot as usize).and_then(Option::as_mut);
            // A second wake of a waiter already woken is the same run.
            let running = c
                .as_ref()
                .is_some_and(|c| c.retry.as_ref().is_some_and(|r| r.ticket == ticket));
            let Some(c) = c.filter(|c| c.blocked.as_ref().is_some_and(|b| b.ticket == ticket))
            else {
                // Gone, or no longer waiting with that ticket: nothing
                // runs again for this wake.
                if wake == crate::server::blocking::Wake::Retry && !running {
                    self.shared.blocking.retried(ticket);
                }
                continue;
            };
            let b = c.blocked.take().expect("checked");
            match wake {
                crate::server::blocking::Wake::Retry => {
                    c.deferred = Some(b.args.clone());
                    c.retry = Some(b);
                }
                crate::server::blocking::Wake::Unblock { error } => {
                    self.shared.blocking.leave(&b.keys, b.ticket);
                    c.push_reply(&if error {
                        crate::resp::Reply::Error(
                            "UNBLOCKED client unblocked via CLIENT UNBLOCK".into(),
                        )
                    } else {
                        crate::commands::blocking::timeout_reply()
                    });
                }
            }
            c.more_input = true;
            self.pending.push(slot);
        }
    }

    /// Queues the messages publishers left for this worker's subscribers.
    pub(super) fn take_pushes(&mut self) {
        for (slot, client, push) in self.pushes.take() {
            let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if c.session.id() != client || c.dead {
                continue;
            }
            if let Some(message) = c.push_for(push) {
                c.push_message(&message);
                self.pending.push(slot);
            }
        }
    }

    /// Queues the replies of scripts the script thread ran; the
    /// connections go on with what they sent after.
    pub(super) fn take_script_replies(&mut self) {
        for done in self.scripts_done.take() {
            let Some(c) = self
                .conns
                .get_mut(done.slot as usize)
                .and_then(Option::as_mut)
            else {
                continue;
            };
            if c.session.id() != done.client || !c.script_pending {
                continue;
            }
            c.script_pending = false;
            if let Some(at) = done.wrote {
                WorkerStats::add(&self.shared.stats.by_worker[self.index].changes, 1);
                self.shared.committer.wrote(at);
                if self.shared.durability().holds(self.shared.db.store(), at) {
                    // Before the reply is queued: it is the first to wait.
                    c.hold_until(at);
                }
            }
            c.push_reply(&done.reply);
            // Counted now that it is answered: its command is the last
            // this connection ran (nothing more of it ran meanwhile).
            if let Some(id) = c.live.last_command.load(Ordering::Relaxed).checked_sub(1) {
                let failed = matches!(done.reply, crate::resp::Reply::Error(_)).then_some(false);
                dispatch::count_call(&self.shared, self.index, id as usize, done.us, failed);
            }
            c.more_input = true;
            self.pending.push(done.slot);
        }
    }

    /// Answers blocked connections whose time is up as Redis does (a null
    /// reply) and takes them out of the registry.
    #[expect(
        clippy::expect_used,
        reason = "each expect follows the check of the same value just before it"
    )]
    pub(super) fn expire_blocked(&mut self) {
        if self.blocked.is_empty() {
            return;
        }
        let now = Instant::now();
        let (conns, pending) = (&mut self.conns, &mut self.pending);
        let blocking = &self.shared.blocking;
        self.blocked.retain(|&slot| {
            let Some(c) = conns.get_mut(slot as usize).and_then(Option::as_mut) else {
                return false;
            };
            let Some(b) = &c.blocked else {
                return c.retry.is_some();
            };
            if b.deadline.is_none_or(|d| d > now) {
                return true;
            }
            let b = c.blocked.take().expect("checked");
            blocking.leave(&b.keys, b.ticket);
            c.push_reply(&timeout_reply_of(&b.args));
            c.more_input = true;
            pending.push(slot);
            false
        });
    }

    /// How long the worker may sleep: `most`, or less when a blocked
    /// connection's deadline comes sooner.
    pub(super) fn until_next_deadline(&self, most: Duration) -> Duration {
        let now = Instant::now();
        self.blocked
            .iter()
            .filter_map(|&slot| {
                self.conns
                    .get(slot as usize)?
                    .as_ref()?
                    .blocked
                    .as_ref()?
                    .deadline
            })
            .map(|d| d.saturating_duration_since(now))
            .fold(most, Duration::min)
    }
}
