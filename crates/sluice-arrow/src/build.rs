//! Rows into Arrow record batches: a key column, optionally the whole value,
//! and one typed column per projected field.

use crate::types::{ColumnType, Inference, ListOf};
use crate::Error;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder,
    UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use sluice_ndp::fields::{FieldReader, FieldValue};
use sonic_rs::{JsonNumberTrait, JsonValueTrait};
use std::collections::HashMap;
use std::sync::Arc;

/// Most documents the column types are inferred from.
pub const MAX_SAMPLE_DOCS: usize = 1024;

/// The columns a result set has, before any row.
#[derive(Debug, Clone)]
pub struct ColumnsSpec {
    /// Name of the key column (`_key`: store keys, binary; `_id`: export
    /// ids, strings).
    pub key: KeyColumn,
    /// The whole value as a column of this name, if asked for.
    pub whole: Option<WholeColumn>,
    /// Projected fields.
    pub fields: Option<Arc<FieldReader>>,
    /// Column types the caller chose, by field name.
    pub types: HashMap<String, ColumnType>,
}

/// The key column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyColumn {
    /// `_key`, binary: a store's keys are bytes.
    StoreKey,
    /// `_id`, utf8: a search index's document ids.
    DocumentId,
}

/// The whole value as one column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholeColumn {
    /// Its name (`value`, `_source`).
    pub name: String,
    /// Binary (raw values) or utf8 (JSON text).
    pub binary: bool,
}

impl ColumnsSpec {
    /// Picks each field's column type: the caller's, else the declared
    /// one, else inferred from `sample`; and the schema.
    pub fn plan(&self, sample: &[&[u8]]) -> Result<Plan, Error> {
        let mut types = Vec::new();
        if let Some(reader) = &self.fields {
            for name in self.types.keys() {
                if !reader.names().iter().any(|n| n == name) {
                    return Err(Error::Usage(format!(
                        "a type was given for {name:?}, which is not among the columns asked for ({})",
                        reader.names().join(", ")
                    )));
                }
            }
            let mut seen = vec![Inference::default(); reader.names().len()];
            for doc in sample.iter().take(MAX_SAMPLE_DOCS) {
                reader.read(doc, &mut |i, v| seen[i].see(&v))?;
            }
            for (i, name) in reader.names().iter().enumerate() {
                let t = match (self.types.get(name), reader.declared()[i]) {
                    (Some(t), _) => (*t, Origin::Given),
                    (None, Some(d)) => (ColumnType::of_declared(d), Origin::Declared),
                    (None, None) => (seen[i].column(), Origin::Inferred),
                };
                types.push(t);
            }
        }
        let mut fields = vec![match self.key {
            KeyColumn::StoreKey => Field::new("_key", DataType::Binary, false),
            KeyColumn::DocumentId => Field::new("_id", DataType::Utf8, false),
        }];
        if let Some(w) = &self.whole {
            let t = if w.binary {
                DataType::Binary
            } else {
                DataType::Utf8
            };
            fields.push(Field::new(&w.name, t, true));
        }
        let non_null = self.fields.as_ref().is_some_and(|r| r.is_record());
        if let Some(reader) = &self.fields {
            for (name, (t, _)) in reader.names().iter().zip(&types) {
                if fields.iter().any(|f| f.name() == name) {
                    return Err(Error::Usage(format!(
                        "column {name:?} asked for twice (or it clashes with the key or value column)"
                    )));
                }
                fields.push(Field::new(name, t.data_type(), !non_null));
            }
        }
        Ok(Plan {
            spec: self.clone(),
            schema: Arc::new(Schema::new(fields)),
            types,
        })
    }
}

/// Where a column's type came from (for error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Given,
    Declared,
    Inferred,
}

/// The columns with their types fixed.
#[derive(Debug, Clone)]
pub struct Plan {
    spec: ColumnsSpec,
    schema: SchemaRef,
    types: Vec<(ColumnType, Origin)>,
}

impl Plan {
    /// The Arrow schema every batch has.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// A builder for batches of this plan.
    pub fn builder(&self) -> RowBuilder {
        RowBuilder {
            plan: self.clone(),
            key: match self.spec.key {
                KeyColumn::StoreKey => BytesBuilder::Binary(BinaryBuilder::new()),
                KeyColumn::DocumentId => BytesBuilder::Utf8(StringBuilder::new()),
            },
            whole: self.spec.whole.as_ref().map(|w| {
                if w.binary {
                    BytesBuilder::Binary(BinaryBuilder::new())
                } else {
                    BytesBuilder::Utf8(StringBuilder::new())
                }
            }),
            columns: self
                .types
                .iter()
                .map(|(t, _)| ColBuilder::new(*t))
                .collect(),
            rows: 0,
            text: String::new(),
        }
    }
}

/// A column of bytes per row: the key, or the whole value.
enum BytesBuilder {
    Binary(BinaryBuilder),
    Utf8(StringBuilder),
}

/// Appends rows and cuts batches.
pub struct RowBuilder {
    plan: Plan,
    key: BytesBuilder,
    whole: Option<BytesBuilder>,
    columns: Vec<ColBuilder>,
    rows: usize,
    text: String,
}

impl RowBuilder {
    /// Rows appended since the last batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends one row: its key (or id) and its stored value. After an
    /// error the builder must not be used again.
    pub fn append(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        // One pass over the value for all fields. After an error the
        // columns differ in length: the builder is not used again (a
        // mismatch ends the result set).
        if let Some(reader) = &self.plan.spec.fields {
            let types = &self.plan.types;
            let columns = &mut self.columns;
            let text = &mut self.text;
            let mut bad: Option<(usize, String)> = None;
            reader.read(value, &mut |i, v| {
                if bad.is_some() {
                    return;
                }
                if !types[i].0.accepts(&v) {
                    bad = Some((i, describe(&v)));
                } else if let Err(e) = columns[i].append(&v, text) {
                    bad = Some((i, e));
                }
            })?;
            if let Some((i, what)) = bad {
                return Err(self.mismatch(i, key, what));
            }
        }
        match &mut self.key {
            BytesBuilder::Binary(b) => b.append_value(key),
            BytesBuilder::Utf8(b) => b.append_value(
                std::str::from_utf8(key)
                    .map_err(|_| Error::Malformed(format!("document id {key:?} is not UTF-8")))?,
            ),
        }
        match &mut self.whole {
            Some(BytesBuilder::Binary(b)) => b.append_value(value),
            Some(BytesBuilder::Utf8(b)) => {
                b.append_value(std::str::from_utf8(value).map_err(|_| {
                    Error::Malformed(format!(
                        "the value of {} is not UTF-8 text",
                        sluice_store::batch::show(key)
                    ))
                })?)
            }
            None => {}
        }
        self.rows += 1;
        Ok(())
    }

    fn mismatch(&self, i: usize, key: &[u8], value: String) -> Error {
        let (t, origin) = self.plan.types[i];
        let names = self.plan.spec.fields.as_ref().map(|r| r.names());
        let column = names.map(|n| n[i].clone()).unwrap_or_default();
        Error::Mismatch {
            column,
            row: match self.plan.spec.key {
                KeyColumn::StoreKey => format!("key {}", sluice_store::batch::show(key)),
                KeyColumn::DocumentId => format!("document {:?}", String::from_utf8_lossy(key)),
            },
            value,
            column_type: t.to_string(),
            origin: match origin {
                Origin::Given => "as given",
                Origin::Declared => "as the keyspace declares it",
                Origin::Inferred => "inferred from the first documents",
            },
        }
    }

    /// The rows appended so far as one batch; the builder starts over.
    pub fn finish(&mut self) -> Result<RecordBatch, Error> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(2 + self.columns.len());
        arrays.push(match &mut self.key {
            BytesBuilder::Binary(b) => Arc::new(b.finish()),
            BytesBuilder::Utf8(b) => Arc::new(b.finish()),
        });
        match &mut self.whole {
            Some(BytesBuilder::Binary(b)) => arrays.push(Arc::new(b.finish())),
            Some(BytesBuilder::Utf8(b)) => arrays.push(Arc::new(b.finish())),
            None => {}
        }
        for c in &mut self.columns {
            arrays.push(c.finish());
        }
        self.rows = 0;
        Ok(RecordBatch::try_new(self.plan.schema.clone(), arrays)?)
    }
}

fn describe(v: &FieldValue<'_>) -> String {
    let short = |s: &str| -> String {
        let mut t: String = s.chars().take(40).collect();
        if t.len() < s.len() {
            t.push('…');
        }
        t
    };
    match v {
        FieldValue::Null => "null".into(),
        FieldValue::Bool(b) => format!("the boolean {b}"),
        FieldValue::Int(i) => format!("the number {i}"),
        FieldValue::UInt(u) => format!("the number {u}"),
        FieldValue::Float(x) => format!("the number {x}"),
        FieldValue::Str(s) => format!("the string {:?}", short(s)),
        FieldValue::Json(j) => format!("the JSON {}", short(j)),
    }
}

enum ColBuilder {
    Bool(BooleanBuilder),
    Int64(Int64Builder),
    UInt64(UInt64Builder),
    UInt32(UInt32Builder),
    Float64(Float64Builder),
    Utf8(StringBuilder),
    Json(StringBuilder),
    ListBool(ListBuilder<BooleanBuilder>),
    ListInt64(ListBuilder<Int64Builder>),
    ListUInt64(ListBuilder<UInt64Builder>),
    ListFloat64(ListBuilder<Float64Builder>),
    ListUtf8(ListBuilder<StringBuilder>),
}

impl ColBuilder {
    fn new(t: ColumnType) -> ColBuilder {
        match t {
            ColumnType::Bool => ColBuilder::Bool(BooleanBuilder::new()),
            ColumnType::Int64 => ColBuilder::Int64(Int64Builder::new()),
            ColumnType::UInt64 => ColBuilder::UInt64(UInt64Builder::new()),
            ColumnType::UInt32 => ColBuilder::UInt32(UInt32Builder::new()),
            ColumnType::Float64 => ColBuilder::Float64(Float64Builder::new()),
            ColumnType::Utf8 => ColBuilder::Utf8(StringBuilder::new()),
            ColumnType::Json => ColBuilder::Json(StringBuilder::new()),
            ColumnType::List(of) => match of {
                ListOf::Bool => ColBuilder::ListBool(ListBuilder::new(BooleanBuilder::new())),
                ListOf::Int64 => ColBuilder::ListInt64(ListBuilder::new(Int64Builder::new())),
                ListOf::UInt64 => ColBuilder::ListUInt64(ListBuilder::new(UInt64Builder::new())),
                ListOf::Float64 => ColBuilder::ListFloat64(ListBuilder::new(Float64Builder::new())),
                ListOf::Utf8 => ColBuilder::ListUtf8(ListBuilder::new(StringBuilder::new())),
            },
        }
    }

    /// Appends a value the column accepts (checked before); list elements
    /// are checked here, an error names the element.
    fn append(&mut self, v: &FieldValue<'_>, text: &mut String) -> Result<(), String> {
        use FieldValue as V;
        match (self, v) {
            (ColBuilder::Bool(b), V::Null) => b.append_null(),
            (ColBuilder::Int64(b), V::Null) => b.append_null(),
            (ColBuilder::UInt64(b), V::Null) => b.append_null(),
            (ColBuilder::UInt32(b), V::Null) => b.append_null(),
            (ColBuilder::Float64(b), V::Null) => b.append_null(),
            (ColBuilder::Utf8(b) | ColBuilder::Json(b), V::Null) => b.append_null(),
            (ColBuilder::Bool(b), V::Bool(x)) => b.append_value(*x),
            (ColBuilder::Int64(b), V::Int(i)) => b.append_value(*i),
            (ColBuilder::UInt64(b), V::UInt(u)) => b.append_value(*u),
            (ColBuilder::UInt64(b), V::Int(i)) => b.append_value(*i as u64),
            (ColBuilder::UInt32(b), V::UInt(u)) => b.append_value(*u as u32),
            (ColBuilder::UInt32(b), V::Int(i)) => b.append_value(*i as u32),
            (ColBuilder::Float64(b), V::Int(i)) => b.append_value(*i as f64),
            (ColBuilder::Float64(b), V::UInt(u)) => b.append_value(*u as f64),
            (ColBuilder::Float64(b), V::Float(x)) => b.append_value(*x),
            (ColBuilder::Utf8(b), V::Str(s)) => b.append_value(s),
            (ColBuilder::Json(b), v) => {
                text.clear();
                json_text(v, text);
                b.append_value(&*text);
            }
            (ColBuilder::ListBool(b), V::Null) => b.append_null(),
            (ColBuilder::ListInt64(b), V::Null) => b.append_null(),
            (ColBuilder::ListUInt64(b), V::Null) => b.append_null(),
            (ColBuilder::ListFloat64(b), V::Null) => b.append_null(),
            (ColBuilder::ListUtf8(b), V::Null) => b.append_null(),
            (list, V::Json(array)) => return list.append_list(array),
            (_, v) => return Err(describe(v)),
        }
        Ok(())
    }

    fn append_list(&mut self, array: &str) -> Result<(), String> {
        let bad = |e: &sonic_rs::LazyValue<'_>| format!("the list element {}", e.as_raw_str());
        for e in sonic_rs::to_array_iter(array) {
            let e = e.map_err(|err| format!("a list that is not JSON ({err})"))?;
            if e.is_null() {
                match self {
                    ColBuilder::ListBool(b) => b.values().append_null(),
                    ColBuilder::ListInt64(b) => b.values().append_null(),
                    ColBuilder::ListUInt64(b) => b.values().append_null(),
                    ColBuilder::ListFloat64(b) => b.values().append_null(),
                    ColBuilder::ListUtf8(b) => b.values().append_null(),
                    _ => return Err(bad(&e)),
                }
                continue;
            }
            match self {
                ColBuilder::ListBool(b) => {
                    b.values().append_value(e.as_bool().ok_or_else(|| bad(&e))?)
                }
                ColBuilder::ListInt64(b) => {
                    b.values().append_value(e.as_i64().ok_or_else(|| bad(&e))?)
                }
                ColBuilder::ListUInt64(b) => {
                    b.values().append_value(e.as_u64().ok_or_else(|| bad(&e))?)
                }
                ColBuilder::ListFloat64(b) => b.values().append_value(
                    e.as_number()
                        .and_then(|n| n.as_f64())
                        .ok_or_else(|| bad(&e))?,
                ),
                ColBuilder::ListUtf8(b) => {
                    b.values().append_value(e.as_str().ok_or_else(|| bad(&e))?)
                }
                _ => return Err(bad(&e)),
            }
        }
        match self {
            ColBuilder::ListBool(b) => b.append(true),
            ColBuilder::ListInt64(b) => b.append(true),
            ColBuilder::ListUInt64(b) => b.append(true),
            ColBuilder::ListFloat64(b) => b.append(true),
            ColBuilder::ListUtf8(b) => b.append(true),
            _ => return Err(format!("the JSON {array}")),
        }
        Ok(())
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            ColBuilder::Bool(b) => Arc::new(b.finish()),
            ColBuilder::Int64(b) => Arc::new(b.finish()),
            ColBuilder::UInt64(b) => Arc::new(b.finish()),
            ColBuilder::UInt32(b) => Arc::new(b.finish()),
            ColBuilder::Float64(b) => Arc::new(b.finish()),
            ColBuilder::Utf8(b) | ColBuilder::Json(b) => Arc::new(b.finish()),
            ColBuilder::ListBool(b) => Arc::new(b.finish()),
            ColBuilder::ListInt64(b) => Arc::new(b.finish()),
            ColBuilder::ListUInt64(b) => Arc::new(b.finish()),
            ColBuilder::ListFloat64(b) => Arc::new(b.finish()),
            ColBuilder::ListUtf8(b) => Arc::new(b.finish()),
        }
    }
}

/// A value as JSON text.
fn json_text(v: &FieldValue<'_>, out: &mut String) {
    use std::fmt::Write;
    match v {
        FieldValue::Null => out.push_str("null"),
        FieldValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        FieldValue::Int(i) => {
            let _ = write!(out, "{i}");
        }
        FieldValue::UInt(u) => {
            let _ = write!(out, "{u}");
        }
        FieldValue::Float(x) => {
            out.push_str(&sonic_rs::to_string(x).unwrap_or_else(|_| "null".into()))
        }
        FieldValue::Str(s) => {
            out.push_str(&sonic_rs::to_string(s).unwrap_or_else(|_| "null".into()))
        }
        FieldValue::Json(j) => out.push_str(j),
    }
}
