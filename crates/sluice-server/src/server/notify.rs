//! Keyspace notifications (Redis's notify.c): with
//! `notify-keyspace-events` set, a command that changes a key publishes
//! `__keyspace@<db>__:<key>` → event and `__keyevent@<db>__:<event>` →
//! key over pub/sub, for the classes the setting names.
//!
//! The data model lists the keys each command's batches changed (and
//! whether their records went); the events are named here, per command,
//! as Redis names them, and published once the command's writes are
//! applied (a transaction's or a script's once all of them are).

use super::Shared;
use crate::resp::Args;
use sluice_redis::db::Change;
use std::sync::atomic::{AtomicU32, Ordering};

const KEYSPACE: u32 = 1 << 0;
const KEYEVENT: u32 = 1 << 1;
const GENERIC: u32 = 1 << 2;
const STRING: u32 = 1 << 3;
const LIST: u32 = 1 << 4;
const SET: u32 = 1 << 5;
const HASH: u32 = 1 << 6;
const ZSET: u32 = 1 << 7;
const EXPIRED: u32 = 1 << 8;
const EVICTED: u32 = 1 << 9;
const STREAM: u32 = 1 << 10;
const KEY_MISS: u32 = 1 << 11;
const MODULE: u32 = 1 << 13;
const NEW: u32 = 1 << 14;
const ALL: u32 = GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// The classes `text` names (Redis's `keyspaceEventsStringToFlags`), or
/// Redis's refusal.
pub fn parse(text: &[u8]) -> Result<u32, String> {
    let mut flags = 0;
    for &c in text {
        flags |= match c {
            b'A' => ALL,
            b'g' => GENERIC,
            b'$' => STRING,
            b'l' => LIST,
            b's' => SET,
            b'h' => HASH,
            b'z' => ZSET,
            b'x' => EXPIRED,
            b'e' => EVICTED,
            b'K' => KEYSPACE,
            b'E' => KEYEVENT,
            b't' => STREAM,
            b'm' => KEY_MISS,
            b'd' => MODULE,
            b'n' => NEW,
            _ => return Err("Invalid event class character. Use 'Ag$lshzxeKEtmdn'.".into()),
        };
    }
    Ok(flags)
}

/// `flags` as CONFIG GET shows them (Redis's `keyspaceEventsFlagsToString`,
/// but for `n` beside `A`, which Redis leaves out of what it shows though
/// it keeps it: here what is shown is what is kept).
pub fn format(flags: u32) -> String {
    let mut out = String::new();
    if flags & ALL == ALL {
        out.push('A');
        if flags & NEW != 0 {
            out.push('n');
        }
    } else {
        for (bit, c) in [
            (GENERIC, 'g'),
            (STRING, '$'),
            (LIST, 'l'),
            (SET, 's'),
            (HASH, 'h'),
            (ZSET, 'z'),
            (EXPIRED, 'x'),
            (EVICTED, 'e'),
            (STREAM, 't'),
            (MODULE, 'd'),
            (NEW, 'n'),
        ] {
            if flags & bit != 0 {
                out.push(c);
            }
        }
    }
    for (bit, c) in [(KEYSPACE, 'K'), (KEYEVENT, 'E'), (KEY_MISS, 'm')] {
        if flags & bit != 0 {
            out.push(c);
        }
    }
    out
}

/// The setting in force.
#[derive(Debug, Default)]
pub struct Notify {
    flags: AtomicU32,
}

impl Notify {
    /// Takes a new setting (already checked by [`parse`]).
    pub fn set(&self, flags: u32) {
        self.flags.store(flags, Ordering::Relaxed);
    }

    /// Whether any event is published: K or E, and a class.
    pub fn on(&self) -> bool {
        let f = self.flags.load(Ordering::Relaxed);
        f & (KEYSPACE | KEYEVENT) != 0 && f & !(KEYSPACE | KEYEVENT) != 0
    }
}

/// One event: its class, its name and the key's position in the
/// command's arguments it is about (None: any key the command changed).
type Event = (u32, &'static str, Option<usize>);

/// The events a command raises, in Redis's order, for the keys it
/// changed; a key whose record went gets a `del` after its own events
/// unless the command's own event is the removal.
fn events_of(name: &[u8], args: &Args) -> Vec<Event> {
    let arg = |i: usize| {
        args.get(i)
            .map(|a| a.to_ascii_lowercase())
            .unwrap_or_default()
    };
    let side = |word: Vec<u8>, left: &'static str, right: &'static str| {
        if word == b"left" {
            left
        } else {
            right
        }
    };
    let has = |word: &[u8]| args.iter().skip(2).any(|a| a.eq_ignore_ascii_case(word));
    let one = |class: u32, event: &'static str| vec![(class, event, None)];
    match name {
        b"del" | b"unlink" | b"getdel" => one(GENERIC, "del"),
        b"expire" | b"pexpire" | b"expireat" | b"pexpireat" => one(GENERIC, "expire"),
        b"persist" => one(GENERIC, "persist"),
        b"rename" | b"renamenx" => vec![
            (GENERIC, "rename_from", Some(1)),
            (GENERIC, "rename_to", Some(2)),
        ],
        b"move" => vec![
            (GENERIC, "move_from", Some(1)),
            (GENERIC, "move_to", Some(1)),
        ],
        b"copy" => vec![(GENERIC, "copy_to", Some(2))],
        b"restore" => one(GENERIC, "restore"),
        b"set" if has(b"ex") || has(b"px") || has(b"exat") || has(b"pxat") => {
            vec![(STRING, "set", None), (GENERIC, "expire", None)]
        }
        b"setex" | b"psetex" => vec![(STRING, "set", None), (GENERIC, "expire", None)],
        b"set" | b"setnx" | b"getset" | b"mset" | b"msetnx" | b"bitop" => one(STRING, "set"),
        b"getex" if has(b"persist") => one(GENERIC, "persist"),
        b"getex" => one(GENERIC, "expire"),
        b"incr" | b"decr" | b"incrby" | b"decrby" => one(STRING, "incrby"),
        b"incrbyfloat" => one(STRING, "incrbyfloat"),
        b"append" => one(STRING, "append"),
        b"setrange" => one(STRING, "setrange"),
        b"setbit" | b"bitfield" => one(STRING, "setbit"),
        b"pfadd" | b"pfmerge" => one(STRING, "pfadd"),
        b"lpush" | b"lpushx" => one(LIST, "lpush"),
        b"rpush" | b"rpushx" => one(LIST, "rpush"),
        b"lpop" | b"blpop" => one(LIST, "lpop"),
        b"rpop" | b"brpop" => one(LIST, "rpop"),
        b"lmpop" | b"blmpop" => {
            let at = if name == b"lmpop" { 1 } else { 2 };
            let numkeys = crate::resp::string_to_i64(&args[at]).unwrap_or(0).max(0) as usize;
            one(LIST, side(arg(at + 1 + numkeys), "lpop", "rpop"))
        }
        b"linsert" => one(LIST, "linsert"),
        b"lset" => one(LIST, "lset"),
        b"ltrim" => one(LIST, "ltrim"),
        b"lrem" => one(LIST, "lrem"),
        // The push is told first, as Redis tells it.
        b"rpoplpush" | b"brpoplpush" => vec![(LIST, "lpush", Some(2)), (LIST, "rpop", Some(1))],
        b"lmove" | b"blmove" => vec![
            (LIST, side(arg(4), "lpush", "rpush"), Some(2)),
            (LIST, side(arg(3), "lpop", "rpop"), Some(1)),
        ],
        b"sadd" => one(SET, "sadd"),
        b"srem" => one(SET, "srem"),
        b"spop" => one(SET, "spop"),
        b"smove" => vec![(SET, "srem", Some(1)), (SET, "sadd", Some(2))],
        b"sinterstore" => one(SET, "sinterstore"),
        b"sunionstore" => one(SET, "sunionstore"),
        b"sdiffstore" => one(SET, "sdiffstore"),
        b"hset" | b"hmset" | b"hsetnx" => one(HASH, "hset"),
        b"hdel" => one(HASH, "hdel"),
        b"hincrby" => one(HASH, "hincrby"),
        b"hincrbyfloat" => one(HASH, "hincrbyfloat"),
        b"zadd" if has(b"incr") => one(ZSET, "zincr"),
        b"zadd" => one(ZSET, "zadd"),
        b"zincrby" => one(ZSET, "zincr"),
        b"zrem" => one(ZSET, "zrem"),
        b"zremrangebyscore" => one(ZSET, "zremrangebyscore"),
        b"zremrangebyrank" => one(ZSET, "zremrangebyrank"),
        b"zremrangebylex" => one(ZSET, "zremrangebylex"),
        b"zpopmin" | b"bzpopmin" => one(ZSET, "zpopmin"),
        b"zpopmax" | b"bzpopmax" => one(ZSET, "zpopmax"),
        b"zmpop" | b"bzmpop" => {
            let at = if name == b"zmpop" { 1 } else { 2 };
            let numkeys = crate::resp::string_to_i64(&args[at]).unwrap_or(0).max(0) as usize;
            let min = arg(at + 1 + numkeys) == b"min";
            one(ZSET, if min { "zpopmin" } else { "zpopmax" })
        }
        b"zunionstore" => one(ZSET, "zunionstore"),
        b"zinterstore" => one(ZSET, "zinterstore"),
        b"zdiffstore" => one(ZSET, "zdiffstore"),
        b"zrangestore" => one(ZSET, "zrangestore"),
        b"sort" => one(LIST, "sortstore"),
        b"xadd" => one(STREAM, "xadd"),
        b"xdel" => one(STREAM, "xdel"),
        b"xtrim" => one(STREAM, "xtrim"),
        b"xsetid" => one(STREAM, "xsetid"),
        b"xgroup" => match &arg(1)[..] {
            b"create" => one(STREAM, "xgroup-create"),
            b"setid" => one(STREAM, "xgroup-setid"),
            b"destroy" => one(STREAM, "xgroup-destroy"),
            b"createconsumer" => one(STREAM, "xgroup-createconsumer"),
            b"delconsumer" => one(STREAM, "xgroup-delconsumer"),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// Publishes the events of the command `args` that changed `changes`
/// (the data model's list; nothing when notifications are off): each of
/// the command's events for the keys it is about, in Redis's order, then
/// `del` for each key whose record went, unless the command's own event
/// says so (DEL, RENAME's source, MOVE's source).
///
/// Clients that track the keys hear of them first ([`super::tracking`];
/// `writer`: the client whose command it was).
pub(super) fn command(shared: &Shared, writer: Option<u64>, args: &Args, changes: &[Change]) {
    let keys = changes.iter().map(|c| &c.key[..]);
    shared.tracking.invalidate(shared, writer, keys);
    events(shared, args, changes);
}

/// The keyspace events of command `args`, which changed `changes`.
fn events(shared: &Shared, args: &Args, changes: &[Change]) {
    if changes.is_empty() || !shared.tunables.notify.on() {
        return;
    }
    let name = args[0].to_ascii_lowercase();
    let events = events_of(&name, args);
    let said = matches!(
        &name[..],
        b"del" | b"unlink" | b"getdel" | b"rename" | b"renamenx" | b"move"
    );
    let about = |at: Option<usize>, change: &Change| {
        at.is_none_or(|i| args.get(i).map(|a| &a[..]) == Some(&change.key[..]))
    };
    // What the data model told of itself comes first (a consumer a read
    // or a claim made, before what it read).
    for change in changes {
        for event in &change.events {
            tell(shared, STREAM, event, change);
        }
    }
    let mut deleted = vec![false; changes.len()];
    // A key that held nothing is `new` just before its first own event
    // (Redis tells it as it adds the key).
    let mut told_new = vec![false; changes.len()];
    // RENAME and MOVE add the target before they tell of the source.
    if matches!(&name[..], b"rename" | b"renamenx" | b"move") {
        for (c, change) in changes.iter().enumerate().filter(|(_, c)| c.created) {
            told_new[c] = true;
            tell(shared, NEW, "new", change);
        }
    }
    for (i, &(class, event, at)) in events.iter().enumerate() {
        for (c, change) in changes.iter().enumerate() {
            if !about(at, change) {
                continue;
            }
            let fits = match event {
                // MOVE's one key: gone from one database, new in the other.
                "move_from" | "rename_from" | "del" => change.removed,
                "move_to" | "rename_to" => !change.removed,
                // EXPIRE to a time already past removes the key: a del.
                "expire" => !change.removed,
                _ => true,
            };
            if fits {
                if change.created && !told_new[c] {
                    told_new[c] = true;
                    tell(shared, NEW, "new", change);
                }
                tell(shared, class, event, change);
            }
            // A key whose record went: `del` after its last own event
            // (SMOVE's source: srem, del, then the target's sadd).
            let last = !events[i + 1..]
                .iter()
                .any(|&(_, _, later)| about(later, change));
            if last && change.removed && !said && !deleted[c] {
                deleted[c] = true;
                tell(shared, GENERIC, "del", change);
            }
        }
    }
    for (c, change) in changes.iter().enumerate() {
        if change.created && !told_new[c] {
            tell(shared, NEW, "new", change);
        }
        if change.removed && !said && !deleted[c] {
            tell(shared, GENERIC, "del", change);
        }
    }
}

thread_local! {
    /// A transaction's or a script's commands and what each changed,
    /// held until its writes are applied as a whole.
    static HELD: std::cell::RefCell<Vec<(Args, Vec<Change>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Holds command `args`'s changes until [`release`] (a transaction's or
/// a script's command, whose writes are not applied yet).
pub(super) fn hold(args: &Args, changes: Vec<Change>) {
    if !changes.is_empty() {
        HELD.with(|h| h.borrow_mut().push((args.clone(), changes)));
    }
}

/// Publishes the events held on this thread: the writes (of client
/// `writer`'s transaction or script) are applied.
pub(super) fn release(shared: &Shared, writer: Option<u64>) {
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    // Tracking clients hear of the whole once (a BCAST client gets one
    // message per prefix, as Redis sends after a transaction).
    let keys = held
        .iter()
        .flat_map(|(_, changes)| changes.iter().map(|c| &c.key[..]));
    shared.tracking.invalidate(shared, writer, keys);
    for (args, changes) in held {
        events(shared, &args, &changes);
    }
}

/// Drops the events held on this thread: the writes were not applied.
pub(super) fn forget() {
    HELD.with(|h| h.borrow_mut().clear());
}

/// Publishes `expired` for each key the expiry sweep removed.
pub(super) fn expired(shared: &Shared, removed: &[Change]) {
    let keys = removed.iter().map(|c| &c.key[..]);
    shared.tracking.invalidate(shared, None, keys);
    if !shared.tunables.notify.on() {
        return;
    }
    for change in removed {
        tell(shared, EXPIRED, "expired", change);
    }
}

/// [`publish`] of `event` about the key of `change`, in the logical
/// database that names its physical one now.
fn tell(shared: &Shared, class: u32, event: &str, change: &Change) {
    let db = shared.db.logical_of(change.database);
    publish(shared, class, event, db, &change.key);
}

fn publish(shared: &Shared, class: u32, event: &str, db: u8, key: &[u8]) {
    let flags = shared.tunables.notify.flags.load(Ordering::Relaxed);
    if flags & class == 0 {
        return;
    }
    if flags & KEYSPACE != 0 {
        let mut channel = format!("__keyspace@{db}__:").into_bytes();
        channel.extend_from_slice(key);
        shared.pubsub.publish(&channel, event.as_bytes(), false);
    }
    if flags & KEYEVENT != 0 {
        let channel = format!("__keyevent@{db}__:{event}").into_bytes();
        shared.pubsub.publish(&channel, key, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_read_and_print_as_redis_s() {
        for (given, shown) in [
            ("gKE", "gKE"),
            ("$lshzxeKE", "$lshzxeKE"),
            ("KA", "AK"),
            ("EA", "AE"),
            ("", ""),
            ("Kn", "nK"),
            ("KEAn", "AnKE"),
        ] {
            assert_eq!(format(parse(given.as_bytes()).unwrap()), shown, "{given}");
        }
        assert!(parse(b"KQ").is_err());
    }
}
