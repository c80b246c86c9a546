//! NBD at the byte level: a client that pipelines a batch of requests —
//! block-aligned reads and writes (which go to the device as they arrive),
//! unaligned and FUA writes, trims, flushes (which run after them) — and
//! checks every reply, by cookie, against a model of the export, with
//! simple and with structured replies.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;
use common::{rss_bytes, threads_named};
use rand::{Rng, SeedableRng};
use sluice_io::{FileDevice, FileOptions};
use sluice_nvmf::controller::{Namespace, Subsystem};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const DEVICE_BYTES: u64 = 8 << 20;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const READ: u16 = 0;
const WRITE: u16 = 1;
const DISC: u16 = 2;
const FLUSH: u16 = 3;
const TRIM: u16 = 4;
const FUA: u16 = 1;

fn start() -> (String, Arc<AtomicBool>, tempfile::TempDir) {
    let (address, stop, dir, _) = start_counted();
    (address, stop, dir)
}

/// As [`start`], with the subsystem (its counters).
fn start_counted() -> (String, Arc<AtomicBool>, tempfile::TempDir, Arc<Subsystem>) {
    start_configured(sluice_nvmf::nbd::NbdConfig {
        max_connections: 16,
        ..Default::default()
    })
}

/// As [`start_counted`], with `config`.
fn start_configured(
    config: sluice_nvmf::nbd::NbdConfig,
) -> (String, Arc<AtomicBool>, tempfile::TempDir, Arc<Subsystem>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns.dev");
    let dev = FileDevice::create(&path, DEVICE_BYTES, &FileOptions::default()).unwrap();
    let ns = Namespace::new(Arc::new(dev)).unwrap();
    let subsystem = Arc::new(Subsystem::new("nqn.test".into(), vec![ns], Vec::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let served = subsystem.clone();
    std::thread::spawn(move || sluice_nvmf::nbd::serve(listener, served, config, s));
    (address, stop, dir, subsystem)
}

fn u32_of(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().unwrap())
}

fn u64_of(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap())
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

/// Fixed newstyle, no zeroes; structured replies when asked; export "1".
fn connect(address: &str, structured: bool) -> TcpStream {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_nodelay(true).unwrap();
    let greeting = read_n(&mut s, 18);
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let option = |s: &mut TcpStream, opt: u32, data: &[u8]| {
        let mut o = IHAVEOPT.to_be_bytes().to_vec();
        o.extend_from_slice(&opt.to_be_bytes());
        o.extend_from_slice(&(data.len() as u32).to_be_bytes());
        o.extend_from_slice(data);
        s.write_all(&o).unwrap();
    };
    if structured {
        option(&mut s, 8, &[]);
        let head = read_n(&mut s, 20);
        assert_eq!(u32_of(&head[12..16]), 1, "NBD_REP_ACK");
    }
    option(&mut s, 1, b"1");
    let info = read_n(&mut s, 10);
    assert_eq!(u64_of(&info[..8]), DEVICE_BYTES);
    s
}

fn request(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// One reply: its cookie, error and, for a read, its data (`read_len`
/// says how long a simple reply's data is).
fn reply(
    s: &mut TcpStream,
    structured: bool,
    read_len: &HashMap<u64, usize>,
) -> (u64, u32, Vec<u8>) {
    if !structured {
        let head = read_n(s, 16);
        assert_eq!(u32_of(&head[..4]), SIMPLE_REPLY_MAGIC);
        let (error, cookie) = (u32_of(&head[4..8]), u64_of(&head[8..16]));
        let n = if error == 0 {
            read_len.get(&cookie).copied().unwrap_or(0)
        } else {
            0
        };
        return (cookie, error, read_n(s, n));
    }
    let head = read_n(s, 20);
    assert_eq!(u32_of(&head[..4]), STRUCTURED_REPLY_MAGIC);
    assert_eq!(u16::from_be_bytes([head[4], head[5]]), 1, "one chunk, done");
    let kind = u16::from_be_bytes([head[6], head[7]]);
    let cookie = u64_of(&head[8..16]);
    let payload = read_n(s, u32_of(&head[16..20]) as usize);
    match kind {
        0 => (cookie, 0, Vec::new()),
        1 => (cookie, 0, payload[8..].to_vec()),
        0x8001 => (cookie, u32_of(&payload[..4]), Vec::new()),
        other => panic!("reply type {other:#x}"),
    }
}

#[test]
fn pipelined_requests_of_every_kind_match_a_model_of_the_export() {
    const REGION: usize = 64 << 10;
    let (address, _stop, _dir) = start();
    let regions = DEVICE_BYTES as usize / REGION;
    let mut model = vec![0u8; DEVICE_BYTES as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for structured in [false, true] {
        let mut s = connect(&address, structured);
        for round in 0..6 {
            let mut order: Vec<usize> = (0..regions).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            let before = model.clone();
            let mut out = Vec::new();
            let mut expect: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
            let mut read_len = HashMap::new();
            for (k, &region) in order.iter().take(100).enumerate() {
                let cookie = (round * 1000 + k) as u64 | (structured as u64) << 40;
                let base = region * REGION;
                // Distinct regions: no two requests of a batch overlap.
                let (offset, len) = match k % 5 {
                    // Whole blocks: to the device as they arrive.
                    0..=2 => (base, 4096 * rng.gen_range(1..=16)),
                    // Not whole blocks: read, patched and written back.
                    _ => (base + rng.gen_range(1..4000), rng.gen_range(1..20_000)),
                };
                match k % 4 {
                    0 | 1 => {
                        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        let flags = if k % 7 == 0 { FUA } else { 0 };
                        request(&mut out, flags, WRITE, cookie, offset as u64, len as u32);
                        out.extend_from_slice(&data);
                        model[offset..offset + len].copy_from_slice(&data);
                        expect.insert(cookie, None);
                    }
                    2 => {
                        request(&mut out, 0, READ, cookie, offset as u64, len as u32);
                        read_len.insert(cookie, len);
                        expect.insert(cookie, Some(before[offset..offset + len].to_vec()));
                    }
                    _ => {
                        request(&mut out, 0, TRIM, cookie, offset as u64, len as u32);
                        model[offset..offset + len].fill(0);
                        expect.insert(cookie, None);
                    }
                }
                if k == 50 {
                    request(&mut out, 0, FLUSH, 1 << 50, 0, 0);
                    expect.insert(1 << 50, None);
                }
            }
            // A read past the end fails alone.
            let past = 1 << 51;
            request(&mut out, 0, READ, past, DEVICE_BYTES - 4096, 8192);
            s.write_all(&out).unwrap();
            let mut answered = 0;
            let requests = expect.len() + 1;
            while answered < requests {
                let (cookie, error, data) = reply(&mut s, structured, &read_len);
                answered += 1;
                if cookie == past {
                    assert_eq!(error, 28, "ENOSPC past the end");
                    continue;
                }
                assert_eq!(error, 0, "round {round}, cookie {cookie}");
                match expect.remove(&cookie).unwrap_or_else(|| {
                    panic!(
                        "one reply per request: {cookie:#x} round {round} structured {structured}"
                    )
                }) {
                    Some(want) => assert!(data == want, "round {round}: read {cookie}"),
                    None => assert!(data.is_empty()),
                }
            }
            assert!(expect.is_empty(), "every request answered");
        }
        // Everything back, whole blocks at a time.
        let mut out = Vec::new();
        let mut read_len = HashMap::new();
        for i in 0..regions {
            request(
                &mut out,
                0,
                READ,
                i as u64,
                (i * REGION) as u64,
                REGION as u32,
            );
            read_len.insert(i as u64, REGION);
        }
        s.write_all(&out).unwrap();
        for _ in 0..regions {
            let (cookie, error, data) = reply(&mut s, structured, &read_len);
            assert_eq!(error, 0);
            let at = cookie as usize * REGION;
            assert!(data == model[at..at + REGION], "region {cookie}");
        }
        let mut bye = Vec::new();
        request(&mut bye, 0, DISC, 0, 0, 0);
        s.write_all(&bye).unwrap();
    }
}

#[test]
fn a_client_that_leaves_with_requests_at_the_device_leaves_the_export_usable() {
    let (address, _stop, _dir) = start();
    for round in 0..5u8 {
        let mut s = connect(&address, round % 2 == 0);
        let mut out = Vec::new();
        for k in 0..64u64 {
            request(&mut out, 0, WRITE, k, k * 4096, 4096);
            out.extend_from_slice(&[round + 1; 4096]);
        }
        s.write_all(&out).unwrap();
        drop(s);
    }
    // Every block whole, from one of the rounds; an unaligned write (which
    // needs the namespace's write gate alone) still goes through. It goes to
    // block 64, which no round wrote: a departed client's writes still at
    // the device may land after a later client's write to the same block
    // (nothing orders writes of different connections), and did in one
    // full test run when this write went to block 0. The read is sent
    // after the write's reply: NBD lets a server complete pipelined
    // requests in any order.
    let mut s = connect(&address, false);
    let mut out = Vec::new();
    request(&mut out, 0, WRITE, 1, 64 * 4096 + 100, 10);
    out.extend_from_slice(&[9u8; 10]);
    s.write_all(&out).unwrap();
    let read_len = HashMap::from([(2u64, 65 * 4096)]);
    let (cookie, error, _) = reply(&mut s, false, &read_len);
    assert_eq!((cookie, error), (1, 0));
    out.clear();
    request(&mut out, 0, READ, 2, 0, 65 * 4096);
    s.write_all(&out).unwrap();
    let (cookie, error, data) = reply(&mut s, false, &read_len);
    assert_eq!((cookie, error), (2, 0));
    for (k, block) in data[..64 * 4096].chunks(4096).enumerate() {
        assert!(
            block.iter().all(|&b| b == block[0] && (1..=5).contains(&b)),
            "block {k}"
        );
    }
    let last = &data[64 * 4096..];
    assert_eq!(&last[100..110], &[9u8; 10]);
    assert!(last[..100].iter().chain(&last[110..]).all(|&b| b == 0));
}

/// A client that sends 1000 reads of 1 MiB (1000 MiB of replies) and
/// reads none of them: the node makes at most a few MiB of replies before
/// they go out, so its memory stays bounded; once the client reads, every
/// reply comes.
#[test]
fn a_client_that_reads_no_replies_is_not_served_past_its_limit() {
    let (address, _stop, _dir) = start();
    let mut s = connect(&address, false);
    // Warm: the engine's pool is there before the figure is taken.
    let mut out = Vec::new();
    request(&mut out, 0, READ, 1, 0, 1 << 20);
    s.write_all(&out).unwrap();
    let mut lens = HashMap::new();
    lens.insert(1u64, 1usize << 20);
    assert_eq!(reply(&mut s, false, &lens).1, 0);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = rss_bytes();
    let mut out = Vec::new();
    for k in 0..1000u64 {
        let offset = (k % 7) << 20;
        request(&mut out, 0, READ, 100 + k, offset, 1 << 20);
        lens.insert(100 + k, 1 << 20);
    }
    s.write_all(&out).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let grown = rss_bytes().saturating_sub(before);
    assert!(
        grown < 96 << 20,
        "{} MiB more while 1000 MiB of replies wait",
        grown >> 20
    );
    for _ in 0..1000 {
        let (cookie, error, data) = reply(&mut s, false, &lens);
        assert_eq!((error, data.len()), (0, 1 << 20), "cookie {cookie}");
    }
}

/// Writes of 128 KiB: one sent header first and its data slowly, then 24
/// pipelined eight deep. Each lands whole, and their data is read from
/// the socket straight into the pinned buffers they are written from —
/// copied are only the bytes that came with the first header and a
/// burst's first writes.
#[test]
fn big_writes_are_received_straight_into_pinned_buffers() {
    const BYTES: usize = 128 << 10;
    const WRITES: u64 = 25;
    let (address, _stop, _dir, subsystem) = start_counted();
    let mut s = connect(&address, false);
    let data: Vec<Vec<u8>> = (0..WRITES)
        .map(|w| (0..BYTES).map(|i| (i as u64 * 31 + w) as u8).collect())
        .collect();
    let write = |w: u64| {
        let mut out = Vec::new();
        request(&mut out, 0, WRITE, w, w * BYTES as u64, BYTES as u32);
        out.extend_from_slice(&data[w as usize]);
        out
    };
    let none = HashMap::new();
    let first = write(0);
    s.write_all(&first[..1000]).unwrap();
    for piece in first[1000..].chunks(40_000) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.write_all(piece).unwrap();
    }
    assert_eq!(reply(&mut s, false, &none), (0, 0, Vec::new()));
    let mut sent = 1;
    while sent < WRITES.min(9) {
        s.write_all(&write(sent)).unwrap();
        sent += 1;
    }
    for _ in 1..WRITES {
        let (cookie, error, _) = reply(&mut s, false, &none);
        assert_eq!(error, 0, "write {cookie}");
        if sent < WRITES {
            s.write_all(&write(sent)).unwrap();
            sent += 1;
        }
    }
    for w in 0..WRITES {
        let mut out = Vec::new();
        request(&mut out, 0, READ, 100 + w, w * BYTES as u64, BYTES as u32);
        s.write_all(&out).unwrap();
        let lens = HashMap::from([(100 + w, BYTES)]);
        let (cookie, error, back) = reply(&mut s, false, &lens);
        assert_eq!((cookie, error), (100 + w, 0));
        assert!(back == data[w as usize], "write {w} reads back whole");
    }
    let bytes = subsystem.write_data_bytes();
    assert_eq!(
        bytes.direct + bytes.staged,
        WRITES * BYTES as u64,
        "{bytes:?}"
    );
    // The first write's first 1000 bytes, a burst's first writes (the
    // receive buffer is 256 KiB), and what came with each header.
    let bound = 1000 + 2 * BYTES as u64 + WRITES * 28;
    assert!(bytes.staged <= bound, "{bytes:?} (staged at most {bound})");
    // A client that leaves halfway through a write's data: none of it
    // lands, and the export serves the next client.
    let mut leaving = connect(&address, false);
    let mut out = write(0);
    out[REQUEST_HEADER_BYTES..].fill(0xee);
    leaving.write_all(&out[..1000]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    leaving.write_all(&out[1000..60_000]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(leaving);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut s = connect(&address, false);
    let mut out = Vec::new();
    request(&mut out, 0, READ, 7, 0, BYTES as u32);
    s.write_all(&out).unwrap();
    let (_, error, back) = reply(&mut s, false, &HashMap::from([(7, BYTES)]));
    assert_eq!(error, 0);
    assert!(back == data[0], "the left write changed nothing");
}

const REQUEST_HEADER_BYTES: usize = 28;

/// Reads until the server closes (or 10 s pass); how long it took.
fn closed_within(s: &mut TcpStream) -> std::time::Duration {
    let started = std::time::Instant::now();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn slow_senders_are_cut_at_the_deadline_of_their_handshake_or_request() {
    use std::time::Duration;
    let (address, _stop, _dir, _) = start_configured(sluice_nvmf::nbd::NbdConfig {
        handshake_timeout: Duration::from_millis(1500),
        request_timeout: Duration::from_millis(1500),
        ..Default::default()
    });
    // A handshake trickled a byte every 400 ms: each read came in time,
    // and the 30 s read timeout never ended it.
    let trickler = {
        let address = address.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&address).unwrap();
            let _ = read_n(&mut s, 18);
            let started = std::time::Instant::now();
            let mut option = 3u32.to_be_bytes().to_vec();
            option.extend_from_slice(&IHAVEOPT.to_be_bytes());
            for byte in option {
                if s.write_all(&[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
            started.elapsed() + closed_within(&mut s)
        })
    };
    // Idle between requests for longer than the request deadline: served.
    let mut idle = connect(&address, false);
    std::thread::sleep(Duration::from_millis(2500));
    let mut out = Vec::new();
    request(&mut out, 0, READ, 7, 0, 4096);
    idle.write_all(&out).unwrap();
    let (cookie, error, data) = reply(&mut idle, false, &HashMap::from([(7, 4096)]));
    assert_eq!((cookie, error, data.len()), (7, 0, 4096));
    // Half a request header, then nothing: cut at the request deadline.
    let mut half = connect(&address, false);
    half.write_all(&out[..10]).unwrap();
    let cut = closed_within(&mut half);
    assert!(cut < Duration::from_secs(5), "half a header held {cut:?}");
    // A write whose data trickles in: cut too, and nothing of it applied.
    let mut slow = connect(&address, false);
    let mut write = Vec::new();
    request(&mut write, 0, WRITE, 8, 0, 65536);
    slow.write_all(&write).unwrap();
    for _ in 0..20 {
        if slow.write_all(&[0xee; 512]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let cut = closed_within(&mut slow);
    assert!(
        cut < Duration::from_secs(3),
        "a trickled write held {cut:?} more"
    );
    let mut check = Vec::new();
    request(&mut check, 0, READ, 9, 0, 4096);
    idle.write_all(&check).unwrap();
    let (_, _, data) = reply(&mut idle, false, &HashMap::from([(9, 4096)]));
    assert!(
        data.iter().all(|&b| b != 0xee),
        "part of an unfinished write was applied"
    );
    let held = trickler.join().unwrap();
    assert!(
        held < Duration::from_secs(4),
        "a trickled handshake held {held:?}"
    );
}

/// `n` connections that connect and then say nothing, held open.
fn idle_connections(address: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect()
}

/// A write then a read of the same 4 KiB on a set-up connection.
fn write_then_read(s: &mut TcpStream, byte: u8) {
    let mut out = Vec::new();
    request(&mut out, 0, WRITE, 1, 8192, 4096);
    out.extend_from_slice(&[byte; 4096]);
    s.write_all(&out).unwrap();
    let lens = HashMap::from([(2u64, 4096usize)]);
    assert_eq!(reply(s, false, &lens), (1, 0, Vec::new()));
    out.clear();
    request(&mut out, 0, READ, 2, 8192, 4096);
    s.write_all(&out).unwrap();
    let (cookie, error, data) = reply(s, false, &lens);
    assert_eq!((cookie, error), (2, 0));
    assert!(data == [byte; 4096], "the read did not return the write");
}

#[test]
fn idle_connections_cannot_lock_clients_out() {
    // Five times the connection limit of connections that never start a
    // handshake: the oldest of them make room for a client, and a client
    // past its handshake is never the one closed.
    let (address, _stop, _dir, _) = start_configured(sluice_nvmf::nbd::NbdConfig {
        max_connections: 8,
        ..Default::default()
    });
    let attack = idle_connections(&address, 40);
    let mut client = connect(&address, false);
    write_then_read(&mut client, 7);
    let more = idle_connections(&address, 40);
    write_then_read(&mut client, 8);
    let mut second = connect(&address, false);
    write_then_read(&mut second, 9);
    drop((attack, more));
}

/// A client costs no thread once its handshake is done: the node's workers
/// serve it with the others. 32 clients each write and read back, and the threads that ran their handshakes
/// are gone; then each is served again.
#[test]
fn clients_are_served_by_the_workers() {
    let (address, _stop, _dir, _) = start_configured(sluice_nvmf::nbd::NbdConfig {
        max_connections: 64,
        workers: 2,
        ..Default::default()
    });
    let mut clients: Vec<TcpStream> = (0..32).map(|_| connect(&address, false)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        write_then_read(c, i as u8);
    }
    // The handshake threads end with their handoff; other tests of this
    // binary hold a few connections at most.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads_named("nbd-conn") >= 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let conn_threads = threads_named("nbd-conn");
    assert!(
        conn_threads < 8,
        "{conn_threads} connection threads for 32 NBD clients"
    );
    for (i, c) in clients.iter_mut().enumerate() {
        write_then_read(c, 100 + i as u8);
    }
}
