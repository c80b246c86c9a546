//! Column types of Sluice's Arrow result sets: from a keyspace's declared
//! types, from a caller's choice, or inferred from the first documents.

use arrow_schema::{DataType, Field};
use sluice_ndp::fields::FieldValue;
use sluice_ndp::format::{FieldType, Scalar};
use std::fmt;
use std::sync::Arc;

/// How one column holds its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// Arrow `bool`.
    Bool,
    /// Arrow `int64`.
    Int64,
    /// Arrow `uint64`.
    UInt64,
    /// Arrow `uint32`.
    UInt32,
    /// Arrow `double`.
    Float64,
    /// Arrow `utf8`: strings.
    Utf8,
    /// Arrow `utf8` holding each value's JSON text (objects, arrays, mixed
    /// types): takes any value, loses nothing.
    Json,
    /// Arrow `list` of one scalar type.
    List(ListOf),
}

/// Element types a list column may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListOf {
    /// `list<bool>`.
    Bool,
    /// `list<int64>`.
    Int64,
    /// `list<uint64>`.
    UInt64,
    /// `list<double>`.
    Float64,
    /// `list<utf8>`.
    Utf8,
}

impl ColumnType {
    /// Parses a type name: `bool`, `int64` (`i64`), `uint64` (`u64`),
    /// `uint32` (`u32`), `float64` (`f64`, `double`), `string` (`str`,
    /// `utf8`), `json`, or a list like `list<int64>` (`u64[]`).
    pub fn parse(text: &str) -> Option<ColumnType> {
        let t = text.trim().to_ascii_lowercase();
        let inner = t
            .strip_prefix("list<")
            .and_then(|r| r.strip_suffix('>'))
            .or_else(|| t.strip_suffix("[]"));
        if let Some(inner) = inner {
            return Some(ColumnType::List(match Self::parse(inner)? {
                ColumnType::Bool => ListOf::Bool,
                ColumnType::Int64 => ListOf::Int64,
                ColumnType::UInt64 | ColumnType::UInt32 => ListOf::UInt64,
                ColumnType::Float64 => ListOf::Float64,
                ColumnType::Utf8 => ListOf::Utf8,
                ColumnType::Json | ColumnType::List(_) => return None,
            }));
        }
        Some(match t.as_str() {
            "bool" | "boolean" => ColumnType::Bool,
            "int64" | "i64" | "int" => ColumnType::Int64,
            "uint64" | "u64" => ColumnType::UInt64,
            "uint32" | "u32" => ColumnType::UInt32,
            "float64" | "f64" | "double" | "float" => ColumnType::Float64,
            "string" | "str" | "utf8" => ColumnType::Utf8,
            "json" => ColumnType::Json,
            _ => return None,
        })
    }

    /// The column for a declared field type.
    pub fn of_declared(t: FieldType) -> ColumnType {
        match t {
            FieldType::Scalar(s) => match s {
                Scalar::Bool => ColumnType::Bool,
                Scalar::U32 => ColumnType::UInt32,
                Scalar::U64 => ColumnType::UInt64,
                Scalar::I64 => ColumnType::Int64,
                Scalar::F64 => ColumnType::Float64,
                Scalar::Str => ColumnType::Utf8,
            },
            FieldType::List(s) => ColumnType::List(match s {
                Scalar::Bool => ListOf::Bool,
                Scalar::U32 | Scalar::U64 => ListOf::UInt64,
                Scalar::I64 => ListOf::Int64,
                Scalar::F64 => ListOf::Float64,
                Scalar::Str => ListOf::Utf8,
            }),
        }
    }

    /// The Arrow type.
    pub fn data_type(self) -> DataType {
        match self {
            ColumnType::Bool => DataType::Boolean,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::UInt64 => DataType::UInt64,
            ColumnType::UInt32 => DataType::UInt32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Utf8 | ColumnType::Json => DataType::Utf8,
            ColumnType::List(of) => {
                let item = match of {
                    ListOf::Bool => DataType::Boolean,
                    ListOf::Int64 => DataType::Int64,
                    ListOf::UInt64 => DataType::UInt64,
                    ListOf::Float64 => DataType::Float64,
                    ListOf::Utf8 => DataType::Utf8,
                };
                DataType::List(Arc::new(Field::new("item", item, true)))
            }
        }
    }

    /// Whether a value goes into this column as it is.
    pub fn accepts(self, v: &FieldValue<'_>) -> bool {
        match (self, v) {
            (_, FieldValue::Null) | (ColumnType::Json, _) => true,
            (ColumnType::Bool, FieldValue::Bool(_)) => true,
            (ColumnType::Int64, FieldValue::Int(_)) => true,
            (ColumnType::UInt64, FieldValue::UInt(_)) => true,
            (ColumnType::UInt64, FieldValue::Int(i)) => *i >= 0,
            (ColumnType::UInt32, FieldValue::Int(i)) => u32::try_from(*i).is_ok(),
            (ColumnType::UInt32, FieldValue::UInt(u)) => u32::try_from(*u).is_ok(),
            (
                ColumnType::Float64,
                FieldValue::Int(_) | FieldValue::UInt(_) | FieldValue::Float(_),
            ) => true,
            (ColumnType::Utf8, FieldValue::Str(_)) => true,
            (ColumnType::List(_), FieldValue::Json(text)) => text.starts_with('['),
            _ => false,
        }
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ColumnType::Bool => "bool",
            ColumnType::Int64 => "int64",
            ColumnType::UInt64 => "uint64",
            ColumnType::UInt32 => "uint32",
            ColumnType::Float64 => "float64",
            ColumnType::Utf8 => "string",
            ColumnType::Json => "json",
            ColumnType::List(of) => {
                let item = match of {
                    ListOf::Bool => "bool",
                    ListOf::Int64 => "int64",
                    ListOf::UInt64 => "uint64",
                    ListOf::Float64 => "float64",
                    ListOf::Utf8 => "string",
                };
                return write!(f, "list<{item}>");
            }
        };
        f.write_str(name)
    }
}

/// What the sample documents held in one field, to pick its column.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inference {
    /// The kinds of the field's own values (arrays aside).
    values: Kinds,
    lists: bool,
    /// The kinds of the lists' elements.
    items: Kinds,
}

/// Kinds of JSON values seen.
#[derive(Debug, Clone, Copy, Default)]
struct Kinds {
    bools: bool,
    ints: bool,
    negative: bool,
    uints: bool,
    floats: bool,
    strings: bool,
    nested: bool,
}

/// The one kind a set of values has, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OneKind {
    Bool,
    Int64,
    UInt64,
    Float64,
    Str,
    Nested,
}

impl Kinds {
    fn int(&mut self, i: i64) {
        self.ints = true;
        self.negative |= i < 0;
    }

    /// How many kinds were seen; numbers of several kinds count as one.
    fn count(&self) -> usize {
        let numeric = self.ints || self.uints || self.floats;
        [self.bools, numeric, self.strings, self.nested]
            .iter()
            .filter(|k| **k)
            .count()
    }

    /// The one kind seen (numbers: float64, or the widest integer that
    /// holds them all); None for none or several.
    fn one(&self) -> Option<OneKind> {
        if self.count() != 1 {
            return None;
        }
        Some(if self.bools {
            OneKind::Bool
        } else if self.strings {
            OneKind::Str
        } else if self.nested {
            OneKind::Nested
        } else if self.floats || (self.uints && self.negative) {
            OneKind::Float64
        } else if self.uints {
            OneKind::UInt64
        } else {
            OneKind::Int64
        })
    }
}

impl Inference {
    /// Notes one value.
    pub fn see(&mut self, v: &FieldValue<'_>) {
        match v {
            FieldValue::Null => {}
            FieldValue::Bool(_) => self.values.bools = true,
            FieldValue::Int(i) => self.values.int(*i),
            FieldValue::UInt(_) => self.values.uints = true,
            FieldValue::Float(_) => self.values.floats = true,
            FieldValue::Str(_) => self.values.strings = true,
            FieldValue::Json(text) if text.starts_with('[') => {
                self.lists = true;
                self.see_items(text);
            }
            FieldValue::Json(_) => self.values.nested = true,
        }
    }

    /// Notes the kinds of a JSON array's elements.
    fn see_items(&mut self, array: &str) {
        use sonic_rs::{JsonNumberTrait, JsonType, JsonValueTrait};
        for e in sonic_rs::to_array_iter(array) {
            let Ok(e) = e else {
                self.items.nested = true;
                return;
            };
            match e.get_type() {
                JsonType::Null => {}
                JsonType::Boolean => self.items.bools = true,
                JsonType::String => self.items.strings = true,
                JsonType::Number => match e.as_number() {
                    Some(n) if n.as_i64().is_some() => self.items.int(n.as_i64().unwrap_or(0)),
                    Some(n) if n.as_u64().is_some() => self.items.uints = true,
                    _ => self.items.floats = true,
                },
                JsonType::Array | JsonType::Object => self.items.nested = true,
            }
        }
    }

    /// The column the values seen fit: one kind gives its type (numbers of
    /// several kinds float64; lists of one scalar kind a list column),
    /// anything else, or nothing seen, JSON text.
    pub fn column(&self) -> ColumnType {
        if self.lists {
            return match (self.values.count(), self.items.one()) {
                (0, Some(kind)) => match kind {
                    OneKind::Bool => ColumnType::List(ListOf::Bool),
                    OneKind::Int64 => ColumnType::List(ListOf::Int64),
                    OneKind::UInt64 => ColumnType::List(ListOf::UInt64),
                    OneKind::Float64 => ColumnType::List(ListOf::Float64),
                    OneKind::Str => ColumnType::List(ListOf::Utf8),
                    OneKind::Nested => ColumnType::Json,
                },
                _ => ColumnType::Json,
            };
        }
        match self.values.one() {
            Some(OneKind::Bool) => ColumnType::Bool,
            Some(OneKind::Int64) => ColumnType::Int64,
            Some(OneKind::UInt64) => ColumnType::UInt64,
            Some(OneKind::Float64) => ColumnType::Float64,
            Some(OneKind::Str) => ColumnType::Utf8,
            Some(OneKind::Nested) | None => ColumnType::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for t in [
            "bool",
            "int64",
            "uint64",
            "uint32",
            "float64",
            "string",
            "json",
            "list<int64>",
            "list<string>",
        ] {
            assert_eq!(ColumnType::parse(t).unwrap().to_string(), t);
        }
        assert_eq!(
            ColumnType::parse("u64[]"),
            Some(ColumnType::List(ListOf::UInt64))
        );
        assert_eq!(ColumnType::parse("list<json>"), None);
        assert_eq!(ColumnType::parse("decimal"), None);
    }

    #[test]
    fn inference_picks_the_narrowest_column_that_holds_every_value() {
        let pick = |vals: &[FieldValue<'_>]| {
            let mut i = Inference::default();
            vals.iter().for_each(|v| i.see(v));
            i.column()
        };
        use FieldValue::*;
        assert_eq!(pick(&[Int(1), Null, Int(-3)]), ColumnType::Int64);
        assert_eq!(pick(&[Int(1), Float(0.5)]), ColumnType::Float64);
        assert_eq!(pick(&[UInt(u64::MAX), Int(2)]), ColumnType::UInt64);
        assert_eq!(pick(&[UInt(u64::MAX), Int(-2)]), ColumnType::Float64);
        assert_eq!(pick(&[Str("a"), Null]), ColumnType::Utf8);
        assert_eq!(pick(&[Str("a"), Int(1)]), ColumnType::Json);
        assert_eq!(pick(&[Bool(true)]), ColumnType::Bool);
        assert_eq!(
            pick(&[Json("[1]"), Json("[]"), Null]),
            ColumnType::List(ListOf::Int64)
        );
        assert_eq!(
            pick(&[Json("[\"a\",null]")]),
            ColumnType::List(ListOf::Utf8)
        );
        assert_eq!(pick(&[Json("[1, 2.5]")]), ColumnType::List(ListOf::Float64));
        assert_eq!(pick(&[Json("[1, \"a\"]")]), ColumnType::Json);
        assert_eq!(pick(&[Json("[[1]]")]), ColumnType::Json);
        assert_eq!(pick(&[Json("[1]"), Json("{}")]), ColumnType::Json);
        assert_eq!(pick(&[Json("{\"a\":1}")]), ColumnType::Json);
        assert_eq!(pick(&[Null]), ColumnType::Json);
        assert!(ColumnType::UInt32.accepts(&Int(7)));
        assert!(!ColumnType::UInt32.accepts(&Int(-7)));
        assert!(!ColumnType::Int64.accepts(&Float(1.5)));
        assert!(ColumnType::Json.accepts(&Str("x")));
    }
}
