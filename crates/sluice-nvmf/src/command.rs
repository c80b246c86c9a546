//! NVMe commands as they travel in capsules: the 64-byte submission queue
//! entry and the 16-byte completion (docs/NVMF.md, "Commands").

use sluice_io::codec::{u16_at, u32_at, u64_at};

/// Bytes of a submission queue entry.
pub const SQE_BYTES: usize = 64;
/// Bytes of a completion queue entry.
pub const CQE_BYTES: usize = 16;
/// The opcode of every Fabrics command; the command type is in FCTYPE.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// A submission queue entry, kept as its bytes; fields read on demand.
#[derive(Clone, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_BYTES]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &self.opcode())
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("fuse", &self.fuse())
            .finish()
    }
}

/// Whether a command is fused with its neighbour (Compare and Write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fuse {
    /// A command of its own.
    None,
    /// The first of a fused pair (the Compare).
    First,
    /// The second of a fused pair (the Write).
    Second,
    /// The reserved value 3.
    Reserved,
}

/// Where a command's data is: the SGL descriptor of DPTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    /// Address (for in-capsule data: the offset into the capsule's data).
    pub address: u64,
    /// Bytes.
    pub length: u32,
    /// The descriptor's kind.
    pub kind: SglKind,
}

/// SGL descriptor kinds an NVMe/TCP host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglKind {
    /// Data Block, subtype Offset (0x01): the data is in the capsule.
    InCapsule,
    /// Transport SGL Data Block, subtype Transport Specific (0x5A): the data
    /// moves in H2CData/C2HData PDUs.
    Transport,
    /// Any other identifier byte (refused with SGL Descriptor Type Invalid).
    Other(u8),
}

impl SglKind {
    /// The descriptor's identifier byte (type << 4 | subtype).
    pub fn identifier(self) -> u8 {
        match self {
            SglKind::InCapsule => 0x01,
            SglKind::Transport => 0x5a,
            SglKind::Other(b) => b,
        }
    }

    fn from_identifier(b: u8) -> SglKind {
        match b {
            0x01 => SglKind::InCapsule,
            0x5a => SglKind::Transport,
            other => SglKind::Other(other),
        }
    }
}

impl Sqe {
    /// An entry with only its opcode and command identifier set.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut b = [0u8; SQE_BYTES];
        b[0] = opcode;
        b[2..4].copy_from_slice(&cid.to_le_bytes());
        Sqe(b)
    }

    /// CDW0 bits 7:0.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// CDW0 bits 9:8.
    pub fn fuse(&self) -> Fuse {
        match self.0[1] & 3 {
            0 => Fuse::None,
            1 => Fuse::First,
            2 => Fuse::Second,
            _ => Fuse::Reserved,
        }
    }

    /// CDW0 bits 15:14: 0 for PRPs, 1 or 2 for SGLs (a fabric uses SGLs).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    /// CDW0 bits 31:16.
    pub fn cid(&self) -> u16 {
        self.u16(2)
    }

    /// The namespace (CDW1).
    pub fn nsid(&self) -> u32 {
        self.u32(4)
    }

    /// A Fabrics command's type (byte 4, where other commands have NSID).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Command dword `n` (0..16).
    pub fn cdw(&self, n: usize) -> u32 {
        assert!(n < 16, "an SQE has 16 dwords");
        self.u32(4 * n)
    }

    /// The data pointer as an SGL descriptor (bytes 24..40).
    pub fn sgl(&self) -> Sgl {
        Sgl {
            address: u64_at(&self.0, 24).unwrap_or(0),
            length: self.u32(32),
            kind: SglKind::from_identifier(self.0[39]),
        }
    }

    /// Sets the fuse bits.
    pub fn with_fuse(mut self, fuse: Fuse) -> Sqe {
        let bits = match fuse {
            Fuse::None => 0,
            Fuse::First => 1,
            Fuse::Second => 2,
            Fuse::Reserved => 3,
        };
        self.0[1] = (self.0[1] & !3) | bits;
        self
    }

    /// Sets the command identifier.
    pub fn with_cid(mut self, cid: u16) -> Sqe {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
        self
    }

    /// Sets the namespace.
    pub fn with_nsid(mut self, nsid: u32) -> Sqe {
        self.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        self
    }

    /// Sets command dword `n`.
    pub fn with_cdw(mut self, n: usize, value: u32) -> Sqe {
        assert!(n < 16, "an SQE has 16 dwords");
        self.0[4 * n..4 * n + 4].copy_from_slice(&value.to_le_bytes());
        self
    }

    /// Sets the data pointer to an SGL descriptor (and PSDT to SGL).
    pub fn with_sgl(mut self, sgl: Sgl) -> Sqe {
        self.0[1] = (self.0[1] & 0x3f) | 1 << 6;
        self.0[24..32].copy_from_slice(&sgl.address.to_le_bytes());
        self.0[32..36].copy_from_slice(&sgl.length.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = sgl.kind.identifier();
        self
    }

    fn u16(&self, at: usize) -> u16 {
        u16_at(&self.0, at).unwrap_or(0)
    }

    fn u32(&self, at: usize) -> u32 {
        u32_at(&self.0, at).unwrap_or(0)
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// DW0: the command-specific result.
    pub result: u32,
    /// DW1.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// The command's identifier.
    pub cid: u16,
    /// The status field (without the phase tag).
    pub status: Status,
}

impl Completion {
    /// A completion of command `cid` with `status` and no result.
    pub fn new(cid: u16, status: Status) -> Completion {
        Completion {
            result: 0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            status,
        }
    }

    /// The 16 bytes of the entry (phase tag 0: a fabric has no phase).
    pub fn encode(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        b[0..4].copy_from_slice(&self.result.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&(self.status.0 << 1).to_le_bytes());
        b
    }

    /// Reads an entry from its 16 bytes (shorter input reads as zeros).
    pub fn decode(b: &[u8]) -> Completion {
        let u16_ = |at| u16_at(b, at).unwrap_or(0);
        let u32_ = |at| u32_at(b, at).unwrap_or(0);
        Completion {
            result: u32_(0),
            dw1: u32_(4),
            sqhd: u16_(8),
            sqid: u16_(10),
            cid: u16_(12),
            status: Status(u16_(14) >> 1),
        }
    }
}

/// The 15-bit status field: status code (bits 7:0), status code type
/// (10:8), command retry delay (12:11), more (13), do not retry (14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u16);

/// Status code types.
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Command specific status (Fabrics command statuses are here too).
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
}

impl Status {
    /// Success.
    pub const SUCCESS: Status = Status(0);

    /// A status of type `sct` and code `sc`, with Do Not Retry set as given.
    pub const fn new(sct: u8, sc: u8, dnr: bool) -> Status {
        Status(sc as u16 | ((sct as u16 & 7) << 8) | (dnr as u16) << 14)
    }

    /// The status code.
    pub fn sc(self) -> u8 {
        self.0 as u8
    }

    /// The status code type.
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }

    /// Do Not Retry.
    pub fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// Whether the command succeeded.
    pub fn is_success(self) -> bool {
        self.sc() == 0 && self.sct() == 0
    }
}

/// Statuses the node answers with (NVMe base specification, figure
/// "Generic Command Status Values" and the Fabrics command statuses).
pub mod status {
    use super::{sct, Status};

    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::new(sct::GENERIC, 0x01, true);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::new(sct::GENERIC, 0x02, true);
    /// Command ID Conflict.
    pub const CID_CONFLICT: Status = Status::new(sct::GENERIC, 0x03, true);
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Status = Status::new(sct::GENERIC, 0x04, false);
    /// Internal Error.
    pub const INTERNAL: Status = Status::new(sct::GENERIC, 0x06, false);
    /// Command Aborted due to Failed Fused Command.
    pub const FUSED_FAILED: Status = Status::new(sct::GENERIC, 0x09, true);
    /// Command Aborted due to Missing Fused Command.
    pub const FUSED_MISSING: Status = Status::new(sct::GENERIC, 0x0a, true);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::new(sct::GENERIC, 0x0b, true);
    /// Command Sequence Error.
    pub const SEQUENCE_ERROR: Status = Status::new(sct::GENERIC, 0x0c, true);
    /// SGL Descriptor Type Invalid.
    pub const SGL_TYPE_INVALID: Status = Status::new(sct::GENERIC, 0x11, true);
    /// Data SGL Length Invalid: the transfer and the command disagree on length.
    pub const SGL_LENGTH_INVALID: Status = Status::new(sct::GENERIC, 0x0f, true);
    /// SGL Offset Invalid.
    pub const SGL_OFFSET_INVALID: Status = Status::new(sct::GENERIC, 0x16, true);
    /// Transient Transport Error (a data digest that did not match).
    pub const TRANSIENT_TRANSPORT: Status = Status::new(sct::GENERIC, 0x22, false);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status::new(sct::GENERIC, 0x80, true);
    /// Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: Status = Status::new(sct::GENERIC, 0x81, true);
    /// Write Fault.
    pub const WRITE_FAULT: Status = Status::new(sct::MEDIA, 0x80, false);
    /// Unrecovered Read Error.
    pub const UNRECOVERED_READ: Status = Status::new(sct::MEDIA, 0x81, false);
    /// Compare Failure.
    pub const COMPARE_FAILURE: Status = Status::new(sct::MEDIA, 0x85, true);
    /// Fabrics: Connect Incompatible Format.
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::new(sct::COMMAND_SPECIFIC, 0x80, true);
    /// Fabrics: Connect Controller Busy.
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x81, false);
    /// Fabrics: Connect Invalid Parameters.
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::new(sct::COMMAND_SPECIFIC, 0x82, true);
    /// Fabrics: Connect Invalid Host.
    pub const CONNECT_INVALID_HOST: Status = Status::new(sct::COMMAND_SPECIFIC, 0x84, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_fields_round_trip() {
        let sgl = Sgl {
            address: 0x1122_3344_5566_7788,
            length: 4096,
            kind: SglKind::Transport,
        };
        let sqe = Sqe::new(0x02, 0xbeef)
            .with_nsid(3)
            .with_fuse(Fuse::Second)
            .with_cdw(10, 0xdead_beef)
            .with_cdw(11, 7)
            .with_cdw(12, 31)
            .with_sgl(sgl);
        assert_eq!(sqe.opcode(), 0x02);
        assert_eq!(sqe.cid(), 0xbeef);
        assert_eq!(sqe.nsid(), 3);
        assert_eq!(sqe.fuse(), Fuse::Second);
        assert_eq!(sqe.psdt(), 1);
        assert_eq!(
            (sqe.cdw(10), sqe.cdw(11), sqe.cdw(12)),
            (0xdead_beef, 7, 31)
        );
        assert_eq!(sqe.sgl(), sgl);
        assert_eq!(sqe.0[39], 0x5a);
        let odd = Sqe::new(0x01, 1).with_sgl(Sgl {
            kind: SglKind::Other(0x30),
            ..sgl
        });
        assert_eq!(odd.sgl().kind, SglKind::Other(0x30));
    }

    #[test]
    fn completions_round_trip_with_the_phase_bit_clear() {
        let c = Completion {
            result: 0x0102_0304,
            dw1: 9,
            sqhd: 17,
            sqid: 2,
            cid: 0x4242,
            status: status::COMPARE_FAILURE,
        };
        let bytes = c.encode();
        assert_eq!(bytes[14] & 1, 0, "phase tag");
        assert_eq!(Completion::decode(&bytes), c);
        assert_eq!(c.status.sct(), sct::MEDIA);
        assert_eq!(c.status.sc(), 0x85);
        assert!(c.status.dnr());
        assert!(!c.status.is_success());
        assert!(Status::SUCCESS.is_success());
        // Status field 0x85 of type 2 with DNR: bits 1..15 of the last word.
        assert_eq!(
            u16::from_le_bytes([bytes[14], bytes[15]]),
            (0x85 | 2 << 8 | 1 << 14) << 1
        );
    }
}

/// What a command produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Data for the host (sent in C2HData), then the completion.
    Done {
        /// Data to send before the completion.
        data: Vec<u8>,
        /// The completion.
        completion: Completion,
    },
    /// No answer now (an Asynchronous Event Request waits for an event; a
    /// Compare waits for the Write fused to it).
    Held,
    /// A completion to send first (of a held command this one ended), then
    /// this command's outcome.
    Also(Completion, Box<Outcome>),
}
