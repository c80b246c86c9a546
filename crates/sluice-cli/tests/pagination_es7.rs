//! The pagination suite (tests/suite/pagination.rs) against a real
//! Elasticsearch 7.17.29, started by this test binary through
//! scripts/search-engine from its Maven integ-test zip with the system Java.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

const ENGINE: EngineUnderTest = EngineUnderTest {
    name: "elasticsearch",
    version: "7.17.29",
    port: 9255,
    tls_port: 9456,
};

include!("suite/pagination.rs");
