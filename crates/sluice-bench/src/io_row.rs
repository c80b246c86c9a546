//! One row of the I/O benchmark and what a run of it measured: shared by
//! our side (`io`) and fio's (`fio`), so that neither imports the other's.

/// One row: the pattern, block size and queue depth both sides run.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub name: &'static str,
    pub write: bool,
    pub random: bool,
    pub block_bytes: usize,
    pub queue_depth: usize,
    pub sqpoll: bool,
}

/// What one run of one side measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunResult {
    /// Operations per second.
    pub iops: f64,
    /// Megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// p50, p90, p99, p99.9 of completion latency, microseconds.
    pub lat_us: [f64; 4],
}
