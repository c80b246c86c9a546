//! The HTTP API's request bodies beyond the query: `_bulk` (NDJSON actions
//! and sources), aggregations, sorts, `_msearch` and `_count`, against a
//! small index in a memory store. Any body is answered — JSON, a status
//! between 200 and 599 — never a panic; a search answers the same thing
//! twice (but for `took`); a `_bulk` answered 200 says in `errors`
//! whether one of its items carries an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::wire::Request;
use sluice_http::Api;
use sluice_io::{Device, MemoryDevice};
use sluice_store::{Store, StoreConfig};
use std::sync::{Arc, OnceLock};

fn request(method: &str, path: &str, body: &[u8]) -> Request {
    Request {
        method: method.into(),
        path: path.into(),
        params: Vec::new(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_vec(),
    }
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new(4096, 16 << 10));
        let config = StoreConfig {
            wal_blocks: 2048,
            write_buffer_bytes: 4 << 20,
            block_cache_bytes: 8 << 20,
            ..StoreConfig::default()
        };
        let store = Arc::new(Store::create(dev, &config).unwrap());
        let api = Api::open(store).unwrap();
        let mapping = br#"{"mappings":{"properties":{"n":{"type":"long"},"tag":{"type":"keyword"},
            "title":{"type":"text"},"at":{"type":"date"},"o":{"properties":{"x":{"type":"double"}}}}}}"#;
        assert_eq!(api.handle(&mut request("PUT", "/idx", mapping)).status, 200);
        let mut bulk = Vec::new();
        for i in 0..40 {
            bulk.extend_from_slice(format!("{{\"index\":{{\"_id\":\"{i}\"}}}}\n").as_bytes());
            bulk.extend_from_slice(
                format!(
                    "{{\"n\":{i},\"tag\":\"t{}\",\"title\":\"word{} other\",\"at\":\"2024-01-{:02}\",\"o\":{{\"x\":{}.5}}}}\n",
                    i % 3,
                    i % 5,
                    1 + i % 28,
                    i
                )
                .as_bytes(),
            );
        }
        let mut load = request("POST", "/idx/_bulk", &bulk);
        load.params.push(("refresh".into(), "true".into()));
        assert_eq!(api.handle(&mut load).status, 200);
        api
    })
}

fn without_took(body: &[u8]) -> Option<serde_json::Value> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if let Some(m) = v.as_object_mut() {
        m.remove("took");
    }
    if let Some(responses) = v.get_mut("responses").and_then(|r| r.as_array_mut()) {
        for r in responses {
            if let Some(m) = r.as_object_mut() {
                m.remove("took");
            }
        }
    }
    Some(v)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let api = api();
    let (method, path) = match which % 5 {
        0 => ("POST", "/idx/_search"),
        1 => ("POST", "/idx/_count"),
        2 => ("POST", "/idx/_msearch"),
        3 => ("POST", "/_search"),
        _ => ("POST", "/scratch/_bulk"),
    };
    let first = api.handle(&mut request(method, path, body));
    assert!((200..600).contains(&first.status), "status {}", first.status);
    let answer: serde_json::Value = serde_json::from_slice(&first.body)
        .unwrap_or_else(|e| panic!("{method} {path} answered {} with no JSON ({e})", first.status));
    if path.ends_with("_bulk") {
        if first.status == 200 {
            let items = answer["items"].as_array().expect("items");
            // As Elasticsearch: an item failed when it carries an error (a
            // delete of a missing document is 404 and no error).
            let failed = items.iter().any(|i| {
                let (_, r) = i.as_object().unwrap().iter().next().unwrap();
                r.get("error").is_some()
            });
            assert_eq!(answer["errors"].as_bool(), Some(failed), "{answer}");
        }
        return;
    }
    // Afresh: handling may take the request's body.
    let second = api.handle(&mut request(method, path, body));
    assert_eq!(first.status, second.status);
    assert_eq!(without_took(&first.body), without_took(&second.body), "a search answered two ways");
});
