//! The HTTP listener: its start and stop. Connections are served on
//! network rings ([`crate::ring`]), requests run on a pool of threads
//! ([`crate::pool`]); the history sampler runs beside them.

use crate::api::Api;
pub use crate::config::{default_request_threads, default_ring_threads, HttpConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The listen backlog: a burst of connections waits here for the ring.
const LISTEN_BACKLOG: i32 = 4096;

/// A running HTTP listener.
pub struct HttpServer {
    addr: SocketAddr,
    anonymous: bool,
    shutdown: Arc<AtomicBool>,
    rings: Vec<std::thread::JoinHandle<()>>,
    pool: Option<Arc<crate::pool::Pool>>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

/// How often the history sampler looks at the shutdown flag.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

impl HttpServer {
    /// Binds and starts serving.
    pub fn start(api: Arc<Api>, config: HttpConfig) -> std::io::Result<HttpServer> {
        let listener = sluice_io::net::bind_listener(config.addr, LISTEN_BACKLOG)?;
        let addr = listener.local_addr()?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let anonymous =
            config.users.is_empty() && config.api_keys.is_empty() && !config.clients_verified;
        let threads = match config.request_threads {
            0 => default_request_threads(),
            n => n,
        };
        let pool = Arc::new(crate::pool::Pool::start(
            api.clone(),
            threads,
            shutdown.clone(),
        )?);
        let ring_threads = match config.ring_threads {
            0 => default_ring_threads(),
            n => n,
        };
        let settings = crate::ring::RingSettings {
            config: Arc::new(config),
            shutdown: shutdown.clone(),
            open: Arc::new(AtomicUsize::new(0)),
        };
        // Each ring is made on its own thread (it is single-issuer); what
        // making them found comes back before `start` returns.
        let listener = Arc::new(listener);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut rings = Vec::with_capacity(ring_threads);
        for i in 0..ring_threads {
            let (listener, settings, ring_pool) =
                (listener.clone(), settings.clone(), pool.clone());
            let ring_ready = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sluice-http-ring-{i}"))
                .spawn(
                    move || match crate::ring::RingLoop::new(&listener, settings, ring_pool) {
                        Ok(ring) => {
                            let _ = ring_ready.send(Ok(()));
                            ring.run();
                        }
                        Err(e) => {
                            let _ = ring_ready.send(Err(e));
                        }
                    },
                );
            match spawned {
                Ok(handle) => rings.push(handle),
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    break;
                }
            }
        }
        let mut made = Ok(());
        for _ in 0..ring_threads {
            let r = ready_rx
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("an HTTP ring thread ended")));
            if made.is_ok() {
                made = r;
            }
        }
        if let Err(e) = made {
            shutdown.store(true, Ordering::Release);
            for ring in rings {
                let _ = ring.join();
            }
            stop_pool(pool);
            return Err(e);
        }
        let sampled = (api, shutdown.clone());
        let sampler = std::thread::Builder::new()
            .name("sluice-http-history".into())
            .spawn(move || sample_history(&sampled.0, &sampled.1))?;
        Ok(HttpServer {
            addr,
            anonymous,
            shutdown,
            rings,
            pool: Some(pool),
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

    /// Stops accepting; requests running finish and are answered, then
    /// every connection closes.
    pub fn stop(mut self) {
        self.shutdown.store(true, Ordering::Release);
        let threads = std::mem::take(&mut self.rings)
            .into_iter()
            .chain(self.sampler.take());
        for thread in threads {
            let _ = thread.join();
        }
        if let Some(pool) = self.pool.take() {
            stop_pool(pool);
        }
    }
}

/// Ends the pool once the ring that shared it has ended.
fn stop_pool(pool: Arc<crate::pool::Pool>) {
    match Arc::try_unwrap(pool) {
        Ok(pool) => pool.stop(),
        Err(_) => {
            log::warn!("http: the request threads are still shared; left to end with the process")
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
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
