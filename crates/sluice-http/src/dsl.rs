//! The query DSL subset that maps onto Sluice's predicates: `match_all`,
//! `match_none`, `term`, `terms`, `range`, `exists`, `prefix`, `ids`,
//! `bool` (must, filter, should with `minimum_should_match`, must_not), and
//! `match` on a field not mapped as analysed text. Every leaf becomes a
//! near-data predicate ([`sluice_ndp::Predicate`]); a tree without `ids`
//! and counted `should` runs as one predicate in one pass over each
//! document. Anything else is refused with Elasticsearch's error shape.
//!
//! Values are compared as JSON values, as a `keyword` or numeric field
//! would be: an analysed `text` field is refused for `match`; a field
//! holding an array matches `term`/`terms`/`range`/`prefix` when one of its
//! elements does, and `null` is no value
//! ([`FieldPredicate::compile_multi_valued`]).

use crate::error::{ApiError, ApiResult};
use serde_json::Value;
use sluice_ndp::expr::{CmpOp, Literal, Path, Step};
use sluice_ndp::{FieldPredicate, Predicate};
use std::collections::HashSet;

/// A compiled query.
#[derive(Debug, Clone)]
pub enum Query {
    /// Every document.
    All,
    /// No document.
    None,
    /// A near-data predicate.
    Pred(Box<FieldPredicate>, Box<Predicate>),
    /// Documents with these ids.
    Ids(HashSet<String>),
    /// All of these.
    And(Vec<Query>),
    /// At least `min` of these.
    AtLeast(usize, Vec<Query>),
    /// Not this.
    Not(Box<Query>),
}

impl Query {
    /// Whether document `id` with `source` matches.
    pub fn matches(&self, id: &[u8], source: &[u8]) -> ApiResult<bool> {
        Ok(match self {
            Query::All => true,
            Query::None => false,
            Query::Pred(p, _) => p.matches(source).map_err(|e| {
                ApiError::store(format!("document {:?}: {e}", String::from_utf8_lossy(id)))
            })?,
            Query::Ids(ids) => std::str::from_utf8(id).is_ok_and(|s| ids.contains(s)),
            Query::And(qs) => {
                for q in qs {
                    if !q.matches(id, source)? {
                        return Ok(false);
                    }
                }
                true
            }
            Query::AtLeast(min, qs) => {
                let mut n = 0;
                for q in qs {
                    if q.matches(id, source)? {
                        n += 1;
                        if n >= *min {
                            return Ok(true);
                        }
                    }
                }
                n >= *min
            }
            Query::Not(q) => !q.matches(id, source)?,
        })
    }

    /// Whether every document matches (no document need be read to tell).
    pub fn is_all(&self) -> bool {
        matches!(self, Query::All)
    }
}

/// How fields are mapped, for the checks that depend on it.
pub trait Mapped {
    /// The declared type of `field` (`text`, `keyword`, ...), if any.
    fn field_type(&self, field: &str) -> Option<String>;
}

impl Mapped for Value {
    fn field_type(&self, field: &str) -> Option<String> {
        let mut node = self.get("properties")?;
        let mut parts = field.split('.').peekable();
        while let Some(part) = parts.next() {
            let def = node.get(part)?;
            if parts.peek().is_none() {
                return def.get("type").and_then(Value::as_str).map(str::to_string);
            }
            node = def.get("properties")?;
        }
        None
    }
}

/// Compiles the `query` clause of a request.
pub fn compile(query: Option<&Value>, mapping: &dyn Mapped) -> ApiResult<Query> {
    let Some(q) = query else {
        return Ok(Query::All);
    };
    let parsed = parse(q, mapping, 0)?;
    Ok(fuse(parsed))
}

/// The tree before predicates are fused.
enum Node {
    All,
    None,
    Leaf(Predicate),
    Ids(HashSet<String>),
    And(Vec<Node>),
    AtLeast(usize, Vec<Node>),
    Not(Box<Node>),
}

const MAX_DEPTH: usize = 32;

fn single<'a>(v: &'a Value, kind: &str) -> ApiResult<(&'a String, &'a Value)> {
    let obj = v.as_object().ok_or_else(|| {
        ApiError::parsing(format!(
            "[{kind}] query malformed, no start_object after query name"
        ))
    })?;
    let mut it = obj
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "boost" | "_name"));
    match (it.next(), it.next()) {
        (Some(one), None) => Ok(one),
        (None, _) => Err(ApiError::parsing(format!(
            "[{kind}] query malformed, no field name"
        ))),
        (Some(_), Some((k, _))) => Err(ApiError::parsing(format!(
            "[{kind}] query doesn't support multiple fields, found [{}] and [{k}]",
            obj.keys().next().map_or("", String::as_str)
        ))),
    }
}

fn path_of(field: &str) -> ApiResult<Path> {
    if field.is_empty() {
        return Err(ApiError::illegal("field name is null or empty"));
    }
    Ok(Path {
        steps: field.split('.').map(|s| Step::Key(s.to_string())).collect(),
    })
}

fn literal(v: &Value, kind: &str, field: &str) -> ApiResult<Literal> {
    Ok(match v {
        Value::String(s) => Literal::Str(s.clone()),
        Value::Bool(b) => Literal::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Literal::Int(i),
            None => Literal::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::Null => {
            return Err(ApiError::illegal(format!(
                "[{kind}] query on [{field}]: value cannot be null"
            )))
        }
        _ => {
            return Err(ApiError::parsing(format!(
                "[{kind}] query on [{field}] does not support a value of [{v}]"
            )))
        }
    })
}

fn value_of<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Object(m) => m.get(key).unwrap_or(&Value::Null),
        other => other,
    }
}

fn parse(v: &Value, mapping: &dyn Mapped, depth: usize) -> ApiResult<Node> {
    if depth > MAX_DEPTH {
        return Err(ApiError::parsing(format!(
            "the query is nested deeper than {MAX_DEPTH}"
        )));
    }
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::parsing("[_na] query malformed, must start with start_object"))?;
    let mut it = obj.iter();
    let (kind, body) = match (it.next(), it.next()) {
        (Some(one), None) => one,
        (None, _) => return Ok(Node::All),
        (Some((a, _)), Some((b, _))) => {
            return Err(ApiError::parsing(format!(
                "[{a}] malformed query, expected [END_OBJECT] but found [FIELD_NAME] ({b})"
            )))
        }
    };
    match kind.as_str() {
        "match_all" => Ok(Node::All),
        "match_none" => Ok(Node::None),
        "term" => term(body, kind),
        "match" => match_query(body, kind, mapping),
        "terms" => terms(body, kind),
        "range" => range_query(body, kind, mapping),
        "exists" => {
            let field = body
                .get("field")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::parsing("[exists] must be provided with a [field]"))?;
            Ok(Node::Leaf(exists(&path_of(field)?)))
        }
        "prefix" => prefix(body, kind),
        "ids" => ids(body),
        "bool" => parse_bool(body, mapping, depth),
        "constant_score" => {
            let filter = body
                .get("filter")
                .ok_or_else(|| ApiError::parsing("[constant_score] requires a 'filter' element"))?;
            parse(filter, mapping, depth + 1)
        }
        // Elasticsearch's cause names where in the text the name stood;
        // Sluice, parsing a tree, names the field alone.
        other => Err(ApiError::parsing(format!("unknown query [{other}]")).with(
            "caused_by",
            serde_json::json!({
                "type": "named_object_not_found_exception",
                "reason": format!("unknown field [{other}]"),
            }),
        )),
    }
}

/// `term`: the field equals the value.
fn term(body: &Value, kind: &str) -> ApiResult<Node> {
    let (field, value) = single(body, kind)?;
    let lit = literal(value_of(value, "value"), kind, field)?;
    let path = path_of(field)?;
    Ok(Node::Leaf(Predicate::Cmp {
        path,
        op: CmpOp::Eq,
        value: lit,
    }))
}

/// `match`, on a field that is not analysed text: as `term`.
fn match_query(body: &Value, kind: &str, mapping: &dyn Mapped) -> ApiResult<Node> {
    let (field, value) = single(body, kind)?;
    if mapping.field_type(field).as_deref() == Some("text") {
        return Err(ApiError::new(
            400,
            "query_shard_exception",
            format!("[match] on [{field}]: the field is mapped as analysed text, which Sluice does not analyse; map it as keyword or use a term query"),
        ));
    }
    let lit = literal(value_of(value, "query"), kind, field)?;
    let path = path_of(field)?;
    Ok(Node::Leaf(Predicate::Cmp {
        path,
        op: CmpOp::Eq,
        value: lit,
    }))
}

/// `terms`: the field equals one of the values.
fn terms(body: &Value, kind: &str) -> ApiResult<Node> {
    let (field, value) = single(body, kind)?;
    let values = value.as_array().ok_or_else(|| {
        ApiError::parsing(format!(
            "[terms] query does not support [{field}] with a value that is not an array"
        ))
    })?;
    if values.len() > sluice_ndp::expr::MAX_IN_VALUES {
        return Err(ApiError::illegal(format!(
            "[terms] on [{field}] has {} values; at most {} are allowed",
            values.len(),
            sluice_ndp::expr::MAX_IN_VALUES
        )));
    }
    let lits = values
        .iter()
        .map(|v| literal(v, kind, field))
        .collect::<ApiResult<Vec<_>>>()?;
    if lits.is_empty() {
        return Ok(Node::None);
    }
    let path = path_of(field)?;
    Ok(Node::Leaf(Predicate::In { path, values: lits }))
}

/// `range`: bounds on the field (none given: the field exists).
fn range_query(body: &Value, kind: &str, mapping: &dyn Mapped) -> ApiResult<Node> {
    let (field, bounds) = single(body, kind)?;
    let b = bounds.as_object().ok_or_else(|| {
        ApiError::parsing(format!(
            "[range] query malformed, no start_object after [{field}]"
        ))
    })?;
    let mut ops = Vec::new();
    for (k, v) in b {
        let op = match k.as_str() {
            "gte" | "from" => CmpOp::Ge,
            "gt" => CmpOp::Gt,
            "lte" | "to" => CmpOp::Le,
            "lt" => CmpOp::Lt,
            "boost" | "format" | "time_zone" | "relation" => continue,
            other => {
                return Err(ApiError::parsing(format!(
                    "[range] query does not support [{other}]"
                )))
            }
        };
        if v.is_null() {
            continue;
        }
        ops.push((op, literal(v, kind, field)?));
    }
    let path = path_of(field)?;
    if ops.is_empty() {
        return Ok(Node::Leaf(exists(&path)));
    }
    Ok(Node::Leaf(range(
        path,
        ops,
        mapping.field_type(field).as_deref(),
    )))
}

/// `prefix`: a string field starts with the value.
fn prefix(body: &Value, kind: &str) -> ApiResult<Node> {
    let (field, value) = single(body, kind)?;
    let Value::String(text) = value_of(value, "value") else {
        return Err(ApiError::parsing(format!(
            "[prefix] query on [{field}] needs a string value"
        )));
    };
    let path = path_of(field)?;
    Ok(Node::Leaf(Predicate::Prefix {
        path,
        prefix: text.clone(),
    }))
}

/// `ids`: documents by id.
fn ids(body: &Value) -> ApiResult<Node> {
    let values = body
        .get("values")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::parsing("[ids] query malformed, [values] must be an array"))?;
    let ids = values
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            _ => Err(ApiError::parsing("[ids] values must be strings")),
        })
        .collect::<ApiResult<HashSet<_>>>()?;
    Ok(Node::Ids(ids))
}

fn exists(path: &Path) -> Predicate {
    // Multi-valued: null and empty arrays hold no value, as in Elasticsearch.
    Predicate::Exists(path.clone())
}

/// A range as one test per value: with two bounds, BETWEEN, so that both
/// hold for the same element of an array. An exclusive bound on an integer
/// field becomes the inclusive one next to it; on other fields two bounds
/// with an exclusive one are tested separately (on a field holding an
/// array, each may hold for a different element).
fn range(path: Path, mut ops: Vec<(CmpOp, Literal)>, field_type: Option<&str>) -> Predicate {
    let integer = matches!(
        field_type,
        Some("long" | "integer" | "short" | "byte" | "unsigned_long")
    );
    if integer {
        for (op, lit) in ops.iter_mut() {
            if let Literal::Int(n) = lit {
                match op {
                    CmpOp::Gt if *n < i64::MAX => (*op, *n) = (CmpOp::Ge, *n + 1),
                    CmpOp::Lt if *n > i64::MIN => (*op, *n) = (CmpOp::Le, *n - 1),
                    _ => {}
                }
            }
        }
    }
    let low = ops
        .iter()
        .find(|(op, _)| *op == CmpOp::Ge)
        .map(|(_, l)| l.clone());
    let high = ops
        .iter()
        .find(|(op, _)| *op == CmpOp::Le)
        .map(|(_, l)| l.clone());
    if let (Some(low), Some(high), 2) = (low, high, ops.len()) {
        return Predicate::Between { path, low, high };
    }
    Predicate::And(
        ops.into_iter()
            .map(|(op, value)| Predicate::Cmp {
                path: path.clone(),
                op,
                value,
            })
            .collect(),
    )
}

fn clauses(v: Option<&Value>, mapping: &dyn Mapped, depth: usize) -> ApiResult<Vec<Node>> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|q| parse(q, mapping, depth + 1)).collect(),
        Some(one) => Ok(vec![parse(one, mapping, depth + 1)?]),
    }
}

fn parse_bool(body: &Value, mapping: &dyn Mapped, depth: usize) -> ApiResult<Node> {
    let obj = body.as_object().ok_or_else(|| {
        ApiError::parsing("[bool] query malformed, no start_object after query name")
    })?;
    for k in obj.keys() {
        if !matches!(
            k.as_str(),
            "must"
                | "filter"
                | "should"
                | "must_not"
                | "minimum_should_match"
                | "boost"
                | "_name"
                | "adjust_pure_negative"
        ) {
            return Err(ApiError::parsing(format!(
                "[bool] query does not support [{k}]"
            )));
        }
    }
    let mut all = clauses(obj.get("must"), mapping, depth)?;
    all.extend(clauses(obj.get("filter"), mapping, depth)?);
    let should = clauses(obj.get("should"), mapping, depth)?;
    let must_not = clauses(obj.get("must_not"), mapping, depth)?;
    let min = match obj.get("minimum_should_match") {
        None => 0,
        Some(v) => minimum_should_match(v, should.len())?,
    };
    // As in Lucene: with no required clause, some should clause must match,
    // whatever minimum_should_match computed to.
    let min = if all.is_empty() && !should.is_empty() {
        min.max(1)
    } else {
        min
    };
    if min > should.len() {
        return Ok(Node::None);
    }
    if min > 0 {
        all.push(Node::AtLeast(min, should));
    }
    for n in must_not {
        all.push(Node::Not(Box::new(n)));
    }
    Ok(match all.len() {
        0 => Node::All,
        _ => Node::And(all),
    })
}

fn minimum_should_match(v: &Value, clauses: usize) -> ApiResult<usize> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_string(),
        _ => {
            return Err(ApiError::parsing(
                "[minimum_should_match] must be a number or a string",
            ))
        }
    };
    let n = clauses as i64;
    let computed = if let Some(pct) = text.strip_suffix('%') {
        let p: i64 = pct
            .parse()
            .map_err(|_| ApiError::parsing(format!("bad minimum_should_match [{text}]")))?;
        let r = n * p.abs() / 100;
        if p < 0 {
            n - r
        } else {
            r
        }
    } else {
        let k: i64 = text
            .parse()
            .map_err(|_| ApiError::parsing(format!("bad minimum_should_match [{text}]")))?;
        if k < 0 {
            n + k
        } else {
            k
        }
    };
    Ok(computed.max(0) as usize)
}

/// The node as one predicate, where it is one.
fn as_predicate(n: &Node) -> Option<Predicate> {
    match n {
        Node::Leaf(p) => Some(p.clone()),
        Node::And(ns) => ns
            .iter()
            .map(as_predicate)
            .collect::<Option<Vec<_>>>()
            .map(Predicate::And),
        Node::AtLeast(1, ns) => ns
            .iter()
            .map(as_predicate)
            .collect::<Option<Vec<_>>>()
            .map(Predicate::Or),
        Node::Not(inner) => as_predicate(inner).map(|p| Predicate::Not(Box::new(p))),
        _ => None,
    }
}

fn fuse(n: Node) -> Query {
    if let Some(p) = as_predicate(&n) {
        return Query::Pred(
            Box::new(FieldPredicate::compile_multi_valued(&p)),
            Box::new(p),
        );
    }
    match n {
        Node::All => Query::All,
        Node::None => Query::None,
        Node::Leaf(p) => Query::Pred(
            Box::new(FieldPredicate::compile_multi_valued(&p)),
            Box::new(p),
        ),
        Node::Ids(ids) => Query::Ids(ids),
        Node::And(ns) => {
            let qs: Vec<Query> = ns.into_iter().map(fuse).filter(|q| !q.is_all()).collect();
            if qs.iter().any(|q| matches!(q, Query::None)) {
                return Query::None;
            }
            if qs.is_empty() {
                Query::All
            } else {
                Query::And(qs)
            }
        }
        Node::AtLeast(min, ns) => Query::AtLeast(min, ns.into_iter().map(fuse).collect()),
        Node::Not(inner) => match fuse(*inner) {
            Query::All => Query::None,
            Query::None => Query::All,
            q => Query::Not(Box::new(q)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(q: Value, doc: &str) -> bool {
        compile(Some(&q), &json!({}))
            .unwrap()
            .matches(b"id1", doc.as_bytes())
            .unwrap()
    }

    #[test]
    fn leaves_match_like_elasticsearch() {
        let d = r#"{"venue":"VLDB","year":2020,"tags":["db","io"],"n":null,"meta":{"pages":12}}"#;
        assert!(run(json!({"term":{"venue":"VLDB"}}), d));
        assert!(run(json!({"term":{"venue":{"value":"VLDB"}}}), d));
        assert!(!run(json!({"term":{"venue":"vldb"}}), d));
        assert!(run(json!({"term":{"tags":"io"}}), d));
        assert!(run(json!({"terms":{"year":[2019,2020]}}), d));
        assert!(run(json!({"range":{"year":{"gte":2020,"lt":2021}}}), d));
        assert!(!run(json!({"range":{"year":{"gt":2020}}}), d));
        assert!(run(json!({"range":{"meta.pages":{"lte":12}}}), d));
        assert!(run(json!({"exists":{"field":"venue"}}), d));
        assert!(!run(json!({"exists":{"field":"n"}}), d));
        assert!(!run(json!({"exists":{"field":"nope"}}), d));
        assert!(run(json!({"prefix":{"venue":"VL"}}), d));
        assert!(run(json!({"ids":{"values":["id1"]}}), d));
        assert!(!run(json!({"ids":{"values":["id2"]}}), d));
        assert!(run(json!({"match_all":{}}), d));
        let arrays = r#"{"a":[],"b":[null],"c":[[1,2],[3]],"r":[1,10]}"#;
        assert!(!run(json!({"exists":{"field":"a"}}), arrays));
        assert!(!run(json!({"exists":{"field":"b"}}), arrays));
        assert!(run(json!({"term":{"c":3}}), arrays));
        // Both ends of a range hold for one element, not one end each.
        let mapped = json!({"properties":{"r":{"type":"long"}}});
        let q = compile(Some(&json!({"range":{"r":{"gt":1,"lt":10}}})), &mapped).unwrap();
        assert!(!q.matches(b"x", arrays.as_bytes()).unwrap());
        let q = compile(Some(&json!({"range":{"r":{"gte":2,"lte":10}}})), &mapped).unwrap();
        assert!(q.matches(b"x", arrays.as_bytes()).unwrap());
        assert!(!run(json!({"match_none":{}}), d));
    }

    #[test]
    fn bool_clauses_combine() {
        let d = r#"{"a":1,"b":2,"c":3}"#;
        assert!(run(
            json!({"bool":{"must":[{"term":{"a":1}}],"must_not":{"term":{"b":3}}}}),
            d
        ));
        assert!(!run(
            json!({"bool":{"should":[{"term":{"a":9}},{"term":{"b":9}}]}}),
            d
        ));
        assert!(run(
            json!({"bool":{"filter":{"term":{"a":1}},"should":[{"term":{"a":9}}]}}),
            d
        ));
        assert!(!run(
            json!({"bool":{"filter":{"term":{"a":1}},"should":[{"term":{"a":9}}],"minimum_should_match":1}}),
            d
        ));
        assert!(run(
            json!({"bool":{"should":[{"term":{"a":1}},{"term":{"b":2}},{"term":{"c":9}}],"minimum_should_match":2}}),
            d
        ));
        assert!(!run(
            json!({"bool":{"should":[{"term":{"a":1}},{"term":{"b":9}},{"term":{"c":9}}],"minimum_should_match":"67%"}}),
            d
        ));
        assert!(run(
            json!({"bool":{"should":[{"ids":{"values":["id1"]}},{"term":{"b":9}}]}}),
            d
        ));
    }

    #[test]
    fn unknown_and_malformed_queries_are_parsing_errors() {
        let e = compile(Some(&json!({"fuzzy":{"a":"x"}})), &json!({})).unwrap_err();
        assert_eq!(
            (e.status, e.kind, e.reason.as_str()),
            (400, "parsing_exception", "unknown query [fuzzy]")
        );
        assert!(compile(Some(&json!({"term":{"a":1,"b":2}})), &json!({})).is_err());
        assert!(compile(Some(&json!({"bool":{"must":[],"bogus":1}})), &json!({})).is_err());
        let text = json!({"properties":{"title":{"type":"text"}}});
        assert!(compile(Some(&json!({"match":{"title":"x"}})), &text).is_err());
    }
}
