//! Redis's tuning parameters: what `CONFIG SET` takes and `CONFIG GET`
//! reports beyond the settings `sluice serve` has flags for.
//!
//! Redis's clients and tools (its own test suite first) set memory-encoding
//! thresholds, background-job rates and monitoring limits as they start. A
//! server that refuses them breaks the client before its first command, so
//! each is checked as Redis checks it (same bounds, same error texts),
//! kept and reported back. Most change nothing in Sluice: its types keep
//! one layout on the device whatever their size, and its background work
//! is the store's. The ones that do are marked [`Effect`]; `docs` (README,
//! "Redis tuning parameters") lists them.

use sluice_redis::Db;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// How a parameter's value is written and checked.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A signed integer within bounds.
    Int { min: i64, max: i64 },
    /// A byte count: digits with an optional unit (b, k, kb, m, mb, g, gb),
    /// reported in bytes.
    Bytes { min: i64, max: i64 },
    /// A byte count as `Bytes`, or a percentage of `maxmemory` (`N%`,
    /// at most 100).
    BytesOrPercent { max: i64 },
    /// `yes` or `no`.
    Bool,
    /// One of a few words.
    Word(&'static [&'static str]),
    /// `save`: empty, or pairs of seconds and changes.
    SavePoints,
    /// `notify-keyspace-events`: classes of events, as Redis spells
    /// them, reported in Redis's order.
    Events,
    /// A value only one setting of is served (what Sluice does always).
    Only {
        value: &'static str,
        why: &'static str,
    },
}

/// What a parameter changes in Sluice, beyond being reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Nothing: kept and reported, as Redis's clients expect.
    Kept,
    /// The stream node size `XADD`/`XTRIM ... ~` trims by.
    StreamNodeEntries,
    /// `hll-sparse-max-bytes`: the data model's setting of it.
    HllSparseMaxBytes,
    /// How many fields a hash may have and keep its field order.
    HashOrderEntries,
    /// How long a hash's fields and values may be and keep its order.
    HashOrderValueBytes,
    /// `notify-keyspace-events`: which events go out.
    Notify,
    /// How long a script runs before other clients get BUSY.
    BusyReply,
    /// `min-replicas-to-write` or `min-replicas-max-lag`: with both above
    /// 0, writes need that many replicas (Sluice has none yet, so every
    /// write is refused, as Redis refuses them with too few).
    MinReplicas,
    /// SLOWLOG's threshold (µs), its length, LATENCY's threshold (ms).
    SlowlogSlowerThan,
    SlowlogMaxLen,
    LatencyThreshold,
}

/// One of Redis's parameters.
#[derive(Debug)]
pub struct Tunable {
    name: &'static str,
    alias: Option<&'static str>,
    kind: Kind,
    default: &'static str,
    effect: Effect,
}

const INT_MAX: i64 = i32::MAX as i64;
const LONG_MAX: i64 = i64::MAX;

const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

const fn bytes(min: i64, max: i64) -> Kind {
    Kind::Bytes { min, max }
}

const fn kept(name: &'static str, kind: Kind, default: &'static str) -> Tunable {
    Tunable {
        name,
        alias: None,
        kind,
        default,
        effect: Effect::Kept,
    }
}

const fn aliased(
    name: &'static str,
    alias: &'static str,
    kind: Kind,
    default: &'static str,
) -> Tunable {
    Tunable {
        name,
        alias: Some(alias),
        kind,
        default,
        effect: Effect::Kept,
    }
}

/// Redis 7.0's parameters Sluice takes, with Redis's bounds and defaults.
static TUNABLES: &[Tunable] = &[
    // Memory encodings: every type has one layout on Sluice's device.
    // A hash within both keeps its fields in the order first set.
    Tunable {
        name: "hash-max-listpack-entries",
        alias: Some("hash-max-ziplist-entries"),
        kind: int(0, LONG_MAX),
        default: "512",
        effect: Effect::HashOrderEntries,
    },
    Tunable {
        name: "hash-max-listpack-value",
        alias: Some("hash-max-ziplist-value"),
        kind: bytes(0, LONG_MAX),
        default: "64",
        effect: Effect::HashOrderValueBytes,
    },
    aliased(
        "list-max-listpack-size",
        "list-max-ziplist-size",
        int(i32::MIN as i64, INT_MAX),
        "-2",
    ),
    kept("list-compress-depth", int(0, INT_MAX), "0"),
    kept("set-max-intset-entries", int(0, LONG_MAX), "512"),
    aliased(
        "zset-max-listpack-entries",
        "zset-max-ziplist-entries",
        int(0, LONG_MAX),
        "128",
    ),
    aliased(
        "zset-max-listpack-value",
        "zset-max-ziplist-value",
        bytes(0, LONG_MAX),
        "64",
    ),
    kept("stream-node-max-bytes", bytes(0, LONG_MAX), "4096"),
    Tunable {
        name: "stream-node-max-entries",
        alias: None,
        kind: int(0, LONG_MAX),
        default: "100",
        effect: Effect::StreamNodeEntries,
    },
    Tunable {
        name: "hll-sparse-max-bytes",
        alias: None,
        kind: bytes(0, LONG_MAX),
        default: "3000",
        effect: Effect::HllSparseMaxBytes,
    },
    // Redis's memory and background jobs: the store runs its own.
    kept("activerehashing", Kind::Bool, "yes"),
    kept("activedefrag", Kind::Bool, "no"),
    kept("active-defrag-cycle-min", int(1, 99), "1"),
    kept("active-defrag-cycle-max", int(1, 99), "25"),
    kept("active-defrag-threshold-lower", int(0, 1000), "10"),
    kept("active-defrag-threshold-upper", int(0, 1000), "100"),
    kept(
        "active-defrag-ignore-bytes",
        bytes(1, LONG_MAX),
        "104857600",
    ),
    kept("active-defrag-max-scan-fields", int(1, LONG_MAX), "1000"),
    kept("active-expire-effort", int(1, 10), "1"),
    kept("hz", int(0, INT_MAX), "10"),
    kept("dynamic-hz", Kind::Bool, "yes"),
    kept("lazyfree-lazy-eviction", Kind::Bool, "no"),
    kept("lazyfree-lazy-expire", Kind::Bool, "no"),
    kept("lazyfree-lazy-server-del", Kind::Bool, "no"),
    kept("lazyfree-lazy-user-del", Kind::Bool, "no"),
    kept("lazyfree-lazy-user-flush", Kind::Bool, "no"),
    kept("lfu-log-factor", int(0, INT_MAX), "10"),
    kept("lfu-decay-time", int(0, INT_MAX), "1"),
    // Memory: Sluice keeps its data on the device and bounds its own
    // memory (memtables, block cache) by its settings, so it neither
    // evicts keys nor refuses writes at `maxmemory`; both are kept and
    // reported for the clients that set them.
    kept("maxmemory", bytes(0, LONG_MAX), "0"),
    kept(
        "maxmemory-policy",
        Kind::Word(&[
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "noeviction",
        ]),
        "noeviction",
    ),
    kept("maxmemory-samples", int(1, INT_MAX), "5"),
    // Replication (Sluice has no replicas yet: kept for the clients that
    // set them).
    kept("repl-backlog-size", bytes(1, LONG_MAX), "1048576"),
    kept("repl-backlog-ttl", int(0, INT_MAX), "3600"),
    kept("repl-timeout", int(1, INT_MAX), "60"),
    kept(
        "maxmemory-clients",
        Kind::BytesOrPercent { max: LONG_MAX },
        "0",
    ),
    kept("maxmemory-eviction-tenacity", int(0, 100), "10"),
    kept("jemalloc-bg-thread", Kind::Bool, "yes"),
    kept("tracking-table-max-keys", int(0, LONG_MAX), "1000000"),
    // Snapshots: Sluice's log makes every write durable as --durability says.
    kept("rdbcompression", Kind::Bool, "yes"),
    kept("stop-writes-on-bgsave-error", Kind::Bool, "yes"),
    kept("save", Kind::SavePoints, ""),
    kept(
        "appendonly",
        Kind::Only {
            value: "yes",
            why: "Sluice logs every write; `sluice serve --durability` says when the log is synced",
        },
        "yes",
    ),
    // Monitoring and scripts.
    Tunable {
        name: "slowlog-log-slower-than",
        alias: None,
        kind: int(-1, LONG_MAX),
        default: "10000",
        effect: Effect::SlowlogSlowerThan,
    },
    Tunable {
        name: "slowlog-max-len",
        alias: None,
        kind: int(0, LONG_MAX),
        default: "128",
        effect: Effect::SlowlogMaxLen,
    },
    Tunable {
        name: "latency-monitor-threshold",
        alias: None,
        kind: int(0, LONG_MAX),
        default: "0",
        effect: Effect::LatencyThreshold,
    },
    kept("latency-tracking", Kind::Bool, "yes"),
    kept("acllog-max-len", int(0, LONG_MAX), "128"),
    Tunable {
        name: "busy-reply-threshold",
        alias: Some("lua-time-limit"),
        kind: int(0, LONG_MAX),
        default: "5000",
        effect: Effect::BusyReply,
    },
    Tunable {
        name: "min-replicas-to-write",
        alias: Some("min-slaves-to-write"),
        kind: int(0, INT_MAX),
        default: "0",
        effect: Effect::MinReplicas,
    },
    Tunable {
        name: "min-replicas-max-lag",
        alias: Some("min-slaves-max-lag"),
        kind: int(0, INT_MAX),
        default: "10",
        effect: Effect::MinReplicas,
    },
    Tunable {
        name: "notify-keyspace-events",
        alias: None,
        kind: Kind::Events,
        default: "",
        effect: Effect::Notify,
    },
    // The process.
    kept(
        "loglevel",
        Kind::Word(&["debug", "verbose", "notice", "warning"]),
        "notice",
    ),
    kept("tcp-keepalive", int(0, INT_MAX), "300"),
    kept("shutdown-timeout", int(0, INT_MAX), "10"),
    kept(
        "oom-score-adj",
        Kind::Word(&["no", "yes", "relative", "absolute"]),
        "no",
    ),
    kept(
        "acl-pubsub-default",
        Kind::Word(&["allchannels", "resetchannels"]),
        "resetchannels",
    ),
    kept("crash-log-enabled", Kind::Bool, "yes"),
    // RESTORE checks every payload whole whatever this says: a value is
    // decoded in full before anything is written.
    kept(
        "sanitize-dump-payload",
        Kind::Word(&["no", "yes", "clients"]),
        "no",
    ),
    // Hidden (CONFIG GET names it only when asked by name): Redis's tests
    // slow its loading with it.
    kept("key-load-delay", int(i32::MIN as i64, INT_MAX), "0"),
    kept("crash-memcheck-enabled", Kind::Bool, "yes"),
];

/// Parameters CONFIG GET's patterns pass over, as Redis's hidden ones.
pub const HIDDEN: &[&str] = &["key-load-delay"];

/// The parameters' values now, by name.
#[derive(Debug)]
pub struct Tunables {
    values: Mutex<HashMap<&'static str, String>>,
    /// `busy-reply-threshold` in ms, read before every command.
    pub busy_reply_ms: std::sync::atomic::AtomicU64,
    /// `notify-keyspace-events` in force.
    pub notify: super::notify::Notify,
    /// See [`Effect::MinReplicas`]; read before every write.
    writes_need_replicas: std::sync::atomic::AtomicBool,
    /// What SLOWLOG and LATENCY keep.
    pub slow: super::slowlog::Thresholds,
}

impl Default for Tunables {
    fn default() -> Tunables {
        Tunables {
            values: Mutex::new(
                TUNABLES
                    .iter()
                    .map(|t| (t.name, t.default.to_string()))
                    .collect(),
            ),
            busy_reply_ms: std::sync::atomic::AtomicU64::new(5000),
            notify: super::notify::Notify::default(),
            writes_need_replicas: std::sync::atomic::AtomicBool::new(false),
            slow: super::slowlog::Thresholds::default(),
        }
    }
}

impl Tunables {
    /// The parameter `name` names (its name or Redis's older alias, in any
    /// case).
    pub fn find(name: &str) -> Option<&'static Tunable> {
        TUNABLES.iter().find(|t| {
            t.name.eq_ignore_ascii_case(name)
                || t.alias.is_some_and(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// Every name CONFIG GET's patterns match against, aliases included
    /// (as Redis 7.0 lists them), with the value each reports.
    pub fn all(&self) -> Vec<(&'static str, String)> {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for t in TUNABLES {
            let value = values[t.name].clone();
            if let Some(alias) = t.alias {
                out.push((alias, value.clone()));
            }
            out.push((t.name, value));
        }
        out
    }

    /// The parameters whose values differ from their defaults, by name
    /// (what CONFIG REWRITE keeps).
    pub fn changed(&self) -> Vec<(String, String)> {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        TUNABLES
            .iter()
            .filter(|t| values[t.name] != t.default && !HIDDEN.contains(&t.name))
            .map(|t| (t.name.to_string(), values[t.name].clone()))
            .collect()
    }

    /// The value `t` reports now.
    pub fn get(&self, t: &Tunable) -> String {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values[t.name].clone()
    }

    /// Sets `t` to a value [`check`] returned, and applies its effect.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: checked as a non-negative number; checked as a non-negative integer; checked as an integer; checked"
    )]
    pub fn set(&self, db: &Db, t: &'static Tunable, value: String) {
        match t.effect {
            Effect::HllSparseMaxBytes
            | Effect::StreamNodeEntries
            | Effect::HashOrderEntries
            | Effect::HashOrderValueBytes => {
                let n = value
                    .parse::<u64>()
                    .expect("checked as a non-negative number");
                let settings = &db.settings;
                let setting = match t.effect {
                    Effect::HllSparseMaxBytes => &settings.hll_sparse_max_bytes,
                    Effect::StreamNodeEntries => &settings.stream_node_entries,
                    Effect::HashOrderEntries => &settings.hash_order_entries,
                    _ => &settings.hash_order_value_bytes,
                };
                setting.store(n, Ordering::Relaxed);
            }
            Effect::BusyReply => {
                let ms = value
                    .parse::<u64>()
                    .expect("checked as a non-negative integer");
                self.busy_reply_ms.store(ms, Ordering::Relaxed);
            }
            Effect::SlowlogSlowerThan => {
                let us = value.parse::<i64>().expect("checked as an integer");
                self.slow.slower_than_us.store(us, Ordering::Relaxed);
            }
            Effect::SlowlogMaxLen => {
                let n = value
                    .parse::<u64>()
                    .expect("checked as a non-negative integer");
                self.slow.max_len.store(n, Ordering::Relaxed);
            }
            Effect::LatencyThreshold => {
                let ms = value
                    .parse::<u64>()
                    .expect("checked as a non-negative integer");
                self.slow.latency_ms.store(ms, Ordering::Relaxed);
            }
            Effect::Notify => {
                let flags = super::notify::parse(value.as_bytes()).expect("checked");
                // The caller has batches list the keys they change while
                // events go out (Shared::refresh_change_recording).
                self.notify.set(flags);
            }
            Effect::Kept | Effect::MinReplicas => {}
        }
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values.insert(t.name, value);
        if t.effect == Effect::MinReplicas {
            let positive = |name: &str| values[name].parse::<u64>().is_ok_and(|n| n > 0);
            let need = positive("min-replicas-to-write") && positive("min-replicas-max-lag");
            self.writes_need_replicas.store(need, Ordering::Relaxed);
        }
    }

    /// `tracking-table-max-keys` (0: no bound).
    pub fn tracking_table_max_keys(&self) -> usize {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values["tracking-table-max-keys"].parse().unwrap_or(0)
    }

    /// Whether writes are refused for want of replicas (Redis's
    /// NOREPLICAS): `min-replicas-to-write` and `min-replicas-max-lag`
    /// both above 0, and Sluice serves no replicas yet.
    pub fn writes_need_replicas(&self) -> bool {
        self.writes_need_replicas.load(Ordering::Relaxed)
    }
}

impl Tunable {
    /// The parameter's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The name `given` calls it by: Redis's older alias if that is what
    /// it is (Redis's errors name the parameter so).
    pub fn called(&self, given: &str) -> &'static str {
        match self.alias {
            Some(alias) if alias.eq_ignore_ascii_case(given) => alias,
            _ => self.name,
        }
    }
}

/// `value` as `t` keeps and reports it, or Redis's reason it is refused
/// (the text after "CONFIG SET failed (possibly related to argument ...) - ").
pub fn check(t: &Tunable, value: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(value).map_err(|_| "argument must be text".to_string());
    match t.kind {
        Kind::Int { min, max } => {
            let n = crate::resp::string_to_i64(value)
                .ok_or("argument couldn't be parsed into an integer")?;
            within(n, min, max)
        }
        Kind::Bytes { min, max } => {
            let n = parse_bytes(value).ok_or("argument must be a memory value")?;
            within(n, min, max)
        }
        Kind::BytesOrPercent { max } => match value.strip_suffix(b"%") {
            Some(digits) => {
                let n = crate::resp::string_to_i64(digits)
                    .filter(|n| *n >= 0)
                    .ok_or("argument must be a memory or percent value")?;
                if n > 100 {
                    return Err("percentage argument must be less or equal to 100".into());
                }
                Ok(format!("{n}%"))
            }
            None => {
                let n = parse_bytes(value).ok_or("argument must be a memory or percent value")?;
                within(n, 0, max)
            }
        },
        Kind::Bool => match value.to_ascii_lowercase().as_slice() {
            b"yes" => Ok("yes".into()),
            b"no" => Ok("no".into()),
            _ => Err("argument must be 'yes' or 'no'".into()),
        },
        Kind::Word(words) => {
            let text = text?.to_ascii_lowercase();
            match words.iter().find(|w| **w == text) {
                Some(w) => Ok(w.to_string()),
                None => Err(format!(
                    "argument(s) must be one of the following: {}",
                    words.join(", ")
                )),
            }
        }
        Kind::SavePoints => save_points(text?),
        Kind::Events => super::notify::parse(value).map(super::notify::format),
        Kind::Only { value: only, why } => match text? {
            v if v.eq_ignore_ascii_case(only) => Ok(only.to_string()),
            _ => Err(why.to_string()),
        },
    }
}

/// `n` if it is within `min..=max`, else Redis's text for it.
fn within(n: i64, min: i64, max: i64) -> Result<String, String> {
    if (min..=max).contains(&n) {
        Ok(n.to_string())
    } else {
        Err(format!(
            "argument must be between {min} and {max} inclusive"
        ))
    }
}

/// A byte count within `min..=max` as CONFIG SET takes one (for the
/// settings `sluice serve` has flags for), or Redis's reason it is not.
pub fn memory(value: &[u8], min: i64, max: i64) -> Result<i64, String> {
    let n = parse_bytes(value).ok_or("argument must be a memory value")?;
    within(n, min, max).map(|_| n)
}

/// A byte count as Redis writes one: digits and an optional unit (k and
/// m and g are powers of 1000, kb and mb and gb of 1024), no sign.
fn parse_bytes(value: &[u8]) -> Option<i64> {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    let unit: u64 = match value[digits..].to_ascii_lowercase().as_slice() {
        b"" | b"b" => 1,
        b"k" => 1000,
        b"kb" => 1024,
        b"m" => 1000 * 1000,
        b"mb" => 1024 * 1024,
        b"g" => 1000 * 1000 * 1000,
        b"gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    let n: u64 = std::str::from_utf8(&value[..digits]).ok()?.parse().ok()?;
    i64::try_from(n.checked_mul(unit)?).ok()
}

/// `save`'s value: empty (no snapshots) or pairs of seconds and changes,
/// each a non-negative integer.
fn save_points(text: &str) -> Result<String, String> {
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    let numbers_ok = words.iter().all(|w| w.parse::<i64>().is_ok_and(|n| n >= 0));
    if !words.len().is_multiple_of(2) || !numbers_ok {
        return Err("Invalid save parameters".into());
    }
    Ok(words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_with_redis_bounds_and_texts() {
        let t = Tunables::find("HASH-MAX-ZIPLIST-ENTRIES").unwrap();
        assert_eq!(t.name(), "hash-max-listpack-entries");
        assert_eq!(check(t, b"16").unwrap(), "16");
        assert_eq!(
            check(t, b"-1").unwrap_err(),
            "argument must be between 0 and 9223372036854775807 inclusive"
        );
        assert_eq!(
            check(t, b"x").unwrap_err(),
            "argument couldn't be parsed into an integer"
        );
        let v = Tunables::find("zset-max-ziplist-value").unwrap();
        assert_eq!(check(v, b"1kb").unwrap(), "1024");
        assert_eq!(check(v, b"2M").unwrap(), "2000000");
        assert_eq!(
            check(v, b"-5").unwrap_err(),
            "argument must be a memory value"
        );
        let w = Tunables::find("loglevel").unwrap();
        assert_eq!(check(w, b"WARNING").unwrap(), "warning");
        assert_eq!(
            check(w, b"loud").unwrap_err(),
            "argument(s) must be one of the following: debug, verbose, notice, warning"
        );
        let s = Tunables::find("save").unwrap();
        assert_eq!(check(s, b"").unwrap(), "");
        assert_eq!(check(s, b" 900  1 60 10").unwrap(), "900 1 60 10");
        assert_eq!(check(s, b"900").unwrap_err(), "Invalid save parameters");
        let a = Tunables::find("appendonly").unwrap();
        assert!(check(a, b"no").unwrap_err().contains("--durability"));
        assert!(Tunables::find("no-such-parameter").is_none());
    }

    #[test]
    fn every_default_passes_its_own_check() {
        for t in TUNABLES {
            assert_eq!(
                check(t, t.default.as_bytes()).as_deref(),
                Ok(t.default),
                "{}",
                t.name
            );
        }
    }
}
