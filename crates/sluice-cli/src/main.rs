//! `sluice`: the command line over the Sluice crates. Thin by design: parse,
//! call a crate, print.
#![warn(clippy::expect_used)]

#[cfg(feature = "full")]
mod config_file;
mod graph;
#[cfg(feature = "full")]
mod import;
mod kv;
#[cfg(feature = "full")]
mod node;
#[cfg(feature = "full")]
mod nvmf;
#[cfg(feature = "full")]
mod pagination;
mod papers;
#[cfg(feature = "full")]
mod query;
#[cfg(feature = "full")]
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Scans hand out many short-lived key and value buffers; glibc's malloc
/// spends a fifth of a short scan's time on them, mimalloc a fraction.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t`, mimalloc.h).
const MI_OPTION_PURGE_DELAY: std::os::raw::c_int = 15;

extern "C" {
    fn mi_option_get(option: std::os::raw::c_int) -> std::os::raw::c_long;
    fn mi_option_set(option: std::os::raw::c_int, value: std::os::raw::c_long);
}

/// Sets mimalloc's purge delay for this process to what sluice-io's
/// policy says for its control group ([`sluice_io::mem::freed_memory_kept_ms`])
/// unless MIMALLOC_PURGE_DELAY says otherwise; returns the delay in force.
fn keep_freed_memory() -> std::os::raw::c_long {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        let delay_ms: std::os::raw::c_long =
            sluice_io::mem::freed_memory_kept_ms(sluice_io::probe::cgroup_memory_limit_bytes());
        // SAFETY: mimalloc's own option setter, called with an option of
        // its enum and a value it documents (milliseconds, -1: never).
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, delay_ms) };
    }
    // SAFETY: reads one option of mimalloc's enum.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

/// The version with the store format this build reads and writes
/// (scripts/main remakes its database when this changes).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), ", store format 4");

#[derive(Parser)]
#[command(
    name = "sluice",
    version = VERSION,
    about = "Direct-I/O document and key/value store: tools and benchmarks"
)]
#[cfg_attr(
    not(feature = "full"),
    command(
        after_help = "This build has the demo's commands only (scripts/main builds it so); \
                          `cargo build --release -p sluice-cli` builds every command."
    )
)]
pub(crate) struct Cli {
    /// How log lines are written to standard error: `text` for people,
    /// `json` (one object a line: time, level, module, message) for log
    /// collectors. Which lines: RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// See [`Cli::log_format`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// Starts the logger: RUST_LOG's filter (default `info`), lines in `format`.
fn start_logging(format: LogFormat) {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    match format {
        LogFormat::Text => builder.format_timestamp(None).format_target(false),
        LogFormat::Json => builder.format(|buf, record| {
            use std::io::Write;
            let line = serde_json::json!({
                "time": buf.timestamp_millis().to_string(),
                "level": record.level().as_str(),
                "module": record.target(),
                "message": record.args().to_string(),
            });
            writeln!(buf, "{line}")
        }),
    };
    builder.init();
}

/// Options of every command that opens a store.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreOpenArgs {
    /// What to do if the store's write-ahead log is damaged before its end:
    /// strict (refuse, naming the damaged blocks), point-in-time (keep the
    /// log up to the first damaged block, drop the rest) or skip-damaged
    /// (keep every intact block, drop only the records in damaged ones).
    #[arg(long, value_name = "MODE", default_value = "strict")]
    recover_wal: sluice_store::wal::WalRecovery,
}

impl StoreOpenArgs {
    /// `base` with these options applied.
    pub fn config(&self, base: sluice_store::StoreConfig) -> sluice_store::StoreConfig {
        sluice_store::StoreConfig {
            wal_recovery: self.recover_wal,
            ..base
        }
    }

    /// The store on `devices`, opened with `base` and these options.
    pub fn files(
        &self,
        devices: &[std::path::PathBuf],
        base: sluice_store::StoreConfig,
    ) -> sluice_store::StoreFiles {
        sluice_store::StoreFiles::new(devices)
            .config(self.config(base))
            .when_missing("make one with `sluice kv --device PATH format --create-mib N`")
    }

    /// Opens the existing store on `devices` with `base` and these options.
    pub fn open(
        &self,
        devices: &[std::path::PathBuf],
        base: sluice_store::StoreConfig,
    ) -> anyhow::Result<sluice_store::Store> {
        Ok(self.files(devices, base).open()?)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks, each against its baseline in the same run.
    #[cfg(feature = "full")]
    #[command(subcommand)]
    Bench(sluice_bench::BenchCommand),
    /// The key/value store on a device: format, put, get, del, scan, stats.
    Kv(kv::KvArgs),
    /// The research-paper data set of the near-data demo.
    Papers(papers::PapersArgs),
    /// SCAN a keyspace with a predicate, a projection and a limit, run in the engine.
    #[cfg(feature = "full")]
    Query(query::QueryArgs),
    /// BFS and Betweenness Centrality over an edge keyspace.
    Graph(graph::GraphArgs),
    /// Bulk-index seeded paper documents (1556 bytes each) into OpenSearch.
    #[cfg(feature = "full")]
    Load(pagination::LoadArgs),
    /// Export an index onto a device: sliced point-in-time (or scroll) pages written with direct I/O.
    #[cfg(feature = "full")]
    Export(pagination::ExportArgs),
    /// Read an export back at device speed, parsing each page as it arrives.
    #[cfg(feature = "full")]
    Read(pagination::ReadArgs),
    /// Serve the store over the Redis protocol (thread per core, durable writes)
    /// and, with --http, an Elasticsearch-compatible HTTP API.
    #[cfg(feature = "full")]
    Serve(Box<serve::ServeArgs>),
    /// Import an export device into an index of the store `sluice serve --http` serves.
    #[cfg(feature = "full")]
    Import(import::ImportArgs),
    /// Serve devices to NVMe/TCP hosts (`nvme connect -t tcp`): the storage node.
    #[cfg(feature = "full")]
    Node(node::NodeArgs),
    /// Reach an NVMe/TCP target with Sluice's initiator: identify, read, write, copy in the node.
    #[cfg(feature = "full")]
    Nvmf(nvmf::NvmfArgs),
    /// Print what this kernel and process support (io_uring opcodes, SQPOLL, memlock).
    Probe,
    /// A command this build leaves out (built without the `full` feature).
    #[cfg(not(feature = "full"))]
    #[command(external_subcommand)]
    LeftOut(Vec<String>),
}

/// The commands of a build without the `full` feature.
#[cfg(not(feature = "full"))]
const DEMO_COMMANDS: &str = "kv, papers, graph and probe";

/// The error for a command this build leaves out.
#[cfg(not(feature = "full"))]
fn left_out(args: &[String]) -> anyhow::Result<()> {
    let name = args.first().map_or("", String::as_str);
    anyhow::bail!(
        "`sluice {name}` is not in this build: it has the demo's commands only ({DEMO_COMMANDS}), \
         as scripts/main builds it; build every command with `cargo build --release -p sluice-cli` \
         (scripts/test does)"
    )
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = match parse_args() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    start_logging(cli.log_format);
    let result = match cli.command {
        #[cfg(feature = "full")]
        Command::Bench(cmd) => sluice_bench::run(cmd),
        Command::Kv(args) => kv::run(&args),
        Command::Papers(args) => papers::run(&args),
        #[cfg(feature = "full")]
        Command::Query(args) => query::run(&args),
        Command::Graph(args) => graph::run(&args),
        #[cfg(feature = "full")]
        Command::Load(args) => pagination::run_load(&args),
        #[cfg(feature = "full")]
        Command::Export(args) => pagination::run_export(&args),
        #[cfg(feature = "full")]
        Command::Read(args) => pagination::run_read(&args),
        #[cfg(feature = "full")]
        Command::Serve(args) => serve::run(&args),
        #[cfg(feature = "full")]
        Command::Import(args) => import::run(&args),
        #[cfg(feature = "full")]
        Command::Node(args) => node::run(&args),
        #[cfg(feature = "full")]
        Command::Nvmf(args) => nvmf::run(&args),
        Command::Probe => {
            print_probe();
            Ok(())
        }
        #[cfg(not(feature = "full"))]
        Command::LeftOut(args) => left_out(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line, with the keys of a `--config` file put in.
fn parse_args() -> anyhow::Result<Cli> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    #[cfg(feature = "full")]
    let args = {
        use clap::CommandFactory;
        config_file::expand(args, &Cli::command())?
    };
    Ok(Cli::parse_from(args))
}

fn print_probe() {
    let p = sluice_io::probe::kernel();
    println!("kernel           {}", p.kernel_release);
    match &p.uring {
        Ok(u) => {
            println!("io_uring         yes");
            println!("  READ/WRITE     {}/{}", u.read, u.write);
            println!("  READ_FIXED     {}", u.read_fixed);
            println!("  WRITE_FIXED    {}", u.write_fixed);
            println!("  FSYNC          {}", u.fsync);
            println!("  sparse buffers {}", u.buffers_sparse);
            println!("  SQPOLL         {}", u.sqpoll_error().unwrap_or("yes"));
        }
        Err(why) => println!("io_uring         no: {why}"),
    }
    let limit = p.memlock.limit_bytes;
    let limit = if limit == u64::MAX {
        "unlimited".to_string()
    } else {
        format!("{limit} bytes")
    };
    println!(
        "memlock limit    {limit}{}",
        if p.memlock.cap_ipc_lock {
            " (lifted: CAP_IPC_LOCK)"
        } else {
            ""
        }
    );
}

/// Cores this process may run on: the default worker count of operators
/// that split their work.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(64))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_the_store_format_of_this_build() {
        let want = format!(
            ", store format {}",
            sluice_store::superblock::FORMAT_VERSION
        );
        assert!(super::VERSION.ends_with(&want), "{}", super::VERSION);
    }

    /// The option set is the purge delay: mimalloc reads the same option
    /// from MIMALLOC_PURGE_DELAY, and its default is not our value.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            eprintln!("not checked: MIMALLOC_PURGE_DELAY is set, and mimalloc took it");
            return;
        }
        // SAFETY: reads one option of mimalloc's enum.
        let default = unsafe { super::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(default, 1000, "mimalloc's default purge delay (v3)");
        let want =
            sluice_io::mem::freed_memory_kept_ms(sluice_io::probe::cgroup_memory_limit_bytes());
        assert_eq!(super::keep_freed_memory(), want);
    }

    /// The heap is not advised for transparent huge pages (mimalloc's
    /// `no_thp`): where the kernel gives huge pages only to memory advised
    /// for them, 64 MiB allocated and touched holds none.
    #[test]
    fn the_heap_gets_no_transparent_huge_pages_where_they_are_advised_only() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") {
            eprintln!("not checked: THP mode here is {mode:?}, not madvise");
            return;
        }
        let len = 64 << 20;
        let mut heap = vec![0u8; len];
        for page in heap.chunks_mut(4096) {
            page[0] = 1;
        }
        let heap = std::hint::black_box(heap);
        let huge_kib = huge_page_kib_over(heap.as_ptr() as usize, len);
        assert_eq!(
            huge_kib, 0,
            "the heap's 64 MiB came with {huge_kib} KiB of huge pages"
        );
    }

    /// AnonHugePages of the mappings of /proc/self/smaps that overlap
    /// `[start, start + len)`, in KiB.
    fn huge_page_kib_over(start: usize, len: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            // A mapping's first line: "lo-hi perms ...", in hex.
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((Ok(lo), Ok(hi))) =
                range.map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)))
            {
                inside = lo < start + len && start < hi;
            } else if let Some(v) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
        kib
    }
}
