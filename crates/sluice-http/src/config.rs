//! How the HTTP API listens and serves: address, limits, credentials,
//! TLS and the threads of its network model.

use std::net::SocketAddr;
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
    /// Threads that run requests (0: [`default_request_threads`]).
    pub request_threads: usize,
    /// Threads serving connections on rings (0: [`default_ring_threads`]).
    pub ring_threads: usize,
}

/// Ring threads by default: one per two cores, at least one, at most
/// four — a ring only receives, frames and sends.
pub fn default_ring_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.div_ceil(2).clamp(1, 4)
}

/// Threads that run requests by default: four per core, at least eight —
/// requests wait on the device and the log as often as they compute.
pub fn default_request_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 4).clamp(8, 256)
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
            .field("request_threads", &self.request_threads)
            .field("ring_threads", &self.ring_threads)
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
            request_threads: 0,
            ring_threads: 0,
        }
    }
}
