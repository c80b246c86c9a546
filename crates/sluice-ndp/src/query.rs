//! A query given as text — predicate, projection, aggregates, group-by —
//! parsed, then checked and compiled against a keyspace's declared format.
//! What `sluice query` (and any other front end) runs: bad text fails
//! before a store is opened, fields that do not fit the keyspace before
//! any work starts.

use crate::aggregate::{parse_aggregates, Aggregate, AggregateSpec};
use crate::expr::{parse, ParseError, Path, Predicate};
use crate::format::{FormatError, Layout};
use crate::predicate::FieldPredicate;
use crate::scan::{Projection, ScanSpec};
use sluice_store::KeyspaceDef;
use std::ops::Bound;

/// A query that cannot run: its text, or its fields against the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The text does not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The query does not fit the keyspace's format.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Parts that do not go together.
    #[error("{0}")]
    Usage(String),
}

/// The parts of a query as the user wrote them.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryText<'a> {
    /// A predicate, e.g. "venue IN ('VLDB','SIGMOD') AND year > 2000".
    pub predicate: Option<&'a str>,
    /// Fields to return, comma-separated paths, e.g. "title,authors[0]".
    pub select: Option<&'a str>,
    /// Aggregates, e.g. "count(*),avg(year)"; excludes `select`.
    pub aggregate: Option<&'a str>,
    /// One field to group the aggregates by.
    pub group_by: Option<&'a str>,
}

/// A parsed query, not yet checked against a keyspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Rows must match it.
    pub predicate: Option<Predicate>,
    /// Fields returned (None: whole values).
    pub select: Option<Vec<Path>>,
    /// Aggregates instead of rows.
    pub aggregates: Option<Vec<Aggregate>>,
    /// The field aggregates are grouped by.
    pub group_by: Option<Path>,
}

/// Comma-separated field paths.
pub fn parse_paths(text: &str, what: &str) -> Result<Vec<Path>, QueryError> {
    text.split(',')
        .map(|field| match parse(&format!("EXISTS {}", field.trim())) {
            Ok(Predicate::Exists(p)) => Ok(p),
            _ => Err(QueryError::Usage(format!(
                "{what} {text:?}: {:?} is not a field path (e.g. title, meta.pages, authors[0])",
                field.trim()
            ))),
        })
        .collect()
}

impl Query {
    /// Parses each part; says which part is wrong and where.
    pub fn parse(text: &QueryText<'_>) -> Result<Query, QueryError> {
        if text.select.is_some() && text.aggregate.is_some() {
            return Err(QueryError::Usage(
                "--select and --aggregate exclude each other".into(),
            ));
        }
        if text.group_by.is_some() && text.aggregate.is_none() {
            return Err(QueryError::Usage("--group-by needs --aggregate".into()));
        }
        let group_by = match text
            .group_by
            .map(|g| parse_paths(g, "--group-by"))
            .transpose()?
        {
            Some(mut p) if p.len() == 1 => p.pop(),
            Some(_) => return Err(QueryError::Usage("--group-by takes one field".into())),
            None => None,
        };
        Ok(Query {
            predicate: text.predicate.map(parse).transpose()?,
            select: text
                .select
                .map(|s| parse_paths(s, "--select"))
                .transpose()?,
            aggregates: text.aggregate.map(parse_aggregates).transpose()?,
            group_by,
        })
    }

    /// Whether the query reads fields of the values (a raw keyspace can
    /// only be listed).
    pub fn reads_fields(&self) -> bool {
        self.predicate.is_some() || self.select.is_some() || self.aggregates.is_some()
    }

    /// Checks the query against a keyspace's declared format and compiles
    /// its predicate and projection.
    pub fn plan(&self, def: &KeyspaceDef) -> Result<Plan, QueryError> {
        let layout = match Layout::of(def) {
            Ok(layout) => Some(layout),
            Err(e) if self.reads_fields() => return Err(e.into()),
            Err(_) => None,
        };
        let (predicate, projection) = match &layout {
            Some(l) => (
                self.predicate
                    .as_ref()
                    .map(|p| FieldPredicate::compile_for(p, l))
                    .transpose()?,
                self.select
                    .as_ref()
                    .map(|s| Projection::new_for(s, l))
                    .transpose()?,
            ),
            None => (None, None),
        };
        Ok(Plan {
            keyspace: def.id,
            layout,
            predicate,
            projection,
            aggregates: self.aggregates.clone(),
            group_by: self.group_by.clone(),
        })
    }
}

/// A query checked against its keyspace, ready to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The keyspace's id.
    pub keyspace: u32,
    /// None for a raw keyspace (listed, never read field by field).
    pub layout: Option<Layout>,
    /// The compiled predicate.
    pub predicate: Option<FieldPredicate>,
    /// The compiled projection.
    pub projection: Option<Projection>,
    /// The aggregates.
    pub aggregates: Option<Vec<Aggregate>>,
    /// The grouping field.
    pub group_by: Option<Path>,
}

impl Plan {
    /// A SCAN of the whole keyspace.
    pub fn scan_spec(
        &self,
        reverse: bool,
        limit: usize,
        batch_bytes: usize,
        threads: usize,
    ) -> ScanSpec<'_> {
        ScanSpec {
            keyspace: self.keyspace,
            range: (Bound::Unbounded, Bound::Unbounded),
            reverse,
            predicate: self.predicate.as_ref(),
            projection: self.projection.as_ref(),
            limit,
            batch_bytes,
            threads,
        }
    }

    /// The aggregation over the whole keyspace, if the query has one.
    pub fn aggregate_spec(&self, threads: usize) -> Option<AggregateSpec<'_>> {
        Some(AggregateSpec {
            keyspace: self.keyspace,
            layout: self.layout.as_ref()?,
            range: (Bound::Unbounded, Bound::Unbounded),
            predicate: self.predicate.as_ref(),
            aggregates: self.aggregates.as_deref()?,
            group_by: self.group_by.as_ref(),
            threads,
            multi_valued: false,
        })
    }

    /// The layout rows are converted to JSON with: records returned whole
    /// (a projection is JSON already).
    pub fn record_output(&self) -> Option<&Layout> {
        self.layout
            .as_ref()
            .filter(|l| l.is_record() && self.projection.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{check_definition, encode_value};
    use sluice_store::ValueFormat;

    fn keyspace(format: ValueFormat, schema: &str) -> KeyspaceDef {
        KeyspaceDef {
            id: 3,
            name: "people".into(),
            format,
            schema: schema.into(),
        }
    }

    fn text<'a>(predicate: Option<&'a str>, select: Option<&'a str>) -> QueryText<'a> {
        QueryText {
            predicate,
            select,
            ..QueryText::default()
        }
    }

    #[test]
    fn a_query_is_checked_against_the_keyspace_before_it_runs() {
        let people = keyspace(ValueFormat::Record, "name:str,born:u32");
        let q = Query::parse(&text(Some("born > 1900"), Some("name"))).unwrap();
        let plan = q.plan(&people).unwrap();
        assert_eq!(plan.keyspace, 3);
        assert!(plan.predicate.is_some() && plan.projection.is_some());
        assert!(
            plan.record_output().is_none(),
            "a projection is JSON already"
        );
        let whole = Query::parse(&text(None, None))
            .unwrap()
            .plan(&people)
            .unwrap();
        assert!(whole.record_output().is_some());
        let err = Query::parse(&text(Some("age > 3"), None))
            .unwrap()
            .plan(&people)
            .unwrap_err();
        assert!(err.to_string().contains("no field \"age\""), "{err}");
        // A raw keyspace can be listed, not read field by field.
        let raw = keyspace(ValueFormat::Raw, "");
        assert!(Query::parse(&text(None, None)).unwrap().plan(&raw).is_ok());
        let err = Query::parse(&text(Some("a = 1"), None))
            .unwrap()
            .plan(&raw)
            .unwrap_err();
        assert!(err.to_string().contains("holds raw values"), "{err}");
    }

    #[test]
    fn bad_query_text_says_which_part_is_wrong() {
        let err = |t: QueryText<'_>| Query::parse(&t).unwrap_err().to_string();
        assert!(err(text(Some("year >"), None)).contains("column 7"));
        assert!(err(text(None, Some("title,"))).contains("--select"));
        let both = QueryText {
            select: Some("a"),
            aggregate: Some("count(*)"),
            ..QueryText::default()
        };
        assert!(err(both).contains("exclude each other"));
        let group = QueryText {
            aggregate: Some("count(*)"),
            group_by: Some("a,b"),
            ..QueryText::default()
        };
        assert!(err(group).contains("one field"));
    }

    #[test]
    fn definitions_and_values_are_checked_before_they_are_stored() {
        assert!(check_definition(ValueFormat::Json, "").is_ok());
        assert!(check_definition(ValueFormat::Record, "name:str").is_ok());
        let e = check_definition(ValueFormat::Record, "").unwrap_err();
        assert!(e.to_string().contains("need a schema"), "{e}");
        let e = check_definition(ValueFormat::Raw, "a:u32").unwrap_err();
        assert!(e.to_string().contains("take no schema"), "{e}");
        let docs = keyspace(ValueFormat::Json, "");
        assert_eq!(encode_value(&docs, r#"{"a":1}"#).unwrap(), br#"{"a":1}"#);
        let e = encode_value(&docs, "{oops").unwrap_err();
        assert!(e.to_string().contains("is not JSON"), "{e}");
        let people = keyspace(ValueFormat::Record, "name:str");
        assert!(encode_value(&people, r#"{"name":"Ada"}"#).is_ok());
        assert!(encode_value(&people, r#"{"nome":"Ada"}"#).is_err());
        assert_eq!("json".parse::<ValueFormat>(), Ok(ValueFormat::Json));
        assert!("xml"
            .parse::<ValueFormat>()
            .unwrap_err()
            .contains("raw, json or record"));
    }
}
