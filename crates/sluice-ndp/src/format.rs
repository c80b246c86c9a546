//! Declared value formats: how the operators read fields out of a
//! keyspace's values, and the checks a query passes before any work starts.
//!
//! A keyspace declares its values' format when it is created
//! (`sluice_store::ValueFormat`) together with a schema text:
//!
//! - `json` with an empty schema: any field may be asked for; a missing one
//!   makes comparisons false (see [`crate::predicate`]).
//! - `json` with a schema, e.g. `id:u64,title:str,year:u32,authors:u64[]`:
//!   the same documents, but a query naming a field the schema lacks, or
//!   comparing a field with a literal of the wrong type, is refused before
//!   the scan starts.
//! - `record` with a schema (required): typed records, read field by field
//!   without decoding the rest, encoded as below.
//!
//! Schema text: `name:type` pairs separated by commas; names are
//! `[A-Za-z_][A-Za-z0-9_]*`; types `bool`, `u32`, `u64`, `i64`, `f64`, `str`,
//! and (JSON only) a list of one of them, `u64[]`.
//!
//! ## Record encoding
//!
//! The fields in schema order, nothing between them, little-endian:
//!
//! | type | bytes |
//! |---|---|
//! | `bool` | 1: 0 or 1 |
//! | `u32` | 4 |
//! | `u64`, `i64` | 8 (two's complement for `i64`) |
//! | `f64` | 8, IEEE 754 binary64 |
//! | `str` | `u32` length, then that many bytes of UTF-8 |
//!
//! A field after only fixed-width fields sits at a fixed offset and is read
//! directly; a field after a string is found by skipping the fields before
//! it, reading only their lengths.

use crate::expr::{Literal, Path, Predicate, Step};
use crate::json_value::MalformedValue;
use sluice_io::codec;
use sluice_json::skim;
use sluice_store::{KeyspaceDef, ValueFormat};
use sonic_rs::{JsonNumberTrait, JsonValueTrait, LazyValue};
use std::cmp::Ordering;
use std::fmt;

/// Most fields a schema may declare.
pub const MAX_FIELDS: usize = 256;

/// The type of a declared field (or of a list's elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// `bool`: one byte, 0 or 1.
    Bool,
    /// `u32`: four bytes, little-endian.
    U32,
    /// `u64`: eight bytes, little-endian.
    U64,
    /// `i64`: eight bytes, little-endian, two's complement.
    I64,
    /// `f64`: eight bytes, IEEE 754, little-endian.
    F64,
    /// `str`: a u32 length, then UTF-8.
    Str,
}

impl Scalar {
    fn parse(text: &str) -> Option<Scalar> {
        Some(match text {
            "bool" => Scalar::Bool,
            "u32" => Scalar::U32,
            "u64" => Scalar::U64,
            "i64" => Scalar::I64,
            "f64" => Scalar::F64,
            "str" => Scalar::Str,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::U32 => "u32",
            Scalar::U64 => "u64",
            Scalar::I64 => "i64",
            Scalar::F64 => "f64",
            Scalar::Str => "str",
        }
    }

    /// Whether sums and averages apply.
    pub fn is_numeric(self) -> bool {
        matches!(self, Scalar::U32 | Scalar::U64 | Scalar::I64 | Scalar::F64)
    }

    /// Bytes in a record; None for strings.
    fn width_bytes(self) -> Option<usize> {
        match self {
            Scalar::Bool => Some(1),
            Scalar::U32 => Some(4),
            Scalar::U64 | Scalar::I64 | Scalar::F64 => Some(8),
            Scalar::Str => None,
        }
    }

    /// Whether a literal can be compared with a value of this type.
    fn accepts(self, lit: &Literal) -> bool {
        match lit {
            Literal::Int(_) | Literal::Float(_) => self.is_numeric(),
            Literal::Str(_) => self == Scalar::Str,
            Literal::Bool(_) => self == Scalar::Bool,
            Literal::Null => false,
        }
    }
}

/// A declared field's type: one value, or a list (`u64[]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// One value.
    Scalar(Scalar),
    /// A list of values of one type.
    List(Scalar),
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldType::Scalar(s) => f.write_str(s.name()),
            FieldType::List(s) => write!(f, "{}[]", s.name()),
        }
    }
}

/// A query that does not fit the keyspace's declared format, found before
/// any work starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A schema that does not parse, or a definition it does not fit.
    #[error("schema {schema:?}: {message}")]
    BadSchema {
        /// The schema text.
        schema: String,
        /// What is wrong.
        message: String,
    },
    /// Fields asked of a keyspace of raw values.
    #[error("keyspace {keyspace} holds raw values: fields can be read from json and record keyspaces only")]
    RawValues {
        /// The keyspace.
        keyspace: String,
    },
    /// A field the keyspace does not declare.
    #[error("keyspace {keyspace} has no field {field:?}; its fields are {known}")]
    UnknownField {
        /// The keyspace.
        keyspace: String,
        /// The field asked for.
        field: String,
        /// The fields it declares, with their types.
        known: String,
    },
    /// A path the declared fields cannot have (a member of a string, say).
    #[error("{path}: {message}")]
    BadPath {
        /// The path.
        path: String,
        /// Why not.
        message: String,
    },
    /// A field compared with or used as something of another type.
    #[error("{path} is {field_type}: {message}")]
    TypeMismatch {
        /// The path.
        path: String,
        /// The field's declared type.
        field_type: String,
        /// What cannot be done with it.
        message: String,
    },
    /// A value that is not a record of the keyspace's schema.
    #[error("record for keyspace {keyspace}: {message}")]
    BadRecord {
        /// The keyspace.
        keyspace: String,
        /// What is wrong.
        message: String,
    },
    /// A value for a JSON keyspace that is not JSON.
    #[error("keyspace {keyspace} holds JSON: the value is not JSON ({message})")]
    NotJson {
        /// The keyspace.
        keyspace: String,
        /// The parser's message.
        message: String,
    },
}

/// Checks a keyspace definition before the keyspace is created: a keyspace
/// is never created with a schema its queries could not read.
pub fn check_definition(format: ValueFormat, schema: &str) -> Result<(), FormatError> {
    let bad = |message: &str| {
        Err(FormatError::BadSchema {
            schema: schema.to_string(),
            message: message.to_string(),
        })
    };
    match (format, schema.trim().is_empty()) {
        (ValueFormat::Raw, false) => bad("raw keyspaces take no schema"),
        (ValueFormat::Record, true) => {
            bad("record keyspaces need a schema, e.g. \"name:str,year:u32\"")
        }
        (ValueFormat::Raw | ValueFormat::Json, true) => Ok(()),
        (_, false) => Schema::parse(schema).map(|_| ()),
    }
}

/// The bytes to store for a value given as text: a record encoded from
/// its JSON, a JSON document checked, a raw value as it is.
pub fn encode_value(def: &KeyspaceDef, value: &str) -> Result<Vec<u8>, FormatError> {
    match def.format {
        ValueFormat::Raw => Ok(value.as_bytes().to_vec()),
        ValueFormat::Json => match sonic_rs::from_str::<sonic_rs::Value>(value) {
            Ok(_) => Ok(value.as_bytes().to_vec()),
            Err(e) => Err(FormatError::NotJson {
                keyspace: def.name.clone(),
                message: e.to_string(),
            }),
        },
        ValueFormat::Record => Layout::of(def)?.encode_record(value),
    }
}

/// The fields a keyspace declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    fields: Vec<(String, FieldType)>,
}

impl Schema {
    /// Parses `name:type,...` (types bool, u32, u64, i64, f64, str, and lists as `u64[]`).
    pub fn parse(text: &str) -> Result<Schema, FormatError> {
        let bad = |message: String| FormatError::BadSchema {
            schema: text.to_string(),
            message,
        };
        let mut fields: Vec<(String, FieldType)> = Vec::new();
        for part in text.split(',') {
            let Some((name, ty)) = part.split_once(':') else {
                return Err(bad(format!("{part:?} is not name:type")));
            };
            let (name, ty) = (name.trim(), ty.trim());
            let valid_name = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid_name {
                return Err(bad(format!(
                    "{name:?} is not a field name (letters, digits, _)"
                )));
            }
            if fields.iter().any(|(n, _)| n == name) {
                return Err(bad(format!("field {name:?} declared twice")));
            }
            let field_type = match ty.strip_suffix("[]") {
                Some(inner) => Scalar::parse(inner).map(FieldType::List),
                None => Scalar::parse(ty).map(FieldType::Scalar),
            }
            .ok_or_else(|| {
                bad(format!(
                    "unknown type {ty:?}: use bool, u32, u64, i64, f64, str or a list like u64[]"
                ))
            })?;
            fields.push((name.to_string(), field_type));
            if fields.len() > MAX_FIELDS {
                return Err(bad(format!("more than {MAX_FIELDS} fields")));
            }
        }
        Ok(Schema { fields })
    }

    /// The fields, in declared order.
    pub fn fields(&self) -> &[(String, FieldType)] {
        &self.fields
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|(n, _)| n == name)
    }

    fn names(&self) -> String {
        self.fields
            .iter()
            .map(|(n, t)| format!("{n} ({t})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, ty)) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}:{ty}")?;
        }
        Ok(())
    }
}

/// How to read a keyspace's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    keyspace: String,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Json(Option<Schema>),
    Record(RecordLayout),
}

impl Layout {
    /// JSON documents with no declared fields (nothing is checked).
    pub fn json_undeclared() -> Layout {
        Layout {
            keyspace: String::new(),
            kind: Kind::Json(None),
        }
    }

    /// The declared format of a keyspace.
    pub fn of(def: &KeyspaceDef) -> Result<Layout, FormatError> {
        let kind = match def.format {
            ValueFormat::Raw => {
                return Err(FormatError::RawValues {
                    keyspace: def.name.clone(),
                })
            }
            ValueFormat::Json if def.schema.trim().is_empty() => Kind::Json(None),
            ValueFormat::Json => Kind::Json(Some(Schema::parse(&def.schema)?)),
            ValueFormat::Record => Kind::Record(RecordLayout::new(Schema::parse(&def.schema)?)?),
        };
        Ok(Layout {
            keyspace: def.name.clone(),
            kind,
        })
    }

    /// The declared fields, if any.
    pub fn schema(&self) -> Option<&Schema> {
        match &self.kind {
            Kind::Json(s) => s.as_ref(),
            Kind::Record(r) => Some(&r.schema),
        }
    }

    /// Whether values are typed records (else JSON).
    pub fn is_record(&self) -> bool {
        matches!(self.kind, Kind::Record(_))
    }

    /// The type `path` reads (None: undeclared JSON, anything goes).
    pub fn check_path(&self, path: &Path) -> Result<Option<Scalar>, FormatError> {
        let Some(schema) = self.schema() else {
            return Ok(None);
        };
        let bad = |message: String| FormatError::BadPath {
            path: path.to_string(),
            message,
        };
        let Some(Step::Key(name)) = path.steps.first() else {
            return Err(bad("a path starts with a field name".into()));
        };
        let Some(i) = schema.position(name) else {
            return Err(FormatError::UnknownField {
                keyspace: self.keyspace.clone(),
                field: name.clone(),
                known: schema.names(),
            });
        };
        match (schema.fields[i].1, &path.steps[1..]) {
            (FieldType::Scalar(s), []) => Ok(Some(s)),
            (FieldType::Scalar(s), _) => Err(bad(format!(
                "{name} is {}, it has no members or elements",
                s.name()
            ))),
            (FieldType::List(s), [Step::Index(_)]) => Ok(Some(s)),
            (t @ FieldType::List(_), _) => Err(bad(format!(
                "{name} is {t}: read one element, e.g. {name}[0]"
            ))),
        }
    }

    /// Checks every test of a predicate against the declared fields.
    pub fn check_predicate(&self, pred: &Predicate) -> Result<(), FormatError> {
        let literal = |path: &Path, lit: &Literal| -> Result<(), FormatError> {
            let Some(t) = self.check_path(path)? else {
                return Ok(());
            };
            if matches!(lit, Literal::Null) && !self.is_record() {
                return Ok(()); // a declared JSON field may still be null
            }
            if t.accepts(lit) {
                return Ok(());
            }
            Err(FormatError::TypeMismatch {
                path: path.to_string(),
                field_type: t.name().into(),
                message: format!("it cannot be compared with {}", describe(lit)),
            })
        };
        match pred {
            Predicate::Cmp { path, value, .. } => literal(path, value),
            Predicate::Between { path, low, high } => {
                literal(path, low)?;
                literal(path, high)
            }
            Predicate::In { path, values } => values.iter().try_for_each(|v| literal(path, v)),
            Predicate::Prefix { path, .. } => self.check_str(path, "PREFIX"),
            Predicate::Contains { path, .. } => self.check_str(path, "CONTAINS"),
            Predicate::Exists(path) => self.check_path(path).map(|_| ()),
            Predicate::And(ps) | Predicate::Or(ps) => {
                ps.iter().try_for_each(|p| self.check_predicate(p))
            }
            Predicate::Not(p) => self.check_predicate(p),
        }
    }

    /// Checks that `path` is a string field (for `what`: PREFIX, CONTAINS).
    fn check_str(&self, path: &Path, what: &str) -> Result<(), FormatError> {
        match self.check_path(path)? {
            Some(t) if t != Scalar::Str => Err(FormatError::TypeMismatch {
                path: path.to_string(),
                field_type: t.name().into(),
                message: format!("{what} needs a str field"),
            }),
            _ => Ok(()),
        }
    }

    /// Checks that `path` is a numeric field (for sum, avg, min, max).
    pub fn check_numeric(&self, path: &Path, what: &str) -> Result<(), FormatError> {
        match self.check_path(path)? {
            Some(t) if !t.is_numeric() => Err(FormatError::TypeMismatch {
                path: path.to_string(),
                field_type: t.name().into(),
                message: format!("{what} needs a numeric field"),
            }),
            _ => Ok(()),
        }
    }

    /// How to reach `path` in a value. Record paths must have been checked.
    pub(crate) fn access(&self, path: &Path) -> Access {
        match &self.kind {
            Kind::Json(_) => Access::Json(path.clone()),
            Kind::Record(r) => match path.steps.as_slice() {
                [Step::Key(name)] => match r.schema.position(name) {
                    Some(i) => Access::Record(i),
                    None => Access::Missing,
                },
                _ => Access::Missing,
            },
        }
    }

    /// The value at `access` in `doc`, read in place.
    pub(crate) fn get<'d>(
        &self,
        doc: &'d [u8],
        access: &Access,
    ) -> Result<Option<Val<'d>>, MalformedValue> {
        match (access, &self.kind) {
            (Access::Json(path), _) => json_field(doc, path),
            (Access::Record(i), Kind::Record(r)) => r.field(doc, *i).map(Some),
            _ => Ok(None),
        }
    }

    /// A whole value as JSON text (records converted, JSON as stored).
    pub fn to_json(&self, doc: &[u8], out: &mut Vec<u8>) -> Result<(), MalformedValue> {
        match &self.kind {
            Kind::Json(_) => {
                out.extend_from_slice(doc);
                Ok(())
            }
            Kind::Record(r) => r.to_json(doc, out),
        }
    }

    /// Encodes a JSON object as a record of this keyspace (every declared
    /// field present, of its type; no others).
    pub fn encode_record(&self, json: &str) -> Result<Vec<u8>, FormatError> {
        let Kind::Record(r) = &self.kind else {
            return Err(FormatError::BadRecord {
                keyspace: self.keyspace.clone(),
                message: "the keyspace does not hold records".into(),
            });
        };
        r.encode_json(json)
            .map_err(|message| FormatError::BadRecord {
                keyspace: self.keyspace.clone(),
                message,
            })
    }
}

fn describe(lit: &Literal) -> String {
    match lit {
        Literal::Int(i) => format!("the number {i}"),
        Literal::Float(x) => format!("the number {x}"),
        Literal::Str(s) => format!("the string {s:?}"),
        Literal::Bool(b) => format!("{b}"),
        Literal::Null => "null (record fields are never null)".into(),
    }
}

/// Where a field is, per format.
#[derive(Debug, Clone)]
pub(crate) enum Access {
    Json(Path),
    Record(usize),
    /// Not in the value's format (only for undeclared paths).
    Missing,
}

/// A field's value, borrowed from the stored bytes.
#[derive(Debug, Clone)]
pub(crate) enum Val<'d> {
    /// A JSON array or object, or a string with escapes.
    Json(LazyValue<'d>),
    /// A JSON scalar as stored (written out as it is), and its value.
    Text(&'d [u8], Plain<'d>),
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'d str),
}

impl Val<'_> {
    /// The order against a literal; None across types.
    pub(crate) fn compare(&self, lit: &Literal) -> Option<Ordering> {
        match (self, lit) {
            (Val::Json(v), _) => crate::json_value::compare(v, lit),
            (Val::Text(_, Plain::Null), Literal::Null) => Some(Ordering::Equal),
            (Val::Text(_, p), _) => p.as_val()?.compare(lit),
            (Val::Bool(b), Literal::Bool(l)) => Some(b.cmp(l)),
            (Val::Str(s), Literal::Str(l)) => Some((*s).cmp(l.as_str())),
            (Val::Int(i), Literal::Int(l)) => Some(i.cmp(l)),
            (Val::UInt(u), Literal::Int(l)) => Some(if *l < 0 {
                Ordering::Greater
            } else {
                u.cmp(&(*l as u64))
            }),
            (Val::Float(_) | Val::Int(_) | Val::UInt(_), Literal::Int(_) | Literal::Float(_)) => {
                let l = match lit {
                    Literal::Int(l) => *l as f64,
                    Literal::Float(x) => *x,
                    _ => unreachable!("matched above"),
                };
                self.as_f64()?.partial_cmp(&l)
            }
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Val::Json(v) => v.as_str(),
            Val::Text(_, Plain::Str(s)) | Val::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        match self {
            Val::Json(v) => v.is_null(),
            Val::Text(_, p) => matches!(p, Plain::Null),
            _ => false,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Val::Json(v) => v.as_number()?.as_i64(),
            Val::Text(_, p) => p.as_val()?.as_i64(),
            Val::Int(i) => Some(*i),
            Val::UInt(u) => i64::try_from(*u).ok(),
            _ => None,
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Val::Json(v) => v.as_number()?.as_f64(),
            Val::Text(_, p) => p.as_val()?.as_f64(),
            Val::Int(i) => Some(*i as f64),
            Val::UInt(u) => Some(*u as f64),
            Val::Float(x) => Some(*x),
            _ => None,
        }
    }

    /// The value as JSON text.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a string serializes"
    )]
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Val::Json(v) => out.extend_from_slice(v.as_raw_str().as_bytes()),
            Val::Text(raw, _) => out.extend_from_slice(raw),
            Val::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Val::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
            Val::UInt(u) => out.extend_from_slice(u.to_string().as_bytes()),
            Val::Float(x) => out.extend_from_slice(
                sonic_rs::to_string(x)
                    .unwrap_or_else(|_| "null".into())
                    .as_bytes(),
            ),
            Val::Str(s) => out.extend_from_slice(
                sonic_rs::to_string(s)
                    .expect("a string serializes")
                    .as_bytes(),
            ),
        }
    }
}

/// The value of a JSON scalar.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Plain<'d> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    /// A string without escapes, its contents.
    Str(&'d str),
}

impl<'d> Plain<'d> {
    /// The same value as a record field's (None for null, which records
    /// never hold).
    fn as_val(self) -> Option<Val<'d>> {
        Some(match self {
            Plain::Null => return None,
            Plain::Bool(b) => Val::Bool(b),
            Plain::Int(i) => Val::Int(i),
            Plain::UInt(u) => Val::UInt(u),
            Plain::Float(x) => Val::Float(x),
            Plain::Str(s) => Val::Str(s),
        })
    }
}

/// The value at `path` in a JSON document, found by a skim (nothing past it
/// read): scalars are parsed here from their text; containers, strings with
/// escapes and numbers past f64's range go to sonic-rs as lazy values.
/// The JSON text of the field at `path` of a JSON document, found as the
/// predicates and aggregates find it (the first member of a name; None
/// when a step is missing or crosses a value of another kind).
pub fn field_text<'d>(doc: &'d [u8], path: &Path) -> Result<Option<&'d [u8]>, MalformedValue> {
    let steps = path.steps.iter().map(|s| match s {
        Step::Key(k) => skim::Step::Key(k),
        Step::Index(i) => skim::Step::Index(*i),
    });
    skim::find(doc, steps).map_err(|e| MalformedValue(format!("JSON: {e}")))
}

/// A value read from its JSON text, as [`field_text`] gives it.
pub(crate) fn json_value(raw: &[u8]) -> Result<Option<Val<'_>>, MalformedValue> {
    json_field(raw, &Path { steps: Vec::new() })
}

fn json_field<'d>(doc: &'d [u8], path: &Path) -> Result<Option<Val<'d>>, MalformedValue> {
    let malformed = |e: sluice_json::Error| MalformedValue(format!("JSON: {e}"));
    let Some(raw) = field_text(doc, path)? else {
        return Ok(None);
    };
    let plain = match raw[0] {
        b'"' => match skim::plain_str(raw) {
            Some(s) => Some(Plain::Str(s.map_err(malformed)?)),
            None => None,
        },
        b't' => Some(Plain::Bool(true)),
        b'f' => Some(Plain::Bool(false)),
        b'n' => Some(Plain::Null),
        b'{' | b'[' => None,
        _ => number(raw),
    };
    match plain {
        Some(p) => Ok(Some(Val::Text(raw, p))),
        None => crate::json_value::lookup(raw, &[]).map(|v| v.map(Val::Json)),
    }
}

/// A JSON number's value (its grammar checked by the skim): an integer in
/// i64's or u64's range exactly, anything else as a finite f64.
fn number(raw: &[u8]) -> Option<Plain<'_>> {
    let text = std::str::from_utf8(raw).ok()?;
    if let Ok(i) = text.parse::<i64>() {
        return Some(Plain::Int(i));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(Plain::UInt(u));
    }
    text.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .map(Plain::Float)
}

/// A record schema with the fixed offsets precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RecordLayout {
    schema: Schema,
    types: Vec<Scalar>,
    /// Offset of each field that follows only fixed-width fields.
    fixed_offset: Vec<Option<usize>>,
}

impl RecordLayout {
    fn new(schema: Schema) -> Result<RecordLayout, FormatError> {
        let mut types = Vec::new();
        for (name, t) in &schema.fields {
            match t {
                FieldType::Scalar(s) => types.push(*s),
                FieldType::List(_) => {
                    return Err(FormatError::BadSchema {
                        schema: schema.to_string(),
                        message: format!("record field {name} is a list: records hold scalars"),
                    })
                }
            }
        }
        let mut fixed_offset = Vec::new();
        let mut at = Some(0usize);
        for t in &types {
            fixed_offset.push(at);
            at = at.zip(t.width_bytes()).map(|(a, w)| a + w);
        }
        Ok(RecordLayout {
            schema,
            types,
            fixed_offset,
        })
    }

    /// Field `i` of `doc`: jumps to a fixed offset or skips the fields
    /// before it by their lengths.
    fn field<'d>(&self, doc: &'d [u8], i: usize) -> Result<Val<'d>, MalformedValue> {
        let mut at = 0;
        let mut from = 0;
        if let Some(o) = self.fixed_offset[i] {
            at = o;
            from = i;
        }
        for j in from..i {
            at += self.width(doc, at, j)?;
        }
        self.read(doc, at, i).map(|(v, _)| v)
    }

    fn width(&self, doc: &[u8], at: usize, j: usize) -> Result<usize, MalformedValue> {
        match self.types[j].width_bytes() {
            Some(w) => Ok(w),
            None => Ok(4 + le_u32(self.take(doc, at, 4, j)?, 0) as usize),
        }
    }

    fn take<'d>(
        &self,
        doc: &'d [u8],
        at: usize,
        len: usize,
        j: usize,
    ) -> Result<&'d [u8], MalformedValue> {
        doc.get(at..at + len).ok_or_else(|| {
            MalformedValue(format!(
                "record of {} bytes ends inside field {} (at byte {at})",
                doc.len(),
                self.schema.fields[j].0
            ))
        })
    }

    /// The value of field `j` at `at`, and its width in bytes.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 8 bytes taken"
    )]
    fn read<'d>(
        &self,
        doc: &'d [u8],
        at: usize,
        j: usize,
    ) -> Result<(Val<'d>, usize), MalformedValue> {
        let t = self.types[j];
        let b = self.take(doc, at, t.width_bytes().unwrap_or(4), j)?;
        let u64_at = |b: &[u8]| codec::u64_at(b, 0).expect("8 bytes taken");
        Ok(match t {
            Scalar::Bool => match b[0] {
                0 | 1 => (Val::Bool(b[0] == 1), 1),
                x => {
                    return Err(MalformedValue(format!(
                        "field {} holds {x}, not a bool",
                        self.schema.fields[j].0
                    )))
                }
            },
            Scalar::U32 => (Val::UInt(le_u32(b, 0) as u64), 4),
            Scalar::U64 => (Val::UInt(u64_at(b)), 8),
            Scalar::I64 => (Val::Int(u64_at(b) as i64), 8),
            Scalar::F64 => (Val::Float(f64::from_bits(u64_at(b))), 8),
            Scalar::Str => {
                let len = le_u32(b, 0) as usize;
                let bytes = self.take(doc, at + 4, len, j)?;
                let s = std::str::from_utf8(bytes).map_err(|_| {
                    MalformedValue(format!("field {} is not UTF-8", self.schema.fields[j].0))
                })?;
                (Val::Str(s), 4 + len)
            }
        })
    }

    fn to_json(&self, doc: &[u8], out: &mut Vec<u8>) -> Result<(), MalformedValue> {
        out.push(b'{');
        let mut at = 0;
        for j in 0..self.types.len() {
            if j > 0 {
                out.push(b',');
            }
            let (v, w) = self.read(doc, at, j)?;
            Val::Str(&self.schema.fields[j].0).write_json(out);
            out.push(b':');
            v.write_json(out);
            at += w;
        }
        out.push(b'}');
        if at != doc.len() {
            return Err(MalformedValue(format!(
                "record of {} bytes has {} bytes past its last field",
                doc.len(),
                doc.len() - at
            )));
        }
        Ok(())
    }

    fn encode_json(&self, json: &str) -> Result<Vec<u8>, String> {
        let doc: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        let Some(obj) = doc.as_object() else {
            return Err("give a JSON object with one member per field".into());
        };
        if let Some(extra) = obj.keys().find(|k| self.schema.position(k).is_none()) {
            return Err(format!(
                "no field {extra:?} in the schema ({})",
                self.schema.names()
            ));
        }
        let mut out = Vec::new();
        for ((name, _), t) in self.schema.fields.iter().zip(&self.types) {
            let v = obj
                .get(name)
                .ok_or_else(|| format!("field {name} ({}) is missing", t.name()))?;
            let wrong = || format!("field {name} is {}, got {v}", t.name());
            match t {
                Scalar::Bool => out.push(v.as_bool().ok_or_else(wrong)? as u8),
                Scalar::U32 => {
                    let n = v.as_u64().and_then(|n| u32::try_from(n).ok());
                    out.extend_from_slice(&n.ok_or_else(wrong)?.to_le_bytes());
                }
                Scalar::U64 => out.extend_from_slice(&v.as_u64().ok_or_else(wrong)?.to_le_bytes()),
                Scalar::I64 => out.extend_from_slice(&v.as_i64().ok_or_else(wrong)?.to_le_bytes()),
                Scalar::F64 => out.extend_from_slice(&v.as_f64().ok_or_else(wrong)?.to_le_bytes()),
                Scalar::Str => {
                    let s = v.as_str().ok_or_else(wrong)?;
                    let len = u32::try_from(s.len()).map_err(|_| wrong())?;
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
        }
        Ok(out)
    }
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes checked by the caller"
)]
fn le_u32(b: &[u8], at: usize) -> u32 {
    codec::u32_at(b, at).expect("4 bytes checked by the caller")
}
