//! CONFIG GET, SET, REWRITE and RESETSTAT: Redis's parameters (the
//! tunables) and the settings `sluice serve` has flags for.

use super::Shared;
use crate::commands;
use crate::resp::{Args, Reply};
use std::sync::atomic::Ordering;

pub(super) fn config(shared: &Shared, args: &Args) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match &sub[..] {
        b"get" if args.len() >= 3 => config_get(shared, args),
        b"get" => commands::wrong_arity("config|get"),
        b"set" if args.len() >= 4 && args.len().is_multiple_of(2) => config_set(shared, args),
        b"set" => commands::wrong_arity("config|set"),
        // Without `--config`, Redis's answer when it runs without a file.
        b"rewrite" if args.len() == 2 => config_rewrite(shared),
        b"rewrite" => commands::wrong_arity("config|rewrite"),
        b"resetstat" => {
            shared.stats.errors.reset();
            // A worker counting meanwhile may write back its count from
            // before: a reset is as good as Redis's, not atomic.
            for c in shared
                .stats
                .by_worker
                .iter()
                .flat_map(|w| w.commands.iter())
            {
                for counter in [&c.calls, &c.usec, &c.rejected, &c.failed] {
                    counter.store(0, Ordering::Relaxed);
                }
            }
            for bucket in shared
                .stats
                .by_worker
                .iter()
                .flat_map(|w| w.latency_buckets.iter())
            {
                bucket.store(0, Ordering::Relaxed);
            }
            Reply::Simple("OK".into())
        }
        _ => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// CONFIG GET: a name without `*`, `?` or `[` is looked up (in any case)
/// and answered under the name as given; a pattern is matched against
/// every name and alias, as Redis 7.0 does.
fn config_get(shared: &Shared, args: &Args) -> Reply {
    let mut all = settings(shared);
    all.extend(shared.tunables.all());
    let mut out: Vec<(Vec<u8>, String)> = Vec::new();
    for pattern in &args[2..] {
        if !pattern.iter().any(|b| b"*?[".contains(b)) {
            let found = all
                .iter()
                .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(pattern));
            if let Some((_, value)) = found {
                if !out.iter().any(|(n, _)| n == pattern) {
                    out.push((pattern.to_vec(), value.clone()));
                }
            }
            continue;
        }
        let pattern = pattern.to_ascii_lowercase();
        for (name, value) in &all {
            let seen = out.iter().any(|(n, _)| n == name.as_bytes());
            let hidden = super::tunables::HIDDEN.contains(name);
            if !seen && !hidden && commands::glob_match(&pattern, name.as_bytes()) {
                out.push((name.as_bytes().to_vec(), value.clone()));
            }
        }
    }
    Reply::Map(
        out.into_iter()
            .map(|(n, v)| (Reply::Bulk(n), Reply::Bulk(v.into_bytes())))
            .collect(),
    )
}

/// CONFIG SET for the settings that can change while serving: `timeout`,
/// `maxclients`, `protected-mode` and `requirepass` (the default user's
/// password, as in Redis: empty for none), and Redis's tuning parameters
/// ([`super::tunables`]). All pairs are checked before any is applied.
/// CONFIG REWRITE: the tunables that differ from their defaults and the
/// settings CONFIG SET changed, handed to the front end's writer.
fn config_rewrite(shared: &Shared) -> Reply {
    let Some(rewrite) = &shared.config.rewrite else {
        return error("ERR The server is running without a config file");
    };
    let mut kept = shared.tunables.changed();
    let settings = shared
        .set_settings
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    kept.extend(settings);
    match (rewrite.0)(&kept) {
        Ok(()) => Reply::Simple("OK".into()),
        Err(why) => error(&format!("ERR Rewriting config file: {why}")),
    }
}

pub(super) fn config_set(shared: &Shared, args: &Args) -> Reply {
    let mut changes = Vec::new();
    let mut tuned = Vec::new();
    let mut requirepass = None;
    let mut names: Vec<&'static str> = Vec::new();
    for pair in args[2..].chunks(2) {
        let name = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
        if let Some(t) = super::tunables::Tunables::find(&name) {
            if names.contains(&t.name()) {
                return error(&format!(
                    "ERR CONFIG SET failed (possibly related to argument '{name}') - duplicate parameter"
                ));
            }
            names.push(t.name());
            match super::tunables::check(t, &pair[1]) {
                Ok(v) => tuned.push((t, v)),
                Err(why) => {
                    return error(&format!(
                        "ERR CONFIG SET failed (possibly related to argument '{}') - {why}",
                        t.called(&name)
                    ))
                }
            }
            continue;
        }
        if name == "requirepass" {
            requirepass = Some(pair[1].clone());
            continue;
        }
        match check_setting(shared, &name, &pair[1]) {
            Ok(Some(change)) => changes.push((name, change)),
            Ok(None) => {}
            Err(e) => return error(&e),
        }
    }
    if let Some(password) = requirepass {
        let rules = if password.is_empty() {
            vec![b"nopass".to_vec()]
        } else {
            let mut rule = b">".to_vec();
            rule.extend_from_slice(&password);
            vec![b"resetpass".to_vec(), rule]
        };
        if let Err(e) = shared.config.users.set_user(b"default", &rules) {
            return error(&format!(
                "ERR CONFIG SET failed (possibly related to argument 'requirepass') - {e}"
            ));
        }
    }
    for (t, value) in tuned {
        shared.tunables.set(&shared.db, t, value);
    }
    shared.refresh_change_recording();
    shared.tracking.limit(shared);
    {
        let mut kept = shared
            .set_settings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for pair in args[2..].chunks(2) {
            let name = String::from_utf8_lossy(&pair[0]).to_ascii_lowercase();
            if name != "requirepass" && super::tunables::Tunables::find(&name).is_none() {
                kept.insert(name, String::from_utf8_lossy(&pair[1]).into_owned());
            }
        }
    }
    for (name, value) in changes {
        match name.as_str() {
            "timeout" => shared.idle_timeout_secs.store(value, Ordering::Relaxed),
            "protected-mode" => shared.protected_mode.store(value == 1, Ordering::Relaxed),
            "appendfsync" => shared.set_durability(super::Durability::from_byte(value as u8)),
            "client-query-buffer-limit" => shared
                .max_query_bytes
                .store(value as usize, Ordering::Relaxed),
            _ => shared.max_clients.store(value as usize, Ordering::Relaxed),
        }
    }
    Reply::Simple("OK".into())
}

/// Redis's parameters that are fixed once a server runs.
const IMMUTABLE: &[&str] = &[
    "daemonize",
    "databases",
    "io-threads",
    "replicaof",
    "slaveof",
];

/// Checks CONFIG SET `name value` for one of the settings `sluice serve`
/// has flags for: the change to make (as a number), none when `value` is
/// what is in force, or Redis's error for it.
fn check_setting(shared: &Shared, name: &str, raw: &[u8]) -> Result<Option<u64>, String> {
    let failed = |why: &str| {
        format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
    };
    if IMMUTABLE.contains(&name) {
        return Err(failed("can't set immutable config"));
    }
    let value = crate::resp::string_to_i64(raw);
    match (name, value) {
        ("timeout" | "maxclients", Some(v)) if v >= 0 => Ok(Some(v as u64)),
        ("timeout" | "maxclients", _) => Err(failed("argument couldn't be parsed into an integer")),
        ("protected-mode", _) => match raw.to_ascii_lowercase().as_slice() {
            b"yes" => Ok(Some(1)),
            b"no" => Ok(Some(0)),
            _ => Err(failed("argument must be 'yes' or 'no'")),
        },
        ("appendfsync", _) => match raw.to_ascii_lowercase().as_slice() {
            b"always" => Ok(Some(super::Durability::Always.as_byte().into())),
            b"everysec" => Ok(Some(super::Durability::Everysec.as_byte().into())),
            b"no" => Ok(Some(super::Durability::None.as_byte().into())),
            _ => Err(failed(
                "argument(s) must be one of the following: everysec, always, no",
            )),
        },
        ("client-query-buffer-limit", _) => super::tunables::memory(raw, 1 << 20, i64::MAX)
            .map(|n| Some(n as u64))
            .map_err(|why| failed(&why)),
        (other, _) => {
            let now = settings(shared).into_iter().find(|(n, _)| *n == other);
            match now {
                Some((_, now)) if now.as_bytes() == raw => Ok(None),
                Some(_) if other == "port" => {
                    // Redis moves its listener; Sluice's workers keep theirs.
                    // A port in use is refused as Redis refuses it.
                    let port = value
                        .filter(|p| (0..=65535).contains(p))
                        .ok_or_else(|| failed("argument must be between 0 and 65535 inclusive"))?;
                    match std::net::TcpListener::bind((shared.resp_addr.ip(), port as u16)) {
                        Err(e) => Err(failed(&format!("Unable to listen on this port: {e}"))),
                        Ok(_) => Err(failed(
                            "Sluice sets it only at start: restart `sluice serve` with --resp",
                        )),
                    }
                }
                Some(_) => Err(failed(
                    "Sluice sets it only at start: restart `sluice serve` with its flag",
                )),
                None => Err(format!(
                    "ERR Unknown option or number of arguments for CONFIG SET - '{other}'"
                )),
            }
        }
    }
}

/// The settings CONFIG GET reports, by Redis's names.
fn settings(shared: &Shared) -> Vec<(&'static str, String)> {
    let c = &shared.config;
    let appendfsync = match shared.durability() {
        super::Durability::Always => "always",
        super::Durability::Everysec => "everysec",
        super::Durability::None => "no",
    };
    vec![
        ("appendfsync", appendfsync.into()),
        ("bind", shared.resp_addr.ip().to_string()),
        (
            "client-query-buffer-limit",
            shared.max_query_bytes.load(Ordering::Relaxed).to_string(),
        ),
        ("daemonize", "no".into()),
        ("databases", sluice_redis::DATABASES.to_string()),
        ("io-threads", c.threads.to_string()),
        (
            "maxclients",
            shared.max_clients.load(Ordering::Relaxed).to_string(),
        ),
        ("port", shared.resp_addr.port().to_string()),
        ("replicaof", String::new()),
        ("slaveof", String::new()),
        (
            "protected-mode",
            if shared.protected_mode.load(Ordering::Relaxed) {
                "yes"
            } else {
                "no"
            }
            .into(),
        ),
        ("proto-max-bulk-len", c.limits.bulk_max_bytes.to_string()),
        (
            "timeout",
            shared.idle_timeout_secs.load(Ordering::Relaxed).to_string(),
        ),
    ]
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}
