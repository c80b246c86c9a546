//! Index administration of the HTTP API: create, delete, mappings,
//! settings, `_cat/indices`.

use crate::api::*;
use crate::catalog::Index;
use crate::dsl;
use crate::error::{ApiError, ApiResult};
use crate::search::{self};
use crate::wire::{Request, Response};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A size as Elasticsearch's `_cat` APIs write it: `225b`, `5.2kb`, `1mb`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["kb", "mb", "gb", "tb", "pb"];
    if bytes < 1024 {
        return format!("{bytes}b");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{}", UNITS[unit])
}

impl Api {
    pub(crate) fn doc_count(&self, index: &Arc<Index>) -> ApiResult<u64> {
        search::count(
            self.catalog.store(),
            std::slice::from_ref(index),
            &dsl::Query::All,
        )
    }

    pub(crate) fn cat_indices(&self, req: &Request, pattern: Option<&str>) -> ApiResult<Response> {
        let indices = match pattern {
            Some(p) => self.catalog.resolve(p)?,
            None => self.catalog.all(),
        };
        let raw_bytes = req.param("bytes") == Some("b");
        let store = self.catalog.store();
        let mut rows = Vec::new();
        for i in &indices {
            let count = self.doc_count(i)?;
            let bytes = store.keyspace_table_bytes(i.docs) + store.keyspace_table_bytes(i.versions);
            let size = if raw_bytes {
                bytes.to_string()
            } else {
                human_bytes(bytes)
            };
            rows.push(json!({
                "health": "green", "status": "open", "index": i.name, "uuid": i.uuid,
                "pri": i.shards.to_string(), "rep": "0", "docs.count": count.to_string(),
                "docs.deleted": "0", "store.size": size, "pri.store.size": size,
                "dataset.size": size,
                "creation.date": i.created_ms.to_string(),
            }));
        }
        const DEFAULT_COLUMNS: [&str; 11] = [
            "health",
            "status",
            "index",
            "uuid",
            "pri",
            "rep",
            "docs.count",
            "docs.deleted",
            "store.size",
            "pri.store.size",
            "dataset.size",
        ];
        let columns: Vec<&str> = match req.param("h") {
            Some(h) => h.split(',').collect(),
            None => DEFAULT_COLUMNS.to_vec(),
        };
        if req.param("format") == Some("json") {
            let picked: Vec<Value> = rows
                .iter()
                .map(|r| {
                    Value::Object(
                        columns
                            .iter()
                            .map(|c| (c.to_string(), r.get(*c).cloned().unwrap_or(Value::Null)))
                            .collect(),
                    )
                })
                .collect();
            return ok(200, &Value::Array(picked));
        }
        let mut text = String::new();
        for r in &rows {
            let cells: Vec<&str> = columns
                .iter()
                .map(|c| r.get(*c).and_then(Value::as_str).unwrap_or(""))
                .collect();
            text.push_str(&cells.join(" "));
            text.push('\n');
        }
        Ok(Response::text(200, text))
    }

    pub(crate) fn create_index(&self, req: &Request, name: &str) -> ApiResult<Response> {
        let body = body_json(req)?.unwrap_or(json!({}));
        self.catalog.create(name, &body)?;
        ok(
            200,
            &json!({"acknowledged": true, "shards_acknowledged": true, "index": name}),
        )
    }

    pub(crate) fn delete_index(&self, expression: &str) -> ApiResult<Response> {
        // Elasticsearch's DestructiveOperations: a name is needed for each
        // index, so that one mistyped request cannot drop every index.
        let wildcard = expression
            .split(',')
            .any(|part| part == "_all" || part.contains('*'));
        if wildcard && self.destructive_requires_name.load(Ordering::Relaxed) {
            return Err(ApiError::illegal(
                "Wildcard expressions or all indices are not allowed",
            ));
        }
        for i in self.catalog.resolve(expression)? {
            self.catalog.delete(&i.name)?;
        }
        ok(200, &json!({"acknowledged": true}))
    }

    pub(crate) fn settings_of(i: &Index) -> Value {
        json!({"index": {
            "number_of_shards": i.shards.to_string(), "number_of_replicas": "0",
            "uuid": i.uuid, "creation_date": i.created_ms.to_string(), "provided_name": i.name,
            "version": {"created": "8500003"}
        }})
    }

    pub(crate) fn get_index(&self, expression: &str) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            out.insert(
                i.name.clone(),
                json!({"aliases": {}, "mappings": i.mappings(), "settings": Self::settings_of(&i)}),
            );
        }
        ok(200, &Value::Object(out))
    }

    pub(crate) fn get_mapping(&self, expression: &str) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            out.insert(i.name.clone(), json!({"mappings": i.mappings()}));
        }
        ok(200, &Value::Object(out))
    }

    pub(crate) fn put_mapping(&self, req: &Request, expression: &str) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: mapping source is missing;",
            )
        })?;
        for i in self.catalog.resolve(expression)? {
            self.catalog.put_mapping(&i, &body)?;
        }
        ok(200, &json!({"acknowledged": true}))
    }

    pub(crate) fn get_settings(&self, expression: &str, name: Option<&str>) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            let mut s = Self::settings_of(&i);
            if let Some(n) = name {
                let key = n.strip_prefix("index.").unwrap_or(n);
                let picked = s["index"].get(key).cloned();
                s = match picked {
                    Some(v) => json!({"index": {key: v}}),
                    None => json!({}),
                };
            }
            out.insert(i.name.clone(), json!({"settings": s}));
        }
        ok(200, &Value::Object(out))
    }
}
