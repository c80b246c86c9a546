//! XINFO STREAM (with FULL), GROUPS and CONSUMERS.

use super::{id_reply, no_such_group, sub_syntax};
use crate::commands::streams::{entries_reply, entry_reply, MAX_ID};
use crate::commands::*;
use sluice_redis::stream;
use sluice_redis::stream_group::{self as groups, Nack};
use sluice_redis::{Collection, StreamId, StreamMeta};

const XINFO_HELP: &[&str] = &[
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
];

pub(in crate::commands) fn xinfo(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let arities = [("consumers", 4), ("groups", 3), ("stream", -3), ("help", 2)];
    let sub = subcommand("XINFO", args, &arities)?;
    if sub == b"help" {
        return Ok(help_reply(XINFO_HELP));
    }
    let key = &args[2][..];
    let Some((c, meta)) = stream::get(ctx, key)? else {
        return Err(fail("ERR no such key"));
    };
    let name = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    match &sub[..] {
        b"groups" => {
            let mut out = Vec::new();
            for (group, g) in groups::groups(ctx, c)? {
                let consumers = groups::consumers(ctx, c, &group)?.len() as i64;
                let pending = groups::pending(ctx, c, &group, StreamId::default(), MAX_ID, false)
                    .count() as i64;
                let optional = |v: Option<u64>| v.map_or(Reply::Null, |n| int(n as i64));
                out.push(Reply::Map(vec![
                    (name("name"), Reply::Bulk(group.clone())),
                    (name("consumers"), int(consumers)),
                    (name("pending"), int(pending)),
                    (name("last-delivered-id"), id_reply(g.last)),
                    (name("entries-read"), optional(g.entries_read)),
                    (name("lag"), optional(groups::lag(&meta, c.len, &g))),
                ]));
            }
            Ok(Reply::Array(out))
        }
        b"consumers" => {
            let group = &args[3][..];
            if groups::group(ctx, c, group)?.is_none() {
                return Err(no_such_group(group, key));
            }
            let mut pending: std::collections::HashMap<Vec<u8>, i64> = Default::default();
            for item in groups::pending(ctx, c, group, StreamId::default(), MAX_ID, false) {
                *pending.entry(item?.1.consumer).or_default() += 1;
            }
            let now = ctx.now_ms() as i64;
            let mut out = Vec::new();
            for (consumer, seen) in groups::consumers(ctx, c, group)? {
                out.push(Reply::Map(vec![
                    (name("name"), Reply::Bulk(consumer.clone())),
                    (
                        name("pending"),
                        int(pending.get(&consumer).copied().unwrap_or(0)),
                    ),
                    (name("idle"), int((now - seen.seen_ms as i64).max(0))),
                ]));
            }
            Ok(Reply::Array(out))
        }
        _ => stream_info(ctx, c, meta, args),
    }
}

/// XINFO STREAM key [FULL [COUNT n]]. `radix-tree-keys` and
/// `radix-tree-nodes` count Redis's memory layout, which Sluice does not
/// have: both are the nodes of `stream-node-max-entries` entries the
/// stream's entries would fill there.
fn stream_info(ctx: &Ctx<'_>, c: Collection, meta: StreamMeta, args: &Args) -> Outcome {
    let options = &args[3..];
    let full = !options.is_empty();
    let mut count = 10u64;
    if full {
        let full_word = options[0].eq_ignore_ascii_case(b"full");
        let count_ok = options.len() == 1 || options[1].eq_ignore_ascii_case(b"count");
        if !(options.len() == 1 || options.len() == 3) || !full_word || !count_ok {
            return Err(sub_syntax("XINFO", &args[1]));
        }
        if options.len() == 3 {
            count = match parse_i64(&options[2])? {
                n if n < 0 => 10,
                n => n as u64,
            };
        }
    }
    let name = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let node_entries = ctx
        .db()
        .settings
        .stream_node_entries
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(1);
    let nodes = int(c.len.div_ceil(node_entries) as i64);
    let mut map = vec![
        (name("length"), int(c.len as i64)),
        (name("radix-tree-keys"), nodes.clone()),
        (name("radix-tree-nodes"), nodes),
        (name("last-generated-id"), id_reply(meta.last)),
        (name("max-deleted-entry-id"), id_reply(meta.max_deleted)),
        (name("entries-added"), int(meta.added as i64)),
        (name("recorded-first-entry-id"), id_reply(meta.first)),
    ];
    let all = |rev: bool, n: u64| stream::range(ctx, c, StreamId::default(), MAX_ID, n, rev);
    if !full {
        let edge = |rev: bool| -> Result<Reply, Failure> {
            Ok(all(rev, 1)?
                .pop()
                .map_or(Reply::Null, |(id, fields)| entry_reply(id, fields)))
        };
        map.push((name("groups"), int(groups::groups(ctx, c)?.len() as i64)));
        map.push((name("first-entry"), edge(false)?));
        map.push((name("last-entry"), edge(true)?));
        return Ok(Reply::Map(map));
    }
    map.push((name("entries"), entries_reply(all(false, count)?)));
    let limit = if count == 0 { u64::MAX } else { count };
    let mut group_replies = Vec::new();
    for (group, g) in groups::groups(ctx, c)? {
        let pel: Vec<(StreamId, Nack)> =
            groups::pending(ctx, c, &group, StreamId::default(), MAX_ID, false)
                .collect::<Result<_, _>>()?;
        let optional = |v: Option<u64>| v.map_or(Reply::Null, |n| int(n as i64));
        let pending = pel
            .iter()
            .take(limit as usize)
            .map(|(id, n)| {
                Reply::Array(vec![
                    id_reply(*id),
                    Reply::Bulk(n.consumer.clone()),
                    int(n.delivered_ms as i64),
                    int(n.deliveries as i64),
                ])
            })
            .collect();
        let mut consumers = Vec::new();
        for (consumer, seen) in groups::consumers(ctx, c, &group)? {
            let own: Vec<&(StreamId, Nack)> =
                pel.iter().filter(|(_, n)| n.consumer == consumer).collect();
            let own_pending = own
                .iter()
                .take(limit as usize)
                .map(|(id, n)| {
                    Reply::Array(vec![
                        id_reply(*id),
                        int(n.delivered_ms as i64),
                        int(n.deliveries as i64),
                    ])
                })
                .collect();
            consumers.push(Reply::Map(vec![
                (name("name"), Reply::Bulk(consumer)),
                (name("seen-time"), int(seen.seen_ms as i64)),
                (name("pel-count"), int(own.len() as i64)),
                (name("pending"), Reply::Array(own_pending)),
            ]));
        }
        group_replies.push(Reply::Map(vec![
            (name("name"), Reply::Bulk(group)),
            (name("last-delivered-id"), id_reply(g.last)),
            (name("entries-read"), optional(g.entries_read)),
            (name("lag"), optional(groups::lag(&meta, c.len, &g))),
            (name("pel-count"), int(pel.len() as i64)),
            (name("pending"), Reply::Array(pending)),
            (name("consumers"), Reply::Array(consumers)),
        ]));
    }
    map.push((name("groups"), Reply::Array(group_replies)));
    Ok(Reply::Map(map))
}
