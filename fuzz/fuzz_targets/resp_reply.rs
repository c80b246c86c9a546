//! The reply decoder: any bytes decode, are incomplete, or are refused,
//! never a panic or a huge allocation; what decodes encodes (RESP3) to
//! bytes that decode to a reply encoding to the same bytes (RESP3 has one
//! null, so a RESP2 null array comes back as the null).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_server::resp::{Protocol, Reply};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((reply, used))) = Reply::decode(data) {
        assert!(used <= data.len());
        let bytes = reply.encode(Protocol::Resp3);
        let (again, used_again) = Reply::decode(&bytes)
            .expect("an encoded reply decodes")
            .expect("an encoded reply is whole");
        assert_eq!(used_again, bytes.len());
        assert_eq!(again.encode(Protocol::Resp3), bytes);
        // RESP2 encoding must not panic either.
        let _ = reply.encode(Protocol::Resp2);
    }
});
