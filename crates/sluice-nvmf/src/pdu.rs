//! NVMe/TCP PDUs: the common header, each type's specific header, header
//! and data digests, and framing from a byte stream (docs/NVMF.md, "PDUs").
//!
//! [`Framer::next`] takes bytes as they arrive and hands out one whole PDU
//! at a time, or says how many more bytes it needs, or a [`Fatal`] error:
//! the connection's end, reported to the peer with a TermReq carrying the
//! error's FES and FEI, as the transport binding requires.

use crate::command::{Completion, Sqe, SQE_BYTES};
use sluice_io::codec::{u16_at, u32_at};

/// Bytes of the common header every PDU starts with.
pub const COMMON_HEADER_BYTES: usize = 8;
/// Bytes of a header or data digest (CRC32C).
pub const DIGEST_BYTES: usize = 4;
/// The one PDU format version (PFV) there is.
pub const PFV_1_0: u16 = 0;
/// Most bytes of a PDU header copied into a TermReq's data.
pub const MAX_TERM_HEADER_COPY: usize = 128;

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PduType {
    /// Initialize Connection Request (host → controller).
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to controller terminate connection request.
    H2cTermReq = 0x02,
    /// Controller to host terminate connection request.
    C2hTermReq = 0x03,
    /// A command capsule (an SQE and perhaps in-capsule data).
    CapsuleCmd = 0x04,
    /// A response capsule (a CQE).
    CapsuleResp = 0x05,
    /// Host to controller data, after an R2T.
    H2cData = 0x06,
    /// Controller to host data.
    C2hData = 0x07,
    /// Ready to transfer: the controller asks for data.
    R2t = 0x09,
}

impl PduType {
    /// The type of a common header's first byte.
    pub fn from_u8(b: u8) -> Option<PduType> {
        Some(match b {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// HLEN, fixed per type: the common header and the type's own header.
    pub fn header_len(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => COMMON_HEADER_BYTES + SQE_BYTES,
            _ => 24,
        }
    }

    /// Whether digests, once negotiated, cover PDUs of this type (not the
    /// connection set-up and teardown).
    pub fn has_digests(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }

    /// Whether PDUs of this type may carry data.
    pub fn may_carry_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2cData
                | PduType::C2hData
                | PduType::H2cTermReq
                | PduType::C2hTermReq
        )
    }
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGST: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGST: u8 = 1 << 1;
    /// The last data PDU of a command's transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData only: the command succeeded; no response capsule follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Fatal error status (FES) of a TermReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fes {
    /// A header field is invalid; FEI is its byte offset in the PDU.
    InvalidHeaderField = 0x01,
    /// A PDU came that the connection's state does not allow.
    SequenceError = 0x02,
    /// The header digest does not match.
    HeaderDigest = 0x03,
    /// Data outside the command's range.
    DataOutOfRange = 0x04,
    /// More data than negotiated (MAXH2CDATA, the in-capsule size).
    DataLimitExceeded = 0x05,
    /// A parameter the controller does not support (PFV, alignment).
    UnsupportedParameter = 0x06,
}

/// An error that ends the connection: sent to the peer as a TermReq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// The status.
    pub fes: Fes,
    /// Fatal error information: for an invalid header field, its byte offset.
    pub fei: u32,
    /// What was wrong, for logs.
    pub reason: &'static str,
}

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (FES {:#04x}, FEI {})",
            self.reason, self.fes as u8, self.fei
        )
    }
}

impl std::error::Error for Fatal {}

fn fatal(fes: Fes, fei: u32, reason: &'static str) -> Fatal {
    Fatal { fes, fei, reason }
}

fn invalid_field(offset: u32, reason: &'static str) -> Fatal {
    fatal(Fes::InvalidHeaderField, offset, reason)
}

/// The digests a connection negotiated in its ICReq/ICResp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// CRC32C after every header of a type that has digests.
    pub header: bool,
    /// CRC32C after the data of every data-carrying PDU.
    pub data: bool,
}

impl Digests {
    fn from_byte(b: u8) -> Digests {
        Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        }
    }

    fn to_byte(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }
}

/// The common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// The PDU type.
    pub pdu_type: PduType,
    /// [`flags`].
    pub flags: u8,
    /// Header length (common + type-specific), without the header digest.
    pub hlen: u8,
    /// Where the data starts, from the PDU's first byte (0: no data).
    pub pdo: u8,
    /// The whole PDU's length on the wire.
    pub plen: u32,
}

/// The type-specific part of a PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// ICReq: PDU format version, host data alignment (dwords, 0's based),
    /// digests asked for, most R2Ts outstanding per command (0's based).
    IcReq {
        /// PDU format version.
        pfv: u16,
        /// Host PDU data alignment.
        hpda: u8,
        /// Digests the host asks for.
        digests: Digests,
        /// Most outstanding R2Ts per command, 0's based.
        maxr2t: u32,
    },
    /// ICResp: version, controller data alignment, digests, most bytes of
    /// one H2CData PDU.
    IcResp {
        /// PDU format version.
        pfv: u16,
        /// Controller PDU data alignment.
        cpda: u8,
        /// Digests enabled.
        digests: Digests,
        /// Most data bytes in one H2CData PDU.
        maxh2cdata: u32,
    },
    /// H2CTermReq; the data holds the offending header.
    H2cTermReq(Term),
    /// C2HTermReq; the data holds the offending header.
    C2hTermReq(Term),
    /// A command capsule.
    CapsuleCmd(Sqe),
    /// A response capsule.
    CapsuleResp(Completion),
    /// H2CData: data for a write, answering an R2T.
    H2cData(DataHeader),
    /// C2HData: data for a read.
    C2hData(DataHeader),
    /// R2T.
    R2t {
        /// The command's identifier.
        cccid: u16,
        /// Transfer tag the H2CData answering it carries.
        ttag: u16,
        /// Offset in the command's transfer asked for.
        r2to: u32,
        /// Bytes asked for.
        r2tl: u32,
    },
}

/// A TermReq's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// Fatal error status ([`Fes`]).
    pub fes: u16,
    /// Fatal error information.
    pub fei: u32,
}

/// An H2CData or C2HData header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// The command's identifier.
    pub cccid: u16,
    /// Transfer tag (H2CData: the R2T's; C2HData: reserved, 0).
    pub ttag: u16,
    /// Offset of this data in the command's transfer.
    pub datao: u32,
    /// Data bytes in this PDU.
    pub datal: u32,
}

/// One framed PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu<'a> {
    /// The common header.
    pub common: CommonHeader,
    /// The type-specific header.
    pub header: Header,
    /// The data (in-capsule data, transfer data, a TermReq's header copy).
    pub data: &'a [u8],
    /// False if a data digest was present and did not match: not fatal, the
    /// command fails with a transient transport error.
    pub data_digest_ok: bool,
}

/// Limits a framer enforces on the PDUs it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most data bytes in one data PDU (MAXH2CDATA) or other PDU.
    pub max_data_bytes: u32,
    /// Most in-capsule data in one command capsule (IOCCSZ − 64).
    pub max_capsule_data_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_data_bytes: 128 << 10,
            max_capsule_data_bytes: 128 << 10,
        }
    }
}

/// What the next PDU needs, or is.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed<'a> {
    /// At least this many more bytes are needed.
    NeedBytes(usize),
    /// A whole PDU and the bytes it took from the front of the input.
    Pdu(Pdu<'a>, usize),
}

/// A PDU's header, with where its data lies ([`Framer::data_header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPdu {
    /// The decoded header.
    pub header: Header,
    /// Bytes from the PDU's start to its data (PDO).
    pub data_offset: usize,
    /// Bytes of data.
    pub data_len: usize,
    /// Whether a data digest (CRC32C, 4 bytes, little-endian) follows it.
    pub data_digest: bool,
}

/// Frames PDUs of one connection: knows its negotiated digests and limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Framer {
    /// Digests negotiated (none before the ICReq/ICResp exchange).
    pub digests: Digests,
    /// Limits on data.
    pub limits: Limits,
}

impl Framer {
    /// The next PDU at the front of `bytes`.
    pub fn next<'a>(&self, bytes: &'a [u8]) -> Result<Framed<'a>, Fatal> {
        if bytes.len() < COMMON_HEADER_BYTES {
            return Ok(Framed::NeedBytes(COMMON_HEADER_BYTES - bytes.len()));
        }
        let common = self.common(bytes)?;
        let plen = common.plen as usize;
        if bytes.len() < plen {
            return Ok(Framed::NeedBytes(plen - bytes.len()));
        }
        let pdu = &bytes[..plen];
        let hlen = common.hlen as usize;
        let digests = common.pdu_type.has_digests();
        let hdgst = digests && common.flags & flags::HDGST != 0;
        if hdgst {
            let want = crc32c::crc32c(&pdu[..hlen]);
            if u32_at(pdu, hlen) != Some(want) {
                return Err(fatal(Fes::HeaderDigest, 0, "header digest does not match"));
            }
        }
        let header = specific(common.pdu_type, &pdu[..hlen])?;
        let (data, data_digest_ok) = if common.pdo == 0 {
            (&pdu[plen..], true)
        } else {
            let ddgst = digests && common.flags & flags::DDGST != 0;
            let end = plen - if ddgst { DIGEST_BYTES } else { 0 };
            let data = &pdu[common.pdo as usize..end];
            let ok = !ddgst || u32_at(pdu, end) == Some(crc32c::crc32c(data));
            (data, ok)
        };
        check_data_length(&header, data.len())?;
        Ok(Framed::Pdu(
            Pdu {
                common,
                header,
                data,
                data_digest_ok,
            },
            plen,
        ))
    }

    /// The header of the PDU at the front of `bytes` once everything up to
    /// its data has arrived (the data itself need not have): for a receiver
    /// that reads the data straight into its own buffer. `None`: more bytes
    /// are needed first, or the PDU carries no data. Checked as
    /// [`Framer::next`] checks it.
    pub fn data_header(&self, bytes: &[u8]) -> Result<Option<DataPdu>, Fatal> {
        if bytes.len() < COMMON_HEADER_BYTES {
            return Ok(None);
        }
        let common = self.common(bytes)?;
        let (hlen, pdo) = (common.hlen as usize, common.pdo as usize);
        if pdo == 0 || bytes.len() < pdo {
            return Ok(None);
        }
        let hdgst = common.pdu_type.has_digests() && common.flags & flags::HDGST != 0;
        if hdgst {
            let want = crc32c::crc32c(&bytes[..hlen]);
            if u32_at(bytes, hlen) != Some(want) {
                return Err(fatal(Fes::HeaderDigest, 0, "header digest does not match"));
            }
        }
        let header = specific(common.pdu_type, &bytes[..hlen])?;
        let ddgst = common.pdu_type.has_digests() && common.flags & flags::DDGST != 0;
        let data_len = common.plen as usize - pdo - if ddgst { DIGEST_BYTES } else { 0 };
        check_data_length(&header, data_len)?;
        Ok(Some(DataPdu {
            header,
            data_offset: pdo,
            data_len,
            data_digest: ddgst,
        }))
    }

    /// Decodes and checks the common header against the type and the
    /// negotiated digests; the lengths it gives are then safe to slice by.
    fn common(&self, bytes: &[u8]) -> Result<CommonHeader, Fatal> {
        let pdu_type = PduType::from_u8(bytes[0]).ok_or(invalid_field(0, "unknown PDU type"))?;
        let (flags, hlen, pdo) = (bytes[1], bytes[2], bytes[3]);
        let plen = u32_at(bytes, 4).unwrap_or(0);
        if hlen as usize != pdu_type.header_len() {
            return Err(invalid_field(2, "HLEN is not the PDU type's header length"));
        }
        let digests = pdu_type.has_digests();
        let hdgst = digests && self.digests.header;
        let ddgst = digests && self.digests.data;
        if digests && (flags & flags::HDGST != 0) != hdgst {
            return Err(invalid_field(
                1,
                "HDGSTF differs from the negotiated header digest",
            ));
        }
        let header_end = hlen as usize + if hdgst { DIGEST_BYTES } else { 0 };
        let max_data = if pdu_type == PduType::CapsuleCmd {
            self.limits.max_capsule_data_bytes
        } else {
            self.limits.max_data_bytes
        } as usize;
        if pdo == 0 {
            if digests && flags & flags::DDGST != 0 {
                return Err(invalid_field(1, "DDGSTF set on a PDU without data"));
            }
            if plen as usize != header_end {
                return Err(invalid_field(4, "PLEN does not match a PDU without data"));
            }
        } else {
            if !pdu_type.may_carry_data() {
                return Err(invalid_field(
                    3,
                    "PDO set on a PDU type that carries no data",
                ));
            }
            if (flags & flags::DDGST != 0) != ddgst {
                return Err(invalid_field(
                    1,
                    "DDGSTF differs from the negotiated data digest",
                ));
            }
            if (pdo as usize) < header_end {
                return Err(invalid_field(3, "PDO points into the header"));
            }
            let min_len = pdo as usize + if ddgst { DIGEST_BYTES } else { 0 };
            if (plen as usize) < min_len {
                return Err(invalid_field(
                    4,
                    "PLEN is shorter than the header and digests",
                ));
            }
            if plen as usize - min_len > max_data {
                return Err(fatal(
                    Fes::DataLimitExceeded,
                    4,
                    "more data in one PDU than the limit",
                ));
            }
        }
        Ok(CommonHeader {
            pdu_type,
            flags,
            hlen,
            pdo,
            plen,
        })
    }
}

/// The type-specific header of a PDU whose header is `h` (HLEN bytes).
fn specific(pdu_type: PduType, h: &[u8]) -> Result<Header, Fatal> {
    let u16_ = |at: usize| u16_at(h, at).unwrap_or(0);
    let u32_ = |at: usize| u32_at(h, at).unwrap_or(0);
    Ok(match pdu_type {
        PduType::IcReq => Header::IcReq {
            pfv: u16_(8),
            hpda: h[10],
            digests: Digests::from_byte(h[11]),
            maxr2t: u32_(12),
        },
        PduType::IcResp => Header::IcResp {
            pfv: u16_(8),
            cpda: h[10],
            digests: Digests::from_byte(h[11]),
            maxh2cdata: u32_(12),
        },
        PduType::H2cTermReq => Header::H2cTermReq(Term {
            fes: u16_(8),
            fei: u32_(10),
        }),
        PduType::C2hTermReq => Header::C2hTermReq(Term {
            fes: u16_(8),
            fei: u32_(10),
        }),
        PduType::CapsuleCmd => {
            let mut sqe = [0u8; SQE_BYTES];
            sqe.copy_from_slice(&h[COMMON_HEADER_BYTES..]);
            Header::CapsuleCmd(Sqe(sqe))
        }
        PduType::CapsuleResp => Header::CapsuleResp(Completion::decode(&h[8..24])),
        PduType::H2cData | PduType::C2hData => {
            let data = DataHeader {
                cccid: u16_(8),
                ttag: u16_(10),
                datao: u32_(12),
                datal: u32_(16),
            };
            if pdu_type == PduType::H2cData {
                Header::H2cData(data)
            } else {
                Header::C2hData(data)
            }
        }
        PduType::R2t => Header::R2t {
            cccid: u16_(8),
            ttag: u16_(10),
            r2to: u32_(12),
            r2tl: u32_(16),
        },
    })
}

/// A data PDU's DATAL must equal the data it carries.
fn check_data_length(header: &Header, data_len: usize) -> Result<(), Fatal> {
    match header {
        Header::H2cData(d) | Header::C2hData(d) if d.datal as usize != data_len => Err(
            invalid_field(16, "DATAL differs from the data the PDU carries"),
        ),
        _ => Ok(()),
    }
}

/// Encodes PDUs: a header (with its digest when negotiated), padding up to
/// the data alignment, the data and its digest.
#[derive(Debug, Clone, Copy, Default)]
pub struct Encoder {
    /// Digests negotiated.
    pub digests: Digests,
    /// Data alignment the peer asked for, in bytes (0 or 4: none).
    pub data_alignment: usize,
}

impl Encoder {
    /// Appends one PDU to `out`.
    pub fn encode(&self, header: &Header, pdu_flags: u8, data: &[u8], out: &mut Vec<u8>) {
        self.encode_parts(header, pdu_flags, data, out, true);
    }

    /// Appends one PDU to `out` without its data bytes: the header, its
    /// digest and the padding up to the data, then the data's digest.
    /// Returns where in `out` the data belongs: the PDU is `out[..at]`,
    /// `data`, `out[at..]` — sent from where the data already lies (an I/O
    /// buffer), with no copy into `out`.
    pub fn encode_around(
        &self,
        header: &Header,
        pdu_flags: u8,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> usize {
        self.encode_parts(header, pdu_flags, data, out, false)
    }

    fn encode_parts(
        &self,
        header: &Header,
        pdu_flags: u8,
        data: &[u8],
        out: &mut Vec<u8>,
        with_data: bool,
    ) -> usize {
        let pdu_type = header_type(header);
        let hlen = pdu_type.header_len();
        let digests = pdu_type.has_digests();
        let hdgst = digests && self.digests.header;
        let ddgst = digests && self.digests.data && !data.is_empty();
        let header_end = hlen + if hdgst { DIGEST_BYTES } else { 0 };
        let pdo = if data.is_empty() {
            0
        } else if self.data_alignment > 4 {
            header_end.next_multiple_of(self.data_alignment)
        } else {
            header_end
        };
        let plen = if data.is_empty() {
            header_end
        } else {
            pdo + data.len() + if ddgst { DIGEST_BYTES } else { 0 }
        };
        let start = out.len();
        let mut flags_byte = pdu_flags & !(flags::HDGST | flags::DDGST);
        if hdgst {
            flags_byte |= flags::HDGST;
        }
        if ddgst {
            flags_byte |= flags::DDGST;
        }
        out.extend_from_slice(&[pdu_type as u8, flags_byte, hlen as u8, pdo as u8]);
        out.extend_from_slice(&(plen as u32).to_le_bytes());
        specific_bytes(header, out);
        out.resize(start + hlen, 0);
        if hdgst {
            let digest = crc32c::crc32c(&out[start..start + hlen]);
            out.extend_from_slice(&digest.to_le_bytes());
        }
        let mut at = out.len();
        if !data.is_empty() {
            out.resize(start + pdo, 0);
            at = out.len();
            if with_data {
                out.extend_from_slice(data);
            }
            if ddgst {
                out.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
            }
        }
        let outside = if with_data { 0 } else { data.len() };
        debug_assert_eq!(out.len() + outside - start, plen);
        at
    }
}

fn header_type(header: &Header) -> PduType {
    match header {
        Header::IcReq { .. } => PduType::IcReq,
        Header::IcResp { .. } => PduType::IcResp,
        Header::H2cTermReq(_) => PduType::H2cTermReq,
        Header::C2hTermReq(_) => PduType::C2hTermReq,
        Header::CapsuleCmd(_) => PduType::CapsuleCmd,
        Header::CapsuleResp(_) => PduType::CapsuleResp,
        Header::H2cData(_) => PduType::H2cData,
        Header::C2hData(_) => PduType::C2hData,
        Header::R2t { .. } => PduType::R2t,
    }
}

/// The type-specific bytes after the common header (the encoder pads the
/// rest of HLEN with zeros).
fn specific_bytes(header: &Header, out: &mut Vec<u8>) {
    match *header {
        Header::IcReq {
            pfv,
            hpda,
            digests,
            maxr2t,
        } => {
            out.extend_from_slice(&pfv.to_le_bytes());
            out.extend_from_slice(&[hpda, digests.to_byte()]);
            out.extend_from_slice(&maxr2t.to_le_bytes());
        }
        Header::IcResp {
            pfv,
            cpda,
            digests,
            maxh2cdata,
        } => {
            out.extend_from_slice(&pfv.to_le_bytes());
            out.extend_from_slice(&[cpda, digests.to_byte()]);
            out.extend_from_slice(&maxh2cdata.to_le_bytes());
        }
        Header::H2cTermReq(t) | Header::C2hTermReq(t) => {
            out.extend_from_slice(&t.fes.to_le_bytes());
            out.extend_from_slice(&t.fei.to_le_bytes());
        }
        Header::CapsuleCmd(ref sqe) => out.extend_from_slice(&sqe.0),
        Header::CapsuleResp(ref cqe) => out.extend_from_slice(&cqe.encode()),
        Header::H2cData(d) | Header::C2hData(d) => {
            out.extend_from_slice(&d.cccid.to_le_bytes());
            out.extend_from_slice(&d.ttag.to_le_bytes());
            out.extend_from_slice(&d.datao.to_le_bytes());
            out.extend_from_slice(&d.datal.to_le_bytes());
        }
        Header::R2t {
            cccid,
            ttag,
            r2to,
            r2tl,
        } => {
            out.extend_from_slice(&cccid.to_le_bytes());
            out.extend_from_slice(&ttag.to_le_bytes());
            out.extend_from_slice(&r2to.to_le_bytes());
            out.extend_from_slice(&r2tl.to_le_bytes());
        }
    }
}

/// A C2HTermReq for `error`, carrying up to 128 bytes of the header that
/// caused it, ready to send before the connection closes.
pub fn term_req(error: &Fatal, offending: &[u8]) -> Vec<u8> {
    let copy = &offending[..offending.len().min(MAX_TERM_HEADER_COPY)];
    let mut out = Vec::with_capacity(24 + copy.len());
    Encoder::default().encode(
        &Header::C2hTermReq(Term {
            fes: error.fes as u16,
            fei: error.fei,
        }),
        0,
        copy,
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{status, Sgl, SglKind};
    use proptest::prelude::*;

    fn framer(digests: Digests) -> Framer {
        Framer {
            digests,
            limits: Limits::default(),
        }
    }

    fn both() -> Digests {
        Digests {
            header: true,
            data: true,
        }
    }

    fn one_pdu(f: &Framer, bytes: &[u8]) -> Pdu<'static> {
        let leaked: &'static [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
        match f.next(leaked).unwrap() {
            Framed::Pdu(pdu, used) => {
                assert_eq!(used, bytes.len());
                pdu
            }
            other => panic!("{other:?}"),
        }
    }

    fn samples() -> Vec<(Header, Vec<u8>)> {
        let sqe = Sqe::new(0x01, 7).with_nsid(1).with_sgl(Sgl {
            address: 0,
            length: 512,
            kind: SglKind::InCapsule,
        });
        let data = |d: DataHeader| d;
        vec![
            (
                Header::IcReq {
                    pfv: PFV_1_0,
                    hpda: 0,
                    digests: both(),
                    maxr2t: 0,
                },
                vec![],
            ),
            (
                Header::IcResp {
                    pfv: PFV_1_0,
                    cpda: 0,
                    digests: both(),
                    maxh2cdata: 131072,
                },
                vec![],
            ),
            (Header::CapsuleCmd(sqe.clone()), vec![0xab; 512]),
            (Header::CapsuleCmd(sqe), vec![]),
            (
                Header::CapsuleResp(Completion::new(7, status::LBA_OUT_OF_RANGE)),
                vec![],
            ),
            (
                Header::H2cData(data(DataHeader {
                    cccid: 7,
                    ttag: 3,
                    datao: 4096,
                    datal: 100,
                })),
                vec![1; 100],
            ),
            (
                Header::C2hData(data(DataHeader {
                    cccid: 9,
                    ttag: 0,
                    datao: 0,
                    datal: 4096,
                })),
                vec![2; 4096],
            ),
            (
                Header::R2t {
                    cccid: 7,
                    ttag: 3,
                    r2to: 0,
                    r2tl: 8192,
                },
                vec![],
            ),
            (Header::H2cTermReq(Term { fes: 1, fei: 2 }), vec![4; 24]),
        ]
    }

    #[test]
    fn every_pdu_type_round_trips_with_and_without_digests() {
        for digests in [Digests::default(), both()] {
            for alignment in [0, 32] {
                for (header, data) in samples() {
                    let enc = Encoder {
                        digests,
                        data_alignment: alignment,
                    };
                    let mut bytes = Vec::new();
                    enc.encode(&header, flags::LAST_PDU, &data, &mut bytes);
                    let pdu = one_pdu(&framer(digests), &bytes);
                    assert_eq!(pdu.header, header);
                    assert_eq!(pdu.data, &data[..]);
                    assert!(pdu.data_digest_ok);
                    if !data.is_empty() && alignment == 32 && header_type(&header).has_digests() {
                        assert_eq!(pdu.common.pdo % 32, 0);
                    }
                }
            }
        }
    }

    #[test]
    fn a_pdu_is_handed_out_only_when_whole() {
        let mut bytes = Vec::new();
        let (header, data) = samples().remove(2);
        Encoder::default().encode(&header, 0, &data, &mut bytes);
        let f = framer(Digests::default());
        assert_eq!(f.next(&bytes[..3]).unwrap(), Framed::NeedBytes(5));
        assert_eq!(
            f.next(&bytes[..100]).unwrap(),
            Framed::NeedBytes(bytes.len() - 100)
        );
        // Two PDUs back to back: the first is framed alone.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        match f.next(&two).unwrap() {
            Framed::Pdu(_, used) => assert_eq!(used, bytes.len()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn digests_are_checked() {
        let (header, data) = samples().remove(2);
        let mut bytes = Vec::new();
        Encoder {
            digests: both(),
            data_alignment: 0,
        }
        .encode(&header, 0, &data, &mut bytes);
        let f = framer(both());
        let mut bad_header = bytes.clone();
        bad_header[20] ^= 1;
        assert_eq!(f.next(&bad_header).unwrap_err().fes, Fes::HeaderDigest);
        let mut bad_data = bytes.clone();
        let last = bad_data.len() - 10;
        bad_data[last] ^= 1;
        match f.next(&bad_data).unwrap() {
            Framed::Pdu(pdu, _) => assert!(!pdu.data_digest_ok),
            other => panic!("{other:?}"),
        }
        // Digests negotiated, PDU without them: the flags say so, refused.
        let mut plain = Vec::new();
        Encoder::default().encode(&header, 0, &data, &mut plain);
        let err = f.next(&plain).unwrap_err();
        assert_eq!((err.fes, err.fei), (Fes::InvalidHeaderField, 1));
    }

    #[test]
    fn malformed_common_headers_name_the_field() {
        let (header, data) = samples().remove(2);
        let mut good = Vec::new();
        Encoder::default().encode(&header, 0, &data, &mut good);
        let f = Framer {
            digests: Digests::default(),
            limits: Limits {
                max_data_bytes: 256,
                max_capsule_data_bytes: 256,
            },
        };
        let err = f.next(&good).unwrap_err();
        assert_eq!(
            err.fes,
            Fes::DataLimitExceeded,
            "512 bytes over a 256-byte limit"
        );
        let f = framer(Digests::default());
        let cases: Vec<(usize, u8, Fes, u32)> = vec![
            (0, 0x08, Fes::InvalidHeaderField, 0), // unknown type
            (2, 24, Fes::InvalidHeaderField, 2),   // HLEN of another type
            (3, 16, Fes::InvalidHeaderField, 3),   // PDO inside the header
            (1, flags::HDGST, Fes::InvalidHeaderField, 1),
        ];
        for (at, value, fes, fei) in cases {
            let mut bad = good.clone();
            bad[at] = value;
            let err = f.next(&bad).unwrap_err();
            assert_eq!((err.fes, err.fei), (fes, fei), "byte {at} = {value}: {err}");
        }
        // PLEN shorter than the header.
        let mut short = good.clone();
        short[4..8].copy_from_slice(&20u32.to_le_bytes());
        assert_eq!(f.next(&short).unwrap_err().fei, 4);
        // DATAL that disagrees with the data.
        let mut bytes = Vec::new();
        let (h2c, data) = samples().remove(5);
        Encoder::default().encode(&h2c, 0, &data, &mut bytes);
        bytes[16] = 99;
        assert_eq!(f.next(&bytes).unwrap_err().fei, 16);
    }

    #[test]
    fn a_term_req_carries_the_offending_header() {
        let error = invalid_field(2, "HLEN");
        let offending = [0x04u8; 200];
        let bytes = term_req(&error, &offending);
        let pdu = one_pdu(&framer(both()), &bytes);
        assert_eq!(pdu.header, Header::C2hTermReq(Term { fes: 1, fei: 2 }));
        assert_eq!(pdu.data, &offending[..MAX_TERM_HEADER_COPY]);
    }

    proptest! {
        /// Any bytes frame to a PDU, a need for more, or a fatal error:
        /// never a panic, never more bytes than given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                                       header in any::<bool>(), data in any::<bool>()) {
            let f = framer(Digests { header, data });
            if let Ok(Framed::Pdu(_, used)) = f.next(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        /// Valid PDUs with one byte changed: framed or refused, never a panic.
        #[test]
        fn edited_pdus_never_panic(which in 0usize..9, at in any::<prop::sample::Index>(), value in any::<u8>()) {
            let (header, data) = samples().remove(which);
            let mut bytes = Vec::new();
            Encoder { digests: both(), data_alignment: 0 }.encode(&header, 0, &data, &mut bytes);
            let i = at.index(bytes.len());
            bytes[i] = value;
            let _ = framer(both()).next(&bytes);
        }
    }
}
