//! The log mirror (docs/FORMAT.md, "Log mirror"): writes acknowledged on
//! the mirror's word survive the process's death, which this test brings
//! about for real — a child process of this test binary writes and
//! aborts — and records the mirror cannot keep wait for the device.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_io::{Device, FileDevice, FileOptions};
use sluice_store::{LogMirrorConfig, Store, StoreConfig, WriteBatch};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CHILD_ENV: &str = "SLUICE_LOG_MIRROR_CHILD";
const WRITES: u64 = 20_000;
/// The child lets the mirror go this often, as a server's committer does
/// on its timer.
const WRITE_THROUGH_EVERY: u64 = 1_000;

fn mirror_path(dir: &Path) -> PathBuf {
    // One per test run: the device's directory names it.
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    PathBuf::from(format!("/dev/shm/sluice-test-{name}.mirror"))
}

fn config(mirror: Option<PathBuf>) -> StoreConfig {
    StoreConfig {
        wal_blocks: 4096,
        log_mirror: mirror.map(|path| LogMirrorConfig {
            path,
            size_bytes: 1 << 20,
        }),
        ..StoreConfig::default()
    }
}

fn open(dir: &Path, mirror: bool) -> Store {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&dir.join("dev"), &FileOptions::default()).unwrap());
    Store::open(dev, &config(mirror.then(|| mirror_path(dir)))).unwrap()
}

fn value(i: u64) -> Vec<u8> {
    format!("value {i:08} {}", "x".repeat(80)).into_bytes()
}

/// The child: unsynced writes, each checked kept, then death with no
/// close (abort runs no destructor: the open block never reaches the
/// device).
fn child(dir: &Path) -> ! {
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::create(&dir.join("dev"), 64 << 20, &FileOptions::default()).unwrap());
    let store = Store::create(dev, &config(Some(mirror_path(dir)))).unwrap();
    assert!(store.has_log_mirror());
    let ks = store.keyspace("default").unwrap();
    for i in 0..WRITES {
        let mut b = WriteBatch::new();
        b.put(ks, format!("key{i:08}").as_bytes(), &value(i))
            .unwrap();
        let logged = store.write_logged(&b).unwrap();
        assert!(store.is_kept(logged.position), "write {i} not kept");
        if i % WRITE_THROUGH_EVERY == WRITE_THROUGH_EVERY / 2 {
            store.write_through(logged.position).unwrap();
        }
    }
    assert!(store.log_mirror_used_bytes() > 0);
    std::process::abort();
}

#[test]
fn writes_kept_by_the_mirror_survive_the_process_death() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "writes_kept_by_the_mirror_survive_the_process_death",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborts");
    assert!(mirror_path(dir.path()).exists());

    // Without the mirror the device's log alone lacks the last writes:
    // those in the block that was open, at least.
    let store = open(dir.path(), false);
    let ks = store.keyspace("default").unwrap();
    let on_device = (0..WRITES)
        .filter(|i| {
            store
                .get(ks, format!("key{i:08}").as_bytes())
                .unwrap()
                .is_some()
        })
        .count() as u64;
    assert!(
        on_device < WRITES,
        "every write reached the device: nothing tested"
    );
    assert!(
        on_device >= WRITES - WRITE_THROUGH_EVERY,
        "written through: {on_device}"
    );
    drop(store);

    // With it, every write is back, and the mirror was made anew.
    let store = open(dir.path(), true);
    for i in 0..WRITES {
        let got = store.get(ks, format!("key{i:08}").as_bytes()).unwrap();
        assert_eq!(got, Some(value(i)), "write {i}");
    }
    assert_eq!(store.log_mirror_used_bytes(), 0);
    drop(store);
    // A clean close leaves no mirror behind, and reopening needs none.
    assert!(!mirror_path(dir.path()).exists());
    let store = open(dir.path(), false);
    assert_eq!(store.get(ks, b"key00019999").unwrap(), Some(value(19_999)));
}

#[test]
fn records_the_mirror_cannot_keep_wait_for_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let dev: Arc<dyn Device> = Arc::new(
        FileDevice::create(&dir.path().join("dev"), 64 << 20, &FileOptions::default()).unwrap(),
    );
    let store = Store::create(dev, &config(Some(mirror_path(dir.path())))).unwrap();
    let ks = store.keyspace("default").unwrap();
    let put = |key: &[u8], v: &[u8]| {
        let mut b = WriteBatch::new();
        b.put(ks, key, v).unwrap();
        store.write_logged(&b).unwrap().position
    };
    let small = put(b"a", b"1");
    assert!(store.is_kept(small));
    // A value large enough for a blob file: its bytes may be in memory
    // only until the log block is written, so the mirror does not count.
    let large = put(b"big", &vec![7u8; 64 << 10]);
    assert!(!store.is_kept(large));
    // Nor any write after it, until a write through covers it.
    let after = put(b"b", b"2");
    assert!(!store.is_kept(after));
    store.write_through(after).unwrap();
    assert!(store.is_kept(large) && store.is_kept(after));
    let next = put(b"c", b"3");
    assert!(
        store.is_kept(next),
        "kept again once the gap is on the device"
    );

    // A full mirror: records past its room are not kept either. (A record
    // takes at most a quarter of it: 100 KiB values fill 1 MiB in ten.)
    let mut positions = Vec::new();
    for i in 0..12u8 {
        // Values under the blob threshold: a record of ~100 KiB.
        let mut b = WriteBatch::new();
        for j in 0..100u32 {
            b.put(ks, format!("k{i}-{j}").as_bytes(), &[i; 1000])
                .unwrap();
        }
        positions.push(store.write_logged(&b).unwrap().position);
    }
    let kept = positions.iter().filter(|p| store.is_kept(**p)).count();
    assert!(kept < positions.len(), "a 1 MiB mirror kept 1.2 MB");
    assert!(kept >= 8, "kept {kept}");
    store.write_through(*positions.last().unwrap()).unwrap();
    assert!(positions.iter().all(|p| store.is_kept(*p)));
    assert!(store.log_mirror_used_bytes() < 1 << 20);
}
