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
        let id = ks.values().map(|k| k.id).max().map_or(0, |m| m + 1);
        let def = KeyspaceDef {
            id,
            name: name.into(),
            format,
            schema: schema.into(),
        };
        manifest.log(&[Edit::AddKeyspace(def.clone())])?;
        ks.insert(name.into(), def);
        Ok(id)
    }

    pub(super) fn check_keyspaces(&self, batch: &WriteBatch) -> Result<()> {
        let ks = read(&self.inner.keyspaces);
        for op in &batch.ops {
            if !ks.values().any(|k| k.id == op.keyspace) {
                return Err(StoreError::UnknownKeyspace {
                    name: format!("#{}", op.keyspace),
                    known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(())
    }
}
