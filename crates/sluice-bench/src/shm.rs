//! `sluice bench shm`: the shared-memory paper's table (Table I) on this
//! machine — GET and SET of small values over a hot key set at batch 1,
//! 10 and 50, to `sluice serve` over its shared-memory rings, a Unix
//! socket and TCP loopback, and to `redis-server` over a Unix socket and
//! TCP, in one run. The load generator is the same code on every row
//! (sluice-client: pre-encoded batches, replies framed and discarded), one
//! client thread per core the server does not use.

use crate::serve::{cpu_ticks, start_redis_with, start_sluice_with, ticks_per_sec, Process};
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use sluice_client::{Client, Endpoint};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `sluice bench shm`.
#[derive(clap::Args)]
pub struct ShmBenchArgs {
    /// Commands per batch (pipelined; over shm published with one store).
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    batches: Vec<usize>,
    /// Tests: get, set.
    #[arg(long, value_delimiter = ',', default_value = "get,set")]
    tests: Vec<String>,
    /// Paths: sluice-shm, sluice-unix, sluice-tcp, redis-unix, redis-tcp.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sluice-shm,sluice-unix,sluice-tcp,redis-unix,redis-tcp"
    )]
    paths: Vec<String>,
    /// Seconds each row runs.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// The hot key set.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Server threads (Sluice's workers; Redis runs its one).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Client threads (default: one per core the server does not use).
    #[arg(long)]
    client_threads: Option<usize>,
    /// Runs of each row; the median is printed.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// After the rows: the CPU an idle server with --idle-clients
    /// shared-memory clients burns, and a client waiting on a reply that
    /// does not come, each over this many seconds (0: leave out).
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// First: the rings' own ceiling at batch 1 on this machine — two
    /// threads in this process, one writing a GET frame and waiting for
    /// the reply, the other echoing a fixed 100-byte reply at once, with
    /// no server behind it — over this many seconds (0: leave out). Also
    /// measured for a moment before each run of a row, whose lowest and
    /// highest are printed with it: this machine's rings have run at two
    /// speeds about 4x apart, changing between runs.
    #[arg(long, default_value_t = 3)]
    echo_secs: u64,
    /// Shared-memory clients connected while the server's idle CPU is measured.
    #[arg(long, default_value_t = 100)]
    idle_clients: usize,
    /// Where both servers keep their data and sockets.
    #[arg(long, default_value = "data/bench-shm")]
    dir: PathBuf,
}

/// One row's result.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    ops_per_sec: f64,
    /// Per request: the batch's round trip.
    p50_us: f64,
    p99_us: f64,
    /// CPU of the server and the clients together, per operation.
    cpu_us_per_op: f64,
}

/// The load one client thread runs: pre-encoded batches over the hot keys.
fn batches_for(test: &str, batch: usize, args: &ShmBenchArgs, seed: usize) -> Vec<Vec<u8>> {
    let value = vec![b'x'; args.value_bytes];
    let mut key_index = seed.wrapping_mul(7919);
    (0..64)
        .map(|_| {
            let mut bytes = Vec::new();
            for _ in 0..batch {
                key_index = (key_index + 7) % args.keys;
                let key = format!("key:{key_index:012}");
                match test {
                    "set" => sluice_client::encode(&mut bytes, &[b"SET", key.as_bytes(), &value]),
                    _ => sluice_client::encode(&mut bytes, &[b"GET", key.as_bytes()]),
                }
            }
            bytes
        })
        .collect()
}

/// One client thread: batches until `until`; (requests, histogram of
/// batch round trips in ns).
fn client_loop(
    endpoint: &Endpoint,
    batches: &[Vec<u8>],
    batch: usize,
    until: Instant,
) -> Result<(u64, Histogram<u64>)> {
    let mut client = Client::connect_to(endpoint)?;
    let mut hist = Histogram::<u64>::new(3)?;
    let mut done = 0u64;
    let mut i = 0;
    // One clock read a batch: a batch ends when the next begins.
    let mut started = Instant::now();
    while started < until {
        client.send_raw(&batches[i % batches.len()])?;
        let errors = client.discard_replies(batch)?;
        if errors > 0 {
            bail!("{errors} error replies in a batch");
        }
        let ended = Instant::now();
        let _ = hist.record((ended - started).as_nanos() as u64);
        started = ended;
        done += batch as u64;
        i += 1;
    }
    Ok((done, hist))
}

/// A value on cache lines of its own.
#[repr(align(128))]
struct OwnLines<T>(T);

/// Round trips per second of one GET frame and a fixed bulk reply of
/// `value_bytes` through a pair of rings between two threads, the echoing
/// one doing nothing else: the ceiling batch 1 can reach on this machine,
/// with the same ring code, fences and wake-up checks as client and server.
fn ring_echo(length: Duration, value_bytes: usize) -> Result<f64> {
    use sluice_io::shm::{duplicate, ShmChannel, ShmRegion, Side};
    use std::sync::atomic::{AtomicBool, Ordering};
    let region = ShmRegion::create(1 << 20, 1 << 20)?;
    let client_region = ShmRegion::open(duplicate(region.fd())?)?;
    // Each channel on lines of its own: the two threads' channels side by
    // side on the stack shared a line in some runs, which cost up to a
    // fifth of the round trips.
    let mut server = Box::new(OwnLines(ShmChannel::new(region, Side::Server)));
    let mut client = Box::new(OwnLines(ShmChannel::new(client_region, Side::Client)));
    let (server, client) = (&mut server.0, &mut client.0);
    let mut reply = format!("${value_bytes}\r\n").into_bytes();
    reply.resize(reply.len() + value_bytes, b'x');
    reply.extend_from_slice(b"\r\n");
    let request = b"*2\r\n$3\r\nGET\r\n$8\r\nkey:0001\r\n";
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<f64> {
        scope.spawn(|| -> Result<()> {
            let mut buf = Vec::with_capacity(4096);
            while !stop.load(Ordering::Relaxed) {
                buf.clear();
                if server.read(&mut buf, usize::MAX)? > 0 {
                    server.stage_all(&[&reply])?;
                    server.publish_staged();
                    server.take_peer_sleeping();
                } else {
                    std::hint::spin_loop();
                }
            }
            Ok(())
        });
        let mut buf = Vec::with_capacity(4096);
        let started = Instant::now();
        let mut trips = 0u64;
        while started.elapsed() < length {
            for _ in 0..1000 {
                client.write(request)?;
                client.take_peer_sleeping();
                buf.clear();
                while client.read(&mut buf, usize::MAX)? == 0 {
                    std::hint::spin_loop();
                }
                client.take_peer_sleeping();
            }
            trips += 1000;
        }
        let per_sec = trips as f64 / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        Ok(per_sec)
    })
}

/// This process's CPU time so far, in seconds.
fn own_cpu_secs() -> Result<f64> {
    Ok(cpu_ticks(std::process::id())? as f64 / ticks_per_sec()?)
}

fn measure(
    endpoint: &Endpoint,
    server: &Process,
    test: &str,
    batch: usize,
    args: &ShmBenchArgs,
    threads: usize,
) -> Result<Measured> {
    let tick = ticks_per_sec()?;
    let server_before = cpu_ticks(server.0.id())?;
    let own_before = own_cpu_secs()?;
    let started = Instant::now();
    let until = started + Duration::from_secs(args.seconds);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let batches = batches_for(test, batch, args, t);
                // Sluice's workers are pinned to the first cores; each
                // client takes one of the others, so a client never shares
                // a core with the server it measures (the row then measures
                // the scheduler: batch 1 over shm ran at 0.9M or 2.2M from
                // one run to the next with the clients left to it).
                let core = (args.server_threads + t) % cores;
                scope.spawn(move || {
                    sluice_io::net::pin_current_thread(core)
                        .with_context(|| format!("pinning a client thread to CPU {core}"))?;
                    client_loop(endpoint, &batches, batch, until)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let server_secs = (cpu_ticks(server.0.id())? - server_before) as f64 / tick;
    let own_secs = own_cpu_secs()? - own_before;
    let mut ops = 0;
    let mut hist = Histogram::<u64>::new(3)?;
    for r in results {
        let (n, h) = r?;
        ops += n;
        hist.add(&h)?;
    }
    if ops == 0 {
        bail!("no requests finished in {} s", args.seconds);
    }
    Ok(Measured {
        ops_per_sec: ops as f64 / elapsed,
        p50_us: hist.value_at_quantile(0.50) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        cpu_us_per_op: (server_secs + own_secs) * 1e6 / ops as f64,
    })
}

/// How long the rings' ceiling is measured before each run of a row.
const ROW_ECHO: Duration = Duration::from_millis(200);

/// `lowest–highest` of `values` (one decimal), or `-` for none.
fn span(values: &[f64]) -> String {
    let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match values {
        [] => "-".into(),
        _ if (highest - lowest) < 0.05 => format!("{lowest:.1}"),
        _ => format!("{lowest:.1}-{highest:.1}"),
    }
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    runs[runs.len() / 2]
}

/// A server started for some paths, and the endpoints it offers.
struct Target {
    server: Process,
    endpoints: Vec<(String, Endpoint)>,
}

fn start_targets(args: &ShmBenchArgs) -> Result<Vec<Target>> {
    let _ = std::fs::remove_dir_all(&args.dir);
    // Absolute: redis-server changes into its --dir before it binds its
    // Unix socket, so a relative socket path would point elsewhere.
    let dir = std::path::absolute(&args.dir)?;
    let sluice_dir = dir.join("sluice");
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&sluice_dir)?;
    std::fs::create_dir_all(&redis_dir)?;
    let wants = |prefix: &str| args.paths.iter().any(|p| p.starts_with(prefix));
    let mut targets = Vec::new();
    if wants("sluice-") {
        let shm = sluice_dir.join("shm.sock");
        let unix = sluice_dir.join("redis.sock");
        let extra = [
            "--shm".to_string(),
            shm.display().to_string(),
            "--unixsocket".to_string(),
            unix.display().to_string(),
        ];
        let (server, port) =
            start_sluice_with(&sluice_dir, "none", args.server_threads, 1024, &extra)?;
        targets.push(Target {
            server,
            endpoints: vec![
                ("sluice-shm".into(), Endpoint::Shm(shm)),
                ("sluice-unix".into(), Endpoint::Unix(unix)),
                (
                    "sluice-tcp".into(),
                    Endpoint::Tcp(format!("127.0.0.1:{port}")),
                ),
            ],
        });
    }
    if wants("redis-") {
        let unix = redis_dir.join("redis.sock");
        let extra = [
            "--unixsocket".to_string(),
            unix.display().to_string(),
            "--unixsocketperm".to_string(),
            "700".to_string(),
        ];
        let (server, port) = start_redis_with(&redis_dir, "none", 1, &extra)?;
        targets.push(Target {
            server,
            endpoints: vec![
                ("redis-unix".into(), Endpoint::Unix(unix)),
                (
                    "redis-tcp".into(),
                    Endpoint::Tcp(format!("127.0.0.1:{port}")),
                ),
            ],
        });
    }
    Ok(targets)
}

/// Loads every hot key once, so GETs find values.
fn preload(endpoint: &Endpoint, args: &ShmBenchArgs) -> Result<()> {
    let mut client = Client::connect_to(endpoint)?;
    let value = vec![b'x'; args.value_bytes];
    let commands: Vec<Vec<Vec<u8>>> = (0..args.keys)
        .map(|k| {
            vec![
                b"SET".to_vec(),
                format!("key:{k:012}").into_bytes(),
                value.clone(),
            ]
        })
        .collect();
    for reply in client.batch(&commands)? {
        reply.into_result().context("preloading the hot keys")?;
    }
    Ok(())
}

/// Runs the table and prints it with the ratios the issue names.
pub fn run(args: &ShmBenchArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args
        .client_threads
        .unwrap_or_else(|| cores.saturating_sub(args.server_threads).max(1));
    if args.echo_secs > 0 {
        let per_sec = ring_echo(Duration::from_secs(args.echo_secs), args.value_bytes)?;
        println!(
            "the rings alone (a thread echoing a fixed {} B reply, no server): {per_sec:.0} round trips/s at batch 1",
            args.value_bytes
        );
    }
    let targets = start_targets(args)?;
    println!(
        "{} B values, {} hot keys, {threads} client thread(s), {} server thread(s), {} s per row, median of {}",
        args.value_bytes, args.keys, args.server_threads, args.seconds, args.repeat
    );
    println!(
        "{:<12} {:<4} {:>5} {:>12} {:>10} {:>10} {:>10} {:>15}",
        "path", "test", "batch", "ops/s", "p50 us", "p99 us", "cpu us/op", "rings M trips/s"
    );
    let mut table: Vec<(String, String, usize, Measured)> = Vec::new();
    for target in &targets {
        if let Some((_, endpoint)) = target.endpoints.first() {
            preload(endpoint, args)?;
        }
        for (name, endpoint) in &target.endpoints {
            if !args.paths.contains(name) {
                continue;
            }
            for test in &args.tests {
                for &batch in &args.batches {
                    let mut runs = Vec::new();
                    let mut rings = Vec::new();
                    for _ in 0..args.repeat.max(1) {
                        if args.echo_secs > 0 {
                            rings.push(ring_echo(ROW_ECHO, args.value_bytes)? / 1e6);
                        }
                        runs.push(measure(
                            endpoint,
                            &target.server,
                            test,
                            batch,
                            args,
                            threads,
                        )?);
                    }
                    let m = median(runs);
                    println!(
                        "{name:<12} {test:<4} {batch:>5} {:>12.0} {:>10.1} {:>10.1} {:>10.2} {:>15}",
                        m.ops_per_sec,
                        m.p50_us,
                        m.p99_us,
                        m.cpu_us_per_op,
                        span(&rings)
                    );
                    table.push((name.clone(), test.clone(), batch, m));
                }
            }
        }
    }
    if args.idle_secs > 0 {
        if let Some(target) = targets.first().filter(|t| t.endpoints[0].0 == "sluice-shm") {
            idle_rows(target, args)?;
        }
    }
    let find = |path: &str, test: &str, batch: usize| {
        table
            .iter()
            .find(|(p, t, b, _)| p == path && t == test && *b == batch)
            .map(|r| r.3.ops_per_sec)
    };
    println!("ratios (ops/s):");
    for test in &args.tests {
        for &batch in &args.batches {
            let Some(shm) = find("sluice-shm", test, batch) else {
                continue;
            };
            let mut line = format!("{test:<4} batch {batch:>3}: shm");
            for other in ["sluice-tcp", "sluice-unix", "redis-tcp", "redis-unix"] {
                if let Some(o) = find(other, test, batch) {
                    line.push_str(&format!("  {:.2}x {other}", shm / o));
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}

/// The share of one core `pid` burns over `secs` seconds.
fn cpu_share(pid: u32, secs: u64) -> Result<f64> {
    let before = cpu_ticks(pid)?;
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let ticks = cpu_ticks(pid)? - before;
    Ok(ticks as f64 / ticks_per_sec()? / started.elapsed().as_secs_f64())
}

/// Idle CPU: the server with idle shared-memory clients connected, and a
/// client parked on a reply while the server is stopped (SIGSTOP).
fn idle_rows(target: &Target, args: &ShmBenchArgs) -> Result<()> {
    let endpoint = &target.endpoints[0].1;
    let mut idle = Vec::with_capacity(args.idle_clients);
    for _ in 0..args.idle_clients {
        let mut c = Client::connect_to(endpoint)?;
        c.ping()?;
        idle.push(c);
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = target.server.0.id();
    let server = cpu_share(pid, args.idle_secs)?;
    println!(
        "idle sluice serve, {} shm clients connected: {:.2}% of a core over {} s",
        args.idle_clients,
        server * 100.0,
        args.idle_secs
    );
    let signal = |sig: &str| -> Result<()> {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill {sig} {pid} failed");
        }
        Ok(())
    };
    let mut waiting = idle.pop().context("no idle client")?;
    signal("-STOP")?;
    let waiter = std::thread::spawn(move || waiting.ping());
    std::thread::sleep(Duration::from_millis(200));
    let client = cpu_share(std::process::id(), args.idle_secs);
    signal("-CONT")?;
    let answered = waiter
        .join()
        .map_err(|_| anyhow::anyhow!("the waiting client panicked"))?;
    answered.context("the waiting client's PING after SIGCONT")?;
    println!(
        "a shm client waiting {} s on a reply (server stopped): {:.2}% of a core",
        args.idle_secs,
        client? * 100.0
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::span;

    #[test]
    fn a_rows_ring_speeds_print_as_their_span() {
        assert_eq!(span(&[]), "-");
        assert_eq!(span(&[7.02, 7.0]), "7.0");
        assert_eq!(span(&[6.9, 1.6, 7.2]), "1.6-7.2");
    }
}
