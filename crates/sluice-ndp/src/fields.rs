//! Fields read out of stored values, one typed value per projected path:
//! what typed result sets (Arrow batches, Python) are built from.
//!
//! JSON values are read with one pass per document for all paths (a
//! pointer tree, not one lookup per path); record fields are read in
//! place at their offsets. Each value is handed to a callback borrowed
//! from the document, so nothing is copied or allocated per field unless a
//! string holds escapes.

use crate::expr::{Path, Step};
use crate::format::{Access, FieldType, FormatError, Layout, Val};
use crate::json_value::{lookup, MalformedValue};
use crate::predicate::pointer;
use sonic_rs::{JsonNumberTrait, JsonType, JsonValueTrait, LazyValue, PointerTree};

/// One field's value in one document.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'v> {
    /// Absent, or JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer that fits i64.
    Int(i64),
    /// An integer above `i64::MAX` (or a record's unsigned field).
    UInt(u64),
    /// Any other number.
    Float(f64),
    /// A string, unescaped.
    Str(&'v str),
    /// An array or object, as its JSON text.
    Json(&'v str),
}

/// Reads a fixed list of paths out of a keyspace's values.
#[derive(Debug)]
pub struct FieldReader {
    layout: Layout,
    names: Vec<String>,
    declared: Vec<Option<FieldType>>,
    reach: Reach,
}

#[derive(Debug)]
enum Reach {
    /// JSON: all paths found in one pass (the pointers one by one where
    /// the pass gives up on a document, see `read`).
    Json(PointerTree, Vec<Vec<sonic_rs::PointerNode>>),
    /// Records: each path's field.
    Record(Vec<Access>),
}

impl FieldReader {
    /// Reads `paths` from values of `layout`, named by the paths as written.
    /// A path the keyspace's schema lacks is refused here.
    pub fn new(layout: &Layout, paths: &[Path]) -> Result<Self, FormatError> {
        for p in paths {
            // A whole declared list is a field of its own here (a list
            // column), where a predicate must pick one element.
            if !matches!(declared_type(layout, p), Some(FieldType::List(_))) {
                layout.check_path(p)?;
            }
        }
        let declared = paths.iter().map(|p| declared_type(layout, p)).collect();
        let reach = if layout.is_record() {
            Reach::Record(paths.iter().map(|p| layout.access(p)).collect())
        } else {
            let mut tree = PointerTree::new();
            let pointers: Vec<_> = paths.iter().map(pointer).collect();
            for p in &pointers {
                tree.add_path(p.clone());
            }
            Reach::Json(tree, pointers)
        };
        Ok(FieldReader {
            layout: layout.clone(),
            names: paths.iter().map(|p| p.to_string()).collect(),
            declared,
            reach,
        })
    }

    /// Every declared field of the layout, in schema order; None when the
    /// layout declares none (undeclared JSON).
    pub fn declared_fields(layout: &Layout) -> Option<Self> {
        let paths: Vec<Path> = layout
            .schema()?
            .fields()
            .iter()
            .map(|(name, _)| Path {
                steps: vec![Step::Key(name.clone())],
            })
            .collect();
        Self::new(layout, &paths).ok()
    }

    /// The fields' names, as their paths are written.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Each field's declared type, where the schema declares it.
    pub fn declared(&self) -> &[Option<FieldType>] {
        &self.declared
    }

    /// Whether values are typed records (fields never null).
    pub fn is_record(&self) -> bool {
        self.layout.is_record()
    }

    /// Calls `each(i, value)` once per field, in order.
    pub fn read(
        &self,
        doc: &[u8],
        each: &mut dyn FnMut(usize, FieldValue<'_>),
    ) -> Result<(), MalformedValue> {
        match &self.reach {
            Reach::Json(tree, pointers) => {
                let found = match sonic_rs::get_many(doc, tree) {
                    Ok(found) => found,
                    // The one-pass lookup fails a whole document where a
                    // path runs into an empty or mistyped container;
                    // then each path is looked up alone (None where missing).
                    Err(e) if e.is_not_found() || e.is_unmatched_type() => {
                        for (i, p) in pointers.iter().enumerate() {
                            match lookup(doc, p)? {
                                Some(v) => each(i, json_value(&v)),
                                None => each(i, FieldValue::Null),
                            }
                        }
                        return Ok(());
                    }
                    Err(e) => return Err(MalformedValue(format!("JSON: {e}"))),
                };
                debug_assert_eq!(found.len(), self.names.len());
                for (i, v) in found.iter().enumerate() {
                    match v {
                        Some(v) => each(i, json_value(v)),
                        None => each(i, FieldValue::Null),
                    }
                }
            }
            Reach::Record(accesses) => {
                for (i, a) in accesses.iter().enumerate() {
                    match self.layout.get(doc, a)? {
                        Some(v) => each(i, record_value(&v)),
                        None => each(i, FieldValue::Null),
                    }
                }
            }
        }
        Ok(())
    }
}

/// The type a path reads where the schema says: a declared field, or an
/// element of a declared list.
fn declared_type(layout: &Layout, path: &Path) -> Option<FieldType> {
    let schema = layout.schema()?;
    let find = |name: &str| {
        schema
            .fields()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
    };
    match path.steps.as_slice() {
        [Step::Key(name)] => find(name),
        [Step::Key(name), Step::Index(_)] => match find(name)? {
            FieldType::List(s) => Some(FieldType::Scalar(s)),
            FieldType::Scalar(_) => None,
        },
        _ => None,
    }
}

fn json_value<'v>(v: &'v LazyValue<'_>) -> FieldValue<'v> {
    match v.get_type() {
        JsonType::Null => FieldValue::Null,
        JsonType::Boolean => FieldValue::Bool(v.as_bool().unwrap_or(false)),
        JsonType::Number => match v.as_number() {
            Some(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => FieldValue::Int(i),
                (None, Some(u), _) => FieldValue::UInt(u),
                (None, None, Some(x)) => FieldValue::Float(x),
                _ => FieldValue::Json(v.as_raw_str()),
            },
            None => FieldValue::Json(v.as_raw_str()),
        },
        JsonType::String => match v.as_str() {
            Some(s) => FieldValue::Str(s),
            None => FieldValue::Json(v.as_raw_str()),
        },
        JsonType::Array | JsonType::Object => FieldValue::Json(v.as_raw_str()),
    }
}

fn record_value<'v>(v: &Val<'v>) -> FieldValue<'v> {
    match *v {
        Val::Bool(b) => FieldValue::Bool(b),
        Val::Int(i) => FieldValue::Int(i),
        Val::UInt(u) => FieldValue::UInt(u),
        Val::Float(x) => FieldValue::Float(x),
        Val::Str(s) => FieldValue::Str(s),
        // Records hold no JSON; a reader built for one never sees this.
        Val::Json(_) | Val::Text(..) => FieldValue::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::encode_value;
    use crate::query::parse_paths;
    use sluice_store::{KeyspaceDef, ValueFormat};

    fn def(format: ValueFormat, schema: &str) -> KeyspaceDef {
        KeyspaceDef {
            id: 1,
            name: "t".into(),
            format,
            schema: schema.into(),
        }
    }

    fn read_all(reader: &FieldReader, doc: &[u8]) -> Vec<String> {
        let mut out = vec![String::new(); reader.names().len()];
        reader
            .read(doc, &mut |i, v| out[i] = format!("{v:?}"))
            .unwrap();
        out
    }

    #[test]
    fn json_fields_come_typed_in_one_pass_with_missing_ones_null() {
        let layout = Layout::json_undeclared();
        let paths = parse_paths(
            "title,year,big,ratio,meta.ok,authors,authors[1],nope,n",
            "x",
        )
        .unwrap();
        let r = FieldReader::new(&layout, &paths).unwrap();
        assert_eq!(r.names()[6], "authors[1]");
        let doc =
            br#"{"title":"caf\u00e9 \"x\"","year":2016,"big":18446744073709551615,"ratio":0.5,
            "meta":{"ok":true},"authors":["a","b"],"n":null}"#;
        let got = read_all(&r, doc);
        assert_eq!(got[0], r#"Str("café \"x\"")"#);
        assert_eq!(got[1], "Int(2016)");
        assert_eq!(got[2], "UInt(18446744073709551615)");
        assert_eq!(got[3], "Float(0.5)");
        assert_eq!(got[4], "Bool(true)");
        assert_eq!(got[5], r#"Json("[\"a\",\"b\"]")"#);
        assert_eq!(got[6], r#"Str("b")"#);
        assert_eq!(got[7], "Null");
        assert_eq!(got[8], "Null");
        // A path through an empty object or into a scalar is missing, not an error.
        let got = read_all(&r, br#"{"meta":{},"authors":5,"title":"t"}"#);
        assert_eq!(got[0], r#"Str("t")"#);
        assert_eq!(got[4], "Null");
        assert_eq!(got[6], "Null");
        let err = r.read(b"{\"title\":", &mut |_, _| {}).unwrap_err();
        assert!(err.0.contains("JSON"), "{err:?}");
    }

    #[test]
    fn record_fields_are_read_in_place_and_undeclared_paths_refused() {
        let d = def(ValueFormat::Record, "name:str,born:u32,score:f64");
        let layout = Layout::of(&d).unwrap();
        let doc = encode_value(&d, r#"{"name":"Ada","born":1815,"score":9.5}"#).unwrap();
        let all = FieldReader::declared_fields(&layout).unwrap();
        assert!(all.is_record());
        assert_eq!(all.names(), ["name", "born", "score"]);
        assert_eq!(
            all.declared()[2],
            Some(FieldType::Scalar(crate::format::Scalar::F64))
        );
        let got = read_all(&all, &doc);
        assert_eq!(got, [r#"Str("Ada")"#, "UInt(1815)", "Float(9.5)"]);
        let err = FieldReader::new(&layout, &parse_paths("age", "x").unwrap()).unwrap_err();
        assert!(err.to_string().contains("age"), "{err}");
    }

    #[test]
    fn declared_json_lists_give_their_element_type() {
        let d = def(ValueFormat::Json, "id:u64,authors:u64[]");
        let layout = Layout::of(&d).unwrap();
        let r =
            FieldReader::new(&layout, &parse_paths("authors,authors[0],id", "x").unwrap()).unwrap();
        use crate::format::Scalar;
        assert_eq!(
            r.declared(),
            [
                Some(FieldType::List(Scalar::U64)),
                Some(FieldType::Scalar(Scalar::U64)),
                Some(FieldType::Scalar(Scalar::U64))
            ]
        );
    }
}
