//! The HTTP listener: one thread accepts, one thread per connection (up to
//! a limit) reads requests and answers them, keep-alive between requests.

use crate::api::Api;
use crate::error::ApiError;
use crate::wire::{self, Response, WireError};
use std::cell::Cell;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the HTTP API listens.
#[derive(Clone)]
pub struct HttpConfig {
    /// Where (port 0: any free port).
    pub addr: SocketAddr,
    /// Most connections open at once; more are answered 429 and closed.
    pub max_connections: usize,
    /// `http.max_content_length`: the largest request body.
    pub max_body_bytes: usize,
    /// A connection idle this long between requests is closed.
    pub idle_timeout: Duration,
    /// A request must arrive whole (head and body) within this from its
    /// first byte, and each write of an answer must be taken by the client
    /// within it: a slow sender or a client that stops reading holds its
    /// slot no longer.
    pub request_timeout: Duration,
    /// Basic-auth users (name, password).
    pub users: sluice_auth::Credentials,
    /// API keys (id, key), sent as `Authorization: ApiKey
    /// base64(id:key)`. With neither users nor keys: no authentication,
    /// and then only local clients are served (see `protected_mode`).
    pub api_keys: sluice_auth::Credentials,
    /// Without users or keys, answer clients other than `127.0.0.1` and
    /// `::1` with 403 (Redis's protected mode; Elasticsearch 8 turns its
    /// security on by default in the same spirit).
    pub protected_mode: bool,
    /// Every connection shows a client certificate the TLS configuration
    /// verified (client authentication required): it is no anonymous
    /// client, and protected mode lets it in from anywhere.
    pub clients_verified: bool,
    /// TLS (rustls) on every connection, if set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("addr", &self.addr)
            .field("max_connections", &self.max_connections)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("users", &self.users.len())
            .field("api_keys", &self.api_keys.len())
            .field("protected_mode", &self.protected_mode)
            .field("clients_verified", &self.clients_verified)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 9200)),
            max_connections: 1024,
            max_body_bytes: 100 << 20,
            idle_timeout: Duration::from_secs(300),
            request_timeout: Duration::from_secs(60),
            users: sluice_auth::Credentials::new(),
            api_keys: sluice_auth::Credentials::new(),
            protected_mode: true,
            clients_verified: false,
            tls: None,
        }
    }
}

/// A running HTTP listener.
pub struct HttpServer {
    addr: SocketAddr,
    anonymous: bool,
    shutdown: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

/// How often blocked threads look at the shutdown flag.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

impl HttpServer {
    /// Binds and starts accepting.
    pub fn start(api: Arc<Api>, config: HttpConfig) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(config.addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = shutdown.clone();
        let anonymous =
            config.users.is_empty() && config.api_keys.is_empty() && !config.clients_verified;
        let sampled = (api.clone(), shutdown.clone());
        let acceptor = std::thread::Builder::new()
            .name("sluice-http-accept".into())
            .spawn(move || accept_loop(listener, api, config, flag))?;
        let sampler = std::thread::Builder::new()
            .name("sluice-http-history".into())
            .spawn(move || sample_history(&sampled.0, &sampled.1))?;
        Ok(HttpServer {
            addr,
            anonymous,
            shutdown,
            acceptor: Some(acceptor),
            sampler: Some(sampler),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it asks clients for nothing (no users, no API keys, no
    /// client certificates): then protected mode decides who comes in.
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }

    /// Stops accepting; connections finish the request they hold and close.
    pub fn stop(mut self) {
        self.shutdown.store(true, Ordering::Release);
        for thread in [self.acceptor.take(), self.sampler.take()]
            .into_iter()
            .flatten()
        {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
    }
}

/// One of the `--http-max-connections` slots, given back when the
/// connection's thread ends, whichever way it ends (a panic included).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a slot, or none when all `limit` are held.
    fn take(open: &Arc<AtomicUsize>, limit: usize) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(
    listener: TcpListener,
    api: Arc<Api>,
    config: HttpConfig,
    shutdown: Arc<AtomicBool>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let config = Arc::new(config);
    let mut workers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !shutdown.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                workers.retain(|w| !w.is_finished());
                let Some(slot) = Slot::take(&open, config.max_connections) else {
                    refuse(stream, config.max_connections);
                    continue;
                };
                let (api, config, shutdown) = (api.clone(), config.clone(), shutdown.clone());
                // The slot moves into the thread; if the thread cannot start,
                // the closure is dropped and the slot with it.
                let spawned = std::thread::Builder::new()
                    .name("sluice-http".into())
                    .spawn(move || {
                        let _slot = slot;
                        if let Err(e) = serve_connection(stream, peer, &api, &config, &shutdown) {
                            log::debug!("http connection: {e}");
                        }
                    });
                match spawned {
                    Ok(h) => workers.push(h),
                    Err(e) => log::warn!("http: could not start a connection thread: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Woken the moment a connection arrives; `shutdown` is
                // looked at each interval.
                use std::os::fd::AsFd;
                if let Err(e) = sluice_io::shm::wait_readable(listener.as_fd(), POLL_INTERVAL) {
                    log::warn!("http accept: waiting for a connection: {e}");
                    std::thread::sleep(POLL_INTERVAL);
                }
            }
            Err(e) => {
                log::warn!("http accept: {e}");
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
    for w in workers {
        let _ = w.join();
    }
}

/// Reads the API's figures into its history once a second until shutdown
/// (looking at the flag every [`POLL_INTERVAL`]).
fn sample_history(api: &Api, shutdown: &AtomicBool) {
    let interval = Duration::from_millis(crate::history::SAMPLE_INTERVAL_MS);
    let mut next = std::time::Instant::now();
    while !shutdown.load(Ordering::Acquire) {
        let now = std::time::Instant::now();
        if now >= next {
            api.sample_history();
            // A late reading moves the schedule rather than bunching samples.
            next = (next + interval).max(now);
            continue;
        }
        std::thread::sleep((next - now).min(POLL_INTERVAL));
    }
}

fn refuse(stream: TcpStream, limit: usize) {
    let e = ApiError::new(429, "es_rejected_execution_exception", format!("rejected: the server holds its limit of {limit} HTTP connections (--http-max-connections)"));
    let mut out = BufWriter::new(&stream);
    let _ = wire::write_response(
        &mut out,
        Response::json(429, e.body().to_string().into_bytes()),
        false,
        false,
        false,
    );
}

/// Most body bytes read from a request that is not authorized, so that
/// the connection can answer it and go on; a larger body is not read at
/// all (the answer closes the connection).
pub const MAX_UNAUTHORIZED_BODY_BYTES: usize = 64 << 10;

fn authorized(req: &wire::Request, config: &HttpConfig) -> bool {
    let Some(value) = req.header("authorization") else {
        return false;
    };
    let (scheme, encoded) = value.split_once(' ').unwrap_or((value, ""));
    use base64::Engine;
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let Some(colon) = decoded.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, secret) = (&decoded[..colon], &decoded[colon + 1..]);
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    let known = if scheme.eq_ignore_ascii_case("basic") {
        &config.users
    } else if scheme.eq_ignore_ascii_case("apikey") {
        &config.api_keys
    } else {
        return false;
    };
    known.check(name, secret)
}

/// The answer to a request that may not run, if it may not: one without
/// the credentials the server asks for, or one from a client beyond
/// loopback when the server has none to ask for (protected mode).
fn refusal(request: &wire::Request, peer: &SocketAddr, config: &HttpConfig) -> Option<Response> {
    if config.users.is_empty() && config.api_keys.is_empty() {
        if !config.protected_mode || config.clients_verified || sluice_auth::is_local_peer(peer) {
            return None;
        }
        let e = ApiError::new(
            403,
            "security_exception",
            format!(
                "the HTTP API has no users, so it serves only clients on 127.0.0.1 and ::1 (protected mode), and this request [{}] came from {}: give the server --http-users-file FILE or --http-api-keys-file FILE and send credentials, or start it with --protected-mode no on a network you trust",
                request.path,
                peer.ip()
            ),
        );
        return Some(Response::json(403, e.body().to_string().into_bytes()));
    }
    (!authorized(request, config)).then(|| unauthorized(request))
}

/// The socket under a connection's reads: while a request is being read,
/// each read waits no later than the request's deadline, so a sender that
/// trickles a byte at a time cannot hold the connection's slot past it;
/// between requests a read waits [`POLL_INTERVAL`], so that shutdown and
/// the idle limit are seen.
struct DeadlineSocket {
    stream: TcpStream,
    deadline: Rc<Cell<Option<Instant>>>,
    /// The read timeout the socket has now: an idle connection's polls
    /// set it once, not on every read.
    timeout: Option<Duration>,
}

impl Read for DeadlineSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let wait = match self.deadline.get() {
            None => POLL_INTERVAL,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the request did not arrive whole within the request timeout",
                    ));
                }
                left
            }
        };
        if self.timeout != Some(wait) {
            self.stream.set_read_timeout(Some(wait))?;
            self.timeout = Some(wait);
        }
        self.stream.read(buf)
    }
}

impl Write for DeadlineSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    api: &Api,
    config: &HttpConfig,
    shutdown: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(config.request_timeout))?;
    let deadline = Rc::new(Cell::new(None));
    let socket = DeadlineSocket {
        stream,
        deadline: deadline.clone(),
        timeout: None,
    };
    let connection = Connection {
        peer,
        api,
        config,
        shutdown,
        deadline,
    };
    match &config.tls {
        None => connection.serve(socket),
        Some(tls) => {
            let conn = rustls::ServerConnection::new(tls.clone())
                .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
            connection.serve(rustls::StreamOwned::new(conn, socket))
        }
    }
}

/// What one connection's thread serves with.
struct Connection<'a> {
    peer: SocketAddr,
    api: &'a Api,
    config: &'a HttpConfig,
    shutdown: &'a AtomicBool,
    deadline: Rc<Cell<Option<Instant>>>,
}

/// What arrived on a connection.
enum Incoming {
    /// The peer closed between requests.
    Closed,
    /// A request allowed to run.
    Request(wire::Request),
    /// A request answered without running; whether its body was read
    /// whole, so that the connection can go on.
    Refused(wire::Request, Response, bool),
}

/// How long a refused connection reads what its client still sends before
/// it closes ([`Connection::linger`]).
const LINGER: Duration = Duration::from_secs(2);

/// The most a refused connection reads before it closes.
const LINGER_MOST_BYTES: usize = 64 << 20;

impl Connection<'_> {
    fn serve<S: Read + Write>(&self, stream: S) -> std::io::Result<()> {
        let config = self.config;
        let mut reader = BufReader::with_capacity(64 << 10, stream);
        let mut idle = Duration::ZERO;
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return Ok(());
            }
            // Wait for the first byte of a request with the short timeout,
            // so shutdown and the idle limit are seen; then read it whole
            // before its deadline.
            match std::io::BufRead::fill_buf(&mut reader) {
                Ok([]) => return Ok(()),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    idle += POLL_INTERVAL;
                    if idle >= config.idle_timeout {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
            idle = Duration::ZERO;
            self.deadline
                .set(Some(Instant::now() + config.request_timeout));
            let incoming = self.read(&mut reader);
            self.deadline.set(None);
            let mut writer = BufWriter::with_capacity(64 << 10, reader.get_mut());
            let (request, response, keep_alive) = match incoming {
                Ok(Incoming::Closed) => return Ok(()),
                Ok(Incoming::Refused(request, response, body_read)) => {
                    (request, response, body_read)
                }
                Ok(Incoming::Request(mut request)) => {
                    let (response, keep_alive) = self.run(&mut request);
                    (request, response, keep_alive)
                }
                Err(WireError::Io(e)) => return Err(e),
                Err(e) => {
                    let (status, kind) = match e {
                        WireError::BodyTooLarge { .. } => (413, "content_too_long_exception"),
                        _ => (400, "illegal_argument_exception"),
                    };
                    let body = ApiError::new(status, kind, e.to_string())
                        .body()
                        .to_string()
                        .into_bytes();
                    wire::write_response(
                        &mut writer,
                        Response::json(status, body),
                        false,
                        false,
                        false,
                    )?;
                    drop(writer);
                    self.linger(&mut reader);
                    return Ok(());
                }
            };
            let head_only = request.method == "HEAD";
            let gzip = request
                .header("accept-encoding")
                .is_some_and(|a| a.contains("gzip"));
            let keep_alive =
                keep_alive && request.keep_alive() && !self.shutdown.load(Ordering::Acquire);
            wire::write_response(&mut writer, response, head_only, gzip, keep_alive)?;
            if !keep_alive {
                return Ok(());
            }
        }
    }

    /// Before a connection refused mid-request closes: reads and drops what
    /// the client still sends, for at most `LINGER` and `LINGER_MOST_BYTES`.
    /// Closing with unread bytes makes the kernel reset the connection,
    /// and a reset discards the error reply the client has not read yet
    /// (a client sending a body over the limit would see "connection reset"
    /// instead of 413).
    fn linger<S: Read>(&self, reader: &mut BufReader<S>) {
        self.deadline.set(Some(Instant::now() + LINGER));
        let mut drained = 0usize;
        let mut chunk = [0u8; 16 << 10];
        while drained < LINGER_MOST_BYTES {
            match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        self.deadline.set(None);
    }

    /// Reads a request's head, decides whether it may run, and only then
    /// reads its body (a refused one's only when it is small). A client
    /// that waits for `100 Continue` gets it once the request is allowed
    /// and its declared body fits the limit.
    fn read<S: Read + Write>(&self, reader: &mut BufReader<S>) -> Result<Incoming, WireError> {
        let max_body_bytes = self.config.max_body_bytes;
        let Some(mut request) = wire::read_request_head(reader)? else {
            return Ok(Incoming::Closed);
        };
        if let Some(response) = refusal(&request, &self.peer, self.config) {
            let body_read = !wire::expects_continue(&request)
                && wire::read_body(reader, &mut request, MAX_UNAUTHORIZED_BODY_BYTES).is_ok();
            return Ok(Incoming::Refused(request, response, body_read));
        }
        if wire::expects_continue(&request) {
            wire::declared_length(&request, max_body_bytes)?;
            let out = reader.get_mut();
            out.write_all(wire::CONTINUE)?;
            out.flush()?;
        }
        wire::read_body(reader, &mut request, max_body_bytes)?;
        Ok(Incoming::Request(request))
    }

    /// Runs an allowed request; whether the connection may go on. A panic
    /// in the API is a bug: it is answered 500 and the connection closed,
    /// instead of the connection ending without a word.
    fn run(&self, request: &mut wire::Request) -> (Response, bool) {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.api.handle(request))) {
            Ok(response) => (response, true),
            Err(_) => {
                log::error!(
                    "http: a {} {} request panicked; answered 500",
                    request.method,
                    request.path
                );
                let e = ApiError::new(
                    500,
                    "exception",
                    "the server failed on this request (a bug: its log has the details)",
                );
                (
                    Response::json(500, e.body().to_string().into_bytes()),
                    false,
                )
            }
        }
    }
}

fn unauthorized(request: &wire::Request) -> Response {
    let challenge = "Basic realm=\"security\" charset=\"UTF-8\"";
    let e = ApiError::new(
        401,
        "security_exception",
        format!(
            "missing authentication credentials for REST request [{}]",
            request.path
        ),
    )
    .with(
        "header",
        serde_json::json!({ "WWW-Authenticate": challenge }),
    );
    let mut r = Response::json(401, e.body().to_string().into_bytes());
    r.headers.push(("WWW-Authenticate", challenge.into()));
    r
}
