//! Client-side caching (Redis's tracking.c): `CLIENT TRACKING`,
//! `CLIENT CACHING`, `CLIENT GETREDIR`, `CLIENT TRACKINGINFO`.
//!
//! A tracking client is told when a key it read may have changed, so it
//! can drop the copy it keeps. In the default mode the server remembers,
//! per key, the clients that read it (the key's entry goes with the
//! first invalidation: a client that reads the key again is remembered
//! again); in BCAST mode a client names prefixes instead and hears of
//! every changed key under them. As in Redis the table is one for all
//! databases, messages go as RESP3 pushes (`invalidate`) or, redirected
//! to a RESP2 client in pub/sub mode, as messages on
//! `__redis__:invalidate`; FLUSHDB and FLUSHALL tell every tracking
//! client "everything" (a null key list).
//!
//! The table is bounded by `tracking-table-max-keys` (Redis's default of
//! one million): past it, keys are dropped from it with an invalidation,
//! as if they had changed. A message reaches a client on another worker
//! through that worker's push queue (the writer's own messages come after
//! its reply, as Redis sends them after the command).

use super::Shared;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The channel invalidations go to for a redirected RESP2 client.
pub(super) const CHANNEL: &[u8] = b"__redis__:invalidate";

/// A message for a client, decided upon by its own worker (which knows
/// its protocol and whether it is subscribed).
#[derive(Debug, Clone)]
pub(super) enum Push {
    /// A pub/sub message, a MONITOR line: sent as it is.
    Message(crate::resp::Reply),
    /// Keys that may have changed (None: all of them); `redirected`: sent
    /// on behalf of another client.
    Invalidate {
        keys: Option<Vec<Vec<u8>>>,
        redirected: bool,
    },
    /// The client invalidations are redirected to is gone (RESP3 only).
    RedirectBroken(u64),
}

/// One client's tracking mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Mode {
    /// The client its invalidations go to (0: itself).
    pub(super) redirect: u64,
    pub(super) bcast: bool,
    pub(super) optin: bool,
    pub(super) optout: bool,
    pub(super) noloop: bool,
    /// BCAST's prefixes ("" for every key when none was named).
    pub(super) prefixes: Vec<Vec<u8>>,
    /// Its redirect target was gone when a message was due.
    pub(super) broken: bool,
}

#[derive(Default)]
struct Table {
    /// Default mode: who read each key since it last changed.
    keys: HashMap<Vec<u8>, Vec<u64>>,
    /// BCAST mode: the clients of each prefix.
    prefixes: BTreeMap<Vec<u8>, Vec<u64>>,
    /// Every tracking client's mode.
    clients: HashMap<u64, Mode>,
}

/// The server's tracking state.
#[derive(Default)]
pub struct Tracking {
    table: Mutex<Table>,
    /// Tracking clients now (none: nothing is looked up).
    clients: AtomicUsize,
}

impl Tracking {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any client tracks.
    pub(super) fn any(&self) -> bool {
        self.clients.load(Ordering::Relaxed) > 0
    }

    /// Client `id`'s mode, if it tracks.
    pub(super) fn mode(&self, id: u64) -> Option<Mode> {
        if !self.any() {
            return None;
        }
        self.lock().clients.get(&id).cloned()
    }

    /// Turns tracking on for client `id` (its options checked by the
    /// caller), replacing its mode; BCAST prefixes add to those it has.
    pub(super) fn enable(&self, id: u64, mut mode: Mode) {
        let mut t = self.lock();
        if mode.bcast {
            if mode.prefixes.is_empty() {
                mode.prefixes.push(Vec::new());
            }
            let old = t.clients.get(&id).map(|m| m.prefixes.clone());
            for prefix in &mode.prefixes {
                let ids = t.prefixes.entry(prefix.clone()).or_default();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            for prefix in old.into_iter().flatten() {
                if !mode.prefixes.contains(&prefix) {
                    mode.prefixes.push(prefix);
                }
            }
            mode.prefixes.sort();
        }
        if t.clients.insert(id, mode).is_none() {
            self.clients.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Turns tracking off for client `id` (CLIENT TRACKING off, RESET, a
    /// closed connection). Its entries under keys go lazily, as Redis's.
    pub(super) fn disable(&self, id: u64) {
        if !self.any() {
            return;
        }
        let mut t = self.lock();
        let Some(mode) = t.clients.remove(&id) else {
            return;
        };
        self.clients.fetch_sub(1, Ordering::Relaxed);
        for prefix in &mode.prefixes {
            if let Some(ids) = t.prefixes.get_mut(prefix) {
                ids.retain(|&c| c != id);
                if ids.is_empty() {
                    t.prefixes.remove(prefix);
                }
            }
        }
    }

    /// Remembers that client `id` read `keys` (a read-only command ran):
    /// unless it is in BCAST mode, or OPTIN without `CLIENT CACHING yes`,
    /// or OPTOUT after `CLIENT CACHING no` (`caching`: that CLIENT
    /// CACHING was given for this command).
    pub(super) fn remember<'a>(
        &self,
        shared: &Shared,
        id: u64,
        caching: bool,
        keys: impl Iterator<Item = &'a [u8]>,
    ) {
        let mut t = self.lock();
        let Some(mode) = t.clients.get(&id) else {
            return;
        };
        if mode.bcast || (mode.optin && !caching) || (mode.optout && caching) {
            return;
        }
        for key in keys {
            let ids = t.keys.entry(key.to_vec()).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        keep_within_limit(shared, &mut t);
    }

    /// Drops keys from the table until it is within
    /// `tracking-table-max-keys` (after CONFIG SET lowers it).
    pub(super) fn limit(&self, shared: &Shared) {
        if self.any() {
            keep_within_limit(shared, &mut self.lock());
        }
    }

    /// Tells the clients that read or watch `keys` that they changed;
    /// `writer` is the client that changed them (NOLOOP spares it).
    pub(super) fn invalidate<'a>(
        &self,
        shared: &Shared,
        writer: Option<u64>,
        keys: impl Iterator<Item = &'a [u8]>,
    ) {
        if !self.any() {
            return;
        }
        let mut t = self.lock();
        let mut bcast = Heard::new();
        for key in keys {
            invalidate_key(shared, &mut t, writer, key, true, &mut bcast);
        }
        // BCAST: per prefix, one message to each of its clients with the
        // keys under it (Redis gathers them over one event-loop turn; here
        // over one command, or one transaction or script). NOLOOP leaves
        // out what the client changed itself.
        for (prefix, keys) in bcast {
            let ids = t.prefixes.get(&prefix).cloned().unwrap_or_default();
            for id in ids {
                let noloop = t.clients.get(&id).is_some_and(|m| m.noloop);
                let told: Vec<Vec<u8>> = keys
                    .iter()
                    .filter(|_| !(noloop && writer == Some(id)))
                    .cloned()
                    .collect();
                if !told.is_empty() {
                    send(shared, &mut t, id, Some(told));
                }
            }
        }
    }

    /// FLUSHDB and FLUSHALL: every tracking client is told all its keys
    /// changed, and the table is emptied.
    pub(super) fn flush(&self, shared: &Shared) {
        // Also with no client tracking now: the entries they left go.
        let mut t = self.lock();
        t.keys.clear();
        let mut ids: Vec<u64> = t.clients.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            send(shared, &mut t, id, None);
        }
    }

    /// Keys in the default mode's table, and the client entries under
    /// them (INFO's `tracking_total_keys`, `tracking_total_items`).
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        let t = self.lock();
        let items = t.keys.values().map(Vec::len).sum();
        (t.keys.len(), items, t.prefixes.len())
    }

    /// Tracking clients now (INFO's `tracking_clients`).
    pub(super) fn client_count(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }
}

/// Redis's `trackingLimitUsedSlots`: past `tracking-table-max-keys`, keys
/// leave the table and their readers hear of them as if they had changed
/// (their copies are no longer watched).
fn keep_within_limit(shared: &Shared, t: &mut Table) {
    let most = shared.tunables.tracking_table_max_keys();
    if most == 0 {
        return;
    }
    while t.keys.len() > most {
        let Some(key) = t.keys.keys().next().cloned() else {
            break;
        };
        invalidate_key(shared, t, None, &key, false, &mut Heard::new());
    }
}

/// Changed keys by BCAST prefix, each once, in the order they changed.
type Heard = BTreeMap<Vec<u8>, Vec<Vec<u8>>>;

/// Redis's `trackingInvalidateKey`: the readers of `key` are told (its
/// entry goes), and with `bcast` the key is added to the keys of each
/// BCAST prefix it has.
fn invalidate_key(
    shared: &Shared,
    t: &mut Table,
    writer: Option<u64>,
    key: &[u8],
    bcast: bool,
    heard: &mut Heard,
) {
    if bcast {
        for prefix in t.prefixes.keys().filter(|p| key.starts_with(p)) {
            let keys = heard.entry(prefix.clone()).or_default();
            if !keys.iter().any(|k| k == key) {
                keys.push(key.to_vec());
            }
        }
    }
    let Some(ids) = t.keys.remove(key) else {
        return;
    };
    for id in ids {
        let Some(mode) = t.clients.get(&id) else {
            continue;
        };
        if mode.bcast || (mode.noloop && writer == Some(id)) {
            continue;
        }
        send(shared, t, id, Some(vec![key.to_vec()]));
    }
}

/// Redis's `sendTrackingMessage`: to the client itself, or to the one it
/// redirects to; a redirect target that is gone marks the mode broken
/// and tells the client (in RESP3; its worker decides).
fn send(shared: &Shared, t: &mut Table, id: u64, keys: Option<Vec<Vec<u8>>>) {
    let Some(mode) = t.clients.get_mut(&id) else {
        return;
    };
    if mode.redirect == 0 {
        shared.registry.post(
            id,
            Push::Invalidate {
                keys,
                redirected: false,
            },
        );
        return;
    }
    let delivered = shared.registry.post(
        mode.redirect,
        Push::Invalidate {
            keys,
            redirected: true,
        },
    );
    if !delivered {
        mode.broken = true;
        let target = mode.redirect;
        shared.registry.post(id, Push::RedirectBroken(target));
    }
}

/// CLIENT TRACKING's arguments after on/off, checked as Redis checks them
/// (with `on`, against the client's mode now): the mode to enable, or
/// Redis's error.
pub(super) fn parse_mode(
    shared: &Shared,
    now: Option<&Mode>,
    args: &[Vec<u8>],
    on: bool,
) -> Result<Mode, String> {
    let mut mode = Mode::default();
    let mut j = 0;
    while j < args.len() {
        let more = j + 1 < args.len();
        let word = args[j].to_ascii_lowercase();
        match &word[..] {
            b"redirect" if more => {
                j += 1;
                if mode.redirect != 0 {
                    return Err("ERR A client can only redirect to a single other client".into());
                }
                let id = crate::resp::string_to_i64(&args[j])
                    .ok_or("ERR value is not an integer or out of range")?;
                if id <= 0 || shared.registry.get(id as u64).is_none() {
                    return Err("ERR The client ID you want redirect to does not exist".into());
                }
                mode.redirect = id as u64;
            }
            b"bcast" => mode.bcast = true,
            b"optin" => mode.optin = true,
            b"optout" => mode.optout = true,
            b"noloop" => mode.noloop = true,
            b"prefix" if more => {
                j += 1;
                mode.prefixes.push(args[j].clone());
            }
            _ => return Err("ERR syntax error".into()),
        }
        j += 1;
    }
    if !on {
        return Ok(mode);
    }
    if !mode.bcast && !mode.prefixes.is_empty() {
        return Err("ERR PREFIX option requires BCAST mode to be enabled".into());
    }
    if let Some(now) = now {
        if now.bcast != mode.bcast {
            return Err("ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.".into());
        }
    }
    if mode.bcast && (mode.optin || mode.optout) {
        return Err("ERR OPTIN and OPTOUT are not compatible with BCAST".into());
    }
    if mode.optin && mode.optout {
        return Err("ERR You can't specify both OPTIN mode and OPTOUT mode".into());
    }
    if let Some(now) = now {
        if (mode.optin && now.optout) || (mode.optout && now.optin) {
            return Err("ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.".into());
        }
    }
    if mode.bcast {
        check_prefixes(now, &mode.prefixes)?;
    }
    Ok(mode)
}

/// Redis's `checkPrefixCollisionsOrReply`: no two prefixes of a client
/// where one starts the other.
fn check_prefixes(now: Option<&Mode>, prefixes: &[Vec<u8>]) -> Result<(), String> {
    let overlap = |a: &[u8], b: &[u8]| a.starts_with(b) || b.starts_with(a);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for (i, p) in prefixes.iter().enumerate() {
        for old in now.map(|m| &m.prefixes[..]).unwrap_or(&[]) {
            if overlap(p, old) {
                return Err(format!(
                    "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.",
                    text(p),
                    text(old)
                ));
            }
        }
        for q in &prefixes[i + 1..] {
            if overlap(p, q) {
                return Err(format!(
                    "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client must not overlap.",
                    text(p),
                    text(q)
                ));
            }
        }
    }
    Ok(())
}
