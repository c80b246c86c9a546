//! Publish/subscribe: SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE and their UN-
//! forms, PUBLISH, SPUBLISH, PUBSUB — Redis 7.0's pubsub.c: its replies
//! (arrays in RESP2, push messages in RESP3), its counts and the RESP2
//! subscriber context where only a few commands run.
//!
//! The registry lists, per channel and per pattern, the connections that
//! subscribed; a message goes to each through its worker's push queue,
//! which the worker drains every turn (waking it if it sleeps), so a
//! publisher on one worker reaches subscribers on all of them. Nothing
//! is kept: a subscriber that is gone or slow to read loses nothing it
//! was sent, but no message waits for one that is not subscribed.

use super::conn::Conn;
use crate::commands::glob_match;
use crate::resp::{Args, Reply};
use sluice_io::net::ConnId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Where a worker takes the messages for its subscribers: (slot, client
/// id, message).
pub(super) type PushQueue = super::mailbox::Mailbox<(ConnId, u64, super::tracking::Push)>;

/// A subscribed connection.
#[derive(Clone)]
struct Subscriber {
    client: u64,
    slot: ConnId,
    queue: Arc<PushQueue>,
}

/// What a name is subscribed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// SUBSCRIBE.
    Channel,
    /// PSUBSCRIBE.
    Pattern,
    /// SSUBSCRIBE.
    Shard,
}

impl Kind {
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Kind::Channel => ("subscribe", "unsubscribe"),
            Kind::Pattern => ("psubscribe", "punsubscribe"),
            Kind::Shard => ("ssubscribe", "sunsubscribe"),
        }
    }
}

#[derive(Default)]
struct Registry {
    /// Subscribers by name, in subscription order (BTreeMap per kind
    /// keeps PUBSUB CHANNELS' walk cheap to reason about).
    by_kind: [BTreeMap<Vec<u8>, Vec<Subscriber>>; 3],
}

/// Every subscription of a server.
#[derive(Default)]
pub struct PubSub {
    registry: Mutex<Registry>,
    /// Subscriptions now (PUBLISH with none takes no lock).
    count: AtomicUsize,
}

fn index(kind: Kind) -> usize {
    match kind {
        Kind::Channel => 0,
        Kind::Pattern => 1,
        Kind::Shard => 2,
    }
}

/// A connection's own subscriptions.
#[derive(Debug, Default)]
pub(super) struct Subscriptions {
    channels: Vec<Vec<u8>>,
    patterns: Vec<Vec<u8>>,
    shards: Vec<Vec<u8>>,
}

impl Subscriptions {
    fn list(&mut self, kind: Kind) -> &mut Vec<Vec<u8>> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shards,
        }
    }

    /// Redis's count in (un)subscribe replies: channels and patterns, or
    /// shard channels for the shard kind.
    fn count(&self, kind: Kind) -> i64 {
        match kind {
            Kind::Shard => self.shards.len() as i64,
            _ => (self.channels.len() + self.patterns.len()) as i64,
        }
    }

    /// Channels, patterns and shard channels subscribed to.
    pub(super) fn counts(&self) -> [usize; 3] {
        [self.channels.len(), self.patterns.len(), self.shards.len()]
    }

    /// Whether the connection is in subscriber mode.
    pub(super) fn any(&self) -> bool {
        !(self.channels.is_empty() && self.patterns.is_empty() && self.shards.is_empty())
    }
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

impl PubSub {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes `conn` to `names`; the replies, one per name.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a worker's connection"
    )]
    pub(super) fn subscribe(&self, conn: &mut Conn, kind: Kind, names: &[Vec<u8>]) -> Vec<Reply> {
        let queue = conn.pushes.clone().expect("a worker's connection");
        let me = Subscriber {
            client: conn.session.id(),
            slot: conn.slot,
            queue,
        };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let mine = conn.subscriptions.list(kind);
            if !mine.contains(name) {
                mine.push(name.clone());
                self.lock().by_kind[index(kind)]
                    .entry(name.clone())
                    .or_default()
                    .push(me.clone());
                self.count.fetch_add(1, Ordering::AcqRel);
            }
            let count = conn.subscriptions.count(kind);
            out.push(Reply::Push(vec![
                bulk(kind.words().0.as_bytes()),
                bulk(name),
                Reply::Integer(count),
            ]));
        }
        out
    }

    /// Unsubscribes `conn` from `names` (empty: from all of `kind`); the
    /// replies, one per name (one with a null name when there was none).
    pub(super) fn unsubscribe(&self, conn: &mut Conn, kind: Kind, names: &[Vec<u8>]) -> Vec<Reply> {
        let names: Vec<Vec<u8>> = if names.is_empty() {
            conn.subscriptions.list(kind).clone()
        } else {
            names.to_vec()
        };
        let word = bulk(kind.words().1.as_bytes());
        if names.is_empty() {
            let count = conn.subscriptions.count(kind);
            return vec![Reply::Push(vec![word, Reply::Null, Reply::Integer(count)])];
        }
        let mut out = Vec::with_capacity(names.len());
        for name in &names {
            self.leave(conn, kind, name);
            let count = conn.subscriptions.count(kind);
            out.push(Reply::Push(vec![
                word.clone(),
                bulk(name),
                Reply::Integer(count),
            ]));
        }
        out
    }

    fn leave(&self, conn: &mut Conn, kind: Kind, name: &[u8]) {
        let mine = conn.subscriptions.list(kind);
        let Some(at) = mine.iter().position(|n| n == name) else {
            return;
        };
        mine.remove(at);
        let client = conn.session.id();
        let mut registry = self.lock();
        let by_name = &mut registry.by_kind[index(kind)];
        if let Some(subs) = by_name.get_mut(name) {
            subs.retain(|s| s.client != client);
            if subs.is_empty() {
                by_name.remove(name);
            }
        }
        self.count.fetch_sub(1, Ordering::AcqRel);
    }

    /// Drops every subscription of `conn` (RESET, disconnection), without
    /// replies.
    pub(super) fn leave_all(&self, conn: &mut Conn) {
        for kind in [Kind::Channel, Kind::Pattern, Kind::Shard] {
            for name in conn.subscriptions.list(kind).clone() {
                self.leave(conn, kind, &name);
            }
        }
    }

    /// PUBLISH (or SPUBLISH with `shard`): delivers `message`; how many
    /// subscriptions received it.
    pub(super) fn publish(&self, channel: &[u8], message: &[u8], shard: bool) -> i64 {
        if self.count.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let registry = self.lock();
        let mut receivers = 0;
        let (kind, word) = if shard {
            (Kind::Shard, &b"smessage"[..])
        } else {
            (Kind::Channel, &b"message"[..])
        };
        if let Some(subs) = registry.by_kind[index(kind)].get(channel) {
            for s in subs {
                let m = Reply::Push(vec![bulk(word), bulk(channel), bulk(message)]);
                s.queue
                    .post((s.slot, s.client, super::tracking::Push::Message(m)));
                receivers += 1;
            }
        }
        if !shard {
            for (pattern, subs) in &registry.by_kind[index(Kind::Pattern)] {
                if !glob_match(pattern, channel) {
                    continue;
                }
                for s in subs {
                    let m = Reply::Push(vec![
                        bulk(b"pmessage"),
                        bulk(pattern),
                        bulk(channel),
                        bulk(message),
                    ]);
                    s.queue
                        .post((s.slot, s.client, super::tracking::Push::Message(m)));
                    receivers += 1;
                }
            }
        }
        receivers
    }

    /// PUBSUB's subcommands.
    pub(super) fn pubsub(&self, args: &Args) -> Reply {
        let sub = args[1].to_ascii_lowercase();
        let registry = self.lock();
        let names = |kind: Kind, pattern: Option<&Vec<u8>>| {
            Reply::Array(
                registry.by_kind[index(kind)]
                    .keys()
                    .filter(|c| pattern.is_none_or(|p| glob_match(p, c)))
                    .map(|c| bulk(c))
                    .collect(),
            )
        };
        let numsub = |kind: Kind| {
            let mut out = Vec::new();
            for c in &args[2..] {
                let n = registry.by_kind[index(kind)].get(c).map_or(0, Vec::len);
                out.push(bulk(c));
                out.push(Reply::Integer(n as i64));
            }
            Reply::Array(out)
        };
        let given = String::from_utf8_lossy(&args[1]);
        match (&sub[..], args.len()) {
            (b"channels", 2 | 3) => names(Kind::Channel, args.get(2)),
            (b"shardchannels", 2 | 3) => names(Kind::Shard, args.get(2)),
            (b"numsub", _) => numsub(Kind::Channel),
            (b"shardnumsub", _) => numsub(Kind::Shard),
            (b"numpat", 2) => Reply::Integer(registry.by_kind[index(Kind::Pattern)].len() as i64),
            (b"help", 2) => Reply::Array(
                HELP.iter().map(|l| Reply::Simple((*l).into())).collect(),
            ),
            // Redis's dispatch checks a subcommand's arity first.
            (b"numpat" | b"help", _) => Reply::Error(format!(
                "ERR wrong number of arguments for 'pubsub|{}' command",
                String::from_utf8_lossy(&sub)
            )),
            (b"channels" | b"shardchannels", _) => Reply::Error(format!(
                "ERR unknown subcommand or wrong number of arguments for '{given}'. Try PUBSUB HELP."
            )),
            _ => Reply::Error(format!(
                "ERR unknown subcommand '{given}'. Try PUBSUB HELP."
            )),
        }
    }

    /// Channels with subscribers, per kind (INFO).
    /// The ids of the clients subscribed to anything (CLIENT KILL TYPE
    /// pubsub).
    pub(super) fn subscribed_clients(&self) -> std::collections::HashSet<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Default::default();
        }
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        registry
            .by_kind
            .iter()
            .flat_map(|names| names.values())
            .flatten()
            .map(|s| s.client)
            .collect()
    }

    pub(super) fn channel_count(&self) -> usize {
        self.lock().by_kind[0].len()
    }

    /// Distinct patterns subscribed to (INFO).
    pub(super) fn pattern_count(&self) -> usize {
        self.lock().by_kind[1].len()
    }
}

const HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
];

/// The pub/sub commands and their arities.
pub(super) const COMMANDS: &[(&str, i32)] = &[
    ("subscribe", -2),
    ("unsubscribe", -1),
    ("psubscribe", -2),
    ("punsubscribe", -1),
    ("ssubscribe", -2),
    ("sunsubscribe", -1),
    ("publish", 3),
    ("spublish", 3),
    ("pubsub", -2),
];

/// Whether RESP2's subscriber context lets `name` run.
pub(super) fn allowed_while_subscribed(name: &[u8]) -> bool {
    matches!(
        name,
        b"ping"
            | b"subscribe"
            | b"ssubscribe"
            | b"unsubscribe"
            | b"sunsubscribe"
            | b"psubscribe"
            | b"punsubscribe"
            | b"quit"
            | b"reset"
    )
}

/// Runs pub/sub command `name`; None if it is not one. The
/// (un)subscribe confirmations are queued here as pushes (CLIENT REPLY OFF
/// does not silence them, as in Redis): Some(None).
pub(super) fn run(ps: &PubSub, conn: &mut Conn, name: &[u8], args: &Args) -> Option<Option<Reply>> {
    let names = || args[1..].to_vec();
    let mut replies = match name {
        b"subscribe" => ps.subscribe(conn, Kind::Channel, &names()),
        b"psubscribe" => ps.subscribe(conn, Kind::Pattern, &names()),
        b"ssubscribe" => ps.subscribe(conn, Kind::Shard, &names()),
        b"unsubscribe" => ps.unsubscribe(conn, Kind::Channel, &names()),
        b"punsubscribe" => ps.unsubscribe(conn, Kind::Pattern, &names()),
        b"sunsubscribe" => ps.unsubscribe(conn, Kind::Shard, &names()),
        b"publish" => vec![Reply::Integer(ps.publish(&args[1], &args[2], false))],
        b"spublish" => vec![Reply::Integer(ps.publish(&args[1], &args[2], true))],
        b"pubsub" => vec![ps.pubsub(args)],
        _ => return None,
    };
    if name.ends_with(b"subscribe") {
        for r in &replies {
            conn.push_message(r);
        }
        return Some(None);
    }
    Some(replies.pop())
}
