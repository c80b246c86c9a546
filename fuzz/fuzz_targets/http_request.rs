//! The HTTP API's request reader (`sluice_http::wire`): any bytes end in a
//! request or an error, never a panic; a body never passes the limit; and
//! the answer does not depend on how the bytes arrive (a reader that takes
//! one byte at a time frames the same request as one that takes them all).
//! The event loop's framing (`sluice_http::framing`, which finds a whole
//! request in the bytes buffered so far) gives the same request, and says
//! "incomplete" for no prefix of a request it then frames differently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::framing;
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

/// The first request in `data` as the event loop frames it: None while
/// incomplete or on an error.
fn framed(data: &[u8]) -> Option<(String, String, Vec<u8>)> {
    let head = framing::head_end(data).ok()??;
    let mut request = framing::parse_head(&data[..head]).ok()?;
    let length = framing::body_end(&data[head..], &request, MAX_BODY).ok()??;
    framing::set_body(&mut request, data[head..head + length].to_vec(), MAX_BODY).ok()?;
    outcome(Ok(Some(request)))
}

fuzz_target!(|data: &[u8]| {
    let whole = outcome(read_request(&mut BufReader::new(data), MAX_BODY));
    let trickled = outcome(read_request(
        &mut BufReader::with_capacity(1, Trickle(data)),
        MAX_BODY,
    ));
    assert_eq!(whole, trickled);
    assert_eq!(whole, framed(data), "the event loop framed it differently");
});
