//! # sluice-auth
//!
//! What every surface of Sluice (the Redis protocol, the HTTP API, the
//! storage node) needs to let a client in, in one place:
//!
//! - [`Secret`]: a password or key read from a file or an environment
//!   variable, never from the command line (where `ps` shows it to every
//!   user of the machine); its `Debug` prints no byte of it.
//! - [`Credentials`]: named secrets (users, API keys), each kept as its
//!   SHA-256 (as Redis's ACL keeps passwords) and compared in constant
//!   time, every entry on every check, so that neither the time of a
//!   refusal nor a memory dump gives a secret away.
//! - [`is_local_peer`]: the one rule of what counts as local — Redis's
//!   protected mode: `127.0.0.1`, `::1` (and a Unix socket, which has no
//!   address) — that the surfaces apply when they are reachable from
//!   elsewhere without credentials.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;

/// A secret that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The file could not be read.
    #[error("cannot read the secret file {path} for {what}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the secret is for (a flag's name).
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file or variable holds nothing usable.
    #[error("{0}")]
    Invalid(String),
}

/// Longest secret file read (a password list of many users fits).
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;

/// A password or key: bytes that are never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// The bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The first line of the file at `path` (one trailing newline, as
    /// `echo` writes, is not part of it). `what` names the flag in errors.
    /// A file others may read is taken, with a warning: the secret is only
    /// as safe as the file.
    pub fn from_file(path: &Path, what: &str) -> Result<Secret, AuthError> {
        let text = read_secret_file(path, what)?;
        let line = text.lines().next().unwrap_or("");
        if line.is_empty() {
            return Err(AuthError::Invalid(format!(
                "{what}: {} is empty: put the secret on its first line",
                path.display()
            )));
        }
        Ok(Secret(line.as_bytes().to_vec()))
    }

    /// The value of environment variable `name`, if set and not empty.
    pub fn from_env(name: &str) -> Option<Secret> {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(|v| Secret(v.into_encoded_bytes()))
    }
}

/// Reads a file of secrets, bounded, warning when others may read it.
pub fn read_secret_file(path: &Path, what: &str) -> Result<String, AuthError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let read_error = |source| AuthError::Read {
        path: path.to_path_buf(),
        what: what.to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mode = file.metadata().map_err(read_error)?.permissions().mode();
    if mode & 0o077 != 0 {
        log::warn!(
            "{what}: {} can be read by others than its owner (mode {:o}): chmod 600 it",
            path.display(),
            mode & 0o777
        );
    }
    let mut text = String::new();
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(AuthError::Invalid(format!(
            "{what}: {} is over {MAX_SECRET_FILE_BYTES} bytes",
            path.display()
        )));
    }
    Ok(text)
}

/// A password as its SHA-256 (as Redis's ACL keeps them): what is kept
/// instead of the password, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
struct PasswordHash([u8; 32]);

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PasswordHash(..)")
    }
}

impl PasswordHash {
    /// The hash of `password`.
    fn of(password: &[u8]) -> PasswordHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, password);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        PasswordHash(bytes)
    }
}

/// A password's SHA-256 as 64 lower-case hex digits: how Redis's ACL
/// keeps passwords (ACL LIST's `#hash`), and so how Sluice's does.
pub fn password_sha256_hex(password: &[u8]) -> String {
    PasswordHash::of(password)
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `offered` equals any of `known`: every one compared, each in
/// time that depends on lengths only.
pub fn any_equal_constant_time<'a>(
    known: impl IntoIterator<Item = &'a [u8]>,
    offered: &[u8],
) -> bool {
    let mut found = subtle::Choice::from(0);
    for k in known {
        found |= k.ct_eq(offered);
    }
    found.into()
}

/// `chars` random hex digits from the system's secure source (ACL
/// GENPASS); None if that source fails.
pub fn random_hex(chars: usize) -> Option<String> {
    use ring::rand::SecureRandom;
    let mut random = vec![0u8; chars.div_ceil(2)];
    ring::rand::SystemRandom::new().fill(&mut random).ok()?;
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    Some(hex[..chars].to_string())
}

/// Named secrets: users and their passwords, or API key ids and keys.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    entries: Vec<(String, PasswordHash)>,
}

impl Credentials {
    /// None: whoever asks is refused.
    pub fn new() -> Credentials {
        Credentials::default()
    }

    /// Adds (or replaces) `name`.
    pub fn insert(&mut self, name: &str, secret: &[u8]) {
        self.entries.retain(|(n, _)| n != name);
        self.entries
            .push((name.to_string(), PasswordHash::of(secret)));
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `name` has an entry (names are not secret).
    pub fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|(n, _)| n == name)
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether `name` is known with `secret`. Every entry is compared, and
    /// each compare takes the same time, so the answer's time says
    /// nothing about which part was wrong.
    pub fn check(&self, name: &str, secret: &[u8]) -> bool {
        let offered = PasswordHash::of(secret);
        let mut found = subtle::Choice::from(0);
        for (n, hash) in &self.entries {
            found |= n.as_bytes().ct_eq(name.as_bytes()) & hash.0.ct_eq(&offered.0);
        }
        found.into()
    }

    /// Entries from a file of `NAME:SECRET` lines (blank lines and lines
    /// starting with `#` skipped); `what` names the flag in errors.
    pub fn from_file(path: &Path, what: &str) -> Result<Credentials, AuthError> {
        let text = read_secret_file(path, what)?;
        let mut credentials = Credentials::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(':') {
                Some((name, secret)) if !name.is_empty() && !secret.is_empty() => {
                    credentials.insert(name, secret.as_bytes())
                }
                _ => {
                    return Err(AuthError::Invalid(format!(
                        "{what}: line {} of {} is not NAME:SECRET (secrets are not printed)",
                        n + 1,
                        path.display()
                    )))
                }
            }
        }
        if credentials.is_empty() {
            return Err(AuthError::Invalid(format!(
                "{what}: {} names nobody: write NAME:SECRET lines",
                path.display()
            )));
        }
        Ok(credentials)
    }
}

/// Whether a peer counts as local, by Redis's rule for protected mode:
/// `127.0.0.1` and `::1` only (an IPv4 address mapped into IPv6 counts as
/// itself). Another address of the loopback range, such as `127.0.0.2`,
/// is not local: a proxy or tunnel may hand its connections over from
/// there.
pub fn is_local_peer(peer: &SocketAddr) -> bool {
    match peer.ip() {
        IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => {
            v6 == std::net::Ipv6Addr::LOCALHOST
                || v6.to_ipv4_mapped() == Some(std::net::Ipv4Addr::LOCALHOST)
        }
    }
}

/// Whether a listening address can be reached only from this machine.
pub fn is_loopback_bind(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_kept_as_their_sha256() {
        // Redis's ACL GETUSER shows this hash for "foo".
        let want = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
        let got: String = PasswordHash::of(b"foo")
            .0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
        assert!(!format!("{:?}", PasswordHash::of(b"foo")).contains("2c26"));
    }

    #[test]
    fn credentials_need_the_name_and_the_secret() {
        let mut c = Credentials::new();
        assert!(!c.check("ann", b"x"));
        c.insert("ann", b"pw1");
        c.insert("bob", b"pw2");
        assert!(c.check("ann", b"pw1"));
        assert!(c.check("bob", b"pw2"));
        assert!(!c.check("ann", b"pw2"));
        assert!(!c.check("carl", b"pw1"));
        c.insert("ann", b"new");
        assert!(!c.check("ann", b"pw1") && c.check("ann", b"new"));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn files_give_secrets_and_say_what_is_wrong() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"hunter2\n")
            .unwrap();
        assert_eq!(
            Secret::from_file(&path, "--x").unwrap().expose(),
            b"hunter2"
        );
        assert!(!format!("{:?}", Secret::from_file(&path, "--x").unwrap()).contains("hunter2"));
        std::fs::write(&path, "\n").unwrap();
        assert!(Secret::from_file(&path, "--x")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        std::fs::write(&path, "# users\nann:one\n\nbob:two:with:colons\n").unwrap();
        let c = Credentials::from_file(&path, "--users").unwrap();
        assert!(c.check("ann", b"one") && c.check("bob", b"two:with:colons"));
        std::fs::write(&path, "ann:one\nnocolon\n").unwrap();
        let e = Credentials::from_file(&path, "--users")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && !e.contains("one"), "{e}");
        let e = Secret::from_file(&dir.path().join("missing"), "--x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing") && e.contains("--x"), "{e}");
    }

    #[test]
    fn only_the_two_loopback_addresses_are_local() {
        let local = |s: &str| is_local_peer(&s.parse().unwrap());
        assert!(local("127.0.0.1:5"));
        assert!(local("[::1]:5"));
        assert!(local("[::ffff:127.0.0.1]:5"));
        assert!(!local("127.0.0.2:5"));
        assert!(!local("10.0.0.1:5"));
        assert!(!local("[::ffff:127.0.0.2]:5"));
    }
}
