//! The last ten minutes of the process's figures, one sample a second:
//! what the console's charts draw (`GET /_sluice/stats/history`).
//!
//! The sampler reads cumulative counters ([`Totals`]) each second; a
//! sample is the difference between two readings divided by the time
//! between them, so a rate never depends on when the page was opened.
//! The ring holds [`HISTORY_SAMPLES`] samples: a fixed few tens of kB.

use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Samples kept: ten minutes at one a second.
pub const HISTORY_SAMPLES: usize = 600;

/// Time between samples.
pub const SAMPLE_INTERVAL_MS: u64 = 1000;

/// One reading of the cumulative counters and gauges a sample is made of.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Totals {
    /// When it was read, in ms since the Unix epoch.
    pub at_ms: u64,
    /// HTTP requests served since start.
    pub http_requests: u64,
    /// Redis-protocol commands run since start (None: no such server).
    pub resp_commands: Option<u64>,
    /// Redis-protocol commands per latency bucket since start: bucket `i`
    /// holds those of at most 2^i µs, the last one the rest.
    pub resp_latency_buckets: Vec<u64>,
    /// Device bytes since start: `[high, low]` priority, each `[read, written]`.
    pub device_bytes: [[u64; 2]; 2],
    /// Where the write-ahead log's writes end, in bytes.
    pub wal_written_bytes: u64,
    /// Where the log's durable part ends, in bytes.
    pub wal_durable_bytes: u64,
    /// Bytes compaction has yet to rewrite (a gauge).
    pub compaction_debt_bytes: u64,
    /// Compactions since start.
    pub compactions: u64,
    /// Memtable flushes since start.
    pub flushes: u64,
}

/// HTTP latency over one interval, in µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IntervalLatency {
    /// Requests the figures cover (0: the percentiles are 0 and mean none).
    pub requests: u64,
    /// The median.
    pub p50_us: u64,
    /// The 90th percentile.
    pub p90_us: u64,
    /// The 99th percentile.
    pub p99_us: u64,
    /// The slowest.
    pub max_us: u64,
}

/// The series of a sample, in the order the JSON answer lists them.
pub const SERIES: [&str; 17] = [
    "http_requests_per_s",
    "resp_commands_per_s",
    "http_p50_us",
    "http_p90_us",
    "http_p99_us",
    "http_max_us",
    "resp_p50_us",
    "resp_p99_us",
    "device_high_read_mb_per_s",
    "device_high_write_mb_per_s",
    "device_low_read_mb_per_s",
    "device_low_write_mb_per_s",
    "wal_written_mb_per_s",
    "wal_durable_mb_per_s",
    "compaction_debt_mb",
    "compactions_per_min",
    "flushes_per_min",
];

/// One second's figures: [`SERIES`] in order (None: not served here, as
/// Redis-protocol figures without a Redis-protocol server).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// When the interval ended, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Each series' figure, in [`SERIES`]' order.
    pub values: [Option<f64>; SERIES.len()],
}

/// The upper bound, in µs, of the latency bucket holding quantile `q` of
/// `counts` (bucket `i` ends at 2^i µs; the last bucket is reported at the
/// bound before it). None when `counts` holds nothing.
pub fn bucket_quantile_us(counts: &[u64], q: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: the smallest count reaching it.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let last = counts.len().saturating_sub(1);
            return Some(1u64 << i.min(last.saturating_sub(1)).min(62));
        }
    }
    None
}

impl Sample {
    /// The sample of the interval from `before` to `now`; None when no
    /// time passed (a clock that stood still or went back).
    pub fn between(before: &Totals, now: &Totals, http: IntervalLatency) -> Option<Sample> {
        if now.at_ms <= before.at_ms {
            return None;
        }
        let secs = (now.at_ms - before.at_ms) as f64 / 1e3;
        let rate = |a: u64, b: u64| Some(b.saturating_sub(a) as f64 / secs);
        let mb_rate = |a: u64, b: u64| Some(b.saturating_sub(a) as f64 / 1e6 / secs);
        let per_min = |a: u64, b: u64| Some(b.saturating_sub(a) as f64 * 60.0 / secs);
        let resp_rate = match (before.resp_commands, now.resp_commands) {
            (Some(a), Some(b)) => rate(a, b),
            _ => None,
        };
        let resp_deltas: Vec<u64> = now
            .resp_latency_buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                n.saturating_sub(before.resp_latency_buckets.get(i).copied().unwrap_or(0))
            })
            .collect();
        let resp_quantile = |q| {
            now.resp_commands?;
            Some(bucket_quantile_us(&resp_deltas, q).unwrap_or(0) as f64)
        };
        let http_figure = |us: u64| Some(if http.requests == 0 { 0.0 } else { us as f64 });
        let [[high_r0, high_w0], [low_r0, low_w0]] = before.device_bytes;
        let [[high_r1, high_w1], [low_r1, low_w1]] = now.device_bytes;
        Some(Sample {
            at_ms: now.at_ms,
            values: [
                rate(before.http_requests, now.http_requests),
                resp_rate,
                http_figure(http.p50_us),
                http_figure(http.p90_us),
                http_figure(http.p99_us),
                http_figure(http.max_us),
                resp_quantile(0.5),
                resp_quantile(0.99),
                mb_rate(high_r0, high_r1),
                mb_rate(high_w0, high_w1),
                mb_rate(low_r0, low_r1),
                mb_rate(low_w0, low_w1),
                mb_rate(before.wal_written_bytes, now.wal_written_bytes),
                mb_rate(before.wal_durable_bytes, now.wal_durable_bytes),
                Some(now.compaction_debt_bytes as f64 / 1e6),
                per_min(before.compactions, now.compactions),
                per_min(before.flushes, now.flushes),
            ],
        })
    }
}

/// The ring of samples and the last reading.
#[derive(Default)]
pub struct History {
    inner: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    last: Option<Totals>,
    samples: VecDeque<Sample>,
}

impl History {
    /// Adds the interval since the last reading (the first reading only
    /// sets the start).
    pub fn record(&self, now: Totals, http: IntervalLatency) {
        let mut ring = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sample) = ring
            .last
            .as_ref()
            .and_then(|b| Sample::between(b, &now, http))
        {
            if ring.samples.len() == HISTORY_SAMPLES {
                ring.samples.pop_front();
            }
            ring.samples.push_back(sample);
        }
        ring.last = Some(now);
        debug_assert!(ring.samples.len() <= HISTORY_SAMPLES);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .samples
            .len()
    }

    /// Whether no interval has ended yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples after `since_ms` (all when None), by series:
    /// `{"interval_ms", "capacity", "at_ms": [...], "series": {name: [...]}}`,
    /// a figure not served here as null.
    pub fn json(&self, since_ms: Option<u64>) -> Value {
        let ring = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let kept: Vec<&Sample> = ring
            .samples
            .iter()
            .filter(|s| since_ms.is_none_or(|t| s.at_ms > t))
            .collect();
        let mut series = Map::new();
        for (i, name) in SERIES.iter().enumerate() {
            let column: Vec<Value> = kept
                .iter()
                .map(|s| match s.values[i] {
                    // Three decimals are plenty for a chart and keep the answer short.
                    Some(v) => json!((v * 1e3).round() / 1e3),
                    None => Value::Null,
                })
                .collect();
            series.insert((*name).to_string(), Value::Array(column));
        }
        json!({
            "interval_ms": SAMPLE_INTERVAL_MS,
            "capacity": HISTORY_SAMPLES,
            "at_ms": kept.iter().map(|s| s.at_ms).collect::<Vec<_>>(),
            "series": series,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(at_ms: u64, http: u64, resp: Option<u64>) -> Totals {
        Totals {
            at_ms,
            http_requests: http,
            resp_commands: resp,
            resp_latency_buckets: vec![0; 4],
            ..Totals::default()
        }
    }

    fn series(h: &History, name: &str) -> Vec<Value> {
        h.json(None)["series"][name].as_array().unwrap().clone()
    }

    #[test]
    fn a_sample_is_the_rate_between_two_readings() {
        let mut a = totals(10_000, 100, Some(1_000));
        a.device_bytes = [[0, 0], [5_000_000, 0]];
        a.wal_written_bytes = 4096;
        let mut b = totals(12_000, 300, Some(5_000));
        b.device_bytes = [[2_000_000, 4_000_000], [5_000_000, 1_000_000]];
        b.wal_written_bytes = 4096 + 2_000_000;
        b.compaction_debt_bytes = 3_000_000;
        b.compactions = 1;
        let s = Sample::between(&a, &b, IntervalLatency::default()).unwrap();
        let v = |name: &str| s.values[SERIES.iter().position(|n| *n == name).unwrap()];
        assert_eq!(v("http_requests_per_s"), Some(100.0));
        assert_eq!(v("resp_commands_per_s"), Some(2_000.0));
        assert_eq!(v("device_high_read_mb_per_s"), Some(1.0));
        assert_eq!(v("device_high_write_mb_per_s"), Some(2.0));
        assert_eq!(v("device_low_read_mb_per_s"), Some(0.0));
        assert_eq!(v("device_low_write_mb_per_s"), Some(0.5));
        assert_eq!(v("wal_written_mb_per_s"), Some(1.0));
        assert_eq!(v("compaction_debt_mb"), Some(3.0));
        assert_eq!(v("compactions_per_min"), Some(30.0));
        // No request in the interval: its latency reads 0, not a stale figure.
        assert_eq!(v("http_p99_us"), Some(0.0));
        assert!(Sample::between(&b, &a, IntervalLatency::default()).is_none());
        assert!(Sample::between(&b, &b, IntervalLatency::default()).is_none());
    }

    #[test]
    fn redis_protocol_figures_are_null_without_its_server() {
        let h = History::default();
        h.record(totals(1_000, 0, None), IntervalLatency::default());
        h.record(totals(2_000, 5, None), IntervalLatency::default());
        assert_eq!(series(&h, "resp_commands_per_s"), vec![Value::Null]);
        assert_eq!(series(&h, "resp_p99_us"), vec![Value::Null]);
        assert_eq!(series(&h, "http_requests_per_s"), vec![json!(5.0)]);
    }

    #[test]
    fn quantiles_come_from_bucket_deltas() {
        // 90 commands of at most 2 µs, 10 of at most 8 µs, in this interval.
        let mut a = totals(0, 0, Some(0));
        a.resp_latency_buckets = vec![7, 7, 7, 7, 7];
        let mut b = totals(1_000, 0, Some(100));
        b.resp_latency_buckets = vec![7, 97, 7, 17, 7];
        let s = Sample::between(&a, &b, IntervalLatency::default()).unwrap();
        assert_eq!(s.values[6], Some(2.0));
        assert_eq!(s.values[7], Some(8.0));
        assert_eq!(bucket_quantile_us(&[0, 0, 0], 0.5), None);
        // The last bucket (+Inf) reads as the bound before it.
        assert_eq!(bucket_quantile_us(&[0, 0, 5], 0.5), Some(2));
    }

    #[test]
    fn the_ring_keeps_the_last_ten_minutes_and_answers_since_a_time() {
        let h = History::default();
        for i in 0..(HISTORY_SAMPLES as u64 + 50) {
            h.record(totals(i * 1_000, i, Some(i)), IntervalLatency::default());
        }
        assert_eq!(h.len(), HISTORY_SAMPLES);
        let all = h.json(None);
        let at: Vec<u64> = all["at_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(at.first(), Some(&50_000));
        assert_eq!(at.last(), Some(&649_000));
        let recent = h.json(Some(647_000));
        assert_eq!(recent["at_ms"], json!([648_000, 649_000]));
        assert_eq!(recent["series"]["http_requests_per_s"], json!([1.0, 1.0]));
    }
}
