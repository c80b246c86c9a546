//! What the formats and the predicates share about a JSON value found in
//! a stored document: finding it by a skipping scan, and ordering it
//! against a literal.

use crate::expr::Literal;
use sonic_rs::{JsonNumberTrait, JsonValueTrait, LazyValue, PointerNode};
use std::cmp::Ordering;

/// A stored value that is not of its keyspace's format where a field was
/// looked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed value: {0}")]
pub struct MalformedValue(pub String);

/// The value at `pointer` in `doc`, found by a skipping scan; None when a
/// step is missing or crosses a value that is not an object or array.
pub(crate) fn lookup<'d>(
    doc: &'d [u8],
    pointer: &[PointerNode],
) -> Result<Option<LazyValue<'d>>, MalformedValue> {
    match sonic_rs::get_from_slice(doc, pointer) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() || e.is_unmatched_type() => Ok(None),
        Err(e) => Err(MalformedValue(format!("JSON: {e}"))),
    }
}

/// The order of a JSON value against a literal; None across types.
pub(crate) fn compare(v: &LazyValue<'_>, lit: &Literal) -> Option<Ordering> {
    match lit {
        Literal::Int(n) => {
            let num = v.as_number()?;
            match num.as_i64() {
                Some(i) => Some(i.cmp(n)),
                None => num.as_f64()?.partial_cmp(&(*n as f64)),
            }
        }
        Literal::Float(x) => v.as_number()?.as_f64()?.partial_cmp(x),
        Literal::Str(s) => Some(v.as_str()?.cmp(s.as_str())),
        Literal::Bool(b) => Some(v.as_bool()?.cmp(b)),
        Literal::Null => v.is_null().then_some(Ordering::Equal),
    }
}
