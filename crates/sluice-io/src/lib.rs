//! # sluice-io
//!
//! The bottom of Sluice: everything between a device and the bytes a caller
//! asks for.
//!
//! - [`device`]: LBA-addressed devices — a preallocated file opened with
//!   O_DIRECT, a raw block device, and a memory device with fault injection.
//! - [`pool`]: the three-tier pinned buffer pool (small static lists, medium
//!   chunks with scatter/gather, big per-request buffers).
//! - [`engine`]: the io_uring engine (registered file, fixed buffers, batched
//!   submission, SQPOLL, IOPOLL, two priority classes) and the posix baseline.
//! - [`probe`]: what the kernel offers; engines fall back from it.
//! - [`net`]: the network ring of a server thread (multishot accept and
//!   recv into provided buffers, owned sends, a waker), Linux 6.0.
//! - [`shm`]: shared-memory rings for local clients of the server (sealed
//!   memfds, futex and eventfd wake-ups, descriptor passing).
//! - [`kept`]: memory that outlives the process (a tmpfs file mapped
//!   shared), where the store keeps its log's unwritten tail.
//! - [`cpu`]: background threads at idle CPU priority.
//! - [`spin`]: the process's slots for threads that poll instead of
//!   sleeping (at most half the cores).
//! - [`sync_io`]: [`DeviceIo`], blocking I/O from any thread through leased
//!   engines — how the crates above wait for a device I/O; [`write_runs_on`]
//!   and [`write_bufs_on`] for a caller that keeps an engine of its own (the
//!   second writes buffers the caller filled in the engine's pool, with no
//!   copy).
//!
//! Data flows one way: device → pool → engine → the crates above.
//!
//! Kernel versions: io_uring READ/WRITE and the probe need Linux 5.6, sparse
//! registered-buffer tables 5.19; without them the engine falls back (fixed
//! buffers off, or the posix engine) and says so in one log line.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]

pub mod codec;
pub mod cpu;
pub mod device;
pub mod engine;
pub mod error;
pub mod kept;
pub mod mem;
pub mod net;
pub mod pool;
pub mod probe;
pub mod readiness;
pub mod shm;
pub mod spin;
pub mod sync_io;

pub use device::{
    Device, FileDevice, FileOptions, Geometry, IoCounts, IoCountsSnapshot, MemoryDevice,
    PowerCutMode,
};
pub use engine::{
    open_engine, Completion, Engine, EngineConfig, EngineKind, Op, PosixEngine, Priority, Request,
    UringEngine,
};
pub use error::{IoError, Result};
pub use pool::{BufferPool, Direction, IoBuf, OnExhausted, Pinning, PoolConfig, PoolStats, Tier};
pub use sync_io::{
    write_bufs_on, write_runs_on, DeviceIo, DurableWrites, EngineLease, PendingRead, ReadBytes,
};
