//! Sliced-scroll pagination against a real OpenSearch 2.11.1, which this
//! test binary starts itself through scripts/search-engine (on its own port
//! and home under target/) and which a watchdog stops when the binary exits.
//! TLS and basic auth go through a real nginx in front of it. Tests take a
//! lock and run one at a time: the machine has two cores and one cluster.
//! The suite (tests/suite/pagination.rs) runs against Elasticsearch 8 and 7
//! too (pagination_es8.rs, pagination_es7.rs); the export benchmark, whose
//! baselines include opensearch-py, runs here only.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

const ENGINE: EngineUnderTest = EngineUnderTest {
    name: "opensearch",
    version: "2.11.1",
    port: 9251,
    tls_port: 9452,
};

include!("suite/pagination.rs");

#[test]
fn bench_export_measures_every_side_on_the_same_index() {
    let _guard = serial();
    cluster();
    let dir = tmp("bench-export");
    let json = dir.join("report.json");
    let out = sluice()
        .args(["bench", "export", "--source", &url()])
        .args([
            "--index",
            "t-bench-export",
            "--docs",
            "3000",
            "--shards",
            "2",
        ])
        .args(["--page-docs", "500", "--runs", "1"])
        .arg("--device")
        .arg(dir.join("export.dev"))
        .arg("--out-dir")
        .arg(dir.join("out"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["docs"], 3000);
    let sides: Vec<&str> = v["sides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert!(s["median_docs_per_s"].as_f64().unwrap() > 0.0, "{s}");
            s["side"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        sides,
        [
            "sluice",
            "ceiling",
            "elasticdump",
            "elasticdump_default",
            "helpers_scan"
        ]
    );
    // Each side checked that it saw all 3000 documents; the NDJSON is there too.
    let lines = std::fs::read_to_string(dir.join("out/helpers-scan.ndjson"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 3000);
    assert!(
        stdout.contains("sluice export / bare sliced PIT loop"),
        "{stdout}"
    );
}
