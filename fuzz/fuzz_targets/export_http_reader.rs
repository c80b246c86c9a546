//! The exporter's own HTTP reader (`sluice_paginate::plain`), its chunked
//! bodies: any bytes end in a body or an error, never a panic or an
//! allocation past the limit; an accepted body never passes the limit, and
//! encoding it chunked again reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_paginate::plain::fuzz_read_chunked;

const MAX: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let mut reader = std::io::Cursor::new(data);
    if let Ok(body) = fuzz_read_chunked(&mut reader, MAX) {
        assert!(body.len() <= MAX);
        let mut again = Vec::new();
        for chunk in body.chunks(4096) {
            again.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            again.extend_from_slice(chunk);
            again.extend_from_slice(b"\r\n");
        }
        again.extend_from_slice(b"0\r\n\r\n");
        let back = fuzz_read_chunked(&mut std::io::Cursor::new(&again[..]), MAX).expect("a body re-encoded reads");
        assert_eq!(back, body);
    }
});
