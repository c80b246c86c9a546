//! Redis's access control lists (ACL): users, the commands each may run
//! and the keys each may touch, as Redis 7.0 keeps and checks them — the
//! same rules (`ACL SETUSER alice on >pw ~cache:* -@all +get`), the same
//! checks in the same order, the same `NOPERM` replies, `ACL LIST` lines a
//! real `redis-server` loads, and `ACL LOG`. Checked against a real
//! `redis-server` in tests/acl_redis.rs.
//!
//! What a rule means rests on each command's categories and key
//! positions: [`table`] holds them as Redis 7.0.15's `COMMAND INFO` gives
//! them (written by `scripts/gen-acl-table`).
//!
//! Users live in [`Users`], shared by every connection; a change bumps a
//! generation that connections compare on their next command, so a
//! connection whose rights did not change pays one atomic load.

mod log;
mod rules;
mod table;

pub use log::{LogContext, LogEntry, LogReason};
pub use rules::{category_bit, load_file, parse_file, Denied, SetError, User};
pub use table::{cat, CATEGORY_NAMES};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// One command's ACL facts, as Redis's `COMMAND INFO` gives them.
#[derive(Debug)]
pub struct Command {
    /// Its full name, lower case (`get`, `client|kill`).
    pub name: &'static str,
    /// Redis's arity: `n` arguments with the name, or at least `-n`.
    pub arity: i32,
    /// Its ACL categories ([`cat`] bits).
    pub categories: u32,
    /// Runs before authentication (AUTH, HELLO, QUIT, RESET): no user's
    /// command rules apply to it.
    pub no_auth: bool,
    /// Refused from scripts (Redis's `noscript`: blocking commands,
    /// transactions, scripts themselves, SUBSCRIBE and the like).
    pub no_script: bool,
    /// Refused inside MULTI (Redis's `no_multi`: SAVE, SHUTDOWN...).
    pub no_multi: bool,
    /// Where its keys are among its arguments.
    pub keys: &'static [KeySpec],
    /// Whether its keys' access depends on its arguments (SET: read too
    /// only with GET).
    pub variable_flags: bool,
}

/// Where a command's keys are: from argument `index`, to `last` (0: that
/// one; -1: to the end; with `limit` > 1, a `limit`-th of the rest), every
/// `step`; and whether the command reads them, writes them, or both.
#[derive(Debug)]
pub struct KeySpec {
    /// The first key's argument position (the command name is 0).
    pub index: usize,
    /// See the type.
    pub last: i32,
    /// See the type.
    pub step: usize,
    /// See the type.
    pub limit: usize,
    /// Non-zero: the argument holding how many keys there are (LMPOP's,
    /// SINTERCARD's `numkeys`); the keys are that many from `index`,
    /// every `step`, and `last` and `limit` do not apply.
    pub numkeys_at: usize,
    /// Non-empty: the keys follow this word (lower case; XREAD's
    /// `streams`), searched for from argument `index` on; the key range
    /// then starts after it.
    pub keyword: &'static str,
    /// Whether the command reads the keys' values (`%R~` covers it).
    pub read: bool,
    /// Whether it inserts, updates or deletes them (`%W~` covers it).
    pub write: bool,
}

/// A command's place in [`table::COMMANDS`]: the bit a selector keeps for it.
pub type CommandId = usize;

fn commands() -> &'static [Command] {
    table::COMMANDS
}

/// How many commands and subcommands the table holds: every
/// [`CommandId`] is below this.
pub fn command_count() -> usize {
    commands().len()
}

/// GET's id in the command table (the plain paths count under it).
#[expect(
    clippy::expect_used,
    reason = "the command table is generated with every command Sluice serves"
)]
pub static GET_ID: std::sync::LazyLock<CommandId> =
    std::sync::LazyLock::new(|| lookup(b"get").expect("GET is in the table"));
/// SET's id in the command table.
#[expect(
    clippy::expect_used,
    reason = "the command table is generated with every command Sluice serves"
)]
pub static SET_ID: std::sync::LazyLock<CommandId> =
    std::sync::LazyLock::new(|| lookup(b"set").expect("SET is in the table"));
/// PING's id in the command table.
#[expect(
    clippy::expect_used,
    reason = "the command table is generated with every command Sluice serves"
)]
pub static PING_ID: std::sync::LazyLock<CommandId> =
    std::sync::LazyLock::new(|| lookup(b"ping").expect("PING is in the table"));

/// The command whose full name (`get`, `client|kill`) is `name`, any case.
pub fn lookup(name: &[u8]) -> Option<CommandId> {
    type ById = HashMap<&'static [u8], CommandId, crate::commands::ByNameHash>;
    static BY_NAME: std::sync::OnceLock<ById> = std::sync::OnceLock::new();
    thread_local! {
        // Every request's name is looked up (INFO commandstats counts
        // it), and a pipeline repeats one: the last name as given.
        static LAST: std::cell::RefCell<(Vec<u8>, Option<CommandId>)> =
            const { std::cell::RefCell::new((Vec::new(), None)) };
    }
    if let Some(found) = LAST.with_borrow(|(last, found)| (last[..] == *name).then_some(*found)) {
        return found;
    }
    let by_name = BY_NAME.get_or_init(|| {
        commands()
            .iter()
            .enumerate()
            .map(|(id, c)| (c.name.as_bytes(), id))
            .collect()
    });
    // In lower case on the stack: names are short.
    let mut lower = [0u8; 48];
    let found = match lower.get_mut(..name.len()) {
        Some(buf) => {
            buf.copy_from_slice(name);
            buf.make_ascii_lowercase();
            by_name.get(&*buf).copied()
        }
        None => by_name.get(&name.to_ascii_lowercase()[..]).copied(),
    };
    if name.len() <= lower.len() {
        LAST.with_borrow_mut(|(last, last_found)| {
            last.clear();
            last.extend_from_slice(name);
            *last_found = found;
        });
    }
    found
}

/// The command a request runs: a container's subcommand (`client|kill`)
/// when it names one; the container itself otherwise (its handler then
/// answers unknown subcommand; the rules of the container apply).
pub fn resolve(args: &[Vec<u8>]) -> Option<CommandId> {
    let id = lookup(&args[0])?;
    if args.len() >= 2 && is_container(id) {
        let mut full = args[0].to_ascii_lowercase();
        full.push(b'|');
        full.extend_from_slice(&args[1]);
        if let Some(sub) = lookup(&full) {
            return Some(sub);
        }
    }
    Some(id)
}

/// Whether command `id` names keys at all (COMMAND GETKEYS).
pub fn has_key_specs(id: CommandId) -> bool {
    !commands()[id].keys.is_empty() || commands()[id].name == "sort"
}

/// Whether `argc` arguments (the name included) fit command `id`'s arity.
pub fn arity_fits(id: CommandId, argc: usize) -> bool {
    let arity = commands()[id].arity;
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= arity.unsigned_abs() as usize
    }
}

/// The full names of the commands in category `bit`, in table order.
pub fn in_category(bit: u32) -> impl Iterator<Item = &'static str> {
    commands()
        .iter()
        .filter(move |c| c.categories & bit != 0)
        .map(|c| c.name)
}

/// Every command's full name (ACL's table), in table order.
pub fn all_names() -> impl Iterator<Item = &'static str> {
    commands().iter().map(|c| c.name)
}

/// Whether command `id` writes (Redis's `@write` category).
pub fn is_write(id: CommandId) -> bool {
    commands()[id].categories & table::cat::WRITE != 0
}

/// Whether command `id` only reads (Redis's `@read` category, which its
/// read-only commands have).
pub fn is_read(id: CommandId) -> bool {
    commands()[id].categories & table::cat::READ != 0
}

/// Whether command `id` is refused from scripts.
pub fn no_script(id: CommandId) -> bool {
    commands()[id].no_script
}

/// Whether command `id` is refused inside MULTI.
pub fn no_multi(id: CommandId) -> bool {
    commands()[id].no_multi
}

/// The command's full name.
pub fn name_of(id: CommandId) -> &'static str {
    commands()[id].name
}

fn is_container(id: CommandId) -> bool {
    subcommands(id).next().is_some()
}

/// The subcommands of container `id` (they follow it in the table).
fn subcommands(id: CommandId) -> impl Iterator<Item = CommandId> {
    let prefix = commands()[id].name;
    (id + 1..commands().len()).take_while(move |&sub| {
        commands()[sub]
            .name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('|'))
    })
}

fn is_subcommand(id: CommandId) -> bool {
    commands()[id].name.contains('|')
}

/// The argument positions of the keys `args` names for command `id`, with
/// whether each is read and written (Redis's key specs, and SET's rule).
pub fn keys_of(id: CommandId, args: &[Vec<u8>]) -> Vec<(usize, bool, bool)> {
    let command = &commands()[id];
    let argc = args.len();
    let mut out = Vec::new();
    for spec in command.keys {
        let first = if spec.keyword.is_empty() {
            spec.index
        } else {
            match args
                .iter()
                .skip(spec.index)
                .position(|a| a.eq_ignore_ascii_case(spec.keyword.as_bytes()))
            {
                Some(at) => spec.index + at + 1,
                None => continue,
            }
        };
        if first >= argc {
            continue;
        }
        let last = if spec.numkeys_at != 0 {
            let numkeys = args
                .get(spec.numkeys_at)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok());
            match numkeys.filter(|n| *n > 0) {
                Some(n) => first + (n - 1) * spec.step.max(1),
                None => continue,
            }
        } else if spec.last >= 0 {
            first + spec.last as usize
        } else if spec.limit <= 1 {
            match argc.checked_sub(spec.last.unsigned_abs() as usize) {
                Some(last) => last,
                None => continue,
            }
        } else {
            let per = (argc - first) / spec.limit;
            match (first + per).checked_sub(spec.last.unsigned_abs() as usize) {
                Some(last) => last,
                None => continue,
            }
        };
        let (mut read, mut write) = (spec.read, spec.write);
        if command.variable_flags && command.name == "bitfield" {
            // BITFIELD writes only with a SET or INCRBY (Redis's
            // bitfieldGetKeys).
            write = !bitfield_reads_only(args);
        } else if command.variable_flags {
            // SET reads its key only when asked to return the old value.
            read = args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"get"));
        }
        let mut i = first;
        while i <= last && i < argc {
            out.push((i, read, write));
            i += spec.step.max(1);
        }
    }
    if command.name == "sort" {
        // SORT's STORE may come anywhere (its key spec is "unknown"):
        // found as Redis's sortGetKeys finds it, the last one winning.
        if let Some(at) = sort_store_at(args) {
            out.push((at, false, true));
        }
    }
    out
}

/// Whether a BITFIELD only reads: GETs and OVERFLOWs, well formed.
fn bitfield_reads_only(args: &[Vec<u8>]) -> bool {
    let mut i = 2;
    while i < args.len() {
        let more = args.len() - i - 1;
        match args[i].to_ascii_lowercase().as_slice() {
            b"get" if more >= 2 => i += 3,
            b"overflow" if more >= 1 => i += 2,
            _ => return false,
        }
    }
    true
}

/// Where SORT's destination is: after its last STORE, skipping LIMIT's
/// two arguments and GET's and BY's one.
fn sort_store_at(args: &[Vec<u8>]) -> Option<usize> {
    let mut found = None;
    let mut i = 2;
    while i < args.len() {
        match args[i].to_ascii_lowercase().as_slice() {
            b"limit" => i += 2,
            b"get" | b"by" => i += 1,
            b"store" if i + 1 < args.len() => found = Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    found
}

/// Most entries ACL LOG keeps (Redis's `acllog-max-len` default).
pub const LOG_MAX_ENTRIES: usize = 128;

/// Most users (each connection checks against its own; the limit bounds
/// what ACL LIST and SAVE write).
pub const MAX_USERS: usize = 10_000;

/// Every user, shared by every connection of a server.
#[derive(Debug, Clone)]
pub struct Users {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    users: RwLock<BTreeMap<Vec<u8>, Arc<User>>>,
    /// Bumped by every change of any user.
    generation: AtomicU64,
    /// The ACL file ACL SAVE writes and ACL LOAD reads (`--users-file`).
    file: Option<PathBuf>,
    log: Mutex<log::Log>,
}

impl Default for Users {
    fn default() -> Self {
        Users::new(Vec::new(), None)
    }
}

impl Users {
    /// These users, and the default user (all commands, all keys, no
    /// password) unless one of them is `default`. `file` is the ACL file.
    pub fn new(users: Vec<User>, file: Option<PathBuf>) -> Self {
        Users {
            inner: Arc::new(Shared {
                users: RwLock::new(by_name(users)),
                generation: AtomicU64::new(1),
                file,
                log: Mutex::new(log::Log::default()),
            }),
        }
    }

    /// Users from `name:password` pairs (each may run everything).
    pub fn from_pairs(pairs: &[(String, String)]) -> Self {
        let users = pairs
            .iter()
            .map(|(name, password)| User::with_password(name.as_bytes(), password.as_bytes()))
            .collect();
        Users::new(users, None)
    }

    /// The generation: it changes whenever any user does.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Vec<u8>, Arc<User>>> {
        self.inner.users.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Vec<u8>, Arc<User>>> {
        self.inner.users.write().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// User `name`, as it is now.
    pub fn get(&self, name: &[u8]) -> Option<Arc<User>> {
        self.read().get(name).cloned()
    }

    /// The default user.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: the default user cannot be removed"
    )]
    pub fn default_user(&self) -> Arc<User> {
        self.get(b"default")
            .expect("the default user cannot be removed")
    }

    /// Whether the default user needs a password (Redis's `requirepass`):
    /// protected mode turns others than loopback clients away when not.
    pub fn default_needs_password(&self) -> bool {
        !self.default_user().nopass()
    }

    /// The user `name` logs in as with `password`, if it exists, is on,
    /// and the password is one of its own (compared in constant time).
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<Arc<User>> {
        let user = self.get(name)?;
        user.admits(password).then_some(user)
    }

    /// Every user's name, in order.
    pub fn names(&self) -> Vec<Vec<u8>> {
        self.read().keys().cloned().collect()
    }

    /// Every user as an ACL file line, in name order.
    pub fn list(&self) -> Vec<String> {
        self.read()
            .values()
            .map(|u| {
                format!(
                    "user {} {}",
                    String::from_utf8_lossy(u.name()),
                    u.describe()
                )
            })
            .collect()
    }

    /// ACL SETUSER: applies `ops` to user `name` (created if new), all of
    /// them or none.
    pub fn set_user(&self, name: &[u8], ops: &[Vec<u8>]) -> Result<(), String> {
        if rules::has_spaces(name) {
            return Err("Usernames can't contain spaces or null characters".into());
        }
        let mut users = self.write();
        let mut user = match users.get(name) {
            Some(u) => (**u).clone(),
            None if users.len() >= MAX_USERS => {
                return Err(format!(
                    "Sluice keeps at most {MAX_USERS} users; delete some first"
                ))
            }
            None => User::new(name),
        };
        user.apply(ops)?;
        users.insert(name.to_vec(), Arc::new(user));
        drop(users);
        self.changed();
        Ok(())
    }

    /// ACL DELUSER: removes these users; how many existed. `default`
    /// cannot go.
    pub fn delete(&self, names: &[Vec<u8>]) -> Result<usize, &'static str> {
        if names.iter().any(|n| n == b"default") {
            return Err("The 'default' user cannot be removed");
        }
        let mut users = self.write();
        let removed = names
            .iter()
            .filter(|n| users.remove(&n[..]).is_some())
            .count();
        drop(users);
        self.changed();
        Ok(removed)
    }

    /// The ACL file, if the server has one.
    pub fn file(&self) -> Option<&std::path::Path> {
        self.inner.file.as_deref()
    }

    /// ACL LOAD: replaces every user with those of the ACL file, or, on
    /// any error, changes nothing and says what was wrong.
    pub fn load(&self) -> Result<(), String> {
        let Some(path) = self.file() else {
            return Err(NO_FILE.into());
        };
        let users = rules::load_file(path)?;
        *self.write() = by_name(users);
        self.changed();
        Ok(())
    }

    /// ACL SAVE: writes every user to the ACL file (a new file renamed
    /// over the old, readable by its owner only).
    pub fn save(&self) -> Result<(), String> {
        let Some(path) = self.file() else {
            return Err(NO_FILE.into());
        };
        let mut text = String::new();
        for line in self.list() {
            text.push_str(&line);
            text.push('\n');
        }
        rules::save_file(path, &text)
    }

    /// Records a refusal in ACL LOG.
    pub fn log(&self, entry: LogEntry) {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(entry);
    }

    /// ACL LOG: the newest `count` entries.
    pub fn log_entries(&self, count: usize) -> Vec<LogEntry> {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .newest(count)
    }

    /// ACL LOG RESET.
    pub fn log_reset(&self) {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// `users` by name, with the default user (all commands, all keys, no
/// password) unless one of them is `default`.
fn by_name(users: Vec<User>) -> BTreeMap<Vec<u8>, Arc<User>> {
    let mut map: BTreeMap<Vec<u8>, Arc<User>> = users
        .into_iter()
        .map(|u| (u.name().to_vec(), Arc::new(u)))
        .collect();
    map.entry(b"default".to_vec())
        .or_insert_with(|| Arc::new(User::default_user()));
    map
}

/// ACL SAVE and LOAD on a server started without an ACL file.
pub const NO_FILE: &str = "This Sluice server was started without --users-file, so it has no ACL file to save to or load from: restart it with --users-file FILE (ACL SETUSER changes last until then)";

#[cfg(test)]
mod tests;
