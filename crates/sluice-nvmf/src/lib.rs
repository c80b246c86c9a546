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
//!
//! Formats byte by byte: docs/NVMF.md. Data flows one way: sluice-io (device,
//! pool, engine) → this crate → the CLI's `sluice node`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod command;
pub mod pdu;
