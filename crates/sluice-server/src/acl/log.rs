//! ACL LOG: the latest refusals, the same one counted rather than repeated
//! (Redis's grouping: same reason, context, object and user within a
//! minute).

use crate::resp::Reply;
use std::collections::VecDeque;

/// Where the refused command ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogContext {
    /// Sent by the client.
    TopLevel,
    /// Queued in, or run by, a transaction.
    Multi,
}

/// What was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogReason {
    /// A command.
    Command,
    /// A key.
    Key,
    /// A login.
    Auth,
}

/// One refusal (or several alike).
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    /// How many times.
    pub count: u64,
    /// What was refused.
    pub reason: LogReason,
    /// Where.
    pub context: LogContext,
    /// The command's full name, the key, or for a login the command (AUTH).
    pub object: Vec<u8>,
    /// The user refused (for a login, the name tried).
    pub username: Vec<u8>,
    /// When, in Unix ms (the latest of a group).
    pub at_ms: u64,
    /// The client, as CLIENT INFO prints it.
    pub client_info: String,
}

/// Refusals within this long of each other, alike, are counted as one.
const GROUPING_MS: u64 = 60_000;
/// How many of the newest entries a new one is compared with.
const GROUPING_SCAN: usize = 10;

impl LogEntry {
    fn alike(&self, other: &LogEntry) -> bool {
        self.reason == other.reason
            && self.context == other.context
            && self.at_ms.abs_diff(other.at_ms) <= GROUPING_MS
            && self.object == other.object
            && self.username == other.username
    }

    /// ACL LOG's map of the entry at `now_ms`.
    pub fn reply(&self, now_ms: u64) -> Reply {
        let bulk = |s: &[u8]| Reply::Bulk(s.to_vec());
        let reason: &[u8] = match self.reason {
            LogReason::Command => b"command",
            LogReason::Key => b"key",
            LogReason::Auth => b"auth",
        };
        let context: &[u8] = match self.context {
            LogContext::TopLevel => b"toplevel",
            LogContext::Multi => b"multi",
        };
        let age_s = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        Reply::Map(vec![
            (bulk(b"count"), Reply::Integer(self.count as i64)),
            (bulk(b"reason"), bulk(reason)),
            (bulk(b"context"), bulk(context)),
            (bulk(b"object"), bulk(&self.object)),
            (bulk(b"username"), bulk(&self.username)),
            (bulk(b"age-seconds"), Reply::Double(format_g17(age_s))),
            (bulk(b"client-info"), bulk(self.client_info.as_bytes())),
        ])
    }
}

/// A double as Redis's `%.17g` prints it, for the small non-negative
/// values ACL LOG has (ages in seconds).
fn format_g17(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let exponent = v.abs().log10().floor() as i32;
    if !(-5..17).contains(&exponent) {
        let s = format!("{:.16e}", v);
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        );
    }
    let decimals = (16 - exponent).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The newest entries first, at most [`super::LOG_MAX_ENTRIES`].
#[derive(Debug, Default)]
pub(super) struct Log {
    entries: VecDeque<LogEntry>,
}

impl Log {
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: found"
    )]
    pub(super) fn add(&mut self, entry: LogEntry) {
        let found = self
            .entries
            .iter()
            .take(GROUPING_SCAN)
            .position(|e| e.alike(&entry));
        if let Some(at) = found {
            let mut same = self.entries.remove(at).expect("found");
            same.count += 1;
            same.at_ms = entry.at_ms;
            same.client_info = entry.client_info;
            self.entries.push_front(same);
            return;
        }
        self.entries.push_front(entry);
        self.entries.truncate(super::LOG_MAX_ENTRIES);
    }

    pub(super) fn newest(&self, count: usize) -> Vec<LogEntry> {
        self.entries.iter().take(count).cloned().collect()
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::format_g17;

    #[test]
    fn ages_print_as_redis_prints_doubles() {
        assert_eq!(format_g17(0.0), "0");
        assert_eq!(format_g17(1.5), "1.5");
        assert_eq!(format_g17(0.123), "0.123");
        assert_eq!(format_g17(12.0), "12");
        assert_eq!(format_g17(0.001), "0.001");
    }
}
