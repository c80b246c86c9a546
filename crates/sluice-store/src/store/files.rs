//! One way to open a store on device files: create-or-open with options.
//!
//! The CLI, the server, the Python package and the benchmarks all open a
//! store the same way: a list of device files (regular files opened with
//! `O_DIRECT`, or block devices), created and formatted when none of them
//! exists yet, opened otherwise. The policy that goes with it (how large
//! a fresh store's log ring is, what a half-present device set means)
//! lives here once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_io::{Device, FileDevice, FileOptions};

use super::{Store, StoreConfig};
use crate::error::{Result, StoreError};

/// A store on device files, opened or made ([`StoreFiles::open`],
/// [`StoreFiles::format`]).
#[derive(Debug, Clone)]
pub struct StoreFiles {
    paths: Vec<PathBuf>,
    config: StoreConfig,
    create_bytes: Option<u64>,
    wal_blocks: Option<u32>,
    when_missing: String,
}

impl StoreFiles {
    /// The device set at `paths`, in the order the store was (or will be)
    /// formatted with; the first holds the superblock, manifest and log.
    pub fn new<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Self {
        StoreFiles {
            paths: paths.into_iter().map(Into::into).collect(),
            config: StoreConfig::default(),
            create_bytes: None,
            wal_blocks: None,
            when_missing: "create and format one there first".into(),
        }
    }

    /// Opens (and formats) with `config` (default: [`StoreConfig::default`]).
    /// Its `wal_blocks` is not used: see [`StoreFiles::wal_blocks`].
    pub fn config(mut self, config: StoreConfig) -> Self {
        self.config = config;
        self
    }

    /// Files of `size_bytes` each are made where none of the set exists
    /// yet ([`StoreFiles::open`]), or made anew ([`StoreFiles::format`]),
    /// with their directories.
    pub fn create_bytes(mut self, size_bytes: u64) -> Self {
        self.create_bytes = Some(size_bytes);
        self
    }

    /// The log ring of a store formatted here, in 4 KiB store blocks
    /// (default: [`StoreConfig::format_wal_blocks`] for the first device).
    pub fn wal_blocks(mut self, blocks: u32) -> Self {
        self.wal_blocks = Some(blocks);
        self
    }

    /// What the error of [`StoreFiles::open`] advises when no file of the
    /// set exists and none is to be made (each front end names its own way
    /// to make one).
    pub fn when_missing(mut self, advice: impl Into<String>) -> Self {
        self.when_missing = advice.into();
        self
    }

    /// The device files, in order.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Opens the store, or, when no file of the set exists and
    /// [`StoreFiles::create_bytes`] was given, makes the files and formats
    /// a store on them. A set of which only some files exist is refused
    /// (naming the missing one): a device of a set is never replaced
    /// behind the others' back.
    pub fn open(&self) -> Result<Store> {
        self.check_paths()?;
        let existing: Vec<bool> = self.paths.iter().map(|p| p.exists()).collect();
        if existing.iter().all(|e| !e) {
            return match self.create_bytes {
                Some(size_bytes) => {
                    let store = self.make_and_format(size_bytes)?;
                    for path in &self.paths {
                        log::info!(
                            "created and formatted {} ({} MiB)",
                            path.display(),
                            size_bytes >> 20
                        );
                    }
                    Ok(store)
                }
                None => Err(StoreError::NoStore {
                    path: self.paths[0].clone(),
                    advice: self.when_missing.clone(),
                }),
            };
        }
        if let Some((missing, _)) = self.paths.iter().zip(&existing).find(|(_, e)| !**e) {
            return Err(StoreError::NoStore {
                path: missing.clone(),
                advice: "the other devices of the set exist: give the same device list, \
                         in the same order, that the store was formatted with"
                    .into(),
            });
        }
        Store::open_on(self.open_devices()?, &self.config)
    }

    /// Formats a new store on the set (everything on it is overwritten):
    /// on fresh files of [`StoreFiles::create_bytes`] each if it was given
    /// (replacing any there), on the existing files otherwise.
    pub fn format(&self) -> Result<Store> {
        self.check_paths()?;
        match self.create_bytes {
            Some(size_bytes) => self.make_and_format(size_bytes),
            None => self.format_on(self.open_devices()?),
        }
    }

    /// Opens each device file (`O_DIRECT`), in order.
    pub fn open_devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        self.paths
            .iter()
            .map(|path| {
                let dev = FileDevice::open(path, &FileOptions::default())
                    .map_err(|error| device_error(path, "opening", error))?;
                Ok(Arc::new(dev) as Arc<dyn Device>)
            })
            .collect()
    }

    fn check_paths(&self) -> Result<()> {
        if self.paths.is_empty() {
            return Err(StoreError::BadInput(
                "no device given: name at least one device file".into(),
            ));
        }
        Ok(())
    }

    fn make_and_format(&self, size_bytes: u64) -> Result<Store> {
        let mut devices: Vec<Arc<dyn Device>> = Vec::with_capacity(self.paths.len());
        for path in &self.paths {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::BadDevice(format!("creating {} for its device: {e}", dir.display()))
                })?;
            }
            if path.exists() {
                std::fs::remove_file(path).map_err(|e| {
                    StoreError::BadDevice(format!("replacing {}: {e}", path.display()))
                })?;
            }
            let dev = FileDevice::create(path, size_bytes, &FileOptions::default())
                .map_err(|error| device_error(path, "creating", error))?;
            devices.push(Arc::new(dev));
        }
        self.format_on(devices)
    }

    fn format_on(&self, devices: Vec<Arc<dyn Device>>) -> Result<Store> {
        let first_blocks = crate::blocks::device_store_blocks(&devices[0])?;
        let config = StoreConfig {
            wal_blocks: self
                .wal_blocks
                .unwrap_or_else(|| self.config.format_wal_blocks(first_blocks)),
            ..self.config.clone()
        };
        Store::create_on(devices, &config)
    }
}

fn device_error(path: &Path, doing: &str, error: sluice_io::IoError) -> StoreError {
    if !path.exists() {
        return StoreError::NoStore {
            path: path.to_path_buf(),
            advice: format!("{doing} it failed: {error}"),
        };
    }
    StoreError::BadDevice(format!("{doing} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ks(store: &Store) -> u32 {
        store.keyspace(crate::DEFAULT_KEYSPACE).unwrap()
    }

    fn small() -> StoreConfig {
        StoreConfig {
            write_buffer_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
            ..StoreConfig::default()
        }
    }

    #[test]
    fn open_makes_a_fresh_store_once_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/one.dev");
        let files = StoreFiles::new([&path])
            .config(small())
            .create_bytes(64 << 20);
        {
            let store = files.open().unwrap();
            store.put(ks(&store), b"k", b"v").unwrap();
        }
        let store = files.open().unwrap();
        assert_eq!(
            store.get(ks(&store), b"k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
    }

    #[test]
    fn open_without_create_names_the_missing_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.dev");
        let err = StoreFiles::new([&path]).open().err().unwrap();
        assert!(matches!(err, StoreError::NoStore { .. }), "{err}");
        assert!(err.to_string().contains("none.dev"), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn a_half_present_set_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.dev");
        let b = dir.path().join("b.dev");
        StoreFiles::new([&a])
            .config(small())
            .create_bytes(64 << 20)
            .open()
            .unwrap();
        let err = StoreFiles::new([&a, &b])
            .config(small())
            .create_bytes(64 << 20)
            .open()
            .err()
            .unwrap();
        assert!(err.to_string().contains("b.dev"), "{err}");
        assert!(!b.exists(), "a missing member must not be made");
    }

    #[test]
    fn format_replaces_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.dev");
        let files = StoreFiles::new([&path])
            .config(small())
            .create_bytes(64 << 20);
        let store = files.open().unwrap();
        store.put(ks(&store), b"k", b"v").unwrap();
        drop(store);
        drop(files.format().unwrap());
        let store = files.open().unwrap();
        assert_eq!(store.get(ks(&store), b"k").unwrap(), None);
    }

    #[test]
    fn the_log_ring_follows_the_write_buffer_within_an_eighth() {
        let config = |mib: usize| StoreConfig {
            write_buffer_bytes: mib << 20,
            ..StoreConfig::default()
        };
        // A small device: an eighth of it, at least 64 blocks.
        assert_eq!(config(64).format_wal_blocks(1024), 128);
        assert_eq!(config(64).format_wal_blocks(100), 64);
        // The default ring where three buffers do not fit an eighth.
        assert_eq!(config(64).format_wal_blocks(131_072), 16_384);
        // Three write buffers where an eighth of the device allows.
        assert_eq!(config(256).format_wal_blocks(8 << 20), 3 * 256 * 256);
        assert_eq!(config(256).format_wal_blocks(1 << 20), 131_072);
    }
}
