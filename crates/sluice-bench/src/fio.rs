//! Runs fio with the same parameters as a row of `sluice bench io` and reads
//! its JSON report; and gives fio the kind of memory our pool has.
//!
//! Our pool's buffers are 2 MiB-aligned mappings advised as transparent huge
//! pages, so a 1 MiB request is one or two physical segments; fio's default
//! buffers are scattered 4 KiB pages, which hit the virtio disk's segment
//! limit and split every large request. fio's `iomem=shmhuge` (SysV shared
//! memory on hugetlb pages) removes that difference; the benchmark reserves
//! the huge pages it needs and gives them back afterwards.

use crate::io_row::{Row, RunResult};
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
pub fn args(file: &Path, size_bytes: u64, row: &Row, seconds: f64, memory: Memory) -> Vec<String> {
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
        format!("--iomem={}", memory.iomem()),
    ];
    if row.sqpoll {
        a.push("--sqthread_poll=1".into());
    }
    a
}

/// The memory fio's I/O buffers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Memory {
    /// fio's default: malloc, scattered 4 KiB pages.
    Malloc,
    /// SysV shared memory on 2 MiB hugetlb pages (reserved by [`HugePages`]).
    ShmHuge,
}

impl Memory {
    fn iomem(self) -> &'static str {
        match self {
            Memory::Malloc => "malloc",
            Memory::ShmHuge => "shmhuge",
        }
    }

    /// How the table names it.
    pub fn describe(self) -> &'static str {
        match self {
            Memory::Malloc => "4k-pages",
            Memory::ShmHuge => "hugetlb",
        }
    }
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Huge pages reserved for fio's buffers while it lives; the kernel's
/// previous reservation is put back on drop.
pub struct HugePages {
    before: u64,
}

impl HugePages {
    /// Reserves `pages` more 2 MiB pages. Fails (with what to do) when the
    /// setting cannot be written (not root) or the kernel finds too few.
    pub fn reserve(pages: u64) -> Result<HugePages> {
        let read = || -> Result<u64> {
            Ok(std::fs::read_to_string(NR_HUGEPAGES)
                .with_context(|| format!("reading {NR_HUGEPAGES}"))?
                .trim()
                .parse()?)
        };
        let before = read()?;
        std::fs::write(NR_HUGEPAGES, (before + pages).to_string()).with_context(|| {
            format!("writing {NR_HUGEPAGES} (huge pages for fio's buffers need root)")
        })?;
        let guard = HugePages { before };
        let free = huge_pages_free()?;
        if free < pages {
            bail!(
                "the kernel has {free} of {pages} huge pages free (memory too fragmented); \
                 try again after `echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory`"
            );
        }
        Ok(guard)
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(NR_HUGEPAGES, self.before.to_string()) {
            eprintln!("giving back fio's huge pages: writing {NR_HUGEPAGES}: {e}");
        }
    }
}

/// 2 MiB pages fio needs for a row's buffers: queue depth × block size,
/// plus two for its alignment slack (measured: 1 MiB × 8 fails with 5
/// pages free and runs with 6).
pub fn huge_pages_for(row: &Row) -> u64 {
    ((row.queue_depth * row.block_bytes).div_ceil(2 << 20) + 2) as u64
}

/// HugePages_Free from /proc/meminfo.
fn huge_pages_free() -> Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    info.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .context("/proc/meminfo has no HugePages_Free")
}

pub fn run(
    bin: &Path,
    file: &Path,
    size_bytes: u64,
    row: &Row,
    seconds: f64,
    memory: Memory,
) -> Result<RunResult> {
    let out = Command::new(bin)
        .args(args(file, size_bytes, row, seconds, memory))
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio (iomem={}) failed for {}: {}",
            memory.iomem(),
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
        let a = args(Path::new("/d"), 1 << 30, &row, 1.5, Memory::ShmHuge).join(" ");
        for want in [
            "--rw=write",
            "--bs=131072",
            "--iodepth=8",
            "--fixedbufs=1",
            "--registerfiles=1",
            "--direct=1",
            "--sqthread_poll=1",
            "--runtime=1500ms",
            "--iomem=shmhuge",
        ] {
            assert!(a.contains(want), "{want} missing from {a}");
        }
    }
}
