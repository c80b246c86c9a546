//! Documents one at a time: index, create, update, delete, get, `_mget`,
//! with `_source` filtering.

use crate::api::*;
use crate::catalog::Index;
use crate::docs::{self, DocOp, Expect, Outcome};
use crate::error::{ApiError, ApiResult};
use crate::wire::{Request, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// `_source` as a request asks for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourceFilter {
    pub(crate) off: bool,
    pub(crate) includes: Vec<String>,
    pub(crate) excludes: Vec<String>,
}

impl SourceFilter {
    pub(crate) fn from_value(v: Option<&Value>) -> ApiResult<SourceFilter> {
        let list = |v: Option<&Value>| strings(v).unwrap_or_default();
        Ok(match v {
            None | Some(Value::Bool(true)) => SourceFilter::default(),
            Some(Value::Bool(false)) => SourceFilter {
                off: true,
                ..Default::default()
            },
            Some(Value::Object(m)) => SourceFilter {
                off: false,
                includes: list(m.get("includes").or_else(|| m.get("include"))),
                excludes: list(m.get("excludes").or_else(|| m.get("exclude"))),
            },
            Some(other @ (Value::String(_) | Value::Array(_))) => SourceFilter {
                off: false,
                includes: list(Some(other)),
                excludes: Vec::new(),
            },
            Some(other) => {
                return Err(ApiError::parsing(format!(
                    "[_source] does not take [{other}]"
                )))
            }
        })
    }

    pub(crate) fn from_params(req: &Request, base: SourceFilter) -> SourceFilter {
        let split = |s: &str| {
            s.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let mut f = base;
        match req.param("_source") {
            Some("false") => f.off = true,
            Some("true") | None => {}
            Some(list) => f.includes = split(list),
        }
        if let Some(i) = req.param("_source_includes") {
            f.includes = split(i);
        }
        if let Some(e) = req.param("_source_excludes") {
            f.excludes = split(e);
        }
        f
    }

    pub(crate) fn to_value(&self) -> Value {
        if self.off {
            return Value::Bool(false);
        }
        json!({"includes": self.includes, "excludes": self.excludes})
    }

    /// The source as the request wants it: none, the stored bytes as they
    /// are (no copy), or filtered.
    pub(crate) fn apply<'a>(
        &self,
        source: &'a [u8],
    ) -> ApiResult<Option<std::borrow::Cow<'a, [u8]>>> {
        if self.off {
            return Ok(None);
        }
        if self.includes.is_empty() && self.excludes.is_empty() {
            return Ok(Some(std::borrow::Cow::Borrowed(source)));
        }
        docs::filter_source(source, &self.includes, &self.excludes)
            .map(|v| Some(std::borrow::Cow::Owned(v)))
    }
}

pub(crate) fn expect_of(req: &Request) -> ApiResult<Expect> {
    let num = |name: &str| -> ApiResult<Option<u64>> {
        req.param(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::illegal(format!("[{name}] must be a number, got [{v}]")))
            })
            .transpose()
    };
    Ok(Expect {
        seq_no: num("if_seq_no")?,
        primary_term: num("if_primary_term")?,
    })
}

pub(crate) fn outcome_body(index: &str, o: &Outcome) -> Value {
    json!({
        "_index": index,
        "_id": o.id,
        "_version": o.version,
        "result": o.result,
        "_shards": write_shards(),
        "_seq_no": o.seq_no,
        "_primary_term": 1,
    })
}

pub(crate) fn id_text(v: &Value) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(ApiError::parsing(format!(
            "an id must be a string, got [{v}]"
        ))),
    }
}

pub(crate) fn update_op(id: &str, body: &Value, expect: Expect) -> ApiResult<DocOp> {
    if body.get("script").is_some() {
        return Err(ApiError::illegal(
            "scripted updates are not supported by Sluice; send a partial document as [doc]",
        ));
    }
    if let Some(m) = body.as_object() {
        for k in m.keys() {
            if !matches!(
                k.as_str(),
                "doc" | "upsert" | "doc_as_upsert" | "detect_noop" | "_source" | "scripted_upsert"
            ) {
                return Err(ApiError::parsing(format!(
                    "[UpdateRequest] unknown field [{k}]"
                )));
            }
        }
    }
    let doc = body.get("doc").cloned();
    let upsert = body.get("upsert").cloned();
    if doc.is_none() && upsert.is_none() {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: script or doc is missing;",
        ));
    }
    Ok(DocOp::Update {
        id: id.to_string(),
        doc,
        upsert,
        doc_as_upsert: body
            .get("doc_as_upsert")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        expect,
    })
}

impl Api {
    /// The index for a write, created on first use as Elasticsearch's
    /// `action.auto_create_index` does.
    pub(crate) fn index_for_write(&self, name: &str) -> ApiResult<Arc<Index>> {
        match self.catalog.get(name) {
            Ok(i) => Ok(i),
            Err(_) => match self.catalog.create(name, &json!({})) {
                Ok(i) => Ok(i),
                Err(e) if e.kind == "resource_already_exists_exception" => self.catalog.get(name),
                Err(e) => Err(e),
            },
        }
    }

    pub(crate) fn one(&self, index: &Index, op: DocOp) -> ApiResult<Outcome> {
        self.docs
            .apply(index, vec![op])
            .pop()
            .unwrap_or_else(|| Err(ApiError::store("no outcome")))
    }

    pub(crate) fn index_doc(
        &self,
        req: &mut Request,
        idx: &str,
        id: Option<&str>,
        create: bool,
    ) -> ApiResult<Response> {
        let index = self.index_for_write(idx)?;
        let expect = expect_of(req)?;
        let op = DocOp::Index {
            id: id.map(str::to_string),
            // Taken, not copied: a document may be 100 MB.
            source: std::mem::take(&mut req.body),
            create,
            expect,
        };
        let o = self.one(&index, op)?;
        ok(o.status, &outcome_body(&index.name, &o))
    }

    pub(crate) fn delete_doc(&self, req: &Request, idx: &str, id: &str) -> ApiResult<Response> {
        let index = self.catalog.get(idx)?;
        let o = self.one(
            &index,
            DocOp::Delete {
                id: id.into(),
                expect: expect_of(req)?,
            },
        )?;
        ok(o.status, &outcome_body(&index.name, &o))
    }

    pub(crate) fn update_doc(&self, req: &Request, idx: &str, id: &str) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: script or doc is missing;",
            )
        })?;
        let index = self.index_for_write(idx)?;
        let op = update_op(id, &body, expect_of(req)?)?;
        let o = self.one(&index, op)?;
        let mut answer = outcome_body(&index.name, &o);
        // Asked for, the document as the update left it.
        let asked = body.get("_source").is_some()
            || ["_source", "_source_includes", "_source_excludes"]
                .iter()
                .any(|p| req.param(p).is_some());
        if let (true, Some(source)) = (asked, &o.source) {
            let filter =
                SourceFilter::from_params(req, SourceFilter::from_value(body.get("_source"))?);
            if let Some(kept) = filter.apply(source)? {
                let kept: Value = serde_json::from_slice(&kept)
                    .map_err(|e| ApiError::store(format!("an updated source: {e}")))?;
                answer["get"] = json!({"_seq_no": o.seq_no, "_primary_term": 1, "found": true, "_source": kept});
            }
        }
        ok(o.status, &answer)
    }

    pub(crate) fn get_doc(
        &self,
        req: &Request,
        idx: &str,
        id: &str,
        source_only: bool,
    ) -> ApiResult<Response> {
        let index = self.catalog.get(idx)?;
        let filter = SourceFilter::from_params(req, SourceFilter::default());
        let Some(doc) = self.docs.get(&index, id, None)? else {
            if source_only {
                return Err(ApiError::new(
                    404,
                    "resource_not_found_exception",
                    format!("Document not found [{}]/[{id}]", index.name),
                ));
            }
            return ok(
                404,
                &json!({"_index": index.name, "_id": id, "found": false}),
            );
        };
        if source_only {
            // The whole source goes out as read (not copied: it may be
            // 100 MB); a filtered one is a new, smaller document.
            let filtered = filter.apply(&doc.source)?.map(|c| match c {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(kept) => Some(kept),
            });
            let bytes = match filtered {
                None => b"{}".to_vec(),
                Some(None) => doc.source,
                Some(Some(kept)) => kept,
            };
            return Ok(Response::json(200, bytes));
        }
        let mut head = format!(
            "{{\"_index\":{},\"_id\":{},\"_version\":{},\"_seq_no\":{},\"_primary_term\":1,\"found\":true",
            json_escape(&index.name), json_escape(id), doc.version, doc.seq_no
        )
        .into_bytes();
        let filtered = filter.apply(&doc.source)?.map(|c| match c {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(kept) => Some(kept),
        });
        let source = match filtered {
            None => {
                head.push(b'}');
                return Ok(Response::json(200, head));
            }
            Some(None) => doc.source,
            Some(Some(kept)) => kept,
        };
        // The answer is built around the source where it lies (it may be
        // 100 MB): the head goes in front of it, not the source after a
        // head.
        head.extend_from_slice(b",\"_source\":");
        let mut out = source;
        out.reserve_exact(head.len() + 1);
        out.splice(0..0, head);
        out.push(b'}');
        Ok(Response::json(200, out))
    }

    pub(crate) fn mget(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: no documents to get;",
            )
        })?;
        let filter = SourceFilter::from_params(req, SourceFilter::default());
        let mut wanted: Vec<(String, String, SourceFilter)> = Vec::new();
        if let Some(ids) = body.get("ids").and_then(Value::as_array) {
            let index = idx.ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: index is missing for doc 0;",
                )
            })?;
            for id in ids {
                wanted.push((index.to_string(), id_text(id)?, filter.clone()));
            }
        } else if let Some(docs) = body.get("docs").and_then(Value::as_array) {
            for (n, d) in docs.iter().enumerate() {
                let index = d
                    .get("_index")
                    .and_then(Value::as_str)
                    .or(idx)
                    .ok_or_else(|| {
                        ApiError::new(
                            400,
                            "action_request_validation_exception",
                            format!("Validation Failed: 1: index is missing for doc {n};"),
                        )
                    })?;
                let id = d.get("_id").map(id_text).transpose()?.ok_or_else(|| {
                    ApiError::new(
                        400,
                        "action_request_validation_exception",
                        format!("Validation Failed: 1: id is missing for doc {n};"),
                    )
                })?;
                let f = match d.get("_source") {
                    Some(s) => SourceFilter::from_value(Some(s))?,
                    None => filter.clone(),
                };
                wanted.push((index.to_string(), id, f));
            }
        } else {
            return Err(ApiError::parsing(
                "unknown parameter: [mget] needs [docs] or [ids]",
            ));
        }
        let snapshot = self.catalog.store().snapshot();
        let mut out = b"{\"docs\":[".to_vec();
        for (n, (index_name, id, f)) in wanted.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let index = match self.catalog.get(index_name) {
                Ok(i) => i,
                Err(e) => {
                    let v = json!({"_index": index_name, "_id": id, "error": e.body()["error"]});
                    out.extend_from_slice(v.to_string().as_bytes());
                    continue;
                }
            };
            match self.docs.get(&index, id, Some(&snapshot))? {
                None => out.extend_from_slice(
                    json!({"_index": index.name, "_id": id, "found": false})
                        .to_string()
                        .as_bytes(),
                ),
                Some(doc) => {
                    out.extend_from_slice(format!(
                        "{{\"_index\":{},\"_id\":{},\"_version\":{},\"_seq_no\":{},\"_primary_term\":1,\"found\":true",
                        json_escape(&index.name), json_escape(id), doc.version, doc.seq_no
                    ).as_bytes());
                    if let Some(src) = f.apply(&doc.source)? {
                        out.extend_from_slice(b",\"_source\":");
                        out.extend_from_slice(&src);
                    }
                    out.push(b'}');
                }
            }
        }
        out.extend_from_slice(b"]}");
        Ok(Response::json(200, out))
    }
}
