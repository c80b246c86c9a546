//! A blocking NVMe/TCP initiator: one connection per queue, one command at a
//! time or a pipeline of many ([`QueueConnection::pipeline`]). What `sluice
//! nvmf`, `sluice bench node` and the tests use to reach a target.

use crate::command::{status, Completion, Fuse, Sgl, SglKind, Sqe, Status, FABRICS_OPCODE};
use crate::controller::{
    admin, fctype, property, CATTR_DISABLE_SQ_FLOW, CONNECT_DATA_BYTES, IN_CAPSULE_BYTES,
};
use crate::link::{Link, OpensslLink, PlainLink};
use crate::nvm::opcode as io;
use crate::pdu::{flags, DataHeader, Digests, Encoder, Framed, Framer, Header, Limits, PFV_1_0};
use crate::tls::TlsClient;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Why an initiator's request failed.
#[derive(Debug)]
pub enum InitiatorError {
    /// The connection failed.
    Io(std::io::Error),
    /// The target sent something the protocol does not allow here.
    Protocol(String),
    /// The command completed with an error status.
    Status(Status),
}

impl std::fmt::Display for InitiatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitiatorError::Io(e) => write!(f, "connection: {e}"),
            InitiatorError::Protocol(s) => write!(f, "protocol: {s}"),
            InitiatorError::Status(s) => write!(
                f,
                "command failed with status type {:#x} code {:#04x}",
                s.sct(),
                s.sc()
            ),
        }
    }
}

impl std::error::Error for InitiatorError {}

impl From<std::io::Error> for InitiatorError {
    fn from(e: std::io::Error) -> Self {
        InitiatorError::Io(e)
    }
}

/// The initiator's result type.
pub type Result<T> = std::result::Result<T, InitiatorError>;

/// One queue's connection to a target.
pub struct QueueConnection {
    link: Box<dyn Link + Send>,
    framer: Framer,
    encoder: Encoder,
    /// Bytes received: `buf[start..filled]` not yet framed.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    next_cid: u16,
    /// Most data bytes the target takes in one H2CData PDU.
    pub maxh2cdata: u32,
    /// Bytes this connection has sent, PDU headers and digests included.
    pub bytes_sent: u64,
    /// Bytes this connection has received.
    pub bytes_received: u64,
    /// Whether an I/O queue's Connect keeps SQ flow control on (CATTR bit
    /// 2 clear). Off by default: this host reads no SQHD, and the target
    /// then answers a successful read with its data PDU alone (C2HData's
    /// SUCCESS flag), one PDU instead of two.
    pub sq_flow_control: bool,
    /// Most data a command carries in its capsule; more goes after the
    /// target's R2T. [`IN_CAPSULE_BYTES`] (what every Sluice node takes)
    /// until set from the controller's IOCCSZ
    /// ([`QueueConnection::in_capsule_limit`]).
    pub in_capsule_bytes: usize,
}

/// What a command returned: its completion and any data.
#[derive(Debug)]
pub struct Answer {
    /// The completion.
    pub completion: Completion,
    /// Data the target sent (reads, Identify, log pages).
    pub data: Vec<u8>,
}

impl QueueConnection {
    /// Connects to `address` and runs the ICReq/ICResp exchange.
    pub fn open(address: &str, digests: Digests) -> Result<QueueConnection> {
        let stream = Self::socket(address)?;
        // Polls for the target's answer a short while before it blocks.
        Self::handshake(Box::new(PlainLink::new(stream)), digests)
    }

    /// Connects to `address` over TLS with `tls`'s pre-shared key, then
    /// runs the ICReq/ICResp exchange inside it.
    pub fn open_tls(address: &str, digests: Digests, tls: &TlsClient) -> Result<QueueConnection> {
        let stream = Self::socket(address)?;
        let session = tls.connect(stream).map_err(InitiatorError::Protocol)?;
        Self::handshake(Box::new(OpensslLink { tls: session }), digests)
    }

    /// [`open_tls`](Self::open_tls) with `tls`, else [`open`](Self::open).
    pub fn open_with(
        address: &str,
        digests: Digests,
        tls: Option<&TlsClient>,
    ) -> Result<QueueConnection> {
        match tls {
            Some(tls) => Self::open_tls(address, digests, tls),
            None => Self::open(address, digests),
        }
    }

    fn socket(address: &str) -> Result<TcpStream> {
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(stream)
    }

    fn handshake(link: Box<dyn Link + Send>, digests: Digests) -> Result<QueueConnection> {
        let mut q = QueueConnection {
            link,
            framer: Framer {
                digests: Digests::default(),
                limits: Limits {
                    max_data_bytes: 1 << 20,
                    max_capsule_data_bytes: 1 << 20,
                },
            },
            encoder: Encoder::default(),
            buf: vec![0u8; 1 << 20],
            start: 0,
            filled: 0,
            next_cid: 1,
            maxh2cdata: 0,
            bytes_sent: 0,
            bytes_received: 0,
            sq_flow_control: false,
            in_capsule_bytes: IN_CAPSULE_BYTES,
        };
        let mut out = Vec::new();
        Encoder::default().encode(
            &Header::IcReq {
                pfv: PFV_1_0,
                hpda: 0,
                digests,
                maxr2t: 0,
            },
            0,
            &[],
            &mut out,
        );
        q.send(&out)?;
        match q.receive()? {
            (
                Header::IcResp {
                    digests: granted,
                    maxh2cdata,
                    ..
                },
                _,
                _,
            ) => {
                q.framer.digests = granted;
                q.encoder.digests = granted;
                q.maxh2cdata = maxh2cdata;
                Ok(q)
            }
            (other, _, _) => Err(InitiatorError::Protocol(format!(
                "expected ICResp, got {other:?}"
            ))),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.link.write_all(bytes)?;
        self.bytes_sent += bytes.len() as u64;
        Ok(())
    }

    /// The next PDU from the target.
    fn receive(&mut self) -> Result<(Header, u8, Vec<u8>)> {
        loop {
            if let Some(got) = self.receive_buffered()? {
                return Ok(got);
            }
            let got = match self.link.read(&mut self.buf[self.filled..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            self.bytes_received += got as u64;
            if got == 0 {
                return Err(InitiatorError::Protocol(
                    "the target closed the connection".into(),
                ));
            }
            self.filled += got;
        }
    }

    /// The next PDU if all of it has been received already; else makes
    /// room for the rest and returns `None`.
    fn receive_buffered(&mut self) -> Result<Option<(Header, u8, Vec<u8>)>> {
        match self.framer.next(&self.buf[self.start..self.filled]) {
            Ok(Framed::Pdu(pdu, used)) => {
                let got = (pdu.header, pdu.common.flags, pdu.data.to_vec());
                self.start += used;
                if self.start == self.filled {
                    (self.start, self.filled) = (0, 0);
                }
                Ok(Some(got))
            }
            Ok(Framed::NeedBytes(n)) => {
                // The partial PDU moves to the front only now, once per
                // read, not once per PDU framed.
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
                if self.filled + n > self.buf.len() {
                    self.buf.resize(self.filled + n, 0);
                }
                Ok(None)
            }
            Err(e) => Err(InitiatorError::Protocol(e.to_string())),
        }
    }

    /// Sends a command (its data in the capsule when it fits, else after
    /// the target's R2T) and waits for its completion; data the target sends
    /// back is gathered in the answer.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one command, one answer"
    )]
    pub fn command(&mut self, sqe: Sqe, data: &[u8]) -> Result<Answer> {
        let mut answers = self.commands(vec![(sqe, data)])?;
        answers.pop().expect("one command, one answer")
    }

    /// Sends commands back to back (a fused pair: the Compare, then the
    /// Write) and waits for every completion, answered in the order sent.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: every command answered"
    )]
    pub fn commands(&mut self, commands: Vec<(Sqe, &[u8])>) -> Result<Vec<Result<Answer>>> {
        let depth = commands.len().max(1);
        let mut answers: Vec<Option<Result<Answer>>> = (0..commands.len()).map(|_| None).collect();
        let mut commands = commands.into_iter();
        self.pipeline(
            depth,
            || commands.next(),
            |i, answer, _| {
                answers[i] = Some(answer);
                Ok(())
            },
        )?;
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every command answered"))
            .collect())
    }

    /// Keeps up to `depth` commands in flight on this queue: `next` gives
    /// each new command and its data until it returns `None`; `answered`
    /// gets each one's answer as it completes, with its place in the order
    /// sent (from 0) and when it was sent. Commands that come together are
    /// sent with one system call. Returns once every command is answered;
    /// an error of `answered` or of the connection stops it.
    pub fn pipeline<'d>(
        &mut self,
        depth: usize,
        mut next: impl FnMut() -> Option<(Sqe, &'d [u8])>,
        mut answered: impl FnMut(usize, Result<Answer>, Instant) -> Result<()>,
    ) -> Result<()> {
        let depth = depth.clamp(1, MAX_PIPELINE_DEPTH);
        let mut pending: Vec<Pending<'d>> = Vec::with_capacity(depth);
        let mut sent = 0usize;
        let mut exhausted = false;
        let mut out = Vec::new();
        loop {
            out.clear();
            while !exhausted && pending.len() < depth {
                let Some((sqe, data)) = next() else {
                    exhausted = true;
                    break;
                };
                let cid = self.next_cid;
                self.next_cid = self.next_cid.wrapping_add(1);
                let sqe = with_data(sqe, cid, data.len(), self.in_capsule_bytes);
                let in_capsule = sqe.sgl().kind == SglKind::InCapsule && !data.is_empty();
                let capsule_data = if in_capsule { data } else { &[][..] };
                self.encoder
                    .encode(&Header::CapsuleCmd(sqe), 0, capsule_data, &mut out);
                pending.push(Pending {
                    cid,
                    index: sent,
                    sent_at: Instant::now(),
                    data,
                    received: Vec::new(),
                });
                sent += 1;
            }
            if !out.is_empty() {
                self.send(&out)?;
            }
            if pending.is_empty() {
                return Ok(());
            }
            // One PDU, waiting for it, then every one already here.
            let mut pdu = Some(self.receive()?);
            while let Some((header, pdu_flags, bytes)) = pdu {
                if let Some((p, answer)) = self.on_pdu(&mut pending, header, pdu_flags, bytes)? {
                    answered(p.index, answer, p.sent_at)?;
                }
                pdu = self.receive_buffered()?;
            }
        }
    }

    /// Handles one PDU for the commands in flight; a completion takes its
    /// command out of `pending` and comes back with its answer.
    fn on_pdu<'d>(
        &mut self,
        pending: &mut Vec<Pending<'d>>,
        header: Header,
        pdu_flags: u8,
        bytes: Vec<u8>,
    ) -> Result<Option<(Pending<'d>, Result<Answer>)>> {
        let slot = |cid: u16, pending: &Vec<Pending<'_>>| pending.iter().position(|p| p.cid == cid);
        match header {
            Header::R2t {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                let i = slot(cccid, pending)
                    .ok_or_else(|| InitiatorError::Protocol("R2T for no command".into()))?;
                let data = pending[i].data;
                let range = r2to as usize..(r2to as usize + r2tl as usize);
                if range.end > data.len() {
                    return Err(InitiatorError::Protocol(
                        "R2T past the command's data".into(),
                    ));
                }
                self.send_data(cccid, ttag, &data[range], r2to)?;
                Ok(None)
            }
            Header::C2hData(d) => {
                let i = slot(d.cccid, pending)
                    .ok_or_else(|| InitiatorError::Protocol("C2HData for no command".into()))?;
                if d.datao as usize != pending[i].received.len() {
                    return Err(InitiatorError::Protocol("C2HData out of order".into()));
                }
                if pending[i].received.is_empty() {
                    pending[i].received = bytes;
                } else {
                    pending[i].received.extend_from_slice(&bytes);
                }
                if pdu_flags & flags::SUCCESS == 0 {
                    return Ok(None);
                }
                if pdu_flags & flags::LAST_PDU == 0 {
                    return Err(InitiatorError::Protocol(
                        "C2HData with SUCCESS but not LAST_PDU".into(),
                    ));
                }
                // The command succeeded; no response capsule follows.
                let mut p = pending.swap_remove(i);
                let data = std::mem::take(&mut p.received);
                let completion = Completion::new(d.cccid, Status::SUCCESS);
                Ok(Some((p, Ok(Answer { completion, data }))))
            }
            Header::CapsuleResp(c) => {
                let i = slot(c.cid, pending).ok_or_else(|| {
                    InitiatorError::Protocol("a completion for no command".into())
                })?;
                let mut p = pending.swap_remove(i);
                let data = std::mem::take(&mut p.received);
                let answer = if c.status.is_success() {
                    Ok(Answer {
                        completion: c,
                        data,
                    })
                } else {
                    Err(InitiatorError::Status(c.status))
                };
                Ok(Some((p, answer)))
            }
            Header::C2hTermReq(t) => Err(InitiatorError::Protocol(format!(
                "the target ended the connection: FES {:#x}, FEI {}",
                t.fes, t.fei
            ))),
            other => Err(InitiatorError::Protocol(format!(
                "unexpected PDU {other:?}"
            ))),
        }
    }

    /// Fused Compare-and-Write of whole blocks at `lba`: `new` lands only
    /// if the blocks hold `expected`, with no other write in between.
    /// Returns whether it landed.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: two answers"
    )]
    pub fn compare_and_write(
        &mut self,
        nsid: u32,
        lba: u64,
        expected: &[u8],
        new: &[u8],
        block_bytes: u32,
    ) -> Result<bool> {
        let blocks = (new.len() / block_bytes as usize) as u32;
        let compare = rw(io::COMPARE, nsid, lba, blocks).with_fuse(Fuse::First);
        let write = rw(io::WRITE, nsid, lba, blocks).with_fuse(Fuse::Second);
        let mut answers = self.commands(vec![(compare, expected), (write, new)])?;
        let written = answers.pop().expect("two answers");
        let compared = answers.pop().expect("two answers");
        match (compared, written) {
            (Ok(_), Ok(_)) => Ok(true),
            (Err(InitiatorError::Status(s)), Err(InitiatorError::Status(w)))
                if s == status::COMPARE_FAILURE && w == status::FUSED_FAILED =>
            {
                Ok(false)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    fn send_data(&mut self, cid: u16, ttag: u16, data: &[u8], base: u32) -> Result<()> {
        let chunk = (self.maxh2cdata as usize).max(4096);
        let mut out = Vec::new();
        let pieces = data.chunks(chunk).count();
        for (i, piece) in data.chunks(chunk).enumerate() {
            out.clear();
            let last = if i + 1 == pieces { flags::LAST_PDU } else { 0 };
            self.encoder.encode(
                &Header::H2cData(DataHeader {
                    cccid: cid,
                    ttag,
                    datao: base + (i * chunk) as u32,
                    datal: piece.len() as u32,
                }),
                last,
                piece,
                &mut out,
            );
            self.send(&out)?;
        }
        Ok(())
    }

    /// Fabrics Connect of queue `qid` to controller `cntlid` (0xFFFF: a new
    /// controller, for the admin queue); returns the controller's id.
    pub fn connect(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
        kato_ms: u32,
    ) -> Result<u16> {
        let result = self.connect_result(subnqn, hostnqn, qid, cntlid, kato_ms)?;
        Ok(result as u16)
    }

    /// Fabrics Connect as [`QueueConnection::connect`], then, when the
    /// node asks (ATR), DH-HMAC-CHAP with `secret` — and the node's proof
    /// of `controller` when given. Returns the controller's id.
    #[allow(clippy::too_many_arguments)]
    pub fn connect_authenticated(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
        kato_ms: u32,
        secret: &crate::auth::Secret,
        controller: Option<&crate::auth::Secret>,
    ) -> Result<u16> {
        let result = self.connect_result(subnqn, hostnqn, qid, cntlid, kato_ms)?;
        if result & crate::auth::CONNECT_ATR == 0 {
            return Err(InitiatorError::Protocol(
                "the node did not ask this host to authenticate".into(),
            ));
        }
        self.authenticate(subnqn, hostnqn, secret, controller)?;
        Ok(result as u16)
    }

    fn connect_result(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
        kato_ms: u32,
    ) -> Result<u32> {
        let mut sqe = Sqe::new(FABRICS_OPCODE, 0);
        sqe.0[4] = fctype::CONNECT;
        sqe.0[42..44].copy_from_slice(&qid.to_le_bytes());
        sqe.0[44..46].copy_from_slice(&31u16.to_le_bytes());
        sqe.0[48..52].copy_from_slice(&kato_ms.to_le_bytes());
        if qid != 0 && !self.sq_flow_control {
            sqe.0[46] |= CATTR_DISABLE_SQ_FLOW;
        }
        let mut data = vec![0u8; CONNECT_DATA_BYTES];
        data[16..18].copy_from_slice(&cntlid.to_le_bytes());
        data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        Ok(self.command(sqe, &data)?.completion.result)
    }

    fn auth_send(&mut self, message: &[u8]) -> Result<()> {
        let mut sqe = Sqe::new(FABRICS_OPCODE, 0);
        sqe.0[4] = crate::auth::FCTYPE_SEND;
        sqe.0[41] = 1;
        sqe.0[42] = 1;
        sqe.0[43] = crate::auth::SECP;
        sqe.0[44..48].copy_from_slice(&(message.len() as u32).to_le_bytes());
        self.command(sqe, message).map(|_| ())
    }

    fn auth_receive(&mut self) -> Result<Vec<u8>> {
        const AL: u32 = 4096;
        let mut sqe = Sqe::new(FABRICS_OPCODE, 0).with_sgl(Sgl {
            address: 0,
            length: AL,
            kind: SglKind::Transport,
        });
        sqe.0[4] = crate::auth::FCTYPE_RECEIVE;
        sqe.0[41] = 1;
        sqe.0[42] = 1;
        sqe.0[43] = crate::auth::SECP;
        sqe.0[44..48].copy_from_slice(&AL.to_le_bytes());
        let message = self.command(sqe, &[])?.data;
        if message.len() >= 8 && message[..2] == [0x00, 0xf1] {
            return Err(InitiatorError::Protocol(format!(
                "the node refused this host's authentication (AUTH_Failure1, reason {:#04x})",
                message[7]
            )));
        }
        Ok(message)
    }

    /// DH-HMAC-CHAP on this queue after its Connect ([`crate::auth`]):
    /// offers SHA-256/384/512 and the NULL, ffdhe2048, ffdhe3072 and
    /// ffdhe4096 groups, answers the node's challenge, and with
    /// `controller` checks the node's answer to its own. Returns the DH
    /// group the node took (0: NULL).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 4 bytes"
    )]
    pub fn authenticate(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        secret: &crate::auth::Secret,
        controller: Option<&crate::auth::Secret>,
    ) -> Result<u8> {
        let bad = |what: &str| InitiatorError::Protocol(format!("DH-HMAC-CHAP: {what}"));
        let tid: u16 = 1;
        let mut negotiate = vec![0u8; 8 + 64];
        negotiate[1] = 0x00; // AUTH_Negotiate
        negotiate[4..6].copy_from_slice(&tid.to_le_bytes());
        negotiate[7] = 1; // one protocol descriptor
        negotiate[8] = 0x01; // DH-HMAC-CHAP
        negotiate[10] = 3; // hash functions
        negotiate[11] = 4; // DH groups
        negotiate[12..15].copy_from_slice(&[1, 2, 3]);
        // NULL, ffdhe2048, ffdhe3072, ffdhe4096.
        negotiate[8 + 34..8 + 38].copy_from_slice(&[0, 1, 2, 3]);
        self.auth_send(&negotiate)?;
        let challenge = self.auth_receive()?;
        if challenge.len() < 16 || challenge[..2] != [0x01, 0x01] {
            return Err(bad(
                "the node's answer to AUTH_Negotiate is not a challenge",
            ));
        }
        let hash = crate::auth::Hash::from_id(challenge[8])
            .ok_or_else(|| bad("the challenge names an unknown hash"))?;
        let hl = hash.output_bytes();
        let s1 = u32::from_le_bytes(challenge[12..16].try_into().expect("4 bytes"));
        let dhvlen = u16::from_le_bytes([challenge[10], challenge[11]]) as usize;
        if challenge[6] as usize != hl || challenge.len() < 16 + hl + dhvlen {
            return Err(bad("the challenge's fields do not fit"));
        }
        let c1 = &challenge[16..16 + hl];
        // Under a DH group: this host's public value, and Z to augment the
        // challenges with.
        let (mine, z) = match challenge[9] {
            0 => (Vec::new(), None),
            id => {
                let group = crate::auth::ffdhe::Group::from_id(id)
                    .ok_or_else(|| bad("the challenge names a DH group this host does not run"))?;
                let (x, mine) = group.key_pair().map_err(|e| bad(&e))?;
                let peer = &challenge[16 + hl..16 + hl + dhvlen];
                let z = group.shared(&x, peer).map_err(|e| bad(&e))?;
                (mine, Some(z))
            }
        };
        let augmented = |c: &[u8]| match &z {
            Some(z) => crate::auth::ffdhe::augment(hash, z, c),
            None => c.to_vec(),
        };
        let r1 = crate::auth::host_response(secret, hash, &augmented(c1), s1, tid, hostnqn, subnqn);
        let mut c2 = vec![0u8; hl];
        let s2: u32 = 0x5eed_0001;
        let mut reply = vec![0u8; 16];
        reply[0] = 0x01;
        reply[1] = 0x02;
        reply[4..6].copy_from_slice(&tid.to_le_bytes());
        reply[6] = hl as u8;
        reply.extend_from_slice(&r1);
        if controller.is_some() {
            openssl::rand::rand_bytes(&mut c2).map_err(|e| bad(&e.to_string()))?;
            reply[8] = 1;
            reply[12..16].copy_from_slice(&s2.to_le_bytes());
        }
        reply[10..12].copy_from_slice(&(mine.len() as u16).to_le_bytes());
        reply.extend_from_slice(&c2);
        reply.extend_from_slice(&mine);
        self.auth_send(&reply)?;
        let success = self.auth_receive()?;
        if success.len() < 16 || success[..2] != [0x01, 0x03] {
            return Err(bad("the node's answer to the reply is not Success1"));
        }
        if let Some(secret) = controller {
            let expected = crate::auth::controller_response(
                secret,
                hash,
                &augmented(&c2),
                s2,
                tid,
                hostnqn,
                subnqn,
            );
            if success[8] != 1 || success.len() < 16 + hl || success[16..16 + hl] != expected[..] {
                return Err(bad("the node did not prove it holds the controller secret"));
            }
            let mut success2 = vec![0u8; 16];
            success2[0] = 0x01;
            success2[1] = 0x04;
            success2[4..6].copy_from_slice(&tid.to_le_bytes());
            self.auth_send(&success2)?;
        }
        Ok(challenge[9])
    }

    /// The in-capsule data the controller's I/O queues take (IOCCSZ × 16 −
    /// 64, from Identify Controller), for [`QueueConnection::in_capsule_bytes`]
    /// of its I/O queues; on the admin queue, after `enable`.
    pub fn in_capsule_limit(&mut self) -> Result<usize> {
        let id = self.identify(1, 0)?;
        let ioccsz = sluice_io::codec::u32_at(&id, 1792).unwrap_or_default() as usize;
        Ok((ioccsz * 16).saturating_sub(64))
    }

    /// Property Get of the 4- or 8-byte property at `offset`.
    pub fn property_get(&mut self, offset: u32, eight: bool) -> Result<u64> {
        let mut sqe = Sqe::new(FABRICS_OPCODE, 0);
        sqe.0[4] = fctype::PROPERTY_GET;
        sqe.0[40] = eight as u8;
        sqe.0[44..48].copy_from_slice(&offset.to_le_bytes());
        let c = self.command(sqe, &[])?.completion;
        Ok(c.result as u64 | (c.dw1 as u64) << 32)
    }

    /// Property Set of the 4-byte property at `offset`.
    pub fn property_set(&mut self, offset: u32, value: u32) -> Result<()> {
        let mut sqe = Sqe::new(FABRICS_OPCODE, 0);
        sqe.0[4] = fctype::PROPERTY_SET;
        sqe.0[44..48].copy_from_slice(&offset.to_le_bytes());
        sqe.0[48..52].copy_from_slice(&value.to_le_bytes());
        self.command(sqe, &[]).map(|_| ())
    }

    /// Enables the controller (CC.EN, 64-byte SQEs, 16-byte CQEs) and
    /// checks CSTS.RDY.
    pub fn enable(&mut self) -> Result<()> {
        self.property_set(property::CC, 1 | 6 << 16 | 4 << 20)?;
        match self.property_get(property::CSTS, false)? & 1 {
            1 => Ok(()),
            _ => Err(InitiatorError::Protocol("CSTS.RDY did not come up".into())),
        }
    }

    /// Identify with `cns` for namespace `nsid`: its 4096 bytes.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        let sqe = Sqe::new(admin::IDENTIFY, 0)
            .with_nsid(nsid)
            .with_cdw(10, cns as u32)
            .with_sgl(Sgl {
                address: 0,
                length: 4096,
                kind: SglKind::Transport,
            });
        Ok(self.command(sqe, &[])?.data)
    }

    /// Get Log Page `lid`: its first `len` bytes (a multiple of 4).
    pub fn log_page(&mut self, lid: u8, len: usize) -> Result<Vec<u8>> {
        let dwords = (len / 4).saturating_sub(1) as u32;
        let sqe = Sqe::new(admin::GET_LOG_PAGE, 0)
            .with_cdw(10, lid as u32 | (dwords & 0xffff) << 16)
            .with_cdw(11, dwords >> 16)
            .with_sgl(Sgl {
                address: 0,
                length: len as u32,
                kind: SglKind::Transport,
            });
        Ok(self.command(sqe, &[])?.data)
    }

    /// Set Features Number of Queues; returns the I/O queues granted.
    pub fn set_queue_count(&mut self, queues: u16) -> Result<u16> {
        let n = queues.saturating_sub(1) as u32;
        let sqe = Sqe::new(admin::SET_FEATURES, 0)
            .with_cdw(10, 0x07)
            .with_cdw(11, n | n << 16);
        let r = self.command(sqe, &[])?.completion.result;
        Ok((r as u16).min((r >> 16) as u16) + 1)
    }

    /// Reads `blocks` blocks of `block_bytes` at `lba` of namespace `nsid`.
    pub fn read(&mut self, nsid: u32, lba: u64, blocks: u32, block_bytes: u32) -> Result<Vec<u8>> {
        let sqe = read_sqe(nsid, lba, blocks, block_bytes);
        Ok(self.command(sqe, &[])?.data)
    }

    /// Writes `data` (whole blocks of `block_bytes`) at `lba`.
    pub fn write(&mut self, nsid: u32, lba: u64, data: &[u8], block_bytes: u32) -> Result<()> {
        let blocks = (data.len() / block_bytes as usize) as u32;
        self.command(rw(io::WRITE, nsid, lba, blocks), data)
            .map(|_| ())
    }

    /// Flush of namespace `nsid`.
    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.command(Sqe::new(io::FLUSH, 0).with_nsid(nsid), &[])
            .map(|_| ())
    }

    /// Write Zeroes of `blocks` blocks at `lba`.
    pub fn write_zeroes(&mut self, nsid: u32, lba: u64, blocks: u32) -> Result<()> {
        self.command(rw(io::WRITE_ZEROES, nsid, lba, blocks), &[])
            .map(|_| ())
    }

    /// Sends raw bytes (tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.send(bytes)?;
        Ok(())
    }

    /// The next PDU from the target, whatever it is (tests).
    pub fn receive_any(&mut self) -> Result<(Header, Vec<u8>)> {
        self.receive().map(|(header, _, data)| (header, data))
    }

    /// [`QueueConnection::receive_any`], with the PDU's common header
    /// flags ([`crate::pdu::flags`]).
    pub fn receive_with_flags(&mut self) -> Result<(Header, u8, Vec<u8>)> {
        self.receive()
    }
}

/// A Read, Write, Compare or Write Zeroes entry: SLBA in CDW10–11, blocks
/// (0's based) in CDW12.
pub fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    Sqe::new(opcode, 0)
        .with_nsid(nsid)
        .with_cdw(10, lba as u32)
        .with_cdw(11, (lba >> 32) as u32)
        .with_cdw(12, blocks.saturating_sub(1))
}

/// A Read of `blocks` blocks of `block_bytes` at `lba`, its data to come
/// in C2HData.
pub fn read_sqe(nsid: u32, lba: u64, blocks: u32, block_bytes: u32) -> Sqe {
    rw(io::READ, nsid, lba, blocks).with_sgl(Sgl {
        address: 0,
        length: blocks * block_bytes,
        kind: SglKind::Transport,
    })
}

/// A command sent and not yet answered.
struct Pending<'d> {
    cid: u16,
    /// Its place in the order sent.
    index: usize,
    sent_at: Instant,
    data: &'d [u8],
    received: Vec<u8>,
}

/// Most commands [`QueueConnection::pipeline`] keeps in flight on one queue
/// (the target's queue entries).
pub const MAX_PIPELINE_DEPTH: usize = crate::controller::QUEUE_ENTRIES as usize;

/// The entry with its identifier set and, for data to the node, its SGL:
/// in the capsule up to the in-capsule size, else a transport SGL (the data
/// goes after the target's R2T). Reads keep the SGL their caller set.
fn with_data(sqe: Sqe, cid: u16, len: usize, in_capsule_bytes: usize) -> Sqe {
    let sqe = sqe.with_cid(cid);
    if len == 0 {
        return sqe;
    }
    let kind = if len <= in_capsule_bytes {
        SglKind::InCapsule
    } else {
        SglKind::Transport
    };
    sqe.with_sgl(Sgl {
        address: 0,
        length: len as u32,
        kind,
    })
}

/// Whether an error is the status `want`.
pub fn is_status(e: &InitiatorError, want: Status) -> bool {
    matches!(e, InitiatorError::Status(s) if *s == want)
}
