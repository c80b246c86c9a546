//! The client's reply decoder (`sluice_client::value`): any bytes end in a
//! reply, "not yet whole" or an error, never a panic; `reply_len` and
//! `decode` agree on where a reply ends (`decode` may still refuse what is
//! inside it, a double that is no number, say, which framing does not read).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_client::value::{decode, reply_len};

fuzz_target!(|data: &[u8]| {
    match reply_len(data) {
        Ok(Some(n)) => {
            assert!(n <= data.len());
            if let Err(e) = decode(&data[..n]) {
                assert!(!e.to_string().contains("ended early"), "a reply said whole ended early: {e}");
            }
            // Cut short, it is not whole any more.
            if n > 0 {
                assert!(!matches!(reply_len(&data[..n - 1]), Ok(Some(_))));
            }
        }
        Ok(None) => assert!(decode(data).is_err(), "a reply not yet whole decoded"),
        Err(_) => {}
    }
});
