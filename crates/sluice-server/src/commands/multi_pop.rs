//! LMPOP's and ZMPOP's arguments (and their blocking forms'): `numkeys
//! key... SIDE [COUNT n]`, parsed once for both types.

use super::*;

/// The keys in the order given, the side to pop from (LEFT|RIGHT of a
/// list, MIN|MAX of a sorted set), and COUNT (1 when not given).
pub(crate) struct MultiPop<'a, S> {
    /// The keys in the order given.
    pub keys: Vec<&'a [u8]>,
    /// Which end.
    pub side: S,
    /// COUNT (1 when not given).
    pub count: u64,
}

/// Parses `numkeys key... SIDE [COUNT n]` from `args[at..]`, the side by
/// `side_of` (its error for a word it does not take).
pub(crate) fn parse<'a, S>(
    args: &'a Args,
    at: usize,
    side_of: impl Fn(&[u8]) -> Result<S, Failure>,
) -> Result<MultiPop<'a, S>, Failure> {
    // Redis answers a count that is no integer with the range's message.
    let numkeys = match string_to_i64(&args[at]) {
        Some(n) if n >= 1 => n as usize,
        _ => return Err(fail("ERR numkeys should be greater than 0")),
    };
    let side_at = at.saturating_add(numkeys).saturating_add(1);
    if side_at >= args.len() {
        return Err(fail(SYNTAX));
    }
    let side = side_of(&args[side_at])?;
    let mut count = None;
    let mut j = side_at + 1;
    while j < args.len() {
        if count.is_none() && args[j].eq_ignore_ascii_case(b"count") && j + 1 < args.len() {
            count = Some(match string_to_i64(&args[j + 1]) {
                Some(n) if n >= 1 => n as u64,
                _ => return Err(fail("ERR count should be greater than 0")),
            });
            j += 2;
        } else {
            return Err(fail(SYNTAX));
        }
    }
    Ok(MultiPop {
        keys: args[at + 1..side_at].iter().map(|k| &k[..]).collect(),
        side,
        count: count.unwrap_or(1),
    })
}
