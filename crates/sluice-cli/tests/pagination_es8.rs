//! The pagination suite (tests/suite/pagination.rs) against a real
//! Elasticsearch 8.19.7, started by this test binary through
//! scripts/search-engine from its Maven integ-test zip with the system Java.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

const ENGINE: EngineUnderTest = EngineUnderTest {
    name: "elasticsearch",
    version: "8.19.7",
    port: 9253,
    tls_port: 9454,
};

include!("suite/pagination.rs");
