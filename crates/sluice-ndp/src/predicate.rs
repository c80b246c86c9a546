//! Predicates evaluated on stored values in place. In a JSON document each
//! field a predicate names is found by a skipping scan of the document's
//! bytes (sonic-rs's lazy lookup) and only that field's value is decoded;
//! the document is never built as a tree. In a typed record
//! ([`crate::format`]) a field is read at its offset.
//!
//! Semantics: a comparison between a field and a literal of another type
//! (a string field against a number, say) is false, whatever the
//! operator; so is any comparison on a missing field. Numbers compare by
//! value (integers exactly, otherwise as f64), strings by bytes, `false`
//! before `true`; `null` is only equal to `null`. `EXISTS` holds for a
//! present field, `null` included. `NOT` negates the result.
//!
//! A document that is not JSON is an error where a lookup runs into the
//! damage; a lookup skips what it does not need without validating it, so
//! damage past the fields a predicate reads goes unnoticed here (checking
//! documents when they are written is the place for that).
//!
//! [`FieldPredicate::compile_multi_valued`] reads arrays as Elasticsearch
//! does (each element a value of the field); the HTTP API compiles its
//! query DSL that way.

use crate::expr::{CmpOp, Literal, Path, Predicate, Step};
use crate::format::{Access, FormatError, Layout, Val};
pub use crate::json_value::MalformedValue;
use sonic_rs::{JsonValueTrait, LazyValue, PointerNode};
use std::cmp::Ordering;

/// A predicate ready to run: each distinct path turned into an accessor
/// once.
#[derive(Debug, Clone)]
pub struct FieldPredicate {
    root: Node,
    layout: Layout,
    accesses: Vec<Access>,
    /// Arrays hold several values of their field (see
    /// [`FieldPredicate::compile_multi_valued`]).
    multi_valued: bool,
}

#[derive(Debug, Clone)]
enum Node {
    Cmp(usize, CmpOp, Literal),
    Between(usize, Literal, Literal),
    In(usize, Vec<Literal>),
    Prefix(usize, String),
    Contains(usize, String),
    Exists(usize),
    And(Vec<Node>),
    Or(Vec<Node>),
    Not(Box<Node>),
}

impl FieldPredicate {
    /// For JSON documents with no declared fields: nothing to check.
    pub fn compile(pred: &Predicate) -> Self {
        Self::build(pred, Layout::json_undeclared())
    }

    /// For JSON documents read as Elasticsearch reads them: a field holding
    /// an array holds each of its elements as a value, so a comparison,
    /// `IN`, `BETWEEN`, `PREFIX` or `CONTAINS` holds when it holds for one
    /// element; `null` is no value, so `EXISTS` holds for a field with a
    /// value other than `null` (an empty array, or one of nulls, has none).
    pub fn compile_multi_valued(pred: &Predicate) -> Self {
        FieldPredicate {
            multi_valued: true,
            ..Self::build(pred, Layout::json_undeclared())
        }
    }

    /// For a keyspace's declared format: a predicate naming a field the
    /// format lacks, or comparing one with a literal of another type, is
    /// refused here, before any work starts.
    pub fn compile_for(pred: &Predicate, layout: &Layout) -> Result<Self, FormatError> {
        layout.check_predicate(pred)?;
        Ok(Self::build(pred, layout.clone()))
    }

    fn build(pred: &Predicate, layout: Layout) -> Self {
        let mut paths: Vec<Path> = Vec::new();
        let root = Self::node(pred, &mut paths);
        let accesses = paths.iter().map(|p| layout.access(p)).collect();
        FieldPredicate {
            root,
            layout,
            accesses,
            multi_valued: false,
        }
    }

    fn node(pred: &Predicate, paths: &mut Vec<Path>) -> Node {
        let mut slot = |path: &Path| match paths.iter().position(|p| p == path) {
            Some(i) => i,
            None => {
                paths.push(path.clone());
                paths.len() - 1
            }
        };
        match pred {
            Predicate::Cmp { path, op, value } => Node::Cmp(slot(path), *op, value.clone()),
            Predicate::Between { path, low, high } => {
                Node::Between(slot(path), low.clone(), high.clone())
            }
            Predicate::In { path, values } => Node::In(slot(path), values.clone()),
            Predicate::Prefix { path, prefix } => Node::Prefix(slot(path), prefix.clone()),
            Predicate::Contains { path, text } => Node::Contains(slot(path), text.clone()),
            Predicate::Exists(path) => Node::Exists(slot(path)),
            Predicate::And(ps) => Node::And(ps.iter().map(|p| Self::node(p, paths)).collect()),
            Predicate::Or(ps) => Node::Or(ps.iter().map(|p| Self::node(p, paths)).collect()),
            Predicate::Not(p) => Node::Not(Box::new(Self::node(p, paths))),
        }
    }

    /// Whether `doc` satisfies the predicate. Fields are looked up at most
    /// once each, and only those the evaluation reaches (AND and OR stop
    /// early).
    pub fn matches(&self, doc: &[u8]) -> Result<bool, MalformedValue> {
        // Up to 8 fields without an allocation per document.
        const INLINE: usize = 8;
        if self.accesses.len() <= INLINE {
            let mut fields: [Option<Option<Val<'_>>>; INLINE] = Default::default();
            self.eval(&self.root, doc, &mut fields)
        } else {
            let mut fields: Vec<Option<Option<Val<'_>>>> = vec![None; self.accesses.len()];
            self.eval(&self.root, doc, &mut fields)
        }
    }

    fn field<'d>(
        &self,
        i: usize,
        doc: &'d [u8],
        fields: &mut [Option<Option<Val<'d>>>],
    ) -> Result<Option<Val<'d>>, MalformedValue> {
        if let Some(v) = &fields[i] {
            return Ok(v.clone());
        }
        let found = self.layout.get(doc, &self.accesses[i])?;
        fields[i] = Some(found.clone());
        Ok(found)
    }

    fn eval<'d>(
        &self,
        node: &Node,
        doc: &'d [u8],
        fields: &mut [Option<Option<Val<'d>>>],
    ) -> Result<bool, MalformedValue> {
        Ok(match node {
            Node::Cmp(p, op, lit) => self.holds(self.field(*p, doc, fields)?, |v| {
                v.compare(lit).is_some_and(|o| op_holds(*op, o))
            }),
            Node::Between(p, low, high) => self.holds(self.field(*p, doc, fields)?, |v| {
                v.compare(low).is_some_and(Ordering::is_ge)
                    && v.compare(high).is_some_and(Ordering::is_le)
            }),
            Node::In(p, values) => self.holds(self.field(*p, doc, fields)?, |v| {
                values.iter().any(|l| v.compare(l) == Some(Ordering::Equal))
            }),
            Node::Prefix(p, prefix) => self.holds(self.field(*p, doc, fields)?, |v| {
                v.as_str().is_some_and(|s| s.starts_with(prefix.as_str()))
            }),
            Node::Contains(p, text) => self.holds(self.field(*p, doc, fields)?, |v| {
                v.as_str().is_some_and(|s| s.contains(text.as_str()))
            }),
            Node::Exists(p) if self.multi_valued => {
                self.holds(self.field(*p, doc, fields)?, |v| !v.is_null())
            }
            Node::Exists(p) => self.field(*p, doc, fields)?.is_some(),
            Node::And(parts) => {
                for n in parts {
                    if !self.eval(n, doc, fields)? {
                        return Ok(false);
                    }
                }
                true
            }
            Node::Or(parts) => {
                for n in parts {
                    if self.eval(n, doc, fields)? {
                        return Ok(true);
                    }
                }
                false
            }
            Node::Not(n) => !self.eval(n, doc, fields)?,
        })
    }
}

impl FieldPredicate {
    /// Whether `test` holds for the value, or, multi-valued, for one of the
    /// array's elements (nested arrays are flattened, as Elasticsearch does).
    fn holds(&self, value: Option<Val<'_>>, test: impl Fn(&Val<'_>) -> bool + Copy) -> bool {
        match value {
            None => false,
            Some(Val::Json(v)) if self.multi_valued && v.is_array() => any_element(&v, test),
            Some(v) => test(&v),
        }
    }
}

fn any_element(array: &LazyValue<'_>, test: impl Fn(&Val<'_>) -> bool + Copy) -> bool {
    sonic_rs::to_array_iter(array.as_raw_str()).any(|e| match e {
        Ok(e) if e.is_array() => any_element(&e, test),
        Ok(e) => test(&Val::Json(e)),
        Err(_) => false,
    })
}

/// The sonic-rs pointer that finds `path` in a document.
pub(crate) fn pointer(path: &Path) -> Vec<PointerNode> {
    path.steps
        .iter()
        .map(|s| match s {
            Step::Key(k) => PointerNode::Key(k.clone().into()),
            Step::Index(i) => PointerNode::Index(*i),
        })
        .collect()
}

fn op_holds(op: CmpOp, o: Ordering) -> bool {
    match op {
        CmpOp::Eq => o.is_eq(),
        CmpOp::Ne => o.is_ne(),
        CmpOp::Lt => o.is_lt(),
        CmpOp::Le => o.is_le(),
        CmpOp::Gt => o.is_gt(),
        CmpOp::Ge => o.is_ge(),
    }
}
