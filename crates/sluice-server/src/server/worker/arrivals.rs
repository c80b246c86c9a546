//! Connections arriving: counted against `maxclients`, accepted from
//! the ring, handed over by other workers, or made over shared memory.

use super::Worker;
use crate::server::conn::{Conn, ShmLink, Transport};
use crate::session::Session;
use sluice_io::net::ConnId;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Redis's reply to a client over `maxclients`.
const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

impl Worker {
    /// Counts a new connection in; false (and Redis's error sent) if it
    /// is over the client limit or the server stops.
    fn count_in(&self, mut refuse: impl FnMut(&[u8])) -> bool {
        let shared = &self.shared;
        shared
            .stats
            .connections_received
            .fetch_add(1, Ordering::Relaxed);
        let admitted = shared
            .clients
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < shared.max_clients.load(Ordering::Relaxed)).then_some(n + 1)
            })
            .is_ok();
        if !admitted || shared.stopping() {
            shared
                .stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            if admitted {
                shared.clients.fetch_sub(1, Ordering::AcqRel);
            }
            refuse(MAX_CLIENTS_REPLY);
            return false;
        }
        true
    }

    /// Takes a new connection on the Unix socket (Redis's `unixsocket`).
    pub(super) fn admit_unix(&mut self, mut stream: UnixStream) -> std::io::Result<()> {
        let admitted = self.count_in(|reply| {
            // A fresh socket's send buffer takes these few bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(reply);
        });
        if !admitted {
            return Ok(());
        }
        let id = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, &self.shared.config.users);
        let path = self
            .shared
            .config
            .unix_socket
            .as_ref()
            .map_or_else(|| "?".into(), |u| u.path.display().to_string());
        let conn = Conn::new(
            Transport::Unix(stream),
            format!("{path}:0"),
            session,
            self.shared.config.limits,
        );
        self.install(conn, path)
    }

    /// Takes a new TCP connection, or refuses it over the client limit or
    /// in protected mode (a TLS client hears `-DENIED` once its handshake
    /// is done, as Redis sends it).
    pub(super) fn admit(&mut self, mut stream: TcpStream, tls: bool) -> std::io::Result<()> {
        let denied = self.shared.denies(stream.peer_addr().ok().as_ref());
        if denied && !tls {
            self.shared
                .stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            // A fresh socket's send buffer takes these bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(crate::server::DENIED_REPLY);
            return Ok(());
        }
        let admitted = self.count_in(|reply| {
            // A fresh socket's send buffer takes these few bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(reply);
        });
        if !admitted {
            return Ok(());
        }
        let shared = &self.shared;
        let _ = stream.set_nodelay(true);
        let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, &shared.config.users);
        let addr = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let laddr = stream
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let mut conn = Conn::new(Transport::Tcp(stream), addr, session, shared.config.limits);
        conn.denied = denied;
        if tls {
            let Some(settings) = &shared.config.tls else {
                return Ok(());
            };
            match rustls::ServerConnection::new(settings.config.clone()) {
                Ok(mut t) => {
                    // The connection's own limits bound what waits here.
                    t.set_buffer_limit(None);
                    conn.tls = Some(Box::new(t));
                }
                Err(e) => {
                    log::warn!("TLS refused a connection: {e}");
                    shared.clients.fetch_sub(1, Ordering::AcqRel);
                    return Ok(());
                }
            }
        }
        self.install(conn, laddr)
    }

    /// Gives `conn` a slot, arms its recv, and registers it.
    fn install(&mut self, mut conn: Conn, laddr: String) -> std::io::Result<()> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as ConnId
            }
        };
        self.ring.recv(slot, &conn.stream)?;
        conn.recv_armed = true;
        if conn.stream.is_shm() {
            self.shm_conns.push(slot);
        }
        self.shared.registry.insert(
            conn.session.id(),
            crate::server::ClientEntry {
                addr: conn.addr.clone(),
                laddr,
                name: Vec::new(),
                user: conn.session.user().name().to_vec(),
                lib_name: Vec::new(),
                lib_ver: Vec::new(),
                created: Instant::now(),
                worker: self.index,
                slot,
                db: 0,
                pushes: self.pushes.clone(),
                live: conn.live.clone(),
            },
        );
        conn.slot = slot;
        conn.worker = self.index;
        conn.wakes = Some(self.wakes.clone());
        conn.pushes = Some(self.pushes.clone());
        conn.scripts_done = Some(self.scripts_done.clone());
        conn.errors = Some(self.shared.stats.errors.clone());
        self.conns[slot as usize] = Some(conn);
        self.events.touched.push(slot);
        Ok(())
    }

    /// Takes the shared-memory clients the acceptor handed over.
    pub(super) fn take_arrivals(&mut self) -> std::io::Result<()> {
        let arrivals = self.inbox.take();
        let Some(settings) = self
            .shared
            .config
            .shm
            .as_ref()
            .filter(|_| !arrivals.is_empty())
        else {
            return Ok(());
        };
        let addr = crate::server::shm::client_addr(&settings.path);
        let laddr = settings.path.display().to_string();
        for arrival in arrivals {
            let session = Session::new(arrival.id, &self.shared.config.users);
            let link = ShmLink {
                channel: arrival.channel,
                sock: arrival.sock,
            };
            log::debug!("shared-memory client {} (pid {})", arrival.id, arrival.pid);
            let conn = Conn::new(
                Transport::Shm(Box::new(link)),
                addr.clone(),
                session,
                self.shared.config.limits,
            );
            self.install(conn, laddr.clone())?;
        }
        Ok(())
    }
}
