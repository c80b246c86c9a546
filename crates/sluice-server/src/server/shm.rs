//! The shared-memory transport's front door (`sluice serve --shm PATH`):
//! a Unix socket where a local client asks for its rings.
//!
//! One acceptor thread takes connections, checks the handshake and the
//! client limits, makes the client's sealed memfd (`sluice_io::shm`) and
//! hands it back with the eventfd of the worker chosen for it (the least
//! loaded); the worker then polls the client's request ring from its
//! loop. The socket stays open for the client's life: its hang-up is how
//! a dead client is seen, and its rings are then reclaimed.
//!
//! The handshake is `sluice_io::shm`'s (docs/FORMAT.md, "Shared-memory
//! transport"); a refusal carries Redis's own error text where it has one.

use super::Shared;
use sluice_io::net::Waker;
use sluice_io::readiness::{Interest, Poller};
use sluice_io::shm::{self, ShmChannel, ShmRegion, Side};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connecting client may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the acceptor looks at the shutdown flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// How the shared-memory transport runs.
#[derive(Debug, Clone)]
pub struct ShmSettings {
    /// The Unix socket clients connect to.
    pub path: PathBuf,
    /// The socket's permission bits: who may connect.
    pub mode: u32,
    /// Most shared-memory clients at once (they count toward
    /// `maxclients` too).
    pub max_clients: usize,
    /// Bytes of each client's request ring (a power of two).
    pub request_ring_bytes: usize,
    /// Bytes of each client's response ring (a power of two).
    pub response_ring_bytes: usize,
}

impl ShmSettings {
    /// Defaults for a socket at `path`.
    pub fn at(path: impl Into<PathBuf>) -> ShmSettings {
        ShmSettings {
            path: path.into(),
            mode: 0o660,
            max_clients: 1024,
            request_ring_bytes: 1 << 20,
            response_ring_bytes: 1 << 20,
        }
    }
}

/// A client handed from the acceptor to a worker.
pub(super) struct Arrival {
    pub(super) channel: ShmChannel,
    pub(super) sock: UnixStream,
    pub(super) id: u64,
    pub(super) pid: i32,
}

/// A worker's side of the hand-over.
pub(super) struct WorkerInbox {
    pub(super) waker: Arc<Waker>,
    pub(super) arrivals: Mutex<Vec<Arrival>>,
    /// Whether `arrivals` may hold any: the worker looks every turn, so
    /// an empty inbox costs one load, not a lock.
    waiting: AtomicBool,
    /// Shared-memory clients the worker holds now.
    pub(super) load: AtomicUsize,
}

impl WorkerInbox {
    pub(super) fn new(waker: Arc<Waker>) -> WorkerInbox {
        WorkerInbox {
            waker,
            arrivals: Mutex::new(Vec::new()),
            waiting: AtomicBool::new(false),
            load: AtomicUsize::new(0),
        }
    }

    pub(super) fn take(&self) -> Vec<Arrival> {
        if !self.waiting.load(Ordering::Relaxed) || !self.waiting.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.arrivals.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn put(&self, arrival: Arrival) {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(arrival);
        self.waiting.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// Binds the shared-memory socket (see [`super::bind_unix`]).
pub(super) fn bind(settings: &ShmSettings) -> std::io::Result<UnixListener> {
    let listener = super::bind_unix(&settings.path, settings.mode, "--shm")?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Starts the acceptor thread.
pub(super) fn start(
    shared: Arc<Shared>,
    listener: UnixListener,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-shm-accept".into())
        .spawn(move || accept_loop(&shared, &listener))
}

/// Most connections whose hello is still coming; past it a new one is
/// refused at once. Each holds a socket and [`shm::HELLO_BYTES`].
const MAX_HELLOS: usize = 256;

/// The acceptor's token for the listening socket.
const LISTENER: u64 = u64::MAX;

/// A connection whose hello is still coming.
struct Hello {
    sock: UnixStream,
    got: [u8; shm::HELLO_BYTES],
    len: usize,
    since: std::time::Instant,
}

/// Takes connections and reads their hellos as they come, all on one
/// thread without waiting on any one client: a client that connects and
/// says nothing costs a slot among [`MAX_HELLOS`] for [`HELLO_TIMEOUT`],
/// and holds up nobody.
fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener) {
    let mut poller = match Poller::new(64) {
        Ok(p) => p,
        Err(e) => {
            log::error!("the shared-memory acceptor cannot wait on its sockets: {e}");
            return;
        }
    };
    if let Err(e) = poller.add(listener, LISTENER, Interest::READ) {
        log::error!("the shared-memory acceptor cannot watch its socket: {e}");
        return;
    }
    let mut hellos: HashMap<u64, Hello> = HashMap::new();
    let mut next_token = 0u64;
    let mut ready = Vec::new();
    while !shared.stopping() {
        ready.clear();
        if let Err(e) = poller.wait(ACCEPT_POLL, &mut ready) {
            log::warn!("waiting on the shared-memory socket failed: {e}");
            std::thread::sleep(ACCEPT_POLL);
        }
        for &token in &ready {
            if token == LISTENER {
                accept_all(listener, &poller, &mut hellos, &mut next_token);
            } else if let Some(done) = read_some(&mut hellos, token) {
                let _ = poller.remove(&done.sock);
                let Hello { sock, got, .. } = done;
                if let Err(e) = admit(shared, sock, &got) {
                    log::info!("a shared-memory client was not admitted: {e}");
                }
            }
        }
        // Dropping a socket takes it out of the poller too.
        hellos.retain(|_, h| h.since.elapsed() < HELLO_TIMEOUT);
    }
    if let Some(settings) = &shared.config.shm {
        let _ = std::fs::remove_file(&settings.path);
    }
}

/// Takes every waiting connection and starts reading its hello.
fn accept_all(
    listener: &UnixListener,
    poller: &Poller,
    hellos: &mut HashMap<u64, Hello>,
    next_token: &mut u64,
) {
    loop {
        let mut sock = match listener.accept() {
            Ok((sock, _)) => sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::warn!("accept on the shared-memory socket failed: {e}");
                return;
            }
        };
        if hellos.len() >= MAX_HELLOS {
            refuse(&mut sock, "ERR too many clients connecting at once");
            continue;
        }
        let token = *next_token;
        *next_token = (*next_token + 1) % LISTENER;
        let watched = sock
            .set_nonblocking(true)
            .and_then(|()| poller.add(&sock, token, Interest::READ));
        if let Err(e) = watched {
            log::warn!("a shared-memory client's socket cannot be watched: {e}");
            continue;
        }
        hellos.insert(
            token,
            Hello {
                sock,
                got: [0; shm::HELLO_BYTES],
                len: 0,
                since: std::time::Instant::now(),
            },
        );
    }
}

/// Reads what has come of hello `token`; the connection once its hello is
/// whole (a connection that fails or hangs up is dropped).
fn read_some(hellos: &mut HashMap<u64, Hello>, token: u64) -> Option<Hello> {
    let hello = hellos.get_mut(&token)?;
    let read = hello.sock.read(&mut hello.got[hello.len..]);
    match read {
        Ok(0) => {
            hellos.remove(&token);
            None
        }
        Ok(n) => {
            hello.len += n;
            (hello.len == shm::HELLO_BYTES)
                .then(|| hellos.remove(&token))
                .flatten()
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => None,
        Err(_) => {
            hellos.remove(&token);
            None
        }
    }
}

fn refuse(sock: &mut UnixStream, text: &str) {
    let _ = sock.write_all(&shm::refuse_answer(text));
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: at least one worker"
)]
fn admit(
    shared: &Arc<Shared>,
    mut sock: UnixStream,
    hello: &[u8; shm::HELLO_BYTES],
) -> std::io::Result<()> {
    let Some(settings) = &shared.config.shm else {
        return Ok(());
    };
    shared
        .stats
        .connections_received
        .fetch_add(1, Ordering::Relaxed);
    sock.set_nonblocking(false)?;
    sock.set_write_timeout(Some(HELLO_TIMEOUT))?;
    if let Err(e) = shm::check_hello(hello) {
        // A client of another transport version, or not one of ours: it
        // is told why, in the answer every version can read.
        refuse(&mut sock, &format!("ERR {e}"));
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    }
    let cred = shm::peer_credentials(&sock)?;
    let inboxes = shared.shm_inboxes.lock().unwrap_or_else(|p| p.into_inner());
    let shm_clients: usize = inboxes.iter().map(|w| w.load.load(Ordering::Relaxed)).sum();
    let admitted = shm_clients < settings.max_clients
        && shared
            .clients
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < shared.max_clients.load(Ordering::Relaxed)).then_some(n + 1)
            })
            .is_ok();
    if !admitted || shared.stopping() {
        if admitted {
            shared.clients.fetch_sub(1, Ordering::AcqRel);
        }
        shared
            .stats
            .rejected_connections
            .fetch_add(1, Ordering::Relaxed);
        refuse(&mut sock, "ERR max number of clients reached");
        return Ok(());
    }
    let give_back = |e: std::io::Error| {
        shared.clients.fetch_sub(1, Ordering::AcqRel);
        e
    };
    let worker = inboxes
        .iter()
        .min_by_key(|w| w.load.load(Ordering::Relaxed))
        .expect("at least one worker")
        .clone();
    drop(inboxes);
    let region = ShmRegion::create(settings.request_ring_bytes, settings.response_ring_bytes)
        .map_err(give_back)?;
    let eventfd = worker.waker.duplicate_fd().map_err(give_back)?;
    let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
    let answer = shm::admit_answer(id);
    shm::send_with_fds(&sock, &answer, &[region.fd(), eventfd.as_fd()]).map_err(give_back)?;
    drop(eventfd);
    worker.load.fetch_add(1, Ordering::Relaxed);
    worker.put(Arrival {
        channel: ShmChannel::new(region, Side::Server),
        sock,
        id,
        pid: cred.pid,
    });
    Ok(())
}

/// The name a shared-memory client goes by in CLIENT LIST (Redis shows a
/// Unix-socket client as `path:0`).
pub(super) fn client_addr(path: &Path) -> String {
    format!("{}:0", path.display())
}
