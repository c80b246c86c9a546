//! The HTTP listener: one thread accepts, one thread per connection (up to
//! a limit) reads requests and answers them, keep-alive between requests.

use crate::api::Api;
use crate::error::ApiError;
use crate::wire::{self, Response, WireError};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// Basic-auth users (`name`, `password`).
    pub users: Vec<(String, String)>,
    /// API keys (`id`, `key`), sent as `Authorization: ApiKey
    /// base64(id:key)`. With neither users nor keys: no authentication.
    pub api_keys: Vec<(String, String)>,
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
            .field("users", &self.users.len())
            .field("api_keys", &self.api_keys.len())
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
            users: Vec::new(),
            api_keys: Vec::new(),
            tls: None,
        }
    }
}

/// A running HTTP listener.
pub struct HttpServer {
    addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
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
        let acceptor = std::thread::Builder::new()
            .name("sluice-http-accept".into())
            .spawn(move || accept_loop(listener, api, config, flag))?;
        Ok(HttpServer {
            addr,
            shutdown,
            acceptor: Some(acceptor),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; connections finish the request they hold and close.
    pub fn stop(mut self) {
        self.shutdown.store(true, Ordering::Release);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
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
            Ok((stream, _)) => {
                workers.retain(|w| !w.is_finished());
                if open.load(Ordering::Acquire) >= config.max_connections {
                    refuse(stream, config.max_connections);
                    continue;
                }
                open.fetch_add(1, Ordering::AcqRel);
                let (api, config, open, shutdown) =
                    (api.clone(), config.clone(), open.clone(), shutdown.clone());
                let spawned = std::thread::Builder::new()
                    .name("sluice-http".into())
                    .spawn(move || {
                        if let Err(e) = serve_connection(stream, &api, &config, &shutdown) {
                            log::debug!("http connection: {e}");
                        }
                        open.fetch_sub(1, Ordering::AcqRel);
                    });
                match spawned {
                    Ok(h) => workers.push(h),
                    Err(e) => log::warn!("http: could not start a connection thread: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
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

fn authorized(req: &wire::Request, config: &HttpConfig) -> bool {
    if config.users.is_empty() && config.api_keys.is_empty() {
        return true;
    }
    let Some(value) = req.header("authorization") else {
        return false;
    };
    let (scheme, encoded) = value.split_once(' ').unwrap_or((value, ""));
    use base64::Engine;
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    let Some((name, secret)) = text.split_once(':') else {
        return false;
    };
    let known = if scheme.eq_ignore_ascii_case("basic") {
        &config.users
    } else if scheme.eq_ignore_ascii_case("apikey") {
        &config.api_keys
    } else {
        return false;
    };
    known.iter().any(|(u, p)| u == name && p == secret)
}

fn serve_connection(
    stream: TcpStream,
    api: &Api,
    config: &HttpConfig,
    shutdown: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(POLL_INTERVAL))?;
    let socket = stream.try_clone()?;
    match &config.tls {
        None => serve_stream(stream, &socket, api, config, shutdown),
        Some(tls) => {
            let conn = rustls::ServerConnection::new(tls.clone())
                .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
            serve_stream(
                rustls::StreamOwned::new(conn, stream),
                &socket,
                api,
                config,
                shutdown,
            )
        }
    }
}

fn serve_stream<S: Read + Write>(
    stream: S,
    socket: &TcpStream,
    api: &Api,
    config: &HttpConfig,
    shutdown: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let mut idle = Duration::ZERO;
    loop {
        if shutdown.load(Ordering::Acquire) {
            return Ok(());
        }
        // Wait for the first byte of a request with the short timeout, so
        // shutdown and the idle limit are seen; then read it whole.
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
        socket.set_read_timeout(Some(config.idle_timeout))?;
        let request = read_with_continue(&mut reader, config.max_body_bytes);
        socket.set_read_timeout(Some(POLL_INTERVAL))?;
        let mut writer = BufWriter::with_capacity(64 << 10, reader.get_mut());
        let request = match request {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
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
                return Ok(());
            }
        };
        let head_only = request.method == "HEAD";
        let response = if authorized(&request, config) {
            api.handle(&request)
        } else {
            unauthorized(&request)
        };
        let gzip = request
            .header("accept-encoding")
            .is_some_and(|a| a.contains("gzip"));
        let keep_alive = request.keep_alive() && !shutdown.load(Ordering::Acquire);
        wire::write_response(&mut writer, response, head_only, gzip, keep_alive)?;
        if !keep_alive {
            return Ok(());
        }
    }
}

/// Reads a request; a client that waits for `100 Continue` gets it once
/// the head is read and the declared body fits the limit.
fn read_with_continue<S: Read + Write>(
    reader: &mut BufReader<S>,
    max_body_bytes: usize,
) -> Result<Option<wire::Request>, WireError> {
    let Some(mut request) = wire::read_request_head(reader)? else {
        return Ok(None);
    };
    if wire::expects_continue(&request) {
        wire::declared_length(&request, max_body_bytes)?;
        let out = reader.get_mut();
        out.write_all(wire::CONTINUE)?;
        out.flush()?;
    }
    wire::read_body(reader, &mut request, max_body_bytes)?;
    Ok(Some(request))
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
