//! `sluice bench serve`: redis-benchmark, same flags, same run, against
//! `redis-server` and `sluice serve` in matching durability modes (Redis's
//! `appendonly no` / `appendfsync everysec` / `appendfsync always` against
//! `--durability none|everysec|always`), with one worker thread against
//! Redis and two against Redis with `io-threads 2`. Each test (`--tests`:
//! SET and GET unless told; `--tests default` is redis-benchmark's own set
//! and XADD) runs as its own redis-benchmark process, one after the other
//! against the same server, so that each row also shows the CPU each side
//! used: redis-benchmark runs one thread, and a row where it used a whole
//! core measured the load generator, not the server.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Options of `sluice bench serve`.
#[derive(clap::Args)]
pub struct ServeBenchArgs {
    /// Durability modes to compare: none, everysec, always.
    #[arg(long, value_delimiter = ',', default_value = "none,everysec,always")]
    modes: Vec<String>,
    /// Server threads to compare: 1 (against Redis) and 2 (against Redis
    /// with io-threads 2).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// redis-benchmark tests (-t), in order; `default` is redis-benchmark's
    /// own set and XADD; `xadd` and `eval` (a script that INCRs a random
    /// key) run as commands of their own.
    #[arg(long, value_delimiter = ',', default_value = "set,get")]
    tests: Vec<String>,
    /// Pipeline depths (redis-benchmark -P).
    #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
    pipelines: Vec<usize>,
    /// Requests per test (redis-benchmark -n).
    #[arg(long, default_value_t = 200_000)]
    requests: usize,
    /// Keys drawn from (redis-benchmark -r).
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
    /// Connections (redis-benchmark -c).
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Value size in bytes (redis-benchmark -d).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Leave out the single connection at -P 1 (latency).
    #[arg(long)]
    no_single_client: bool,
    /// Where both servers keep their data (removed and made anew per run).
    #[arg(long, default_value = "data/bench-serve")]
    dir: PathBuf,
    /// Size of Sluice's device file, in MiB.
    #[arg(long, default_value_t = 4096)]
    device_mib: u64,
    /// Runs of each row; the median is printed.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// After the rows, the CPU each server burns idle over this many
    /// seconds (after a load, with --idle-clients connections open);
    /// 0 leaves it out.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Connections held open, doing nothing, while idle CPU is measured.
    #[arg(long, default_value_t = 1000)]
    idle_clients: usize,
}

/// One redis-benchmark test's result.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    /// redis-benchmark's CPU over the test's wall time, in cores: near 1.0
    /// (it runs one thread) the load generator, not the server, set the
    /// pace.
    client_cores: f64,
    /// The server's CPU over the same time, in cores.
    server_cores: f64,
}

/// A server the benchmark started; stopped on drop with SIGTERM (Sluice
/// then deletes its log mirror in /dev/shm), killed if still there 10 s on.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let child = &mut self.0;
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn wait_listening(port: u16, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn start_redis(dir: &Path, mode: &str, threads: usize) -> Result<(Process, u16)> {
    start_redis_with(dir, mode, threads, &[])
}

/// Starts `redis-server` in durability `mode` with `extra` flags; returns
/// it and its port.
pub(crate) fn start_redis_with(
    dir: &Path,
    mode: &str,
    threads: usize,
    extra: &[String],
) -> Result<(Process, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .args([
        "--dir",
        dir.to_str().context("the --dir path is not UTF-8")?,
    ]);
    match mode {
        "none" => cmd.args(["--appendonly", "no"]),
        "everysec" | "always" => cmd.args(["--appendonly", "yes", "--appendfsync", mode]),
        other => bail!("unknown mode {other:?}: use none, everysec or always"),
    };
    if threads > 1 {
        cmd.args([
            "--io-threads",
            &threads.to_string(),
            "--io-threads-do-reads",
            "yes",
        ]);
    }
    let child = cmd
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server (scripts/setup installs it)")?;
    let p = Process(child);
    wait_listening(port, "redis-server")?;
    Ok((p, port))
}

fn start_sluice(dir: &Path, mode: &str, threads: usize, device_mib: u64) -> Result<(Process, u16)> {
    start_sluice_with(dir, mode, threads, device_mib, &[])
}

/// Starts `sluice serve` (this binary) in durability `mode` with `extra`
/// flags, once it is ready; returns it and its port.
pub(crate) fn start_sluice_with(
    dir: &Path,
    mode: &str,
    threads: usize,
    device_mib: u64,
    extra: &[String],
) -> Result<(Process, u16)> {
    let port = free_port()?;
    let device = dir.join("serve.dev");
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let mut child = Command::new(exe)
        .arg("serve")
        .args([
            "--device",
            device.to_str().context("the --dir path is not UTF-8")?,
        ])
        .args(["--create-mib", &device_mib.to_string()])
        .args(["--resp", &format!("127.0.0.1:{port}")])
        .args(["--threads", &threads.to_string(), "--durability", mode])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting sluice serve")?;
    let stdout = child.stdout.take().context("sluice serve's output")?;
    let p = Process(child);
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(line) => {
                if line?.contains("ready to accept connections") {
                    break;
                }
            }
            None => bail!("sluice serve ended before it was ready"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok((p, port))
}

/// redis-benchmark's default tests (7.0) and XADD, in its order.
const DEFAULT_TESTS: &[&str] = &[
    "ping_mbulk",
    "set",
    "get",
    "incr",
    "lpush",
    "rpush",
    "lpop",
    "rpop",
    "sadd",
    "hset",
    "spop",
    "zadd",
    "zpopmin",
    "lrange_100",
    "lrange_300",
    "lrange_500",
    "lrange_600",
    "mset",
    "xadd",
];

/// A test redis-benchmark 7.0 has no `-t` for, as the command it runs
/// (`__rand_int__` drawn from -r).
fn custom_command(test: &str) -> Option<&'static [&'static str]> {
    match test {
        "xadd" => Some(&["XADD", "benchstream", "*", "field", "__rand_int__"]),
        // A script that writes, as rate limiters and job queues run them.
        "eval" => Some(&[
            "EVAL",
            "return redis.call('INCR', KEYS[1])",
            "1",
            "counter:__rand_int__",
        ]),
        _ => None,
    }
}

/// The tests `--tests` names, `default` spelled out.
fn tests_of(args: &ServeBenchArgs) -> Vec<String> {
    let mut tests = Vec::new();
    for t in &args.tests {
        if t == "default" {
            tests.extend(DEFAULT_TESTS.iter().map(|d| d.to_string()));
        } else {
            tests.push(t.to_lowercase());
        }
    }
    tests
}

/// Runs redis-benchmark once per test, in order, against the server
/// `server` listening on `port`; each test's result with the CPU both
/// sides used while it ran.
fn redis_benchmark(
    server: &Process,
    port: u16,
    args: &ServeBenchArgs,
    clients: usize,
    pipeline: usize,
) -> Result<Vec<Measured>> {
    let tick = ticks_per_sec()?;
    let tests = tests_of(args);
    let mut results = vec![Measured::default(); tests.len()];
    for (result, test) in results.iter_mut().zip(&tests) {
        let client_before = waited_children_ticks()?;
        let server_before = cpu_ticks(server.0.id())?;
        let started = Instant::now();
        let mut cmd = Command::new("redis-benchmark");
        cmd.args(["-p", &port.to_string()]);
        // A command of its own goes last: redis-benchmark takes every
        // argument after it as the command's.
        let command: Vec<&str> = match custom_command(test) {
            Some(command) => command.to_vec(),
            None => vec!["-t", test],
        };
        let out = cmd
            .args([
                "-n",
                &args.requests.to_string(),
                "-r",
                &args.keys.to_string(),
            ])
            .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
            .args(["-d", &args.value_bytes.to_string()])
            .args(command)
            .output()
            .context("running redis-benchmark (scripts/setup installs redis-tools)")?;
        let wall_secs = started.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!(
                "redis-benchmark failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cores = |ticks: u64| ticks as f64 / tick / wall_secs;
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
        let section = custom_command(test).map_or_else(|| test.to_uppercase(), |c| c.join(" "));
        *result = Measured {
            client_cores: cores(waited_children_ticks()? - client_before),
            server_cores: cores(cpu_ticks(server.0.id())? - server_before),
            ..parse(&text, &section)?
        };
    }
    Ok(results)
}

/// One test's section of redis-benchmark's full report: the section
/// headed by the test's name (`LRANGE_100 (first 100 elements)` for
/// `lrange_100`; not the LPUSH it runs first to fill the list).
fn parse(text: &str, test: &str) -> Result<Measured> {
    let start = [format!("====== {test} ======"), format!("====== {test} (")]
        .iter()
        .find_map(|header| text.find(header.as_str()))
        .with_context(|| format!("redis-benchmark printed no {test} section"))?;
    let section = &text[start..];
    let section = &section[..section.find("\n====== ").unwrap_or(section.len())];
    let number = |s: &str| s.trim().parse::<f64>().ok();
    let ops_per_sec = section
        .lines()
        .find_map(|l| l.trim().strip_prefix("throughput summary:"))
        .and_then(|l| number(l.trim().trim_end_matches("requests per second")))
        .context("no throughput summary")?;
    let summary: Vec<f64> = section
        .lines()
        .skip_while(|l| !l.contains("latency summary"))
        .nth(2)
        .context("no latency summary")?
        .split_whitespace()
        .filter_map(number)
        .collect();
    let p999_ms = section
        .lines()
        .filter_map(|l| {
            let (pct, rest) = l.split_once("% <= ")?;
            let pct = number(pct)?;
            let ms = number(rest.split_whitespace().next()?)?;
            (pct >= 99.9).then_some(ms)
        })
        .next()
        .context("no latency percentiles")?;
    Ok(Measured {
        ops_per_sec,
        p50_ms: *summary.get(2).context("latency summary")?,
        p99_ms: *summary.get(4).context("latency summary")?,
        p999_ms,
        ..Measured::default()
    })
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    runs[runs.len() / 2]
}

/// One row: both servers, fresh, the same redis-benchmark run on each;
/// per test, Redis's median and Sluice's.
fn row(
    args: &ServeBenchArgs,
    mode: &str,
    threads: usize,
    clients: usize,
    pipeline: usize,
) -> Result<Vec<(Measured, Measured)>> {
    let tests = tests_of(args).len();
    let mut redis_runs = vec![Vec::new(); tests];
    let mut sluice_runs = vec![Vec::new(); tests];
    for _ in 0..args.repeat {
        for sluice in [false, true] {
            let _ = std::fs::remove_dir_all(&args.dir);
            std::fs::create_dir_all(&args.dir)
                .with_context(|| format!("creating {}", args.dir.display()))?;
            let (server, port) = if sluice {
                start_sluice(&args.dir, mode, threads, args.device_mib)?
            } else {
                start_redis(&args.dir, mode, threads)?
            };
            let measured = redis_benchmark(&server, port, args, clients, pipeline)?;
            drop(server);
            let runs = if sluice {
                &mut sluice_runs
            } else {
                &mut redis_runs
            };
            for (i, m) in measured.into_iter().enumerate() {
                runs[i].push(m);
            }
        }
    }
    Ok(redis_runs
        .into_iter()
        .zip(sluice_runs)
        .map(|(r, s)| (median(r), median(s)))
        .collect())
}

/// CPU time (user + system) of process `pid` so far, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    Ok(stat_ticks(pid)?[..2].iter().sum())
}

/// As [`cpu_ticks`], with the children it has waited for.
pub(crate) fn cpu_ticks_with_children(pid: u32) -> Result<u64> {
    Ok(stat_ticks(pid)?.iter().sum())
}

/// CPU time of the children this process has waited for, in clock ticks.
fn waited_children_ticks() -> Result<u64> {
    Ok(stat_ticks(std::process::id())?[2..].iter().sum())
}

/// utime, stime, cutime and cstime of process `pid`, in clock ticks.
fn stat_ticks(pid: u32) -> Result<[u64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in ")".
    let rest = stat
        .rsplit_once(')')
        .context("a malformed /proc stat line")?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime, cutime and cstime are fields 14 to 17 of the line: 11
    // to 14 here.
    let tick = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .context("a short /proc stat line")?
            .parse()
            .context("a /proc stat field is not a number")
    };
    Ok([tick(11)?, tick(12)?, tick(13)?, tick(14)?])
}

/// The share of one core a server (already loaded) burns over
/// `args.idle_secs` with `args.idle_clients` idle connections open.
fn idle_cpu(server: &Process, port: u16, args: &ServeBenchArgs) -> Result<f64> {
    let mut idle = Vec::with_capacity(args.idle_clients);
    for _ in 0..args.idle_clients {
        idle.push(std::net::TcpStream::connect(("127.0.0.1", port))?);
    }
    std::thread::sleep(Duration::from_secs(2));
    let pid = server.0.id();
    let before = cpu_ticks(pid)?;
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let ticks = cpu_ticks(pid)? - before;
    drop(idle);
    Ok(ticks as f64 / ticks_per_sec()? / started.elapsed().as_secs_f64())
}

/// Clock ticks per second of /proc's CPU times.
pub(crate) fn ticks_per_sec() -> Result<f64> {
    let getconf = Command::new("getconf").arg("CLK_TCK").output()?;
    String::from_utf8_lossy(&getconf.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK did not print a number")
}

/// Idle CPU of both servers in `mode` with the most threads asked for.
fn idle_rows(args: &ServeBenchArgs) -> Result<()> {
    let threads = args.threads.iter().copied().max().unwrap_or(1);
    let mode = args.modes.first().map_or("everysec", String::as_str);
    println!(
        "idle CPU over {} s after a load, {} idle connections open ({mode}, {threads} threads): share of one core",
        args.idle_secs, args.idle_clients
    );
    for sluice in [false, true] {
        let _ = std::fs::remove_dir_all(&args.dir);
        std::fs::create_dir_all(&args.dir)?;
        let (server, port) = if sluice {
            start_sluice(&args.dir, mode, threads, args.device_mib)?
        } else {
            start_redis(&args.dir, mode, threads)?
        };
        redis_benchmark(&server, port, args, args.clients, 10)?;
        let share = idle_cpu(&server, port, args)?;
        let who = if sluice {
            "sluice serve"
        } else {
            "redis-server"
        };
        println!("{who:<13} {:.2}%", share * 100.0);
    }
    Ok(())
}

/// Runs the comparison and prints one line per row and test.
pub fn run(args: &ServeBenchArgs) -> Result<()> {
    let tests = tests_of(args);
    println!(
        "redis-benchmark -t {}, one after the other, -n {} -r {} -d {} (median of {}; ops/s, latency ms p50/p99/p99.9)",
        tests.join(" then -t "),
        args.requests,
        args.keys,
        args.value_bytes,
        args.repeat
    );
    println!("(client, server: cores each side used while the test ran, against redis / against sluice; a client near 1.00 set the pace; sluice's workers spin while busy)");
    println!(
        "{:<9} {:>3} {:>3} {:>3} {:<10} {:>10} {:>22} {:>10} {:>22} {:>6} {:>11} {:>11}",
        "mode",
        "thr",
        "c",
        "P",
        "test",
        "redis",
        "redis lat",
        "sluice",
        "sluice lat",
        "ratio",
        "client r/s",
        "server r/s"
    );
    for mode in &args.modes {
        for &threads in &args.threads {
            let mut shapes: Vec<(usize, usize)> =
                args.pipelines.iter().map(|&p| (args.clients, p)).collect();
            if !args.no_single_client {
                shapes.push((1, 1));
            }
            for (clients, pipeline) in shapes {
                let results = row(args, mode, threads, clients, pipeline)?;
                for (test, (r, s)) in tests.iter().zip(results) {
                    let lat =
                        |m: &Measured| format!("{:.3}/{:.3}/{:.3}", m.p50_ms, m.p99_ms, m.p999_ms);
                    println!(
                        "{mode:<9} {threads:>3} {clients:>3} {pipeline:>3} {test:<10} {:>10.0} {:>22} {:>10.0} {:>22} {:>6.2} {:>11} {:>11}",
                        r.ops_per_sec,
                        lat(&r),
                        s.ops_per_sec,
                        lat(&s),
                        s.ops_per_sec / r.ops_per_sec,
                        format!("{:.2}/{:.2}", r.client_cores, s.client_cores),
                        format!("{:.2}/{:.2}", r.server_cores, s.server_cores),
                    );
                }
            }
        }
    }
    if args.idle_secs > 0 {
        idle_rows(args)?;
    }
    Ok(())
}
