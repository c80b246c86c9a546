//! `sluice node`: serve devices to NVMe/TCP hosts (the storage node).

use anyhow::{bail, Context, Result};
use sluice_io::{Device, FileDevice, FileOptions};
use sluice_nvmf::controller::{Namespace, Subsystem};
use sluice_nvmf::nbd::NbdConfig;
use sluice_nvmf::target::{serve, TargetConfig};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// A TOML file whose keys are these options (`listen = "0.0.0.0:4420"`,
    /// `device = ["a.dev", "b.dev"]`); an option given here wins over its
    /// key (docs/examples/sluice-node.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print every option as a commented key of a `--config` file, and exit.
    #[arg(long)]
    config_example: bool,
    /// Serve Prometheus's `/metrics` (each namespace's size and device I/O,
    /// each controller's queues, where write data was received) on this
    /// loopback address, without a password.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// A device to serve (a file, created at --create-mib if missing, or a
    /// block device); repeat it: namespace 1, 2, … in the order given.
    #[arg(long = "device", required_unless_present = "config_example")]
    devices: Vec<PathBuf>,
    /// Size of each device file created, in MiB.
    #[arg(long, default_value_t = 1024)]
    create_mib: u64,
    /// Where hosts connect (NVMe/TCP's port is 4420; port 0: any free port,
    /// printed).
    #[arg(long, default_value = "127.0.0.1:4420")]
    listen: SocketAddr,
    /// The subsystem's NQN, which hosts name when they connect.
    #[arg(long, default_value = "nqn.2026-11.io.sluice:node")]
    nqn: String,
    /// A host NQN allowed to connect (a Linux host's is in
    /// /etc/nvme/hostnqn); repeat it. With none, hosts are admitted only
    /// while every listener is on loopback, unless --allow-any-host.
    #[arg(long = "allow-host", value_name = "NQN")]
    allowed_hosts: Vec<String>,
    /// Admit every host that can connect, on any address (nvmet's
    /// allow_any_host): needed to listen beyond loopback without
    /// --allow-host, and for NBD beyond loopback (NBD names no host).
    #[arg(long)]
    allow_any_host: bool,
    /// How long a controller whose host asked for no keep-alive (KATO 0)
    /// may stay silent before it ends, in seconds.
    #[arg(long, default_value_t = 120)]
    silent_controller_secs: u64,
    /// Also serve discovery here (NVMe/TCP's discovery port is 8009);
    /// the listen address serves it too.
    #[arg(long, value_name = "ADDR")]
    discovery: Option<SocketAddr>,
    /// Also serve the namespaces over NBD here (NBD's port is 10809;
    /// export "1" or "" is namespace 1, "2" namespace 2, …).
    #[arg(long, value_name = "ADDR")]
    nbd: Option<SocketAddr>,
    /// Most connections at once (a host opens one per queue).
    #[arg(long, default_value_t = sluice_nvmf::target::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Threads serving the NVMe/TCP connections, each serving many (0: one
    /// per core), plain and TLS; as many again serve NBD's.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    threads: u16,
    /// In-capsule data a command may carry, in KiB (reported to hosts as
    /// IOCCSZ): a write up to this size goes with its command, a larger
    /// one after the node's R2T.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(8..=128))]
    in_capsule_kib: u32,
    /// NBD over TLS (NBD_OPT_STARTTLS): this PEM certificate chain, with
    /// --nbd-tls-key (clients: nbds:// URIs).
    #[arg(long, value_name = "PEM", requires = "nbd_tls_key")]
    nbd_tls_cert: Option<PathBuf>,
    /// The private key of --nbd-tls-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "nbd_tls_cert")]
    nbd_tls_key: Option<PathBuf>,
    /// CA certificates (PEM) an NBD client's certificate must chain to:
    /// clients without one signed by them are refused (libnbd sends
    /// `client-cert.pem` from its tls-certificates directory). With TLS
    /// required, NBD may then listen beyond loopback.
    #[arg(long, value_name = "PEM", requires = "nbd_tls_cert")]
    nbd_tls_ca_cert: Option<PathBuf>,
    /// With a certificate: `require` refuses clients that do not start TLS
    /// first, `on` lets them choose.
    #[arg(long, value_enum, default_value_t = TlsMode::Require, requires = "nbd_tls_cert")]
    nbd_tls: TlsMode,
    /// NVMe/TCP over TLS 1.3 with a pre-shared key: a file holding the key
    /// in the PSK interchange format (NVMeTLSkey-1:01:…:, as `sluice nvmf
    /// gen-tls-key` or `nvme gen-tls-key --hmac=1` prints). Hosts connect
    /// with the same key (`nvme connect --tls --tls-key=…`).
    #[arg(long, value_name = "FILE")]
    nvme_tls_key: Option<PathBuf>,
    /// With a key: `require` refuses hosts that do not begin with TLS, `on`
    /// lets them choose. Discovery always takes both.
    #[arg(long, value_enum, default_value_t = TlsMode::Require, requires = "nvme_tls_key")]
    nvme_tls: TlsMode,
    /// Hosts that must authenticate in band (DH-HMAC-CHAP) on every queue:
    /// a file (chmod 600) of `HOSTNQN SECRET [CONTROLLER_SECRET]` lines,
    /// secrets as `sluice nvmf gen-dhchap-key` or `nvme gen-dhchap-key`
    /// print them (DHHC-1:00:…:). The host connects with `nvme connect
    /// --dhchap-secret=SECRET` (and `--dhchap-ctrl-secret=CONTROLLER_SECRET`
    /// to make the node prove itself). The hosts named are admitted, and
    /// unless --allow-any-host, only they and the --allow-host ones.
    #[arg(long, value_name = "FILE")]
    dhchap_secrets_file: Option<PathBuf>,
}

/// The hosts of `--dhchap-secrets-file`, with their secrets.
fn dhchap_secrets(
    path: &std::path::Path,
) -> Result<std::collections::HashMap<String, sluice_nvmf::auth::HostSecrets>> {
    use sluice_nvmf::auth::{HostSecrets, Secret};
    let text = sluice_auth::read_secret_file(path, "--dhchap-secrets-file")?;
    let mut hosts = std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("--dhchap-secrets-file {} line {}", path.display(), n + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        let (host, secret, controller) = match words[..] {
            [host, secret] => (host, secret, None),
            [host, secret, controller] => (host, secret, Some(controller)),
            _ => bail!("{at}: write HOSTNQN SECRET [CONTROLLER_SECRET], separated by spaces"),
        };
        let secrets = HostSecrets {
            host: Secret::parse(secret).map_err(|e| anyhow::anyhow!("{at}: {e}"))?,
            controller: controller
                .map(Secret::parse)
                .transpose()
                .map_err(|e| anyhow::anyhow!("{at}: the controller secret: {e}"))?,
        };
        if hosts.insert(host.to_string(), secrets).is_some() {
            bail!("{at}: host {host} is named twice");
        }
    }
    if hosts.is_empty() {
        bail!("--dhchap-secrets-file {} names no host", path.display());
    }
    Ok(hosts)
}

/// Whether clients must use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TlsMode {
    /// Clients choose.
    On,
    /// Only clients that start TLS first.
    Require,
}

pub fn run(args: &NodeArgs) -> Result<()> {
    if args.config_example {
        print!("{}", crate::config_file::example_of("node"));
        return Ok(());
    }
    if args.nqn.len() > 223 || !args.nqn.starts_with("nqn.") {
        bail!(
            "--nqn {:?}: an NQN starts with \"nqn.\" and has at most 223 bytes, e.g. nqn.2026-11.io.sluice:node",
            args.nqn
        );
    }
    check_exposure(args)?;
    // The ports first: a busy one is refused before any device is made.
    let sockets = Sockets::bind(args)?;
    let nbd_config = nbd_config(args)?;
    let nvme_tls = args
        .nvme_tls_key
        .as_deref()
        .map(|path| tls_server(path, &args.nqn))
        .transpose()?;
    // Secrets are checked before any device is made.
    let dhchap = match &args.dhchap_secrets_file {
        Some(path) => dhchap_secrets(path)?,
        None => Default::default(),
    };
    let address = sockets.nvme.local_addr()?;
    let tls_required = nvme_tls.is_some() && args.nvme_tls == TlsMode::Require;
    let dhchap_hosts = dhchap.len();
    let tls = nvme_tls.is_some().then_some(tls_required);
    let subsystem = Arc::new(subsystem(args, address, tls, dhchap)?);
    if let Some(listener) = sockets.metrics {
        start_metrics(listener, &subsystem)?;
    }
    print_connect_line(args, address, tls, dhchap_hosts);
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let config = TargetConfig {
        max_connections: args.max_connections,
        tls: nvme_tls.map(Arc::new),
        tls_required,
        workers: match args.threads {
            0 => TargetConfig::default().workers,
            n => n as usize,
        },
    };
    let discovery_thread = sockets
        .discovery
        .map(|listener| start_discovery(listener, &subsystem, &config, &stop))
        .transpose()?;
    let nbd_thread = sockets
        .nbd
        .map(|listener| start_nbd(listener, nbd_config, &subsystem, &config, &stop))
        .transpose()?;
    let counted = subsystem.clone();
    serve(sockets.nvme, subsystem, config, stop.clone())?;
    join_listener(nbd_thread, "NBD")?;
    join_listener(discovery_thread, "discovery")?;
    if stop.load(Ordering::Relaxed) {
        report_write_data(&counted);
    }
    Ok(())
}

/// The node's listening sockets, bound before any device is made.
struct Sockets {
    nvme: TcpListener,
    discovery: Option<TcpListener>,
    nbd: Option<TcpListener>,
    metrics: Option<TcpListener>,
}

impl Sockets {
    fn bind(args: &NodeArgs) -> Result<Sockets> {
        let metrics = args
            .metrics
            .map(|addr| {
                sluice_server::server::metrics::bind(
                    addr,
                    "beyond loopback, scrape it through an authenticating proxy on this machine",
                )
                .with_context(|| format!("listening for metrics on {addr}"))
            })
            .transpose()?;
        let nvme = TcpListener::bind(args.listen)
            .with_context(|| format!("listening on {} (is another target there?)", args.listen))?;
        let discovery = args
            .discovery
            .map(|at| {
                TcpListener::bind(at).with_context(|| {
                    format!("listening for discovery on {at} (is another target there?)")
                })
            })
            .transpose()?;
        let nbd = args
            .nbd
            .map(|at| {
                TcpListener::bind(at).with_context(|| {
                    format!("listening for NBD on {at} (is another server there?)")
                })
            })
            .transpose()?;
        Ok(Sockets {
            nvme,
            discovery,
            nbd,
            metrics,
        })
    }
}

/// NBD's configuration: TLS when a certificate is given, and whether
/// clients must start it.
fn nbd_config(args: &NodeArgs) -> Result<NbdConfig> {
    if args.nbd_tls_cert.is_some() && args.nbd.is_none() {
        bail!("--nbd-tls-cert is for NBD: add --nbd ADDR (NVMe/TCP's TLS takes a pre-shared key: --nvme-tls-key FILE)");
    }
    let tls = match (&args.nbd_tls_cert, &args.nbd_tls_key) {
        (Some(cert), Some(key)) => {
            let clients = args
                .nbd_tls_ca_cert
                .as_deref()
                .map(|ca| sluice_server::server::tls::ClientCertificates { ca, required: true });
            Some(
                sluice_server::server::tls::load_with_clients(cert, key, clients)
                    .map_err(anyhow::Error::msg)?,
            )
        }
        _ => None,
    };
    Ok(NbdConfig {
        tls_required: tls.is_some() && args.nbd_tls == TlsMode::Require,
        tls,
        ..Default::default()
    })
}

/// The subsystem of the devices given: its hosts (those with secrets are
/// named hosts, the others stay out unless named too or every host is let
/// in), TLS (`Some(required)`) and limits.
fn subsystem(
    args: &NodeArgs,
    address: SocketAddr,
    tls: Option<bool>,
    dhchap: std::collections::HashMap<String, sluice_nvmf::auth::HostSecrets>,
) -> Result<Subsystem> {
    let mut namespaces = Vec::new();
    for path in &args.devices {
        let device = open_device(path, args.create_mib)?;
        namespaces.push(
            Namespace::new(device).with_context(|| format!("opening I/O on {}", path.display()))?,
        );
    }
    let mut allowed = args.allowed_hosts.clone();
    if !args.allow_any_host {
        allowed.extend(
            dhchap
                .keys()
                .filter(|h| !args.allowed_hosts.contains(h))
                .cloned(),
        );
    }
    let mut subsystem = Subsystem::new(args.nqn.clone(), namespaces, allowed)
        .with_address(address)
        .with_in_capsule_bytes(args.in_capsule_kib as usize * 1024)
        .map_err(anyhow::Error::msg)?
        .with_unkept_silence(std::time::Duration::from_secs(
            args.silent_controller_secs.max(1),
        ));
    if let Some(required) = tls {
        subsystem = subsystem.with_tls(required);
    }
    Ok(subsystem.with_dhchap(dhchap))
}

/// Serves `/metrics` on `listener` from a thread of its own.
fn start_metrics(listener: TcpListener, subsystem: &Arc<Subsystem>) -> Result<()> {
    let figures = Arc::downgrade(subsystem);
    let started = std::time::Instant::now();
    let render = Arc::new(move || match figures.upgrade() {
        Some(s) => node_metrics(&s.figures(), started.elapsed().as_secs_f64()),
        None => String::new(),
    });
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("sluice-metrics".into())
        .spawn(move || sluice_server::server::metrics::serve(listener, render))?;
    println!("sluice node: Prometheus metrics on http://{addr}/metrics");
    Ok(())
}

/// The line that says what is served and how a host connects to it.
fn print_connect_line(
    args: &NodeArgs,
    address: SocketAddr,
    tls: Option<bool>,
    dhchap_hosts: usize,
) {
    let tls_note = match tls {
        None => "",
        Some(true) => ", TLS required: add --tls --tls-key=<the key>",
        Some(false) => ", TLS on offer: --tls --tls-key=<the key>",
    };
    let dhchap_note = match dhchap_hosts {
        0 => String::new(),
        n => format!(
            ", {n} host(s) authenticate with DH-HMAC-CHAP: add --dhchap-secret=<its secret>"
        ),
    };
    println!(
        "sluice node: {} namespace(s) of subsystem {} on nvme-tcp {} (nvme connect -t tcp -a {} -s {} -n {}{tls_note}{dhchap_note})",
        args.devices.len(),
        args.nqn,
        address,
        address.ip(),
        address.port(),
        args.nqn
    );
}

type ListenerThread = std::thread::JoinHandle<std::io::Result<()>>;

/// The discovery controller's listener on a thread of its own (never TLS
/// only: hosts discover before they know a key).
fn start_discovery(
    listener: TcpListener,
    subsystem: &Arc<Subsystem>,
    config: &TargetConfig,
    stop: &Arc<AtomicBool>,
) -> Result<ListenerThread> {
    println!("sluice node: discovery on {}", listener.local_addr()?);
    let config = TargetConfig {
        tls_required: false,
        ..config.clone()
    };
    let (subsystem, stop) = (subsystem.clone(), stop.clone());
    Ok(std::thread::spawn(move || {
        serve(listener, subsystem, config, stop)
    }))
}

/// NBD's listener on a thread of its own.
fn start_nbd(
    listener: TcpListener,
    nbd_config: NbdConfig,
    subsystem: &Arc<Subsystem>,
    config: &TargetConfig,
    stop: &Arc<AtomicBool>,
) -> Result<ListenerThread> {
    let tls_note = match (&nbd_config.tls, nbd_config.tls_required) {
        (None, _) => "",
        (Some(_), true) => " (TLS required)",
        (Some(_), false) => " (TLS on offer)",
    };
    println!("sluice node: NBD on {}{tls_note}", listener.local_addr()?);
    let nbd_config = NbdConfig {
        max_connections: config.max_connections,
        workers: config.workers,
        ..nbd_config
    };
    let (subsystem, stop) = (subsystem.clone(), stop.clone());
    Ok(std::thread::spawn(move || {
        sluice_nvmf::nbd::serve(listener, subsystem, nbd_config, stop)
    }))
}

/// Waits for a listener's thread, passing on its error or panic.
fn join_listener(thread: Option<ListenerThread>, what: &str) -> Result<()> {
    let Some(t) = thread else {
        return Ok(());
    };
    t.join()
        .map_err(|_| anyhow::anyhow!("the {what} listener panicked"))??;
    Ok(())
}

/// After a stop: how the write data came in.
fn report_write_data(subsystem: &Subsystem) {
    let bytes = subsystem.write_data_bytes();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "sluice node: stopped; write data (NVMe/TCP and NBD) received straight into pinned buffers {:.1} MiB, copied from receive buffers {:.1} MiB",
        mib(bytes.direct),
        mib(bytes.staged)
    );
}

/// Refuses to serve beyond loopback without saying who may connect, as
/// Linux nvmet and SPDK admit no host unless told to.
fn check_exposure(args: &NodeArgs) -> Result<()> {
    if args.allow_any_host {
        return Ok(());
    }
    let beyond = |addr: &SocketAddr| !sluice_auth::is_loopback_bind(addr);
    let nvme = std::iter::once(("--listen", args.listen))
        .chain(args.discovery.map(|a| ("--discovery", a)))
        .find(|(_, a)| beyond(a));
    let named = !args.allowed_hosts.is_empty() || args.dhchap_secrets_file.is_some();
    if let (Some((flag, addr)), false) = (nvme, named) {
        bail!(
            "{flag} {addr} can be reached from other machines, and no host is named: give --allow-host NQN for each host allowed (a Linux host's NQN is in /etc/nvme/hostnqn), or --allow-any-host to admit every host that can connect"
        );
    }
    // NBD clients that must start TLS and show a certificate the node
    // checks are no anonymous clients.
    let nbd_clients_checked = args.nbd_tls_ca_cert.is_some() && args.nbd_tls == TlsMode::Require;
    if let Some(addr) = args.nbd.filter(|a| beyond(a) && !nbd_clients_checked) {
        bail!(
            "--nbd {addr} can be reached from other machines, and NBD names no host that --allow-host could check: ask clients for certificates (--nbd-tls-cert, --nbd-tls-key, --nbd-tls-ca-cert), bind NBD to loopback (reach it through an SSH tunnel), or pass --allow-any-host to serve every client that can connect"
        );
    }
    Ok(())
}

/// The TLS side of subsystem `nqn` with the key in the file at `path`.
fn tls_server(path: &Path, nqn: &str) -> Result<sluice_nvmf::tls::TlsServer> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the TLS key {}", path.display()))?;
    let key = sluice_nvmf::tls::ConfiguredPsk::parse(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("the TLS key in {}", path.display()))?;
    warn_if_readable_by_others(path);
    sluice_nvmf::tls::TlsServer::new(key, nqn.into()).map_err(anyhow::Error::msg)
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "sluice node: warning: the TLS key {} can be read by others (chmod 600 it)",
                path.display()
            );
        }
    }
}

fn open_device(path: &Path, create_mib: u64) -> Result<Arc<dyn Device>> {
    let options = FileOptions::default();
    if path.exists() {
        return Ok(Arc::new(
            FileDevice::open(path, &options)
                .with_context(|| format!("opening {}", path.display()))?,
        ));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(Arc::new(
        FileDevice::create(path, create_mib << 20, &options)
            .with_context(|| format!("creating {} ({create_mib} MiB)", path.display()))?,
    ))
}

/// The node's figures in Prometheus's text format.
fn node_metrics(f: &sluice_nvmf::controller::NodeFigures, uptime_secs: f64) -> String {
    use sluice_server::server::metrics::{family, sample};
    let mut out = String::new();
    family(
        &mut out,
        "sluice_uptime_seconds",
        "gauge",
        "Seconds since the node started.",
    );
    sample(&mut out, "sluice_uptime_seconds", &[], uptime_secs);
    let name = "sluice_node_namespace_size_bytes";
    family(&mut out, name, "gauge", "Size of each namespace.");
    for ns in &f.namespaces {
        sample(
            &mut out,
            name,
            &[("nsid", &ns.nsid.to_string())],
            ns.size_bytes,
        );
    }
    type Field = fn(&sluice_io::device::ClassSnapshot) -> u64;
    let fields: [(&str, &str, Field); 5] = [
        (
            "sluice_node_namespace_reads_total",
            "Device read requests.",
            |c| c.reads,
        ),
        (
            "sluice_node_namespace_read_bytes_total",
            "Bytes device reads asked for.",
            |c| c.read_bytes,
        ),
        (
            "sluice_node_namespace_writes_total",
            "Device write requests.",
            |c| c.writes,
        ),
        (
            "sluice_node_namespace_write_bytes_total",
            "Bytes device writes carried.",
            |c| c.write_bytes,
        ),
        (
            "sluice_node_namespace_flushes_total",
            "Device flush requests.",
            |c| c.flushes,
        ),
    ];
    for (name, help, field) in fields {
        family(
            &mut out,
            name,
            "counter",
            &format!("{help} By namespace and I/O priority."),
        );
        for ns in &f.namespaces {
            let Some(io) = &ns.io else { continue };
            let nsid = ns.nsid.to_string();
            for (priority, class) in [("high", &io.high), ("low", &io.low)] {
                sample(
                    &mut out,
                    name,
                    &[("nsid", &nsid), ("priority", priority)],
                    field(class),
                );
            }
        }
    }
    let name = "sluice_node_controllers";
    family(
        &mut out,
        name,
        "gauge",
        "Live controllers (discovery ones apart).",
    );
    for discovery in [false, true] {
        let count = f
            .controllers
            .iter()
            .filter(|c| c.discovery == discovery)
            .count();
        let kind = if discovery { "discovery" } else { "io" };
        sample(&mut out, name, &[("kind", kind)], count);
    }
    let name = "sluice_node_controller_io_queues";
    family(
        &mut out,
        name,
        "gauge",
        "I/O queues each live controller was granted.",
    );
    for c in f.controllers.iter().filter(|c| !c.discovery) {
        let id = c.id.to_string();
        sample(
            &mut out,
            name,
            &[("controller", &id), ("host", &c.host_nqn)],
            c.io_queues,
        );
    }
    let name = "sluice_node_write_data_bytes_total";
    family(
        &mut out,
        name,
        "counter",
        "Bytes of write data, by where they were received: straight into pinned buffers, or copied from receive buffers.",
    );
    sample(
        &mut out,
        name,
        &[("received", "direct")],
        f.write_data.direct,
    );
    sample(
        &mut out,
        name,
        &[("received", "copied")],
        f.write_data.staged,
    );
    queue_metrics(&f.queues, &mut out);
    out
}

/// Each connected queue's commands by kind, and its error answers.
fn queue_metrics(queues: &[sluice_nvmf::queue_figures::QueueFigures], out: &mut String) {
    use sluice_nvmf::queue_figures::CommandKind;
    use sluice_server::server::metrics::{family, sample};
    let name = "sluice_node_queue_commands_total";
    family(
        out,
        name,
        "counter",
        "Commands each connected queue received, by kind (qid 0: the admin queue).",
    );
    for q in queues {
        let (controller, qid) = (q.controller.to_string(), q.qid.to_string());
        for (kind, count) in CommandKind::ALL.iter().zip(q.commands) {
            let labels = [
                ("controller", controller.as_str()),
                ("qid", qid.as_str()),
                ("kind", kind.name()),
            ];
            sample(out, name, &labels, count);
        }
    }
    let name = "sluice_node_queue_errors_total";
    family(
        out,
        name,
        "counter",
        "Commands each connected queue answered with an error status.",
    );
    for q in queues {
        let labels = [
            ("controller", q.controller.to_string()),
            ("qid", q.qid.to_string()),
        ];
        let labels = labels.each_ref().map(|(k, v)| (*k, v.as_str()));
        sample(out, name, &labels, q.errors);
    }
}
