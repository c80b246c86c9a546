//! What a worker serves on a connection, whatever its protocol: an NVMe/TCP
//! queue (`target`) or an NBD client's transmission phase (`nbd`). The
//! worker sees one kind of session, a non-blocking turn at a time; each
//! protocol keeps its own rules behind it.

use crate::controller::Subsystem;
use crate::wire::Wire;
use std::os::fd::RawFd;
use std::sync::Arc;

/// A connection's protocol state on its worker.
pub(crate) trait Session: Send {
    /// One non-blocking turn: takes what the peer sent, runs its requests,
    /// issues and answers device I/O, sends what the socket takes. Returns
    /// whether anything happened; `Err` ends the connection (`Ok` inside:
    /// the peer left).
    fn turn(&mut self, wire: &mut Wire) -> Result<bool, Result<(), String>>;
    /// Commands at the device (or finished, not yet answered).
    fn busy_at_device(&self) -> bool;
    /// Whether every completion of its device I/O is signalled to the
    /// worker's eventfd (the worker may then sleep in epoll meanwhile).
    fn signals_completions(&self) -> bool;
    /// Waits for the device to finish at least one command and answers
    /// what finished (sent by the next turn).
    fn wait_for_device(&mut self);
    /// Answers made and not yet taken by the wire.
    fn has_unsent(&self) -> bool;
    /// Received requests wait for a turn without new bytes.
    fn held(&self) -> bool;
    /// Why the connection must end now, if it must.
    fn expired(&self) -> Option<String>;
    /// Commands waiting for [`Session::run_deferred`].
    fn has_deferred(&self) -> bool;
    /// Whether its waiting commands run on the worker itself (an admin
    /// queue's) rather than on the worker's helper thread.
    fn runs_on_worker(&self) -> bool;
    /// Runs the waiting commands, in order, after its device I/O.
    fn run_deferred(&mut self);
    /// Reaps every command at the device and queues their answers.
    fn drain_device(&mut self);
    /// Whether the peer is past its setup (and no longer holds a setup
    /// slot).
    fn is_connected(&self) -> bool;
    /// Whether the peer has begun talking.
    fn initialized(&self) -> bool;
    /// Ends the session: what is at the device finishes first.
    fn close(self: Box<Self>);
}

/// How a connection handed to a worker begins: its session made on the
/// worker's thread (whose engines it uses, signalling their completions to
/// the eventfd given) for the node's subsystem.
pub(crate) type Begin = Box<dyn FnOnce(Arc<Subsystem>, RawFd) -> Box<dyn Session> + Send>;
