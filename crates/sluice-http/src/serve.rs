//! The HTTP listener: one thread accepts, one thread per connection (up to
//! a limit) reads requests and answers them, keep-alive between requests.

use crate::api::Api;
use crate::error::ApiError;
use crate::wire::{self, Response, WireError};
use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the HTTP API listens.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Where (port 0: any free port).
    pub addr: SocketAddr,
    /// Most connections open at once; more are answered 429 and closed.
    pub max_connections: usize,
    /// `http.max_content_length`: the largest request body.
    pub max_body_bytes: usize,
    /// A connection idle this long between requests is closed.
    pub idle_timeout: Duration,
    /// Basic-auth users (`name`, `password`); none: no authentication.
    pub users: Vec<(String, String)>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 9200)),
            max_connections: 1024,
            max_body_bytes: 100 << 20,
            idle_timeout: Duration::from_secs(300),
            users: Vec::new(),
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

fn authorized(req: &wire::Request, users: &[(String, String)]) -> bool {
    if users.is_empty() {
        return true;
    }
    let Some(value) = req.header("authorization") else {
        return false;
    };
    let Some(encoded) = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
    else {
        return false;
    };
    use base64::Engine;
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let text = String::from_utf8_lossy(&decoded);
    let Some((name, password)) = text.split_once(':') else {
        return false;
    };
    users.iter().any(|(u, p)| u == name && p == password)
}

fn serve_connection(
    stream: TcpStream,
    api: &Api,
    config: &HttpConfig,
    shutdown: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(POLL_INTERVAL))?;
    let mut reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(64 << 10, stream);
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
        reader
            .get_ref()
            .set_read_timeout(Some(config.idle_timeout))?;
        let request = wire::read_request(&mut reader, config.max_body_bytes);
        reader.get_ref().set_read_timeout(Some(POLL_INTERVAL))?;
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
        let response = if authorized(&request, &config.users) {
            api.handle(&request)
        } else {
            let e = ApiError::new(401, "security_exception", format!("missing authentication credentials for REST request [{}]", request.path))
                .with("header", serde_json::json!({"WWW-Authenticate": "Basic realm=\"security\" charset=\"UTF-8\""}));
            let mut r = Response::json(401, e.body().to_string().into_bytes());
            r.headers.push((
                "WWW-Authenticate",
                "Basic realm=\"security\" charset=\"UTF-8\"".into(),
            ));
            r
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
