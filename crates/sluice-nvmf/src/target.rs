//! The NVMe/TCP target: accepts hosts' connections, runs the ICReq/ICResp
//! exchange, frames their PDUs, moves command data (in-capsule, or asked
//! for with R2T and received in H2CData; read data out in C2HData) and hands
//! each command to its queue ([`crate::controller::Queue`]).
//!
//! Connections (a host opens one per queue) are served thread per core by
//! the workers (`crate::worker`), each connection a non-blocking
//! `Connection::turn` at a time; a TLS connection's handshake runs on the
//! thread that took it in, then a worker serves it like the others. Limits on
//! connections, data per PDU and time without a keep-alive. Malformed PDUs
//! end the connection with a C2HTermReq naming the error.

pub use crate::admission::{Counted, SetupSlots};
use crate::connection::{Connection, Receiving};
pub use crate::connection::{MAXH2CDATA, MAX_PENDING_WRITES, SEND_TIMEOUT, SETUP_TIMEOUT};
use crate::controller::{Queue, Subsystem};
use crate::session::{Begin, Session};
use crate::tls::TlsServer;
use crate::wire::Wire;
use crate::worker::{Handoff, Workers};
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most connections at once (each queue of each host is one).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// How often a blocked connection looks at the clock and the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How the target serves.
#[derive(Clone)]
pub struct TargetConfig {
    /// Most connections at once.
    pub max_connections: usize,
    /// TLS with pre-shared keys: hosts that begin with a TLS handshake.
    pub tls: Option<Arc<TlsServer>>,
    /// Refuse hosts that do not begin with TLS.
    pub tls_required: bool,
    /// Threads serving the connections (each serves many), TLS ones
    /// included: one per core by default.
    pub workers: usize,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            tls: None,
            tls_required: false,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// The first byte of a TLS handshake record; an NVMe/TCP host's first PDU
/// (ICReq) begins with 0.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Accepts connections on `listener` until `stop` is set, served by
/// [`TargetConfig::workers`] threads (a TLS one after its handshake).
pub fn serve(
    listener: TcpListener,
    subsystem: Arc<Subsystem>,
    config: TargetConfig,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let stop_flag = stop.clone();
    let max_connections = config.max_connections;
    let workers = Arc::new(Workers::start(
        config.workers.max(1),
        subsystem.clone(),
        stop.clone(),
        "nvmf-worker",
    )?);
    let handing = workers.clone();
    let result = accept_loop(
        listener,
        max_connections,
        stop,
        "nvmf-conn",
        move |stream, counted| {
            serve_connection(stream, counted, &config, &handing, &stop_flag)
                .map_err(std::io::Error::other)
        },
    );
    workers.join();
    result
}

/// Serves one host: over TLS when it begins with a handshake (and the node
/// has a key), else plain (unless TLS is required).
fn serve_connection(
    stream: TcpStream,
    counted: Counted,
    config: &TargetConfig,
    workers: &Workers,
    stop: &AtomicBool,
) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    stream.set_nodelay(true).map_err(io)?;
    stream.set_read_timeout(Some(POLL_INTERVAL)).map_err(io)?;
    // A host that stops reading its answers must not hold this
    // connection's writes in flight (and with them a Compare-and-Write of
    // another host) for ever.
    stream.set_write_timeout(Some(SEND_TIMEOUT)).map_err(io)?;
    let plain = |stream, counted| {
        let handoff = Handoff {
            wire: Wire::Plain(stream),
            counted,
            begin: nvme_session(None),
        };
        workers.hand(handoff).map_err(io)
    };
    let Some(tls) = &config.tls else {
        return plain(stream, counted);
    };
    match first_byte(&stream, stop)? {
        None => Ok(()),
        Some(TLS_HANDSHAKE_RECORD) => {
            stream.set_read_timeout(Some(SETUP_TIMEOUT)).map_err(io)?;
            let (session, host) = tls.accept(stream)?;
            log::debug!("TLS: host {host} authenticated with its PSK");
            let handoff = Handoff {
                wire: Wire::tls(session).map_err(io)?,
                counted,
                begin: nvme_session(Some(host)),
            };
            workers.hand(handoff).map_err(io)
        }
        Some(_) if config.tls_required => {
            Err("a host began without TLS; the node requires it (--nvme-tls require)".into())
        }
        Some(_) => plain(stream, counted),
    }
}

/// How a host's connection begins on its worker: a queue before its ICReq;
/// `host` is the NQN a TLS session authenticated with its pre-shared key.
fn nvme_session(host: Option<String>) -> Begin {
    Box::new(move |subsystem, completions| {
        let queue = match host {
            Some(host) => Queue::authenticated(subsystem, host),
            None => Queue::new(subsystem),
        };
        Box::new(NvmeSession {
            conn: Connection::new(queue, completions),
            rx: Receiving::new(),
        })
    })
}

/// An NVMe/TCP queue on a worker: the connection and its receive side.
struct NvmeSession {
    conn: Connection,
    rx: Receiving,
}

impl Session for NvmeSession {
    fn turn(&mut self, wire: &mut Wire) -> Result<bool, Result<(), String>> {
        self.conn.turn(wire, &mut self.rx)
    }
    fn busy_at_device(&self) -> bool {
        self.conn.busy_at_device()
    }
    fn signals_completions(&self) -> bool {
        self.conn.signals_completions()
    }
    fn wait_for_device(&mut self) {
        self.conn.wait_for_device();
    }
    fn has_unsent(&self) -> bool {
        self.conn.has_unsent()
    }
    fn held(&self) -> bool {
        self.rx.held()
    }
    fn expired(&self) -> Option<String> {
        self.conn.expired(&self.rx)
    }
    fn has_deferred(&self) -> bool {
        self.conn.has_deferred()
    }
    /// An admin queue's (or a queue's not connected yet).
    fn runs_on_worker(&self) -> bool {
        self.conn.is_admin()
    }
    fn run_deferred(&mut self) {
        self.conn.run_deferred();
    }
    fn drain_device(&mut self) {
        self.conn.drain_device();
    }
    /// A host's Connect made its queue part of a controller.
    fn is_connected(&self) -> bool {
        self.conn.is_connected()
    }
    /// The host's ICReq came.
    fn initialized(&self) -> bool {
        self.conn.initialized()
    }
    fn close(self: Box<Self>) {
        self.conn.close();
    }
}

/// The first byte the host sends, left in the socket; `None` if it closes
/// first. Waits up to [`SETUP_TIMEOUT`] (the stream's read timeout is the
/// polling interval).
fn first_byte(stream: &TcpStream, stop: &AtomicBool) -> Result<Option<u8>, String> {
    let opened = Instant::now();
    let mut byte = [0u8; 1];
    loop {
        match stream.peek(&mut byte) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(byte[0])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                if opened.elapsed() > SETUP_TIMEOUT {
                    return Err(format!(
                        "nothing sent within {} s of connecting",
                        SETUP_TIMEOUT.as_secs()
                    ));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("receiving: {e}")),
        }
    }
}

/// Bytes waiting at accept that show a peer talking: NVMe/TCP's common
/// header (a TLS record header and more are as long).
const TALKING_BYTES: usize = 8;

/// How long the accept loop waits for a connection before it looks at
/// its stop flag again.
const ACCEPT_WAIT: Duration = Duration::from_millis(100);

/// The share of the connection limit that connections still setting up
/// may take (a quarter, at least one).
pub fn setup_slots_for(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// The accept loop of every front end of the node: until `stop` is set,
/// each connection on a thread of its own running `handle`, at most
/// `max_connections` at once, of which at most a quarter still setting up
/// (see [`SetupSlots`]: the oldest of those is closed to make room; with
/// every connection set up, a newcomer is closed at once, with a log line).
pub fn accept_loop<H>(
    listener: TcpListener,
    max_connections: usize,
    stop: Arc<AtomicBool>,
    thread_name: &str,
    handle: H,
) -> std::io::Result<()>
where
    H: Fn(TcpStream, Counted) -> std::io::Result<()> + Send + Sync + 'static,
{
    listener.set_nonblocking(true)?;
    let open = Arc::new(AtomicUsize::new(0));
    let setups = Arc::new(SetupSlots::new(
        setup_slots_for(max_connections),
        open.clone(),
    ));
    let handle = Arc::new(handle);
    while !stop.load(Ordering::Relaxed) {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Woken the moment a connection arrives (a sleep here put
                // up to its length on every session's setup); `stop` is
                // looked at each interval.
                use std::os::fd::AsFd;
                sluice_io::shm::wait_readable(listener.as_fd(), ACCEPT_WAIT)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        // Room for the newcomer: the oldest connection still setting up
        // goes when setups are at their limit, or when every connection is
        // taken; with every connection past its setup, the newcomer goes.
        if (setups.len() >= setups.max || open.load(Ordering::Relaxed) >= max_connections)
            && !setups.close_oldest()
        {
            log::warn!("refusing a connection: {max_connections} open, the limit");
            drop(stream);
            continue;
        }
        // A host that sent a whole header (ICReq, a TLS record) before it
        // was accepted is talking already.
        let talking = stream.set_nonblocking(true).is_ok()
            && stream
                .peek(&mut [0u8; TALKING_BYTES])
                .is_ok_and(|n| n >= TALKING_BYTES);
        // Accepted sockets do not inherit the listener's O_NONBLOCK on Linux;
        // said anyway, and a failure here is the connection's alone.
        let _ = stream.set_nonblocking(false);
        let Ok(handle_to_close) = stream.try_clone() else {
            continue;
        };
        let counted = setups.enter(handle_to_close, talking);
        let handle = handle.clone();
        std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                if let Err(e) = handle(stream, counted) {
                    log::info!("connection from {peer} ended: {e}");
                }
            })?;
    }
    Ok(())
}
