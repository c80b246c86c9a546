//! The handshake: the greeting, option haggling (EXPORT_NAME, GO, INFO,
//! LIST, STRUCTURED_REPLY, STARTTLS) and its one deadline.

use super::{
    opt, protocol, rep, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT, MAX_OPTION_BYTES,
    MAX_REQUEST_BYTES, NBDMAGIC, OPTION_REPLY_MAGIC, TRANSMISSION_FLAGS,
};
use crate::controller::{Namespace, Subsystem};
use std::io::{Read, Write};
use std::net::TcpStream;

/// Shuts a connection's socket at a deadline unless dropped first, so that
/// a phase made of many reads (the handshake) has one deadline, however
/// its bytes trickle in.
pub(super) struct Watchdog {
    disarm: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(super) fn arm(
        stream: &TcpStream,
        limit: std::time::Duration,
        what: &'static str,
    ) -> std::io::Result<Watchdog> {
        let socket = stream.try_clone()?;
        let (disarm, armed) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("nbd-deadline".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = armed.recv_timeout(limit) {
                    log::info!(
                        "NBD client {:?}: {what} not done within {} s; closed",
                        socket.peer_addr().ok(),
                        limit.as_secs()
                    );
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            })?;
        Ok(Watchdog {
            disarm: Some(disarm),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The sender's end wakes the thread at once.
        drop(self.disarm.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A reader and a writer as one stream (the handshake's plain socket).
pub(super) struct Split<R, W> {
    pub(super) r: R,
    pub(super) w: W,
}

impl<R: Read, W> Read for Split<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.r.read(buf)
    }
}

impl<R, W: Write> Write for Split<R, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.w.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Where a connection stands with TLS.
#[derive(Debug, Clone, Copy)]
pub(super) struct TlsState {
    /// The node has a certificate: STARTTLS is accepted.
    pub(super) offered: bool,
    /// The connection runs over TLS now.
    pub(super) active: bool,
    /// Nothing but STARTTLS and ABORT before TLS.
    pub(super) required: bool,
}

/// How option haggling ended.
pub(super) enum Haggled {
    /// Transmission on this namespace, structured replies or not.
    Export(u32, bool),
    /// The client asked for TLS and was told yes: the TLS handshake is next.
    StartTls,
    /// The client ended it.
    Abort,
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn option_reply(w: &mut impl Write, option: u32, reply: u32, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&OPTION_REPLY_MAGIC.to_be_bytes())?;
    w.write_all(&option.to_be_bytes())?;
    w.write_all(&reply.to_be_bytes())?;
    w.write_all(&(data.len() as u32).to_be_bytes())?;
    w.write_all(data)
}

/// The export's namespace and its NSID.
pub(super) fn export<'s>(subsystem: &'s Subsystem, name: &[u8]) -> Option<(u32, &'s Namespace)> {
    let n = match name {
        b"" => 1,
        digits => std::str::from_utf8(digits).ok()?.parse().ok()?,
    };
    Some((n, subsystem.namespace(n)?))
}

pub(super) fn export_size_bytes(ns: &Namespace) -> u64 {
    ns.block_count * ns.block_size_bytes as u64
}

/// The server's greeting and the client's flags: whether the client asked
/// for no zeroes after NBD_OPT_EXPORT_NAME's reply.
pub(super) fn greet(io: &mut (impl Read + Write)) -> std::io::Result<bool> {
    io.write_all(&NBDMAGIC.to_be_bytes())?;
    io.write_all(&IHAVEOPT.to_be_bytes())?;
    io.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())?;
    io.flush()?;
    let client_flags = read_u32(io)?;
    if client_flags & 1 == 0 {
        return Err(protocol("the client does not speak fixed newstyle"));
    }
    Ok(client_flags & 2 != 0)
}

/// Option haggling, until transmission, STARTTLS or the client's end.
pub(super) fn handshake(
    io: &mut (impl Read + Write),
    subsystem: &Subsystem,
    tls: TlsState,
    no_zeroes: bool,
) -> std::io::Result<Haggled> {
    let mut structured = false;
    loop {
        if read_u64(io)? != IHAVEOPT {
            return Err(protocol("an option without IHAVEOPT"));
        }
        let option = read_u32(io)?;
        let len = read_u32(io)?;
        if len > MAX_OPTION_BYTES {
            return Err(protocol("option data past 64 KiB"));
        }
        let mut data = vec![0u8; len as usize];
        io.read_exact(&mut data)?;
        if tls.required && !tls.active && !matches!(option, opt::STARTTLS | opt::ABORT) {
            if option == opt::EXPORT_NAME {
                // No error reply exists for it: the connection ends.
                return Err(protocol(
                    "NBD_OPT_EXPORT_NAME before the TLS this node requires",
                ));
            }
            let why = b"this node requires TLS: send NBD_OPT_STARTTLS first";
            option_reply(io, option, rep::ERR_TLS_REQD, why)?;
            io.flush()?;
            continue;
        }
        match option {
            opt::STARTTLS => {
                let refusal: Option<(u32, &[u8])> = if !data.is_empty() {
                    Some((rep::ERR_INVALID, b"NBD_OPT_STARTTLS carries no data"))
                } else if tls.active {
                    Some((rep::ERR_INVALID, b"TLS is already on"))
                } else if !tls.offered {
                    Some((
                        rep::ERR_POLICY,
                        b"this node serves NBD without TLS (start it with a certificate)",
                    ))
                } else {
                    None
                };
                match refusal {
                    Some((code, why)) => option_reply(io, option, code, why)?,
                    None => {
                        option_reply(io, option, rep::ACK, &[])?;
                        io.flush()?;
                        return Ok(Haggled::StartTls);
                    }
                }
            }
            opt::EXPORT_NAME => {
                let Some((nsid, ns)) = export(subsystem, &data) else {
                    return Err(protocol("NBD_OPT_EXPORT_NAME of an export there is not"));
                };
                io.write_all(&export_size_bytes(ns).to_be_bytes())?;
                io.write_all(&TRANSMISSION_FLAGS.to_be_bytes())?;
                if !no_zeroes {
                    io.write_all(&[0u8; 124])?;
                }
                io.flush()?;
                return Ok(Haggled::Export(nsid, structured));
            }
            opt::ABORT => {
                option_reply(io, option, rep::ACK, &[])?;
                io.flush()?;
                return Ok(Haggled::Abort);
            }
            opt::LIST => {
                for n in 1..=subsystem.namespace_count() {
                    let name = n.to_string();
                    let mut d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name.as_bytes());
                    option_reply(io, option, rep::SERVER, &d)?;
                }
                option_reply(io, option, rep::ACK, &[])?;
            }
            opt::STRUCTURED_REPLY => {
                structured = true;
                option_reply(io, option, rep::ACK, &[])?;
            }
            opt::INFO | opt::GO => {
                let name_len = data
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                let Some(name) = name_len.and_then(|l| data.get(4..4 + l)) else {
                    option_reply(io, option, rep::ERR_INVALID, b"malformed NBD_OPT_GO")?;
                    io.flush()?;
                    continue;
                };
                let Some((nsid, ns)) = export(subsystem, name) else {
                    option_reply(io, option, rep::ERR_UNKNOWN, b"no such export")?;
                    io.flush()?;
                    continue;
                };
                let mut info = vec![0u8, 0];
                info.extend_from_slice(&export_size_bytes(ns).to_be_bytes());
                info.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                option_reply(io, option, rep::INFO, &info)?;
                // NBD_INFO_BLOCK_SIZE: any byte (unaligned requests are
                // served), 1 MiB preferred.
                let mut sizes = vec![0u8, 3];
                sizes.extend_from_slice(&1u32.to_be_bytes());
                sizes.extend_from_slice(&(1u32 << 20).max(ns.block_size_bytes).to_be_bytes());
                sizes.extend_from_slice(&MAX_REQUEST_BYTES.to_be_bytes());
                option_reply(io, option, rep::INFO, &sizes)?;
                option_reply(io, option, rep::ACK, &[])?;
                io.flush()?;
                if option == opt::GO {
                    return Ok(Haggled::Export(nsid, structured));
                }
            }
            _ => {
                option_reply(io, option, rep::ERR_UNSUP, b"option not supported")?;
            }
        }
        io.flush()?;
    }
}
