//! `sluice serve`: the thread-per-core server.
//!
//! Each worker thread is pinned to a core and owns a network ring
//! (`sluice_io::net`): its own `SO_REUSEPORT` listener with a multishot
//! accept, a multishot recv per connection into provided buffers, one
//! send in flight per connection carrying every reply produced meanwhile,
//! one `io_uring_enter` per loop turn. A command runs on the thread that
//! received it, against the shared store (reads take no lock; writes meet
//! in the store's group commit); a worker takes its connections in the
//! order their requests came. Scripts (EVAL, FCALL) are the exception:
//! they run one at a time on the script thread (`scripting`), the
//! connection parked until the reply comes back through its worker's
//! mailbox, so a runaway script never holds a worker.
//!
//! Durability (`--durability`, Redis's appendfsync): with `always` a
//! connection's replies wait, in order, until the log is durable past its
//! last write — the thread serves its other connections meanwhile; the
//! one committer thread makes the log durable for every thread at once
//! and wakes them. `everysec` makes it durable once a second, `none` at
//! flushes and shutdown.

mod acl_command;
mod blocking;
mod client_cmd;
mod clients;
mod clock;
mod config_cmd;
mod conn;
mod dispatch;
mod durability;
mod expiry;
mod functions;
mod info;
mod lua;
mod lua_libs;
mod mailbox;
pub mod metrics;
mod monitor;
mod notify;
mod pass;
mod pause;
mod pubsub;
mod scripting;
pub mod shm;
mod slowlog;
pub mod tls;
mod tracking;
mod tunables;
mod worker;

pub use blocking::Blocking;
pub use clients::{ClientEntry, Clients};
pub use durability::Durability;
pub use pubsub::PubSub;
pub use scripting::Scripts;
pub use shm::ShmSettings;

use crate::resp::Limits;
use crate::session::Users;
use sluice_redis::db::Db;
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the Redis protocol listens (port 0: any free port).
    pub resp_addr: SocketAddr,
    /// The Redis protocol over TLS too, if set.
    pub tls: Option<tls::TlsSettings>,
    /// The shared-memory transport for local clients, if set.
    pub shm: Option<ShmSettings>,
    /// The Redis protocol on a Unix socket too, if set (Redis's
    /// `unixsocket` and `unixsocketperm`).
    pub unix_socket: Option<UnixSocketSettings>,
    /// Worker threads (one per core by default).
    pub threads: usize,
    /// Pin each worker to a core.
    pub pin_threads: bool,
    /// When a write is acknowledged.
    pub durability: Durability,
    /// Who may connect.
    pub users: Users,
    /// Redis's `protected-mode`: while the default user has no password,
    /// TCP and TLS clients other than `127.0.0.1` and `::1` are answered
    /// `-DENIED` and closed (a Unix socket and shared memory are local).
    pub protected_mode: bool,
    /// Most clients connected at once (Redis's `maxclients`).
    pub max_clients: usize,
    /// Close a client idle this long (0: never; Redis's `timeout`, seconds).
    pub idle_timeout_secs: u64,
    /// Request limits (`proto-max-bulk-len`, inline size).
    pub limits: Limits,
    /// Most bytes a client's received-but-unframed requests may hold
    /// (Redis's `client-query-buffer-limit`).
    pub max_query_bytes: usize,
    /// Most reply bytes waiting for one client; past it the client is
    /// closed (Redis's `client-output-buffer-limit` for normal clients
    /// is unlimited; Sluice keeps a bound). The default, 576 MiB, holds a
    /// reply of the longest string (`proto-max-bulk-len`, 512 MiB) and
    /// 64 MiB more.
    pub max_output_bytes: usize,
    /// Most requests of one connection run in one loop turn before the
    /// thread turns to the others (pipelining fairness).
    pub max_pipeline: usize,
    /// How long a worker keeps polling without blocking after its last
    /// work (adaptive polling), in µs.
    pub spin_us: u64,
    /// How the background threads (the expiry sweep here, the store's
    /// flushes and compactions through its own config) are scheduled
    /// against the workers.
    pub background_cpu: sluice_io::cpu::BackgroundCpu,
    /// Redis parameters set at start as `CONFIG SET name value` sets them
    /// (the same checks and errors), before any client connects.
    pub start_parameters: Vec<(String, String)>,
    /// Where CONFIG REWRITE writes the parameters that differ from their
    /// defaults (none: Redis's error for a server without a config file).
    pub rewrite: Option<ConfigRewrite>,
}

/// What CONFIG REWRITE calls with the parameters to keep, by name: the
/// front end that read a configuration file writes them back into it.
#[derive(Clone)]
pub struct ConfigRewrite(pub Arc<RewriteFn>);

/// Writes parameters (name, value) back where they came from, or says why not.
pub type RewriteFn = dyn Fn(&[(String, String)]) -> Result<(), String> + Send + Sync;

impl std::fmt::Debug for ConfigRewrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigRewrite")
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            resp_addr: SocketAddr::from(([127, 0, 0, 1], 6379)),
            tls: None,
            shm: None,
            unix_socket: None,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pin_threads: true,
            durability: Durability::Always,
            users: Users::default(),
            protected_mode: true,
            max_clients: 10_000,
            idle_timeout_secs: 0,
            limits: Limits::default(),
            max_query_bytes: 1 << 30,
            max_output_bytes: (512 << 20) + (64 << 20),
            max_pipeline: 1024,
            spin_us: 50,
            background_cpu: sluice_io::cpu::BackgroundCpu::Idle,
            start_parameters: Vec::new(),
            rewrite: None,
        }
    }
}

/// Where the Redis protocol's Unix socket is, and who may connect.
#[derive(Debug, Clone)]
pub struct UnixSocketSettings {
    /// The socket's path.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// Binds a Unix socket at `path` with permission bits `mode`: a stale
/// socket (nothing answers) is replaced, a live one is an error, a missing
/// parent directory is made. `flag` names the option in errors.
pub(crate) fn bind_unix(path: &Path, mode: u32, flag: &str) -> std::io::Result<UnixListener> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            Error::new(
                e.kind(),
                format!("cannot make {} for {flag}: {e}", parent.display()),
            )
        })?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(Error::new(
                ErrorKind::AddrInUse,
                format!(
                    "{} already has a server listening: stop it or pick another {flag} path",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).map_err(|e| {
        Error::new(
            e.kind(),
            format!("cannot bind {flag} {}: {e}", path.display()),
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Counters every worker adds to (INFO).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections refused (max clients).
    pub rejected_connections: AtomicU64,
    /// The per-request counters, one set per worker: each is written by
    /// its worker alone, without a locked instruction (which would wait
    /// for the worker's stores into the shared-memory rings to drain).
    /// The last set is the scripts' (the commands scripts call: scripts
    /// run one at a time, under every stripe lock).
    pub by_worker: Box<[WorkerStats]>,
    /// Replies held for durability, and the µs they waited in total.
    pub durable_waits: AtomicU64,
    /// See `durable_waits`.
    pub durable_wait_us: AtomicU64,
    /// Writes held back while the store was under write pressure.
    pub write_pressure_waits: AtomicU64,
    /// Device reads commands left to a worker's fill queue instead of
    /// waiting for them.
    pub reads_queued: AtomicU64,
    /// Error replies by code (INFO's errorstats).
    pub errors: Arc<ErrorStats>,
    /// The sum of the workers' `changes` at the last SAVE.
    pub changes_at_save: AtomicU64,
    /// Keys the expiry sweep removed (INFO's `expired_keys`).
    pub expired_keys: AtomicU64,
}

/// Error replies sent, by their code (the first word: `ERR`, `WRONGTYPE`),
/// as Redis counts them for INFO's `errorstats` and `total_error_replies`.
#[derive(Debug, Default)]
pub struct ErrorStats {
    total: AtomicU64,
    by_code: Mutex<std::collections::BTreeMap<String, u64>>,
}

/// Most error codes counted apart (Redis's `ERROR_STATS_NUMBER`): past it,
/// a new code counts in the total only.
const MAX_ERROR_CODES: usize = 128;

impl ErrorStats {
    /// Counts an error reply of `text`.
    pub fn note(&self, text: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let code = text.split(' ').next().unwrap_or_default();
        let mut by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_code.get_mut(code) {
            *n += 1;
        } else if by_code.len() < MAX_ERROR_CODES {
            by_code.insert(code.to_string(), 1);
        }
    }

    /// Counts the errors among the items of `reply` (EXEC's replies, a
    /// script's array), as Redis counts each error it sends; the reply
    /// itself is counted when queued. Only where such arrays are made:
    /// every other array reply (LRANGE's) is not walked for errors.
    pub fn note_nested(&self, reply: &crate::resp::Reply) {
        if let crate::resp::Reply::Array(items) = reply {
            for item in items {
                if let crate::resp::Reply::Error(text) = item {
                    self.note(text);
                }
            }
        }
    }

    /// Error replies counted since start or CONFIG RESETSTAT.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Each code and its count, by code.
    pub fn by_code(&self) -> Vec<(String, u64)> {
        let by_code = self.by_code.lock().unwrap_or_else(|p| p.into_inner());
        by_code.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Forgets every count (CONFIG RESETSTAT).
    pub fn reset(&self) {
        self.total.store(0, Ordering::Relaxed);
        self.by_code
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// One command's counters on one worker (INFO commandstats), written by
/// that worker only.
#[derive(Debug, Default)]
pub struct CommandCounters {
    /// Times it ran.
    pub calls: AtomicU64,
    /// Microseconds it ran for, in all.
    pub usec: AtomicU64,
    /// Times it was refused before it ran (arity, authentication, ACL,
    /// BUSY...).
    pub rejected: AtomicU64,
    /// Times it ran and answered an error.
    pub failed: AtomicU64,
}

/// One worker's request counters, on their own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct WorkerStats {
    /// Commands run.
    pub commands_processed: AtomicU64,
    /// Bytes received from clients.
    pub net_input_bytes: AtomicU64,
    /// Bytes sent to clients.
    pub net_output_bytes: AtomicU64,
    /// Write commands that changed the keyspace (a transaction or a
    /// script counts once): INFO's `rdb_changes_since_last_save`.
    pub changes: AtomicU64,
    /// Per command and subcommand, by `acl::CommandId`.
    pub commands: Box<[CommandCounters]>,
    /// Commands run, by how long they took: bucket i up to 2^i µs, the
    /// last past 2^20 µs (`/metrics`'s latency histogram).
    pub latency_buckets: [AtomicU64; metrics::LATENCY_BUCKETS + 1],
}

impl WorkerStats {
    /// Adds `n` to `counter`, which only this worker writes: a load and a
    /// store, no read-modify-write.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// One command's counters summed over the workers and the scripts' set
/// (INFO commandstats, `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandSums {
    /// Times it ran.
    pub calls: u64,
    /// Microseconds it ran for, in all.
    pub usec: u64,
    /// Times it was refused before it ran.
    pub rejected: u64,
    /// Times it ran and answered an error.
    pub failed: u64,
}

impl CommandSums {
    /// Whether the command ran or was refused at all.
    pub fn any(&self) -> bool {
        self.calls > 0 || self.rejected > 0 || self.failed > 0
    }
}

impl Stats {
    /// Command `id`'s counters summed over every worker's set.
    pub fn command_sums(&self, id: usize) -> CommandSums {
        let mut sums = CommandSums::default();
        for c in self.by_worker.iter().filter_map(|w| w.commands.get(id)) {
            sums.calls += c.calls.load(Ordering::Relaxed);
            sums.usec += c.usec.load(Ordering::Relaxed);
            sums.rejected += c.rejected.load(Ordering::Relaxed);
            sums.failed += c.failed.load(Ordering::Relaxed);
        }
        sums
    }

    /// Counters for `workers` workers.
    pub fn new(workers: usize) -> Stats {
        Stats {
            by_worker: (0..workers)
                .map(|_| WorkerStats {
                    commands: (0..crate::acl::command_count())
                        .map(|_| CommandCounters::default())
                        .collect(),
                    ..WorkerStats::default()
                })
                .collect(),
            ..Stats::default()
        }
    }

    /// The index of the scripts' counters in `by_worker`.
    pub fn scripts_slot(&self) -> usize {
        self.by_worker.len() - 1
    }

    /// The sum of one per-worker counter over the workers.
    pub fn sum(&self, counter: impl Fn(&WorkerStats) -> &AtomicU64) -> u64 {
        self.by_worker
            .iter()
            .map(|w| counter(w).load(Ordering::Relaxed))
            .sum()
    }

    /// Commands per latency bucket over every worker (bucket `i` holds
    /// those of at most 2^i µs, the last one the rest; not cumulative).
    pub fn latency_counts(&self) -> [u64; metrics::LATENCY_BUCKETS + 1] {
        std::array::from_fn(|i| self.sum(|w| &w.latency_buckets[i]))
    }
}

/// What all workers share.
pub struct Shared {
    /// The keyspace.
    pub db: Arc<Db>,
    /// The configuration.
    pub config: ServerConfig,
    /// Clients connected now.
    pub clients: AtomicUsize,
    /// Every connected client (CLIENT LIST, KILL).
    pub registry: Clients,
    /// Clients blocked on keys (BLPOP ...).
    pub blocking: Blocking,
    /// Pub/sub subscriptions.
    pub pubsub: PubSub,
    /// MONITOR's connections.
    pub monitors: monitor::Monitors,
    /// Client-side caching: who is told of which changed keys.
    pub tracking: tracking::Tracking,
    /// CLIENT PAUSE in force.
    pub pause: pause::Pause,
    /// SLOWLOG's entries and LATENCY's samples.
    pub slowlog: slowlog::SlowLog,
    /// INFO's `master_replid`: 40 hex digits made at start.
    pub replication_id: String,
    /// Scripts EVAL and SCRIPT LOAD saw, by SHA1, and the script thread's
    /// queue.
    pub scripts: Scripts,
    /// The function libraries FUNCTION LOAD loaded.
    pub functions: functions::Functions,
    /// Redis's tuning parameters CONFIG SET keeps.
    pub tunables: tunables::Tunables,
    /// `maxclients` now (CONFIG SET changes it).
    pub max_clients: AtomicUsize,
    /// `timeout` now, in seconds (CONFIG SET changes it).
    pub idle_timeout_secs: AtomicU64,
    /// `protected-mode` now (CONFIG SET changes it).
    pub protected_mode: AtomicBool,
    /// `appendfsync` now ([`Durability`] as a byte; CONFIG SET changes it).
    durability: std::sync::atomic::AtomicU8,
    /// `client-query-buffer-limit` now (CONFIG SET changes it).
    pub max_query_bytes: AtomicUsize,
    /// The next client id.
    pub next_client_id: AtomicU64,
    /// Set to stop: workers finish what they hold and return.
    pub shutdown: AtomicBool,
    /// Counters.
    pub stats: Stats,
    /// When the server started.
    pub started: Instant,
    /// The address the Redis protocol listens on.
    pub resp_addr: SocketAddr,
    /// The address of the TLS listener, if any.
    pub tls_addr: Option<SocketAddr>,
    wakers: Mutex<Vec<Arc<sluice_io::net::Waker>>>,
    /// Each worker's hand-over point for shared-memory clients.
    shm_inboxes: Mutex<Vec<Arc<shm::WorkerInbox>>>,
    /// Settings CONFIG SET changed that are not among the tunables
    /// (`timeout`, `appendfsync`, ...), as last set: CONFIG REWRITE keeps
    /// them. Never `requirepass`: a secret is not written into a file.
    pub(crate) set_settings: Mutex<std::collections::BTreeMap<String, String>>,
    committer: durability::Committer,
}

impl Shared {
    /// Asks every worker to stop (SHUTDOWN, SIGTERM).
    pub fn request_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        // A script never ending would keep its connection, and so the
        // server, from stopping: it is stopped, its writes dropped whole.
        self.scripts.kill_for_shutdown();
        self.wake_workers();
    }

    /// Whether the fast GET and SET paths (which feed no monitor and time
    /// nothing) step aside: while anyone monitors, or SLOWLOG logs every
    /// command (`slowlog-log-slower-than 0`).
    fn fast_paths_closed(&self) -> bool {
        // Keyspace events are named per command: SETs go one by one.
        // Tracking remembers what each read read and tells of each write.
        self.monitors.any()
            || self.tunables.slow.logs_everything()
            || self.tunables.notify.on()
            || self.tracking.any()
            || self.pause.active()
    }

    /// When a write is acknowledged now (`--durability`, then CONFIG SET
    /// appendfsync).
    pub fn durability(&self) -> Durability {
        Durability::from_byte(self.durability.load(Ordering::Relaxed))
    }

    /// Changes when writes are acknowledged from now on. A reply held for
    /// the old mode is released by the new one's test.
    pub fn set_durability(&self, durability: Durability) {
        self.durability
            .store(durability.as_byte(), Ordering::Relaxed);
        // The committer may sleep a tick in `none`; it serves held replies
        // at once in the others.
        self.committer.nudge();
    }

    /// Wakes every worker (to look at held commands again).
    fn wake_workers(&self) {
        for w in self.wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            w.wake();
        }
    }

    /// Whether the data model lists the keys each batch changes: while
    /// keyspace events go out or any client tracks.
    fn refresh_change_recording(&self) {
        let on = self.tunables.notify.on() || self.tracking.any();
        self.db.settings.record_changes.store(on, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Whether protected mode turns a TCP or TLS client from `peer` away.
    fn denies(&self, peer: Option<&SocketAddr>) -> bool {
        self.protected_mode.load(Ordering::Relaxed)
            && !self.config.users.default_needs_password()
            && !peer.is_some_and(sluice_auth::is_local_peer)
    }
}

/// Redis 7's answer to a client protected mode turns away, byte for byte
/// (its `clientAcceptHandler`).
pub const DENIED_REPLY: &[u8] = b"-DENIED Redis is running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers to Redis you may adopt one of the following solutions: 1) Just disable protected mode sending the command 'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the same host the server is running, however MAKE SURE Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable the protected mode by editing the Redis configuration file, and setting the protected mode option to 'no', and then restarting the server. 3) If you started the server manually just for testing, restart it with the '--protected-mode no' option. 4) Setup a an authentication password for the default user. NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";

/// A running server: its address, and a handle to stop it.
pub struct Server {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<std::io::Result<()>>>,
    background: Vec<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts the workers on `db`; returns once every one listens.
    pub fn start(db: Arc<Db>, config: ServerConfig) -> std::io::Result<Server> {
        assert!(config.threads >= 1, "at least one worker thread");
        raise_fd_limit_for(config.max_clients);
        let first = sluice_io::net::bind_reuseport(config.resp_addr, 1024)?;
        let resp_addr = first.local_addr()?;
        let first_tls = match &config.tls {
            Some(t) => Some(sluice_io::net::bind_reuseport(t.addr, 1024)?),
            None => None,
        };
        let tls_addr = match &first_tls {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let unix_listener = match &config.unix_socket {
            Some(u) => Some(Arc::new(bind_unix(&u.path, u.mode, "--unixsocket")?)),
            None => None,
        };
        let shm_listener = match &config.shm {
            Some(settings) => Some(shm::bind(settings)?),
            None => None,
        };
        let functions = functions::Functions::open(&db).map_err(std::io::Error::other)?;
        let shared = Arc::new(Shared {
            db,
            clients: AtomicUsize::new(0),
            registry: Clients::default(),
            blocking: Blocking::default(),
            pubsub: PubSub::default(),
            monitors: monitor::Monitors::default(),
            tracking: tracking::Tracking::default(),
            pause: pause::Pause::default(),
            slowlog: slowlog::SlowLog::default(),
            replication_id: replication_id(),
            scripts: Scripts::default(),
            functions,
            tunables: tunables::Tunables::default(),
            max_clients: AtomicUsize::new(config.max_clients),
            idle_timeout_secs: AtomicU64::new(config.idle_timeout_secs),
            protected_mode: AtomicBool::new(config.protected_mode),
            durability: std::sync::atomic::AtomicU8::new(config.durability.as_byte()),
            max_query_bytes: AtomicUsize::new(config.max_query_bytes),
            next_client_id: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            stats: Stats::new(config.threads + 1),
            started: Instant::now(),
            resp_addr,
            tls_addr,
            wakers: Mutex::new(Vec::new()),
            shm_inboxes: Mutex::new(Vec::new()),
            committer: durability::Committer::default(),
            set_settings: Mutex::new(Default::default()),
            config,
        });
        apply_start_parameters(&shared)?;
        let workers = start_workers(&shared, first, first_tls, unix_listener)?;
        let mut background = vec![
            durability::start(shared.clone())?,
            expiry::start(shared.clone())?,
            scripting::start(shared.clone())?,
        ];
        if let Some(listener) = shm_listener {
            background.push(shm::start(shared.clone(), listener)?);
        }
        Ok(Server {
            shared,
            workers,
            background,
        })
    }

    /// Where the Redis protocol listens.
    pub fn resp_addr(&self) -> SocketAddr {
        self.shared.resp_addr
    }

    /// Where the Redis protocol over TLS listens, if it does.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.shared.tls_addr
    }

    /// What the workers share (to stop the server from a signal handler's
    /// thread: [`Shared::request_shutdown`]).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Waits until the server stops (SHUTDOWN, or [`Shared::request_shutdown`]),
    /// then makes everything acknowledged durable. Returns the first
    /// worker error, if any.
    pub fn wait(mut self) -> std::io::Result<()> {
        let mut first_error = None;
        for w in self.workers.drain(..) {
            let result = w
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a worker thread panicked")));
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        self.shared.request_shutdown();
        // The workers are gone: no script comes any more.
        self.shared.scripts.close();
        for b in self.background.drain(..) {
            let _ = b.join();
        }
        if let Some(u) = &self.shared.config.unix_socket {
            let _ = std::fs::remove_file(&u.path);
        }
        durability::make_all_durable(&self.shared).map_err(std::io::Error::other)?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops the server and waits for it ([`Server::wait`]).
    pub fn stop(self) -> std::io::Result<()> {
        self.shared.request_shutdown();
        self.wait()
    }
}

/// A replication id as Redis makes one: 40 hex digits, new at each start.
fn replication_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seed = format!("{}:{}:{}", now.as_nanos(), std::process::id(), now_ms());
    sha1_smol::Sha1::from(seed.as_bytes()).digest().to_string()
}

/// The current Unix time in ms.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long a blocked worker sleeps at most before it looks at its
/// timers (idle clients, shutdown).
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// Raises the open-file limit to what `max_clients` clients need (each a
/// descriptor; the store and the rings need a few more), or says what it
/// could not.
fn raise_fd_limit_for(max_clients: usize) {
    let wanted = max_clients as u64 + 256;
    match sluice_io::net::raise_fd_limit(wanted) {
        Ok(got) if got < wanted => log::warn!(
            "the open-file limit is {got}, below --max-clients {max_clients} + 256: clients past it are refused (raise the hard limit, e.g. `ulimit -Hn`)"
        ),
        Ok(_) => {}
        Err(e) => log::warn!("could not raise the open-file limit: {e}"),
    }
}

/// The Redis parameters given at start, set as CONFIG SET sets them.
fn apply_start_parameters(shared: &Shared) -> std::io::Result<()> {
    if shared.config.start_parameters.is_empty() {
        return Ok(());
    }
    let mut args: crate::resp::Args = vec![b"CONFIG".to_vec(), b"SET".to_vec()];
    for (name, value) in &shared.config.start_parameters {
        args.push(name.as_bytes().to_vec());
        args.push(value.as_bytes().to_vec());
    }
    match dispatch::config_set(shared, &args) {
        crate::resp::Reply::Error(why) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("a Redis parameter given at start: {why}"),
        )),
        _ => Ok(()),
    }
}

type WorkerThread = std::thread::JoinHandle<std::io::Result<()>>;

/// One worker thread per `--threads`, each pinned to a core and with
/// listeners of its own (`SO_REUSEPORT`; the first takes those bound
/// already); returns once every one listens.
fn start_workers(
    shared: &Arc<Shared>,
    first: std::net::TcpListener,
    first_tls: Option<std::net::TcpListener>,
    unix_listener: Option<Arc<std::os::unix::net::UnixListener>>,
) -> std::io::Result<Vec<WorkerThread>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers = Vec::new();
    let mut listener = Some(first);
    let mut tls_listener = first_tls;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    for index in 0..shared.config.threads {
        let listener = match listener.take() {
            Some(l) => l,
            None => sluice_io::net::bind_reuseport(shared.resp_addr, 1024)?,
        };
        let tls_listener = match (tls_listener.take(), shared.tls_addr) {
            (Some(l), _) => Some(l),
            (None, Some(addr)) => Some(sluice_io::net::bind_reuseport(addr, 1024)?),
            (None, None) => None,
        };
        let shared = shared.clone();
        let ready = ready_tx.clone();
        let core = index % cores;
        let unix_listener = unix_listener.clone();
        workers.push(
            std::thread::Builder::new()
                .name(format!("sluice-serve-{index}"))
                .spawn(move || {
                    let listeners = worker::Listeners {
                        tcp: listener,
                        tls: tls_listener,
                        unix: unix_listener,
                    };
                    worker::run(shared, listeners, core, ready)
                })?,
        );
    }
    drop(ready_tx);
    for _ in 0..workers.len() {
        let failed = match ready_rx.recv() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::other("a worker thread ended while starting"),
        };
        shared.request_shutdown();
        return Err(failed);
    }
    Ok(workers)
}
