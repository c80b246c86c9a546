//! `sluice bench http`: OpenSearch against `sluice serve --http` on the same
//! paper documents with the same clients, in one run — bulk indexing
//! (opensearch-py `helpers.bulk`), a sliced PIT export (`sluice export`) and
//! `helpers.scan` out of each, a predicate `_count` and a terms
//! aggregation. The driver is bench/python/http_bench.py (the clients are
//! Python's); this command runs it with this binary as the server.

use super::repo_file;
use anyhow::{ensure, Context, Result};
use std::path::PathBuf;
use std::process::Command;

const SCRIPT: &str = "bench/python/http_bench.py";

#[derive(clap::Args)]
pub struct HttpBenchArgs {
    /// The OpenSearch to compare with (start ours with scripts/opensearch start).
    #[arg(long, default_value = "http://127.0.0.1:9200")]
    opensearch: String,
    /// The export device the documents come from (`sluice export` of the
    /// seeded paper index, e.g. from `sluice bench export --docs 1000000`).
    #[arg(long, default_value = "data/bench-export-1m.dev")]
    export: PathBuf,
    /// Documents (those with ids below this).
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// The store device `sluice serve` is started on (recreated).
    #[arg(long, default_value = "data/bench-http.dev")]
    device: PathBuf,
    /// Its size in MiB.
    #[arg(long, default_value_t = 8192)]
    create_mib: u64,
    /// Slices of the exports.
    #[arg(long, default_value_t = 4)]
    slices: u32,
    /// Runs of the exports, scans and queries (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the figures go.
    #[arg(long, default_value = "data/bench-http.json")]
    json: PathBuf,
}

pub fn run(args: &HttpBenchArgs) -> Result<()> {
    let script = repo_file(SCRIPT)?;
    let me = std::env::current_exe().context("locating this sluice binary")?;
    let status = Command::new("python3")
        .arg(script)
        .args(["--opensearch", &args.opensearch])
        .arg("--sluice-bin")
        .arg(&me)
        .arg("--export")
        .arg(&args.export)
        .args(["--docs", &args.docs.to_string()])
        .arg("--device")
        .arg(&args.device)
        .args(["--create-mib", &args.create_mib.to_string()])
        .args(["--slices", &args.slices.to_string()])
        .args(["--runs", &args.runs.to_string()])
        .arg("--json")
        .arg(&args.json)
        .status()
        .context(
            "running python3 (opensearch-py and the sluice package: scripts/setup installs them)",
        )?;
    ensure!(status.success(), "{SCRIPT} failed ({status})");
    Ok(())
}
