//! Keyspaces: named key spaces with a value format and schema.

use super::*;

impl Store {
    /// The id of keyspace `name`.
    pub fn keyspace(&self, name: &str) -> Result<u32> {
        let ks = read(&self.inner.keyspaces);
        ks.get(name)
            .map(|k| k.id)
            .ok_or_else(|| StoreError::UnknownKeyspace {
                name: name.into(),
                known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Every keyspace's definition, by name.
    pub fn keyspaces(&self) -> Vec<KeyspaceDef> {
        read(&self.inner.keyspaces).values().cloned().collect()
    }

    /// The keyspace's definition (id, format, schema).
    pub fn keyspace_def(&self, name: &str) -> Result<KeyspaceDef> {
        let ks = read(&self.inner.keyspaces);
        ks.get(name)
            .cloned()
            .ok_or_else(|| StoreError::UnknownKeyspace {
                name: name.into(),
                known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Creates keyspace `name` with a declared value format; returns its id.
    pub fn create_keyspace(&self, name: &str, format: ValueFormat, schema: &str) -> Result<u32> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(StoreError::BadInput(format!(
                "keyspace name {name:?} must be 1 to 255 printable characters"
            )));
        }
        let mut manifest = lock(&self.inner.manifest);
        let mut ks = write(&self.inner.keyspaces);
        if ks.contains_key(name) {
            return Err(StoreError::BadInput(format!(
                "keyspace {name:?} exists already"
            )));
        }
        if ks.len() >= MAX_KEYSPACES {
            return Err(StoreError::BadInput(format!(
                "a store holds at most {MAX_KEYSPACES} keyspaces"
            )));
        }
        // Never an id a dropped keyspace had: its log records may still be
        // replayed.
        let id = manifest.state().next_keyspace;
        let def = KeyspaceDef {
            id,
            name: name.into(),
            format,
            schema: schema.into(),
        };
        manifest.log(&[Edit::AddKeyspace(def.clone())])?;
        ks.insert(name.into(), def);
        lock(&self.inner.writer).keyspace_ids.push(id);
        Ok(id)
    }

    /// Drops keyspace `name` and everything in it: its tables are removed
    /// in one manifest group (their extents are freed once no iterator
    /// reads them), writes still in the memtable or the log are never
    /// flushed, and its id is never given again. Iterators opened before
    /// the drop read on from what they started with.
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        let inner = &self.inner;
        // No flush or compaction may install a table of it meanwhile.
        let _flush = lock(&inner.flush_lock);
        let _compaction = lock(&inner.compaction_lock);
        let id = self.keyspace(name)?;
        let version = read(&inner.version).clone();
        let tables: Vec<Arc<Table>> = version
            .levels(id)
            .map(|l| l.all().cloned().collect())
            .unwrap_or_default();
        let mut edits: Vec<Edit> = tables
            .iter()
            .map(|t| Edit::RemoveTable {
                keyspace: id,
                file_no: t.meta.file_no,
            })
            .collect();
        edits.push(Edit::DropKeyspace(id));
        edits.extend(inner.take_released());
        inner.log_group(&edits)?;
        {
            let mut ks = write(&inner.keyspaces);
            ks.remove(name);
            lock(&inner.writer).keyspace_ids.retain(|&k| k != id);
        }
        {
            let mut v = write(&inner.version);
            let mut next = (**v).clone();
            next.keyspaces.remove(&id);
            *v = Arc::new(next);
            inner.view_generation.fetch_add(1, Ordering::Release);
        }
        for t in &tables {
            t.mark_obsolete();
        }
        inner.drop_unreferenced_blob_files_logged();
        Ok(())
    }

    /// The error of a write to keyspace `id`, which is not (or no more).
    pub(super) fn unknown_keyspace(&self, id: u32) -> StoreError {
        let ks = read(&self.inner.keyspaces);
        StoreError::UnknownKeyspace {
            name: format!("#{id}"),
            known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }
}
