//! TLS for the Redis protocol (`--resp-tls`): rustls over the same ring —
//! received bytes go through the connection's TLS state into the request
//! reader, replies through it into the send buffer.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

/// A TLS listener's certificate chain and key, as rustls holds them.
pub type ServerTlsConfig = Arc<rustls::ServerConfig>;

/// The server's TLS settings: where it listens and its certificate.
#[derive(Clone)]
pub struct TlsSettings {
    /// Where the TLS listener listens (port 0: any free port).
    pub addr: std::net::SocketAddr,
    /// The certificate chain and key, as rustls holds them.
    pub config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Whether clients must show a certificate, and whose signature it needs
/// (Redis's `tls-auth-clients` and `tls-ca-cert-file`).
#[derive(Debug, Clone, Copy)]
pub struct ClientCertificates<'a> {
    /// PEM file of the certificate authorities a client's certificate
    /// must chain to.
    pub ca: &'a Path,
    /// Whether a client without a certificate is refused (`yes`), or let
    /// in while one that shows a bad certificate is refused (`optional`).
    pub required: bool,
}

/// Loads a PEM certificate chain and private key; errors name the file
/// and what is wrong with it. Clients are not asked for certificates.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    load_with_clients(cert, key, None)
}

/// The trust anchors in a PEM file of CA certificates.
fn roots(ca: &Path) -> Result<rustls::RootCertStore, String> {
    let file = std::fs::File::open(ca).map_err(|e| format!("opening {}: {e}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(file)) {
        let cert = cert.map_err(|e| format!("reading certificates from {}: {e}", ca.display()))?;
        roots.add(cert).map_err(|e| {
            format!(
                "a certificate in {} is no CA certificate rustls takes: {e}",
                ca.display()
            )
        })?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----) to check clients against",
            ca.display()
        ));
    }
    Ok(roots)
}

/// [`load`], asking clients for a certificate signed by one of `clients`'
/// CAs (TLS client authentication) when given.
pub fn load_with_clients(
    cert: &Path,
    key: &Path,
    clients: Option<ClientCertificates<'_>>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let open = |p: &Path| {
        std::fs::File::open(p)
            .map(std::io::BufReader::new)
            .map_err(|e| format!("opening {}: {e}", p.display()))
    };
    let certs: Vec<_> = rustls_pemfile::certs(&mut open(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading certificates from {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    }
    let private = rustls_pemfile::private_key(&mut open(key)?)
        .map_err(|e| format!("reading the private key from {}: {e}", key.display()))?
        .ok_or_else(|| format!("{} holds no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?;
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(c.ca)?),
                provider,
            );
            let verifier = if c.required {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| format!("checking clients against {}: {e}", c.ca.display()))?,
            )
        }
    };
    let config = builder.with_single_cert(certs, private).map_err(|e| {
        format!(
            "the key in {} does not fit the certificate in {}: {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(config))
}

/// Most plaintext bytes taken out of one connection's TLS state per read.
const PLAINTEXT_CHUNK_BYTES: usize = 64 << 10;

/// Feeds received ciphertext to `tls` and appends the plaintext it yields
/// to `plaintext`. An error means the connection must close.
pub(super) fn receive(
    tls: &mut rustls::ServerConnection,
    mut ciphertext: &[u8],
    plaintext: &mut Vec<u8>,
) -> Result<(), String> {
    while !ciphertext.is_empty() {
        match tls.read_tls(&mut ciphertext) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        let state = tls.process_new_packets().map_err(|e| e.to_string())?;
        let mut left = state.plaintext_bytes_to_read();
        while left > 0 {
            let n = left.min(PLAINTEXT_CHUNK_BYTES);
            let at = plaintext.len();
            plaintext.resize(at + n, 0);
            tls.reader()
                .read_exact(&mut plaintext[at..])
                .map_err(|e| e.to_string())?;
            left -= n;
        }
    }
    Ok(())
}

/// Encrypts `plaintext` (emptied) and appends every TLS record waiting
/// (handshake, data, alerts) to `ciphertext`.
pub(super) fn send(
    tls: &mut rustls::ServerConnection,
    plaintext: &mut Vec<u8>,
    ciphertext: &mut Vec<u8>,
) -> Result<(), String> {
    if !plaintext.is_empty() {
        tls.writer()
            .write_all(plaintext)
            .map_err(|e| e.to_string())?;
        plaintext.clear();
    }
    while tls.wants_write() {
        tls.write_tls(ciphertext).map_err(|e| e.to_string())?;
    }
    Ok(())
}
