//! PFADD, PFCOUNT, PFMERGE, PFDEBUG and PFSELFTEST, following Redis 7.0's
//! hyperloglog.c: the value is a string in Redis's representation
//! (`sluice_redis::hyperloglog`), read, changed and written back whole
//! under its key's lock.

use super::strings::{store_string, Expiry};
use super::*;
use sluice_redis::hyperloglog::{self as hll, HllError};
use std::sync::atomic::Ordering;

fn hll_failure(e: HllError) -> Failure {
    fail(e.reply_text())
}

/// The HyperLogLog a live entry holds: WRONGTYPE for another type (Redis's
/// usual text) or a string that is no HyperLogLog (its own).
fn hll_of(entry: Option<Entry>) -> Result<Option<Vec<u8>>, Failure> {
    match entry {
        None => Ok(None),
        Some(Entry {
            value: Value::String(s),
            ..
        }) => {
            hll::check(&s).map_err(hll_failure)?;
            Ok(Some(s))
        }
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

fn sparse_max_bytes(ctx: &Ctx<'_>) -> usize {
    let most = ctx
        .db()
        .settings
        .hll_sparse_max_bytes
        .load(Ordering::Relaxed);
    usize::try_from(most).unwrap_or(usize::MAX)
}

pub(super) fn pfadd(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let most = sparse_max_bytes(ctx);
    let _locked = ctx.lock(&[key]);
    let (old, batch) = ctx.begin(key)?;
    let (mut bytes, mut updated) = match hll_of(old.clone())? {
        Some(bytes) => (bytes, false),
        None => (hll::new_sparse(), true),
    };
    for element in &args[2..] {
        updated |= hll::add(&mut bytes, element, most).map_err(hll_failure)?;
    }
    if !updated {
        ctx.commit(batch)?;
        return Ok(int(0));
    }
    hll::invalidate(&mut bytes);
    store_string(ctx, key, bytes, Expiry::Keep, old.as_ref(), batch)?;
    Ok(int(1))
}

pub(super) fn pfcount(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if args.len() > 2 {
        // The union's cardinality; nothing is written.
        let mut max = [0u8; hll::REGISTERS];
        for key in &args[1..] {
            if let Some(bytes) = hll_of(ctx.get(key)?)? {
                hll::merge_into(&mut max, &bytes).map_err(hll_failure)?;
            }
        }
        return Ok(int(hll::count_registers(&max) as i64));
    }
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let (old, batch) = ctx.begin(key)?;
    let Some(mut bytes) = hll_of(old.clone())? else {
        ctx.commit(batch)?;
        return Ok(int(0));
    };
    if let Some(card) = hll::cached(&bytes) {
        ctx.commit(batch)?;
        return Ok(int(card as i64));
    }
    // Counted, and the count kept in the value, as Redis keeps it.
    let card = hll::count(&bytes).map_err(hll_failure)?;
    hll::set_cached(&mut bytes, card);
    store_string(ctx, key, bytes, Expiry::Keep, old.as_ref(), batch)?;
    Ok(int(card as i64))
}

pub(super) fn pfmerge(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    let most = sparse_max_bytes(ctx);
    let _locked = ctx.lock(&keys);
    let mut max = [0u8; hll::REGISTERS];
    let mut any_dense = false;
    for key in &keys {
        if let Some(bytes) = hll_of(ctx.get(key)?)? {
            any_dense |= hll::check(&bytes) == Ok(hll::Encoding::Dense);
            hll::merge_into(&mut max, &bytes).map_err(hll_failure)?;
        }
    }
    let dest = keys[0];
    let (old, batch) = ctx.begin(dest)?;
    let mut bytes = hll_of(old.clone())?.unwrap_or_else(hll::new_sparse);
    // Dense at once when any source is, as Redis makes it.
    if any_dense {
        hll::to_dense(&mut bytes).map_err(hll_failure)?;
    }
    for (index, &value) in max.iter().enumerate() {
        if value > 0 {
            // Redis goes on past a register it could not set.
            let _ = hll::raise(&mut bytes, index, value, most);
        }
    }
    hll::invalidate(&mut bytes);
    store_string(ctx, dest, bytes, Expiry::Keep, old.as_ref(), batch)?;
    Ok(ok())
}

/// PFDEBUG GETREG|DECODE|ENCODING|TODENSE key (Redis 7.0 gives it an
/// arity of 3: a subcommand never sees other counts).
pub(super) fn pfdebug(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let sub = &args[1];
    let key = &args[2][..];
    let _locked = ctx.lock(&[key]);
    let (old, batch) = ctx.begin(key)?;
    let Some(mut bytes) = hll_of(old.clone())? else {
        ctx.commit(batch)?;
        return Err(fail("ERR The specified key does not exist"));
    };
    match &sub.to_ascii_lowercase()[..] {
        b"getreg" => {
            if hll::to_dense(&mut bytes).map_err(hll_failure)? {
                store_string(ctx, key, bytes.clone(), Expiry::Keep, old.as_ref(), batch)?;
            } else {
                ctx.commit(batch)?;
            }
            let registers = hll::registers(&bytes);
            Ok(Reply::Array(
                registers.into_iter().map(|r| int(i64::from(r))).collect(),
            ))
        }
        b"todense" => {
            let converted = hll::to_dense(&mut bytes).map_err(hll_failure)?;
            if converted {
                store_string(ctx, key, bytes, Expiry::Keep, old.as_ref(), batch)?;
            } else {
                ctx.commit(batch)?;
            }
            Ok(int(i64::from(converted)))
        }
        b"decode" => {
            ctx.commit(batch)?;
            let text = hll::decode(&bytes).ok_or_else(|| fail("ERR HLL encoding is not sparse"))?;
            Ok(Reply::Bulk(text.into_bytes()))
        }
        b"encoding" => {
            ctx.commit(batch)?;
            let name = match hll::check(&bytes) {
                Ok(hll::Encoding::Dense) => "dense",
                _ => "sparse",
            };
            Ok(Reply::Simple(name.into()))
        }
        _ => Err(Failure::Reply(format!(
            "ERR Unknown PFDEBUG subcommand '{}'",
            String::from_utf8_lossy(sub)
        ))),
    }
}

pub(super) fn pfselftest(ctx: &mut Ctx<'_>, _args: &Args) -> Outcome {
    let seed: u64 = rand::random();
    match hll::self_test(seed, sparse_max_bytes(ctx)) {
        Ok(()) => Ok(ok()),
        Err(text) => Err(Failure::Reply(text)),
    }
}
