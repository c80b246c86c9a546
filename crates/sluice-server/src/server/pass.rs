//! One serving pass of a worker over its connections with requests: the
//! plain paths (a lone GET, SET or PING answered without the general
//! dispatch), pipelined writes of one kind grouped into one store batch
//! (`Grouped`), and every other request through `dispatch`.

use super::clock::CommandClock;
use super::conn::Conn;
use super::{dispatch, Shared, WorkerStats};
use crate::commands::key_group::{self, KeyGroup};
use crate::commands::set_group::{self, GroupOutcome, SetGroup};
use sluice_io::net::ConnId;
use sluice_store::ReadCache;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Longest key a plain GET is answered for without an argument list.
pub(super) const PLAIN_GET_KEY_MAX_BYTES: usize = 256;

/// Rounds of device reads one request may wait for on the fill queue (a
/// GET: an index and a block per table it looks in, one a round; MGET and
/// the other commands that read keys: every key's next read at once, a
/// round); past them it reads on the worker.
pub(super) const MAX_FILL_ROUNDS: u8 = 8;

/// What one serving pass of a worker shares across its connections.
pub(super) struct Pass<'a> {
    pub(super) shared: &'a Shared,
    pub(super) store: &'a sluice_store::Store,
    pub(super) max_pipeline: usize,
    pub(super) shm_out_limit: usize,
    pub(super) stats: &'a WorkerStats,
    /// Whether its commands may take stripe locks ([`super::scripting::TurnGate`]).
    pub(super) may_lock: bool,
}

/// Why a connection's pass stopped.
pub(super) enum Stop {
    /// Its input for this turn is done (or it must wait).
    Done,
    /// Its next request (a command that reads keys) needs these reads from
    /// the device first.
    Missed(Vec<sluice_store::CacheMiss>),
    /// Its next request needs device reads and the fill queue is full: it
    /// waits for room.
    NoRoom,
    /// Its SETs in the group must be committed before it goes on; then,
    /// if given, its input was malformed and this error ends it.
    GroupFirst(Option<Vec<u8>>),
}

/// What became of a connection's next request on the plain GET path.
pub(super) enum PlainGet {
    /// It is no plain GET: the general path runs it.
    Other,
    /// Answered.
    Answered,
    /// It needs this read from the device first; it stays in the input.
    Missed(sluice_store::CacheMiss),
    /// It needs a device read and the fill queue is full; it stays in the
    /// input.
    NoRoom,
}

/// Starts the reads of `misses` on `fills`, each with `token`; how many
/// started (0: the command reads on the worker).
pub(super) fn start_fills(
    fills: &mut sluice_store::FillQueue,
    misses: Vec<sluice_store::CacheMiss>,
    token: u64,
) -> u16 {
    let mut started = 0u16;
    for miss in misses {
        if !fills.has_room() {
            break;
        }
        match fills.start(miss, token) {
            Ok(()) => started += 1,
            Err(e) => log::warn!("a device read for a command could not start: {e}"),
        }
    }
    started
}

/// The fill queue's token for a read of connection `id`'s client
/// `session_id`: a read that completes after its client left does not
/// wake the next client of the slot.
pub(super) fn fill_token(id: ConnId, session_id: u64) -> u64 {
    (session_id << 32) | u64::from(id)
}

/// A simple-string OK, the same in RESP2 and RESP3.
const OK_REPLY: &[u8] = b"+OK\r\n";

/// Plain writes of a pass waiting for one commit — SETs, or writes of
/// one other kind ([`KeyGroup`]), never both — and the connection each
/// came from (in arrival order).
#[derive(Default)]
pub(super) struct Grouped {
    sets: SetGroup,
    keys: KeyGroup,
    askers: Vec<u32>,
}

/// Plain GETs a connection's pipeline has their memory asked for ahead of
/// the one served.
const PLAIN_GETS_AHEAD: usize = 8;

/// Whether `c`'s next request may take a plain path (a SET or GET framed
/// in place): none is deferred, no transaction is open, and the client
/// has authenticated (each path then asks whether its user may run it on
/// the key it names).
fn plain_path_open(c: &Conn) -> bool {
    c.deferred.is_none() && !c.session.unauthenticated() && plain_path_open_for(c)
}

/// Whether `c`'s command may take a fast path at all: not inside MULTI,
/// not subscribed (its commands go through the subscriber context's
/// check), and every reply sent (CLIENT REPLY OFF or SKIP: the general
/// path knows to drop them).
fn plain_path_open_for(c: &Conn) -> bool {
    c.tx.is_none() && !c.subscriptions.any() && c.replies == super::conn::Replies::On
}

/// Connection `id` unless it is gone or dying.
fn live(conns: &mut [Option<Conn>], id: u32) -> Option<&mut Conn> {
    conns[id as usize].as_mut().filter(|c| !c.dead)
}

impl Grouped {
    /// Whether connection `id` has writes waiting here: a connection is
    /// served in one stretch, so its writes are the last ones.
    fn holds(&self, id: u32) -> bool {
        self.askers.last() == Some(&id)
    }

    /// Whether it should be committed before it takes another.
    fn is_full(&self) -> bool {
        self.sets.is_full() || self.keys.is_full()
    }

    /// Whether it may take a SET (`kind` None) or a write of `kind` now,
    /// without a commit first.
    fn fits(&self, kind: Option<key_group::Kind>) -> bool {
        match kind {
            None => self.keys.is_empty(),
            Some(kind) => self.sets.is_empty() && self.keys.takes(kind),
        }
    }

    /// Commits what it holds and queues each command its reply (after the
    /// log position to wait for, in `always`).
    pub(super) fn commit(
        &mut self,
        shared: &Shared,
        conns: &mut [Option<Conn>],
        reads: &mut ReadCache,
    ) {
        if !self.keys.is_empty() {
            return self.commit_keys(shared, conns, reads);
        }
        if self.sets.is_empty() {
            return;
        }
        // Drained, not taken: the list keeps its room for the next group.
        let Grouped { sets, askers, .. } = self;
        let askers = askers.drain(..);
        let started = Instant::now();
        let outcome = sets.commit(&shared.db);
        // Each SET is counted with its share of the group's commit.
        let each_us = started.elapsed().as_micros() as u64 / askers.len().max(1) as u64;
        match outcome {
            GroupOutcome::Committed(logged) => {
                shared.committer.wrote(logged.position);
                let holds = shared
                    .durability()
                    .holds(shared.db.store(), logged.position);
                for id in askers {
                    if let Some(c) = live(conns, id) {
                        if holds {
                            c.hold_until(logged.position);
                        }
                        c.push_bytes(OK_REPLY);
                        dispatch::count_call(shared, c.worker, *crate::acl::SET_ID, each_us, None);
                        WorkerStats::add(&shared.stats.by_worker[c.worker].changes, 1);
                    }
                }
            }
            GroupOutcome::Failed(error) => {
                for id in askers {
                    if let Some(c) = live(conns, id) {
                        c.push_reply(&error);
                    }
                }
            }
            GroupOutcome::OneByOne(sets) => {
                let mut clock = CommandClock::start();
                for (id, args) in askers.into_iter().zip(sets) {
                    if let Some(c) = live(conns, id) {
                        dispatch::execute(shared, c, &args, reads, &mut clock);
                    }
                }
            }
        }
    }

    /// [`Grouped::commit`] of a [`KeyGroup`].
    fn commit_keys(&mut self, shared: &Shared, conns: &mut [Option<Conn>], reads: &mut ReadCache) {
        let started = Instant::now();
        let Some(done) = self.keys.commit(&shared.db, reads, super::now_ms()) else {
            return;
        };
        let askers = self.askers.drain(..);
        // Each command is counted with its share of the group's run.
        let each_us = started.elapsed().as_micros() as u64 / askers.len().max(1) as u64;
        if let Some(at) = done.position {
            shared.committer.wrote(at);
            // Clients blocked on these keys look again (BLPOP, BZPOPMIN).
            // (Groups form only while no one is blocked: one who blocked
            // since is served after the whole group, as if it came later.)
            let _woken =
                dispatch::signal_writes(shared, done.commands.iter().map(|(db, a)| (*db, a)));
        }
        let hold = done
            .position
            .filter(|&at| shared.durability().holds(shared.db.store(), at));
        let command = crate::acl::lookup(done.kind.name());
        for (id, reply) in askers.zip(done.replies) {
            let Some(c) = live(conns, id) else {
                continue;
            };
            if let Some(at) = hold {
                c.hold_until(at);
            }
            let failed = matches!(reply, crate::resp::Reply::Error(_));
            if !failed && done.position.is_some() {
                WorkerStats::add(&shared.stats.by_worker[c.worker].changes, 1);
            }
            c.push_reply(&reply);
            if let Some(command) = command {
                dispatch::count_call(shared, c.worker, command, each_us, failed.then_some(false));
            }
        }
    }
}

impl Pass<'_> {
    /// Puts `c`'s next request into the group if it is a plain `SET key
    /// value` the group takes, framed where it lies (no argument list);
    /// whether it did. Anything else is left to the general path, which
    /// would group the same SET.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a plain SET peeked"
    )]
    fn take_plain_set(&self, c: &mut Conn, id: u32, group: &mut Grouped) -> bool {
        if !plain_path_open(c) || !group.fits(None) || self.shared.fast_paths_closed() {
            return false;
        }
        let Some((key, value, len)) = c.reader.peek_plain_set() else {
            return false;
        };
        if !c.session.allows_plain(&self.shared.config.users, true, key) {
            return false;
        }
        if !self.shared.db.entry_fits(key, value)
            || self.store.write_pressure()
            || self.shared.tunables.writes_need_replicas()
        {
            return false;
        }
        if value.len() >= set_group::LARGE_VALUE_BYTES {
            // Held where it arrived: the group takes the request buffer.
            let (buf, key, value) = c.reader.take_plain_set().expect("a plain SET peeked");
            group.sets.push_large(c.session.db(), buf, key, value);
        } else {
            group.sets.push_set(c.session.db(), key, value);
            c.reader.consume(len);
        }
        group.askers.push(id);
        true
    }

    /// Whether a script of another client has run past
    /// busy-reply-threshold (`c`'s commands get BUSY).
    fn busy_for(&self, c: &Conn) -> bool {
        let busy_ms = self.shared.tunables.busy_reply_ms.load(Ordering::Relaxed);
        self.shared
            .scripts
            .busy_for(c.session.id(), busy_ms)
            .is_some()
    }

    /// Answers `c`'s next request if it is a plain `PING` (no message) of
    /// a user allowed every command, framed where it lies; whether it did.
    /// The general path answers the same `+PONG` after a dozen lookups
    /// (dispatch, ACL, database, the command table: a quarter of a
    /// pipelined PING's time); it keeps every PING of a connection with
    /// writes in the group (its reply follows theirs) and while a script
    /// is busy (BUSY).
    fn take_plain_ping(
        &self,
        c: &mut Conn,
        id: u32,
        group: &Grouped,
        clock: &mut CommandClock,
    ) -> bool {
        if !plain_path_open(c) || group.holds(id) || self.shared.fast_paths_closed() {
            return false;
        }
        let Some(len) = c.reader.peek_plain_ping() else {
            return false;
        };
        if !c.session.unrestricted(&self.shared.config.users) || self.busy_for(c) {
            return false;
        }
        c.reader.consume(len);
        c.push_bytes(b"+PONG\r\n");
        let us = clock.lap_us();
        dispatch::count_call(self.shared, c.worker, *crate::acl::PING_ID, us, None);
        true
    }

    /// Answers `c`'s next request if it is a plain `GET key` (a key of up
    /// to [`PLAIN_GET_KEY_MAX_BYTES`]), framed where it lies (no argument
    /// list); whether it did. A connection with SETs in the group leaves
    /// it to the general path, which commits them first.
    fn take_plain_get(
        &self,
        c: &mut Conn,
        id: u32,
        group: &Grouped,
        reads: &mut ReadCache,
        clock: &mut CommandClock,
        fill_room: usize,
    ) -> PlainGet {
        if !plain_path_open(c)
            || group.holds(id)
            || self.shared.fast_paths_closed()
            || !self.may_lock
        {
            // While a script runs it waits (an expired key's removal takes
            // its stripe lock); past busy-reply-threshold, BUSY.
            return PlainGet::Other;
        }
        let Some((key, len)) = c.reader.peek_plain_get() else {
            return PlainGet::Other;
        };
        if !c
            .session
            .allows_plain(&self.shared.config.users, false, key)
        {
            return PlainGet::Other;
        }
        // Copied out of the reader: the reply goes into the same connection.
        let mut key_bytes = [0u8; PLAIN_GET_KEY_MAX_BYTES];
        let Some(copy) = key_bytes.get_mut(..key.len()) else {
            return PlainGet::Other;
        };
        copy.copy_from_slice(key);
        // The GETs queued behind it have their first look into memory
        // asked for now, to arrive while this one and the next are served.
        let space = self.shared.db.space_used(c.session.db());
        c.reader.plain_gets_ahead(PLAIN_GETS_AHEAD, |key| {
            self.shared.db.prefetch_record(reads, space, key);
        });
        // A GET that would read the device hands the read to the fill
        // queue and stays in the input, to run again once it is done (with
        // the queue full, once there is room); one that missed too often
        // reads here.
        let wait = c.fills >= MAX_FILL_ROUNDS;
        let now_ms = clock.wall_ms();
        match dispatch::get_key_or_miss(self.shared, c, copy, wait, reads, now_ms) {
            Ok(()) => {
                c.reader.consume(len);
                c.fills = 0;
                let us = clock.lap_us();
                dispatch::count_call(self.shared, c.worker, *crate::acl::GET_ID, us, None);
                PlainGet::Answered
            }
            Err(_) if fill_room == 0 => PlainGet::NoRoom,
            Err(miss) => PlainGet::Missed(miss),
        }
    }

    /// The device reads `c`'s next command, `args`, would wait for, when
    /// it is one that reads keys and may leave them to the fill queue (up
    /// to `fill_room` of them; with none, one, to tell it must wait for
    /// room); empty: it runs now.
    fn misses_of(
        &self,
        c: &Conn,
        args: &crate::resp::Args,
        reads: &mut ReadCache,
        fill_room: usize,
    ) -> Vec<sluice_store::CacheMiss> {
        if c.fills >= MAX_FILL_ROUNDS || !dispatch::acl_allows(self.shared, c, args) {
            return Vec::new();
        }
        let most = fill_room.max(1);
        let database = c.session.db();
        match &c.tx {
            None => dispatch::misses(self.shared, database, args, reads, most),
            // EXEC runs its queue holding every stripe lock: what the
            // queued commands read comes in before it takes them.
            Some(tx) if !tx.dirty && args.len() == 1 && args[0].eq_ignore_ascii_case(b"exec") => {
                let mut out = Vec::new();
                for queued in &tx.queued {
                    if out.len() >= most {
                        break;
                    }
                    out.extend(dispatch::misses(
                        self.shared,
                        database,
                        queued,
                        reads,
                        most - out.len(),
                    ));
                }
                out
            }
            // Queued inside MULTI: nothing is read yet.
            Some(_) => Vec::new(),
        }
    }

    /// Whether `c`'s next command waits for the waiters its last write
    /// woke to run theirs (up to [`super::blocking::WAKE_WAIT`]).
    fn waits_for_woken(&self, c: &mut Conn) -> bool {
        let Some(until) = c.woke_until else {
            return false;
        };
        if self.shared.blocking.any_in_flight(&c.woke) && Instant::now() < until {
            return true;
        }
        c.woke_until = None;
        c.woke.clear();
        false
    }

    /// Runs `c`'s requests until its input is done, the pipeline limit,
    /// back-pressure, or the group must be committed first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_conn(
        &self,
        c: &mut Conn,
        id: u32,
        n: &mut usize,
        group: &mut Grouped,
        reads: &mut ReadCache,
        clock: &mut CommandClock,
        deferring: &mut bool,
        fill_room: usize,
    ) -> Stop {
        if !c.more_input || c.dead || c.parked_reads > 0 || c.blocked.is_some() || c.script_pending
        {
            return Stop::Done;
        }
        let mut held_back = false;
        clock.restart();
        while *n < self.max_pipeline && !c.quit {
            if self.waits_for_woken(c) {
                // Its write woke a waiter who runs first (as Redis serves
                // a woken client before the writer's next command).
                held_back = true;
                break;
            }
            if c.stream.is_shm() && c.backlog_bytes() >= self.shm_out_limit {
                held_back = true;
                break;
            }
            match self.take_plain_get(c, id, group, reads, clock, fill_room) {
                PlainGet::Answered => {
                    WorkerStats::add(&self.stats.commands_processed, 1);
                    *n += 1;
                    continue;
                }
                PlainGet::Missed(miss) => return Stop::Missed(vec![miss]),
                PlainGet::NoRoom => return Stop::NoRoom,
                PlainGet::Other => {}
            }
            if self.take_plain_ping(c, id, group, clock) {
                WorkerStats::add(&self.stats.commands_processed, 1);
                *n += 1;
                continue;
            }
            if !self.may_lock && !self.busy_for(c) {
                // A script holds every stripe lock: the command waits
                // unread (as Redis reads nothing while a script runs) —
                // past busy-reply-threshold it goes on to get BUSY.
                held_back = true;
                *deferring = true;
                break;
            }
            if self.may_lock && self.take_plain_set(c, id, group) {
                WorkerStats::add(&self.stats.commands_processed, 1);
                *n += 1;
                if group.is_full() {
                    return Stop::GroupFirst(None);
                }
                continue;
            }
            let next = match c.deferred.take() {
                Some(args) => Ok(Some(args)),
                None => c.reader.next(c.session.unauthenticated()),
            };
            let args = match next {
                Ok(Some(args)) => args,
                Ok(None) => break,
                Err(e) if group.holds(id) => return Stop::GroupFirst(Some(e.reply())),
                Err(e) => {
                    c.push_bytes(&e.reply());
                    c.quit = true;
                    c.closing = true;
                    continue;
                }
            };
            if let Some(busy) = dispatch::busy_reply(self.shared, c, &args) {
                if group.holds(id) {
                    // Its SETs first, so that its replies keep their order.
                    c.deferred = Some(args);
                    return Stop::GroupFirst(None);
                }
                c.push_reply(&busy);
                *n += 1;
                continue;
            }
            if super::pause::holds(self.shared, c, &args) {
                // Its SETs first (they ran before the pause was seen).
                let group_first = group.holds(id);
                c.deferred = Some(args);
                if group_first {
                    return Stop::GroupFirst(None);
                }
                if !c.postponed {
                    c.postponed = true;
                    self.shared.pause.postponed.fetch_add(1, Ordering::Relaxed);
                }
                *deferring = true;
                break;
            }
            if c.postponed {
                c.postponed = false;
                self.shared.pause.postponed.fetch_sub(1, Ordering::Relaxed);
            }
            let open = plain_path_open_for(c)
                && !self.shared.fast_paths_closed()
                && !self.shared.tunables.writes_need_replicas();
            let set = open && SetGroup::takes(&self.shared.db, &args);
            // While a client is blocked, each write runs alone: Redis serves
            // a blocked client between two pipelined pushes, not after both.
            let kind = if open && !set && !self.shared.blocking.any() {
                key_group::Kind::of(&args)
            } else {
                None
            };
            // A write of another kind reads its keys on the device through
            // the fill queue first, alone.
            let groupable = (set || kind.is_some())
                && dispatch::acl_allows(self.shared, c, &args)
                && (kind.is_none() || self.misses_of(c, &args, reads, fill_room).is_empty());
            if groupable && !group.fits(kind) {
                // One kind at a time: what the group holds goes first.
                c.deferred = Some(args);
                return Stop::GroupFirst(None);
            }
            if !groupable && group.holds(id) {
                // Its SETs first: this command sees them, and its reply
                // follows theirs.
                c.deferred = Some(args);
                return Stop::GroupFirst(None);
            }
            if !groupable {
                // What it reads comes in from the device first, off the
                // worker; it runs once that is done.
                let misses = self.misses_of(c, &args, reads, fill_room);
                if !misses.is_empty() {
                    c.deferred = Some(args);
                    return if fill_room == 0 {
                        Stop::NoRoom
                    } else {
                        Stop::Missed(misses)
                    };
                }
                c.fills = 0;
            }
            if !groupable
                && plain_path_open_for(c)
                && !self.shared.fast_paths_closed()
                && dispatch::try_get(self.shared, c, &args, reads, clock.wall_ms())
            {
                let us = clock.lap_us();
                dispatch::count_call(self.shared, c.worker, *crate::acl::GET_ID, us, None);
                WorkerStats::add(&self.stats.commands_processed, 1);
                *n += 1;
                continue;
            }
            // Back-pressure: while the store is behind on flushes and
            // compactions, writes wait here (reads and other connections
            // go on) instead of the store flushing on this thread.
            if (groupable || dispatch::may_write(c, &args)) && self.store.write_pressure() {
                self.shared
                    .stats
                    .write_pressure_waits
                    .fetch_add(1, Ordering::Relaxed);
                c.deferred = Some(args);
                *deferring = true;
                break;
            }
            WorkerStats::add(&self.stats.commands_processed, 1);
            *n += 1;
            if groupable {
                match kind {
                    Some(kind) => group.keys.push(kind, c.session.db(), args),
                    None => group.sets.push(c.session.db(), args),
                }
                group.askers.push(id);
                if group.is_full() {
                    return Stop::GroupFirst(None);
                }
            } else {
                dispatch::execute(self.shared, c, &args, reads, clock);
                if c.blocked.is_some() || c.script_pending {
                    // Nothing more of it runs until it is served, its time
                    // is up, or its script's reply is back (each sets
                    // `more_input` again).
                    c.more_input = false;
                    return Stop::Done;
                }
            }
        }
        c.more_input = *n == self.max_pipeline || c.deferred.is_some() || held_back;
        if c.waiting_bytes() > self.shared.config.max_output_bytes {
            log::warn!(
                "closing client {}: {} reply bytes wait for it (limit {})",
                c.addr,
                c.waiting_bytes(),
                self.shared.config.max_output_bytes
            );
            c.dead = true;
        }
        Stop::Done
    }
}
