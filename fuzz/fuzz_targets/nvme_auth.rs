//! The node's side of DH-HMAC-CHAP: any sequence of Authentication Send
//! messages and Receive lengths from a host that does not know the secret.
//! Never a panic, every answer at least the length asked for and bounded,
//! and never authenticated: no message sequence gets past the challenge
//! without the secret's HMAC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_nvmf::auth::{Exchange, HostSecrets, Secret};
use std::sync::OnceLock;

fn secrets() -> &'static HostSecrets {
    static S: OnceLock<HostSecrets> = OnceLock::new();
    S.get_or_init(|| HostSecrets {
        host: Secret::parse(&Secret::generate(32).expect("a key")).expect("a secret"),
        controller: Some(Secret::parse(&Secret::generate(64).expect("a key")).expect("a secret")),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut exchange = Exchange::new(
        secrets().clone(),
        "nqn.2014-08.org.nvmexpress:uuid:h".into(),
        "nqn.2026-11.io.sluice:fuzz".into(),
    );
    // Each piece: a first byte choosing Receive (odd: its length from the
    // next two bytes) or Send (even: the rest of the piece), pieces cut at
    // 0xFF bytes.
    for piece in data.split(|&b| b == 0xff) {
        let Some((&kind, rest)) = piece.split_first() else {
            continue;
        };
        if kind & 1 == 1 {
            let al = rest.iter().take(2).fold(0usize, |a, &b| a << 8 | b as usize);
            let answer = exchange.receive(al);
            // The longest message: a challenge of SHA-512 with an ffdhe4096 value.
            assert!(answer.len() >= al && answer.len() <= al.max(16 + 64 + 512));
        } else {
            exchange.send(rest);
        }
        assert!(!exchange.authenticated(), "authenticated without the secret");
    }
});
