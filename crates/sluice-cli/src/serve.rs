//! `sluice serve`: the Redis-protocol server on a device (set).

use anyhow::{bail, Context, Result};
use sluice_redis::db::Db;
use sluice_server::resp::Limits;
use sluice_server::server::{Durability, Server, ServerConfig};
use sluice_server::session::Users;
use sluice_store::StoreConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A TOML file whose keys are these options (`resp = "0.0.0.0:6379"`,
    /// `device = ["a.dev", "b.dev"]`), with a `[redis]` table of Redis
    /// parameters that CONFIG REWRITE writes back; an option given here
    /// wins over its key (docs/examples/sluice-serve.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print every option as a commented key of a `--config` file, and exit.
    #[arg(long)]
    config_example: bool,
    /// Serve Prometheus's `/metrics` (the Redis protocol's, the HTTP API's
    /// and the store's figures) on this loopback address, without a
    /// password; beyond loopback, the HTTP API's `/_sluice/metrics` serves
    /// the same behind its authentication.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// A Redis parameter set at start, as `CONFIG SET NAME VALUE` sets it
    /// (`--redis-param notify-keyspace-events=KEA`); repeat it.
    #[arg(long = "redis-param", value_name = "NAME=VALUE")]
    redis_params: Vec<String>,
    #[command(flatten)]
    store: crate::StoreOpenArgs,
    /// Device: a file (created and formatted on first start) or a block
    /// device. Repeat it for a device set: the first holds the WAL,
    /// manifest and table indexes, the others the table data.
    #[arg(long = "device", default_value = "data/serve.dev")]
    devices: Vec<PathBuf>,
    /// Size of each device file created on first start, in MiB.
    #[arg(long, default_value_t = 4096)]
    create_mib: u64,
    /// Where the Redis protocol listens (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:6379")]
    resp: SocketAddr,
    /// Also serve the Redis protocol over TLS here (needs --tls-cert and
    /// --tls-key).
    #[arg(long, value_name = "ADDR")]
    resp_tls: Option<SocketAddr>,
    /// The TLS certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA certificates (PEM) a TLS client's certificate must chain to:
    /// TLS client authentication on --resp-tls and --http-tls (Redis's
    /// tls-ca-cert-file).
    #[arg(long, value_name = "FILE")]
    tls_ca_cert: Option<PathBuf>,
    /// With --tls-ca-cert: `yes` refuses TLS clients without a
    /// certificate, `optional` lets them in (a bad certificate is refused
    /// either way), as Redis's tls-auth-clients.
    #[arg(long, default_value = "yes", value_parser = ["yes", "optional"], requires = "tls_ca_cert")]
    tls_auth_clients: String,
    /// Also serve the Redis protocol on this Unix socket (Redis's
    /// `unixsocket`).
    #[arg(long = "unixsocket", value_name = "PATH")]
    unix_socket: Option<PathBuf>,
    /// Permission bits of the --unixsocket socket, in octal.
    #[arg(long = "unixsocketperm", default_value = "0660", value_parser = parse_mode)]
    unix_socket_mode: u32,
    /// Also serve local clients through shared-memory rings: the Unix
    /// socket they connect to once (see sluice-client, `shm:///PATH`).
    #[arg(long, value_name = "PATH")]
    shm: Option<PathBuf>,
    /// Permission bits of the --shm socket, in octal: who may connect.
    #[arg(long, default_value = "0660", value_parser = parse_mode)]
    shm_mode: u32,
    /// Most shared-memory clients at once (they count toward
    /// --max-clients too).
    #[arg(long, default_value_t = 1024)]
    shm_max_clients: usize,
    /// Bytes of each shared-memory client's request ring and response ring,
    /// in KiB (a power of two, 4 to 1048576).
    #[arg(long, default_value_t = 1024)]
    shm_ring_kib: usize,
    /// Worker threads, each pinned to a core (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// When a write is acknowledged: always (after its group commit is on
    /// the device), everysec (made durable within a second), none (at the
    /// next flush or at shutdown).
    #[arg(long, default_value = "always")]
    durability: Durability,
    /// Redis's ACL file: users allowed in and what each may do, as Redis's
    /// `user NAME on >PASSWORD ~keys:* +@read` lines (ACL LIST prints
    /// them; ACL SAVE writes this file, ACL LOAD rereads it), or
    /// NAME:PASSWORD lines for users who may run everything (`default:PASS`
    /// makes the default user need a password, as Redis's requirepass).
    /// Secrets come from files or the environment, never the command line,
    /// where `ps` shows them to every user of the machine.
    #[arg(long, value_name = "FILE")]
    users_file: Option<PathBuf>,
    /// A file whose first line is the default user's password (Redis's
    /// requirepass); or set SLUICE_REQUIREPASS.
    #[arg(long, value_name = "FILE")]
    requirepass_file: Option<PathBuf>,
    /// Refused: a password on the command line is visible in `ps`.
    #[arg(long = "user", value_name = "NAME:PASSWORD", hide = true)]
    users_on_argv: Vec<String>,
    /// Refused: a password on the command line is visible in `ps`.
    #[arg(long = "requirepass", hide = true)]
    requirepass_on_argv: Option<String>,
    /// Redis's protected-mode: while the default user has no password,
    /// only clients on 127.0.0.1 and ::1 (and the Unix socket and shared
    /// memory) are served; others get -DENIED, and the HTTP API answers
    /// them 403 unless it has users. `no` serves everyone who can connect.
    #[arg(long, default_value = "yes", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    protected_mode: bool,
    /// Most clients connected at once.
    #[arg(long, default_value_t = 10_000)]
    max_clients: usize,
    /// Close a client idle this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    /// Longest bulk string a request may carry, in bytes.
    #[arg(long, default_value_t = sluice_server::resp::DEFAULT_BULK_MAX_BYTES)]
    proto_max_bulk_len: i64,
    /// Memtable size before a flush to a table, in MiB.
    #[arg(long, default_value_t = 64)]
    write_buffer_mib: usize,
    /// Size compaction aims its output tables at, in MiB (a table is built
    /// in memory before it is written: this and the write buffer bound
    /// the memory flushes and compactions take).
    #[arg(long, default_value_t = 64)]
    table_mib: usize,
    /// Decoded data blocks kept in memory, in MiB.
    #[arg(long, default_value_t = 256)]
    block_cache_mib: usize,
    /// SQPOLL for the WAL's engines with this idle time in ms: a commit
    /// then makes no system call while their kernel threads are awake
    /// (costs a core each while busy; off by default, see BENCHMARKS).
    #[arg(long, value_name = "MS")]
    wal_sqpoll: Option<u32>,
    /// A memory-backed directory (tmpfs) for the log's mirror: a file per
    /// device in which every log record outlives the process, so that an
    /// everysec write is answered without waiting for a device write and
    /// still survives kill -9 (read back at the next start; see
    /// docs/RELIABILITY.md). Lost with the machine, as Redis's page cache is.
    #[arg(long, default_value = DEFAULT_LOG_MIRROR_DIR, value_name = "DIR")]
    log_mirror_dir: PathBuf,
    /// Size of the log's mirror in MiB; 0: none (everysec replies then
    /// wait for their group's device write; a mirror left by a crash is
    /// still read back).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(0..=1024))]
    log_mirror_mib: u64,
    /// CPU priority of the background threads (flushes, compactions, the
    /// expiry sweep): idle runs them only on cores no worker or other
    /// process wants, so requests never wait out their time slices;
    /// normal gives them the same share as the workers.
    #[arg(long, default_value = "idle")]
    background_cpu: sluice_io::cpu::BackgroundCpu,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    no_pin: bool,
    /// Also serve the Elasticsearch/OpenSearch-compatible HTTP API here
    /// (docs/HTTP.md; port 0: any free port, printed).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// A file of users the HTTP API lets in with basic auth, a
    /// NAME:PASSWORD line each (none, and no keys: no authentication, and
    /// then only local clients unless --protected-mode no).
    #[arg(long, value_name = "FILE")]
    http_users_file: Option<PathBuf>,
    /// A file of API keys the HTTP API accepts (`Authorization: ApiKey
    /// base64(ID:KEY)`), an ID:KEY line each.
    #[arg(long, value_name = "FILE")]
    http_api_keys_file: Option<PathBuf>,
    /// Refused: a password on the command line is visible in `ps`.
    #[arg(long = "http-user", hide = true)]
    http_users_on_argv: Vec<String>,
    /// Refused: a key on the command line is visible in `ps`.
    #[arg(long = "http-api-key", hide = true)]
    http_api_keys_on_argv: Vec<String>,
    /// A whole HTTP request must arrive within this many seconds of its
    /// first byte, and each write of an answer be taken within it.
    #[arg(long, default_value_t = 60)]
    http_request_timeout_secs: u64,
    /// Serve the HTTP API over TLS with --tls-cert and --tls-key.
    #[arg(long)]
    http_tls: bool,
    /// Most HTTP connections open at once (each is a slot on the HTTP
    /// ring, not a thread).
    #[arg(long, default_value_t = 1024)]
    http_max_connections: usize,
    /// Threads that run HTTP requests, shared by every connection (0: four
    /// per core, at least eight).
    #[arg(long, default_value_t = 0)]
    http_request_threads: usize,
    /// Threads serving HTTP connections on network rings (0: one per two
    /// cores, at most four).
    #[arg(long, default_value_t = 0)]
    http_ring_threads: usize,
    /// Largest HTTP request body, in MiB (http.max_content_length).
    #[arg(long, default_value_t = 100)]
    http_max_content_mib: usize,
    /// Elasticsearch's action.destructive_requires_name: deleting indices
    /// takes their names; `no` lets `DELETE /_all` and wildcards drop every
    /// index they match.
    #[arg(long, default_value = "yes", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    http_destructive_requires_name: bool,
    /// Memory the graph endpoints (`/_sluice/graph/bc`, the demo) may hold
    /// at once, all requests together, in MiB; past it they are answered
    /// 429.
    #[arg(long, default_value_t = 1024)]
    http_native_memory_mib: u64,
    /// Memory for the field columns that answer counts and aggregations
    /// without reading documents, in MiB, all indices together (0: none;
    /// every count and aggregation scans).
    #[arg(long, default_value_t = 1024)]
    http_columns_mib: u64,
}

/// Refuses secrets given on the command line, naming the way to give them.
fn refuse_secrets_on_argv(args: &ServeArgs) -> Result<()> {
    let given = |present: bool, flag: &str, instead: &str| {
        if present {
            bail!("{flag} puts a secret on the command line, where `ps` shows it to every user of this machine: {instead}");
        }
        Ok(())
    };
    given(
        args.requirepass_on_argv.is_some(),
        "--requirepass",
        "write it to a file (chmod 600) and give --requirepass-file FILE, or set SLUICE_REQUIREPASS",
    )?;
    given(
        !args.users_on_argv.is_empty(),
        "--user",
        "write NAME:PASSWORD lines to a file (chmod 600) and give --users-file FILE",
    )?;
    given(
        !args.http_users_on_argv.is_empty(),
        "--http-user",
        "write NAME:PASSWORD lines to a file (chmod 600) and give --http-users-file FILE",
    )?;
    given(
        !args.http_api_keys_on_argv.is_empty(),
        "--http-api-key",
        "write ID:KEY lines to a file (chmod 600) and give --http-api-keys-file FILE",
    )
}

/// The Redis protocol's users: the ACL file (`--users-file`: Redis's
/// `user NAME rules...` lines or `NAME:PASSWORD` lines), and the default
/// user's password (`--requirepass-file` or SLUICE_REQUIREPASS).
fn users(args: &ServeArgs) -> Result<Users> {
    let mut loaded = match &args.users_file {
        Some(path) => sluice_server::acl::load_file(path)
            .map_err(|e| anyhow::anyhow!("--users-file {}: {e}", path.display()))?,
        None => Vec::new(),
    };
    let requirepass = match &args.requirepass_file {
        Some(path) => Some(sluice_auth::Secret::from_file(path, "--requirepass-file")?),
        None => sluice_auth::Secret::from_env("SLUICE_REQUIREPASS"),
    };
    if let Some(password) = requirepass {
        let mut password_rule = b">".to_vec();
        password_rule.extend_from_slice(password.expose());
        let at = match loaded.iter().position(|u| u.name() == b"default") {
            Some(at) => at,
            None => {
                loaded.push(sluice_server::acl::User::default_user());
                loaded.len() - 1
            }
        };
        loaded[at]
            .apply(&[b"resetpass".to_vec(), password_rule])
            .map_err(|e| anyhow::anyhow!("--requirepass-file: {e}"))?;
    }
    Ok(Users::new(loaded, args.users_file.clone()))
}

/// Credentials from `path`, or none.
fn credentials(path: &Option<PathBuf>, flag: &str) -> Result<sluice_auth::Credentials> {
    Ok(match path {
        Some(path) => sluice_auth::Credentials::from_file(path, flag)?,
        None => sluice_auth::Credentials::new(),
    })
}

const DEFAULT_LOG_MIRROR_DIR: &str = "/dev/shm";

/// The log mirror of the first device (the one with the log): a file in
/// --log-mirror-dir named by the device's file name and a hash of its
/// canonical path, so that a copy of the device elsewhere never takes its
/// records. None where the default directory is missing (said in the log).
fn log_mirror(args: &ServeArgs) -> Result<Option<sluice_store::LogMirrorConfig>> {
    let dir = &args.log_mirror_dir;
    if !dir.is_dir() {
        if dir.as_os_str() != DEFAULT_LOG_MIRROR_DIR {
            bail!(
                "--log-mirror-dir {}: not a directory; give a memory-backed one (tmpfs, such as /dev/shm) or --log-mirror-mib 0",
                dir.display()
            );
        }
        log::warn!(
            "no {DEFAULT_LOG_MIRROR_DIR}: no log mirror; everysec writes wait for the device"
        );
        return Ok(None);
    }
    let device = &args.devices[0];
    // The device may not exist yet: its directory's canonical path then
    // (the directory made now, as the store would make it, so that the
    // name is the same at every start).
    let canonical = match device.canonicalize() {
        Ok(p) => p,
        Err(_) => {
            let parent = device.parent().filter(|p| !p.as_os_str().is_empty());
            let parent = parent.unwrap_or(std::path::Path::new("."));
            let name = device.file_name().unwrap_or_default();
            std::fs::create_dir_all(parent)
                .and_then(|()| parent.canonicalize())
                .with_context(|| format!("--device {}", device.display()))?
                .join(name)
        }
    };
    let hash = canonical
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let name = canonical
        .file_name()
        .map_or("device".into(), |n| n.to_string_lossy().into_owned());
    Ok(Some(sluice_store::LogMirrorConfig {
        path: dir.join(format!("sluice-{name}-{hash:016x}.log-mirror")),
        size_bytes: (args.log_mirror_mib as usize) << 20,
    }))
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if args.config_example {
        print!("{}", crate::config_file::example_of("serve"));
        return Ok(());
    }
    // Every flag is checked before the device is touched.
    let start_parameters = redis_params(&args.redis_params)?;
    let metrics_listener = match args.metrics {
        Some(addr) => Some(
            sluice_server::server::metrics::bind(
                addr,
                "beyond loopback, scrape the HTTP API's /_sluice/metrics (--http, with its users or API keys)",
            )
            .with_context(|| format!("listening for metrics on {addr}"))?,
        ),
        None => None,
    };
    let tls = tls_settings(args)?;
    refuse_secrets_on_argv(args)?;
    let users = users(args)?;
    let http_users = credentials(&args.http_users_file, "--http-users-file")?;
    let http_api_keys = credentials(&args.http_api_keys_file, "--http-api-keys-file")?;
    let shm = shm_settings(args)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        bail!("--threads 0: give at least 1");
    }
    let store = args
        .store
        .files(&args.devices, store_config(args)?)
        .create_bytes(args.create_mib << 20)
        .open()?;
    let store = Arc::new(store);
    let db = Arc::new(Db::open(store.clone())?);
    let config = ServerConfig {
        threads,
        users,
        start_parameters,
        ..server_config(args, tls.resp.clone(), shm)
    };
    let server = Server::start(db.clone(), config)
        .with_context(|| format!("starting the server on {}", args.resp))?;
    let http = match args.http {
        None => None,
        Some(addr) => Some(start_http(
            args,
            addr,
            &server,
            &store,
            &tls,
            (http_users, http_api_keys),
        )?),
    };
    let (http, http_api) = http.map_or((None, None), |(h, a)| (Some(h), Some(a)));
    if let Some(listener) = metrics_listener {
        start_metrics(listener, &server, http_api.as_ref())?;
    }
    // The HTTP server holds the API; only a weak hold stays here, so that
    // the store closes when the servers are done.
    drop(http_api);
    stop_on_signals(&server)?;
    print_banner(args, &server, threads, http.as_ref());
    println!("ready to accept connections");
    server.wait()?;
    if let Some(h) = http {
        h.stop();
    }
    drop(db);
    match Arc::try_unwrap(store) {
        Ok(store) => drop(store),
        Err(_) => log::warn!("the store is still referenced at exit"),
    }
    println!("sluice serve: stopped; every acknowledged write is durable");
    Ok(())
}

/// The TLS of the Redis protocol and the HTTP API: the certificate (with
/// client authentication when asked for) and the Redis protocol's listener.
struct Tls {
    config: Option<sluice_server::server::tls::ServerTlsConfig>,
    clients_required: bool,
    resp: Option<sluice_server::server::tls::TlsSettings>,
}

/// Checks the TLS flags together and loads the certificate.
fn tls_settings(args: &ServeArgs) -> Result<Tls> {
    let clients =
        args.tls_ca_cert
            .as_deref()
            .map(|ca| sluice_server::server::tls::ClientCertificates {
                ca,
                required: args.tls_auth_clients == "yes",
            });
    let tls_config = match (&args.tls_cert, &args.tls_key) {
        (None, None) if clients.is_some() => {
            bail!("--tls-ca-cert checks the clients of a TLS listener: add --tls-cert FILE, --tls-key FILE and --resp-tls ADDR or --http-tls")
        }
        (None, None) => None,
        (Some(cert), Some(key)) => Some(
            sluice_server::server::tls::load_with_clients(cert, key, clients)
                .map_err(anyhow::Error::msg)?,
        ),
        _ => bail!("TLS needs both --tls-cert FILE and --tls-key FILE"),
    };
    let tls = match (&args.resp_tls, &tls_config) {
        (None, _) => None,
        (Some(addr), Some(config)) => Some(sluice_server::server::tls::TlsSettings {
            addr: *addr,
            config: config.clone(),
        }),
        (Some(_), None) => bail!("--resp-tls needs --tls-cert FILE and --tls-key FILE"),
    };
    if tls_config.is_some() && args.resp_tls.is_none() && !args.http_tls {
        bail!("--tls-cert and --tls-key go with --resp-tls ADDR or --http-tls");
    }
    if args.http_tls && (tls_config.is_none() || args.http.is_none()) {
        bail!("--http-tls needs --http ADDR, --tls-cert FILE and --tls-key FILE");
    }
    Ok(Tls {
        config: tls_config,
        clients_required: clients.is_some_and(|c| c.required),
        resp: tls,
    })
}

/// The shared-memory transport's settings, checked.
fn shm_settings(args: &ServeArgs) -> Result<Option<sluice_server::server::ShmSettings>> {
    let shm = match &args.shm {
        None => None,
        Some(path) => {
            let ring_bytes = args.shm_ring_kib << 10;
            if !ring_bytes.is_power_of_two()
                || !(sluice_io::shm::MIN_RING_BYTES..=sluice_io::shm::MAX_RING_BYTES)
                    .contains(&ring_bytes)
            {
                bail!(
                    "--shm-ring-kib {}: give a power of two from 4 to 1048576",
                    args.shm_ring_kib
                );
            }
            Some(sluice_server::server::ShmSettings {
                mode: args.shm_mode,
                max_clients: args.shm_max_clients,
                request_ring_bytes: ring_bytes,
                response_ring_bytes: ring_bytes,
                ..sluice_server::server::ShmSettings::at(path)
            })
        }
    };
    Ok(shm)
}

/// The store's configuration from the flags.
fn store_config(args: &ServeArgs) -> Result<StoreConfig> {
    Ok(StoreConfig {
        write_buffer_bytes: args.write_buffer_mib << 20,
        block_cache_bytes: args.block_cache_mib << 20,
        wal_sqpoll_idle_ms: args.wal_sqpoll,
        background_cpu: args.background_cpu,
        compaction: sluice_store::compaction::CompactionConfig {
            target_file_bytes: args.table_mib << 20,
            ..Default::default()
        },
        log_mirror: log_mirror(args)?,
        ..StoreConfig::default()
    })
}

/// The server's configuration from the flags (its threads, users and
/// start parameters are the caller's).
fn server_config(
    args: &ServeArgs,
    tls: Option<sluice_server::server::tls::TlsSettings>,
    shm: Option<sluice_server::server::ShmSettings>,
) -> ServerConfig {
    ServerConfig {
        resp_addr: args.resp,
        tls,
        shm,
        unix_socket: args.unix_socket.as_ref().map(|path| {
            sluice_server::server::UnixSocketSettings {
                path: path.clone(),
                mode: args.unix_socket_mode,
            }
        }),
        pin_threads: !args.no_pin,
        durability: args.durability,
        protected_mode: args.protected_mode,
        max_clients: args.max_clients,
        idle_timeout_secs: args.timeout,
        limits: Limits {
            bulk_max_bytes: args.proto_max_bulk_len,
            ..Limits::default()
        },
        background_cpu: args.background_cpu,
        rewrite: args.config.clone().map(|path| {
            sluice_server::server::ConfigRewrite(Arc::new(move |parameters| {
                crate::config_file::rewrite_redis_table(&path, parameters)
                    .map_err(|e| format!("{e:#}"))
            }))
        }),
        ..ServerConfig::default()
    }
}

/// Starts the HTTP API on `addr` over the server's store, its figures
/// joined by the Redis protocol's.
fn start_http(
    args: &ServeArgs,
    addr: SocketAddr,
    server: &Server,
    store: &Arc<sluice_store::Store>,
    tls: &Tls,
    (http_users, http_api_keys): (sluice_auth::Credentials, sluice_auth::Credentials),
) -> Result<(sluice_http::HttpServer, Arc<sluice_http::Api>)> {
    let api = Arc::new(sluice_http::Api::open(store.clone())?);
    api.catalog()
        .column_budget()
        .set_limit_bytes(args.http_columns_mib << 20);
    api.catalog().warm_columns();
    api.set_destructive_requires_name(args.http_destructive_requires_name);
    api.native_budget()
        .set_limit_bytes(args.http_native_memory_mib << 20);
    // Weak: the server's state goes when the server stops.
    let resp = Arc::downgrade(server.shared());
    let resp_metrics = resp.clone();
    api.set_extra_metrics(Box::new(move |out| {
        if let Some(shared) = resp_metrics.upgrade() {
            sluice_server::server::metrics::render(&shared, out);
        }
    }));
    api.set_extra_stats(Box::new(move || match resp.upgrade() {
        Some(shared) => serde_json::json!({
            "commands_processed": shared.stats.sum(|w| &w.commands_processed),
            "connected_clients": shared.clients.load(std::sync::atomic::Ordering::Relaxed),
            "latency_buckets": shared.stats.latency_counts(),
        }),
        None => serde_json::Value::Null,
    }));
    let config = sluice_http::HttpConfig {
        addr,
        max_connections: args.http_max_connections,
        request_threads: args.http_request_threads,
        ring_threads: args.http_ring_threads,
        max_body_bytes: args.http_max_content_mib << 20,
        request_timeout: std::time::Duration::from_secs(args.http_request_timeout_secs.max(1)),
        users: http_users,
        api_keys: http_api_keys,
        protected_mode: args.protected_mode,
        clients_verified: args.http_tls && tls.clients_required,
        tls: if args.http_tls {
            tls.config.clone()
        } else {
            None
        },
        ..sluice_http::HttpConfig::default()
    };
    Ok((
        sluice_http::HttpServer::start(api.clone(), config)
            .with_context(|| format!("starting the HTTP API on {addr}"))?,
        api,
    ))
}

/// Answers Prometheus's scrapes on `listener` with the Redis protocol's,
/// the store's and (if it runs) the HTTP API's figures.
fn start_metrics(
    listener: std::net::TcpListener,
    server: &Server,
    http_api: Option<&Arc<sluice_http::Api>>,
) -> Result<()> {
    let resp = Arc::downgrade(server.shared());
    let api = http_api.map(Arc::downgrade);
    let render = Arc::new(move || {
        let mut out = String::new();
        if let Some(shared) = resp.upgrade() {
            sluice_server::server::metrics::render(&shared, &mut out);
        }
        if let Some(api) = api.as_ref().and_then(|a| a.upgrade()) {
            api.http_metrics(&mut out);
        }
        out
    });
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("sluice-metrics".into())
        .spawn(move || sluice_server::server::metrics::serve(listener, render))?;
    println!("sluice serve: Prometheus metrics on http://{addr}/metrics");
    Ok(())
}

/// SIGTERM and SIGINT stop the server (its writes made durable first).
fn stop_on_signals(server: &Server) -> Result<()> {
    // Weak: the store closes when the server is done, not at exit.
    let shared = Arc::downgrade(server.shared());
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    std::thread::Builder::new()
        .name("sluice-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                log::info!("signal {signal}: shutting down");
                if let Some(shared) = shared.upgrade() {
                    shared.request_shutdown();
                }
            }
        })?;
    Ok(())
}

/// What serves where, and how it is protected.
fn print_banner(
    args: &ServeArgs,
    server: &Server,
    threads: usize,
    http: Option<&sluice_http::HttpServer>,
) {
    let devices: Vec<String> = args
        .devices
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    println!(
        "sluice serve: Redis protocol (RESP2/RESP3) on {}, {threads} thread{}, durability {}, device {}",
        server.resp_addr(),
        if threads == 1 { "" } else { "s" },
        args.durability.name(),
        devices.join(" + ")
    );
    if let Some(addr) = server.tls_addr() {
        println!("sluice serve: Redis protocol over TLS on {addr}");
    }
    if let Some(path) = &args.unix_socket {
        println!(
            "sluice serve: Redis protocol on Unix socket {}",
            path.display()
        );
    }
    if let Some(path) = &args.shm {
        println!(
            "sluice serve: shared-memory clients on {} (mode {:o})",
            path.display(),
            args.shm_mode
        );
    }
    if let Some(h) = http {
        println!(
            "sluice serve: HTTP API (Elasticsearch-compatible) on {}://{}",
            if args.http_tls { "https" } else { "http" },
            h.addr()
        );
    }
    for line in protection_notes(args, server, http) {
        println!("sluice serve: {line}");
    }
}

/// What a server bound beyond loopback serves to whom, said at start.
fn protection_notes(
    args: &ServeArgs,
    server: &Server,
    http: Option<&sluice_http::HttpServer>,
) -> Vec<String> {
    let mut notes = Vec::new();
    let beyond = |addr: &SocketAddr| !sluice_auth::is_loopback_bind(addr);
    // As protected mode itself decides: whether the default user needs a
    // password (a users file may name others and leave it without one).
    let resp_open = !server.shared().config.users.default_needs_password();
    let resp_beyond = beyond(&server.resp_addr()) || server.tls_addr().is_some_and(|a| beyond(&a));
    if resp_beyond && resp_open {
        notes.push(if args.protected_mode {
            "protected mode: the default user has no password, so Redis-protocol clients other than 127.0.0.1 and ::1 are answered -DENIED (give --requirepass-file FILE or --users-file FILE)".to_string()
        } else {
            "WARNING: --protected-mode no and no password: any client that can reach the Redis protocol's port can read and change every key".to_string()
        });
    }
    if let Some(h) = http.filter(|h| beyond(&h.addr()) && h.anonymous()) {
        notes.push(if args.protected_mode {
            format!("protected mode: the HTTP API on {} has no users, so clients other than 127.0.0.1 and ::1 are answered 403 (give --http-users-file FILE or --http-api-keys-file FILE)", h.addr())
        } else {
            format!("WARNING: --protected-mode no and no HTTP users: any client that can reach {} can read and change every index", h.addr())
        });
    }
    notes
}

fn parse_yes_no(text: &str) -> std::result::Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{text}: give yes or no")),
    }
}

fn parse_mode(text: &str) -> std::result::Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{text}: give permission bits in octal, as 0660"))
}

/// `--redis-param NAME=VALUE`s as pairs.
fn redis_params(given: &[String]) -> Result<Vec<(String, String)>> {
    given
        .iter()
        .map(|p| match p.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                Ok((name.to_ascii_lowercase(), value.to_string()))
            }
            _ => bail!("--redis-param {p:?}: give NAME=VALUE, e.g. notify-keyspace-events=KEA"),
        })
        .collect()
}
