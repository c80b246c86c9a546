use sluice_io::{Device, FileDevice, FileOptions};
use sluice_paginate::device::DeviceIo;
use sluice_paginate::docgen::paper_doc;
use sluice_paginate::format::{CursorKind, ManifestBlock};
use sluice_paginate::layout::load_export;
use sluice_paginate::load::{load, LoadOptions};
use sluice_paginate::progress::ProgressMode;
use sluice_paginate::read::{read_export, Hit, PageInfo, ReadOptions, Sink};
use sluice_paginate::source::{CursorState, Engine, SharedPit, SourceSpec};
use sluice_paginate::{export, Auth, Client, ExportOptions, HttpOptions};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The engine a test binary runs the suite against.
struct EngineUnderTest {
    /// Argument of scripts/search-engine: opensearch or elasticsearch.
    name: &'static str,
    version: &'static str,
    port: u16,
    /// nginx's TLS port in front of it.
    tls_port: u16,
}

const PORT: u16 = ENGINE.port;
const TLS_PORT: u16 = ENGINE.tls_port;
const SEED: u64 = 11;
const PAPERS: &str = "t-papers-100k";
const PAPERS_DOCS: u64 = 100_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A test's scratch directory: emptied when made, removed when the test
/// passes (its devices take hundreds of megabytes each), kept after a
/// failure to look at.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Scratch {
    /// The directory, no longer removed at the end.
    fn keep(self) -> PathBuf {
        let dir = self.0.clone();
        std::mem::forget(self);
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tmp(name: &str) -> Scratch {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("pagination")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn url() -> String {
    format!("http://127.0.0.1:{PORT}")
}

/// Starts the engine once per test binary; a detached watchdog stops it
/// when this process is gone, however the tests end.
fn cluster() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{}-{}", ENGINE.name, ENGINE.version));
        let script = root().join("scripts/search-engine");
        let run = |action: &str| {
            let mut c = Command::new(&script);
            c.args([ENGINE.name, ENGINE.version, action])
                .env("SEARCH_HOME", &home)
                .env("SEARCH_PORT", PORT.to_string());
            c
        };
        let out = run("start").output().unwrap();
        assert!(
            out.status.success(),
            "scripts/search-engine {} {} start failed: {}{}",
            ENGINE.name,
            ENGINE.version,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stop = run("stop");
        let stop_line = std::iter::once(stop.get_program())
            .chain(stop.get_args())
            .map(|a| format!("'{}'", a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        let watchdog = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; exec {stop_line}",
            std::process::id(),
        );
        // The watchdog outlives this process on purpose (setsid): it stops
        // the engine once the test binary exits, so nobody waits for it.
        #[allow(clippy::zombie_processes)]
        Command::new("setsid")
            .args(["bash", "-c", &watchdog])
            .env("SEARCH_HOME", &home)
            .env("SEARCH_PORT", PORT.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    });
}

/// One test at a time; the cluster running.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    cluster();
    guard
}

fn client() -> Client {
    Client::new(&HttpOptions {
        url: url(),
        ..HttpOptions::default()
    })
    .unwrap()
}

/// Loads a seeded papers index once per test binary.
fn papers_index(name: &str, docs: u64, shards: u32) {
    static LOADED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let loaded = loaded.get_or_insert_with(HashSet::new);
    if loaded.contains(name) {
        return;
    }
    load(
        &client(),
        &LoadOptions {
            index: name.into(),
            docs,
            shards,
            seed: SEED,
            replace: true,
            progress: ProgressMode::Off,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    loaded.insert(name.to_string());
}

fn options(index: &str, device: &Path) -> ExportOptions {
    let mut o = ExportOptions {
        device: device.to_path_buf(),
        progress: ProgressMode::Off,
        ..ExportOptions::default()
    };
    o.spec.index = index.into();
    o
}

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Keeps (id, hash of source) of every hit.
struct Collect(Vec<(String, u64)>);

impl Sink for Collect {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> sluice_paginate::Result<()> {
        self.0.extend(
            hits.iter()
                .map(|h| (h.id.to_string(), hash(h.source.as_bytes()))),
        );
        Ok(())
    }
}

fn open(device: &Path) -> Arc<dyn Device> {
    Arc::new(FileDevice::open(device, &FileOptions::default()).unwrap())
}

/// What a running export has made durable so far; none while its device
/// does not exist yet (it is created once the source has answered) or
/// holds no export yet.
fn export_so_far(device: &Path) -> Option<sluice_paginate::layout::LoadedExport> {
    let dev = FileDevice::open(device, &FileOptions::default()).ok()?;
    let io = DeviceIo::open(Arc::new(dev), 4, 16 << 20).ok()?;
    load_export(&io).ok()
}

fn read_all(device: &Path) -> Vec<(String, u64)> {
    let (summary, sinks) = read_export(open(device), &ReadOptions::default(), |_| {
        Collect(Vec::new())
    })
    .unwrap();
    let all: Vec<_> = sinks.into_iter().flat_map(|c| c.0).collect();
    assert_eq!(summary.docs, all.len() as u64);
    all
}

/// The exact set of ids 0..n, each once, each source byte-identical to what was indexed.
fn assert_exact_papers(hits: &[(String, u64)], n: u64) {
    assert_eq!(hits.len() as u64, n, "document count");
    let mut seen = vec![false; n as usize];
    for (id, h) in hits {
        let i: u64 = id.parse().unwrap();
        assert!(!seen[i as usize], "id {i} twice");
        seen[i as usize] = true;
        assert_eq!(*h, hash(&paper_doc(SEED, i)), "source of {i} differs");
    }
}

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn run_fail(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected failure: {stderr}");
    stderr
}

#[test]
fn export_100k_with_4_slices_reads_back_every_id_and_source() {
    let _g = serial();
    papers_index(PAPERS, PAPERS_DOCS, 4);
    let dir = tmp("exact");
    let dev = dir.join("export.dev");
    let mut o = options(PAPERS, &dev);
    o.slices = Some(4);
    o.page_docs = 1000;
    let s = export(&client(), &o).unwrap();
    assert_eq!(s.docs, PAPERS_DOCS);
    assert_eq!(s.slices.len(), 4);
    assert!(s.slices.iter().all(|x| x.docs > 10_000), "{:?}", s.slices);
    assert_exact_papers(&read_all(&dev), PAPERS_DOCS);

    // Fewer slices than shards (each slice spans two shards: on an engine
    // without _shard_doc the sort is _doc then _id), and the scroll cursor,
    // give the same set.
    o.slices = Some(2);
    let s = export(&client(), &o).unwrap();
    let want = if ENGINE.name == "opensearch" { "_id" } else { "_shard_doc" };
    assert!(s.sort.contains(want), "{}", s.sort);
    assert_exact_papers(&read_all(&dev), PAPERS_DOCS);
    o.slices = Some(3);
    o.cursor = CursorKind::Scroll;
    export(&client(), &o).unwrap();
    assert_exact_papers(&read_all(&dev), PAPERS_DOCS);
}

#[test]
fn kill_9_mid_export_then_resume_gives_the_exact_set() {
    let _g = serial();
    papers_index(PAPERS, PAPERS_DOCS, 4);
    let dir = tmp("resume");
    let dev = dir.join("export.dev");
    let args = |extra: &[&str]| {
        let mut c = sluice();
        c.args([
            "export",
            "--source",
            &url(),
            "--index",
            PAPERS,
            "--page-docs",
            "500",
        ])
        .arg("--device")
        .arg(&dev)
        .args(["--progress", "lines", "--progress-interval-s", "0.2"])
        .args(extra);
        c
    };
    let mut child = args(&["--throttle", "20000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill once some pages are durable and well before the end (5 s at this rate).
    let deadline = Instant::now() + Duration::from_secs(60);
    let durable = loop {
        std::thread::sleep(Duration::from_millis(200));
        let docs = export_so_far(&dev).map_or(0, |l| {
                l.slices.iter().map(|s| s.checkpoint.docs).sum::<u64>()
            });
        if docs >= 20_000 || Instant::now() > deadline {
            break docs;
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        (20_000..PAPERS_DOCS).contains(&durable),
        "{durable} durable at the kill"
    );
    let err = run_fail(sluice().args(["read", "--device"]).arg(&dev));
    assert!(err.contains("is not complete"), "{err}");
    let out = args(&["--resume"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("of them in this run"), "{stdout}");
    assert_exact_papers(&read_all(&dev), PAPERS_DOCS);
}

#[test]
fn an_expired_point_in_time_is_reopened_and_the_export_goes_on() {
    let _g = serial();
    papers_index(PAPERS, PAPERS_DOCS, 4);
    let dir = tmp("pit-expiry");
    let dev = dir.join("export.dev");
    let mut o = options(PAPERS, &dev);
    o.page_docs = 500;
    o.throttle_docs_per_s = Some(25_000.0);
    let summary = std::thread::scope(|scope| {
        let run = scope.spawn(|| export(&client(), &o));
        // Close the point in time the slices read, as its expiry would: its
        // id from a durable checkpoint, closed through the engine's own API.
        let deadline = Instant::now() + Duration::from_secs(60);
        let pit_id = loop {
            std::thread::sleep(Duration::from_millis(100));
            let id = export_so_far(&dev).and_then(|l| {
                    l.slices.iter().find_map(|s| match CursorState::parse(&s.checkpoint.cursor).ok()? {
                        CursorState::Pit { pit_id, .. } => Some(pit_id),
                        CursorState::Scroll { .. } => None,
                    })
                });
            match id {
                Some(id) => break id,
                None => assert!(Instant::now() < deadline, "no page became durable"),
            }
        };
        let c = client();
        let engine = Engine::detect(&c).unwrap();
        SharedPit::adopt(engine, pit_id, &o.spec).close(&c);
        run.join().unwrap().unwrap()
    });
    assert!(summary.pit_reopens >= 1, "the PIT was never reopened");
    assert_exact_papers(&read_all(&dev), PAPERS_DOCS);
}

#[test]
fn empty_slices_and_an_empty_index_export_and_read() {
    let _g = serial();
    let c = client();
    for (index, docs) in [("t-three", 3u64), ("t-empty", 0)] {
        let _ = c.send("DELETE", &format!("/{index}"), None).unwrap();
        let body = r#"{"settings":{"number_of_shards":1,"number_of_replicas":0}}"#;
        assert!(c
            .send("PUT", &format!("/{index}"), Some(body.as_bytes()))
            .unwrap()
            .is_success());
        for id in 0..docs {
            let path = format!("/{index}/_doc/{id}?refresh=true");
            let r = c.send("PUT", &path, Some(&paper_doc(SEED, id))).unwrap();
            assert!(r.is_success(), "{}", r.error_summary());
        }
        let dir = tmp(index);
        let dev = dir.join("export.dev");
        let mut o = options(index, &dev);
        o.slices = Some(8);
        let s = export(&c, &o).unwrap();
        assert_eq!(s.docs, docs);
        assert_eq!(s.slices.len(), 8);
        assert!(s.slices.iter().filter(|x| x.docs == 0).count() >= 5);
        assert_exact_papers(&read_all(&dev), docs);
    }
}

#[test]
fn a_document_many_times_a_usual_page_takes_more_slots() {
    let _g = serial();
    let index = "t-big";
    papers_index(index, 1000, 1);
    let big = format!(
        "{{\"id\":1000,\"title\":\"big\",\"abstract\":\"{}\"}}",
        "x".repeat(2 << 20)
    );
    let c = client();
    let r = c
        .send(
            "PUT",
            &format!("/{index}/_doc/1000?refresh=true"),
            Some(big.as_bytes()),
        )
        .unwrap();
    assert!(r.is_success(), "{}", r.error_summary());
    let dir = tmp("big");
    let dev = dir.join("export.dev");
    let mut o = options(index, &dev);
    o.page_docs = 100;
    let s = export(&c, &o).unwrap();
    assert_eq!(s.docs, 1001);
    let io = DeviceIo::open(open(&dev), 4, 16 << 20).unwrap();
    let layout = load_export(&io).unwrap();
    let slot_bytes = layout.header.slot_bytes();
    assert!(slot_bytes < 1 << 20, "usual page slot {slot_bytes}");
    assert!(layout.slices[0].pages.iter().any(|p| p.slots > 2));
    let hits = read_all(&dev);
    let big_hit = hits.iter().find(|(id, _)| id == "1000").unwrap();
    assert_eq!(big_hit.1, hash(big.as_bytes()));
    let rest: Vec<_> = hits.into_iter().filter(|(id, _)| id != "1000").collect();
    assert_exact_papers(&rest, 1000);
}

#[test]
fn bad_source_input_gets_clear_errors() {
    let _g = serial();
    papers_index("t-small", 5000, 2);
    let dir = tmp("bad-source");
    let dev = dir.join("export.dev");
    let export_cmd = |extra: &[&str]| {
        let mut c = sluice();
        c.args(["export", "--progress", "off", "--retries", "1", "--device"])
            .arg(&dev)
            .args(extra);
        c
    };
    let err = run_fail(&mut export_cmd(&[
        "--source",
        "http://127.0.0.1:1",
        "--index",
        "t-small",
    ]));
    assert!(
        err.contains("cannot reach the source at http://127.0.0.1:1"),
        "{err}"
    );
    let err = run_fail(&mut export_cmd(&["--source", &url(), "--index", "nope"]));
    assert!(err.contains("index \"nope\" does not exist"), "{err}");
    assert!(err.contains("t-small"), "lists the indices there: {err}");
    let err = run_fail(&mut export_cmd(&[
        "--source",
        &url(),
        "--index",
        "t-small",
        "--query",
        "{bad",
    ]));
    assert!(err.contains("--query is not JSON"), "{err}");

    // Too small a device: refused before anything is written.
    let small = dir.join("small.dev");
    std::fs::write(&small, vec![0u8; 1 << 20]).unwrap();
    let err = run_fail(
        sluice()
            .args([
                "export",
                "--source",
                &url(),
                "--index",
                "t-small",
                "--device",
            ])
            .arg(&small),
    );
    assert!(
        err.contains("holds 1048576 bytes; this export needs about"),
        "{err}"
    );
    assert!(
        std::fs::read(&small).unwrap().iter().all(|&b| b == 0),
        "written to"
    );
}

/// Exports `t-small` and returns the device and the first page of slice 0.
/// Puts the cluster's shard allocation back however the test ends.
struct AllocationOff;

impl AllocationOff {
    fn set(value: &str) {
        let body = format!(r#"{{"persistent":{{"cluster.routing.allocation.enable":{value}}}}}"#);
        let r = client()
            .send("PUT", "/_cluster/settings", Some(body.as_bytes()))
            .unwrap();
        assert!(r.is_success(), "{}", r.error_summary());
    }
}

impl Drop for AllocationOff {
    fn drop(&mut self) {
        AllocationOff::set("null");
    }
}

#[test]
fn a_shard_that_cannot_start_is_named_before_any_document_is_sent() {
    let _g = serial();
    AllocationOff::set("\"none\"");
    let off = AllocationOff;
    let err = load(
        &client(),
        &LoadOptions {
            index: "t-unallocated".into(),
            docs: 1000,
            shards: 2,
            replace: true,
            progress: ProgressMode::Off,
            primaries_timeout_seconds: 2,
            ..LoadOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("primary shards of t-unallocated did not start within 2 s"),
        "{err}"
    );
    assert!(err.contains("0 active, 2 unassigned"), "{err}");
    assert!(err.contains("INDEX_CREATED"), "the source's reason: {err}");
    drop(off);
    let r = client().send("DELETE", "/t-unallocated", None).unwrap();
    assert!(r.is_success(), "{}", r.error_summary());
}

fn small_export(name: &str) -> (PathBuf, sluice_paginate::format::PageEntry, u64, u32) {
    papers_index("t-small", 5000, 2);
    // Small: kept for the caller, which outlives this function.
    let dev = tmp(name).keep().join("export.dev");
    let mut o = options("t-small", &dev);
    o.page_docs = 500;
    export(&client(), &o).unwrap();
    let io = DeviceIo::open(open(&dev), 4, 16 << 20).unwrap();
    let layout = load_export(&io).unwrap();
    let slice = &layout.slices[0];
    let page = slice.pages[1];
    let extent = slice.extents[0];
    (
        dev,
        page,
        layout.header.manifest_block_lba(extent),
        layout.header.block_size_bytes,
    )
}

#[test]
fn a_corrupted_page_is_named_and_can_be_skipped() {
    let _g = serial();
    let (dev, page, _, bs) = small_export("corrupt");
    let file = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    file.write_all_at(b"#", page.lba * bs as u64 + 100).unwrap();
    drop(file);
    let read = |policy: &str| {
        let mut c = sluice();
        c.args(["read", "--on-corrupt", policy, "--device"])
            .arg(&dev);
        run_fail(&mut c)
    };
    let err = read("fail");
    let want = format!("page 1 of slice 0 at LBA {} is corrupt", page.lba);
    assert!(err.contains(&want), "{err}");
    let err = read("skip");
    assert!(
        err.contains(&want) && err.contains("1 pages were skipped"),
        "{err}"
    );
    assert!(
        err.contains(&format!("read {} documents", 5000 - page.doc_count)),
        "{err}"
    );
}

#[test]
fn malformed_json_in_a_page_is_named() {
    let _g = serial();
    let (dev, page, manifest_lba, bs) = small_export("malformed");
    // A page with a valid checksum over bytes that are not JSON, of the
    // length the checkpoint counts.
    let mut bad =
        br#"[{"_id":"1","_source":{"year":19}},{"_id":"2","_source":{"year":tru}}]"#.to_vec();
    bad.resize(page.byte_len as usize, b' ');
    let bad = &bad[..];
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    file.write_all_at(bad, page.lba * bs as u64).unwrap();
    let mut block = vec![0u8; bs as usize];
    file.read_exact_at(&mut block, manifest_lba * bs as u64)
        .unwrap();
    let mut manifest = ManifestBlock::decode(&block, manifest_lba).unwrap();
    let entry = manifest
        .entries
        .iter_mut()
        .find(|e| e.seq == page.seq)
        .unwrap();
    entry.crc32c = crc32c::crc32c(bad);
    manifest.encode(&mut block);
    file.write_all_at(&block, manifest_lba * bs as u64).unwrap();
    drop(file);
    let err = run_fail(sluice().args(["read", "--device"]).arg(&dev));
    assert!(
        err.contains(&format!(
            "page 1 of slice 0 at LBA {} is not valid JSON",
            page.lba
        )),
        "{err}"
    );
}

struct Nginx(std::process::Child);

impl Drop for Nginx {
    /// SIGTERM: the master stops its workers too (SIGKILL would leave them
    /// listening with this run's certificate).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn sh(dir: &Path, script: &str) {
    let out = Command::new("bash")
        .args(["-ec", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// nginx terminating TLS (a test CA's certificate) and checking a password
/// (user sluice, password s3cret) in front of the cluster.
fn nginx(dir: &Path) -> Nginx {
    sh(
        dir,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=sluice-test-ca 2>/dev/null
         openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null
         printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nbasicConstraints=CA:FALSE\\n' > ext.cnf
         openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext.cnf 2>/dev/null
         printf 'sluice:%s\\n' \"$(openssl passwd -apr1 s3cret)\" > htpasswd
         mkdir -p tmp",
    );
    let d = dir.display();
    let conf = format!(
        "daemon off; pid {d}/nginx.pid; error_log {d}/error.log;
events {{}}
http {{
  access_log off;
  client_body_temp_path {d}/tmp/body; proxy_temp_path {d}/tmp/proxy;
  fastcgi_temp_path {d}/tmp/fcgi; uwsgi_temp_path {d}/tmp/uwsgi; scgi_temp_path {d}/tmp/scgi;
  server {{
    listen 127.0.0.1:{TLS_PORT} ssl;
    ssl_certificate {d}/server.pem; ssl_certificate_key {d}/server.key;
    auth_basic sluice; auth_basic_user_file {d}/htpasswd;
    client_max_body_size 0;
    location / {{
      proxy_pass http://127.0.0.1:{PORT};
      proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Authorization \"\";
      proxy_buffering off;
    }}
  }}
}}
"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let nginx = ["/usr/sbin/nginx", "nginx"]
        .into_iter()
        .find(|p| Command::new(p).arg("-v").output().is_ok())
        .expect("nginx is installed by scripts/setup");
    let child = Command::new(nginx)
        .args(["-c"])
        .arg(dir.join("nginx.conf"))
        .args(["-p"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = Nginx(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", TLS_PORT)).is_err() {
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!("nginx exited ({status}); see {d}/error.log");
        }
        assert!(
            Instant::now() < deadline,
            "nginx did not listen; see {d}/error.log"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    guard
}

#[test]
fn tls_and_basic_auth_through_nginx() {
    let _g = serial();
    papers_index("t-small", 5000, 2);
    let dir = tmp("tls");
    let _nginx = nginx(&dir);
    let tls_url = format!("https://127.0.0.1:{TLS_PORT}");
    let secure = |password: &str, ca: Option<PathBuf>| {
        Client::new(&HttpOptions {
            url: tls_url.clone(),
            auth: Auth::Basic {
                user: "sluice".into(),
                password: password.into(),
            },
            ca_cert: ca,
            max_retries: 1,
            retry_base_ms: 10,
            ..HttpOptions::default()
        })
        .unwrap()
    };
    let dev = dir.join("export.dev");
    let mut o = options("t-small", &dev);
    o.spec = SourceSpec {
        index: "t-small".into(),
        keep_alive: "1m".into(),
        ..SourceSpec::default()
    };
    let s = export(&secure("s3cret", Some(dir.join("ca.pem"))), &o).unwrap();
    assert_eq!(s.docs, 5000);
    assert_exact_papers(&read_all(&dev), 5000);

    let err = export(&secure("wrong", Some(dir.join("ca.pem"))), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("refused the credentials") && err.contains("401"),
        "{err}"
    );
    let err = export(&secure("s3cret", None), &o).unwrap_err().to_string();
    assert!(
        err.contains("cannot reach the source") && err.to_lowercase().contains("certificate"),
        "{err}"
    );

    // The same through the command line, password from the environment.
    let cli_export = |password: &str| {
        let mut c = sluice();
        c.args(["export", "--progress", "off", "--index", "t-small"])
            .args(["--user", "sluice", "--source", &tls_url, "--ca-cert"])
            .arg(dir.join("ca.pem"))
            .arg("--device")
            .arg(dir.join("cli.dev"))
            .env("SLUICE_SOURCE_PASSWORD", password);
        c
    };
    let out = cli_export("s3cret").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("exported 5000 documents"), "{stdout}");
    let err = run_fail(&mut cli_export("wrong"));
    assert!(err.contains("check --user and --password"), "{err}");
}

#[test]
fn read_sinks_count_ndjson_and_filter() {
    let _g = serial();
    papers_index("t-small", 5000, 2);
    let dir = tmp("sinks");
    let dev = dir.join("export.dev");
    export(&client(), &options("t-small", &dev)).unwrap();
    let out = sluice()
        .args(["read", "--device"])
        .arg(&dev)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("read 5000 documents"),
        "{err}"
    );
    assert!(err.contains("slice 1:"), "per-slice counts: {err}");

    let nd = dir.join("all.ndjson");
    let out = sluice()
        .args(["read", "--sink", "ndjson", "--device"])
        .arg(&dev)
        .arg("--out")
        .arg(&nd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&nd).unwrap();
    let (mut recent, mut recent_on_vldb) = (0, 0);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id: u64 = v["_id"].as_str().unwrap().parse().unwrap();
        let want: serde_json::Value = serde_json::from_slice(&paper_doc(SEED, id)).unwrap();
        assert_eq!(v["_source"], want);
        let is_recent = want["year"].as_u64().unwrap() >= 2015;
        recent += is_recent as u64;
        recent_on_vldb += (is_recent && want["venue"].as_str().unwrap().contains("VLDB")) as u64;
    }
    assert_eq!(text.lines().count(), 5000);

    let out = sluice()
        .args([
            "read",
            "--sink",
            "filter",
            "--where",
            "year>=2015",
            "--device",
        ])
        .arg(&dev)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("; {recent} match")),
        "want {recent}: {err}"
    );
    // The predicate language of `sluice query`: two --where join with AND.
    let out = sluice()
        .args(["read", "--sink", "filter"])
        .args(["--where", "year >= 2015", "--where", "venue CONTAINS 'VLDB'"])
        .arg("--device")
        .arg(&dev)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(recent_on_vldb > 0 && recent_on_vldb < recent);
    assert!(
        err.contains(&format!("; {recent_on_vldb} match")),
        "want {recent_on_vldb}: {err}"
    );
    // A string literal without quotes is refused, saying where.
    let out = sluice()
        .args(["read", "--sink", "filter", "--where", "venue = VLDB"])
        .arg("--device")
        .arg(&dev)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--where \"venue = VLDB\", column 9"), "{err}");
}


/// Documents a source hands over as stored: escapes of every kind with NUL
/// and a surrogate pair, raw multi-byte UTF-8, arrays nested 200 deep, a
/// 1.5 MB string, numbers past i64 and f64 limits, empty and null sources'
/// fields, ids with spaces, slashes, quotes and non-ASCII. Each must come
/// back with its id and its source byte for byte.
fn hostile_documents() -> Vec<(String, String)> {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let big = "x".repeat(1_500_000);
    vec![
        ("a b".into(), r#"{"blob":{"s":"\u00e9\u0000\ud83d\ude00 tab\t nl\n \"q\" \\ \/ end"}}"#.into()),
        ("x/y/z".into(), "{\"blob\":{\"s\":\"日本語 🎉 ünïcödé\"}}".into()),
        ("q\"uote".into(), format!("{{\"blob\":{{\"deep\":{deep}}}}}")),
        ("ünï cödé/%20".into(), format!("{{\"blob\":{{\"big\":\"{big}\"}}}}")),
        ("numbers".into(), r#"{"blob":{"n":[1e308,-1e-308,18446744073709551615,123456789012345678901234567890,-0.0,0,4.9e-324]}}"#.into()),
        ("empty".into(), "{}".into()),
        ("null-field".into(), r#"{"blob":null,"other":[]}"#.into()),
        ("  spaced  ".into(), "{ \"blob\" : { \"ws\" : [ 1 , 2 ] } }".into()),
    ]
}

#[test]
fn hostile_documents_come_back_byte_for_byte() {
    let _g = serial();
    let c = client();
    let index = "t-hostile";
    let _ = c.send("DELETE", &format!("/{index}"), None).unwrap();
    // The blob is stored, never indexed: the engine keeps what it is sent.
    let mapping = r#"{"settings":{"number_of_shards":2,"number_of_replicas":0},"mappings":{"properties":{"blob":{"type":"object","enabled":false}}}}"#;
    let r = c.send("PUT", &format!("/{index}"), Some(mapping.as_bytes())).unwrap();
    assert!(r.is_success(), "{}", r.error_summary());
    let docs = hostile_documents();
    let mut bulk = String::new();
    for (id, source) in &docs {
        bulk.push_str(&serde_json::json!({ "index": { "_id": id } }).to_string());
        bulk.push('\n');
        bulk.push_str(source);
        bulk.push('\n');
    }
    let r = c
        .send("POST", &format!("/{index}/_bulk?refresh=true"), Some(bulk.as_bytes()))
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["errors"], false, "{}", String::from_utf8_lossy(&r.body[..r.body.len().min(2000)]));
    for slices in [1u32, 3] {
        let dir = tmp(&format!("hostile-{slices}"));
        let dev = dir.join("export.dev");
        let mut o = options(index, &dev);
        o.slices = Some(slices);
        o.page_docs = 3;
        let s = export(&c, &o).unwrap();
        assert_eq!(s.docs, docs.len() as u64);
        let mut got = read_all(&dev);
        got.sort();
        let mut want: Vec<(String, u64)> = docs
            .iter()
            .map(|(id, src)| (id.clone(), hash(src.as_bytes())))
            .collect();
        want.sort();
        assert_eq!(got, want, "ids and source bytes over {slices} slices");
    }
}

/// Search contexts open on the source (scrolls and points in time).
fn open_contexts(c: &Client) -> u64 {
    let r = c
        .send("GET", "/_nodes/stats/indices/search?filter_path=nodes.*.indices.search.open_contexts", None)
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["nodes"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n["indices"]["search"]["open_contexts"].as_u64().unwrap())
        .sum()
}

/// Every context an export opens is closed when it ends, including the
/// scroll contexts of slices whose first page is empty (one document over
/// eight slices: seven slices see nothing).
#[test]
fn an_export_leaves_no_search_context_open() {
    let _g = serial();
    let c = client();
    let index = "t-one-doc";
    let _ = c.send("DELETE", &format!("/{index}"), None).unwrap();
    let settings = r#"{"settings":{"number_of_shards":3,"number_of_replicas":0}}"#;
    assert!(c.send("PUT", &format!("/{index}"), Some(settings.as_bytes())).unwrap().is_success());
    let r = c
        .send("PUT", &format!("/{index}/_doc/only?refresh=true"), Some(br#"{"a":1}"#))
        .unwrap();
    assert!(r.is_success(), "{}", r.error_summary());
    for cursor in [CursorKind::Scroll, CursorKind::Pit] {
        let before = open_contexts(&c);
        let dir = tmp(&format!("contexts-{cursor:?}"));
        let dev = dir.join("export.dev");
        let mut o = options(index, &dev);
        o.slices = Some(8);
        o.cursor = cursor;
        let s = export(&c, &o).unwrap();
        assert_eq!(s.docs, 1);
        let after = open_contexts(&c);
        assert!(after <= before, "{cursor:?}: {before} contexts open before the export, {after} after");
    }

    // A device that cannot be made ready stops the export after the slices'
    // first pages were asked for (they are fetched while the device is
    // prepared): what they opened is closed too, and so is the point in time.
    for cursor in [CursorKind::Scroll, CursorKind::Pit] {
        let before = open_contexts(&c);
        let dir = tmp(&format!("contexts-refused-{cursor:?}"));
        let mut o = options(index, &dir);
        o.slices = Some(8);
        o.cursor = cursor;
        let err = export(&c, &o).unwrap_err().to_string();
        assert!(err.contains(&dir.display().to_string()), "{cursor:?}: {err}");
        let after = open_contexts(&c);
        assert!(after <= before, "{cursor:?}: {before} contexts open before the refused export, {after} after");
    }
}
