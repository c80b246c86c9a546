//! SORT and SORT_RO over lists, sets and sorted sets, as Redis 7.0 answers
//! them: numeric or ALPHA order, BY and GET patterns (`*` substituted,
//! `->field` of a hash, `#` the element), LIMIT, DESC, STORE into a list.
//!
//! The elements are read whole into memory and sorted there, as Redis
//! does; keys BY and GET name are read as the sort reaches them.

use super::*;
use sluice_redis::{hash, list, set, zset};
use std::cmp::Ordering;

/// SORT's options.
#[derive(Debug, Default)]
struct Options {
    desc: bool,
    alpha: bool,
    limit: Option<(i64, i64)>,
    store: Option<Vec<u8>>,
    by: Option<Vec<u8>>,
    /// BY a pattern without `*`: keep the stored order.
    dont_sort: bool,
    gets: Vec<Vec<u8>>,
}

fn parse(args: &Args, read_only: bool) -> Result<Options, Failure> {
    let mut o = Options::default();
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - j - 1;
        match args[j].to_ascii_lowercase().as_slice() {
            b"asc" => o.desc = false,
            b"desc" => o.desc = true,
            b"alpha" => o.alpha = true,
            b"limit" if more >= 2 => {
                o.limit = Some((parse_i64(&args[j + 1])?, parse_i64(&args[j + 2])?));
                j += 2;
            }
            b"store" if !read_only && more >= 1 => {
                o.store = Some(args[j + 1].to_vec());
                j += 1;
            }
            b"by" if more >= 1 => {
                o.dont_sort = !args[j + 1].contains(&b'*');
                o.by = Some(args[j + 1].to_vec());
                j += 1;
            }
            b"get" if more >= 1 => {
                o.gets.push(args[j + 1].to_vec());
                j += 1;
            }
            _ => return Err(fail(SYNTAX)),
        }
        j += 1;
    }
    Ok(o)
}

/// The first of a SORT's options that names keys by the data: `BY` with a
/// `*` pattern or `GET`; None for other commands or none.
pub fn pattern_option(args: &Args) -> Option<&'static str> {
    let name = args.first()?.to_ascii_lowercase();
    if name != b"sort" && name != b"sort_ro" {
        return None;
    }
    let mut j = 2;
    while j < args.len() {
        let has_next = j + 1 < args.len();
        match args[j].to_ascii_lowercase().as_slice() {
            b"by" if has_next && args[j + 1].contains(&b'*') => return Some("BY"),
            b"get" if has_next => return Some("GET"),
            b"limit" => j += 2,
            b"by" | b"store" => j += 1,
            _ => {}
        }
        j += 1;
    }
    None
}

/// The value `pattern` names for `element` (Redis's lookupKeyByPattern):
/// `#` is the element; the first `*` is replaced by it; `key->field`
/// reads a hash's field. None for a pattern without `*`, a missing key,
/// or a key of the wrong type.
fn by_pattern(ctx: &Ctx<'_>, pattern: &[u8], element: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
    if pattern == b"#" {
        return Ok(Some(element.to_vec()));
    }
    let Some(star) = pattern.iter().position(|&b| b == b'*') else {
        return Ok(None);
    };
    let rest = &pattern[star + 1..];
    let arrow = rest.windows(2).position(|w| w == b"->");
    let (suffix, field) = match arrow {
        Some(a) if a + 2 < rest.len() => (&rest[..a], Some(&rest[a + 2..])),
        _ => (rest, None),
    };
    let mut key = pattern[..star].to_vec();
    key.extend_from_slice(element);
    key.extend_from_slice(suffix);
    Ok(match (ctx.get(&key)?, field) {
        (
            Some(Entry {
                value: Value::String(s),
                ..
            }),
            None,
        ) => Some(s),
        (
            Some(Entry {
                value: Value::Hash { .. },
                ..
            }),
            Some(field),
        ) => hash::field(ctx, &key, field)?,
        _ => None,
    })
}

/// The elements of the key to sort, and whether it is a set (whose
/// stored order is no order). A missing key is an empty list.
fn elements(ctx: &Ctx<'_>, key: &[u8]) -> Result<(Vec<Vec<u8>>, bool), Failure> {
    let Some(entry) = ctx.get(key)? else {
        return Ok((Vec::new(), false));
    };
    Ok(match entry.value {
        Value::List { .. } => (list::range(ctx, key, 0, -1)?, false),
        Value::Set(_) => (set::members(ctx, key)?, true),
        Value::ZSet(c) => {
            let by_score = zset::ordered(ctx, c, false).map(|item| item.map(|(member, _)| member));
            (by_score.collect::<Result<_, _>>()?, false)
        }
        _ => return Err(fail(WRONGTYPE)),
    })
}

/// A number to sort by, as Redis's strtod takes it: leading spaces, the
/// whole rest a double (the empty string is 0); None if not.
fn sort_score(value: &[u8]) -> Option<f64> {
    let text = value.trim_ascii_start();
    if value.is_empty() {
        return Some(0.0);
    }
    sluice_redis::number::parse_double(text).filter(|v| !v.is_nan())
}

/// What an element sorts by.
enum Weight {
    Score(f64),
    /// ALPHA BY a pattern (None: the key is missing; it sorts first).
    Text(Option<Vec<u8>>),
    /// ALPHA without BY: the element itself.
    Itself,
}

fn compare(a: &(Vec<u8>, Weight), b: &(Vec<u8>, Weight)) -> Ordering {
    match (&a.1, &b.1) {
        (Weight::Score(x), Weight::Score(y)) => x
            .partial_cmp(y)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0)),
        (Weight::Text(x), Weight::Text(y)) => x.cmp(y),
        _ => a.0.cmp(&b.0),
    }
}

/// Redis's LIMIT clamping: the first and last index of the output
/// (`last < first`: none).
fn window(limit: Option<(i64, i64)>, len: i64) -> (i64, i64) {
    let (offset, count) = limit.unwrap_or((0, -1));
    let mut start = offset.clamp(0, len);
    let count = count.clamp(-1, len);
    let mut end = if count < 0 {
        len - 1
    } else {
        start + count - 1
    };
    if start >= len {
        start = len - 1;
        end = len - 2;
    }
    (start, end.min(len - 1))
}

fn sort_generic(ctx: &mut Ctx<'_>, args: &Args, read_only: bool) -> Outcome {
    let mut o = parse(args, read_only)?;
    let key = &args[1];
    let mut locked_keys: Vec<&[u8]> = vec![key];
    if let Some(store) = &o.store {
        locked_keys.push(store);
    }
    let _locked = ctx.lock(&locked_keys);
    let (items, is_set) = elements(ctx, key)?;
    if o.dont_sort && is_set && o.store.is_some() {
        // A set has no order of its own: a stored result is sorted.
        (o.dont_sort, o.alpha, o.by) = (false, true, None);
    }
    let mut sorted: Vec<(Vec<u8>, Weight)> = Vec::with_capacity(items.len());
    let mut not_a_number = false;
    for item in items {
        let weight = if o.dont_sort {
            Weight::Itself
        } else {
            let by = match &o.by {
                Some(p) => by_pattern(ctx, p, &item)?,
                None => None,
            };
            match (o.alpha, &o.by) {
                (true, Some(_)) => Weight::Text(by),
                (true, None) => Weight::Itself,
                (false, Some(_)) => match by {
                    None => Weight::Score(0.0),
                    Some(v) => Weight::Score(sort_score(&v).unwrap_or_else(|| {
                        not_a_number = true;
                        0.0
                    })),
                },
                (false, None) => Weight::Score(sort_score(&item).unwrap_or_else(|| {
                    not_a_number = true;
                    0.0
                })),
            }
        };
        sorted.push((item, weight));
    }
    if !o.dont_sort {
        sorted.sort_by(|a, b| {
            let c = compare(a, b);
            if o.desc {
                c.reverse()
            } else {
                c
            }
        });
    } else if o.desc && !is_set {
        sorted.reverse();
    }
    if not_a_number {
        return Err(fail(
            "ERR One or more scores can't be converted into double",
        ));
    }
    let (start, end) = window(o.limit, sorted.len() as i64);
    let chosen = if end >= start {
        &sorted[start as usize..=end as usize]
    } else {
        &sorted[..0]
    };
    let mut out: Vec<Option<Vec<u8>>> = Vec::new();
    for (item, _) in chosen {
        if o.gets.is_empty() {
            out.push(Some(item.clone()));
        }
        for pattern in &o.gets {
            out.push(by_pattern(ctx, pattern, item)?);
        }
    }
    match &o.store {
        None => Ok(Reply::Array(
            out.into_iter()
                .map(|v| v.map_or(Reply::Null, Reply::Bulk))
                .collect(),
        )),
        Some(store) => {
            let items: Vec<Vec<u8>> = out.into_iter().map(Option::unwrap_or_default).collect();
            Ok(int(list::store(ctx, store, &items)?))
        }
    }
}

pub(super) fn sort(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    sort_generic(ctx, args, false)
}

pub(super) fn sort_ro(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    sort_generic(ctx, args, true)
}
