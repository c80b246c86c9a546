//! Per-queue command counters: what each connected queue (a controller's
//! admin queue or one of its I/O queues) was asked to do and how often it
//! answered an error, for `sluice node --metrics`.
//!
//! A queue's counters are written by the one thread serving its
//! connection and read by the metrics scrape; the subsystem keeps a weak
//! reference to each, so a closed queue's counters go with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What a command asked for, as the metrics split it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    /// NVM Read.
    Read,
    /// NVM Write, Write Zeroes, MultiCast and add_write: commands that
    /// change blocks from the host's data or none.
    Write,
    /// NVM Flush.
    Flush,
    /// Copy, Compare, Dataset Management and the rest of the I/O commands.
    OtherIo,
    /// Any command on an admin queue (Identify, logs, features, keep-alive,
    /// fabrics commands).
    Admin,
}

impl CommandKind {
    /// Every kind, in the order [`QueueFigures::commands`] holds them.
    pub const ALL: [CommandKind; 5] = [
        CommandKind::Read,
        CommandKind::Write,
        CommandKind::Flush,
        CommandKind::OtherIo,
        CommandKind::Admin,
    ];

    /// The kind of a command with `opcode` on queue `qid` (0: admin).
    pub fn of(qid: u16, opcode: u8) -> CommandKind {
        use crate::nvm::opcode;
        if qid == 0 {
            return CommandKind::Admin;
        }
        match opcode {
            opcode::READ => CommandKind::Read,
            opcode::WRITE | opcode::WRITE_ZEROES | opcode::MULTICAST | opcode::ADD_WRITE => {
                CommandKind::Write
            }
            opcode::FLUSH => CommandKind::Flush,
            _ => CommandKind::OtherIo,
        }
    }

    /// Its label value in the metrics.
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::Read => "read",
            CommandKind::Write => "write",
            CommandKind::Flush => "flush",
            CommandKind::OtherIo => "other_io",
            CommandKind::Admin => "admin",
        }
    }
}

/// The counters of one connected queue.
#[derive(Debug)]
pub struct QueueCounters {
    controller: u16,
    qid: u16,
    commands: [AtomicU64; CommandKind::ALL.len()],
    errors: AtomicU64,
}

impl QueueCounters {
    /// Counts a command received.
    pub fn count_command(&self, kind: CommandKind) {
        // One writer (the queue's connection): a load and a store would do,
        // but a relaxed add is as cheap uncontended and needs no argument.
        self.commands[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a command answered with an error status.
    pub fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn figures(&self) -> QueueFigures {
        QueueFigures {
            controller: self.controller,
            qid: self.qid,
            commands: std::array::from_fn(|i| self.commands[i].load(Ordering::Relaxed)),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// One live queue's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFigures {
    /// Its controller's id.
    pub controller: u16,
    /// Its queue id (0: the admin queue).
    pub qid: u16,
    /// Commands received, by [`CommandKind::ALL`].
    pub commands: [u64; CommandKind::ALL.len()],
    /// Commands answered with an error status.
    pub errors: u64,
}

/// Most queues the registry holds: every controller's admin queue and its
/// I/O queues.
pub const MAX_QUEUES: usize =
    crate::controller::MAX_CONTROLLERS * (crate::controller::MAX_IO_QUEUES as usize + 1);

/// The subsystem's weak references to its queues' counters.
#[derive(Debug, Default)]
pub struct QueueRegistry {
    queues: Mutex<Vec<Weak<QueueCounters>>>,
}

impl QueueRegistry {
    /// New counters for queue `qid` of `controller`, registered.
    pub fn register(&self, controller: u16, qid: u16) -> Arc<QueueCounters> {
        let counters = Arc::new(QueueCounters {
            controller,
            qid,
            commands: Default::default(),
            errors: AtomicU64::new(0),
        });
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.retain(|q| q.strong_count() > 0);
        // Connect admits no more controllers and queues than this: a longer
        // list would be counters leaking.
        debug_assert!(
            queues.len() < MAX_QUEUES,
            "{} queues registered",
            queues.len()
        );
        queues.push(Arc::downgrade(&counters));
        counters
    }

    /// The live queues' figures, by controller and queue id.
    pub fn figures(&self) -> Vec<QueueFigures> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.retain(|q| q.strong_count() > 0);
        let mut out: Vec<QueueFigures> = queues
            .iter()
            .filter_map(Weak::upgrade)
            .map(|q| q.figures())
            .collect();
        out.sort_by_key(|q| (q.controller, q.qid));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_counted_by_kind_and_closed_queues_leave() {
        let registry = QueueRegistry::default();
        let admin = registry.register(1, 0);
        let io = registry.register(1, 1);
        admin.count_command(CommandKind::of(0, crate::nvm::opcode::READ));
        for opcode in [
            crate::nvm::opcode::READ,
            crate::nvm::opcode::READ,
            crate::nvm::opcode::WRITE,
        ] {
            io.count_command(CommandKind::of(1, opcode));
        }
        io.count_command(CommandKind::of(1, crate::nvm::opcode::FLUSH));
        io.count_command(CommandKind::of(1, crate::nvm::opcode::COPY));
        io.count_error();
        let figures = registry.figures();
        assert_eq!(figures.len(), 2);
        assert_eq!((figures[0].qid, figures[0].commands), (0, [0, 0, 0, 0, 1]));
        assert_eq!((figures[1].qid, figures[1].commands), (1, [2, 1, 1, 1, 0]));
        assert_eq!((figures[0].errors, figures[1].errors), (0, 1));
        drop(io);
        assert_eq!(registry.figures().len(), 1);
        drop(admin);
        assert!(registry.figures().is_empty());
    }
}
