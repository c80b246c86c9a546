//! What the node says of itself: Identify Controller and Namespace, the
//! discovery log page, the controller's capabilities.

use super::subsystem::Subsystem;
use super::{DISCOVERY_NQN, MAX_AERS, QUEUE_ENTRIES, TREQ_SQ_FLOW_DISABLE_SUPPORTED, VERSION};
use crate::namespace::{Namespace, MDTS};
use crate::nvm;

/// CAP: MQES (0's based entries), CQR, TO (500 ms units), CSS (NVM), MPSMIN
/// and MPSMAX of 4 KiB.
pub fn capabilities() -> u64 {
    let mqes = (QUEUE_ENTRIES - 1) as u64;
    let cqr = 1u64 << 16;
    let timeout = 20u64 << 24; // 10 s
    let css_nvm = 1u64 << 37;
    mqes | cqr | timeout | css_nvm
}

/// An NQN field: ASCII up to the first NUL, at most 256 bytes.
pub(super) fn nqn_field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `text` into `field`, padded with spaces (Identify's ASCII fields).
fn ascii(field: &mut [u8], text: &str) {
    field.fill(b' ');
    let n = text.len().min(field.len());
    field[..n].copy_from_slice(&text.as_bytes()[..n]);
}

/// The discovery log: a 1024-byte header (GENCTR, NUMREC, RECFMT) and one
/// 1024-byte entry for the subsystem at the node's TCP address.
pub(super) fn discovery_log(subsystem: &Subsystem) -> Vec<u8> {
    let mut p = vec![0u8; 2048];
    let records: u64 = subsystem.address.is_some() as u64;
    p[0..8].copy_from_slice(&1u64.to_le_bytes()); // GENCTR
    p[8..16].copy_from_slice(&records.to_le_bytes()); // NUMREC
    if let Some(address) = subsystem.address {
        let e = &mut p[1024..2048];
        e[0] = 3; // TRTYPE: TCP
        e[1] = if address.is_ipv4() { 1 } else { 2 }; // ADRFAM
        e[2] = 2; // SUBTYPE: an NVM subsystem
                  // TREQ: secure channel required (1), not required (2), or not
                  // specified (0).
        e[3] = match subsystem.tls_required {
            Some(true) => 1,
            Some(false) => 2,
            None => 0,
        } | TREQ_SQ_FLOW_DISABLE_SUPPORTED;
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes()); // CNTLID: dynamic
        e[8..10].copy_from_slice(&32u16.to_le_bytes()); // ASQSZ
        ascii(&mut e[32..64], &address.port().to_string());
        let nqn = subsystem.nqn.as_bytes();
        e[256..256 + nqn.len().min(255)].copy_from_slice(&nqn[..nqn.len().min(255)]);
        ascii(&mut e[512..768], &address.ip().to_string());
        // TSAS for TCP: SECTYPE 2 is TLS 1.3, 0 none.
        e[768] = if subsystem.tls_required.is_some() {
            2
        } else {
            0
        };
    }
    p
}

pub(super) fn identify_controller(subsystem: &Subsystem, id: u16, discovery: bool, p: &mut [u8]) {
    p[0..2].copy_from_slice(&0x1b36u16.to_le_bytes()); // VID
    p[2..4].copy_from_slice(&0x1b36u16.to_le_bytes()); // SSVID
    ascii(&mut p[4..24], &subsystem.serial);
    ascii(&mut p[24..64], "Sluice storage node");
    ascii(&mut p[64..72], env!("CARGO_PKG_VERSION"));
    p[72] = 6; // RAB
    p[76] = 0b11; // CMIC: several ports and controllers
    p[77] = MDTS;
    p[78..80].copy_from_slice(&id.to_le_bytes());
    p[80..84].copy_from_slice(&VERSION.to_le_bytes());
    p[111] = if discovery { 2 } else { 1 }; // CNTRLTYPE: discovery or I/O
    p[258] = 3; // ACL (0's based)
    p[259] = (MAX_AERS - 1) as u8; // AERL
    p[261] = 1 << 1; // LPA: Commands Supported and Effects log
    p[320..322].copy_from_slice(&1u16.to_le_bytes()); // KAS: keep-alive in 100 ms units
    p[512] = 0x66; // SQES: 64 bytes
    p[513] = 0x44; // CQES: 16 bytes
    p[514..516].copy_from_slice(&QUEUE_ENTRIES.to_le_bytes()); // MAXCMD
    let namespaces = if discovery {
        0
    } else {
        subsystem.namespace_count()
    };
    p[516..520].copy_from_slice(&namespaces.to_le_bytes()); // NN
                                                            // ONCS: Compare, Dataset Management, Write Zeroes, Copy.
    p[520..522].copy_from_slice(&(1u16 | 1 << 2 | 1 << 3 | 1 << 8).to_le_bytes());
    p[522..524].copy_from_slice(&1u16.to_le_bytes()); // FUSES: Compare and Write
    p[525] = 1; // VWC present
    p[534..536].copy_from_slice(&1u16.to_le_bytes()); // OCFS: Copy format 0
                                                      // SGLS: SGLs supported (no alignment), Offset in the capsule (bit 20).
    p[536..540].copy_from_slice(&(1u32 | 1 << 20).to_le_bytes());
    let nqn = if discovery {
        DISCOVERY_NQN
    } else {
        &subsystem.nqn
    }
    .as_bytes();
    let n = nqn.len().min(255);
    p[768..768 + n].copy_from_slice(&nqn[..n]);
    // Fabrics: capsule sizes in 16-byte units, no ICDOFF, one SGL descriptor.
    let ioccsz = ((64 + subsystem.in_capsule_bytes) / 16) as u32;
    p[1792..1796].copy_from_slice(&ioccsz.to_le_bytes());
    p[1796..1800].copy_from_slice(&1u32.to_le_bytes()); // IORCSZ: 16 bytes
    p[1803] = 1; // MSDBD
}

pub(super) fn identify_namespace(ns: &Namespace, p: &mut [u8]) {
    p[0..8].copy_from_slice(&ns.block_count.to_le_bytes()); // NSZE
    p[8..16].copy_from_slice(&ns.block_count.to_le_bytes()); // NCAP
    p[16..24].copy_from_slice(&ns.block_count.to_le_bytes()); // NUSE
    p[25] = 0; // NLBAF: one format
    p[26] = 0; // FLBAS: format 0
    p[33] = 1; // DLFEAT: deallocated blocks read as zeros
    p[74..76].copy_from_slice(&u16::MAX.to_le_bytes()); // MSSRL
    p[76..80].copy_from_slice(&nvm::MAX_COPY_BLOCKS.to_le_bytes()); // MCL
    p[80] = (nvm::MAX_RANGES - 1) as u8; // MSRC (0's based)
    p[104..120].copy_from_slice(&ns.uuid); // NGUID
                                           // LBAF0: no metadata, LBADS = log2(block size).
    p[130] = ns.block_size_bytes.trailing_zeros() as u8;
}
