//! NVMe/TCP over TLS 1.3 with pre-shared keys (the NVMe/TCP transport
//! specification's secure channel): the keys, their derivation, and the
//! TLS sessions of both sides.
//!
//! A *configured PSK* is what an administrator hands both sides, in the PSK
//! interchange format `NVMeTLSkey-1:HH:<base64 of key and CRC-32>:` (what
//! `nvme gen-tls-key` prints). `HH` says how it becomes the *retained PSK*
//! of one host: `00` as it is, `01` through HKDF with SHA-256 and the host's
//! NQN. The retained PSK and the *PSK identity* the host offers
//! (`NVMe0R01 <hostnqn> <subnqn>`, or `NVMe1R01 <hostnqn> <subnqn>
//! <digest>`) give the *TLS PSK* the handshake uses. The derivations follow
//! libnvme, the library the Linux host's `nvme connect --tls` uses, byte for
//! byte (its HKDF-Expand-Label puts the output length first, little-endian,
//! and the label and context without their length bytes): a node that
//! followed RFC 8446 to the letter would not agree with the hosts that
//! exist.
//!
//! TLS itself is OpenSSL's: rustls has no external pre-shared keys. With
//! them, OpenSSL's TLS 1.3 takes the cipher suite TLS_AES_128_GCM_SHA256,
//! which is the one the specification requires; SHA-384 keys (`02`) are
//! refused when they are read, with what to use instead.

use crate::poll::PolledStream;
use base64::Engine;
use openssl::ex_data::Index;
use openssl::hash::MessageDigest;
use openssl::md::Md;
use openssl::pkey::{Id, PKey};
use openssl::pkey_ctx::PkeyCtx;
use openssl::sign::Signer;
use openssl::ssl::{
    HandshakeError, Ssl, SslContext, SslMethod, SslMode, SslOptions, SslStream, SslVerifyMode,
    SslVersion,
};
use std::net::TcpStream;

/// Bytes of a SHA-256 PSK (the only hash the node's TLS takes).
pub const PSK_BYTES: usize = 32;
/// The hash specifier of SHA-256 in keys and identities.
const HASH_SHA256: u8 = 1;
/// The cipher suites offered and taken.
const CIPHER_SUITES: &str = "TLS_AES_128_GCM_SHA256";

/// A configured PSK, read from the interchange format.
#[derive(Clone)]
pub struct ConfiguredPsk {
    /// 0: used as the retained PSK; 1: transformed with SHA-256.
    transform: u8,
    key: [u8; PSK_BYTES],
}

impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        write!(f, "ConfiguredPsk(transform {:02})", self.transform)
    }
}

impl ConfiguredPsk {
    /// Reads `NVMeTLSkey-1:HH:<base64>:`, checking its CRC-32.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 4 bytes; 32 bytes"
    )]
    pub fn parse(text: &str) -> Result<ConfiguredPsk, String> {
        let text = text.trim();
        let hint = "make one with `nvme gen-tls-key --hmac=1` or `sluice nvmf gen-tls-key`";
        let rest = text
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or_else(|| format!("a TLS key starts with NVMeTLSkey-1: ({hint})"))?;
        let (transform, rest) = rest
            .split_once(':')
            .ok_or_else(|| format!("a TLS key is NVMeTLSkey-1:HH:<base64>: ({hint})"))?;
        let transform = match transform {
            "00" => 0,
            "01" => HASH_SHA256,
            "02" => {
                return Err(format!(
                    "SHA-384 TLS keys (NVMeTLSkey-1:02:) are not supported: the node's TLS \
                     takes SHA-256 keys ({hint})"
                ))
            }
            other => return Err(format!("unknown key transform {other:?} ({hint})")),
        };
        let encoded = rest
            .strip_suffix(':')
            .ok_or_else(|| format!("a TLS key ends with ':' ({hint})"))?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| format!("the TLS key's base64 does not decode: {e}"))?;
        if raw.len() == 48 + 4 {
            return Err(format!(
                "48-byte TLS keys (SHA-384) are not supported: the node's TLS takes 32-byte \
                 keys ({hint})"
            ));
        }
        if raw.len() != PSK_BYTES + 4 {
            return Err(format!(
                "a TLS key holds 32 bytes and a CRC-32, this one {} bytes ({hint})",
                raw.len()
            ));
        }
        let (key, crc) = raw.split_at(PSK_BYTES);
        let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        let got = crc32fast::hash(key);
        if got != want {
            return Err(format!(
                "the TLS key's CRC-32 does not match (a character changed?): it says \
                 {want:08x}, the key gives {got:08x}"
            ));
        }
        Ok(ConfiguredPsk {
            transform,
            key: key.try_into().expect("32 bytes"),
        })
    }

    /// A new random key, transformed with SHA-256 (as `nvme gen-tls-key
    /// --hmac=1` makes).
    pub fn generate() -> Result<ConfiguredPsk, String> {
        let mut key = [0u8; PSK_BYTES];
        openssl::rand::rand_bytes(&mut key).map_err(|e| e.to_string())?;
        Ok(ConfiguredPsk {
            transform: HASH_SHA256,
            key,
        })
    }

    /// The key in the interchange format.
    pub fn interchange(&self) -> String {
        let mut raw = self.key.to_vec();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "NVMeTLSkey-1:{:02}:{}:",
            self.transform,
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// The retained PSK of `hostnqn`.
    fn retained(&self, hostnqn: &str) -> Result<[u8; PSK_BYTES], String> {
        if self.transform == 0 {
            return Ok(self.key);
        }
        expand_label(&self.key, b"HostNQN", hostnqn.as_bytes())
    }

    /// The TLS PSK a host offering `identity` uses, or why it has none.
    pub fn tls_psk(&self, identity: &PskIdentity) -> Result<[u8; PSK_BYTES], String> {
        if identity.hash != HASH_SHA256 {
            return Err(format!(
                "the host offers a PSK with hash {:02}; the node takes 01 (SHA-256)",
                identity.hash
            ));
        }
        let retained = self.retained(&identity.hostnqn)?;
        match (&identity.digest, identity.version) {
            (None, 0) => expand_label(&retained, b"nvme-tls-psk", identity.text().as_bytes()),
            (Some(digest), 1) => {
                let ours = psk_digest(&retained, &identity.hostnqn, &identity.subnqn)?;
                if *digest != ours {
                    return Err("the identity's PSK digest is not this key's: the host \
                                holds another key"
                        .into());
                }
                let mut context = b"01 ".to_vec();
                context.extend_from_slice(digest.as_bytes());
                expand_label(&retained, b"nvme-tls-psk", &context)
            }
            _ => Err(format!(
                "PSK identity version {} is not one the node knows",
                identity.version
            )),
        }
    }

    /// The identity (version 1, with its digest) and TLS PSK a host
    /// `hostnqn` offers to subsystem `subnqn`.
    pub fn host_identity(
        &self,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<(PskIdentity, [u8; PSK_BYTES]), String> {
        let retained = self.retained(hostnqn)?;
        let identity = PskIdentity {
            version: 1,
            hash: HASH_SHA256,
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            digest: Some(psk_digest(&retained, hostnqn, subnqn)?),
        };
        let psk = self.tls_psk(&identity)?;
        Ok((identity, psk))
    }
}

/// HKDF-Extract (no salt) then HKDF-Expand with SHA-256 to 32 bytes, with
/// the info as libnvme writes it: the length (2 bytes, little-endian),
/// `tls13 `, the label, the context.
fn expand_label(key: &[u8], label: &[u8], context: &[u8]) -> Result<[u8; PSK_BYTES], String> {
    let failed = |e: openssl::error::ErrorStack| format!("HKDF: {e}");
    let mut ctx = PkeyCtx::new_id(Id::HKDF).map_err(failed)?;
    ctx.derive_init().map_err(failed)?;
    ctx.set_hkdf_md(Md::sha256()).map_err(failed)?;
    ctx.set_hkdf_key(key).map_err(failed)?;
    ctx.add_hkdf_info(&(PSK_BYTES as u16).to_le_bytes())
        .map_err(failed)?;
    ctx.add_hkdf_info(b"tls13 ").map_err(failed)?;
    ctx.add_hkdf_info(label).map_err(failed)?;
    ctx.add_hkdf_info(context).map_err(failed)?;
    let mut out = [0u8; PSK_BYTES];
    let n = ctx.derive(Some(&mut out)).map_err(failed)?;
    assert_eq!(n, PSK_BYTES, "HKDF gives the length asked for");
    Ok(out)
}

/// The PSK digest of a version-1 identity: base64 of HMAC-SHA-256 keyed
/// with the retained PSK over `<hostnqn> <subnqn> NVMe-over-Fabrics`.
fn psk_digest(retained: &[u8], hostnqn: &str, subnqn: &str) -> Result<String, String> {
    let failed = |e: openssl::error::ErrorStack| format!("HMAC: {e}");
    let key = PKey::hmac(retained).map_err(failed)?;
    let mut signer = Signer::new(MessageDigest::sha256(), &key).map_err(failed)?;
    for part in [hostnqn, " ", subnqn, " ", "NVMe-over-Fabrics"] {
        signer.update(part.as_bytes()).map_err(failed)?;
    }
    let mac = signer.sign_to_vec().map_err(failed)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(mac))
}

/// A PSK identity: `NVMe<v>R<hh> <hostnqn> <subnqn>[ <digest>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    /// 0 (NVMe/TCP 1.0c) or 1 (with the PSK digest).
    pub version: u8,
    /// The hash of the PSK's cipher suite: 1 SHA-256, 2 SHA-384.
    pub hash: u8,
    /// The host's NQN.
    pub hostnqn: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Version 1's PSK digest.
    pub digest: Option<String>,
}

impl PskIdentity {
    /// Reads an identity a host offered.
    pub fn parse(bytes: &[u8]) -> Result<PskIdentity, String> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| "a PSK identity that is not UTF-8".to_string())?;
        let mut fields = text.split(' ');
        let head = fields.next().unwrap_or_default().as_bytes();
        let digit = |b: Option<&u8>| match b {
            Some(d @ b'0'..=b'9') => Ok(d - b'0'),
            _ => Err(format!("{text:?} is not an NVMe PSK identity")),
        };
        if head.len() != 8 || &head[..4] != b"NVMe" || head[5] != b'R' {
            return Err(format!("{text:?} is not an NVMe PSK identity"));
        }
        let version = digit(head.get(4))?;
        let hash = digit(head.get(6))? * 10 + digit(head.get(7))?;
        let hostnqn = fields.next().unwrap_or_default().to_string();
        let subnqn = fields.next().unwrap_or_default().to_string();
        let digest = fields.next().map(str::to_string);
        if hostnqn.is_empty() || subnqn.is_empty() || fields.next().is_some() {
            return Err(format!(
                "{text:?}: an identity names a host and a subsystem"
            ));
        }
        if (version == 1) != digest.is_some() {
            return Err(format!(
                "{text:?}: version 1 identities, and only they, end with a digest"
            ));
        }
        Ok(PskIdentity {
            version,
            hash,
            hostnqn,
            subnqn,
            digest,
        })
    }

    /// The identity as sent.
    pub fn text(&self) -> String {
        let mut s = format!(
            "NVMe{}R{:02} {} {}",
            self.version, self.hash, self.hostnqn, self.subnqn
        );
        if let Some(d) = &self.digest {
            s.push(' ');
            s.push_str(d);
        }
        s
    }
}

/// Settings both sides share.
fn context_builder(method: SslMethod) -> Result<openssl::ssl::SslContextBuilder, String> {
    let failed = |e: openssl::error::ErrorStack| format!("TLS set-up: {e}");
    let mut b = SslContext::builder(method).map_err(failed)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))
        .map_err(failed)?;
    b.set_ciphersuites(CIPHER_SUITES).map_err(failed)?;
    // No resumption: every connection authenticates with the PSK.
    b.set_options(SslOptions::NO_TICKET);
    b.set_num_tickets(0).map_err(failed)?;
    Ok(b)
}

/// The node's side: takes hosts whose identity names this subsystem and
/// whose key derives from the configured PSK.
pub struct TlsServer {
    context: SslContext,
    host_index: Index<Ssl, String>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

impl TlsServer {
    /// A server for subsystem `subnqn` with `psk`.
    pub fn new(psk: ConfiguredPsk, subnqn: String) -> Result<TlsServer, String> {
        let host_index = Ssl::new_ex_index::<String>().map_err(|e| e.to_string())?;
        let mut b = context_builder(SslMethod::tls_server())?;
        // Sessions are served non-blocking by the workers: a write the
        // socket cannot take whole returns what went (ENABLE_PARTIAL_WRITE),
        // and its retry may come from another address with the same bytes
        // at the front (ACCEPT_MOVING_WRITE_BUFFER).
        b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
        b.set_psk_server_callback(move |ssl, identity, out| {
            let offered = identity.unwrap_or_default();
            let found = PskIdentity::parse(offered).and_then(|id| {
                if id.subnqn != subnqn {
                    return Err(format!("the identity names subsystem {}", id.subnqn));
                }
                psk.tls_psk(&id).map(|key| (id, key))
            });
            match found {
                Ok((id, key)) => {
                    out[..key.len()].copy_from_slice(&key);
                    ssl.set_ex_data(host_index, id.hostnqn);
                    Ok(key.len())
                }
                Err(e) => {
                    log::warn!(
                        "TLS: refusing PSK identity {:?}: {e}",
                        String::from_utf8_lossy(offered)
                    );
                    // No key: the handshake fails with an alert.
                    Ok(0)
                }
            }
        });
        Ok(TlsServer {
            context: b.build(),
            host_index,
        })
    }

    /// Runs the handshake on `stream`; returns the session (its socket
    /// read with polling) and the host NQN its identity named.
    pub fn accept(&self, stream: TcpStream) -> Result<(SslStream<PolledStream>, String), String> {
        let ssl = Ssl::new(&self.context).map_err(|e| e.to_string())?;
        let tls = finish(ssl.accept(PolledStream::new(stream)))?;
        let host = tls
            .ssl()
            .ex_data(self.host_index)
            .cloned()
            .ok_or("TLS without a PSK (the node takes no other kind)")?;
        Ok((tls, host))
    }
}

/// A host's side, for the node's own initiator.
pub struct TlsClient {
    context: SslContext,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsClient")
    }
}

impl TlsClient {
    /// A client offering `psk`'s version-1 identity as `hostnqn` to
    /// subsystem `subnqn`.
    pub fn new(psk: &ConfiguredPsk, hostnqn: &str, subnqn: &str) -> Result<TlsClient, String> {
        let (identity, key) = psk.host_identity(hostnqn, subnqn)?;
        let identity = identity.text();
        let mut b = context_builder(SslMethod::tls_client())?;
        // The PSK authenticates the node; it has no certificate.
        b.set_verify(SslVerifyMode::NONE);
        b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
            let id = identity.as_bytes();
            if id.len() + 1 > id_out.len() || key.len() > key_out.len() {
                return Ok(0);
            }
            id_out[..id.len()].copy_from_slice(id);
            id_out[id.len()] = 0;
            key_out[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
        Ok(TlsClient { context: b.build() })
    }

    /// Runs the handshake on `stream`; the session's socket is read with
    /// polling.
    pub fn connect(&self, stream: TcpStream) -> Result<SslStream<PolledStream>, String> {
        let ssl = Ssl::new(&self.context).map_err(|e| e.to_string())?;
        let tls = finish(ssl.connect(PolledStream::new(stream)))?;
        // A server that took no PSK would have needed a certificate the
        // client does not check: only a PSK session is a session.
        if !tls.ssl().session_reused() {
            return Err("the node did not take the PSK".into());
        }
        Ok(tls)
    }
}

/// Most times a handshake resumes after a signal interrupted it.
const MAX_HANDSHAKE_RESUMES: usize = 100;

/// The handshake's end: resumed where a signal interrupted a system call
/// of it, else its session or why it failed.
fn finish<S: std::io::Read + std::io::Write>(
    mut result: Result<SslStream<S>, HandshakeError<S>>,
) -> Result<SslStream<S>, String> {
    for _ in 0..MAX_HANDSHAKE_RESUMES {
        match result {
            Err(HandshakeError::Failure(mid)) | Err(HandshakeError::WouldBlock(mid))
                if mid
                    .error()
                    .io_error()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::Interrupted) =>
            {
                result = mid.handshake();
            }
            other => return other.map_err(handshake_error),
        }
    }
    result.map_err(handshake_error)
}

fn handshake_error<S>(e: HandshakeError<S>) -> String {
    match e {
        HandshakeError::SetupFailure(e) => format!("TLS set-up: {e}"),
        HandshakeError::Failure(m) | HandshakeError::WouldBlock(m) => {
            let e = m.error();
            match e.ssl_error() {
                Some(stack) => format!("TLS handshake: {stack}"),
                None => format!("TLS handshake: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host1";
    const SUB: &str = "nqn.2026-11.io.sluice:tls";

    #[test]
    fn interchange_round_trips_and_checks_its_crc() {
        let k = ConfiguredPsk::generate().unwrap();
        let text = k.interchange();
        assert_eq!(text.len(), 65, "{text}");
        let back = ConfiguredPsk::parse(&text).unwrap();
        assert_eq!(back.key, k.key);
        assert_eq!(back.transform, 1);
        // One base64 character changed: the CRC catches it.
        let mut bad = text.into_bytes();
        bad[20] = if bad[20] == b'A' { b'B' } else { b'A' };
        let e = ConfiguredPsk::parse(std::str::from_utf8(&bad).unwrap()).unwrap_err();
        assert!(e.contains("CRC-32"), "{e}");
        for (text, says) in [
            ("NVMeTLSkey-1:02:xx:", "SHA-384"),
            ("NVMeTLSkey-2:01:xx:", "starts with"),
            ("NVMeTLSkey-1:01:!!!!:", "base64"),
        ] {
            let e = ConfiguredPsk::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn identities_parse_and_print() {
        let id = PskIdentity::parse(format!("NVMe0R01 {HOST} {SUB}").as_bytes()).unwrap();
        assert_eq!((id.version, id.hash, id.digest.clone()), (0, 1, None));
        assert_eq!(id.text(), format!("NVMe0R01 {HOST} {SUB}"));
        let v1 = PskIdentity::parse(format!("NVMe1R01 {HOST} {SUB} abc=").as_bytes()).unwrap();
        assert_eq!(v1.digest.as_deref(), Some("abc="));
        for bad in [
            "NVMe1R01 h s".to_string(),
            format!("NVMe0R01 {HOST} {SUB} extra"),
            "Client_identity".into(),
            "NVMe0R01 onlyhost".into(),
        ] {
            assert!(PskIdentity::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_tls_psk_depends_on_host_subsystem_and_key() {
        let k = ConfiguredPsk::generate().unwrap();
        let (id, psk) = k.host_identity(HOST, SUB).unwrap();
        assert_eq!(k.tls_psk(&id).unwrap(), psk);
        let (_, other_host) = k
            .host_identity("nqn.2014-08.org.nvmexpress:uuid:h2", SUB)
            .unwrap();
        assert_ne!(other_host, psk);
        let v0 = PskIdentity {
            version: 0,
            digest: None,
            ..id.clone()
        };
        assert_ne!(k.tls_psk(&v0).unwrap(), psk);
        // Another key gives another digest: refused, not a wrong PSK.
        let other = ConfiguredPsk::generate().unwrap();
        assert!(other.tls_psk(&id).unwrap_err().contains("another key"));
    }
}
