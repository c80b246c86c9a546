//! NVMe in-band authentication: DH-HMAC-CHAP (NVMe Base 2.0 §8.13), the
//! controller's side, as the Linux host (`nvme connect --dhchap-secret`)
//! runs it against Linux nvmet.
//!
//! A host named in the node's secrets must prove, on every queue it
//! connects, that it holds its secret: Connect answers with ATR set (bit 17
//! of DW0), and until the exchange is done every command but
//! Authentication Send and Receive is refused with Authentication
//! Required. The exchange, one message per command:
//!
//! 1. Send AUTH_Negotiate: the host's hash functions and DH groups; the node
//!    takes the strongest hash, and a finite-field DH group ([`ffdhe`]:
//!    ffdhe3072 first) or, if the host offers none, the NULL group.
//! 2. Receive DH-HMAC-CHAP_Challenge: a transaction's sequence number S1,
//!    a random challenge C1 of the hash's length, and the node's DH public
//!    value.
//! 3. Send DH-HMAC-CHAP_Reply: R1 = HMAC(Kh, C1' ‖ S1 ‖ T_ID ‖ 0 ‖
//!    "HostHost" ‖ host NQN ‖ 0 ‖ subsystem NQN) — C1' being C1 augmented
//!    with the DH value Z both sides compute (HMAC(H(Z), C1); C1 itself
//!    with the NULL group) — the host's DH public value, and, if the host
//!    wants the node to prove itself too, its own challenge C2 and S2.
//! 4. Receive DH-HMAC-CHAP_Success1 (with R2 = HMAC(Kc, C2 ‖ S2 ‖ T_ID ‖ 0
//!    ‖ "Controller" ‖ subsystem NQN ‖ 0 ‖ host NQN) when asked), or
//!    AUTH_Failure1 with the reason.
//! 5. Send DH-HMAC-CHAP_Success2 when the node proved itself.
//!
//! Secrets are in the DH-HMAC-CHAP secret representation `DHHC-1:hh:
//! base64(key ‖ CRC-32(key)):` (hh: 00 the key as is; 01/02/03 the key
//! transformed by HMAC-SHA-256/384/512 over the NQN and
//! "NVMe-over-Fabrics"). Layouts byte by byte: docs/NVMF.md.

pub mod ffdhe;

use crate::command::{sct, Status};
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// Security protocol of DH-HMAC-CHAP (SECP of Authentication Send and
/// Receive).
pub const SECP: u8 = 0xe9;
/// Authentication Send's fabrics command type.
pub const FCTYPE_SEND: u8 = 0x05;
/// Authentication Receive's fabrics command type.
pub const FCTYPE_RECEIVE: u8 = 0x06;
/// Connect's DW0 bit that asks the host to authenticate (ATR).
pub const CONNECT_ATR: u32 = 1 << 17;
/// A command before the queue authenticated.
pub const AUTH_REQUIRED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x91, true);
/// Longest message a host may ask to receive, or send (a reply with a
/// 4096-bit DH value is 656 bytes).
pub const MAX_MESSAGE_BYTES: usize = 8192;

/// Message types and ids.
mod id {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xf0;
    pub const FAILURE1: u8 = 0xf1;
    /// The protocol descriptor's AUTHID of DH-HMAC-CHAP.
    pub const PROTOCOL_DHCHAP: u8 = 0x01;
    /// The NULL DH group.
    pub const DHGROUP_NULL: u8 = 0x00;
}

/// Why an exchange failed (AUTH_Failure's reason code explanation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// The response did not prove the secret.
    Failed = 0x01,
    /// No protocol the node runs was offered.
    ProtocolUnusable = 0x02,
    /// A secure channel concatenation was asked for.
    ConcatenationMismatch = 0x03,
    /// No hash function the node runs was offered.
    HashUnusable = 0x04,
    /// No DH group the node runs was offered.
    DhGroupUnusable = 0x05,
    /// A message's fields did not fit.
    IncorrectPayload = 0x06,
    /// A message out of turn.
    IncorrectProtocolMessage = 0x07,
}

/// A hash function of DH-HMAC-CHAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// HMAC-SHA-256 (id 1).
    Sha256,
    /// HMAC-SHA-384 (id 2).
    Sha384,
    /// HMAC-SHA-512 (id 3).
    Sha512,
}

impl Hash {
    /// The hash with DH-HMAC-CHAP id `id` (1, 2, 3).
    pub fn from_id(id: u8) -> Option<Hash> {
        match id {
            1 => Some(Hash::Sha256),
            2 => Some(Hash::Sha384),
            3 => Some(Hash::Sha512),
            _ => None,
        }
    }

    fn id(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha384 => 2,
            Hash::Sha512 => 3,
        }
    }

    /// Its output length, bytes.
    pub fn output_bytes(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    fn digest(self) -> MessageDigest {
        match self {
            Hash::Sha256 => MessageDigest::sha256(),
            Hash::Sha384 => MessageDigest::sha384(),
            Hash::Sha512 => MessageDigest::sha512(),
        }
    }
}

/// HMAC of the pieces' concatenation.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: HMAC with a valid digest cannot fail"
)]
fn hmac(hash: Hash, key: &[u8], pieces: &[&[u8]]) -> Vec<u8> {
    let run = || -> Result<Vec<u8>, openssl::error::ErrorStack> {
        let key = PKey::hmac(key)?;
        let mut signer = Signer::new(hash.digest(), &key)?;
        for p in pieces {
            signer.update(p)?;
        }
        signer.sign_to_vec()
    };
    run().expect("HMAC with a valid digest cannot fail")
}

/// A DH-HMAC-CHAP secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
    /// The hash that transforms the key before use; None: used as it is.
    transform: Option<Hash>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.key.len())
    }
}

impl Secret {
    /// Reads `DHHC-1:hh:base64(key ‖ CRC-32):`, as `nvme gen-dhchap-key`
    /// prints it; the error says what is wrong, never the secret.
    pub fn parse(text: &str) -> Result<Secret, String> {
        use base64::Engine;
        let text = text.trim();
        let mut parts = text.split(':');
        let (Some("DHHC-1"), Some(hh), Some(b64)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err("a DH-HMAC-CHAP secret looks like DHHC-1:00:<base64>: (make one with `sluice nvmf gen-dhchap-key` or `nvme gen-dhchap-key`)".into());
        };
        let transform = match hh {
            "00" => None,
            "01" => Some(Hash::Sha256),
            "02" => Some(Hash::Sha384),
            "03" => Some(Hash::Sha512),
            other => {
                return Err(format!(
                    "a DH-HMAC-CHAP secret's hash field is 00, 01, 02 or 03, not {other:?}"
                ))
            }
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("a DH-HMAC-CHAP secret's key is not base64: {e}"))?;
        if !matches!(bytes.len(), 36 | 52 | 68) {
            return Err(format!(
                "a DH-HMAC-CHAP secret holds a key of 32, 48 or 64 bytes and its CRC-32, not {} bytes",
                bytes.len()
            ));
        }
        let (key, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(
                "a DH-HMAC-CHAP secret's CRC-32 does not match its key: it was copied wrong".into(),
            );
        }
        Ok(Secret {
            key: key.to_vec(),
            transform,
        })
    }

    /// A new random secret of `key_bytes` (32, 48 or 64), used as it is
    /// (hh 00), in its text form.
    pub fn generate(key_bytes: usize) -> Result<String, String> {
        use base64::Engine;
        if !matches!(key_bytes, 32 | 48 | 64) {
            return Err(format!(
                "a DH-HMAC-CHAP key is 32, 48 or 64 bytes, not {key_bytes}"
            ));
        }
        let mut key = vec![0u8; key_bytes];
        openssl::rand::rand_bytes(&mut key).map_err(|e| format!("random bytes: {e}"))?;
        let mut bytes = key.clone();
        bytes.extend_from_slice(&crc32fast::hash(&key).to_le_bytes());
        Ok(format!(
            "DHHC-1:00:{}:",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ))
    }

    /// The key HMACs use for `nqn` (the host's NQN for a host secret, the
    /// subsystem's for a controller secret).
    fn key_for(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hmac(h, &self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// A host's secrets: its own, and the node's when the host asks the node
/// to prove itself (bidirectional).
#[derive(Debug, Clone)]
pub struct HostSecrets {
    /// The host's secret.
    pub host: Secret,
    /// The node's secret towards this host.
    pub controller: Option<Secret>,
}

/// One response: HMAC(key, challenge ‖ seq ‖ tid ‖ 0 ‖ kind ‖ nqn1 ‖ 0 ‖ nqn2).
#[allow(clippy::too_many_arguments)]
pub fn response(
    hash: Hash,
    key: &[u8],
    challenge: &[u8],
    seq: u32,
    tid: u16,
    kind: &str,
    nqn1: &str,
    nqn2: &str,
) -> Vec<u8> {
    hmac(
        hash,
        key,
        &[
            challenge,
            &seq.to_le_bytes(),
            &tid.to_le_bytes(),
            &[0],
            kind.as_bytes(),
            nqn1.as_bytes(),
            &[0],
            nqn2.as_bytes(),
        ],
    )
}

/// The host's response to a challenge, as a host computes it (for the
/// initiator and tests).
pub fn host_response(
    secret: &Secret,
    hash: Hash,
    challenge: &[u8],
    seq: u32,
    tid: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    let key = secret.key_for(hostnqn);
    response(hash, &key, challenge, seq, tid, "HostHost", hostnqn, subnqn)
}

/// The node's response to a host's challenge.
pub fn controller_response(
    secret: &Secret,
    hash: Hash,
    challenge: &[u8],
    seq: u32,
    tid: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    let key = secret.key_for(subnqn);
    response(
        hash,
        &key,
        challenge,
        seq,
        tid,
        "Controller",
        subnqn,
        hostnqn,
    )
}

/// Where a queue's exchange stands: what the host is to send or receive
/// next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Send AUTH_Negotiate.
    Negotiate,
    /// Receive the challenge.
    Challenge,
    /// Send the reply.
    Reply,
    /// Receive Success1.
    Success1,
    /// Send Success2.
    Success2,
    /// Receive AUTH_Failure1 with this reason.
    Failure1(Reason),
    /// Authenticated.
    Done,
    /// Failed: the queue serves nothing more.
    Failed,
}

/// A private DH exponent: never printed.
struct Private(openssl::bn::BigNum);

impl std::fmt::Debug for Private {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Private(..)")
    }
}

/// One queue's DH-HMAC-CHAP exchange.
#[derive(Debug)]
pub struct Exchange {
    secrets: HostSecrets,
    hostnqn: String,
    subnqn: String,
    step: Step,
    tid: u16,
    hash: Hash,
    c1: Vec<u8>,
    s1: u32,
    /// The host's challenge to the node, when it asked (C2, S2).
    c2: Option<(Vec<u8>, u32)>,
    /// The DH group taken (None: NULL), the node's private exponent, and Z.
    group: Option<ffdhe::Group>,
    private: Option<Private>,
    z: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Exchange {
    /// The exchange of a queue host `hostnqn` connected to subsystem
    /// `subnqn`.
    pub fn new(secrets: HostSecrets, hostnqn: String, subnqn: String) -> Exchange {
        Exchange {
            secrets,
            hostnqn,
            subnqn,
            step: Step::Negotiate,
            tid: 0,
            hash: Hash::Sha256,
            c1: Vec::new(),
            s1: 0,
            c2: None,
            group: None,
            private: None,
            z: Vec::new(),
        }
    }

    /// A challenge as the responses use it: augmented with Z under a DH
    /// group, as it is under NULL.
    fn augmented(&self, challenge: &[u8]) -> Vec<u8> {
        match self.group {
            Some(_) => ffdhe::augment(self.hash, &self.z, challenge),
            None => challenge.to_vec(),
        }
    }

    /// Whether the host proved its secret (and, if it asked, the node its
    /// own): the queue may serve.
    pub fn authenticated(&self) -> bool {
        self.step == Step::Done
    }

    /// Whether the exchange failed for good.
    pub fn failed(&self) -> bool {
        self.step == Step::Failed
    }

    fn finish(&mut self) {
        log::debug!(
            "DH-HMAC-CHAP: host {} authenticated ({:?}, {}{})",
            self.hostnqn,
            self.hash,
            self.group.map_or("NULL", |g| g.name()),
            if self.c2.is_some() {
                ", and the node to it"
            } else {
                ""
            }
        );
        self.step = Step::Done;
    }

    fn fail(&mut self, reason: Reason) {
        log::warn!(
            "DH-HMAC-CHAP: host {} failed to authenticate: {reason:?}",
            self.hostnqn
        );
        self.step = Step::Failure1(reason);
    }

    /// Authentication Send: the host's message. A message that does not
    /// fit or comes out of turn fails the exchange (the next Receive gets
    /// AUTH_Failure1); the command itself succeeds, as the protocol asks.
    pub fn send(&mut self, msg: &[u8]) {
        if msg.len() < 8 {
            return self.fail(Reason::IncorrectPayload);
        }
        match (msg[0], msg[1], &self.step) {
            (id::COMMON, id::NEGOTIATE, Step::Negotiate) => self.negotiate(msg),
            (id::DHCHAP, id::REPLY, Step::Reply) => self.reply(msg),
            (id::DHCHAP, id::SUCCESS2, Step::Success2) => {
                if u16_at(msg, 4) != self.tid {
                    return self.fail(Reason::IncorrectPayload);
                }
                self.finish();
            }
            (id::COMMON, id::FAILURE2, _) => {
                log::warn!(
                    "DH-HMAC-CHAP: host {} refused the node's proof (reason {:#x})",
                    self.hostnqn,
                    msg[7]
                );
                self.step = Step::Failed;
            }
            _ => self.fail(Reason::IncorrectProtocolMessage),
        }
    }

    fn negotiate(&mut self, msg: &[u8]) {
        const DESCRIPTOR_BYTES: usize = 64;
        self.tid = u16_at(msg, 4);
        let (sc_c, napd) = (msg[6], msg[7] as usize);
        if napd == 0 || msg.len() < 8 + napd * DESCRIPTOR_BYTES {
            return self.fail(Reason::IncorrectPayload);
        }
        if sc_c != 0 {
            return self.fail(Reason::ConcatenationMismatch);
        }
        let descriptor = (0..napd)
            .map(|i| &msg[8 + i * DESCRIPTOR_BYTES..8 + (i + 1) * DESCRIPTOR_BYTES])
            .find(|d| d[0] == id::PROTOCOL_DHCHAP);
        let Some(d) = descriptor else {
            return self.fail(Reason::ProtocolUnusable);
        };
        let (halen, dhlen) = (d[2] as usize, d[3] as usize);
        if halen > 30 || dhlen > 30 {
            return self.fail(Reason::IncorrectPayload);
        }
        let hashes = &d[4..4 + halen];
        let groups = &d[34..34 + dhlen];
        // The strongest hash the host offers.
        let Some(hash) = [Hash::Sha512, Hash::Sha384, Hash::Sha256]
            .into_iter()
            .find(|h| hashes.contains(&h.id()))
        else {
            return self.fail(Reason::HashUnusable);
        };
        self.group = ffdhe::PREFERRED
            .into_iter()
            .find(|g| groups.contains(&g.id));
        if self.group.is_none() && !groups.contains(&id::DHGROUP_NULL) {
            return self.fail(Reason::DhGroupUnusable);
        }
        self.hash = hash;
        self.step = Step::Challenge;
    }

    fn reply(&mut self, msg: &[u8]) {
        let hl = self.hash.output_bytes();
        if msg.len() < 16 || u16_at(msg, 4) != self.tid || msg[6] as usize != hl {
            return self.fail(Reason::IncorrectPayload);
        }
        let (cvalid, dhvlen, s2) = (msg[8], u16_at(msg, 10) as usize, u32_at(msg, 12));
        let want_dhvlen = self.group.map_or(0, |g| g.value_bytes());
        if cvalid > 1
            || dhvlen != want_dhvlen
            || msg.len() < 16 + 2 * hl + dhvlen
            || cvalid == 1 && s2 == 0
        {
            return self.fail(Reason::IncorrectPayload);
        }
        if let (Some(group), Some(private)) = (self.group, &self.private) {
            let peer = &msg[16 + 2 * hl..16 + 2 * hl + dhvlen];
            match group.shared(&private.0, peer) {
                Ok(z) => self.z = z,
                Err(e) => {
                    log::warn!("DH-HMAC-CHAP: host {}: {e}", self.hostnqn);
                    return self.fail(Reason::IncorrectPayload);
                }
            }
        }
        let expected = host_response(
            &self.secrets.host,
            self.hash,
            &self.augmented(&self.c1),
            self.s1,
            self.tid,
            &self.hostnqn,
            &self.subnqn,
        );
        let proved = openssl::memcmp::eq(&expected, &msg[16..16 + hl]);
        if !proved {
            return self.fail(Reason::Failed);
        }
        if cvalid == 1 {
            if self.secrets.controller.is_none() {
                log::warn!(
                    "DH-HMAC-CHAP: host {} asks the node to prove itself, and the node has no controller secret for it",
                    self.hostnqn
                );
                return self.fail(Reason::Failed);
            }
            self.c2 = Some((msg[16 + hl..16 + 2 * hl].to_vec(), s2));
        }
        self.step = Step::Success1;
    }

    /// Authentication Receive: the node's next message, zero-padded to
    /// `al` bytes (the host's buffer).
    pub fn receive(&mut self, al: usize) -> Vec<u8> {
        let msg = match self.step.clone() {
            Step::Challenge => self.challenge(),
            Step::Success1 => self.success1(),
            Step::Failure1(reason) => self.failure1(reason),
            _ => self.failure1(Reason::IncorrectProtocolMessage),
        };
        let mut out = vec![0u8; al.max(msg.len())];
        out[..msg.len()].copy_from_slice(&msg);
        out
    }

    fn challenge(&mut self) -> Vec<u8> {
        let hl = self.hash.output_bytes();
        self.c1 = vec![0u8; hl];
        let mut seq = [0u8; 4];
        if openssl::rand::rand_bytes(&mut self.c1).is_err()
            || openssl::rand::rand_bytes(&mut seq).is_err()
        {
            return self.failure1(Reason::Failed);
        }
        self.s1 = u32::from_le_bytes(seq).max(1);
        let mut public = Vec::new();
        if let Some(group) = self.group {
            match group.key_pair() {
                Ok((x, value)) => {
                    self.private = Some(Private(x));
                    public = value;
                }
                Err(e) => {
                    log::warn!("DH-HMAC-CHAP: {e}");
                    return self.failure1(Reason::Failed);
                }
            }
        }
        let mut m = vec![0u8; 16];
        m[0] = id::DHCHAP;
        m[1] = id::CHALLENGE;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        m[6] = hl as u8;
        m[8] = self.hash.id();
        m[9] = self.group.map_or(id::DHGROUP_NULL, |g| g.id);
        m[10..12].copy_from_slice(&(public.len() as u16).to_le_bytes());
        m[12..16].copy_from_slice(&self.s1.to_le_bytes());
        m.extend_from_slice(&self.c1);
        m.extend_from_slice(&public);
        self.step = Step::Reply;
        m
    }

    fn success1(&mut self) -> Vec<u8> {
        let hl = self.hash.output_bytes();
        let mut m = vec![0u8; 16];
        m[0] = id::DHCHAP;
        m[1] = id::SUCCESS1;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        // HL is set whether or not a response follows (the Linux host reads it).
        m[6] = hl as u8;
        match (&self.c2, &self.secrets.controller) {
            (Some((c2, s2)), Some(secret)) => {
                m[8] = 1;
                m.extend_from_slice(&controller_response(
                    secret,
                    self.hash,
                    &self.augmented(c2),
                    *s2,
                    self.tid,
                    &self.hostnqn,
                    &self.subnqn,
                ));
                self.step = Step::Success2;
            }
            _ => self.finish(),
        }
        m
    }

    fn failure1(&mut self, reason: Reason) -> Vec<u8> {
        let mut m = vec![0u8; 8];
        m[0] = id::COMMON;
        m[1] = id::FAILURE1;
        m[4..6].copy_from_slice(&self.tid.to_le_bytes());
        m[6] = 0x01; // reason code: authentication failure
        m[7] = reason as u8;
        self.step = Step::Failed;
        m
    }
}

/// Checks an Authentication Send or Receive command's protocol fields
/// (SECP, SPSP0, SPSP1) and returns its length (TL or AL).
pub fn command_length(sqe: &crate::command::Sqe) -> Result<usize, Status> {
    let b = &sqe.0;
    if b[43] != SECP || b[41] != 0x01 || b[42] != 0x01 {
        return Err(crate::command::status::INVALID_FIELD);
    }
    let len = u32::from_le_bytes([b[44], b[45], b[46], b[47]]) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(crate::command::status::INVALID_FIELD);
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Known answers, computed with Python's `hmac` and `hashlib`
    /// (independently of this code): key bytes 0..32, C1 bytes 100..132,
    /// S1 0x01020304, T_ID 7.
    #[test]
    fn responses_match_an_independent_computation() {
        let (host, sub) = (
            "nqn.2014-08.org.nvmexpress:uuid:h",
            "nqn.2026-11.io.sluice:s",
        );
        let key: Vec<u8> = (0..32).collect();
        let c1: Vec<u8> = (100..132).collect();
        let plain = Secret {
            key: key.clone(),
            transform: None,
        };
        assert_eq!(
            hex(&host_response(
                &plain,
                Hash::Sha256,
                &c1,
                0x0102_0304,
                7,
                host,
                sub
            )),
            "850f1d0a1844f86b9ab477c01ec218bfdd12827ff826021ce03f07b25dff0a5f"
        );
        // hh 01: the key is first HMAC-SHA-256(key, host NQN ‖ "NVMe-over-Fabrics").
        let transformed =
            Secret::parse("DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:").unwrap();
        assert_eq!(transformed.key, key);
        assert_eq!(
            hex(&host_response(&transformed, Hash::Sha384, &c1, 0x0102_0304, 7, host, sub)),
            "071db543389b129b753ce43c4c05d234b86344d2c126caa1859eccbe3abc68e2a2f86baf61eeb01d06ad370aa192d399"
        );
    }

    /// A host that offers only the NULL group gets it, and its proof is
    /// checked against C1 itself.
    #[test]
    fn the_null_group_is_taken_when_it_is_all_a_host_offers() {
        let text = Secret::generate(32).unwrap();
        let secret = Secret::parse(&text).unwrap();
        let (host, sub) = ("nqn.h", "nqn.s");
        let secrets = HostSecrets {
            host: secret.clone(),
            controller: None,
        };
        let mut exchange = Exchange::new(secrets, host.into(), sub.into());
        let mut negotiate = vec![0u8; 8 + 64];
        negotiate[4] = 9;
        negotiate[7] = 1;
        negotiate[8] = 0x01;
        negotiate[10] = 1;
        negotiate[11] = 1;
        negotiate[12] = 1; // SHA-256
        exchange.send(&negotiate);
        let challenge = exchange.receive(4096);
        assert_eq!(&challenge[..2], &[0x01, 0x01]);
        assert_eq!(
            (challenge[8], challenge[9], challenge[10]),
            (1, 0, 0),
            "SHA-256, NULL, no DH value"
        );
        let s1 = u32::from_le_bytes(challenge[12..16].try_into().unwrap());
        let r1 = host_response(&secret, Hash::Sha256, &challenge[16..48], s1, 9, host, sub);
        let mut reply = vec![0u8; 16];
        reply[0] = 0x01;
        reply[1] = 0x02;
        reply[4] = 9;
        reply[6] = 32;
        reply.extend_from_slice(&r1);
        reply.extend_from_slice(&[0u8; 32]);
        exchange.send(&reply);
        let success = exchange.receive(4096);
        assert_eq!(&success[..2], &[0x01, 0x03]);
        assert!(exchange.authenticated());
    }

    #[test]
    fn secrets_read_back_and_refuse_what_is_wrong() {
        let text = Secret::generate(32).unwrap();
        let secret = Secret::parse(&text).unwrap();
        assert_eq!(secret.key.len(), 32);
        assert_eq!(secret.transform, None);
        assert!(Secret::parse("DHHC-1:00:AAAA:")
            .unwrap_err()
            .contains("32, 48 or 64"));
        let mut broken = text.clone().into_bytes();
        let at = 12;
        broken[at] = if broken[at] == b'A' { b'B' } else { b'A' };
        let err = Secret::parse(std::str::from_utf8(&broken).unwrap()).unwrap_err();
        assert!(err.contains("CRC-32") || err.contains("base64"), "{err}");
        assert!(!err.contains(&text[10..20]), "the error repeats the secret");
        assert!(Secret::parse("DHHC-1:07:x:")
            .unwrap_err()
            .contains("hash field"));
    }
}
