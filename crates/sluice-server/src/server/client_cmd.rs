//! CLIENT and its subcommands: a connection's name, info and reply mode,
//! the list of connections, KILL, UNBLOCK, PAUSE's counterpart and
//! client-side caching (TRACKING, CACHING, TRACKINGINFO).

use super::conn::Conn;
use super::Shared;
use crate::acl;
use crate::commands;
use crate::resp::{Args, Reply};
use std::sync::atomic::Ordering;

/// CLIENT LIST, INFO, KILL, SETINFO, UNBLOCK and REPLY (the session
/// answers ID, GETNAME and SETNAME); None: a subcommand for the session;
/// Some(None): no reply (CLIENT REPLY OFF and SKIP).
pub(super) fn client(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<Option<Reply>> {
    let sub = args.get(1)?.to_ascii_lowercase();
    let arity: i32 = match &sub[..] {
        b"list" => -2,
        b"info" => 2,
        b"kill" => -3,
        b"setinfo" => 4,
        b"unblock" => -3,
        b"reply" => 3,
        b"no-evict" => 3,
        b"tracking" => -3,
        b"caching" => 3,
        b"pause" => -3,
        b"unpause" => 2,
        b"getredir" => 2,
        b"trackinginfo" => 2,
        _ => return None,
    };
    if !commands::arity_ok(arity, args.len()) {
        return Some(Some(commands::wrong_arity(&format!(
            "client|{}",
            String::from_utf8_lossy(&sub)
        ))));
    }
    if let Some(noauth) = conn.session.check_auth() {
        return Some(Some(noauth));
    }
    let me = conn.session.id();
    Some(Some(match &sub[..] {
        b"list" => client_list(shared, conn, args),
        b"info" => match shared.registry.get(me) {
            Some(e) => Reply::Verbatim {
                format: *b"txt",
                text: client_line(shared, me, &e, conn, args).into_bytes(),
            },
            None => Reply::Null,
        },
        b"setinfo" => client_setinfo(shared, me, &args[2], &args[3]),
        b"unblock" => client_unblock(shared, args),
        b"reply" => return Some(client_reply(conn, &args[2])),
        // Sluice evicts no keys: every client is already never evicted.
        b"no-evict"
            if args[2].eq_ignore_ascii_case(b"on") || args[2].eq_ignore_ascii_case(b"off") =>
        {
            Reply::Simple("OK".into())
        }
        b"no-evict" => error("ERR syntax error"),
        // Redis's CLIENT PAUSE takes 3 or 4 arguments; past that it is
        // its "unknown subcommand" reply.
        b"pause" if args.len() > 4 => client_sub_syntax(args),
        b"pause" => super::pause::client_pause(shared, args),
        b"unpause" => {
            shared.pause.unpause();
            shared.wake_workers();
            Reply::Simple("OK".into())
        }
        b"tracking" => client_tracking(shared, conn, args),
        b"caching" => client_caching(shared, conn, &args[2]),
        b"getredir" => match shared.tracking.mode(me) {
            Some(mode) => Reply::Integer(mode.redirect as i64),
            None => Reply::Integer(-1),
        },
        b"trackinginfo" => client_trackinginfo(shared, conn),
        _ => client_kill(shared, me, args),
    }))
}

/// CLIENT TRACKING on|off [REDIRECT id] [BCAST] [PREFIX p]... [OPTIN]
/// [OPTOUT] [NOLOOP] (see [`super::tracking`]).
fn client_tracking(shared: &Shared, conn: &mut Conn, args: &Args) -> Reply {
    let me = conn.session.id();
    let on = match args[2].to_ascii_lowercase().as_slice() {
        b"on" => true,
        b"off" => false,
        _ => {
            // Redis checks the options first: their errors come first.
            return match super::tracking::parse_mode(shared, None, &args[3..], false) {
                Err(e) => error(&e),
                Ok(_) => error("ERR syntax error"),
            };
        }
    };
    let now = shared.tracking.mode(me);
    let mode = match super::tracking::parse_mode(shared, now.as_ref(), &args[3..], on) {
        Ok(mode) => mode,
        Err(e) => return error(&e),
    };
    set_tracking(shared, conn, on.then_some(mode));
    Reply::Simple("OK".into())
}

/// Turns `conn`'s tracking to `mode` (None: off).
pub(super) fn set_tracking(shared: &Shared, conn: &mut Conn, mode: Option<super::tracking::Mode>) {
    let me = conn.session.id();
    match mode {
        Some(mode) => {
            shared.tracking.enable(me, mode);
            conn.tracking = true;
        }
        None if conn.tracking => {
            shared.tracking.disable(me);
            conn.tracking = false;
            conn.tracking_caching = false;
        }
        None => {}
    }
    shared.refresh_change_recording();
}

/// CLIENT CACHING yes|no: whether the next command's keys are tracked
/// (OPTIN: only with yes; OPTOUT: not with no).
fn client_caching(shared: &Shared, conn: &mut Conn, option: &[u8]) -> Reply {
    let Some(mode) = conn
        .tracking
        .then(|| shared.tracking.mode(conn.session.id()))
        .flatten()
    else {
        return error("ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled");
    };
    match option.to_ascii_lowercase().as_slice() {
        b"yes" if mode.optin => conn.tracking_caching = true,
        b"yes" => {
            return error(
                "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
            )
        }
        b"no" if mode.optout => conn.tracking_caching = true,
        b"no" => {
            return error(
                "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
            )
        }
        _ => return error("ERR syntax error"),
    }
    Reply::Simple("OK".into())
}

/// CLIENT TRACKINGINFO: flags, redirect and prefixes, as Redis answers.
fn client_trackinginfo(shared: &Shared, conn: &Conn) -> Reply {
    let bulk = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let mode = shared.tracking.mode(conn.session.id());
    let mut flags = vec![bulk(if mode.is_some() { "on" } else { "off" })];
    let mut redirect = -1;
    let mut prefixes = Vec::new();
    if let Some(m) = &mode {
        let caching = conn.tracking_caching;
        for (set, name) in [
            (m.bcast, "bcast"),
            (m.optin, "optin"),
            (m.optin && caching, "caching-yes"),
            (m.optout, "optout"),
            (m.optout && caching, "caching-no"),
            (m.noloop, "noloop"),
            (m.broken, "broken_redirect"),
        ] {
            if set {
                flags.push(bulk(name));
            }
        }
        redirect = m.redirect as i64;
        prefixes = m.prefixes.iter().map(|p| Reply::Bulk(p.clone())).collect();
    }
    Reply::Map(vec![
        (bulk("flags"), Reply::Set(flags)),
        (bulk("redirect"), Reply::Integer(redirect)),
        (bulk("prefixes"), Reply::Array(prefixes)),
    ])
}

/// One client's line, with Redis 7.0's fields in its order (and 7.2's
/// lib-name and lib-ver after them). Buffers are Sluice's: the caller's
/// `qbuf` is its request and what follows it, `argv-mem` its arguments'
/// bytes, `obl` and `omem` the replies waiting; for other clients, whose
/// buffers belong to other threads, those read 0 (a worker takes in and
/// runs everything a turn received). `redir` is the tracking redirect.
pub(super) fn client_line(
    shared: &Shared,
    id: u64,
    e: &super::ClientEntry,
    me: &Conn,
    args: &[Vec<u8>],
) -> String {
    let mine = id == me.session.id();
    let resp = if mine && me.session.protocol() == crate::resp::Protocol::Resp3 {
        3
    } else {
        2
    };
    let live = &e.live;
    let idle_s =
        super::now_ms().saturating_sub(live.last_interaction_ms.load(Ordering::Relaxed)) / 1000;
    let cmd = match live.last_command.load(Ordering::Relaxed) {
        0 => "NULL",
        n => acl::name_of(n as usize - 1),
    };
    let (qbuf, argv_mem, obl, multi_mem) = if mine {
        let request: usize = args.iter().map(|a| a.len()).sum();
        let framed: usize = 3
            + digits(args.len())
            + args
                .iter()
                .map(|a| 5 + digits(a.len()) + a.len())
                .sum::<usize>();
        let queued: usize = me
            .tx
            .as_ref()
            .map_or(0, |tx| tx.queued.iter().flatten().map(Vec::len).sum());
        (
            framed + me.reader.pending_bytes(),
            request,
            me.out.len(),
            queued,
        )
    } else {
        (0, 0, 0, 0)
    };
    let redir = shared.tracking.mode(id).map_or(-1, |m| m.redirect as i64);
    format!(
        "id={id} addr={} laddr={} fd={} name={} age={} idle={idle_s} flags={} db={} sub={} psub={} ssub={} multi={} qbuf={qbuf} qbuf-free=0 argv-mem={argv_mem} multi-mem={multi_mem} rbs=16384 rbp=0 obl={obl} oll=0 omem=0 tot-mem={} events=r cmd={cmd} user={} redir={redir} resp={resp} lib-name={} lib-ver={}\n",
        e.addr,
        e.laddr,
        live.fd,
        String::from_utf8_lossy(&e.name),
        e.created.elapsed().as_secs(),
        live.flag_letters(),
        e.db,
        live.channels.load(Ordering::Relaxed),
        live.patterns.load(Ordering::Relaxed),
        live.shard_channels.load(Ordering::Relaxed),
        live.multi.load(Ordering::Relaxed),
        qbuf + argv_mem + obl + multi_mem + 16384,
        String::from_utf8_lossy(&e.user),
        String::from_utf8_lossy(&e.lib_name),
        String::from_utf8_lossy(&e.lib_ver),
    )
}

/// Decimal digits of `n`.
fn digits(n: usize) -> usize {
    n.to_string().len()
}

fn client_list(shared: &Shared, conn: &Conn, args: &Args) -> Reply {
    let mut ids: Option<Vec<u64>> = None;
    let mut j = 2;
    while j < args.len() {
        let option = args[j].to_ascii_lowercase();
        if option == b"type" && j + 1 < args.len() {
            let kind = args[j + 1].to_ascii_lowercase();
            if !matches!(&kind[..], b"normal" | b"master" | b"replica" | b"pubsub") {
                return error(&format!(
                    "ERR Unknown client type '{}'",
                    String::from_utf8_lossy(&args[j + 1])
                ));
            }
            if kind != b"normal" {
                ids = Some(Vec::new());
            }
            j += 2;
        } else if option == b"id" && j + 1 < args.len() {
            let mut wanted = Vec::new();
            for a in &args[j + 1..] {
                match crate::resp::string_to_i64(a) {
                    Some(n) if n > 0 => wanted.push(n as u64),
                    _ => return error("ERR Invalid client ID"),
                }
            }
            ids = Some(wanted);
            j = args.len();
        } else {
            return error("ERR syntax error");
        }
    }
    let text: String = shared
        .registry
        .list()
        .into_iter()
        .filter(|(id, _)| ids.as_ref().is_none_or(|w| w.contains(id)))
        .map(|(id, e)| client_line(shared, id, &e, conn, args))
        .collect();
    Reply::Verbatim {
        format: *b"txt",
        text: text.into_bytes(),
    }
}

/// CLIENT REPLY ON|OFF|SKIP: ON answers OK; OFF and SKIP answer nothing
/// (SKIP silences the next command's reply only).
fn client_reply(conn: &mut Conn, mode: &[u8]) -> Option<Reply> {
    use super::conn::Replies;
    let mode = mode.to_ascii_lowercase();
    match &mode[..] {
        b"on" => {
            conn.replies = Replies::On;
            Some(Reply::Simple("OK".into()))
        }
        b"off" => {
            conn.replies = Replies::Off;
            None
        }
        b"skip" if conn.replies != Replies::Off => {
            conn.replies = Replies::SkipNext;
            None
        }
        b"skip" => None,
        _ => Some(error("ERR syntax error")),
    }
}

fn client_setinfo(shared: &Shared, me: u64, attr: &[u8], value: &[u8]) -> Reply {
    let attr = attr.to_ascii_lowercase();
    if !value.iter().all(|&c| (b'!'..=b'~').contains(&c)) {
        return error(&format!(
            "ERR {} cannot contain spaces, newlines or special characters.",
            String::from_utf8_lossy(&attr)
        ));
    }
    let value = value.to_vec();
    match &attr[..] {
        b"lib-name" => shared.registry.update(me, |e| e.lib_name = value),
        b"lib-ver" => shared.registry.update(me, |e| e.lib_ver = value),
        _ => {
            return error(&format!(
                "ERR Unrecognized option '{}'",
                String::from_utf8_lossy(&attr)
            ))
        }
    }
    Reply::Simple("OK".into())
}

/// CLIENT KILL addr:port (old form: OK or an error) and CLIENT KILL
/// <ID id | ADDR addr | LADDR addr | USER name | SKIPME yes/no>... (the
/// number closed).
/// Redis's reply to a CLIENT subcommand given more arguments than its
/// own check takes (its `addReplySubcommandSyntaxError`).
fn client_sub_syntax(args: &Args) -> Reply {
    error(&format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
        String::from_utf8_lossy(&args[1])
    ))
}

/// CLIENT UNBLOCK id [TIMEOUT|ERROR]: 1 when client `id` was blocked
/// (its worker answers it as a timeout, or with Redis's UNBLOCKED error).
fn client_unblock(shared: &Shared, args: &Args) -> Reply {
    if args.len() > 4 {
        return client_sub_syntax(args);
    }
    let Some(id) = crate::resp::string_to_i64(&args[2]) else {
        return error("ERR value is not an integer or out of range");
    };
    let error_reply = match args.get(3).map(|a| a.to_ascii_lowercase()) {
        None => false,
        Some(m) if m == b"timeout" => false,
        Some(m) if m == b"error" => true,
        Some(_) => return error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
    };
    let unblocked = u64::try_from(id).is_ok_and(|id| shared.blocking.unblock(id, error_reply));
    Reply::Integer(i64::from(unblocked))
}

fn client_kill(shared: &Shared, me: u64, args: &Args) -> Reply {
    if args.len() == 3 {
        let addr = String::from_utf8_lossy(&args[2]).into_owned();
        return match shared.registry.kill(|_, e| e.addr == addr) {
            0 => error("ERR No such client"),
            _ => Reply::Simple("OK".into()),
        };
    }
    let (mut id, mut addr, mut laddr, mut user, mut skipme) = (None, None, None, None, true);
    // TYPE: None (any), or whether the clients killed are subscribers;
    // Sluice has no master or replica connections, so those kill none.
    let mut kind: Option<Option<bool>> = None;
    let mut j = 2;
    while j < args.len() {
        let Some(value) = args.get(j + 1) else {
            return error("ERR syntax error");
        };
        let text = String::from_utf8_lossy(value).into_owned();
        match &args[j].to_ascii_lowercase()[..] {
            b"id" => match crate::resp::string_to_i64(value) {
                Some(n) if n > 0 => id = Some(n as u64),
                _ => return error("ERR client-id should be greater than 0"),
            },
            b"addr" => addr = Some(text),
            b"laddr" => laddr = Some(text),
            b"type" => {
                kind = Some(match &value.to_ascii_lowercase()[..] {
                    b"normal" => Some(false),
                    b"pubsub" => Some(true),
                    b"master" | b"replica" | b"slave" => None,
                    _ => return error(&format!("ERR Unknown client type '{text}'")),
                })
            }
            b"user" if shared.config.users.get(value).is_none() => {
                return error(&format!("ERR No such user '{text}'"))
            }
            b"user" => user = Some(value.clone()),
            b"skipme" => match &value.to_ascii_lowercase()[..] {
                b"yes" => skipme = true,
                b"no" => skipme = false,
                _ => return error("ERR syntax error"),
            },
            _ => return error("ERR syntax error"),
        }
        j += 2;
    }
    if kind == Some(None) {
        return Reply::Integer(0);
    }
    let subscribed = match kind {
        Some(Some(_)) => shared.pubsub.subscribed_clients(),
        _ => Default::default(),
    };
    let killed = shared.registry.kill(|cid, e| {
        id.is_none_or(|want| want == cid)
            && kind.is_none_or(|k| k == Some(subscribed.contains(&cid)))
            && addr.as_ref().is_none_or(|a| *a == e.addr)
            && laddr.as_ref().is_none_or(|a| *a == e.laddr)
            && user.as_ref().is_none_or(|u| *u == e.user)
            && !(skipme && cid == me)
    });
    Reply::Integer(killed as i64)
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}
