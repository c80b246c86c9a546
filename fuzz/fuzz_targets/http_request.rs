//! The HTTP API's request reader (`sluice_http::wire`): any bytes end in a
//! request or an error, never a panic; a body never passes the limit; and
//! the answer does not depend on how the bytes arrive (a reader that takes
//! one byte at a time frames the same request as one that takes them all).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::wire::{read_request, Request, WireError};
use std::io::{BufReader, Read};

const MAX_BODY: usize = 1 << 16;

/// Hands out at most one byte per read.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some((&b, rest)) = self.0.split_first() else {
            return Ok(0);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        buf[0] = b;
        self.0 = rest;
        Ok(1)
    }
}

fn outcome(r: Result<Option<Request>, WireError>) -> Option<(String, String, Vec<u8>)> {
    match r {
        Ok(Some(req)) => {
            assert!(req.body.len() <= MAX_BODY, "a body past the limit");
            Some((req.method, req.path, req.body))
        }
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = outcome(read_request(&mut BufReader::new(data), MAX_BODY));
    let trickled = outcome(read_request(
        &mut BufReader::with_capacity(1, Trickle(data)),
        MAX_BODY,
    ));
    assert_eq!(whole, trickled);
});
