//! Server commands that need only the clock.

use super::*;

pub(super) fn time(_ctx: &mut Ctx<'_>, _args: &Args) -> Outcome {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(Reply::Array(vec![
        Reply::Bulk(now.as_secs().to_string().into_bytes()),
        Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
    ]))
}

/// LASTSAVE: every acknowledged write is on the device when its reply is
/// sent (or within the durability mode's window), so the last "save" is
/// now, to the second.
pub(super) fn lastsave(ctx: &mut Ctx<'_>, _args: &Args) -> Outcome {
    Ok(int((ctx.now_ms() / 1000) as i64))
}
