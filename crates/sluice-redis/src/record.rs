//! A key's record in `redis.keys`: its type, expiry and, for a
//! collection, its object id, size and type-specific fields
//! (docs/FORMAT.md, "Serving keyspace", "Records").

use sluice_store::StoreError;

/// Bytes of every record's fixed start: type and expiry.
pub(crate) const HEADER_BYTES: usize = 9;
/// Bytes of a collection record's fixed part: header, object id, size.
const COLLECTION_BYTES: usize = HEADER_BYTES + 16;

const STRING: u8 = 0;
const HASH: u8 = 1;
const LIST: u8 = 2;
const SET: u8 = 3;
const ZSET: u8 = 4;
const STREAM: u8 = 5;

/// A stream entry's id: Unix ms and a sequence within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct StreamId {
    /// Milliseconds.
    pub ms: u64,
    /// Sequence within the millisecond.
    pub seq: u64,
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A stream's record fields beyond id and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamMeta {
    /// The greatest id ever given (new ids are above it).
    pub last: StreamId,
    /// The first entry's id (0-0 when empty).
    pub first: StreamId,
    /// The greatest id ever deleted.
    pub max_deleted: StreamId,
    /// Entries ever added.
    pub added: u64,
}

/// A collection's object id (its members' key prefix) and member count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collection {
    /// Object id: the members' keys start with it (big-endian).
    pub id: u64,
    /// Members (fields, items), at least 1 while stored.
    pub len: u64,
}

/// Bytes a hash's field order may take in its record: the record is read
/// by every command on the key, so a longer order is dropped.
pub const MAX_ORDER_BYTES: usize = 8192;

/// A small hash's fields in the order they were first set, as its record
/// lists them: `[field length u16 LE][field]` per field (docs/FORMAT.md).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldOrder {
    bytes: Vec<u8>,
    len: u64,
}

impl FieldOrder {
    /// The fields, first set first.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.bytes[..];
        std::iter::from_fn(move || {
            let (n, tail) = rest.split_first_chunk::<2>()?;
            let (field, tail) = tail.split_at(usize::from(u16::from_le_bytes(*n)));
            rest = tail;
            Some(field)
        })
    }

    /// How many fields it lists.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it lists none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `field`; false (and nothing appended) if the order would
    /// pass [`MAX_ORDER_BYTES`]: the caller drops it.
    pub fn push(&mut self, field: &[u8]) -> bool {
        let Ok(n) = u16::try_from(field.len()) else {
            return false;
        };
        if self.bytes.len() + 2 + field.len() > MAX_ORDER_BYTES {
            return false;
        }
        self.bytes.extend_from_slice(&n.to_le_bytes());
        self.bytes.extend_from_slice(field);
        self.len += 1;
        true
    }

    /// Removes `field`; whether it was listed.
    pub fn remove(&mut self, field: &[u8]) -> bool {
        let mut at = 0;
        let mut found = None;
        for listed in self.iter() {
            if listed == field {
                found = Some(at);
                break;
            }
            at += 2 + listed.len();
        }
        let Some(at) = found else {
            return false;
        };
        self.bytes.drain(at..at + 2 + field.len());
        self.len -= 1;
        true
    }

    /// Reads an order as a record holds it; None if malformed.
    fn decode(bytes: &[u8]) -> Option<FieldOrder> {
        if bytes.len() > MAX_ORDER_BYTES {
            return None;
        }
        let mut len = 0u64;
        let mut rest = bytes;
        while !rest.is_empty() {
            let (n, tail) = rest.split_first_chunk::<2>()?;
            rest = tail.get(usize::from(u16::from_le_bytes(*n))..)?;
            len += 1;
        }
        Some(FieldOrder {
            bytes: bytes.to_vec(),
            len,
        })
    }
}

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string.
    String(Vec<u8>),
    /// A hash; its fields are members `[id][field]`.
    Hash {
        /// Id and field count.
        c: Collection,
        /// A small hash's fields in the order first set (None: byte order).
        order: Option<FieldOrder>,
    },
    /// A list; its items are members `[id][index u64 BE]`, at indexes
    /// `head .. head + len`.
    List {
        /// Id and length.
        c: Collection,
        /// Index of the first item.
        head: u64,
    },
    /// A set; its members are `[id][member]`.
    Set(Collection),
    /// A sorted set; each member has two entries (by member, by score).
    ZSet(Collection),
    /// A stream; its entries are members `[0x00][ms BE][seq BE]`. Unlike
    /// other collections it may be empty.
    Stream {
        /// Id and entry count.
        c: Collection,
        /// Ids.
        meta: StreamMeta,
    },
}

impl Value {
    /// The type name TYPE prints.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Hash { .. } => "hash",
            Value::List { .. } => "list",
            Value::Set(_) => "set",
            Value::ZSet(_) => "zset",
            Value::Stream { .. } => "stream",
        }
    }

    /// The collection's id and size; None for a string.
    pub fn collection(&self) -> Option<Collection> {
        match self {
            Value::String(_) => None,
            Value::Set(c) | Value::ZSet(c) => Some(*c),
            Value::Hash { c, .. } | Value::List { c, .. } | Value::Stream { c, .. } => Some(*c),
        }
    }

    /// How many member entries the collection has in `redis.members`
    /// (a sorted set: two per member).
    pub fn member_entries(&self) -> u64 {
        match self {
            Value::String(_) => 0,
            Value::ZSet(c) => c.len.saturating_mul(2),
            other => other.collection().map_or(0, |c| c.len),
        }
    }

    fn type_byte(&self) -> u8 {
        match self {
            Value::String(_) => STRING,
            Value::Hash { .. } => HASH,
            Value::List { .. } => LIST,
            Value::Set(_) => SET,
            Value::ZSet(_) => ZSET,
            Value::Stream { .. } => STREAM,
        }
    }
}

/// A key's value and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Unix time in ms at which it expires; 0: never.
    pub expire_at_ms: u64,
}

/// How much of an entry a read decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// All of it.
    Whole,
    /// Its type, expiry and a collection's fields; a string comes back
    /// empty (no copy of a value the caller is about to overwrite).
    Shape,
}

fn malformed() -> StoreError {
    StoreError::BadInput("a serving key's record is malformed".into())
}

impl Entry {
    /// A string that never expires.
    pub fn string(bytes: Vec<u8>) -> Entry {
        Entry {
            value: Value::String(bytes),
            expire_at_ms: 0,
        }
    }

    /// A collection `value` that never expires.
    pub fn new(value: Value) -> Entry {
        Entry {
            value,
            expire_at_ms: 0,
        }
    }

    /// Hands `f` the record as pieces laid one after the other (its header,
    /// then the payload), so that a batch copies it once.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: not a string"
    )]
    pub(crate) fn with_pieces<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let mut header = [0u8; HEADER_BYTES];
        header[0] = self.value.type_byte();
        header[1..].copy_from_slice(&self.expire_at_ms.to_le_bytes());
        if let Value::String(s) = &self.value {
            return f(&[&header, s]);
        }
        let c = self.value.collection().expect("not a string");
        let mut fixed = [0u8; 24];
        fixed[..8].copy_from_slice(&c.id.to_le_bytes());
        fixed[8..16].copy_from_slice(&c.len.to_le_bytes());
        match &self.value {
            Value::List { head, .. } => {
                fixed[16..].copy_from_slice(&head.to_le_bytes());
                f(&[&header, &fixed])
            }
            Value::Stream { meta, .. } => {
                let mut ids = [0u8; 56];
                let words = [
                    meta.last.ms,
                    meta.last.seq,
                    meta.first.ms,
                    meta.first.seq,
                    meta.max_deleted.ms,
                    meta.max_deleted.seq,
                    meta.added,
                ];
                for (i, w) in words.iter().enumerate() {
                    ids[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
                }
                f(&[&header, &fixed[..16], &ids])
            }
            Value::Hash {
                order: Some(order), ..
            } => f(&[&header, &fixed[..16], &order.bytes]),
            _ => f(&[&header, &fixed[..16]]),
        }
    }

    /// [`Entry::with_pieces`] of a string `value` with no expiry.
    pub(crate) fn with_string_pieces<R>(value: &[u8], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        f(&[&[0u8; HEADER_BYTES], value])
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.with_pieces(|pieces| pieces.concat())
    }

    /// Decodes a whole record.
    pub fn decode(bytes: &[u8]) -> Result<Entry, StoreError> {
        Entry::decode_as(bytes, Read::Whole)
    }

    /// Decodes a record as far as `read` says.
    pub fn decode_as(bytes: &[u8], read: Read) -> Result<Entry, StoreError> {
        if let Some((s, expire_at_ms)) = Entry::string_view(bytes)? {
            let s = match read {
                Read::Whole => s.to_vec(),
                Read::Shape => Vec::new(),
            };
            return Ok(Entry {
                value: Value::String(s),
                expire_at_ms,
            });
        }
        let expire_at_ms = sluice_io::codec::u64_at(bytes, 1).ok_or_else(malformed)?;
        let id = sluice_io::codec::u64_at(bytes, HEADER_BYTES).ok_or_else(malformed)?;
        let len = sluice_io::codec::u64_at(bytes, HEADER_BYTES + 8).ok_or_else(malformed)?;
        if id == 0 || (len == 0 && bytes[0] != STREAM) {
            return Err(malformed());
        }
        let c = Collection { id, len };
        let exact = |n: usize, v: Value| {
            if bytes.len() == COLLECTION_BYTES + n {
                Ok(v)
            } else {
                Err(malformed())
            }
        };
        let value = match bytes[0] {
            HASH if bytes.len() == COLLECTION_BYTES => Value::Hash { c, order: None },
            HASH => {
                let order = FieldOrder::decode(&bytes[COLLECTION_BYTES..]).ok_or_else(malformed)?;
                if order.len != c.len {
                    return Err(malformed());
                }
                Value::Hash {
                    c,
                    order: Some(order),
                }
            }
            SET => exact(0, Value::Set(c))?,
            ZSET => exact(0, Value::ZSet(c))?,
            LIST => {
                let head =
                    sluice_io::codec::u64_at(bytes, COLLECTION_BYTES).ok_or_else(malformed)?;
                exact(8, Value::List { c, head })?
            }
            STREAM => {
                let w = |i: usize| sluice_io::codec::u64_at(bytes, COLLECTION_BYTES + i * 8);
                let words: Option<Vec<u64>> = (0..7).map(w).collect();
                let w = words.ok_or_else(malformed)?;
                let meta = StreamMeta {
                    last: StreamId {
                        ms: w[0],
                        seq: w[1],
                    },
                    first: StreamId {
                        ms: w[2],
                        seq: w[3],
                    },
                    max_deleted: StreamId {
                        ms: w[4],
                        seq: w[5],
                    },
                    added: w[6],
                };
                exact(56, Value::Stream { c, meta })?
            }
            _ => return Err(malformed()),
        };
        Ok(Entry {
            value,
            expire_at_ms,
        })
    }

    /// A record's string value and expiry, borrowed from `bytes`; None if
    /// it holds another type.
    pub fn string_view(bytes: &[u8]) -> Result<Option<(&[u8], u64)>, StoreError> {
        let expire_at_ms = sluice_io::codec::u64_at(bytes, 1).ok_or_else(malformed)?;
        match bytes[0] {
            STRING => Ok(Some((&bytes[HEADER_BYTES..], expire_at_ms))),
            HASH | LIST | SET | ZSET | STREAM => Ok(None),
            _ => Err(malformed()),
        }
    }

    /// Whether a record is a hash in the layout before object ids (type
    /// 1, an 8-byte field count), which the upgrade at open rewrites.
    pub(crate) fn is_legacy_hash(bytes: &[u8]) -> bool {
        bytes.len() == HEADER_BYTES + 8 && bytes[0] == HASH
    }

    /// The same entry with a collection's object id replaced by `id` (a
    /// copy's record).
    pub fn with_id(&self, id: u64) -> Entry {
        let mut e = self.clone();
        match &mut e.value {
            Value::String(_) => {}
            Value::Set(c) | Value::ZSet(c) => c.id = id,
            Value::Hash { c, .. } | Value::List { c, .. } | Value::Stream { c, .. } => c.id = id,
        }
        e
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expire_at_ms != 0 && self.expire_at_ms <= now_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_decodes_to_what_was_encoded() {
        let c = Collection { id: 7, len: 3 };
        for value in [
            Value::String(b"".to_vec()),
            Value::String(vec![9u8; 300]),
            Value::Hash { c, order: None },
            Value::Hash {
                c,
                order: Some(ordered(&[b"b", b"", b"a"])),
            },
            Value::Set(c),
            Value::ZSet(c),
            Value::List { c, head: 1 << 63 },
            Value::Stream {
                c: Collection { id: 9, len: 0 },
                meta: StreamMeta {
                    last: StreamId { ms: 5, seq: 6 },
                    first: StreamId { ms: 1, seq: 2 },
                    max_deleted: StreamId { ms: 3, seq: 4 },
                    added: 7,
                },
            },
        ] {
            let entry = Entry {
                value,
                expire_at_ms: 1234,
            };
            assert_eq!(Entry::decode(&entry.encode()).unwrap(), entry);
        }
    }

    #[test]
    fn a_grouped_sets_record_is_the_record_of_its_entry() {
        for value in [&b""[..], b"v", &[7u8; 300]] {
            let entry = Entry::string(value.to_vec());
            let grouped = Entry::with_string_pieces(value, |pieces| pieces.concat());
            assert_eq!(grouped, entry.encode());
            assert_eq!(Entry::decode(&grouped).unwrap(), entry);
        }
    }

    fn ordered(fields: &[&[u8]]) -> FieldOrder {
        let mut order = FieldOrder::default();
        for f in fields {
            assert!(order.push(f));
        }
        order
    }

    #[test]
    fn a_field_order_keeps_first_set_first_and_stays_within_its_bound() {
        let mut order = ordered(&[b"zeta", b"", b"alpha", b"mid"]);
        assert!(order.remove(b""));
        assert!(!order.remove(b"absent"));
        let listed: Vec<&[u8]> = order.iter().collect();
        assert_eq!(listed, [&b"zeta"[..], b"alpha", b"mid"]);
        assert_eq!(order.len(), 3);
        let long = vec![b'x'; MAX_ORDER_BYTES];
        assert!(!order.push(&long), "past the bound");
        assert_eq!(order.len(), 3, "a refused field leaves the order as it was");
        let mut full = FieldOrder::default();
        while full.push(b"0123456789") {}
        assert!(full.bytes.len() <= MAX_ORDER_BYTES);
        assert_eq!(full.len(), (MAX_ORDER_BYTES / 12) as u64);
    }

    #[test]
    fn malformed_records_are_refused() {
        let c = Collection { id: 1, len: 2 };
        let one_field = Entry::new(Value::Hash {
            c,
            order: Some(ordered(&[b"f"])),
        })
        .encode();
        let good = Entry::new(Value::Hash {
            c,
            order: Some(ordered(&[b"f", b"g"])),
        })
        .encode();
        assert!(Entry::decode(&good).is_ok());
        assert!(
            Entry::decode(&one_field).is_err(),
            "order lists fewer than size"
        );
        assert!(
            Entry::decode(&good[..good.len() - 1]).is_err(),
            "a field cut short"
        );
        let list = Entry::new(Value::List {
            c: Collection { id: 1, len: 1 },
            head: 5,
        })
        .encode();
        let set = Entry::new(Value::Set(Collection { id: 1, len: 1 })).encode();
        let mut zero_id = set.clone();
        zero_id[HEADER_BYTES..HEADER_BYTES + 8].fill(0);
        let mut unknown = set.clone();
        unknown[0] = 9;
        for bad in [
            &b""[..],
            &[0u8; 5],
            &list[..list.len() - 1],
            &set[..set.len() - 1],
            &zero_id,
            &unknown,
        ] {
            assert!(Entry::decode(bad).is_err(), "{bad:?}");
        }
        let mut legacy = vec![HASH];
        legacy.extend_from_slice(&[0u8; 16]);
        assert!(Entry::is_legacy_hash(&legacy));
        assert!(Entry::decode(&legacy).is_err());
    }
}
