//! What a key is made of: OBJECT, MEMORY USAGE and TOUCH.
//!
//! Sluice keeps every type in one layout on its device (docs/FORMAT.md,
//! "Serving keyspace"), shares no values between keys and does not track
//! when a key was read, so:
//! - `OBJECT ENCODING` names Redis's encoding for a string (int, embstr,
//!   raw: by its bytes, as Redis chooses) and Redis's general encoding of
//!   a collection type (hashtable, quicklist, skiplist, stream);
//! - `OBJECT REFCOUNT` is 1;
//! - `OBJECT IDLETIME` and `OBJECT FREQ` answer that the server does not
//!   track them (FREQ with Redis's own text, true of the default policy);
//! - `MEMORY USAGE` is the bytes of the key's entries in the store: its
//!   record, and its members estimated from the first SAMPLES of them, as
//!   Redis samples.

use super::*;

/// Redis's answer when OBJECT FREQ asks without an LFU policy.
const NO_FREQ: &str = "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.";

/// Redis's OBJECT HELP text, then the HELP lines every help ends with.
const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
];

const MEMORY_HELP: &[&str] = &[
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return memory problems reports.",
    "MALLOC-STATS",
    "    Return internal statistics report from the memory allocator.",
    "PURGE",
    "    Attempt to purge dirty pages for reclamation by the allocator.",
    "STATS",
    "    Return information about the memory usage of the server.",
    "USAGE <key> [SAMPLES <count>]",
    "    Return memory in bytes used by <key> and its value. Nested values are",
    "    sampled up to <count> times (default: 5, 0 means sample all).",
    "HELP",
    "    Prints this help.",
];

/// The encoding Redis would give string `s`: `int` for a 64-bit integer
/// of at most 20 characters without leading zeros or sign quirks, `embstr`
/// up to 44 bytes, `raw` beyond.
fn string_encoding(s: &[u8]) -> &'static str {
    let canonical =
        s.len() <= 20 && string_to_i64(s).is_some_and(|n| n.to_string().as_bytes() == s);
    if canonical {
        "int"
    } else if s.len() <= 44 {
        "embstr"
    } else {
        "raw"
    }
}

fn encoding(value: &Value) -> &'static str {
    match value {
        Value::String(s) => string_encoding(s),
        Value::Hash { order: Some(_), .. } => "listpack",
        Value::Hash { .. } | Value::Set(_) => "hashtable",
        Value::List { .. } => "quicklist",
        Value::ZSet(_) => "skiplist",
        Value::Stream { .. } => "stream",
    }
}

pub(super) fn object(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let arities = [
        ("encoding", 3),
        ("refcount", 3),
        ("idletime", 3),
        ("freq", 3),
        ("help", 2),
    ];
    let sub = subcommand("OBJECT", args, &arities)?;
    if sub == b"help" {
        return Ok(help_reply(OBJECT_HELP));
    }
    let Some(entry) = ctx.get(&args[2])? else {
        return Ok(Reply::Null);
    };
    match &sub[..] {
        b"encoding" => Ok(Reply::Bulk(encoding(&entry.value).as_bytes().to_vec())),
        b"refcount" => Ok(int(1)),
        b"freq" => Err(fail(NO_FREQ)),
        _ => Err(fail(
            "ERR Sluice does not track when a key was last read: OBJECT IDLETIME has no answer",
        )),
    }
}

/// The bytes `key`'s entries take in the store: its record, plus its
/// member entries estimated from the first `samples` of them (all when
/// `samples` is `u64::MAX`).
fn usage_bytes(ctx: &Ctx<'_>, key: &[u8], entry: &Entry, samples: u64) -> Result<u64, Failure> {
    let record = (key.len() + entry.encode().len()) as u64;
    let Some(c) = entry.value.collection() else {
        return Ok(record);
    };
    let (mut seen, mut bytes) = (0u64, 0u64);
    let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    for item in ctx.members(c.id, all, false) {
        if seen == samples {
            break;
        }
        let (sub, value) = item?;
        bytes += (8 + sub.len() + value.len()) as u64;
        seen += 1;
    }
    let entries = entry.value.member_entries();
    let members = if seen == 0 {
        0
    } else {
        (bytes as u128 * entries as u128 / seen as u128) as u64
    };
    Ok(record + members)
}

pub(super) fn memory(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if subcommand("MEMORY", args, &[("usage", -3), ("help", 2)])? == b"help" {
        return Ok(help_reply(MEMORY_HELP));
    }
    let mut samples = 5u64;
    let mut j = 3;
    while j < args.len() {
        if !args[j].eq_ignore_ascii_case(b"samples") || j + 1 >= args.len() {
            return Err(fail(SYNTAX));
        }
        samples = match parse_i64(&args[j + 1])? {
            n if n < 0 => return Err(fail(SYNTAX)),
            0 => u64::MAX,
            n => n as u64,
        };
        j += 2;
    }
    match ctx.get(&args[2])? {
        None => Ok(Reply::Null),
        Some(entry) => Ok(int(usage_bytes(ctx, &args[2], &entry, samples)? as i64)),
    }
}

/// TOUCH: how many of the keys exist (Sluice keeps no access times to
/// update).
pub(super) fn touch(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut n = 0;
    for key in &args[1..] {
        n += i64::from(ctx.get(key)?.is_some());
    }
    Ok(int(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_get_the_encoding_redis_would_give_them() {
        assert_eq!(string_encoding(b"12345"), "int");
        assert_eq!(string_encoding(b"-9223372036854775808"), "int");
        assert_eq!(string_encoding(b"0123"), "embstr");
        assert_eq!(string_encoding(b"+1"), "embstr");
        assert_eq!(string_encoding(&[b'a'; 44]), "embstr");
        assert_eq!(string_encoding(&[b'a'; 45]), "raw");
    }
}
