//! MONITOR: connections that see every command the server runs, as
//! Redis 7.0 shows them (`+<unix time>.<µs> [<db> <client address>]
//! "arg" ...`, `lua` for a script's commands, arguments quoted as Redis's
//! `sdscatrepr`, passwords redacted). A line goes to each monitor through
//! its worker's push queue, as pub/sub messages do. Commands Redis keeps
//! from monitors (administrative ones: CONFIG, ACL, SHUTDOWN...) are not
//! shown; EXEC shows `multi`, its commands, then `exec`.

use super::pubsub::PushQueue;
use crate::resp::Reply;
use sluice_io::net::ConnId;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The monitoring connections.
#[derive(Default)]
pub struct Monitors {
    /// How many there are (every command looks at this first).
    count: AtomicUsize,
    list: Mutex<Vec<Monitor>>,
}

struct Monitor {
    client: u64,
    slot: ConnId,
    queue: Arc<PushQueue>,
}

impl Monitors {
    /// Whether any connection monitors.
    pub(super) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Adds connection `client` (at `slot` of the worker of `queue`).
    pub(super) fn add(&self, client: u64, slot: ConnId, queue: Arc<PushQueue>) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|m| m.client == client) {
            return;
        }
        list.push(Monitor {
            client,
            slot,
            queue,
        });
        self.count.store(list.len(), Ordering::Relaxed);
    }

    /// Whether connection `client` monitors.
    pub(super) fn has(&self, client: u64) -> bool {
        self.any()
            && self
                .list
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|m| m.client == client)
    }

    /// Takes connection `client` out (RESET, its close).
    pub(super) fn remove(&self, client: u64) {
        if !self.any() {
            return;
        }
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|m| m.client != client);
        self.count.store(list.len(), Ordering::Relaxed);
    }

    /// Shows `args`, run by the client at `addr` (`lua` for a script), to
    /// every monitor but `from` (a monitor sees no command of its own).
    pub(super) fn feed(&self, from: u64, addr: &str, args: &[Vec<u8>]) {
        if !self.any() || !shown(args) {
            return;
        }
        let line = Reply::Simple(line(addr, args));
        let list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        for m in list.iter().filter(|m| m.client != from) {
            m.queue.post((
                m.slot,
                m.client,
                super::tracking::Push::Message(line.clone()),
            ));
        }
    }
}

/// Whether Redis shows `args` to monitors: not its administrative
/// commands, nor those it marks to skip (EXEC, EVAL and FCALL are shown
/// by their own code, around what they run).
fn shown(args: &[Vec<u8>]) -> bool {
    let Some(id) = crate::acl::resolve(args) else {
        return true;
    };
    let name = crate::acl::name_of(id);
    let skipped = name.starts_with("config")
        || name.starts_with("acl")
        || name.starts_with("client|kill")
        || matches!(name, "shutdown" | "monitor" | "save" | "bgsave");
    !skipped
}

/// One monitor line (without the `+` and line end a simple string gets).
fn line(addr: &str, args: &[Vec<u8>]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut out = format!("{}.{:06} [0 {addr}]", now.as_secs(), now.subsec_micros());
    for (i, arg) in args.iter().enumerate() {
        out.push(' ');
        if redacted(args, i) {
            out.push_str("\"(redacted)\"");
        } else {
            quote(arg, &mut out);
        }
    }
    out
}

/// Whether argument `i` is a password or user name Redis hides: all of
/// AUTH's, HELLO's after AUTH, MIGRATE's after AUTH or AUTH2.
fn redacted(args: &[Vec<u8>], i: usize) -> bool {
    let name = args[0].to_ascii_lowercase();
    let after = |word: &[u8], count: usize| {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case(word))
            .is_some_and(|at| i > at && i <= at + count)
    };
    match &name[..] {
        b"auth" => i > 0,
        b"hello" => after(b"auth", 2),
        b"migrate" => after(b"auth", 1) || after(b"auth2", 2),
        _ => false,
    }
}

/// `arg` in double quotes, escaped as Redis's `sdscatrepr` escapes it.
fn quote(arg: &[u8], out: &mut String) {
    out.push('"');
    for &b in arg {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            7 => out.push_str("\\a"),
            8 => out.push_str("\\b"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_and_passwords_redacted_as_redis_does() {
        let args = |a: &[&str]| a.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let mut out = String::new();
        quote(b"a\"b\\\n\x01\xff", &mut out);
        assert_eq!(out, "\"a\\\"b\\\\\\n\\x01\\xff\"");
        let l = line("lua", &args(&["AUTH", "user", "secret"]));
        assert!(
            l.ends_with("[0 lua] \"AUTH\" \"(redacted)\" \"(redacted)\""),
            "{l}"
        );
        let l = line("1.2.3.4:5", &args(&["hello", "2", "AUTH", "u", "p"]));
        assert!(
            l.ends_with("\"hello\" \"2\" \"AUTH\" \"(redacted)\" \"(redacted)\""),
            "{l}"
        );
        assert!(!shown(&args(&["CONFIG", "SET", "a", "b"])));
        assert!(shown(&args(&["GET", "k"])));
    }
}
