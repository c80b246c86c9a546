//! The handshake over the Unix socket before the rings: hello, admit
//! (with the region's memfd and eventfd) or refuse.

/// The version of the handshake and the region layout (2: framed rings).
pub const HANDSHAKE_VERSION: u32 = 2;
/// What a client sends first: this, the version u32 LE, flags u32 (0).
pub const HELLO_MAGIC: &[u8; 8] = b"SLUSHMHI";
/// The server's answer admitting a client: this, the version, 0u32, the
/// client id u64 LE; the memfd and the eventfd ride along (SCM_RIGHTS).
pub const ADMIT_MAGIC: &[u8; 8] = b"SLUSHMOK";
/// The server's answer refusing a client: this, the version, the error
/// text's length u32 LE, 0u64, then the text.
pub const REFUSE_MAGIC: &[u8; 8] = b"SLUSHMNO";
/// Bytes of the client's hello.
pub const HELLO_BYTES: usize = 16;
/// Bytes of the server's answer before any error text.
pub const ANSWER_BYTES: usize = 24;
/// Longest refusal text.
pub const MAX_REFUSAL_BYTES: usize = 512;

/// The client's hello.
pub fn hello() -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[..8].copy_from_slice(HELLO_MAGIC);
    out[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out
}

/// Checks a client's hello.
pub fn check_hello(hello: &[u8; HELLO_BYTES]) -> Result<(), String> {
    if &hello[..8] != HELLO_MAGIC {
        return Err("the client's first bytes are not a Sluice shared-memory hello".into());
    }
    let version = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if version != HANDSHAKE_VERSION {
        return Err(format!(
            "the client speaks version {version} of the shared-memory transport; this server speaks {HANDSHAKE_VERSION}"
        ));
    }
    Ok(())
}

/// The answer admitting client `id`.
pub fn admit_answer(id: u64) -> [u8; ANSWER_BYTES] {
    let mut out = [0u8; ANSWER_BYTES];
    out[..8].copy_from_slice(ADMIT_MAGIC);
    out[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out[16..24].copy_from_slice(&id.to_le_bytes());
    out
}

/// The answer refusing a client, with why.
pub fn refuse_answer(text: &str) -> Vec<u8> {
    let text = &text.as_bytes()[..text.len().min(MAX_REFUSAL_BYTES)];
    let mut out = Vec::with_capacity(ANSWER_BYTES + text.len());
    out.extend_from_slice(REFUSE_MAGIC);
    out.extend_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(text);
    out
}

/// A server's answer as the client reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Admitted, with this client id.
    Admitted(u64),
    /// Refused, with why.
    Refused(String),
}

/// Reads a server's answer (`bytes` holds all of it).
pub fn parse_answer(bytes: &[u8]) -> Result<Answer, String> {
    if bytes.len() < ANSWER_BYTES {
        return Err(format!(
            "the server's answer is {} bytes, short of {ANSWER_BYTES}",
            bytes.len()
        ));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != HANDSHAKE_VERSION {
        return Err(format!(
            "the server speaks version {version} of the shared-memory transport; this client speaks {HANDSHAKE_VERSION}"
        ));
    }
    let word = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[16..24]);
    match &bytes[..8] {
        m if m == ADMIT_MAGIC => Ok(Answer::Admitted(u64::from_le_bytes(id))),
        m if m == REFUSE_MAGIC => {
            let text = bytes.get(ANSWER_BYTES..ANSWER_BYTES + word).unwrap_or(&bytes[ANSWER_BYTES..]);
            Ok(Answer::Refused(String::from_utf8_lossy(text).into_owned()))
        }
        _ => Err("the server's answer is not a Sluice shared-memory answer (is the path a Sluice --shm socket?)".into()),
    }
}
