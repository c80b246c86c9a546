//! The shared-memory ring as the server reads it: a client publishes
//! request frames in pieces while the server takes them into its request
//! reader and answers; at a step the input chooses, the client lies (plain
//! writes into the memfd): a word anywhere in its request ring — a frame
//! header or payload — its response tail, and the server's sleeping word.
//! Until the lie, the server reads exactly the bytes published, in order;
//! after it, every call ends in `Corrupt` or goes on, never a panic or a
//! read outside the ring.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::shm::{self, ShmChannel, ShmError, ShmRegion, Side};
use sluice_server::resp::{Limits, RequestReader};
use std::os::unix::fs::FileExt;

fuzz_target!(|data: &[u8]| {
    if data.len() < 19 {
        return;
    }
    let (control, payload) = data.split_at(19);
    let lie_at_step = control[0] as usize;
    let piece_bytes = 1 + control[1] as usize * 16;
    let lie_word_at = (u64::from(control[2]) | u64::from(control[3]) << 8) % 512 * 8;
    let lie_ring_word = u64::from_le_bytes(control[2..10].try_into().expect("8 bytes"));
    let lie_tail = u64::from_le_bytes(control[10..18].try_into().expect("8 bytes"));
    let lie_word = control[18];
    let region = ShmRegion::create(4096, 4096).expect("a region");
    let file = std::fs::File::from(region.fd().try_clone_to_owned().expect("a dup"));
    let client_region =
        ShmRegion::open(region.fd().try_clone_to_owned().expect("a dup")).expect("opened");
    let mut server = ShmChannel::new(region, Side::Server);
    let mut client = ShmChannel::new(client_region, Side::Client);
    let mut reader = RequestReader::new(Limits::default());
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    let mut rest = payload;
    let mut lied = false;
    for step in 0..4096 {
        if step == lie_at_step {
            let at = shm::CONTROL_BYTES as u64 + lie_word_at;
            let _ = file.write_at(&lie_ring_word.to_ne_bytes(), at);
            let _ = file.write_at(&lie_tail.to_ne_bytes(), shm::OFF_RESPONSE_TAIL as u64);
            let _ = file.write_at(&[lie_word], shm::OFF_SERVER_SLEEPING as u64);
            lied = true;
        }
        match client.write(&rest[..rest.len().min(piece_bytes)]) {
            Ok(n) => {
                sent.extend_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
            Err(ShmError::Corrupt(_)) => assert!(lied, "an honest ring read as corrupt"),
            Err(ShmError::Closed) => unreachable!("write never reports Closed"),
        }
        let before = got.len();
        match server.read(&mut got, 3000) {
            Ok(n) => {
                assert_eq!(got.len(), before + n);
                reader.feed(&got[before..]);
                while let Ok(Some(_)) = reader.next(false) {}
            }
            Err(ShmError::Corrupt(_)) => {
                assert!(lied, "an honest ring read as corrupt");
                break;
            }
            Err(ShmError::Closed) => unreachable!("read never reports Closed"),
        }
        if let Err(ShmError::Corrupt(_)) = server.write(b"+OK\r\n") {
            assert!(lied, "an honest ring read as corrupt");
            break;
        }
        let _ = client.read(&mut Vec::new(), usize::MAX);
        if server.take_peer_sleeping() {
            server.wake_client();
        }
        if rest.is_empty() && server.in_pending() == Ok(0) {
            break;
        }
    }
    if !lied {
        assert_eq!(got, sent, "the server read other bytes than were published");
    }
});
