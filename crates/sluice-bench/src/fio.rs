//! Runs fio with the same parameters as a row of `sluice bench io` and reads
//! its JSON report.

use super::io::{Row, RunResult};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn locate() -> Result<PathBuf> {
    let out = Command::new("fio").arg("--version").output();
    match out {
        Ok(o) if o.status.success() => Ok(PathBuf::from("fio")),
        _ => bail!("fio is not installed: run `apt-get install -y fio` (or scripts/setup), or pass --no-fio"),
    }
}

/// fio arguments equivalent to `row`: io_uring, O_DIRECT, fixed buffers,
/// registered files, SQPOLL where the row uses it.
pub fn args(file: &Path, size_bytes: u64, row: &Row, seconds: f64) -> Vec<String> {
    let rw = match (row.write, row.random) {
        (false, true) => "randread",
        (true, true) => "randwrite",
        (false, false) => "read",
        (true, false) => "write",
    };
    let mut a = vec![
        "--name=sluice-compare".to_string(),
        format!("--filename={}", file.display()),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--fixedbufs=1".into(),
        "--registerfiles=1".into(),
        format!("--rw={rw}"),
        format!("--bs={}", row.block_bytes),
        format!("--iodepth={}", row.queue_depth),
        format!("--size={size_bytes}"),
        format!("--runtime={}ms", (seconds * 1000.0) as u64),
        "--time_based=1".into(),
        "--norandommap=1".into(),
        "--randrepeat=0".into(),
        "--lat_percentiles=1".into(),
        "--percentile_list=50:90:99:99.9".into(),
        "--output-format=json".into(),
    ];
    if row.sqpoll {
        a.push("--sqthread_poll=1".into());
    }
    a
}

pub fn run(bin: &Path, file: &Path, size_bytes: u64, row: &Row, seconds: f64) -> Result<RunResult> {
    let out = Command::new(bin)
        .args(args(file, size_bytes, row, seconds))
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio failed for {}: {}",
            row.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse(&String::from_utf8_lossy(&out.stdout), row)
}

pub fn parse(json: &str, row: &Row) -> Result<RunResult> {
    // fio may print notes before the JSON object.
    let start = json.find('{').context("no JSON in fio output")?;
    let v: serde_json::Value = serde_json::from_str(&json[start..]).context("parsing fio JSON")?;
    let side = if row.write { "write" } else { "read" };
    let job = &v["jobs"][0][side];
    let iops = job["iops"].as_f64().context("fio JSON has no iops")?;
    let bw = job["bw_bytes"]
        .as_f64()
        .context("fio JSON has no bw_bytes")?;
    let pct = &job["lat_ns"]["percentile"];
    let p = |k: &str| -> Result<f64> {
        pct[k]
            .as_f64()
            .map(|ns| ns / 1000.0)
            .with_context(|| format!("fio JSON has no lat_ns percentile {k}"))
    };
    Ok(RunResult {
        iops,
        mb_per_s: bw / 1e6,
        lat_us: [
            p("50.000000")?,
            p("90.000000")?,
            p("99.000000")?,
            p("99.900000")?,
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json_and_ignores_leading_notes() {
        let json = r#"note: something
{"jobs":[{"read":{"iops":1000.5,"bw_bytes":4098048,
 "lat_ns":{"percentile":{"50.000000":100000,"90.000000":200000,"99.000000":300000,"99.900000":400000}}},
 "write":{"iops":0}}]}"#;
        let row = Row {
            name: "r",
            write: false,
            random: true,
            block_bytes: 4096,
            queue_depth: 1,
            sqpoll: false,
        };
        let r = parse(json, &row).unwrap();
        assert_eq!(r.iops, 1000.5);
        assert_eq!(r.lat_us, [100.0, 200.0, 300.0, 400.0]);
        assert!((r.mb_per_s - 4.098048).abs() < 1e-9);
        let wrow = Row { write: true, ..row };
        assert!(
            parse(json, &wrow).is_err(),
            "missing write figures must be an error, not zero"
        );
    }

    #[test]
    fn args_match_the_row() {
        let row = Row {
            name: "r",
            write: true,
            random: false,
            block_bytes: 131072,
            queue_depth: 8,
            sqpoll: true,
        };
        let a = args(Path::new("/d"), 1 << 30, &row, 1.5).join(" ");
        for want in [
            "--rw=write",
            "--bs=131072",
            "--iodepth=8",
            "--fixedbufs=1",
            "--registerfiles=1",
            "--direct=1",
            "--sqthread_poll=1",
            "--runtime=1500ms",
        ] {
            assert!(a.contains(want), "{want} missing from {a}");
        }
    }
}
