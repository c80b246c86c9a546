//! String commands, following Redis 7.0's t_string.c check by check.

use super::*;

/// When a write leaves a key's expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// No expiry (SET's default, GETSET).
    Clear,
    /// The key's current expiry (KEEPTTL; INCR, APPEND, SETRANGE).
    Keep,
    /// At this Unix time in ms.
    At(u64),
}

/// How an expiry argument counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Seconds,
    Millis,
}

/// SET's and GETEX's options (Redis's parseExtendedStringArgumentsOrReply).
#[derive(Debug, Default)]
struct Options<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    /// The expiry argument, its unit and whether it is absolute.
    expire: Option<(&'a [u8], Unit, bool)>,
}

fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// Parses SET (`set: true`, options from argument 3) or GETEX options.
fn parse_options(args: &Args, set: bool) -> Result<Options<'_>, Failure> {
    let mut o = Options::default();
    let mut j = if set { 3 } else { 2 };
    while j < args.len() {
        let opt = &args[j][..];
        let next = args.get(j + 1).map(|a| &a[..]);
        let timed = o.expire.is_some();
        if is(opt, "nx") && !o.xx && set {
            o.nx = true;
        } else if is(opt, "xx") && !o.nx && set {
            o.xx = true;
        } else if is(opt, "get") && set {
            o.get = true;
        } else if is(opt, "keepttl") && !o.persist && !timed && set {
            o.keepttl = true;
        } else if is(opt, "persist") && !set && !timed && !o.keepttl {
            o.persist = true;
        } else if let (Some((unit, absolute)), Some(value)) = (expiry_word(opt), next) {
            // The same word again replaces the value; another is an error.
            let same = o.expire.is_none_or(|(_, u, a)| u == unit && a == absolute);
            if o.keepttl || o.persist || !same {
                return Err(fail(SYNTAX));
            }
            o.expire = Some((value, unit, absolute));
            j += 1;
        } else {
            return Err(fail(SYNTAX));
        }
        j += 1;
    }
    Ok(o)
}

fn expiry_word(opt: &[u8]) -> Option<(Unit, bool)> {
    match &opt.to_ascii_lowercase()[..] {
        b"ex" => Some((Unit::Seconds, false)),
        b"px" => Some((Unit::Millis, false)),
        b"exat" => Some((Unit::Seconds, true)),
        b"pxat" => Some((Unit::Millis, true)),
        _ => None,
    }
}

/// Redis's getExpireMillisecondsOrReply: the expiry's Unix time in ms.
fn expire_at(
    value: &[u8],
    unit: Unit,
    absolute: bool,
    now_ms: u64,
    command: &str,
) -> Result<u64, Failure> {
    let invalid = || Failure::Reply(format!("ERR invalid expire time in '{command}' command"));
    let mut ms = parse_i64(value)?;
    if ms <= 0 || (unit == Unit::Seconds && ms > i64::MAX / 1000) {
        return Err(invalid());
    }
    if unit == Unit::Seconds {
        ms *= 1000;
    }
    if !absolute {
        ms = ms.checked_add(now_ms as i64).ok_or_else(invalid)?;
    }
    Ok(ms as u64)
}

/// The expiry of a SET-like write from its options.
fn set_expiry(o: &Options<'_>, now_ms: u64, command: &str) -> Result<Expiry, Failure> {
    Ok(match o.expire {
        Some((value, unit, absolute)) => {
            Expiry::At(expire_at(value, unit, absolute, now_ms, command)?)
        }
        None if o.keepttl => Expiry::Keep,
        None => Expiry::Clear,
    })
}

fn bulk_or_null(value: Option<Vec<u8>>) -> Reply {
    value.map_or(Reply::Null, Reply::Bulk)
}

/// Writes string `value` at `key` (whatever was there goes), with `expiry`
/// and `old` the key's live entry.
pub(super) fn store_string(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    value: Vec<u8>,
    expiry: Expiry,
    old: Option<&Entry>,
    mut batch: DbBatch<'_>,
) -> Result<(), Failure> {
    let expire_at_ms = match expiry {
        Expiry::Clear => 0,
        Expiry::Keep => old.map_or(0, |e| e.expire_at_ms),
        Expiry::At(ms) => ms,
    };
    if let Some(old) = old.filter(|e| e.value.collection().is_some()) {
        ctx.remove(&mut batch, key, &old.value)?;
    }
    batch.put(
        key,
        &Entry {
            value: Value::String(value),
            expire_at_ms,
        },
    )?;
    ctx.commit(batch)?;
    Ok(())
}

/// GET of `key` at the time `now_ms` gives, with the value borrowed where the store holds
/// it: `emit` sees the live value (None: no such key) or the error reply,
/// and writes the reply itself — a server copies the value once, into its
/// output. Outside a transaction only (it reads the newest data).
pub fn get_borrowed<R>(
    db: &Db,
    cache: &mut sluice_store::ReadCache,
    space: sluice_redis::Space,
    key: &[u8],
    now_ms: impl FnOnce() -> u64,
    emit: impl FnOnce(Result<Option<sluice_store::Found<'_>>, Reply>) -> R,
) -> R {
    get_borrowed_or_miss(db, cache, space, key, true, now_ms, emit, || {})
        .unwrap_or_else(|_| unreachable!("a read that may wait never misses"))
}

/// [`get_borrowed`], or with `wait` false, what it would have to read from
/// the device first: then nothing is emitted, and the caller reads it
/// (`sluice_store::FillQueue`) and asks again. `expired` is told when the
/// key's record had expired (the caller removes it: lazy expiry).
#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a record was found; the store calls back once; a failed read emitted nothing"
)]
pub fn get_borrowed_or_miss<R>(
    db: &Db,
    cache: &mut sluice_store::ReadCache,
    space: sluice_redis::Space,
    key: &[u8],
    wait: bool,
    now_ms: impl FnOnce() -> u64,
    emit: impl FnOnce(Result<Option<sluice_store::Found<'_>>, Reply>) -> R,
    expired: impl FnOnce(),
) -> Result<R, sluice_store::CacheMiss> {
    let mut emit = Some(emit);
    let mut expired = Some(expired);
    let read = db.get_raw_latest_or_miss(cache, space, key, wait, |raw| {
        let found = match raw.map(|r| Entry::string_view(r.bytes())).transpose() {
            Ok(None) => Ok(None),
            Ok(Some(None)) => Err(Reply::Error(WRONGTYPE.into())),
            // The clock is read only for a key that can expire.
            Ok(Some(Some((_, expire_at_ms)))) if expire_at_ms != 0 && expire_at_ms <= now_ms() => {
                if let Some(tell) = expired.take() {
                    tell();
                }
                Ok(None)
            }
            // The string is the record's tail.
            Ok(Some(Some((value, _)))) => {
                let record = raw.expect("a record was found");
                Ok(Some(record.skip(record.bytes().len() - value.len())))
            }
            Err(e) => Err(Reply::Error(store_error_text(&e))),
        };
        (emit.take().expect("the store calls back once"))(found)
    });
    match read {
        Ok(answered) => answered,
        // The store failed before it found the record: nothing was emitted.
        Err(e) => Ok((emit.take().expect("a failed read emitted nothing"))(Err(
            Reply::Error(store_error_text(&e)),
        ))),
    }
}

pub(super) fn get(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(bulk_or_null(ctx.get_string_once(&args[1])?.map(|(s, _)| s)))
}

pub(super) fn set(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = parse_options(args, true)?;
    let expiry = set_expiry(&o, ctx.now_ms(), "set")?;
    set_generic(ctx, &args[1], &args[2], &o, expiry, None)
}

/// Redis's setGenericCommand. `answers`: the replies for set / not set
/// (SETNX's 1 and 0); otherwise OK and null.
fn set_generic(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    value: &[u8],
    o: &Options<'_>,
    expiry: Expiry,
    answers: Option<(Reply, Reply)>,
) -> Outcome {
    let _locked = ctx.lock(&[key]);
    let plain = !(o.get || o.nx || o.xx || matches!(expiry, Expiry::Keep));
    if plain && ctx.may_skip_read(key) {
        // Nothing of the old entry is needed: it is no hash (whose fields
        // would go with it), and whatever it was, SET replaces it.
        let batch = ctx.batch();
        store_string(ctx, key, value.to_vec(), expiry, None, batch)?;
        return Ok(answers.map_or_else(ok, |(done, _)| done));
    }
    let (old, batch) = if o.get {
        ctx.begin(key)?
    } else {
        ctx.begin_overwrite(key)?
    };
    let previous = if o.get {
        match &old {
            Some(Entry {
                value: Value::String(s),
                ..
            }) => Reply::Bulk(s.clone()),
            Some(_) => return Err(fail(WRONGTYPE)),
            None => Reply::Null,
        }
    } else {
        Reply::Null
    };
    let (done, skipped) = answers.unwrap_or((ok(), Reply::Null));
    if (o.nx && old.is_some()) || (o.xx && old.is_none()) {
        return Ok(if o.get { previous } else { skipped });
    }
    store_string(ctx, key, value.to_vec(), expiry, old.as_ref(), batch)?;
    Ok(if o.get { previous } else { done })
}

pub(super) fn setnx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = Options {
        nx: true,
        ..Options::default()
    };
    let answers = Some((int(1), int(0)));
    set_generic(ctx, &args[1], &args[2], &o, Expiry::Clear, answers)
}

fn set_with_expiry(ctx: &mut Ctx<'_>, args: &Args, unit: Unit, command: &str) -> Outcome {
    let at = expire_at(&args[2], unit, false, ctx.now_ms(), command)?;
    let o = Options::default();
    set_generic(ctx, &args[1], &args[3], &o, Expiry::At(at), None)
}

pub(super) fn setex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    set_with_expiry(ctx, args, Unit::Seconds, "setex")
}

pub(super) fn psetex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    set_with_expiry(ctx, args, Unit::Millis, "psetex")
}

pub(super) fn getset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = Options {
        get: true,
        ..Options::default()
    };
    set_generic(ctx, &args[1], &args[2], &o, Expiry::Clear, None)
}

pub(super) fn getdel(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, mut batch) = ctx.begin(key)?;
    match old {
        None => {
            ctx.commit(batch)?;
            Ok(Reply::Null)
        }
        Some(Entry {
            value: Value::String(s),
            ..
        }) => {
            ctx.remove(&mut batch, key, &Value::String(Vec::new()))?;
            ctx.commit(batch)?;
            Ok(Reply::Bulk(s))
        }
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

pub(super) fn getex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = parse_options(args, false)?;
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, mut batch) = ctx.begin(key)?;
    // Redis's order: the key and its type before the expiry's value.
    let (value, expire_at_ms) = match old {
        None => {
            ctx.commit(batch)?;
            return Ok(Reply::Null);
        }
        Some(Entry {
            value: Value::String(s),
            expire_at_ms,
        }) => (s, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let expiry = match o.expire {
        Some((v, unit, absolute)) => Some(expire_at(v, unit, absolute, ctx.now_ms(), "getex")?),
        None => None,
    };
    let new_expiry = match (expiry, o.persist) {
        (Some(at), _) => Some(at),
        (None, true) if expire_at_ms != 0 => Some(0),
        _ => None,
    };
    if let Some(at) = new_expiry {
        batch.put(
            key,
            &Entry {
                value: Value::String(value.clone()),
                expire_at_ms: at,
            },
        )?;
    }
    ctx.commit(batch)?;
    Ok(Reply::Bulk(value))
}

pub(super) fn mget(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut out = Vec::with_capacity(args.len() - 1);
    for key in &args[1..] {
        out.push(match ctx.get(key)? {
            Some(Entry {
                value: Value::String(s),
                ..
            }) => Reply::Bulk(s),
            _ => Reply::Null,
        });
    }
    Ok(Reply::Array(out))
}

fn pairs(args: &Args, command: &str) -> Result<Pairs, Failure> {
    if args.len().is_multiple_of(2) {
        return Err(Failure::Reply(format!(
            "ERR wrong number of arguments for '{command}' command"
        )));
    }
    Ok(args[1..]
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect())
}

fn mset_generic(ctx: &mut Ctx<'_>, args: &Args, nx: bool) -> Outcome {
    let pairs = pairs(args, if nx { "msetnx" } else { "mset" })?;
    let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| &k[..]).collect();
    let _locked = ctx.lock(&keys);
    if nx {
        for key in &keys {
            if ctx.get(key)?.is_some() {
                return Ok(int(0));
            }
        }
    }
    let mut batch = ctx.batch();
    for (key, value) in &pairs {
        // As SET: a key that holds no collection is replaced unread.
        if !ctx.may_skip_read(key) {
            if let Some(old) = ctx.get_raw(key)? {
                ctx.remove(&mut batch, key, &old.value)?;
            }
        }
        batch.put(key, &Entry::string(value.clone()))?;
    }
    ctx.commit(batch)?;
    Ok(if nx { int(1) } else { ok() })
}

pub(super) fn mset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    mset_generic(ctx, args, false)
}

pub(super) fn msetnx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    mset_generic(ctx, args, true)
}

/// Redis's checkStringLength.
fn check_length(size: u64, append: u64) -> Result<(), Failure> {
    match size.checked_add(append) {
        Some(total) if total <= STRING_MAX_BYTES => Ok(()),
        _ => Err(fail(
            "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
        )),
    }
}

/// Changes the string at `key` in place (APPEND, SETRANGE, INCR...):
/// `change` gets the current bytes (None: no key) and returns the new
/// bytes and the reply, or no write. The key keeps its expiry.
pub(super) fn update_string(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    change: impl FnOnce(Option<&[u8]>) -> Result<(Option<Vec<u8>>, Reply), Failure>,
) -> Outcome {
    let _locked = ctx.lock(&[key]);
    let (old, batch) = ctx.begin(key)?;
    let current = match &old {
        None => None,
        Some(Entry {
            value: Value::String(s),
            ..
        }) => Some(&s[..]),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let (new, reply) = change(current)?;
    match new {
        Some(bytes) => store_string(ctx, key, bytes, Expiry::Keep, old.as_ref(), batch)?,
        None => ctx.commit(batch)?,
    }
    Ok(reply)
}

pub(super) fn append(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let more = &args[2];
    update_string(ctx, &args[1], |current| {
        let mut bytes = current.unwrap_or_default().to_vec();
        if current.is_some() {
            check_length(bytes.len() as u64, more.len() as u64)?;
        }
        bytes.extend_from_slice(more);
        let len = bytes.len() as i64;
        Ok((Some(bytes), int(len)))
    })
}

pub(super) fn strlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(ctx
        .get_string(&args[1])?
        .map_or(0, |(s, _)| s.len() as i64)))
}

pub(super) fn getrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut start = parse_i64(&args[2])?;
    let mut end = parse_i64(&args[3])?;
    let Some((s, _)) = ctx.get_string(&args[1])? else {
        return Ok(Reply::Bulk(Vec::new()));
    };
    let len = s.len() as i64;
    if start < 0 && end < 0 && start > end {
        return Ok(Reply::Bulk(Vec::new()));
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return Ok(Reply::Bulk(Vec::new()));
    }
    Ok(Reply::Bulk(s[start as usize..=end as usize].to_vec()))
}

pub(super) fn setrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let offset = parse_i64(&args[2])?;
    if offset < 0 {
        return Err(fail("ERR offset is out of range"));
    }
    let offset = offset as u64;
    let value = &args[3];
    update_string(ctx, &args[1], |current| {
        if value.is_empty() {
            let len = current.map_or(0, |c| c.len() as i64);
            return Ok((None, int(len)));
        }
        check_length(offset, value.len() as u64)?;
        let mut bytes = current.unwrap_or_default().to_vec();
        let end = offset as usize + value.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(value);
        let len = bytes.len() as i64;
        Ok((Some(bytes), int(len)))
    })
}

fn incr_by(ctx: &mut Ctx<'_>, key: &[u8], by: i64) -> Outcome {
    update_string(ctx, key, |current| {
        let value = match current {
            None => 0,
            Some(bytes) => parse_i64(bytes)?,
        };
        let new = value.checked_add(by).ok_or_else(|| fail(OVERFLOW))?;
        Ok((Some(new.to_string().into_bytes()), int(new)))
    })
}

/// `times` INCRBYs of `key` by `by` in one change (a group's): each one's
/// reply; one that would overflow fails alone and changes nothing.
pub(super) fn increments(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    by: i64,
    times: usize,
) -> Result<Vec<Reply>, Failure> {
    let mut each = Vec::with_capacity(times);
    update_string(ctx, key, |current| {
        let mut value = match current {
            None => 0,
            Some(bytes) => parse_i64(bytes)?,
        };
        let mut changed = false;
        for _ in 0..times {
            match value.checked_add(by) {
                Some(new) => {
                    value = new;
                    changed = true;
                    each.push(int(new));
                }
                None => each.push(failure_reply(fail(OVERFLOW))),
            }
        }
        Ok((changed.then(|| value.to_string().into_bytes()), Reply::Null))
    })?;
    Ok(each)
}

pub(super) fn incr(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    incr_by(ctx, &args[1], 1)
}

pub(super) fn decr(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    incr_by(ctx, &args[1], -1)
}

pub(super) fn incrby(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let by = parse_i64(&args[2])?;
    incr_by(ctx, &args[1], by)
}

pub(super) fn decrby(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let by = parse_i64(&args[2])?;
    if by == i64::MIN {
        return Err(fail("ERR decrement would overflow"));
    }
    incr_by(ctx, &args[1], -by)
}

pub(super) fn incrbyfloat(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let by = &args[2];
    update_string(ctx, &args[1], |current| {
        let text = float_sum(current.unwrap_or(b"0"), by, NOT_FLOAT)?.into_bytes();
        Ok((Some(text.clone()), Reply::Bulk(text)))
    })
}

/// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]: the longest
/// common subsequence of two strings by Redis 7.0's dynamic programming,
/// with its ranges walked back exactly as Redis walks them.
pub(super) fn lcs(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let as_string = |found: Result<Option<(Vec<u8>, u64)>, Failure>| match found {
        Err(Failure::Reply(t)) if t.starts_with("WRONGTYPE") => {
            Err(fail("ERR The specified keys must contain string values"))
        }
        other => other.map(|s| s.map(|(bytes, _)| bytes).unwrap_or_default()),
    };
    let a = as_string(ctx.get_string(&args[1]))?;
    let b = as_string(ctx.get_string(&args[2]))?;
    let (mut get_len, mut get_idx, mut with_match_len, mut min_match_len) =
        (false, false, false, 0i64);
    let mut j = 3;
    while j < args.len() {
        match args[j].to_ascii_lowercase().as_slice() {
            b"idx" => get_idx = true,
            b"len" => get_len = true,
            b"withmatchlen" => with_match_len = true,
            b"minmatchlen" if j + 1 < args.len() => {
                min_match_len = parse_i64(&args[j + 1])?.max(0);
                j += 1;
            }
            _ => return Err(fail(SYNTAX)),
        }
        j += 1;
    }
    if get_len && get_idx {
        return Err(fail(
            "ERR If you want both the length and indexes, please just use IDX.",
        ));
    }
    let (alen, blen) = (a.len(), b.len());
    let cells = (alen as u64 + 1) * (blen as u64 + 1);
    if cells.saturating_mul(4) > STRING_MAX_BYTES {
        return Err(fail(
            "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
        ));
    }
    let width = blen + 1;
    let mut table = vec![0u32; cells as usize];
    for i in 1..=alen {
        for k in 1..=blen {
            table[k + i * width] = if a[i - 1] == b[k - 1] {
                table[(k - 1) + (i - 1) * width] + 1
            } else {
                table[k + (i - 1) * width].max(table[(k - 1) + i * width])
            };
        }
    }
    let total = table[blen + alen * width];
    if get_len {
        return Ok(int(i64::from(total)));
    }
    let mut result = vec![0u8; total as usize];
    let mut matches = Vec::new();
    let (mut idx, mut i, mut k) = (total as usize, alen, blen);
    // `a_start == alen`: no range open.
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (alen, 0, 0, 0);
    while i > 0 && k > 0 {
        let mut emit = false;
        if a[i - 1] == b[k - 1] {
            result[idx - 1] = a[i - 1];
            if a_start == alen {
                (a_start, a_end, b_start, b_end) = (i - 1, i - 1, k - 1, k - 1);
            } else if a_start == i && b_start == k {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            (idx, i, k) = (idx - 1, i - 1, k - 1);
        } else {
            if table[k + (i - 1) * width] > table[(k - 1) + i * width] {
                i -= 1;
            } else {
                k -= 1;
            }
            emit = a_start != alen;
        }
        let match_len = a_end.wrapping_sub(a_start).wrapping_add(1);
        if emit {
            if min_match_len == 0 || match_len as i64 >= min_match_len {
                let mut range = vec![
                    Reply::Array(vec![int(a_start as i64), int(a_end as i64)]),
                    Reply::Array(vec![int(b_start as i64), int(b_end as i64)]),
                ];
                if with_match_len {
                    range.push(int(match_len as i64));
                }
                matches.push(Reply::Array(range));
            }
            a_start = alen;
        }
    }
    if get_idx {
        return Ok(Reply::Map(vec![
            (Reply::Bulk(b"matches".to_vec()), Reply::Array(matches)),
            (Reply::Bulk(b"len".to_vec()), int(i64::from(total))),
        ]));
    }
    Ok(Reply::Bulk(result))
}
