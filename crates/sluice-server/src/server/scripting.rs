//! Scripts: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FCALL and
//! FCALL_RO (FUNCTION's libraries are `server::functions`), run by the
//! Lua engine of `server::lua`.
//!
//! A script runs atomically: it holds every stripe lock and reads its own
//! writes through a transaction's overlay, and its writes are one store
//! batch, committed when it returns (also when it fails part way, as
//! Redis keeps what a failing script did).
//!
//! Scripts run on a thread of their own, one at a time, not on the
//! worker that received them: the worker hands the script over, parks
//! the connection (nothing more of it runs meanwhile, as after a blocking
//! command) and goes on serving its other clients, so a client on any
//! worker gets BUSY once a script has run past `busy-reply-threshold`,
//! and its SCRIPT KILL or FUNCTION KILL stops the script. The reply comes
//! back through the worker's mailbox with the log position of the
//! script's writes, and waits for durability there as any write's reply.
//! A script inside MULTI runs within EXEC, on the worker, under the
//! transaction's locks.

use super::conn::Conn;
use super::lua::{self, Program};
use super::mailbox::Mailbox;
use super::Shared;
use crate::commands::Ctx;
use crate::resp::{Args, Reply};
use sluice_io::net::ConnId;
use sluice_store::wal::LogPosition;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Scripts by their SHA1 (EVAL and SCRIPT LOAD add them), the script
/// running now, and the scripts waiting for the script thread.
#[derive(Default)]
pub struct Scripts {
    by_sha: Mutex<HashMap<String, Vec<u8>>>,
    /// The script running now, if any (one at a time: a script holds
    /// every stripe lock).
    running: Running,
    /// Scripts handed over by the workers, in order. At most one per
    /// connection (its connection runs nothing more until the reply), so
    /// never more than `maxclients`.
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    /// Set once the workers have stopped: the script thread ends.
    closed: AtomicBool,
    /// A shutdown began: a script starting now starts killed.
    stopping: AtomicBool,
    /// Bumped by SCRIPT FLUSH: a thread's Lua engine older than this
    /// starts afresh (a library is kept by its code's sha, so a changed
    /// library is a new one).
    generation: AtomicU64,
    /// Bytes of Lua memory after the last script (INFO's `used_memory_lua`).
    lua_memory: AtomicU64,
    /// Whether a worker's turn may take stripe locks now.
    pub(super) gate: Arc<TurnGate>,
}

/// Whether workers may take stripe locks. The script thread runs a batch
/// of scripts holding all of them: a worker that waited for one would
/// serve none of its clients — SCRIPT KILL and SHUTDOWN included — until
/// the script ended, and a script that never ends never would. So a
/// worker counts itself in for a turn that may take them and out after
/// it; the script thread says it wants them, waits for the turns under
/// way to end, then takes them. A turn that begins meanwhile takes none:
/// its clients' commands wait unread, and past busy-reply-threshold get
/// Redis's BUSY (but for the few Redis lets through). The two sides write
/// their own word and then read the other's, in one total order: either
/// the worker sees the script thread's wish, or the script thread sees
/// the worker's turn and waits for it.
#[derive(Debug, Default)]
pub struct TurnGate {
    wants_locks: AtomicBool,
    locking_turns: AtomicUsize,
}

impl TurnGate {
    /// A worker's turn begins; whether it may take stripe locks is the
    /// turn's `may_lock`, counted until it drops.
    pub(super) fn begin(&self) -> GatedTurn<'_> {
        self.locking_turns.fetch_add(1, Ordering::SeqCst);
        let may_lock = !self.wants_locks.load(Ordering::SeqCst);
        if !may_lock {
            self.locking_turns.fetch_sub(1, Ordering::SeqCst);
        }
        GatedTurn {
            gate: self,
            may_lock,
        }
    }

    /// The script thread's claim: once it returns, no worker's turn holds
    /// or will take a stripe lock until the claim drops.
    fn claim(&self) -> LocksClaimed<'_> {
        self.wants_locks.store(true, Ordering::SeqCst);
        // A turn is short: it serves what its clients sent, then ends.
        while self.locking_turns.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        LocksClaimed(self)
    }
}

/// A worker's turn under a [`TurnGate`].
pub(super) struct GatedTurn<'a> {
    gate: &'a TurnGate,
    /// Whether the turn may take stripe locks.
    pub(super) may_lock: bool,
}

impl Drop for GatedTurn<'_> {
    fn drop(&mut self) {
        if self.may_lock {
            self.gate.locking_turns.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The script thread's claim on the stripe locks ([`TurnGate::claim`]).
struct LocksClaimed<'a>(&'a TurnGate);

impl Drop for LocksClaimed<'_> {
    fn drop(&mut self) {
        self.0.wants_locks.store(false, Ordering::SeqCst);
    }
}

/// The script running now: when it started, who runs it, whether it has
/// written, and whether SCRIPT KILL (or a shutdown) asked it to stop.
#[derive(Default)]
struct Running {
    /// Microseconds since `epoch` when it started, plus one; 0: none.
    started_us: AtomicU64,
    client: AtomicU64,
    wrote: AtomicBool,
    /// It ran a read-only command (its caller's tracking remembers the
    /// script's keys).
    read: AtomicBool,
    /// An EVAL script (false: a function, which FUNCTION KILL stops).
    eval: AtomicBool,
    kill: Arc<AtomicBool>,
    /// Its name and command, for FUNCTION STATS.
    what: Mutex<Option<(String, Args)>>,
    epoch: std::sync::OnceLock<Instant>,
}

/// Redis's reply to a command while an EVAL script has run past
/// `busy-reply-threshold`.
pub(super) const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";

/// [`BUSY`] while a function runs.
pub(super) const BUSY_FUNCTION: &str =
    "BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.";

/// Most scripts run under one taking of the stripe locks (others' commands
/// wait meanwhile, as they wait for one script).
const MAX_BATCH: usize = 64;

/// Most scripts kept (each EVAL of a new body adds one; SCRIPT FLUSH
/// empties the cache).
const MAX_SCRIPTS: usize = 100_000;

/// What a worker hands the script thread.
pub(super) struct Job {
    what: Runnable,
    /// The whole command (EVAL or FCALL and its arguments).
    args: Args,
    numkeys: usize,
    read_only: bool,
    /// The user it runs as; None: one who may run everything (no check
    /// per command).
    user: Option<Arc<crate::acl::User>>,
    /// Its client's address and name (SLOWLOG's entry).
    addr: String,
    name: Vec<u8>,
    client: u64,
    /// Its client's CLIENT CACHING choice (tracking).
    caching: bool,
    /// The logical database its client had selected: the script starts
    /// there (a SELECT inside it changes only the script's).
    db: u8,
    slot: ConnId,
    done: Arc<DoneQueue>,
}

/// What a job runs.
pub(super) enum Runnable {
    /// An EVAL script: its code after any `#!` line, and its sha.
    Eval { code: Vec<u8>, sha: String },
    /// A function: its library's code after the `#!` line, and its name.
    Function { code: Arc<[u8]>, name: String },
}

/// A script's reply, back at the worker of its connection.
pub(super) struct Done {
    pub(super) slot: ConnId,
    pub(super) client: u64,
    pub(super) reply: Reply,
    /// Where its writes are in the log (the reply waits for them).
    pub(super) wrote: Option<LogPosition>,
    /// How long it ran (INFO commandstats counts it where it is answered).
    pub(super) us: u64,
}

/// Where a worker takes its connections' script replies.
pub(super) type DoneQueue = Mailbox<Done>;

impl Scripts {
    fn now_us(&self) -> u64 {
        let epoch = self.running.epoch.get_or_init(Instant::now);
        epoch.elapsed().as_micros() as u64 + 1
    }

    /// Marks a script of `client` as running; the flag its hook watches.
    fn begin(&self, client: u64, eval: bool, name: &str, args: &Args) -> Arc<AtomicBool> {
        let r = &self.running;
        *r.what.lock().unwrap_or_else(|p| p.into_inner()) = Some((name.to_string(), args.clone()));
        r.kill
            .store(self.stopping.load(Ordering::Acquire), Ordering::Release);
        r.wrote.store(false, Ordering::Release);
        r.read.store(false, Ordering::Release);
        r.eval.store(eval, Ordering::Release);
        r.client.store(client, Ordering::Release);
        r.started_us.store(self.now_us(), Ordering::Release);
        r.kill.clone()
    }

    fn end(&self) {
        self.running.started_us.store(0, Ordering::Release);
        self.running.kill.store(false, Ordering::Release);
        *self.running.what.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether the running script has written.
    pub(super) fn wrote(&self) -> bool {
        self.running.wrote.load(Ordering::Acquire)
    }

    /// See [`Scripts::generation`].
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Lua engines start afresh (SCRIPT FLUSH).
    pub(super) fn renew_engines(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn note_lua_memory(&self, bytes: u64) {
        self.lua_memory.store(bytes, Ordering::Relaxed);
    }

    /// INFO's `number_of_cached_scripts`.
    pub(super) fn cached(&self) -> usize {
        self.by_sha.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// INFO's `used_memory_lua`.
    pub(super) fn lua_memory(&self) -> u64 {
        self.lua_memory.load(Ordering::Relaxed)
    }

    /// The running script ran a read-only command.
    pub(super) fn note_read(&self) {
        self.running.read.store(true, Ordering::Release);
    }

    /// The running script wrote (SCRIPT KILL no longer stops it).
    pub(super) fn note_write(&self) {
        self.running.wrote.store(true, Ordering::Release);
    }

    /// The BUSY reply for a client other than `client` while a script has
    /// run for more than `threshold_ms`; None if none has.
    pub(super) fn busy_for(&self, client: u64, threshold_ms: u64) -> Option<&'static str> {
        let started = self.running.started_us.load(Ordering::Acquire);
        let busy = started != 0
            && self.running.client.load(Ordering::Acquire) != client
            && self.now_us().saturating_sub(started) > threshold_ms.saturating_mul(1000);
        match (busy, self.running.eval.load(Ordering::Acquire)) {
            (false, _) => None,
            (true, true) => Some(BUSY),
            (true, false) => Some(BUSY_FUNCTION),
        }
    }

    /// Stops the running script whatever it wrote, and any that starts
    /// from now on (a shutdown: their writes are discarded whole, none
    /// was acknowledged).
    pub(super) fn kill_for_shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        if self.running.started_us.load(Ordering::Acquire) != 0 {
            self.running.kill.store(true, Ordering::Release);
        }
    }

    /// Ends the script thread once it has run what it holds (the workers
    /// have stopped: nothing more comes).
    pub(super) fn close(&self) {
        let _jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::Release);
        self.ready.notify_all();
    }

    /// SCRIPT KILL (`eval`) or FUNCTION KILL, as Redis answers them.
    pub(super) fn kill(&self, eval: bool) -> Reply {
        if self.running.started_us.load(Ordering::Acquire) == 0 {
            return error("NOTBUSY No scripts in execution right now.");
        }
        if self.running.wrote.load(Ordering::Acquire) {
            return error("UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.");
        }
        match (eval, self.running.eval.load(Ordering::Acquire)) {
            (true, false) => return error(BUSY_FUNCTION),
            (false, true) => return error(BUSY),
            _ => {}
        }
        self.running.kill.store(true, Ordering::Release);
        Reply::Simple("OK".into())
    }

    /// Whether an EVAL script runs now (FUNCTION STATS refuses then).
    pub(super) fn eval_running(&self) -> bool {
        self.running.started_us.load(Ordering::Acquire) != 0
            && self.running.eval.load(Ordering::Acquire)
    }

    /// FUNCTION STATS's `running_script`: the running function's name,
    /// command and time so far; None when no function runs.
    pub(super) fn running_function(&self) -> Option<(String, Args, u64)> {
        let started = self.running.started_us.load(Ordering::Acquire);
        if started == 0 || self.running.eval.load(Ordering::Acquire) {
            return None;
        }
        let what = self
            .running
            .what
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let ms = self.now_us().saturating_sub(started) / 1000;
        Some((what.0, what.1, ms))
    }

    fn add(&self, body: &[u8]) -> String {
        let sha = sha1_hex(body);
        let mut by_sha = self.by_sha.lock().unwrap_or_else(|p| p.into_inner());
        if by_sha.len() >= MAX_SCRIPTS && !by_sha.contains_key(&sha) {
            by_sha.clear();
        }
        by_sha.entry(sha.clone()).or_insert_with(|| body.to_vec());
        sha
    }

    fn get(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.by_sha
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sha)
            .cloned()
    }

    fn submit(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(job);
        self.ready.notify_one();
    }

    /// The next scripts to run, at most [`MAX_BATCH`], in order; None once
    /// closed and nothing is left.
    fn next_jobs(&self) -> Option<Vec<Job>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if !jobs.is_empty() {
                let n = jobs.len().min(MAX_BATCH);
                return Some(jobs.drain(..n).collect());
            }
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            jobs = self.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
        }
    }
}

pub(super) fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The scripting commands and their arities.
pub(super) const COMMANDS: &[(&str, i32)] = &[
    ("eval", -3),
    ("evalsha", -3),
    ("eval_ro", -3),
    ("evalsha_ro", -3),
    ("fcall", -3),
    ("fcall_ro", -3),
    ("script", -2),
    ("function", -2),
];

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// Starts the thread that runs scripts.
pub(super) fn start(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-scripts".into())
        // Room for the Lua libraries' recursion (MAX_NESTING deep) and
        // Lua's C calls beyond the 2 MiB default.
        .stack_size(16 << 20)
        .spawn(move || {
            while let Some(jobs) = shared.scripts.next_jobs() {
                // Every stripe lock once for the scripts waiting: taking
                // the 1,024 of them cost more than a short script. Each
                // script still commits and answers on its own.
                // No worker waits for a lock while the batch holds them
                // all (dropped after `_all`: the locks go first).
                let _claimed = shared.scripts.gate.claim();
                let _all = shared.db.lock_all();
                for job in jobs {
                    let started = std::time::Instant::now();
                    let (reply, wrote) = run_job(&shared, &job);
                    let us = started.elapsed().as_micros() as u64;
                    let slow = &shared.tunables.slow;
                    shared
                        .slowlog
                        .note(slow, &job.args, us, &job.addr, &job.name);
                    shared.stats.errors.note_nested(&reply);
                    job.done.post(Done {
                        slot: job.slot,
                        client: job.client,
                        reply,
                        wrote,
                        us,
                    });
                }
            }
        })
}

/// Runs `job`, every stripe lock held by the caller; its reply and where
/// its writes are in the log.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a selected database exists"
)]
fn run_job(shared: &Shared, job: &Job) -> (Reply, Option<LogPosition>) {
    let db = &shared.db;
    let mut ctx = Ctx::transaction(db, super::now_ms());
    ctx.select(job.db).expect("a selected database exists");
    let (reply, killed) = run_in(shared, job, &mut ctx);
    if killed {
        super::notify::forget();
        // Stopped by a KILL or a shutdown: its writes are dropped whole
        // (the overlay is never committed).
        return (reply, None);
    }
    if let Err(e) = ctx.finish() {
        super::notify::forget();
        let reply = Reply::Error(format!(
            "ERR the script's writes were not applied: {}",
            e.to_string().replace(['\r', '\n'], " ")
        ));
        return (reply, None);
    }
    if shared.scripts.running.read.load(Ordering::Acquire) {
        // As Redis: a script that read anything, read all its keys (for
        // its caller's tracking); the stripe locks are still held.
        let keys = job.args[3..3 + job.numkeys].iter().map(|k| &k[..]);
        shared
            .tracking
            .remember(shared, job.client, job.caching, keys);
    }
    super::notify::release(shared, Some(job.client));
    let wrote = ctx.wrote();
    if wrote.is_some() {
        let dbs = [job.db, ctx.database()];
        let writes = dbs.into_iter().map(|db| (db, &job.args));
        // The script's own client is not held for its waiters: its reply
        // comes back through the worker after they were woken.
        let _woken =
            super::dispatch::signal_writes(shared, writes.take(1 + usize::from(dbs[0] != dbs[1])));
    }
    (reply, wrote)
}

/// Runs `job` in `ctx`: its reply, and whether it was killed.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a selected database exists"
)]
fn run_in(shared: &Shared, job: &Job, ctx: &mut Ctx<'_>) -> (Reply, bool) {
    let keys = &job.args[3..3 + job.numkeys];
    let argv = &job.args[3 + job.numkeys..];
    let (program, eval) = match &job.what {
        Runnable::Eval { code, sha } => (
            Program {
                body: code,
                function: None,
                name: sha,
            },
            true,
        ),
        Runnable::Function { code, name } => (
            Program {
                body: code,
                function: Some(name),
                name,
            },
            false,
        ),
    };
    let kill = shared
        .scripts
        .begin(job.client, eval, program.name, &job.args);
    let run = lua::Run {
        kill: &kill,
        program: &program,
        keys,
        argv,
        read_only: job.read_only,
        user: job.user.as_deref(),
    };
    let reply = lua::run(shared, &run, ctx);
    // Back in the caller's database (a transaction's next command runs
    // where the EXEC's client is).
    ctx.select(job.db).expect("a selected database exists");
    let killed = kill.load(Ordering::Acquire);
    shared.scripts.end();
    (reply, killed)
}

/// Runs scripting command `name`: None if it is not one; Some(None) when
/// the script went to the script thread (the reply comes later).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a worker's connection has a script mailbox"
)]
pub(super) fn run(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
    ctx: &mut Ctx<'_>,
) -> Option<Option<Reply>> {
    let prepared = match name {
        b"eval" | b"eval_ro" => {
            let sha = sha1_hex(&args[1]);
            let prepared = prepare_eval(shared, &args[1], sha, args, name == b"eval_ro");
            if prepared.is_ok() {
                shared.scripts.add(&args[1]);
            }
            prepared
        }
        b"evalsha" | b"evalsha_ro" => match shared.scripts.get(&args[1]) {
            Some(body) => {
                let sha = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
                prepare_eval(shared, &body, sha, args, name == b"evalsha_ro")
            }
            None => Err(error("NOSCRIPT No matching script. Please use EVAL.")),
        },
        b"fcall" | b"fcall_ro" => shared.functions.prepare(shared, args, name == b"fcall_ro"),
        b"script" => return Some(Some(script(shared, args))),
        b"function" => return Some(Some(super::functions::command(shared, args, ctx))),
        _ => return None,
    };
    let (what, numkeys, read_only) = match prepared {
        Ok(p) => p,
        Err(reply) => return Some(Some(reply)),
    };
    let done = conn
        .scripts_done
        .clone()
        .expect("a worker's connection has a script mailbox");
    let job = Job {
        what,
        args: args.clone(),
        numkeys,
        read_only,
        user: (!conn.session.unrestricted(&shared.config.users))
            .then(|| conn.session.user().clone()),
        addr: conn.addr.clone(),
        name: conn.session.name().unwrap_or_default().to_vec(),
        client: conn.session.id(),
        caching: conn.tracking_caching,
        db: ctx.database(),
        slot: conn.slot,
        done,
    };
    if ctx.in_transaction() {
        // Inside EXEC: the transaction's locks and overlay already.
        return Some(Some(run_in(shared, &job, ctx).0));
    }
    conn.script_pending = true;
    shared.scripts.submit(job);
    Some(None)
}

/// Whether EVAL's, EVALSHA's or FCALL's script declares `no-writes` (a
/// `#!` line or a function's flags): then it neither writes nor
/// replicates, and CLIENT PAUSE WRITE does not hold it.
pub(super) fn declares_no_writes(shared: &Shared, args: &Args) -> bool {
    let name = args[0].to_ascii_lowercase();
    let flags = match &name[..] {
        b"fcall" => shared.functions.flags_of(&args[1]),
        b"evalsha" => shared
            .scripts
            .get(&args[1])
            .and_then(|body| shebang(&body).ok().and_then(|(flags, _)| flags)),
        _ => shebang(&args[1]).ok().and_then(|(flags, _)| flags),
    };
    flags.is_some_and(|f| f & lua::NO_WRITES != 0)
}

/// An EVAL's script, key count and whether it may write; or the error.
fn prepare_eval(
    shared: &Shared,
    body: &[u8],
    sha: String,
    args: &Args,
    ro_command: bool,
) -> Result<(Runnable, usize, bool), Reply> {
    let numkeys = numkeys(args, "ERR value is not an integer or out of range")?;
    let (flags, code_at) = shebang(body).map_err(|text| Reply::Error(format!("ERR {text}")))?;
    let read_only = match flags {
        // No `#!` line: Redis's compatibility mode, where only the command
        // decides.
        None => ro_command,
        Some(flags) => {
            let no_writes = flags & lua::NO_WRITES != 0;
            writable_check(shared, ro_command, no_writes)?;
            ro_command || no_writes
        }
    };
    let code = body[code_at..].to_vec();
    Ok((Runnable::Eval { code, sha }, numkeys, read_only))
}

/// Redis's refusals of a script declared able to write (a `#!lua` line
/// without `no-writes`, a function without it): by an `_RO` command, or
/// while writes need replicas.
pub(super) fn writable_check(
    shared: &Shared,
    ro_command: bool,
    no_writes: bool,
) -> Result<(), Reply> {
    if no_writes {
        return Ok(());
    }
    if ro_command {
        return Err(error(
            "ERR Can not execute a script with write flag using *_ro command.",
        ));
    }
    if shared.tunables.writes_need_replicas() {
        return Err(error(super::dispatch::NO_REPLICAS));
    }
    Ok(())
}

/// The number of keys of EVAL or FCALL (`args[2]`), checked as Redis
/// checks it; `not_a_number` is the command's error for a bad count.
pub(super) fn numkeys(args: &Args, not_a_number: &str) -> Result<usize, Reply> {
    let numkeys = crate::resp::string_to_i64(&args[2]).ok_or_else(|| error(not_a_number))?;
    if numkeys > (args.len() - 3) as i64 {
        return Err(error(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    if numkeys < 0 {
        return Err(error("ERR Number of keys can't be negative"));
    }
    Ok(numkeys as usize)
}

/// An EVAL script's `#!lua` line as Redis reads it: its flags (None: no
/// such line) and where the code after it starts (its newline kept, so
/// line numbers stay right).
fn shebang(body: &[u8]) -> Result<(Option<u8>, usize), String> {
    if !body.starts_with(b"#!") {
        return Ok((None, 0));
    }
    let (end, mut parts) = lua::shebang_words(body).ok_or("Invalid script shebang")?;
    let engine = parts.next().ok_or("Invalid engine in script shebang")?;
    if engine != b"#!lua" {
        return Err(format!(
            "Unexpected engine in script shebang: {}",
            String::from_utf8_lossy(engine)
        ));
    }
    let mut flags = 0;
    for part in parts {
        match part.strip_prefix(b"flags=") {
            Some(list) => flags |= lua::flag_bits_of(list)?,
            None => {
                return Err(format!(
                    "Unknown lua shebang option: {}",
                    String::from_utf8_lossy(part)
                ))
            }
        }
    }
    Ok((Some(flags), end))
}

fn script(shared: &Shared, args: &Args) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match (&sub[..], args.len()) {
        (b"load", 3) => {
            let body = &args[2];
            if let Err(text) = shebang(body) {
                return Reply::Error(format!("ERR {text}"));
            }
            Reply::Bulk(shared.scripts.add(body).into_bytes())
        }
        (b"exists", n) if n >= 3 => Reply::Array(
            args[2..]
                .iter()
                .map(|sha| Reply::Integer(i64::from(shared.scripts.get(sha).is_some())))
                .collect(),
        ),
        (b"flush", 2) | (b"flush", 3) => {
            if let Some(mode) = args.get(2) {
                if !mode.eq_ignore_ascii_case(b"sync") && !mode.eq_ignore_ascii_case(b"async") {
                    return error("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
                }
            }
            shared
                .scripts
                .by_sha
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            shared.scripts.renew_engines();
            Reply::Simple("OK".into())
        }
        (b"kill", 2) => shared.scripts.kill(true),
        (b"load" | b"kill", _) => Reply::Error(format!(
            "ERR wrong number of arguments for 'script|{}' command",
            String::from_utf8_lossy(&sub)
        )),
        _ => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}
