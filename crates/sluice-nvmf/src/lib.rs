//! # sluice-nvmf
//!
//! Sluice's storage node speaks NVMe over Fabrics on TCP, so that the
//! standard NVMe hosts (the Linux kernel's nvme-tcp, SPDK) attach to
//! Sluice devices, after the S-Direct design: remote flash with no copy
//! through the node's memory on the way, and commands that move data between
//! devices inside the node (Copy, MultiCast, add_write).
//!
//! - [`pdu`]: the transport binding's PDUs — common header, ICReq/ICResp,
//!   capsules, H2CData/C2HData, R2T, TermReq — with header and data digests
//!   (CRC32C), framed from a byte stream under limits, every malformed
//!   header refused with the fatal error status the binding names.
//! - [`command`]: the 64-byte submission queue entry and the 16-byte
//!   completion the capsules carry, with the statuses the node answers.
//! - [`controller`]: the subsystem (namespaces over Sluice devices, I/O
//!   through sluice-io's `DeviceIo`), the controllers hosts create with
//!   Connect, properties, Identify, features, log pages.
//! - [`nvm`]: the I/O commands — Read, Write, Flush, Write Zeroes, Dataset
//!   Management, Compare, fused Compare-and-Write, Copy — and the node's own
//!   Copy across namespaces, MultiCast and add_write, which move or compute
//!   data between devices without it crossing the network.
//! - [`target`]: the TCP side: ICReq/ICResp, in-capsule data, R2T and
//!   H2CData for writes, C2HData for reads, keep-alive expiry, TermReq on
//!   fatal errors; connections served thread per core by workers (epoll
//!   over non-blocking sockets, `worker`), TLS ones too once their
//!   handshake is done (`wire`); plain Reads and Writes kept in flight at
//!   the device on the connection's own engines, their data in pinned pool
//!   buffers from the socket to the device and back (`datapath`).
//! - [`auth`]: in-band authentication (DH-HMAC-CHAP): hosts named with a
//!   secret prove it on every queue before anything else is served.
//! - [`tls`]: NVMe/TCP over TLS 1.3 with pre-shared keys: the PSK
//!   interchange format, the retained and TLS PSKs derived as the Linux
//!   host's libnvme derives them, and OpenSSL sessions for both sides.
//! - [`initiator`]: a blocking initiator for `sluice nvmf` and the tests.
//! - [`nbd`]: NBD as a second front end over the same namespaces (fixed
//!   newstyle, structured replies), for nbdcopy, qemu-img and fio's nbd
//!   engine.
//!
//! Formats byte by byte: docs/NVMF.md. Data flows one way: sluice-io (device,
//! pool, engine) → this crate → the CLI's `sluice node`.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod admission;
pub mod auth;
pub mod command;
mod connection;
pub mod controller;
mod datapath;
pub mod initiator;
mod link;
mod namespace;
pub mod nbd;
pub mod nvm;
pub mod pdu;
pub mod poll;
pub mod queue_figures;
mod session;
pub mod target;
pub mod tls;
mod wire;
mod worker;
