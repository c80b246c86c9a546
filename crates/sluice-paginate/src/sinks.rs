//! The sinks of `sluice read`: count, NDJSON, and a field filter.

use crate::error::{Error, Result};
use crate::read::{Hit, PageInfo, Sink};
use sonic_rs::JsonValueTrait;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Counts documents and bytes (per slice, through the read summary).
#[derive(Debug, Default)]
pub struct CountSink {
    pub docs: u64,
    pub source_bytes: u64,
}

impl Sink for CountSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.docs += hits.len() as u64;
        self.source_bytes += hits.iter().map(|h| h.source.len() as u64).sum::<u64>();
        Ok(())
    }
}

/// One output shared by the tasks: each writes a page's lines at once.
pub type SharedOut = Arc<Mutex<Box<dyn Write + Send>>>;

/// Writes `{"_id":…,"_source":…}` per line, optionally only hits the filter keeps.
pub struct NdjsonSink {
    out: SharedOut,
    filter: Option<Arc<Filter>>,
    buf: Vec<u8>,
    pub written: u64,
    pub examined: u64,
}

impl NdjsonSink {
    pub fn new(out: SharedOut, filter: Option<Arc<Filter>>) -> Self {
        NdjsonSink {
            out,
            filter,
            buf: Vec::new(),
            written: 0,
            examined: 0,
        }
    }
}

impl Sink for NdjsonSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.buf.clear();
        for h in hits {
            self.examined += 1;
            if let Some(f) = &self.filter {
                if !f.matches(h.source) {
                    continue;
                }
            }
            self.buf.extend_from_slice(b"{\"_id\":");
            self.buf
                .extend_from_slice(sonic_rs::to_string(&h.id).expect("a string").as_bytes());
            self.buf.extend_from_slice(b",\"_source\":");
            self.buf.extend_from_slice(h.source.as_bytes());
            self.buf.extend_from_slice(b"}\n");
            self.written += 1;
        }
        if !self.buf.is_empty() {
            let mut out = self.out.lock().expect("output lock");
            out.write_all(&self.buf)
                .map_err(|e| Error::Config(format!("writing the output: {e}")))?;
        }
        Ok(())
    }
}

/// Counts the hits a filter keeps (without writing them).
pub struct FilterCountSink {
    filter: Arc<Filter>,
    pub matched: u64,
    pub examined: u64,
}

impl FilterCountSink {
    pub fn new(filter: Arc<Filter>) -> Self {
        FilterCountSink {
            filter,
            matched: 0,
            examined: 0,
        }
    }
}

impl Sink for FilterCountSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.examined += hits.len() as u64;
        self.matched += hits
            .iter()
            .filter(|h| self.filter.matches(h.source))
            .count() as u64;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// The string contains the text.
    Contains,
}

#[derive(Debug, Clone)]
struct Condition {
    path: Vec<String>,
    op: CmpOp,
    text: String,
    number: Option<f64>,
}

/// Conditions on source fields, all of which must hold: `year>=2015`,
/// `venue=VLDB`, `title~graph` (contains), `meta.lang!=en`. A list field
/// matches when one of its elements does; a missing field never matches.
#[derive(Debug, Clone)]
pub struct Filter {
    conditions: Vec<Condition>,
}

impl Filter {
    pub fn parse(exprs: &[String]) -> Result<Filter> {
        if exprs.is_empty() {
            return Err(Error::Config(
                "the filter sink needs at least one --where condition, e.g. --where 'year>=2015'"
                    .into(),
            ));
        }
        let conditions = exprs
            .iter()
            .map(|e| parse_condition(e))
            .collect::<Result<_>>()?;
        Ok(Filter { conditions })
    }

    pub fn matches(&self, source: &str) -> bool {
        self.conditions.iter().all(|c| {
            match sonic_rs::get_from_str(source, c.path.iter().map(String::as_str)) {
                Ok(v) => value_matches(&v, c),
                Err(_) => false,
            }
        })
    }
}

fn parse_condition(expr: &str) -> Result<Condition> {
    const OPS: [(&str, CmpOp); 7] = [
        ("!=", CmpOp::Ne),
        ("<=", CmpOp::Le),
        (">=", CmpOp::Ge),
        ("=", CmpOp::Eq),
        ("<", CmpOp::Lt),
        (">", CmpOp::Gt),
        ("~", CmpOp::Contains),
    ];
    let found = OPS
        .iter()
        .filter_map(|(sym, op)| expr.find(sym).map(|at| (at, *sym, *op)))
        .min_by_key(|(at, sym, _)| (*at, std::cmp::Reverse(sym.len())));
    let Some((at, sym, op)) = found else {
        return Err(Error::Config(format!(
            "--where {expr:?} has no comparison; write FIELD OP VALUE with OP one of = != < <= > >= ~ (contains), e.g. 'year>=2015'"
        )));
    };
    let field = expr[..at].trim();
    let text = expr[at + sym.len()..].trim().trim_matches('"').to_string();
    if field.is_empty() {
        return Err(Error::Config(format!("--where {expr:?} names no field")));
    }
    let number = text.parse::<f64>().ok();
    if matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge) && number.is_none() {
        return Err(Error::Config(format!(
            "--where {expr:?}: {sym} compares numbers and {text:?} is not one"
        )));
    }
    Ok(Condition {
        path: field.split('.').map(String::from).collect(),
        op,
        text,
        number,
    })
}

fn value_matches(v: &sonic_rs::LazyValue<'_>, c: &Condition) -> bool {
    if v.is_array() {
        return sonic_rs::to_array_iter(v.as_raw_str())
            .flatten()
            .any(|e| value_matches(&e, c));
    }
    if let (Some(x), Some(n)) = (v.as_f64(), c.number) {
        return match c.op {
            CmpOp::Eq => x == n,
            CmpOp::Ne => x != n,
            CmpOp::Lt => x < n,
            CmpOp::Le => x <= n,
            CmpOp::Gt => x > n,
            CmpOp::Ge => x >= n,
            CmpOp::Contains => false,
        };
    }
    let Some(s) = v.as_str() else {
        return false;
    };
    match c.op {
        CmpOp::Eq => s == c.text,
        CmpOp::Ne => s != c.text,
        CmpOp::Contains => s.contains(c.text.as_str()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(exprs: &[&str]) -> Filter {
        Filter::parse(&exprs.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn conditions_compare_numbers_strings_lists_and_nested_fields() {
        let doc = r#"{"year":2016,"venue":"VLDB","authors":["Ann Lee","Bo"],"meta":{"lang":"en"}}"#;
        assert!(f(&["year>=2015"]).matches(doc));
        assert!(!f(&["year>2016"]).matches(doc));
        assert!(f(&["venue=VLDB", "year<=2016"]).matches(doc));
        assert!(f(&["authors=Bo"]).matches(doc));
        assert!(f(&["authors~Lee"]).matches(doc));
        assert!(!f(&["meta.lang!=en"]).matches(doc));
        assert!(!f(&["missing=1"]).matches(doc));
    }

    #[test]
    fn bad_conditions_are_refused_with_the_reason() {
        for (expr, want) in [
            ("year", "has no comparison"),
            ("=3", "names no field"),
            ("year>=new", "compares numbers"),
        ] {
            let err = Filter::parse(&[expr.to_string()]).unwrap_err().to_string();
            assert!(err.contains(want), "{expr}: {err}");
        }
    }
}
