//! ACL rules as ACL SETUSER takes them and the ACL file holds them: any
//! bytes, cut into rules at NUL bytes, either apply (all of them) or are
//! refused with the user unchanged, never a panic; a user read back as
//! rules (ACL LIST) rebuilds the same user; any command checks against it
//! without a panic; any file text loads or is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_server::acl::{parse_file, resolve, User};

fuzz_target!(|data: &[u8]| {
    let (rules, command) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let ops: Vec<Vec<u8>> = rules.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    let mut user = User::new(b"u");
    let before = user.clone();
    match user.apply(&ops) {
        Ok(()) => {
            let described = user.describe();
            let again_ops: Vec<Vec<u8>> =
                described.split(' ').map(|w| w.as_bytes().to_vec()).collect();
            let mut again = User::new(b"u");
            // Patterns are printed lossily: only valid UTF-8 rules round-trip.
            if std::str::from_utf8(rules).is_ok() && !rules.contains(&b' ') {
                again.apply(&again_ops).expect("a described user's rules apply");
                assert_eq!(again, user, "{described}");
            }
        }
        Err(_) => assert_eq!(user, before, "a refused rule changed the user"),
    }
    let args: Vec<Vec<u8>> = command.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    if !args[0].is_empty() {
        if let Some(id) = resolve(&args) {
            let _ = user.check(id, &args);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_file(text, "fuzz");
    }
});
