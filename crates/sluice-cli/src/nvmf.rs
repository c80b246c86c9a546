//! `sluice nvmf`: reach an NVMe/TCP target (a `sluice node`) with Sluice's
//! own initiator: identify, read, write, and copy inside the node.

use anyhow::{bail, Context, Result};
use sluice_io::codec::{u16_at, u32_at, u64_at};
use sluice_nvmf::command::Sqe;
use sluice_nvmf::initiator::{read_sqe, rw, QueueConnection};
use sluice_nvmf::nvm::opcode;
use sluice_nvmf::pdu::Digests;
use sluice_nvmf::tls::{ConfiguredPsk, TlsClient};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct NvmfArgs {
    /// The target's address.
    #[arg(long, default_value = "127.0.0.1:4420")]
    target: String,
    /// The subsystem's NQN.
    #[arg(long, default_value = "nqn.2026-11.io.sluice:node")]
    nqn: String,
    /// This host's NQN.
    #[arg(
        long,
        default_value = "nqn.2014-08.org.nvmexpress:uuid:sluice-nvmf-cli"
    )]
    host_nqn: String,
    /// Ask for header and data digests (CRC32C) on every PDU.
    #[arg(long)]
    digests: bool,
    /// Connect over TLS 1.3 with the pre-shared key in this file (the PSK
    /// interchange format, NVMeTLSkey-1:01:…:, the node's --nvme-tls-key).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Authenticate in band (DH-HMAC-CHAP) with the secret on this file's
    /// first line (DHHC-1:…:, the node's --dhchap-secrets-file names it).
    #[arg(long, value_name = "FILE")]
    dhchap_secret_file: Option<PathBuf>,
    /// Make the node prove itself with this controller secret too.
    #[arg(long, value_name = "FILE", requires = "dhchap_secret_file")]
    dhchap_ctrl_secret_file: Option<PathBuf>,
    #[command(subcommand)]
    command: NvmfCommand,
}

#[derive(clap::Subcommand)]
enum NvmfCommand {
    /// The controller and its namespaces.
    Identify,
    /// Print a new random TLS pre-shared key in the PSK interchange format
    /// (for the node's --nvme-tls-key and hosts' --tls-key); reaches no
    /// target.
    GenTlsKey,
    /// Print a new random DH-HMAC-CHAP secret (DHHC-1:00:…:, for the node's
    /// --dhchap-secrets-file and hosts' `nvme connect --dhchap-secret`);
    /// reaches no target.
    GenDhchapKey {
        /// The key's length: 32, 48 or 64 bytes.
        #[arg(long, default_value_t = 32)]
        bytes: usize,
    },
    /// Read blocks of a namespace to a file (or standard output).
    Read {
        /// The namespace.
        #[arg(long, default_value_t = 1)]
        nsid: u32,
        /// The first block.
        #[arg(long)]
        lba: u64,
        /// Blocks to read.
        #[arg(long, default_value_t = 1)]
        blocks: u32,
        /// Where the bytes go (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write a file's bytes (whole blocks) to a namespace.
    Write {
        /// The namespace.
        #[arg(long, default_value_t = 1)]
        nsid: u32,
        /// The first block.
        #[arg(long)]
        lba: u64,
        /// The bytes to write: a file of whole blocks.
        #[arg(long = "in")]
        input: PathBuf,
    },
    /// Copy blocks inside the node (within a namespace or across two): no
    /// data crosses the network.
    Copy {
        /// The source namespace.
        #[arg(long, default_value_t = 1)]
        from_nsid: u32,
        /// The source's first block.
        #[arg(long)]
        from_lba: u64,
        /// Blocks to copy (at most 65536).
        #[arg(long)]
        blocks: u32,
        /// The destination namespace.
        #[arg(long, default_value_t = 1)]
        to_nsid: u32,
        /// The destination's first block.
        #[arg(long)]
        to_lba: u64,
    },
    /// Load the target with reads or writes for a while, commands kept in
    /// flight on each queue: IOPS, MB/s and latency percentiles.
    Bench {
        /// The namespace.
        #[arg(long, default_value_t = 1)]
        nsid: u32,
        /// What to do: random or sequential reads or writes.
        #[arg(long, value_enum, default_value_t = Pattern::Randread)]
        rw: Pattern,
        /// Bytes per command (whole blocks, at most 128 KiB).
        #[arg(long, default_value_t = 4096)]
        bs: usize,
        /// Commands in flight in all.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
        qd: u16,
        /// I/O queues (connections, a thread each) to spread them over.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
        queues: u16,
        /// How long, seconds.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Writes overwrite the namespace's blocks with a pattern: say so.
        #[arg(long)]
        overwrite: bool,
    },
}

/// The I/O pattern of `sluice nvmf bench`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Pattern {
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
}

/// Transfers `read` and `write` keep in flight at once.
const PIPELINE_DEPTH: usize = 8;

struct Session {
    admin: QueueConnection,
    io: QueueConnection,
    tls: Option<TlsClient>,
}

/// The TLS client of `--tls-key`, if given.
fn tls_client(args: &NvmfArgs) -> Result<Option<TlsClient>> {
    let Some(path) = &args.tls_key else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the TLS key {}", path.display()))?;
    let key = ConfiguredPsk::parse(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("the TLS key in {}", path.display()))?;
    Ok(Some(
        TlsClient::new(&key, &args.host_nqn, &args.nqn).map_err(anyhow::Error::msg)?,
    ))
}

fn open(args: &NvmfArgs) -> Result<Session> {
    let digests = Digests {
        header: args.digests,
        data: args.digests,
    };
    let reach = || {
        let hint = if args.tls_key.is_some() {
            ""
        } else {
            "; does it require TLS? then --tls-key FILE"
        };
        format!("reaching {} (is a sluice node there?{hint})", args.target)
    };
    let tls = tls_client(args)?;
    let mut admin =
        QueueConnection::open_with(&args.target, digests, tls.as_ref()).with_context(reach)?;
    let cntlid = admin
        .connect(&args.nqn, &args.host_nqn, 0, 0xffff, 0)
        .with_context(|| {
            format!(
                "connecting to {} at {} as host {}",
                args.nqn, args.target, args.host_nqn
            )
        })
        .map_err(|e| {
            let refused = e.chain().any(|c| {
                c.downcast_ref::<sluice_nvmf::initiator::InitiatorError>()
                    .is_some_and(|i| {
                        sluice_nvmf::initiator::is_status(
                            i,
                            sluice_nvmf::command::status::CONNECT_INVALID_HOST,
                        )
                    })
            });
            if refused {
                e.context("the node does not admit this host: its --allow-host list must name it (or give --host-nqn)")
            } else {
                e
            }
        })?;
    let secrets = dhchap_secrets(args)?;
    let authenticate = |q: &mut QueueConnection| -> Result<()> {
        if let Some((host, ctrl)) = &secrets {
            q.authenticate(&args.nqn, &args.host_nqn, host, ctrl.as_ref())
                .context("authenticating with DH-HMAC-CHAP")?;
        }
        Ok(())
    };
    authenticate(&mut admin)?;
    admin.enable().map_err(|e| {
        let needs_auth = sluice_nvmf::initiator::is_status(&e, sluice_nvmf::auth::AUTH_REQUIRED);
        let e = anyhow::Error::from(e);
        if needs_auth {
            e.context("the node requires this host to authenticate (DH-HMAC-CHAP): give --dhchap-secret-file FILE with the secret its --dhchap-secrets-file names for this host")
        } else {
            e
        }
    })?;
    admin.set_queue_count(1)?;
    let mut io =
        QueueConnection::open_with(&args.target, digests, tls.as_ref()).with_context(reach)?;
    io.connect(&args.nqn, &args.host_nqn, 1, cntlid, 0)?;
    authenticate(&mut io)?;
    io.in_capsule_bytes = admin.in_capsule_limit()?;
    Ok(Session { admin, io, tls })
}

type DhchapSecrets = (sluice_nvmf::auth::Secret, Option<sluice_nvmf::auth::Secret>);

/// The host's DH-HMAC-CHAP secret and the controller's, from their files.
fn dhchap_secrets(args: &NvmfArgs) -> Result<Option<DhchapSecrets>> {
    let read = |path: &PathBuf, flag: &str| -> Result<sluice_nvmf::auth::Secret> {
        let secret = sluice_auth::Secret::from_file(path, flag)?;
        let text = String::from_utf8_lossy(secret.expose()).into_owned();
        sluice_nvmf::auth::Secret::parse(&text)
            .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
    };
    let Some(path) = &args.dhchap_secret_file else {
        return Ok(None);
    };
    let host = read(path, "--dhchap-secret-file")?;
    let ctrl = args
        .dhchap_ctrl_secret_file
        .as_ref()
        .map(|p| read(p, "--dhchap-ctrl-secret-file"))
        .transpose()?;
    Ok(Some((host, ctrl)))
}

/// A namespace's block size and block count, from Identify Namespace.
fn geometry(admin: &mut QueueConnection, nsid: u32) -> Result<(u32, u64)> {
    let ns = admin
        .identify(0, nsid)
        .with_context(|| format!("namespace {nsid}"))?;
    let blocks = u64_at(&ns, 0).context("a short Identify Namespace")?;
    Ok((1u32 << ns[130], blocks))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches(['\0', ' '])
        .to_string()
}

pub fn run(args: &NvmfArgs) -> Result<()> {
    if let NvmfCommand::GenTlsKey = args.command {
        let key = ConfiguredPsk::generate().map_err(anyhow::Error::msg)?;
        println!("{}", key.interchange());
        return Ok(());
    }
    if let NvmfCommand::GenDhchapKey { bytes } = args.command {
        println!(
            "{}",
            sluice_nvmf::auth::Secret::generate(bytes).map_err(anyhow::Error::msg)?
        );
        return Ok(());
    }
    let mut s = open(args)?;
    match &args.command {
        NvmfCommand::GenTlsKey | NvmfCommand::GenDhchapKey { .. } => {
            unreachable!("answered above")
        }
        NvmfCommand::Identify => {
            let id = s.admin.identify(1, 0)?;
            let count = u32_at(&id, 516).context("a short Identify Controller")?;
            println!(
                "controller {}: {} {} (firmware {}), serial {}, subsystem {}, {} namespace(s), MDTS {} KiB",
                u16_at(&id, 78).unwrap_or_default(),
                text(&id[24..64]),
                text(&id[4..24]),
                text(&id[64..72]),
                text(&id[4..24]),
                text(&id[768..1024]),
                count,
                4u32 << id[77]
            );
            for nsid in 1..=count {
                let (bs, blocks) = geometry(&mut s.admin, nsid)?;
                println!(
                    "  namespace {nsid}: {blocks} blocks of {bs} bytes ({} MiB)",
                    (blocks * bs as u64) >> 20
                );
            }
        }
        NvmfCommand::Read {
            nsid,
            lba,
            blocks,
            out,
        } => {
            let (bs, _) = geometry(&mut s.admin, *nsid)?;
            let per = (128 << 10) / bs;
            let mut bytes = vec![0u8; *blocks as usize * bs as usize];
            // Transfers of 128 KiB, PIPELINE_DEPTH of them in flight.
            let mut chunks = (0..*blocks).step_by(per as usize).map(|first| {
                let n = (*blocks - first).min(per);
                (read_sqe(*nsid, lba + first as u64, n, bs), &[][..])
            });
            s.io.pipeline(
                PIPELINE_DEPTH,
                || chunks.next(),
                |i, answer, _| {
                    let data = answer?.data;
                    let at = i * per as usize * bs as usize;
                    bytes[at..at + data.len()].copy_from_slice(&data);
                    Ok(())
                },
            )?;
            match out {
                Some(path) => std::fs::write(path, &bytes)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => std::io::stdout().write_all(&bytes)?,
            }
        }
        NvmfCommand::Write { nsid, lba, input } => {
            let (bs, _) = geometry(&mut s.admin, *nsid)?;
            let bytes =
                std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
            if bytes.is_empty() || bytes.len() % bs as usize != 0 {
                bail!(
                    "{} is {} bytes: write whole blocks of {bs} bytes",
                    input.display(),
                    bytes.len()
                );
            }
            // Transfers of 128 KiB, PIPELINE_DEPTH of them in flight, then
            // a flush once all are written.
            let mut chunks = bytes.chunks(128 << 10).enumerate().map(|(i, chunk)| {
                let at = lba + (i * (128 << 10) / bs as usize) as u64;
                let blocks = (chunk.len() / bs as usize) as u32;
                (rw(opcode::WRITE, *nsid, at, blocks), chunk)
            });
            s.io.pipeline(
                PIPELINE_DEPTH,
                || chunks.next(),
                |_, answer, _| answer.map(|_| ()),
            )?;
            s.io.flush(*nsid)?;
            println!(
                "wrote {} blocks at {lba} of namespace {nsid}",
                bytes.len() / bs as usize
            );
        }
        NvmfCommand::Copy {
            from_nsid,
            from_lba,
            blocks,
            to_nsid,
            to_lba,
        } => {
            if *blocks == 0 || *blocks > 65536 {
                bail!("--blocks {blocks}: between 1 and 65536 per copy");
            }
            let sqe = copy_command(*from_nsid, *from_lba, *blocks, *to_nsid, *to_lba);
            s.io.command(sqe, &[])?;
            println!(
                "copied {blocks} blocks from namespace {from_nsid} at {from_lba} to namespace {to_nsid} at {to_lba} inside the node"
            );
        }
        NvmfCommand::Bench {
            nsid,
            rw,
            bs,
            qd,
            queues,
            seconds,
            overwrite,
        } => bench(
            args,
            &mut s.admin,
            s.tls.as_ref(),
            *nsid,
            *rw,
            *bs,
            *qd,
            *queues,
            *seconds,
            *overwrite,
        )?,
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one per option of the command
fn bench(
    args: &NvmfArgs,
    admin: &mut QueueConnection,
    tls: Option<&TlsClient>,
    nsid: u32,
    rw: Pattern,
    io_bytes: usize,
    queue_depth: u16,
    queues: u16,
    seconds: f64,
    overwrite: bool,
) -> Result<()> {
    let write = matches!(rw, Pattern::Randwrite | Pattern::Write);
    if write && !overwrite {
        bail!("--rw {rw:?} overwrites blocks of namespace {nsid}: add --overwrite if that is what you want");
    }
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        bail!("--seconds {seconds}: between 0 and 86400");
    }
    if io_bytes == 0 || io_bytes > 128 << 10 {
        bail!("--bs {io_bytes}: between one block and 131072 bytes (the node's MDTS)");
    }
    let most = queues as usize * sluice_nvmf::initiator::MAX_PIPELINE_DEPTH;
    if queue_depth as usize > most {
        bail!(
            "--qd {queue_depth}: at most {most} with --queues {queues} (a queue holds {} commands)",
            sluice_nvmf::initiator::MAX_PIPELINE_DEPTH
        );
    }
    let (block_size_bytes, namespace_blocks) = geometry(admin, nsid)?;
    let load = sluice_bench::InitiatorLoad {
        address: &args.target,
        nqn: &args.nqn,
        host_nqn: &args.host_nqn,
        tls,
        digests: Digests {
            header: args.digests,
            data: args.digests,
        },
        nsid,
        block_size_bytes,
        namespace_blocks,
        io_bytes,
        write,
        random: matches!(rw, Pattern::Randread | Pattern::Randwrite),
        queue_depth: queue_depth as usize,
        queues,
        seconds,
    };
    let r = sluice_bench::initiator_load(&load)?;
    println!(
        "{rw:?} {io_bytes} B, QD{queue_depth} over {} queue(s), {seconds} s: {:.0} IOPS, {:.1} MB/s, latency us p50 {:.0} p90 {:.0} p99 {:.0} p99.9 {:.0}",
        queues.min(queue_depth),
        r.iops,
        r.mb_per_s,
        r.lat_us[0],
        r.lat_us[1],
        r.lat_us[2],
        r.lat_us[3]
    );
    Ok(())
}

/// The node's Copy across namespaces (docs/NVMF.md): the source in
/// CDW10–13, the destination in NSID and CDW14–15.
fn copy_command(from_nsid: u32, from_lba: u64, blocks: u32, to_nsid: u32, to_lba: u64) -> Sqe {
    Sqe::new(opcode::COPY_ACROSS, 0)
        .with_nsid(to_nsid)
        .with_cdw(10, from_lba as u32)
        .with_cdw(11, (from_lba >> 32) as u32)
        .with_cdw(12, blocks - 1)
        .with_cdw(13, from_nsid)
        .with_cdw(14, to_lba as u32)
        .with_cdw(15, (to_lba >> 32) as u32)
}
