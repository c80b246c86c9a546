//! The server's request reader: any bytes, fed in any pieces, frame into
//! requests or end in a protocol error, never a panic; and feeding them
//! whole or in two pieces frames the same requests when neither ends in an
//! error (the limits on a line still waiting for its end, as in Redis,
//! depend on how much of it has arrived).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_server::resp::{Limits, RequestReader};

fn frame(pieces: &[&[u8]], unauthenticated: bool) -> (Vec<Vec<Vec<u8>>>, Option<String>) {
    let mut reader = RequestReader::new(Limits {
        inline_max_bytes: 64,
        bulk_max_bytes: 1 << 16,
    });
    let mut out = Vec::new();
    for piece in pieces {
        reader.feed(piece);
        loop {
            match reader.next(unauthenticated) {
                Ok(Some(args)) => {
                    assert!(!args.is_empty(), "an empty request was handed out");
                    out.push(args);
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e.0)),
            }
        }
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let unauthenticated = flags & 1 == 1;
    let cut = (flags as usize >> 1) % (bytes.len() + 1);
    let whole = frame(&[bytes], unauthenticated);
    let split = frame(&[&bytes[..cut], &bytes[cut..]], unauthenticated);
    if whole.1.is_none() && split.1.is_none() {
        assert_eq!(whole.0, split.0, "cut at {cut}");
    }
});
