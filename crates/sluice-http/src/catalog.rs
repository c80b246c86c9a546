//! Indices: each one two store keyspaces (its documents' `_source` bytes,
//! and their version records), listed in the catalog keyspace
//! `http.indices` (docs/FORMAT.md, "HTTP indices").

use crate::columns::{ColumnBudget, Columns};
use crate::error::{ApiError, ApiResult};
use serde_json::{json, Value};
use sluice_store::{Store, StoreError, ValueFormat};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// The catalog keyspace.
pub const CATALOG_KEYSPACE: &str = "http.indices";
/// Longest document id, in bytes (Elasticsearch's limit).
pub const MAX_ID_BYTES: usize = 512;
/// Most shards (slices) an index may declare.
pub const MAX_SHARDS: u32 = 1024;

/// One index.
#[derive(Debug)]
pub struct Index {
    /// Its name.
    pub name: String,
    /// Its uuid (new at each creation).
    pub uuid: String,
    /// Keyspace of `_id` → `_source`.
    pub docs: u32,
    /// Keyspace of `_id` → version record.
    pub versions: u32,
    /// `number_of_shards`: how the index is cut into slices.
    pub shards: u32,
    /// When it was created, ms since the epoch.
    pub created_ms: u64,
    /// `{"properties":{…}}` as given (merged over `PUT _mapping`).
    pub mappings: RwLock<Value>,
    /// Its field columns (counts and aggregations without a scan).
    pub columns: Columns,
    /// Versions of its recently deleted documents.
    pub tombstones: crate::tombstones::Tombstones,
    /// The fields the catalog entry says had columns: built again at open.
    column_fields: RwLock<Vec<String>>,
    /// Moves on after every write and mapping change, once it is visible:
    /// the request cache keys answers by it.
    generation: std::sync::atomic::AtomicU64,
}

impl Index {
    /// See `generation`.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Called after a write or a mapping change is visible.
    pub fn bump_generation(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn record(&self) -> Value {
        json!({
            "uuid": self.uuid,
            "docs_keyspace": self.docs,
            "versions_keyspace": self.versions,
            "shards": self.shards,
            "created_ms": self.created_ms,
            "mappings": read(&self.mappings).clone(),
            "column_fields": read(&self.column_fields).clone(),
        })
    }

    /// The mappings as Elasticsearch shows them.
    pub fn mappings(&self) -> Value {
        read(&self.mappings).clone()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Every index of the store.
pub struct Catalog {
    store: Arc<Store>,
    keyspace: u32,
    indices: RwLock<BTreeMap<String, Arc<Index>>>,
    /// Creations and deletions one at a time.
    changing: Mutex<()>,
    /// The memory every index's field columns share.
    column_budget: Arc<ColumnBudget>,
    /// The thread building remembered columns after open, and its stop flag.
    warming: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop_warming: Arc<AtomicBool>,
}

impl Drop for Catalog {
    fn drop(&mut self) {
        self.stop_warming.store(true, Ordering::Relaxed);
        let warming = self.warming.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = warming.take() {
            let _ = handle.join();
        }
    }
}

/// Checks an index name as Elasticsearch does.
pub fn check_index_name(name: &str) -> ApiResult<()> {
    let bad = |why: &str| {
        Err(ApiError::new(
            400,
            "invalid_index_name_exception",
            format!("Invalid index name [{name}], {why}"),
        )
        .with("index", json!(name))
        .with("index_uuid", json!("_na_")))
    };
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name != name.to_lowercase() {
        return bad("must be lowercase");
    }
    if name.starts_with(['_', '-', '+']) {
        return bad("must not start with '_', '-', or '+'");
    }
    if name == "." || name == ".." {
        return bad("must not be '.' or '..'");
    }
    if name.len() > 255 {
        return bad(&format!("index name is too long, ({} > 255)", name.len()));
    }
    if let Some(c) = name.chars().find(|c| {
        matches!(
            c,
            '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ' ' | ',' | '#' | ':'
        )
    }) {
        return bad(&format!(
            "must not contain the following characters [' ', '\"', '*', ',', '/', '<', '>', '?', '\\\\', '|', '#', ':'] (found {c:?})"
        ));
    }
    Ok(())
}

/// The keyspaces of one index: `http.<uuid>.<part>`.
const INDEX_KEYSPACES: [&str; 2] = ["docs", "versions"];

fn index_keyspace(uuid: &str, part: &str) -> String {
    format!("http.{uuid}.{part}")
}

/// Drops the keyspaces of indices the catalog does not hold: an index
/// deleted, or being created, when the process stopped.
fn drop_orphans(store: &Store, indices: &BTreeMap<String, Arc<Index>>) -> Result<(), StoreError> {
    let live: std::collections::HashSet<&str> = indices.values().map(|i| i.uuid.as_str()).collect();
    for def in store.keyspaces() {
        let Some(rest) = def.name.strip_prefix("http.") else {
            continue;
        };
        let orphan = INDEX_KEYSPACES.iter().any(|part| {
            rest.strip_suffix(part)
                .and_then(|r| r.strip_suffix('.'))
                .is_some_and(|uuid| !live.contains(uuid))
        });
        if orphan {
            log::info!(
                "dropping keyspace {} of an index no longer in the catalog",
                def.name
            );
            store.drop_keyspace(&def.name)?;
        }
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn new_uuid() -> String {
    use base64::Engine;
    let bytes: [u8; 16] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl Catalog {
    /// Opens the catalog of `store` (made on first use) and its indices.
    pub fn open(store: Arc<Store>) -> Result<Catalog, StoreError> {
        let keyspace = match store.keyspace(CATALOG_KEYSPACE) {
            Ok(id) => id,
            Err(StoreError::UnknownKeyspace { .. }) => {
                store.create_keyspace(CATALOG_KEYSPACE, ValueFormat::Json, "")?
            }
            Err(e) => return Err(e),
        };
        let snapshot = store.snapshot();
        let column_budget = Arc::new(ColumnBudget::default());
        let mut indices = BTreeMap::new();
        for pair in store.iter(
            keyspace,
            (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
            &snapshot,
            false,
        ) {
            let (key, value) = pair?;
            let name = String::from_utf8_lossy(&key).into_owned();
            let index = parse_record(&name, &value, &column_budget).map_err(|why| {
                StoreError::BadInput(format!(
                    "the catalog entry of index {name:?} is damaged: {why}"
                ))
            })?;
            indices.insert(name, Arc::new(index));
        }
        drop_orphans(&store, &indices)?;
        Ok(Catalog {
            store,
            keyspace,
            indices: RwLock::new(indices),
            changing: Mutex::new(()),
            column_budget,
            warming: Mutex::new(None),
            stop_warming: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Starts building, on a background thread, the field columns each
    /// index had before the last stop, so that its first count does not
    /// wait for them (set the column budget first).
    pub fn warm_columns(&self) {
        let work: Vec<(Arc<Index>, Vec<String>)> = read(&self.indices)
            .values()
            .map(|i| (i.clone(), read(&i.column_fields).clone()))
            .filter(|(_, fields)| !fields.is_empty())
            .collect();
        if work.is_empty() {
            return;
        }
        let store = self.store.clone();
        let stop = self.stop_warming.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-columns".into())
            .spawn(move || {
                for (index, fields) in work {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    index.columns.warm(&store, index.docs, &fields, &stop);
                }
            });
        match spawned {
            Ok(h) => *self.warming.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
            Err(e) => {
                log::warn!("field columns not built at open ({e}): the first counts build them")
            }
        }
    }

    /// Remembers in their catalog entries which fields of `indices` have
    /// columns now, for [`Catalog::warm_columns`] after a restart.
    pub fn remember_columns(&self, indices: &[Arc<Index>]) {
        for index in indices {
            let now = index.columns.field_names();
            if now.is_empty() || *read(&index.column_fields) == now {
                continue;
            }
            let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
            // Not for an index deleted meanwhile: its entry must stay gone.
            let current = read(&self.indices)
                .get(&index.name)
                .is_some_and(|i| Arc::ptr_eq(i, index));
            if !current {
                continue;
            }
            *write(&index.column_fields) = now;
            if let Err(e) = self.save(index) {
                log::warn!("remembering the field columns of index {}: {e}", index.name);
            }
        }
    }

    /// The memory every index's field columns share.
    pub fn column_budget(&self) -> &Arc<ColumnBudget> {
        &self.column_budget
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The index called `name`.
    pub fn get(&self, name: &str) -> ApiResult<Arc<Index>> {
        read(&self.indices)
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::no_index(name))
    }

    /// Whether `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        read(&self.indices).contains_key(name)
    }

    /// Every index, by name.
    pub fn all(&self) -> Vec<Arc<Index>> {
        read(&self.indices).values().cloned().collect()
    }

    /// The indices an expression names: comma-separated names, `*`
    /// wildcards, `_all`. A plain name that does not exist is an error;
    /// a wildcard that matches nothing is not.
    pub fn resolve(&self, expression: &str) -> ApiResult<Vec<Arc<Index>>> {
        let indices = read(&self.indices);
        let mut out: Vec<Arc<Index>> = Vec::new();
        for part in expression.split(',').filter(|p| !p.is_empty()) {
            if part == "_all" || part == "*" {
                out.extend(indices.values().cloned());
            } else if part.contains('*') {
                out.extend(
                    indices
                        .iter()
                        .filter(|(n, _)| glob(part, n))
                        .map(|(_, i)| i.clone()),
                );
            } else {
                out.push(
                    indices
                        .get(part)
                        .cloned()
                        .ok_or_else(|| ApiError::no_index(part))?,
                );
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out.dedup_by(|a, b| a.name == b.name);
        Ok(out)
    }

    /// Creates an index; `body` is the create-index request body (its
    /// `settings` and `mappings`).
    pub fn create(&self, name: &str, body: &Value) -> ApiResult<Arc<Index>> {
        check_index_name(name)?;
        let shards = shards_setting(body)?;
        let mappings = match body.get("mappings") {
            None => json!({}),
            Some(m) => check_mappings(m)?,
        };
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(existing) = self.get(name) {
            return Err(ApiError::new(
                400,
                "resource_already_exists_exception",
                format!("index [{name}/{}] already exists", existing.uuid),
            )
            .with("index", json!(name))
            .with("index_uuid", json!(existing.uuid)));
        }
        let uuid = new_uuid();
        let docs = self
            .store
            .create_keyspace(&index_keyspace(&uuid, "docs"), ValueFormat::Json, "")
            .map_err(ApiError::store)?;
        let versions = self
            .store
            .create_keyspace(&index_keyspace(&uuid, "versions"), ValueFormat::Raw, "")
            .map_err(ApiError::store)?;
        let index = Arc::new(Index {
            name: name.into(),
            uuid,
            docs,
            versions,
            shards,
            created_ms: now_ms(),
            mappings: RwLock::new(mappings),
            columns: Columns::new(self.column_budget.clone()),
            tombstones: Default::default(),
            column_fields: RwLock::new(Vec::new()),
            generation: Default::default(),
        });
        self.save(&index)?;
        write(&self.indices).insert(name.into(), index.clone());
        Ok(index)
    }

    fn save(&self, index: &Index) -> ApiResult<()> {
        self.store
            .put(
                self.keyspace,
                index.name.as_bytes(),
                index.record().to_string().as_bytes(),
            )
            .map_err(ApiError::store)?;
        Ok(())
    }

    /// Deletes an index and every document of it: its catalog entry goes
    /// first (durably), then its keyspaces are dropped, which frees their
    /// space. Keyspaces a crash left behind are dropped at the next open.
    pub fn delete(&self, name: &str) -> ApiResult<()> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let index = self.get(name)?;
        self.store
            .delete(self.keyspace, name.as_bytes())
            .map_err(ApiError::store)?;
        write(&self.indices).remove(name);
        for part in INDEX_KEYSPACES {
            self.store
                .drop_keyspace(&index_keyspace(&index.uuid, part))
                .map_err(ApiError::store)?;
        }
        Ok(())
    }

    /// Adds fields to an index's mappings (`PUT /idx/_mapping`); a field
    /// declared already with another type is refused.
    pub fn put_mapping(&self, index: &Index, body: &Value) -> ApiResult<()> {
        let _one = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let add = check_mappings(body)?;
        {
            let mut m = write(&index.mappings);
            merge_properties(&mut m, &add)?;
        }
        let saved = self.save(index);
        index.bump_generation();
        saved
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

fn shards_setting(body: &Value) -> ApiResult<u32> {
    let settings = body.get("settings");
    let value = settings
        .and_then(|s| {
            s.pointer("/index/number_of_shards")
                .or_else(|| s.get("index.number_of_shards"))
                .or_else(|| s.get("number_of_shards"))
        })
        .cloned();
    let shards = match &value {
        None => 1,
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0_u64),
        Some(_) => 0,
    };
    if shards == 0 || shards > u64::from(MAX_SHARDS) {
        return Err(ApiError::illegal(format!(
            "Failed to parse value [{}] for setting [index.number_of_shards] must be >= 1 and <= {MAX_SHARDS}",
            value.map_or("null".into(), |v| v.to_string())
        )));
    }
    Ok(shards as u32)
}

/// Field types an index may declare (each stored as JSON; sort and
/// comparisons follow the JSON value).
const FIELD_TYPES: &[&str] = &[
    "keyword",
    "text",
    "long",
    "integer",
    "short",
    "byte",
    "double",
    "float",
    "half_float",
    "scaled_float",
    "boolean",
    "date",
    "object",
    "nested",
    "flattened",
    "ip",
    "unsigned_long",
    "match_only_text",
    "wildcard",
    "constant_keyword",
];

fn check_mappings(m: &Value) -> ApiResult<Value> {
    let Value::Object(obj) = m else {
        return Err(ApiError::new(
            400,
            "mapper_parsing_exception",
            "Failed to parse mapping: the mapping must be an object",
        ));
    };
    if let Some(props) = obj.get("properties") {
        check_properties(props, "")?;
    }
    Ok(m.clone())
}

fn check_properties(props: &Value, parent: &str) -> ApiResult<()> {
    let Value::Object(fields) = props else {
        return Err(ApiError::new(
            400,
            "mapper_parsing_exception",
            format!("Failed to parse mapping: [{parent}properties] must be an object"),
        ));
    };
    for (name, def) in fields {
        if let Some(inner) = def.get("properties") {
            check_properties(inner, &format!("{parent}{name}."))?;
            continue;
        }
        match def.get("type").and_then(Value::as_str) {
            Some(t) if FIELD_TYPES.contains(&t) => {}
            Some(t) => {
                return Err(ApiError::new(
                    400,
                    "mapper_parsing_exception",
                    format!("Failed to parse mapping: No handler for type [{t}] declared on field [{parent}{name}]"),
                ))
            }
            None => {
                return Err(ApiError::new(
                    400,
                    "mapper_parsing_exception",
                    format!("Failed to parse mapping: No type specified for field [{parent}{name}]"),
                ))
            }
        }
    }
    Ok(())
}

fn merge_properties(into: &mut Value, add: &Value) -> ApiResult<()> {
    let Some(new) = add.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    if !into.is_object() {
        *into = json!({});
    }
    let Some(target) = into.as_object_mut() else {
        return Ok(());
    };
    let props = target.entry("properties").or_insert_with(|| json!({}));
    let Some(props) = props.as_object_mut() else {
        return Ok(());
    };
    for (name, def) in new {
        match props.get(name) {
            Some(old) if old.get("type") != def.get("type") && def.get("properties").is_none() => {
                return Err(ApiError::illegal(format!(
                    "mapper [{name}] cannot be changed from type [{}] to [{}]",
                    old.get("type").and_then(Value::as_str).unwrap_or("object"),
                    def.get("type").and_then(Value::as_str).unwrap_or("object")
                )))
            }
            Some(_) => {}
            None => {
                props.insert(name.clone(), def.clone());
            }
        }
    }
    Ok(())
}

fn parse_record(name: &str, value: &[u8], budget: &Arc<ColumnBudget>) -> Result<Index, String> {
    let v: Value = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    let num = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or(format!("{k} is missing"))
    };
    Ok(Index {
        name: name.into(),
        uuid: v
            .get("uuid")
            .and_then(Value::as_str)
            .ok_or("uuid is missing")?
            .into(),
        docs: u32::try_from(num("docs_keyspace")?).map_err(|e| e.to_string())?,
        versions: u32::try_from(num("versions_keyspace")?).map_err(|e| e.to_string())?,
        shards: u32::try_from(num("shards")?).map_err(|e| e.to_string())?,
        created_ms: num("created_ms")?,
        mappings: RwLock::new(v.get("mappings").cloned().unwrap_or(json!({}))),
        columns: Columns::new(budget.clone()),
        tombstones: Default::default(),
        column_fields: RwLock::new(match v.get("column_fields") {
            None => Vec::new(),
            Some(f) => serde_json::from_value(f.clone())
                .map_err(|e| format!("column_fields is not a list of names: {e}"))?,
        }),
        generation: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_names() {
        assert!(glob("pap*", "papers"));
        assert!(glob("*ers", "papers"));
        assert!(glob("p*p*s", "papers"));
        assert!(!glob("x*", "papers"));
        assert!(check_index_name("papers-1").is_ok());
        assert_eq!(
            check_index_name("Papers").unwrap_err().kind,
            "invalid_index_name_exception"
        );
        assert!(check_index_name("_x").is_err());
        assert!(check_index_name("a b").is_err());
    }

    /// A deleted index's keyspaces are dropped, and keyspaces of indices
    /// the catalog does not hold (a crash between the steps of a create or
    /// a delete) are dropped when the catalog opens.
    #[test]
    fn deleted_and_orphaned_index_keyspaces_are_dropped() {
        let mem = Arc::new(sluice_io::MemoryDevice::new(4096, 8192));
        let store = Arc::new(
            Store::create(
                mem as Arc<dyn sluice_io::Device>,
                &sluice_store::StoreConfig {
                    wal_blocks: 1024,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let names = |store: &Store| -> Vec<String> {
            store.keyspaces().into_iter().map(|k| k.name).collect()
        };
        let catalog = Catalog::open(store.clone()).unwrap();
        let kept = catalog.create("kept", &json!({})).unwrap();
        let gone = catalog.create("gone", &json!({})).unwrap();
        catalog.delete("gone").unwrap();
        let all = names(&store);
        assert!(!all.iter().any(|n| n.contains(&gone.uuid)), "{all:?}");
        assert!(all.contains(&index_keyspace(&kept.uuid, "docs")), "{all:?}");
        store
            .create_keyspace("http.orphan.docs", ValueFormat::Json, "")
            .unwrap();
        store
            .create_keyspace("http.orphan.versions", ValueFormat::Raw, "")
            .unwrap();
        drop(catalog);
        let catalog = Catalog::open(store.clone()).unwrap();
        let all = names(&store);
        assert!(!all.iter().any(|n| n.contains("orphan")), "{all:?}");
        assert!(catalog.exists("kept"));
        assert_eq!(all.len(), 4, "{all:?}");
    }
}
