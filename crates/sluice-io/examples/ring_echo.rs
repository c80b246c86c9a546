//! The shared-memory rings alone: two threads pinned to CPUs 0 and 1 play
//! a GET request and a 100-byte value's reply through one region, as a
//! client and a server do, with the same fences and wake-up checks.
//! Prints round trips per second.
//!
//!   cargo run --release -p sluice-io --example ring_echo [SECONDS]

use sluice_io::shm::{duplicate, ShmChannel, ShmRegion, Side};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Keeps each side's channel on cache lines of its own: the two threads'
/// channels must not share a line.
#[repr(align(128))]
struct Own<T>(T);

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map_or(1.0, |s| s.parse().expect("ring echo"));
    let region = ShmRegion::create(1 << 20, 1 << 20).expect("ring echo");
    let client_region =
        ShmRegion::open(duplicate(region.fd()).expect("ring echo")).expect("ring echo");
    let mut server = Box::new(Own(ShmChannel::new(region, Side::Server)));
    let mut client = Box::new(Own(ShmChannel::new(client_region, Side::Client)));
    let (server, client) = (&mut server.0, &mut client.0);
    let mut reply = b"$100\r\n".to_vec();
    reply.resize(reply.len() + 100, b'x');
    reply.extend_from_slice(b"\r\n");
    let request = b"*2\r\n$3\r\nGET\r\n$8\r\nkey:0001\r\n";
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            sluice_io::net::pin_current_thread(0).expect("ring echo");
            let mut buf = Vec::with_capacity(4096);
            while !stop.load(Ordering::Relaxed) {
                buf.clear();
                if server.read(&mut buf, usize::MAX).expect("ring echo") > 0 {
                    server.stage_all(&[&reply]).expect("ring echo");
                    server.publish_staged();
                    server.take_peer_sleeping();
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        sluice_io::net::pin_current_thread(1).expect("ring echo");
        let mut buf = Vec::with_capacity(4096);
        let started = Instant::now();
        let mut trips = 0u64;
        while started.elapsed() < Duration::from_secs_f64(secs) {
            for _ in 0..1000 {
                client.write(request).expect("ring echo");
                client.take_peer_sleeping();
                buf.clear();
                while client.read(&mut buf, usize::MAX).expect("ring echo") == 0 {
                    std::hint::spin_loop();
                }
            }
            trips += 1000;
        }
        println!(
            "{:.2}M",
            trips as f64 / started.elapsed().as_secs_f64() / 1e6
        );
        stop.store(true, Ordering::Relaxed);
    });
}
