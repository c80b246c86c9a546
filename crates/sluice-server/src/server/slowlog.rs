//! SLOWLOG and LATENCY: the commands that took longer than
//! `slowlog-log-slower-than` µs (Redis's entries: id, time, duration,
//! arguments cut as Redis cuts them, client address and name, the newest
//! `slowlog-max-len` kept), and the latency monitor's `command` event for
//! those over `latency-monitor-threshold` ms (latest, worst and the last
//! 160 samples, one a second). Commands are timed on the worker that runs
//! them (a script on the script thread), the fast GET and SET paths
//! excepted (they do no I/O while they run) unless every command is to be
//! logged (`slowlog-log-slower-than 0`): they step aside then.

use crate::resp::{Args, Reply};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Arguments an entry keeps (Redis's SLOWLOG_ENTRY_MAX_ARGC).
const MAX_ARGS: usize = 32;
/// Bytes an argument keeps (Redis's SLOWLOG_ENTRY_MAX_STRING).
const MAX_ARG_BYTES: usize = 128;
/// Samples a latency event keeps (Redis's LATENCY_TS_LEN).
const LATENCY_SAMPLES: usize = 160;

/// The slow log and the latency monitor; their thresholds are
/// [`Thresholds`] (CONFIG SET changes them).
#[derive(Debug, Default)]
pub struct SlowLog {
    next_id: AtomicU64,
    entries: Mutex<VecDeque<Entry>>,
    latency: Mutex<Latency>,
}

/// What is logged: Redis's `slowlog-log-slower-than` (µs; negative:
/// nothing), `slowlog-max-len` and `latency-monitor-threshold` (ms; 0:
/// the monitor is off).
#[derive(Debug)]
pub struct Thresholds {
    pub slower_than_us: AtomicI64,
    pub max_len: AtomicU64,
    pub latency_ms: AtomicU64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            slower_than_us: AtomicI64::new(10_000),
            max_len: AtomicU64::new(128),
            latency_ms: AtomicU64::new(0),
        }
    }
}

impl Thresholds {
    /// Whether every command is to be logged (threshold 0).
    pub(super) fn logs_everything(&self) -> bool {
        self.slower_than_us.load(Ordering::Relaxed) == 0
    }

    /// Whether commands need timing at all.
    pub(super) fn timing(&self) -> bool {
        self.slower_than_us.load(Ordering::Relaxed) >= 0
            || self.latency_ms.load(Ordering::Relaxed) > 0
    }
}

#[derive(Debug)]
struct Entry {
    id: u64,
    unix_secs: u64,
    duration_us: u64,
    args: Vec<Vec<u8>>,
    addr: String,
    name: Vec<u8>,
}

/// The `command` event's samples: (unix seconds, ms), oldest first.
#[derive(Debug, Default)]
struct Latency {
    samples: VecDeque<(u64, u64)>,
    max_ms: u64,
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl SlowLog {
    /// Notes that `args`, run by the client at `addr` named `name`, took
    /// `duration_us`.
    pub(super) fn note(
        &self,
        t: &Thresholds,
        args: &Args,
        duration_us: u64,
        addr: &str,
        name: &[u8],
    ) {
        let slower_than = t.slower_than_us.load(Ordering::Relaxed);
        if slower_than >= 0 && duration_us >= slower_than as u64 {
            self.log(
                args,
                duration_us,
                addr,
                name,
                t.max_len.load(Ordering::Relaxed) as usize,
            );
        }
        let threshold_ms = t.latency_ms.load(Ordering::Relaxed);
        let ms = duration_us / 1000;
        if threshold_ms > 0 && ms >= threshold_ms {
            self.latency_sample(ms);
        }
    }

    fn log(&self, args: &Args, duration_us: u64, addr: &str, name: &[u8], max_len: usize) {
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            unix_secs: unix_secs(),
            duration_us,
            args: cut_args(args),
            addr: addr.to_string(),
            name: name.to_vec(),
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push_front(entry);
        entries.truncate(max_len);
    }

    fn latency_sample(&self, ms: u64) {
        let now = unix_secs();
        let mut latency = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        latency.max_ms = latency.max_ms.max(ms);
        // One sample a second, the worst of that second (as Redis keeps).
        match latency.samples.back_mut() {
            Some(last) if last.0 == now => last.1 = last.1.max(ms),
            _ => {
                latency.samples.push_back((now, ms));
                if latency.samples.len() > LATENCY_SAMPLES {
                    latency.samples.pop_front();
                }
            }
        }
    }

    /// SLOWLOG's subcommands (`args[1]` lower-cased as `sub`).
    pub(super) fn slowlog(&self, sub: &[u8], args: &Args) -> Reply {
        match (sub, args.len()) {
            (b"get", 2 | 3) => {
                let count = match args.get(2) {
                    None => 10,
                    // Redis answers a count that is no number as one
                    // out of range.
                    Some(a) => match crate::resp::string_to_i64(a) {
                        None => return error("ERR count should be greater than or equal to -1"),
                        Some(n) if n < -1 => {
                            return error("ERR count should be greater than or equal to -1")
                        }
                        Some(-1) => usize::MAX,
                        Some(n) => n as usize,
                    },
                };
                let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
                Reply::Array(entries.iter().take(count).map(entry_reply).collect())
            }
            (b"len", 2) => {
                Reply::Integer(self.entries.lock().unwrap_or_else(|p| p.into_inner()).len() as i64)
            }
            (b"reset", 2) => {
                self.entries
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                Reply::Simple("OK".into())
            }
            (b"help", 2) => crate::commands::help_reply(SLOWLOG_HELP),
            (b"get" | b"len" | b"reset" | b"help", _) => Reply::Error(format!(
                "ERR wrong number of arguments for 'slowlog|{}' command",
                String::from_utf8_lossy(sub)
            )),
            _ => Reply::Error(format!(
                "ERR unknown subcommand '{}'. Try SLOWLOG HELP.",
                String::from_utf8_lossy(&args[1])
            )),
        }
    }

    /// LATENCY's subcommands Sluice answers (LATEST, HISTORY, RESET, HELP).
    pub(super) fn latency(&self, sub: &[u8], args: &Args) -> Reply {
        let mut latency = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        match (sub, args.len()) {
            (b"latest", 2) => Reply::Array(match latency.samples.back() {
                None => Vec::new(),
                Some(&(at, ms)) => vec![Reply::Array(vec![
                    Reply::Bulk(b"command".to_vec()),
                    Reply::Integer(at as i64),
                    Reply::Integer(ms as i64),
                    Reply::Integer(latency.max_ms as i64),
                ])],
            }),
            (b"history", 3) => {
                let samples = if args[2].eq_ignore_ascii_case(b"command") {
                    latency
                        .samples
                        .iter()
                        .map(|&(at, ms)| {
                            Reply::Array(vec![Reply::Integer(at as i64), Reply::Integer(ms as i64)])
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Reply::Array(samples)
            }
            (b"reset", _) => {
                let all = args.len() == 2;
                let named = args[2..].iter().any(|e| e.eq_ignore_ascii_case(b"command"));
                let had = !latency.samples.is_empty();
                if all || named {
                    *latency = Latency::default();
                }
                Reply::Integer(i64::from((all || named) && had))
            }
            (b"help", 2) => crate::commands::help_reply(LATENCY_HELP),
            (b"doctor" | b"graph" | b"histogram", _) => Reply::Error(format!(
                "ERR LATENCY {} is not served by Sluice: LATENCY LATEST and HISTORY give the samples",
                String::from_utf8_lossy(sub).to_uppercase()
            )),
            (b"latest" | b"history" | b"help", _) => Reply::Error(format!(
                "ERR wrong number of arguments for 'latency|{}' command",
                String::from_utf8_lossy(sub)
            )),
            _ => Reply::Error(format!(
                "ERR unknown subcommand '{}'. Try LATENCY HELP.",
                String::from_utf8_lossy(&args[1])
            )),
        }
    }
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// The arguments as an entry keeps them: at most [`MAX_ARGS`] (the last
/// one saying how many more there were), each cut at [`MAX_ARG_BYTES`].
fn cut_args(args: &Args) -> Vec<Vec<u8>> {
    let kept = if args.len() > MAX_ARGS {
        MAX_ARGS - 1
    } else {
        args.len()
    };
    let mut out: Vec<Vec<u8>> = args[..kept]
        .iter()
        .map(|a| {
            if a.len() > MAX_ARG_BYTES {
                let mut cut = a[..MAX_ARG_BYTES].to_vec();
                cut.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - MAX_ARG_BYTES).as_bytes(),
                );
                cut
            } else {
                a.clone()
            }
        })
        .collect();
    if args.len() > MAX_ARGS {
        out.push(format!("... ({} more arguments)", args.len() - kept).into_bytes());
    }
    out
}

fn entry_reply(e: &Entry) -> Reply {
    Reply::Array(vec![
        Reply::Integer(e.id as i64),
        Reply::Integer(e.unix_secs as i64),
        Reply::Integer(e.duration_us as i64),
        Reply::Array(e.args.iter().cloned().map(Reply::Bulk).collect()),
        Reply::Bulk(e.addr.clone().into_bytes()),
        Reply::Bulk(e.name.clone()),
    ])
}

const SLOWLOG_HELP: &[&str] = &[
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]",
    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    "    Entries are made of:",
    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
    "    client name",
    "LEN",
    "    Return the length of the slowlog.",
    "RESET",
    "    Reset the slowlog.",
    "HELP",
    "    Prints this help.",
];

const LATENCY_HELP: &[&str] = &[
    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return a human readable latency analysis report.",
    "GRAPH <event>",
    "    Return an ASCII latency graph for the <event> class.",
    "HISTORY <event>",
    "    Return time-latency samples for the <event> class.",
    "LATEST",
    "    Return the latest latency samples for all events.",
    "RESET [<event> ...]",
    "    Reset latency data of one or more <event> classes.",
    "    (default: reset all data for all event classes)",
    "HISTOGRAM [COMMAND ...]",
    "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
    "    If no commands are specified then all histograms are replied.",
    "HELP",
    "    Prints this help.",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_cut_as_redis_cuts_them() {
        let mut args: Args = vec![b"rpush".to_vec(), b"l".to_vec(), vec![b'x'; 200]];
        args.extend((0..40).map(|i: i32| i.to_string().into_bytes()));
        let cut = cut_args(&args);
        assert_eq!(cut.len(), MAX_ARGS);
        assert_eq!(cut[2].len(), MAX_ARG_BYTES + "... (72 more bytes)".len());
        assert!(cut[2].ends_with(b"... (72 more bytes)"));
        assert_eq!(cut[MAX_ARGS - 1], b"... (12 more arguments)".to_vec());
    }

    #[test]
    fn only_commands_past_the_thresholds_are_kept() {
        let log = SlowLog::default();
        let t = Thresholds::default();
        let args: Args = vec![b"get".to_vec(), b"k".to_vec()];
        log.note(&t, &args, 9_999, "a", b"");
        log.note(&t, &args, 10_000, "a", b"n");
        assert_eq!(
            log.slowlog(b"len", &vec![b"slowlog".to_vec(), b"len".to_vec()]),
            Reply::Integer(1)
        );
        t.latency_ms.store(5, Ordering::Relaxed);
        log.note(&t, &args, 4_999, "a", b"");
        let latest = vec![b"latency".to_vec(), b"latest".to_vec()];
        assert_eq!(log.latency(b"latest", &latest), Reply::Array(vec![]));
        log.note(&t, &args, 7_000, "a", b"");
        let Reply::Array(events) = log.latency(b"latest", &latest) else {
            panic!()
        };
        assert_eq!(events.len(), 1);
    }
}
