//! `sluice bench node`: the storage node over loopback against the local
//! device and nbdkit, in one run. Every side reads and writes the same
//! preallocated file, filled with data once:
//!
//! - **local**: fio io_uring, O_DIRECT, on the file — the floor;
//! - **sluice node, NBD**: fio's `nbd` engine against `sluice node --nbd`;
//! - **nbdkit**: the same fio job against nbdkit's file plugin
//!   (`cache=none`) on the same file;
//! - **tgt**: the same fio job with fio's `libiscsi` engine against tgtd
//!   (the Linux SCSI target framework's daemon) serving the file as an
//!   iSCSI LUN through its `aio` backing store (O_DIRECT, Linux AIO).
//!   Debian's fio has no libiscsi engine: `scripts/fio-libiscsi` builds
//!   Debian's fio source with it (`--fio-libiscsi`), `--no-tgt` leaves
//!   the side out;
//! - **sluice node, NVMe/TCP**: our initiator, the row's depth kept in
//!   flight as a pipeline on `--initiator-queues` I/O queues (default 1:
//!   one queue, one thread, as fio's local side runs it).
//!
//! Rows: 4 KiB random read and write at QD1 and QD32, 128 KiB sequential
//! read and write at QD8. Sides alternate their order from run to run;
//! medians of `--repeat` runs.
//!
//! Then the S-Direct paper's point, moving data between devices: `--move-mib`
//! copied from namespace 1 to namespace 2 inside the node (Copy across
//! namespaces) against our initiator reading it and writing it back, and
//! written to both namespaces with one MultiCast against one write each;
//! time and the bytes that crossed the network, counted at the initiator.

use super::fio;
use super::median;
use super::serve::{free_port, wait_listening, Process as Server};
use crate::io_row::{Row, RunResult};
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use sluice_nvmf::initiator::{read_sqe, rw, InitiatorError, QueueConnection};
use sluice_nvmf::nvm::opcode as io;
use sluice_nvmf::pdu::Digests;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct NodeBenchArgs {
    /// Seconds per run of each side and row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs of each side and row; medians are printed.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// The device file every side uses (created and filled once).
    #[arg(long, default_value = "data/bench-node.dev")]
    device: PathBuf,
    /// Its size, MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Bytes moved between the node's devices by the copy and multicast
    /// comparison, MiB (at most --size-mib).
    #[arg(long, default_value_t = 1024)]
    move_mib: u64,
    /// Only these rows (comma separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// I/O queues (connections, one thread each) our initiator spreads a
    /// row's queue depth over; each keeps its share of the commands in
    /// flight at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    initiator_queues: u16,
    /// Leave out the tgt (iSCSI) side.
    #[arg(long)]
    no_tgt: bool,
    /// A fio built with the libiscsi engine, for the tgt side (default:
    /// where `scripts/fio-libiscsi` builds one, target/tools/fio-libiscsi/fio
    /// beside this binary's build or under the current directory).
    #[arg(long)]
    fio_libiscsi: Option<PathBuf>,
}

const ROWS: &[Row] = &[
    Row {
        name: "randread-4k-qd1",
        write: false,
        random: true,
        block_bytes: 4096,
        queue_depth: 1,
        sqpoll: false,
    },
    Row {
        name: "randread-4k-qd32",
        write: false,
        random: true,
        block_bytes: 4096,
        queue_depth: 32,
        sqpoll: false,
    },
    Row {
        name: "randwrite-4k-qd1",
        write: true,
        random: true,
        block_bytes: 4096,
        queue_depth: 1,
        sqpoll: false,
    },
    Row {
        name: "randwrite-4k-qd32",
        write: true,
        random: true,
        block_bytes: 4096,
        queue_depth: 32,
        sqpoll: false,
    },
    Row {
        name: "seqread-128k-qd8",
        write: false,
        random: false,
        block_bytes: 131072,
        queue_depth: 8,
        sqpoll: false,
    },
    Row {
        name: "seqwrite-128k-qd8",
        write: true,
        random: false,
        block_bytes: 131072,
        queue_depth: 8,
        sqpoll: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Side {
    Local,
    SluiceNbd,
    Nbdkit,
    Tgt,
    SluiceNvmeTcp,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Local => "local (fio io_uring direct)",
            Side::SluiceNbd => "sluice node, NBD (fio nbd)",
            Side::Nbdkit => "nbdkit file (fio nbd)",
            Side::Tgt => "tgt iSCSI aio (fio libiscsi)",
            Side::SluiceNvmeTcp => "sluice node, NVMe/TCP (ours)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Side::Local => "local",
            Side::SluiceNbd => "sluice NBD",
            Side::Nbdkit => "nbdkit",
            Side::Tgt => "tgt",
            Side::SluiceNvmeTcp => "sluice NVMe/TCP",
        }
    }
}

#[derive(serde::Serialize)]
struct Cell {
    row: &'static str,
    side: Side,
    iops: f64,
    mb_per_s: f64,
    lat_us: [f64; 4],
}

pub fn run(args: &NodeBenchArgs) -> Result<()> {
    let fio = fio::locate()?;
    if Command::new("nbdkit").arg("--version").output().is_err() {
        bail!("nbdkit is not installed: run `apt-get install -y nbdkit` (scripts/setup does)");
    }
    let fio_libiscsi = args
        .fio_libiscsi
        .clone()
        .unwrap_or_else(default_fio_libiscsi);
    if !args.no_tgt {
        check_tgt(&fio_libiscsi)?;
    }
    let size = args.size_mib << 20;
    if args.move_mib > args.size_mib {
        bail!(
            "--move-mib {} is more than the device's --size-mib {}",
            args.move_mib,
            args.size_mib
        );
    }
    prepare(&args.device, size)?;
    let second = args.device.with_extension("b.dev");
    prepare(&second, size)?;
    let rows: Vec<&Row> = ROWS
        .iter()
        .filter(|r| args.only.is_empty() || args.only.iter().any(|o| o == r.name))
        .collect();
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let (node, nbd_addr, nvme_addr) = start_node(&exe, &args.device, &second)?;
    let nbdkit_port = free_port()?;
    let nbdkit = start_nbdkit(&args.device, nbdkit_port)?;
    let tgt = if args.no_tgt {
        None
    } else {
        Some(Tgt::start(&args.device)?)
    };
    let mut sides = vec![Side::Local, Side::SluiceNbd, Side::Nbdkit];
    if tgt.is_some() {
        sides.push(Side::Tgt);
    }
    sides.push(Side::SluiceNvmeTcp);
    let mut cells = Vec::new();
    for row in &rows {
        let mut runs: Vec<Vec<RunResult>> = vec![Vec::new(); sides.len()];
        for run in 0..args.repeat {
            for k in 0..sides.len() {
                let i = (k + run) % sides.len();
                let fio_on = |target| fio_run(&fio, row, args.seconds, size, target);
                let r = match sides[i] {
                    Side::Local => fio_on(Target::File(&args.device))?,
                    Side::SluiceNbd => fio_on(Target::Nbd(&format!("nbd://{nbd_addr}/1")))?,
                    Side::Nbdkit => {
                        fio_on(Target::Nbd(&format!("nbd://127.0.0.1:{nbdkit_port}/")))?
                    }
                    Side::Tgt => {
                        let tgt = tgt.as_ref().context("the tgt side without tgtd")?;
                        fio_run(
                            &fio_libiscsi,
                            row,
                            args.seconds,
                            size,
                            Target::Iscsi(&tgt.url),
                        )?
                    }
                    Side::SluiceNvmeTcp => {
                        initiator_run(row, args.seconds, &nvme_addr, size, args.initiator_queues)?
                    }
                };
                println!(
                    "  {} run {}: {:<32} {:>9.0} IOPS {:>8.1} MB/s  p50 {:.0} us p99 {:.0} us",
                    row.name,
                    run + 1,
                    sides[i].label(),
                    r.iops,
                    r.mb_per_s,
                    r.lat_us[0],
                    r.lat_us[2]
                );
                runs[i].push(r);
            }
        }
        for (side, results) in sides.iter().zip(runs) {
            let pick = |f: &dyn Fn(&RunResult) -> f64| {
                median(&mut results.iter().map(f).collect::<Vec<_>>())
            };
            cells.push(Cell {
                row: row.name,
                side: *side,
                iops: pick(&|r| r.iops),
                mb_per_s: pick(&|r| r.mb_per_s),
                lat_us: [0, 1, 2, 3].map(|p| pick(&|r| r.lat_us[p])),
            });
        }
    }
    drop(nbdkit);
    drop(tgt);
    let moved = movements(&nvme_addr, args.move_mib << 20)?;
    drop(node);
    print_table(&cells, args.repeat);
    print_movements(&moved);
    if let Some(path) = &args.json {
        let report = serde_json::json!({ "cells": cells, "movements": moved });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One way of moving data between the node's devices.
#[derive(serde::Serialize)]
struct Movement {
    what: &'static str,
    seconds: f64,
    mb_per_s: f64,
    network_bytes: u64,
}

const NQN: &str = "nqn.2026-11.io.sluice:node";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:sluice-bench-node";
const BLOCK: u32 = 4096;
/// Blocks per command of the movements (128 KiB; Copy takes up to 64 Ki).
const CHUNK_BLOCKS: u32 = 32;

/// An admin queue and one I/O queue of a new controller.
fn session(address: &str) -> Result<(QueueConnection, QueueConnection)> {
    let mut admin = QueueConnection::open(address, Digests::default())?;
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 0)?;
    admin.enable()?;
    admin.set_queue_count(1)?;
    let mut io = QueueConnection::open(address, Digests::default())?;
    io.connect(NQN, HOST, 1, cntlid, 0)?;
    io.in_capsule_bytes = admin.in_capsule_limit()?;
    Ok((admin, io))
}

fn movements(address: &str, bytes: u64) -> Result<Vec<Movement>> {
    use sluice_nvmf::command::Sqe;
    use sluice_nvmf::nvm::opcode;
    let (_admin, mut io) = session(address)?;
    let blocks = (bytes / BLOCK as u64) as u32;
    let mut out = Vec::new();
    let mut measure = |what,
                       io: &mut QueueConnection,
                       f: &mut dyn FnMut(&mut QueueConnection) -> Result<()>|
     -> Result<()> {
        let before = io.bytes_sent + io.bytes_received;
        let start = Instant::now();
        f(io)?;
        let seconds = start.elapsed().as_secs_f64();
        out.push(Movement {
            what,
            seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
            network_bytes: io.bytes_sent + io.bytes_received - before,
        });
        Ok(())
    };
    measure(
        "copy ns1 -> ns2, inside the node (Copy across)",
        &mut io,
        &mut |io| {
            in_runs(blocks, 65536, |at, n| {
                let copy = Sqe::new(opcode::COPY_ACROSS, 0)
                    .with_nsid(2)
                    .with_cdw(10, at)
                    .with_cdw(12, n - 1)
                    .with_cdw(13, 1)
                    .with_cdw(14, at);
                io.command(copy, &[]).map(drop)
            })
        },
    )?;
    measure(
        "copy ns1 -> ns2, through the initiator (read, write)",
        &mut io,
        &mut |io| {
            in_runs(blocks, CHUNK_BLOCKS, |at, n| {
                let data = io.read(1, at as u64, n, BLOCK)?;
                io.write(2, at as u64, &data, BLOCK)
            })
        },
    )?;
    let data = vec![0xa5u8; (CHUNK_BLOCKS * BLOCK) as usize];
    let piece = |n: u32| &data[..(n * BLOCK) as usize];
    measure(
        "write to ns1 and ns2, inside the node (MultiCast)",
        &mut io,
        &mut |io| {
            in_runs(blocks, CHUNK_BLOCKS, |at, n| {
                let multicast = Sqe::new(opcode::MULTICAST, 0)
                    .with_nsid(1)
                    .with_cdw(10, at)
                    .with_cdw(12, n - 1)
                    .with_cdw(13, 0b11);
                io.command(multicast, piece(n)).map(drop)
            })
        },
    )?;
    measure(
        "write to ns1 and ns2, through the initiator (two writes)",
        &mut io,
        &mut |io| {
            in_runs(blocks, CHUNK_BLOCKS, |at, n| {
                io.write(1, at as u64, piece(n), BLOCK)?;
                io.write(2, at as u64, piece(n), BLOCK)
            })
        },
    )?;
    // Every side did its work: both namespaces hold the last pattern.
    for nsid in [1, 2] {
        let last = io.read(
            nsid,
            (blocks - CHUNK_BLOCKS.min(blocks)) as u64,
            CHUNK_BLOCKS.min(blocks),
            BLOCK,
        )?;
        if last.iter().any(|&b| b != 0xa5) {
            bail!("namespace {nsid} does not hold what was written to it");
        }
    }
    Ok(out)
}

/// Calls `f(first, count)` for consecutive runs of at most `step` of
/// `blocks` blocks.
fn in_runs(
    blocks: u32,
    step: u32,
    mut f: impl FnMut(u32, u32) -> sluice_nvmf::initiator::Result<()>,
) -> Result<()> {
    let mut at = 0;
    while at < blocks {
        let n = (blocks - at).min(step);
        f(at, n)?;
        at += n;
    }
    Ok(())
}

fn print_movements(moved: &[Movement]) {
    println!("\nmoving data between the node's two devices:");
    println!(
        "{:<58} {:>9} {:>9} {:>16}",
        "what", "seconds", "MB/s", "network bytes"
    );
    for m in moved {
        println!(
            "{:<58} {:>9.2} {:>9.1} {:>16}",
            m.what, m.seconds, m.mb_per_s, m.network_bytes
        );
    }
}

/// Creates the file at `size` and fills it with data once (so reads touch
/// the disk, not holes).
fn prepare(device: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(device).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    if let Some(dir) = device.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    println!("filling {} ({} MiB) once...", device.display(), size >> 20);
    let out = Command::new("fio")
        .args([
            "--name=fill",
            "--rw=write",
            "--bs=1M",
            "--direct=1",
            "--ioengine=io_uring",
            "--iodepth=8",
        ])
        .arg(format!("--filename={}", device.display()))
        .arg(format!("--size={size}"))
        .output()?;
    if !out.status.success() {
        bail!(
            "filling the device: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn start_node(exe: &Path, device: &Path, second: &Path) -> Result<(Server, String, String)> {
    let mut child = Command::new(exe)
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--nbd",
            "127.0.0.1:0",
            "--device",
        ])
        .arg(device)
        .arg("--device")
        .arg(second)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting sluice node")?;
    let stdout = child.stdout.take().context("node stdout")?;
    let server = Server(child);
    let (mut nbd, mut nvme) = (None, None);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(at) = line.strip_prefix("sluice node: NBD on ") {
            nbd = Some(at.to_string());
        } else if let Some(rest) = line.split(" on nvme-tcp ").nth(1) {
            nvme = rest.split_whitespace().next().map(str::to_string);
        }
        if nbd.is_some() && nvme.is_some() {
            break;
        }
    }
    match (nbd, nvme) {
        (Some(nbd), Some(nvme)) => Ok((server, nbd, nvme)),
        _ => bail!("sluice node did not say where it listens"),
    }
}

fn start_nbdkit(device: &Path, port: u16) -> Result<Server> {
    let child = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "file"])
        .arg(format!("file={}", device.display()))
        .arg("cache=none")
        .stderr(Stdio::null())
        .spawn()
        .context("starting nbdkit")?;
    let server = Server(child);
    wait_listening(port, "nbdkit")?;
    Ok(server)
}

enum Target<'a> {
    File(&'a Path),
    Nbd(&'a str),
    Iscsi(&'a str),
}

/// The fio job of `row` on `target` with the fio at `fio`.
fn fio_run(
    fio: &Path,
    row: &Row,
    seconds: f64,
    size: u64,
    target: Target<'_>,
) -> Result<RunResult> {
    let file = match target {
        Target::File(path) => path,
        Target::Nbd(_) | Target::Iscsi(_) => Path::new("unused"),
    };
    let mut a = fio::args(file, size, row, seconds, fio::Memory::Malloc);
    let network = |engine: &str, a: &mut Vec<String>| {
        a.retain(|x| {
            ![
                "--filename=",
                "--ioengine=",
                "--direct=",
                "--fixedbufs=",
                "--registerfiles=",
            ]
            .iter()
            .any(|p| x.starts_with(p))
        });
        a.push(format!("--ioengine={engine}"));
    };
    match target {
        Target::File(_) => {}
        Target::Nbd(uri) => {
            network("nbd", &mut a);
            a.push(format!("--uri={uri}"));
        }
        Target::Iscsi(url) => {
            network("libiscsi", &mut a);
            // fio splits file names at ':'; the engine takes the URL escaped.
            a.push(format!("--filename={}", url.replace(':', "\\:")));
        }
    }
    let out = Command::new(fio)
        .args(&a)
        .output()
        .with_context(|| format!("running {}", fio.display()))?;
    if !out.status.success() {
        bail!(
            "fio failed for {}: {}",
            row.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fio::parse(&String::from_utf8_lossy(&out.stdout), row)
}

/// Where `scripts/fio-libiscsi` puts its fio: under the target directory
/// this binary was built in, else under the current directory.
fn default_fio_libiscsi() -> PathBuf {
    let beside_build = std::env::current_exe().ok().and_then(|exe| {
        let target = exe.parent()?.parent()?;
        Some(target.join("tools/fio-libiscsi/fio"))
    });
    match beside_build {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("target/tools/fio-libiscsi/fio"),
    }
}

/// The tgt side's tools are there: tgtd, tgtadm and a fio with the
/// libiscsi engine.
fn check_tgt(fio_libiscsi: &Path) -> Result<()> {
    for tool in ["tgtd", "tgtadm"] {
        if Command::new(tool).arg("--help").output().is_err() {
            bail!(
                "{tool} is not installed: run scripts/fio-libiscsi (it installs tgt), \
                 or pass --no-tgt to leave the tgt side out"
            );
        }
    }
    let engines = Command::new(fio_libiscsi).arg("--enghelp").output();
    match engines {
        Ok(o)
            if String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .any(|e| e == "libiscsi") =>
        {
            Ok(())
        }
        _ => bail!(
            "{} is not a fio with the libiscsi engine (Debian's fio has none): \
             run scripts/fio-libiscsi to build one there, pass --fio-libiscsi with \
             another, or --no-tgt to leave the tgt side out",
            fio_libiscsi.display()
        ),
    }
}

/// The target name tgtd serves the device under.
const TGT_IQN: &str = "iqn.2026-11.io.sluice:bench-node";

/// tgtd serving the device file as LUN 1 of one iSCSI target on a free
/// port of 127.0.0.1; stopped (and its control socket removed) on drop.
struct Tgt {
    daemon: Server,
    /// tgtadm's control port (tgtd's `-C`, at most 32767): one whose
    /// socket no other tgtd holds.
    control: u16,
    /// The LUN as fio's libiscsi engine names it.
    url: String,
}

impl Tgt {
    fn start(device: &Path) -> Result<Tgt> {
        let port = free_port()?;
        let control = (1000..32767)
            .map(|n| 1000 + (port + n) % 31767)
            .find(|n| !Path::new(&format!("/var/run/tgtd/socket.{n}")).exists())
            .context("no free tgtd control port (every /var/run/tgtd/socket.N exists)")?;
        // What tgtd says goes to a file: read only if it fails to start.
        let log_path = std::env::temp_dir().join(format!(
            "sluice-bench-tgtd-{}-{port}.log",
            std::process::id()
        ));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        // Open, the file lives on; its name is not needed past here.
        let _ = std::fs::remove_file(&log_path);
        let child = Command::new("tgtd")
            .args(["-f", "-C", &control.to_string(), "--iscsi"])
            .arg(format!("portal=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log.try_clone()?)
            .spawn()
            .context("starting tgtd")?;
        let mut tgt = Tgt {
            daemon: Server(child),
            control,
            url: format!("iscsi://127.0.0.1:{port}/{TGT_IQN}/1"),
        };
        tgt.wait_listening(port, log)?;
        let device = std::fs::canonicalize(device)?;
        tgt.admin(&[
            "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN,
        ])?;
        tgt.admin(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "--bstype",
            "aio",
            "-b",
            &device.to_string_lossy(),
        ])?;
        tgt.admin(&[
            "--op",
            "bind",
            "--mode",
            "target",
            "--tid",
            "1",
            "-I",
            "127.0.0.1",
        ])?;
        Ok(tgt)
    }

    /// Waits until tgtd listens on `port`; if it exits first, fails with
    /// what it wrote to `log`.
    fn wait_listening(&mut self, port: u16, mut log: std::fs::File) -> Result<()> {
        use std::io::{Read, Seek};
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = self.daemon.0.try_wait()? {
                let mut said = String::new();
                log.rewind()?;
                log.read_to_string(&mut said)?;
                bail!(
                    "tgtd exited ({status}) before it listened: {}\n(tgtd needs root; \
                     --no-tgt leaves the tgt side out)",
                    said.trim()
                );
            }
            if Instant::now() > deadline {
                bail!("tgtd did not listen on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn admin(&self, args: &[&str]) -> Result<()> {
        let out = Command::new("tgtadm")
            .args(["-C", &self.control.to_string(), "--lld", "iscsi"])
            .args(args)
            .output()
            .context("running tgtadm")?;
        if !out.status.success() {
            bail!(
                "tgtadm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        // tgtd ignores SIGTERM while it serves a target; the kill of the
        // daemon's own drop stops it, and its control socket stays behind.
        let _ = self.daemon.0.kill();
        let _ = self.daemon.0.wait();
        for suffix in ["", ".lock"] {
            let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}{suffix}", self.control));
        }
    }
}

/// Our initiator: the row's queue depth spread over up to `max_queues` I/O
/// queues, for `seconds`.
fn initiator_run(
    row: &Row,
    seconds: f64,
    address: &str,
    size: u64,
    max_queues: u16,
) -> Result<RunResult> {
    initiator_load(&InitiatorLoad {
        address,
        nqn: NQN,
        host_nqn: HOST,
        tls: None,
        digests: Digests::default(),
        nsid: 1,
        block_size_bytes: 4096,
        namespace_blocks: size / 4096,
        io_bytes: row.block_bytes,
        write: row.write,
        random: row.random,
        queue_depth: row.queue_depth,
        queues: max_queues,
        seconds,
    })
}

/// A load our NVMe/TCP initiator puts on a target (`sluice bench node`,
/// `sluice nvmf bench`).
#[derive(Debug, Clone)]
pub struct InitiatorLoad<'a> {
    /// The target's address.
    pub address: &'a str,
    /// The subsystem's NQN.
    pub nqn: &'a str,
    /// This host's NQN.
    pub host_nqn: &'a str,
    /// Header and data digests to ask for.
    pub digests: Digests,
    /// TLS with a pre-shared key, or plain TCP.
    pub tls: Option<&'a sluice_nvmf::tls::TlsClient>,
    /// The namespace.
    pub nsid: u32,
    /// Its block size.
    pub block_size_bytes: u32,
    /// Its size in blocks.
    pub namespace_blocks: u64,
    /// Bytes per command (whole blocks).
    pub io_bytes: usize,
    /// Writes (of a fixed pattern) or reads.
    pub write: bool,
    /// Random offsets (aligned to `io_bytes`) or sequential ones.
    pub random: bool,
    /// Commands in flight in all.
    pub queue_depth: usize,
    /// Most I/O queues (connections, a thread each) to spread them over.
    pub queues: u16,
    /// How long.
    pub seconds: f64,
}

/// Runs `load`: each queue's thread keeps its share of the depth in flight
/// (a pipeline) until the time is up; IOPS, MB/s and the latency of every
/// command.
pub fn initiator_load(load: &InitiatorLoad<'_>) -> Result<RunResult> {
    let bs = load.block_size_bytes as usize;
    if load.io_bytes == 0 || !load.io_bytes.is_multiple_of(bs) {
        bail!(
            "the I/O size {} must be a whole number of the namespace's {bs}-byte blocks",
            load.io_bytes
        );
    }
    let blocks_per_io = (load.io_bytes / bs) as u64;
    if load.namespace_blocks <= blocks_per_io {
        bail!(
            "the namespace ({} blocks) is too small for one I/O",
            load.namespace_blocks
        );
    }
    let queues = (load.queue_depth as u16).clamp(1, load.queues.max(1));
    let mut admin = QueueConnection::open_with(load.address, load.digests, load.tls)?;
    let cntlid = admin.connect(load.nqn, load.host_nqn, 0, 0xffff, 0)?;
    admin.enable()?;
    let granted = admin.set_queue_count(queues)?.min(queues);
    let in_capsule = admin.in_capsule_limit()?;
    let lbas = load.namespace_blocks - blocks_per_io;
    let deadline = Instant::now() + Duration::from_secs_f64(load.seconds);
    let started = Instant::now();
    let per_queue = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..granted)
            .map(|q| {
                scope
                    .spawn(move || queue_load(load, q, granted, cntlid, in_capsule, lbas, deadline))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("an initiator thread panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut total = 0u64;
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    for (n, h) in per_queue {
        total += n;
        hist.add(h)?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(load.seconds);
    let iops = total as f64 / elapsed;
    let at = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(RunResult {
        iops,
        mb_per_s: iops * load.io_bytes as f64 / 1e6,
        lat_us: [at(0.5), at(0.9), at(0.99), at(0.999)],
    })
}

/// One queue of [`initiator_load`]: its share of the depth in flight until
/// `deadline`; commands completed and their latencies.
fn queue_load(
    load: &InitiatorLoad<'_>,
    q: u16,
    queues: u16,
    cntlid: u16,
    in_capsule: usize,
    lbas: u64,
    deadline: Instant,
) -> Result<(u64, hdrhistogram::Histogram<u64>)> {
    let bs = load.block_size_bytes;
    let blocks_per_io = (load.io_bytes / bs as usize) as u64;
    // This queue's share of the depth (the first ones take the rest).
    let depth = load.queue_depth / queues as usize
        + usize::from((q as usize) < load.queue_depth % queues as usize);
    let mut io = QueueConnection::open_with(load.address, load.digests, load.tls)?;
    io.connect(load.nqn, load.host_nqn, q + 1, cntlid, 0)?;
    io.in_capsule_bytes = in_capsule;
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(q as u64 + 1);
    let data = vec![0x5au8; load.io_bytes];
    let mut next_seq = (q as u64 * lbas / queues as u64) / blocks_per_io * blocks_per_io;
    let next = || {
        if Instant::now() >= deadline {
            return None;
        }
        let lba = if load.random {
            rng.gen_range(0..lbas) / blocks_per_io * blocks_per_io
        } else {
            let l = next_seq;
            next_seq = (next_seq + blocks_per_io) % lbas;
            l
        };
        Some(if load.write {
            (
                rw(io::WRITE, load.nsid, lba, blocks_per_io as u32),
                &data[..],
            )
        } else {
            (read_sqe(load.nsid, lba, blocks_per_io as u32, bs), &[][..])
        })
    };
    let mut done = 0u64;
    io.pipeline(depth, next, |_, answer, sent_at| {
        answer?;
        hist.record(sent_at.elapsed().as_nanos() as u64)
            .map_err(|e| InitiatorError::Protocol(e.to_string()))?;
        done += 1;
        Ok(())
    })?;
    Ok((done, hist))
}

fn print_table(cells: &[Cell], repeat: usize) {
    println!("\nsluice bench node: medians of {repeat} runs");
    println!(
        "{:<18} {:<32} {:>9} {:>9}  {:<28} {:>9} {:>7} {:>8}",
        "row",
        "side",
        "IOPS",
        "MB/s",
        "lat us p50/p90/p99/p99.9",
        "vs nbdkit",
        "vs tgt",
        "vs local"
    );
    let of = |row: &str, side| cells.iter().find(|x| x.row == row && x.side == side);
    for c in cells {
        let ratio = |side| {
            if c.side == side {
                return String::new();
            }
            of(c.row, side).map_or(String::new(), |b| format!("{:.2}", c.iops / b.iops))
        };
        println!(
            "{:<18} {:<32} {:>9.0} {:>9.1}  {:<28} {:>9} {:>7} {:>8}",
            c.row,
            c.side.label(),
            c.iops,
            c.mb_per_s,
            format!(
                "{:.0}/{:.0}/{:.0}/{:.0}",
                c.lat_us[0], c.lat_us[1], c.lat_us[2], c.lat_us[3]
            ),
            ratio(Side::Nbdkit),
            ratio(Side::Tgt),
            ratio(Side::Local),
        );
    }
    println!(
        "\ntails of sluice node, NVMe/TCP against the other servers (their p90 / p99 over ours):"
    );
    for ours in cells.iter().filter(|c| c.side == Side::SluiceNvmeTcp) {
        let mut line = format!(
            "{:<18} ours {:.0}/{:.0} us",
            ours.row, ours.lat_us[1], ours.lat_us[2]
        );
        for side in [Side::Nbdkit, Side::Tgt] {
            if let Some(b) = of(ours.row, side) {
                line += &format!(
                    "; {} {:.0}/{:.0} us ({:.2}x / {:.2}x)",
                    side.short(),
                    b.lat_us[1],
                    b.lat_us[2],
                    b.lat_us[1] / ours.lat_us[1],
                    b.lat_us[2] / ours.lat_us[2]
                );
            }
        }
        println!("{line}");
    }
}
