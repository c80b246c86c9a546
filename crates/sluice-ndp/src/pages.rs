//! Predicates over exported pages: `sluice read --sink filter --where`
//! runs the same predicate language and evaluator as `sluice query`
//! ([`crate::expr`], [`crate::predicate`]), on each hit's `_source`.

use crate::expr::{parse, Predicate};
use crate::predicate::FieldPredicate;
use sluice_pages::sinks::SourceFilter;
use sluice_pages::{Error, Result};

/// Documents matching every one of a list of predicates.
#[derive(Debug, Clone)]
pub struct PageFilter {
    predicate: FieldPredicate,
    text: String,
}

impl PageFilter {
    /// Parses `--where` expressions; several are joined with AND.
    pub fn parse(exprs: &[String]) -> Result<Self> {
        if exprs.is_empty() {
            return Err(Error::Config(
                "the filter sink needs a --where predicate, e.g. --where \"year >= 2015 AND venue = 'VLDB'\""
                    .into(),
            ));
        }
        let parts = exprs
            .iter()
            .map(|e| parse(e).map_err(|err| Error::Config(format!("--where {err}"))))
            .collect::<Result<Vec<_>>>()?;
        let predicate = match <[Predicate; 1]>::try_from(parts) {
            Ok([one]) => one,
            Err(parts) => Predicate::And(parts),
        };
        Ok(PageFilter {
            text: predicate.to_string(),
            predicate: FieldPredicate::compile(&predicate),
        })
    }

    /// The predicate as parsed, in the language's own spelling.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl SourceFilter for PageFilter {
    fn keep(&self, source: &str) -> Result<bool> {
        self.predicate
            .matches(source.as_bytes())
            .map_err(|e| Error::Format(format!("a source the filter read: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keeps(exprs: &[&str], doc: &str) -> bool {
        let exprs: Vec<String> = exprs.iter().map(|s| s.to_string()).collect();
        PageFilter::parse(&exprs).unwrap().keep(doc).unwrap()
    }

    #[test]
    fn predicates_run_on_sources_and_several_are_joined_with_and() {
        let doc = r#"{"year":2016,"venue":"VLDB","title":"Graph scans","meta":{"lang":"en"},"authors":["Ann","Bo"]}"#;
        assert!(keeps(&["year >= 2015"], doc));
        assert!(!keeps(&["year > 2016"], doc));
        assert!(keeps(&["venue = 'VLDB'", "year <= 2016"], doc));
        assert!(!keeps(&["venue = 'VLDB'", "year < 2016"], doc));
        assert!(keeps(&["title CONTAINS 'scan'"], doc));
        assert!(keeps(&["authors[1] = 'Bo' AND meta.lang = 'en'"], doc));
        assert!(!keeps(&["missing = 1"], doc));
        assert!(keeps(&["NOT EXISTS missing OR year = 1"], doc));
    }

    #[test]
    fn bad_predicates_are_refused_with_the_column_and_what_was_expected() {
        let err = |e: &str| PageFilter::parse(&[e.to_string()]).unwrap_err().to_string();
        assert!(err("year >").contains("column 7"), "{}", err("year >"));
        assert!(err("venue = VLDB").contains("venue = VLDB"));
        assert!(PageFilter::parse(&[])
            .unwrap_err()
            .to_string()
            .contains("--where"));
    }
}
