//! Key commands and expiry, following Redis 7.0's db.c and expire.c.

use super::*;

pub(super) fn del(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    let _locked = ctx.lock(&keys);
    let mut batch = ctx.batch();
    let mut removed = 0;
    let mut seen = std::collections::HashSet::new();
    for key in keys {
        if let Some(e) = ctx.get_raw(key)? {
            if seen.insert(key) {
                ctx.remove(&mut batch, key, &e.value)?;
                removed += i64::from(!e.expired(ctx.now_ms()));
            }
        }
    }
    ctx.commit(batch)?;
    Ok(int(removed))
}

pub(super) fn exists(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut n = 0;
    for key in &args[1..] {
        n += i64::from(ctx.get(key)?.is_some());
    }
    Ok(int(n))
}

pub(super) fn type_of(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let name = ctx.get(&args[1])?.map_or("none", |e| e.value.type_name());
    Ok(Reply::Simple(name.into()))
}

/// Copies `from`'s value to `to` in `batch`: a collection's members under
/// a new object id.
fn copy_value(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    entry: &Entry,
    to: &[u8],
) -> Result<(), StoreError> {
    let Some(c) = entry.value.collection() else {
        return batch.put(to, entry);
    };
    let id = ctx.db().new_id()?;
    for (sub, member) in ctx.all_members(c.id)? {
        batch.put_member(to, id, &sub, &member)?;
    }
    batch.put_new(to, &entry.with_id(id))
}

/// Removes whatever `key` holds (live or expired) in `batch`'s database.
fn clear(ctx: &Ctx<'_>, batch: &mut DbBatch<'_>, key: &[u8]) -> Result<(), StoreError> {
    if let Some(e) = ctx.get_raw_in(batch.space(), key)? {
        ctx.remove(batch, key, &e.value)?;
    }
    Ok(())
}

/// A database number as Redis's `getIntFromObjectOrReply` reads it (an
/// int; `refusal` replaces both of its errors when given), then checked
/// against the 16 databases.
fn database_index(arg: &[u8], refusal: Option<&str>) -> Result<u8, Failure> {
    crate::session::database_number(arg, refusal).map_err(Failure::Reply)
}

/// MOVE key db: the record goes to the other database; a collection's
/// members stay under its object id.
pub(super) fn move_key(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let target = database_index(&args[2], None)?;
    if target == ctx.database() {
        return Err(fail(SAME_OBJECT));
    }
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let to = ctx.db().space(target)?;
    let Some(entry) = ctx.get(key)? else {
        return Ok(int(0));
    };
    if ctx.get_in(to, key)?.is_some() {
        return Ok(int(0));
    }
    let mut batch = ctx.batch();
    batch.remove_record(key, &entry.value)?;
    batch.switch_to(to);
    clear(ctx, &mut batch, key)?;
    batch.put_new(key, &entry)?;
    ctx.commit(batch)?;
    Ok(int(1))
}

/// SWAPDB a b: one write of the database map, every stripe locked.
pub(super) fn swapdb(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let parse = |arg: &[u8], refusal: &str| match database_index(arg, Some(refusal)) {
        Err(Failure::Reply(t)) if t == "ERR DB index is out of range" => Ok(None),
        other => other.map(Some),
    };
    let a = parse(&args[1], "invalid first DB index")?;
    let b = parse(&args[2], "invalid second DB index")?;
    let (Some(a), Some(b)) = (a, b) else {
        return Err(fail("ERR DB index is out of range"));
    };
    if a == b {
        return Ok(ok());
    }
    let _all = ctx.lock_all();
    let logged = ctx.db().swap_databases(a, b)?;
    ctx.note_wrote(logged.position);
    // The run's own database may be one of the two.
    ctx.select(ctx.database())?;
    Ok(ok())
}

fn rename_generic(ctx: &mut Ctx<'_>, args: &Args, nx: bool) -> Outcome {
    let (from, to) = (&args[1][..], &args[2][..]);
    let _locked = ctx.lock(&[from, to]);
    let Some(entry) = ctx.get(from)? else {
        return Err(fail("ERR no such key"));
    };
    if from == to {
        return Ok(if nx { int(0) } else { ok() });
    }
    if nx && ctx.get(to)?.is_some() {
        return Ok(int(0));
    }
    // The record moves; a collection's members stay under its object id.
    let mut batch = ctx.batch();
    clear(ctx, &mut batch, to)?;
    batch.remove_record(from, &entry.value)?;
    batch.put_new(to, &entry)?;
    ctx.commit(batch)?;
    Ok(if nx { int(1) } else { ok() })
}

pub(super) fn rename(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    rename_generic(ctx, args, false)
}

pub(super) fn renamenx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    rename_generic(ctx, args, true)
}

pub(super) fn copy(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut replace = false;
    let mut target = ctx.database();
    let mut j = 3;
    while j < args.len() {
        if args[j].eq_ignore_ascii_case(b"replace") {
            replace = true;
        } else if args[j].eq_ignore_ascii_case(b"db") && j + 1 < args.len() {
            target = database_index(&args[j + 1], None)?;
            j += 1;
        } else {
            return Err(fail(SYNTAX));
        }
        j += 1;
    }
    let (from, to) = (&args[1][..], &args[2][..]);
    if from == to && target == ctx.database() {
        return Err(fail(SAME_OBJECT));
    }
    let _locked = ctx.lock(&[from, to]);
    let to_space = ctx.db().space(target)?;
    let Some(entry) = ctx.get(from)? else {
        return Ok(int(0));
    };
    if ctx.get_in(to_space, to)?.is_some() && !replace {
        return Ok(int(0));
    }
    let mut batch = ctx.batch();
    batch.switch_to(to_space);
    clear(ctx, &mut batch, to)?;
    copy_value(ctx, &mut batch, &entry, to)?;
    ctx.commit(batch)?;
    Ok(int(1))
}

/// One look at the keyspace: the live keys found, and where the next
/// look starts (None: the end).
type KeysPage = (Vec<(Vec<u8>, Entry)>, Option<Vec<u8>>);

/// Live keys from `start` on, in key order, at most `limit` looked at.
fn live_keys(ctx: &Ctx<'_>, start: &[u8], limit: usize) -> Result<KeysPage, StoreError> {
    let mut found = ctx.keys_from(start, limit + 1)?;
    let next = (found.len() > limit).then(|| found.pop().map(|(k, _)| k));
    found.retain(|(_, e)| !e.expired(ctx.now_ms()));
    Ok((found, next.flatten()))
}

pub(super) fn keys(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let pattern = &args[1];
    let mut out = Vec::new();
    let mut start = Vec::new();
    loop {
        let (found, next) = live_keys(ctx, &start, 4096)?;
        out.extend(
            found
                .into_iter()
                .filter(|(k, _)| glob_match(pattern, k))
                .map(|(k, _)| Reply::Bulk(k)),
        );
        match next {
            Some(n) => start = n,
            None => return Ok(Reply::Array(out)),
        }
    }
}

/// SCAN's and HSCAN's options: MATCH, COUNT and (SCAN only) TYPE.
pub(super) struct ScanOptions {
    pub(super) pattern: Option<Vec<u8>>,
    pub(super) count: usize,
    pub(super) type_name: Option<Vec<u8>>,
}

pub(super) fn parse_scan_options(
    args: &Args,
    from: usize,
    allow_type: bool,
) -> Result<ScanOptions, Failure> {
    let mut o = ScanOptions {
        pattern: None,
        count: 10,
        type_name: None,
    };
    let mut i = from;
    while i < args.len() {
        let more = args.len() - i;
        let word = args[i].to_ascii_lowercase();
        if word == b"count" && more >= 2 {
            let count = parse_i64(&args[i + 1])?;
            if count < 1 {
                return Err(fail(SYNTAX));
            }
            o.count = count.min(1 << 20) as usize;
        } else if word == b"match" && more >= 2 {
            o.pattern = Some(args[i + 1].clone());
        } else if word == b"type" && allow_type && more >= 2 {
            o.type_name = Some(args[i + 1].clone());
        } else {
            return Err(fail(SYNTAX));
        }
        i += 2;
    }
    Ok(o)
}

/// Redis's cursor check: an unsigned 64-bit decimal.
pub(super) fn parse_cursor(arg: &[u8]) -> Result<u64, Failure> {
    let valid =
        !arg.is_empty() && arg.iter().all(u8::is_ascii_digit) && (arg == b"0" || arg[0] != b'0');
    valid
        .then(|| std::str::from_utf8(arg).ok()?.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| fail("ERR invalid cursor"))
}

pub(super) fn scan(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let cursor = parse_cursor(&args[1])?;
    let o = parse_scan_options(args, 2, true)?;
    let start = match cursor {
        0 => Vec::new(),
        c => ctx
            .db()
            .cursor(c)
            .ok_or_else(|| fail("ERR invalid cursor"))?,
    };
    let (found, next) = live_keys(ctx, &start, o.count)?;
    let keys = found
        .into_iter()
        .filter(|(k, e)| {
            o.pattern.as_ref().is_none_or(|p| glob_match(p, k))
                && o.type_name
                    .as_ref()
                    .is_none_or(|t| t.eq_ignore_ascii_case(e.value.type_name().as_bytes()))
        })
        .map(|(k, _)| Reply::Bulk(k))
        .collect();
    let next_cursor = next.map_or(0, |n| ctx.db().save_cursor(n));
    Ok(Reply::Array(vec![
        Reply::Bulk(next_cursor.to_string().into_bytes()),
        Reply::Array(keys),
    ]))
}

/// RANDOMKEY looks at this many keys from a random place, and picks one
/// of them.
const RANDOM_WINDOW_KEYS: usize = 64;

pub(super) fn randomkey(ctx: &mut Ctx<'_>, _args: &Args) -> Outcome {
    use rand::Rng;
    let start: [u8; 8] = rand::random();
    // The keys from a random place on, wrapping round to the first: a
    // database of few keys gives each the same chance, whatever the gaps
    // between their names.
    let (mut window, next) = live_keys(ctx, &start, RANDOM_WINDOW_KEYS)?;
    if next.is_none() {
        let (first, _) = live_keys(ctx, &[], RANDOM_WINDOW_KEYS)?;
        for (key, entry) in first {
            if window.len() >= RANDOM_WINDOW_KEYS {
                break;
            }
            if !window.iter().any(|(k, _)| *k == key) {
                window.push((key, entry));
            }
        }
    }
    if !window.is_empty() {
        let at = rand::thread_rng().gen_range(0..window.len());
        return Ok(Reply::Bulk(window.swap_remove(at).0));
    }
    // Past the random start only expired keys, or none: look at all.
    let mut start = Vec::new();
    loop {
        let (found, next) = live_keys(ctx, &start, 4096)?;
        if let Some((k, _)) = found.into_iter().next() {
            return Ok(Reply::Bulk(k));
        }
        match next {
            Some(n) => start = n,
            None => return Ok(Reply::Null),
        }
    }
}

/// EXPIRE's NX/XX/GT/LT.
#[derive(Default)]
struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

fn parse_expire_flags(args: &Args) -> Result<ExpireFlags, Failure> {
    let mut f = ExpireFlags::default();
    for opt in &args[3..] {
        match &opt.to_ascii_lowercase()[..] {
            b"nx" => f.nx = true,
            b"xx" => f.xx = true,
            b"gt" => f.gt = true,
            b"lt" => f.lt = true,
            _ => {
                return Err(Failure::Reply(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(opt)
                )))
            }
        }
    }
    if f.nx && (f.xx || f.gt || f.lt) {
        return Err(fail(
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if f.gt && f.lt {
        return Err(fail(
            "ERR GT and LT options at the same time are not compatible",
        ));
    }
    Ok(f)
}

/// Redis's expireGenericCommand: `base_ms` is now (relative forms) or 0.
fn expire_generic(
    ctx: &mut Ctx<'_>,
    args: &Args,
    base_ms: i64,
    seconds: bool,
    command: &str,
) -> Outcome {
    let flags = parse_expire_flags(args)?;
    let invalid = || Failure::Reply(format!("ERR invalid expire time in '{command}' command"));
    let mut when = parse_i64(&args[2])?;
    if seconds {
        if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
            return Err(invalid());
        }
        when *= 1000;
    }
    if when > i64::MAX - base_ms {
        return Err(invalid());
    }
    when += base_ms;
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, mut batch) = ctx.begin(key)?;
    let Some(entry) = old else {
        ctx.commit(batch)?;
        return Ok(int(0));
    };
    let current = (entry.expire_at_ms != 0).then_some(entry.expire_at_ms as i64);
    let refused = (flags.nx && current.is_some())
        || (flags.xx && current.is_none())
        || (flags.gt && current.is_none_or(|c| when <= c))
        || (flags.lt && current.is_some_and(|c| when >= c));
    if refused {
        ctx.commit(batch)?;
        return Ok(int(0));
    }
    if when <= ctx.now_ms() as i64 {
        ctx.remove(&mut batch, key, &entry.value)?;
    } else {
        batch.put(
            key,
            &Entry {
                expire_at_ms: when as u64,
                ..entry
            },
        )?;
    }
    ctx.commit(batch)?;
    Ok(int(1))
}

pub(super) fn expire(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let now = ctx.now_ms() as i64;
    expire_generic(ctx, args, now, true, "expire")
}

pub(super) fn pexpire(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let now = ctx.now_ms() as i64;
    expire_generic(ctx, args, now, false, "pexpire")
}

pub(super) fn expireat(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    expire_generic(ctx, args, 0, true, "expireat")
}

pub(super) fn pexpireat(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    expire_generic(ctx, args, 0, false, "pexpireat")
}

/// Redis's ttlGenericCommand.
fn ttl_generic(ctx: &mut Ctx<'_>, key: &[u8], millis: bool, absolute: bool) -> Outcome {
    let Some(entry) = ctx.get(key)? else {
        return Ok(int(-2));
    };
    if entry.expire_at_ms == 0 {
        return Ok(int(-1));
    }
    let at = entry.expire_at_ms as i64;
    let ttl = if absolute {
        at
    } else {
        (at - ctx.now_ms() as i64).max(0)
    };
    Ok(int(if millis { ttl } else { (ttl + 500) / 1000 }))
}

pub(super) fn ttl(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    ttl_generic(ctx, &args[1], false, false)
}

pub(super) fn pttl(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    ttl_generic(ctx, &args[1], true, false)
}

pub(super) fn expiretime(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    ttl_generic(ctx, &args[1], false, true)
}

pub(super) fn pexpiretime(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    ttl_generic(ctx, &args[1], true, true)
}

pub(super) fn persist(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, mut batch) = ctx.begin(key)?;
    let changed = match old {
        Some(entry) if entry.expire_at_ms != 0 => {
            batch.put(
                key,
                &Entry {
                    expire_at_ms: 0,
                    ..entry
                },
            )?;
            true
        }
        _ => false,
    };
    ctx.commit(batch)?;
    Ok(int(i64::from(changed)))
}

pub(super) fn dbsize(ctx: &mut Ctx<'_>, _args: &Args) -> Outcome {
    let mut n = 0i64;
    let mut start = Vec::new();
    loop {
        let (found, next) = live_keys(ctx, &start, 4096)?;
        n += found.len() as i64;
        match next {
            Some(k) => start = k,
            None => return Ok(int(n)),
        }
    }
}

pub(super) fn flush(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let valid = match &args[1..] {
        [] => true,
        [mode] => mode.eq_ignore_ascii_case(b"sync") || mode.eq_ignore_ascii_case(b"async"),
        _ => false,
    };
    if !valid {
        return Err(fail(SYNTAX));
    }
    let _all = ctx.lock_all();
    let space = ctx.space();
    let mut everything = args[0].eq_ignore_ascii_case(b"flushall");
    if !everything {
        // Alone in holding records, the database goes as FLUSHALL's do:
        // one range delete per keyspace.
        everything = true;
        for other in ctx.db().spaces().into_iter().filter(|s| *s != space) {
            if !ctx.keys_from_in(other, &[], 1)?.is_empty() {
                everything = false;
                break;
            }
        }
    }
    let mut batch = ctx.batch();
    if everything {
        batch.remove_all_databases()?;
        ctx.commit(batch)?;
        return Ok(ok());
    }
    // The records first, in one batch: the database reads empty at once.
    let ids = ctx.collection_ids(space)?;
    batch.remove_database_records()?;
    ctx.commit(batch)?;
    for chunk in ids.chunks(FLUSHED_COLLECTIONS_PER_BATCH) {
        let mut batch = ctx.batch();
        for &id in chunk {
            batch.remove_members_of(id)?;
        }
        ctx.commit(batch)?;
    }
    Ok(ok())
}

/// How many emptied collections' members one batch of FLUSHDB removes
/// (one range delete each), once their records are gone.
const FLUSHED_COLLECTIONS_PER_BATCH: usize = 1024;

/// Redis's reply to a copy or move onto itself.
const SAME_OBJECT: &str = "ERR source and destination objects are the same";

/// DUMP key: the value in Redis's RDB serialization, with its version and
/// CRC-64 (`sluice_redis::dump`); nil for no key.
pub(super) fn dump(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(match sluice_redis::dump::read(ctx, &args[1])? {
        Some(value) => Reply::Bulk(sluice_redis::dump::dump(&value)),
        None => Reply::Null,
    })
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ n], with
/// Redis's checks in Redis's order. IDLETIME and FREQ are checked and
/// otherwise ignored: Sluice evicts nothing, so keeps no access clock.
pub(super) fn restore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (mut replace, mut absttl) = (false, false);
    let (mut idle, mut freq) = (false, false);
    let mut j = 4;
    while j < args.len() {
        let more = args.len() - j - 1;
        let word = args[j].to_ascii_lowercase();
        if word == b"replace" {
            replace = true;
        } else if word == b"absttl" {
            absttl = true;
        } else if word == b"idletime" && more >= 1 && !freq {
            if parse_i64(&args[j + 1])? < 0 {
                return Err(fail("ERR Invalid IDLETIME value, must be >= 0"));
            }
            idle = true;
            j += 1;
        } else if word == b"freq" && more >= 1 && !idle {
            if !(0..=255).contains(&parse_i64(&args[j + 1])?) {
                return Err(fail("ERR Invalid FREQ value, must be >= 0 and <= 255"));
            }
            freq = true;
            j += 1;
        } else {
            return Err(fail(SYNTAX));
        }
        j += 1;
    }
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, mut batch) = ctx.begin(key)?;
    if !replace && old.is_some() {
        ctx.commit(batch)?;
        return Err(fail("BUSYKEY Target key name already exists."));
    }
    let ttl = parse_i64(&args[2])?;
    if ttl < 0 {
        return Err(fail("ERR Invalid TTL value, must be >= 0"));
    }
    let value =
        sluice_redis::dump::restore(&args[3]).map_err(|e| Failure::Reply(e.reply_text()))?;
    if let Some(old) = &old {
        ctx.remove(&mut batch, key, &old.value)?;
    }
    let expire_at_ms = match ttl {
        0 => 0,
        ttl if absttl => ttl as u64,
        ttl => (ctx.now_ms() as i64).saturating_add(ttl) as u64,
    };
    // Already past: the old value goes and nothing takes its place.
    if expire_at_ms == 0 || expire_at_ms > ctx.now_ms() {
        sluice_redis::dump::write(ctx, &mut batch, key, value, expire_at_ms)?;
    }
    ctx.commit(batch)?;
    Ok(ok())
}
