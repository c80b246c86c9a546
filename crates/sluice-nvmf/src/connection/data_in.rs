//! A write's data from the host: in the capsule, or asked for with R2T
//! and received in H2CData PDUs, straight into the write's pinned buffer
//! where it can be.

use super::receiving::{DirectData, Receiving};
use super::{
    Connection, PendingWrite, Staging, DIRECT_MIN_BYTES, HEADER_READ_BYTES, MAX_PENDING_WRITES,
};
use crate::command::{status, Completion, SglKind, Sqe};
use crate::pdu::{DataHeader, Fatal, Fes, Header};
use crate::wire::Wire;
use sluice_io::IoBuf;
use std::io::ErrorKind;
use std::time::Instant;

impl Connection {
    /// When the PDU begun at `rx.start` (its header here, its data mostly
    /// not) is a plain write's data — a Write or MultiCast capsule with its
    /// data in the capsule, or H2CData for one — and its pinned buffer is
    /// one piece: takes the data bytes already here into the buffer and
    /// makes the rest come straight into it ([`Connection::fill_direct`]).
    /// `false`: the PDU is framed as usual once it is all here.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pending, checked above"
    )]
    pub(super) fn begin_direct(&mut self, rx: &mut Receiving) -> Result<bool, Fatal> {
        let partial = &rx.buf[rx.start..rx.filled];
        let Some(pdu) = self.framer.data_header(partial)? else {
            return Ok(false);
        };
        let have = partial.len() - pdu.data_offset;
        if have >= pdu.data_len || pdu.data_len - have < DIRECT_MIN_BYTES {
            return Ok(false);
        }
        let Some(cid) = self.direct_write(&pdu.header, pdu.data_len)? else {
            return Ok(false);
        };
        let p = self.pending.get_mut(&cid).expect("pending, checked above");
        let data_at = p.received;
        p.data.put(data_at, &partial[pdu.data_offset..]);
        p.received += have;
        self.queue.subsystem().count_write_data(have, false);
        rx.direct = Some(DirectData {
            cid,
            data_at,
            data_len: pdu.data_len,
            digest: pdu.data_digest.then_some(([0; 4], 0)),
        });
        (rx.start, rx.filled) = (0, 0);
        Ok(true)
    }

    /// The pending write whose data the data PDU with `header` carries
    /// (`data_len` bytes), when that data can be read straight into its
    /// pinned buffer: H2CData for a write with a one-piece pinned buffer,
    /// or a Write or MultiCast capsule with its data in it (then made
    /// pending here). `None`: the PDU is framed as usual.
    fn direct_write(&mut self, header: &Header, data_len: usize) -> Result<Option<u16>, Fatal> {
        match header {
            Header::H2cData(d) => {
                let p = self.expecting(d, data_len)?;
                let one_piece = matches!(&p.data, Staging::Pinned(b) if b.as_slice().is_some());
                Ok(one_piece.then_some(d.cccid))
            }
            Header::CapsuleCmd(sqe) if self.initialized => {
                Ok(self.pend_capsule_write(sqe, data_len).then(|| sqe.cid()))
            }
            _ => Ok(None),
        }
    }

    /// A Write or MultiCast capsule whose `len` bytes of in-capsule data
    /// are to be received straight into a pinned buffer: the capsule is
    /// checked as [`Connection::command`] checks it, and the write waits in
    /// `pending` for its data as one after an R2T does. `false`: it runs
    /// the usual way once its capsule is all here.
    fn pend_capsule_write(&mut self, sqe: &Sqe, len: usize) -> bool {
        let sgl = sqe.sgl();
        let cid = sqe.cid();
        if sgl.kind != SglKind::InCapsule
            || sgl.address != 0
            || sgl.length as usize != len
            || self.pending.len() >= MAX_PENDING_WRITES
            || self.pending.contains_key(&cid)
        {
            return false;
        }
        let Some(ios) = self.fast_write(sqe, len) else {
            return false;
        };
        let Some(buf) = self.data_path.write_buffer(&ios[0]) else {
            return false;
        };
        if buf.as_slice().is_none() {
            return false;
        }
        self.pending.insert(
            cid,
            PendingWrite {
                sqe: sqe.clone(),
                ttag: 0,
                data: Staging::Pinned(buf),
                received: 0,
                digest_ok: true,
            },
        );
        // Counted here: this capsule does not pass through `command`.
        self.queue.count_command(sqe.opcode());
        true
    }

    /// Reads what has come of the data PDU of `rx.direct` straight into
    /// its write's pinned buffer, then its digest; what follows it on the
    /// socket goes to the receive buffer in the same read (a header's worth
    /// when headers come first). Starts the write once all is here.
    /// Returns whether bytes came.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a direct PDU's write is pending; one piece, checked when begun; present; pending; one piece"
    )]
    pub(super) fn fill_direct(
        &mut self,
        wire: &mut Wire,
        rx: &mut Receiving,
    ) -> Result<bool, Result<(), String>> {
        use std::io::IoSliceMut;
        let Some(direct) = rx.direct.as_mut() else {
            return Ok(false);
        };
        debug_assert_eq!((rx.start, rx.filled), (0, 0), "nothing framed past it");
        let p = self
            .pending
            .get_mut(&direct.cid)
            .expect("a direct PDU's write is pending");
        let Staging::Pinned(buf) = &mut p.data else {
            unreachable!("direct data goes to a pinned buffer");
        };
        let data = buf.as_mut_slice().expect("one piece, checked when begun");
        let end = direct.data_at + direct.data_len;
        let data_left = end - p.received;
        let tail_bytes = HEADER_READ_BYTES.min(rx.buf.len());
        let (digest_bytes, digest_got) = match &mut direct.digest {
            Some((bytes, got)) => (&mut bytes[*got..], *got),
            None => (&mut [][..], 0),
        };
        let digest_left = digest_bytes.len();
        let mut parts = [
            IoSliceMut::new(&mut data[p.received..end]),
            IoSliceMut::new(digest_bytes),
            IoSliceMut::new(&mut rx.buf[..tail_bytes]),
        ];
        let n = match wire.recv_vectored(&mut parts) {
            Ok(0) => return Err(Ok(())),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Ok(false)
            }
            Err(e) => return Err(Err(format!("receiving: {e}"))),
        };
        rx.last_heard = Instant::now();
        let to_data = n.min(data_left);
        let to_digest = (n - to_data).min(digest_left);
        p.received += to_data;
        if let Some((_, got)) = &mut direct.digest {
            *got = digest_got + to_digest;
        }
        rx.filled = n - to_data - to_digest;
        self.queue.subsystem().count_write_data(to_data, true);
        if to_data < data_left || to_digest < digest_left {
            return Ok(true);
        }
        let direct = rx.direct.take().expect("present");
        if let Some((digest, _)) = direct.digest {
            let range = direct.data_at..direct.data_at + direct.data_len;
            let p = self.pending.get_mut(&direct.cid).expect("pending");
            let Staging::Pinned(buf) = &p.data else {
                unreachable!("direct data goes to a pinned buffer");
            };
            let data = buf.as_slice().expect("one piece");
            p.digest_ok &= u32::from_le_bytes(digest) == crc32c::crc32c(&data[range]);
        }
        rx.headers_first = true;
        rx.whole_pdus = 0;
        self.h2c_received(direct.cid);
        Ok(true)
    }

    /// The blocks a plain Write or a MultiCast of `len_bytes` writes, when
    /// this connection keeps it in flight (the first run's engine receives
    /// the data), or `None` (the slow way).
    fn fast_write(&self, sqe: &Sqe, len_bytes: usize) -> Option<Vec<crate::datapath::BlockIo>> {
        self.queue.independent(sqe)?;
        let ios = match sqe.opcode() {
            crate::nvm::opcode::WRITE => vec![self.data_path.nvme_io(sqe)?],
            crate::nvm::opcode::MULTICAST => self.data_path.multicast_io(sqe)?,
            _ => return None,
        };
        (ios[0].bytes == len_bytes).then_some(ios)
    }

    /// Starts the writes of [`Connection::fast_write`]'s `ios` from `buf`.
    fn start_fast_write(
        &mut self,
        sqe: &Sqe,
        ios: &[crate::datapath::BlockIo],
        buf: IoBuf,
    ) -> Result<(), IoBuf> {
        let tag = sqe.cid() as u64;
        match ios {
            [io] => self.data_path.start_write(tag, io, buf),
            _ => self.data_path.start_multicast(tag, ios, buf),
        }
    }

    /// A command with its data in the capsule: a plain Write or a MultiCast
    /// goes to the device from a pinned buffer, anything else the slow way.
    pub(super) fn write_in_capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        if let Some(ios) = self.fast_write(sqe, data.len()) {
            if let Some(mut buf) = self.data_path.write_buffer(&ios[0]) {
                buf.write_at(0, data);
                self.queue.subsystem().count_write_data(data.len(), false);
                if self.start_fast_write(sqe, &ios, buf).is_ok() {
                    return;
                }
            }
        }
        self.run_command(sqe, data);
    }

    pub(super) fn ask_for_data(&mut self, sqe: Sqe, len: usize) {
        let cid = sqe.cid();
        if self.pending.len() >= MAX_PENDING_WRITES || self.pending.contains_key(&cid) {
            let s = if self.pending.contains_key(&cid) {
                status::CID_CONFLICT
            } else {
                status::INTERNAL
            };
            self.complete(Completion::new(cid, s));
            return;
        }
        let ttag = self.next_ttag;
        self.next_ttag = self.next_ttag.wrapping_add(1).max(1);
        let pinned = match self.fast_write(&sqe, len) {
            Some(ios) => self.data_path.write_buffer(&ios[0]),
            None => None,
        };
        let data = match pinned {
            Some(buf) => Staging::Pinned(buf),
            None => Staging::Heap(vec![0u8; len]),
        };
        self.encoder.encode(
            &Header::R2t {
                cccid: cid,
                ttag,
                r2to: 0,
                r2tl: len as u32,
            },
            0,
            &[],
            &mut self.out.bytes,
        );
        self.pending.insert(
            cid,
            PendingWrite {
                sqe,
                ttag,
                data,
                received: 0,
                digest_ok: true,
            },
        );
    }

    pub(super) fn h2c_data(
        &mut self,
        d: DataHeader,
        data: &[u8],
        digest_ok: bool,
    ) -> Result<(), Fatal> {
        let p = self.expecting(&d, data.len())?;
        p.data.put(p.received, data);
        p.received += data.len();
        p.digest_ok &= digest_ok;
        if matches!(p.data, Staging::Pinned(_)) {
            self.queue.subsystem().count_write_data(data.len(), false);
        }
        self.h2c_received(d.cccid);
        Ok(())
    }

    /// The write an H2CData PDU of `len` bytes is for, checked against
    /// what its R2T asked for.
    fn expecting(&mut self, d: &DataHeader, len: usize) -> Result<&mut PendingWrite, Fatal> {
        let out_of_range = |reason| Fatal {
            fes: Fes::DataOutOfRange,
            fei: 12,
            reason,
        };
        let Some(p) = self.pending.get_mut(&d.cccid) else {
            return Err(Fatal {
                fes: Fes::InvalidHeaderField,
                fei: 8,
                reason: "H2CData for a command that asked for none",
            });
        };
        if d.ttag != p.ttag {
            return Err(Fatal {
                fes: Fes::InvalidHeaderField,
                fei: 10,
                reason: "H2CData with a transfer tag no R2T gave",
            });
        }
        if d.datao as usize != p.received {
            return Err(out_of_range(
                "H2CData not at the next offset of the transfer",
            ));
        }
        if p.received + len > p.data.len() {
            return Err(out_of_range("H2CData past the end of the transfer"));
        }
        Ok(p)
    }

    /// Runs the write `cccid` once all its data is here.
    #[expect(
        clippy::expect_used,
        reason = "the pending write is present: its CCCID was looked up just before"
    )]
    fn h2c_received(&mut self, cccid: u16) {
        let Some(p) = self.pending.get(&cccid) else {
            return;
        };
        if p.received < p.data.len() {
            return;
        }
        let p = self.pending.remove(&cccid).expect("present");
        if !p.digest_ok {
            self.complete(Completion::new(cccid, status::TRANSIENT_TRANSPORT));
            return;
        }
        match p.data {
            Staging::Heap(data) => self.run_command(&p.sqe, &data),
            Staging::Pinned(buf) => {
                let started = match self.fast_write(&p.sqe, buf.len()) {
                    Some(ios) => self.start_fast_write(&p.sqe, &ios, buf),
                    None => Err(buf),
                };
                if let Err(buf) = started {
                    self.run_command(&p.sqe, &buf.to_vec());
                }
            }
        }
    }
}
