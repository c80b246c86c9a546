//! Redis 7.0.15's own Tcl test suite, unmodified, against `sluice serve`:
//! the fastest units, through scripts/redis-suite (which fetches the
//! suite from Debian's source package of redis and runs each unit against
//! a fresh server, in database 9 as Redis's own CI does). Each unit must
//! pass at least 98% of the tests a real redis-server passes under the
//! same flags, with no exception. `scripts/redis-suite` with no unit runs
//! every unit of the data model and prints the whole table.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::PathBuf;
use std::process::Command;

/// Units that run in seconds; the slow ones (sets, sorted sets, lists,
/// scan, sort) are left to `scripts/redis-suite` run by hand.
const UNITS: &[&str] = &[
    "keyspace",
    "type/incr",
    "type/hash",
    "multi",
    "quit",
    "expire",
    "scripting",
    "info-command",
    "other",
    "introspection",
    "bitops",
    "tracking",
    "pause",
];

#[test]
fn redis_s_own_fastest_units_pass_against_sluice_serve() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/redis-suite"))
        .args(UNITS)
        .env("SLUICE", env!("CARGO_BIN_EXE_sluice"))
        .env("SUITE_MIN_SHARE", "98")
        .output()
        .unwrap_or_else(|e| panic!("running scripts/redis-suite: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "Redis's suite against sluice serve:\n{stdout}{stderr}"
    );
    // Every unit ran and is in the table (a unit that never started
    // counts 0 and fails the share above; this catches a missing row).
    for unit in UNITS {
        assert!(
            stdout.lines().any(|l| l.starts_with(unit)),
            "no row for {unit}:\n{stdout}"
        );
    }
    println!("{stdout}");
}
