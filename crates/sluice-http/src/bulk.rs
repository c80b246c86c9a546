//! `_bulk`: a request's items parsed, checked and written in store
//! batches as their semantics allow.

use crate::api::*;
use crate::crud::{id_text, update_op};
use crate::docs::{DocOp, Expect, Outcome};
use crate::error::{ApiError, ApiResult};
use crate::wire::{Request, Response};
use serde_json::Value;
use std::time::Instant;

struct BulkItem {
    index: String,
    action: &'static str,
    id: Option<String>,
    op: ApiResult<DocOp>,
}

/// Most operations one `_bulk` request may carry.
pub const MAX_BULK_ITEMS: usize = 1_000_000;

fn parse_bulk(body: &[u8], default_index: Option<&str>) -> ApiResult<Vec<BulkItem>> {
    let mut lines = body
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace));
    let mut items = Vec::new();
    while let Some((n, line)) = lines.next() {
        let action: Value = serde_json::from_slice(line).map_err(|e| {
            ApiError::illegal(format!("Malformed action/metadata line [{}], expected START_OBJECT or END_OBJECT but found [{e}]", n + 1))
        })?;
        let (name, meta) = action
            .as_object()
            .and_then(|m| if m.len() == 1 { m.iter().next() } else { None })
            .ok_or_else(|| ApiError::illegal(format!("Malformed action/metadata line [{}], expected a simple value for field [_index] but found an object", n + 1)))?;
        let action: &'static str = match name.as_str() {
            "index" => "index",
            "create" => "create",
            "update" => "update",
            "delete" => "delete",
            other => {
                return Err(ApiError::illegal(format!(
                    "Malformed action/metadata line [{}], expected field [create], [delete], [index] or [update] but found [{other}]",
                    n + 1
                )))
            }
        };
        let index = meta
            .get("_index")
            .and_then(Value::as_str)
            .or(default_index)
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    format!("Validation Failed: 1: index is missing for line {};", n + 1),
                )
            })?;
        let id = meta.get("_id").map(id_text).transpose()?;
        let expect = Expect {
            seq_no: meta.get("if_seq_no").and_then(Value::as_u64),
            primary_term: meta.get("if_primary_term").and_then(Value::as_u64),
        };
        let op = if action == "delete" {
            match &id {
                Some(id) => Ok(DocOp::Delete {
                    id: id.clone(),
                    expect,
                }),
                None => Err(ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: id is missing;",
                )),
            }
        } else {
            let (_, source) = lines.next().ok_or_else(|| {
                ApiError::illegal(format!("The bulk request must be terminated by a newline [\\n] (the {action} on line {} has no source)", n + 1))
            })?;
            match action {
                "update" => match (&id, serde_json::from_slice::<Value>(source)) {
                    (Some(id), Ok(body)) => update_op(id, &body, expect),
                    (None, _) => Err(ApiError::new(
                        400,
                        "action_request_validation_exception",
                        "Validation Failed: 1: id is missing;",
                    )),
                    (_, Err(e)) => Err(ApiError::not_json("the update body", e)),
                },
                _ => Ok(DocOp::Index {
                    id: id.clone(),
                    source: trim(source).to_vec(),
                    create: action == "create"
                        || meta.get("op_type").and_then(Value::as_str) == Some("create"),
                    expect,
                }),
            }
        };
        items.push(BulkItem {
            index: index.to_string(),
            action,
            id,
            op,
        });
        if items.len() > MAX_BULK_ITEMS {
            return Err(ApiError::illegal(format!(
                "a bulk request may hold at most {MAX_BULK_ITEMS} operations"
            )));
        }
    }
    if items.is_empty() {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: no requests added;",
        ));
    }
    Ok(items)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

impl Api {
    pub(crate) fn bulk(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let started = Instant::now();
        let items = parse_bulk(&req.body, idx)?;
        let mut results: Vec<(String, &'static str, ApiResult<Outcome>, String)> =
            Vec::with_capacity(items.len());
        // Consecutive operations on one index go in one store batch.
        let mut i = 0;
        while i < items.len() {
            let j = (i..items.len())
                .find(|&k| items[k].index != items[i].index)
                .unwrap_or(items.len());
            let group = &items[i..j];
            let index_name = group[0].index.clone();
            let target = if group.iter().all(|it| it.action == "delete") {
                self.catalog.get(&index_name)
            } else {
                self.index_for_write(&index_name)
            };
            match target {
                Err(e) => {
                    for it in group {
                        results.push((
                            index_name.clone(),
                            it.action,
                            Err(e.clone()),
                            it.id.clone().unwrap_or_default(),
                        ));
                    }
                }
                Ok(index) => {
                    let mut ops = Vec::new();
                    let mut pre: Vec<Option<ApiError>> = Vec::new();
                    for it in group {
                        match &it.op {
                            Ok(op) => {
                                ops.push(op.clone());
                                pre.push(None);
                            }
                            Err(e) => pre.push(Some(e.clone())),
                        }
                    }
                    let mut outcomes = self.docs.apply(&index, ops).into_iter();
                    for (it, p) in group.iter().zip(pre) {
                        let r = match p {
                            Some(e) => Err(e),
                            None => outcomes
                                .next()
                                .unwrap_or_else(|| Err(ApiError::store("no outcome"))),
                        };
                        results.push((
                            index.name.clone(),
                            it.action,
                            r,
                            it.id.clone().unwrap_or_default(),
                        ));
                    }
                }
            }
            i = j;
        }
        let errors = results.iter().any(|r| r.2.is_err());
        // Written directly: a bulk answer has one item per operation, and
        // building each as a JSON tree cost more than the writes.
        let mut out = Vec::with_capacity(64 + 200 * results.len());
        out.extend_from_slice(
            format!(
                "{{\"took\":{},\"errors\":{errors},\"items\":[",
                started.elapsed().as_millis()
            )
            .as_bytes(),
        );
        let mut index_json = (String::new(), String::new());
        for (n, (index, action, r, id)) in results.into_iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            if index_json.0 != index {
                index_json = (index.clone(), json_escape(&index));
            }
            out.extend_from_slice(b"{\"");
            out.extend_from_slice(action.as_bytes());
            out.extend_from_slice(b"\":{\"_index\":");
            out.extend_from_slice(index_json.1.as_bytes());
            out.extend_from_slice(b",\"_id\":");
            match r {
                Ok(o) => {
                    write_json_string(&mut out, &o.id);
                    out.extend_from_slice(
                        format!(
                            ",\"_version\":{},\"result\":\"{}\",\"_shards\":{{\"total\":1,\"successful\":1,\"failed\":0}},\"_seq_no\":{},\"_primary_term\":1,\"status\":{}}}}}",
                            o.version, o.result, o.seq_no, o.status
                        )
                        .as_bytes(),
                    );
                }
                Err(e) => {
                    write_json_string(&mut out, &id);
                    out.extend_from_slice(
                        format!(",\"status\":{},\"error\":{}}}}}", e.status, e.cause()).as_bytes(),
                    );
                }
            }
        }
        out.extend_from_slice(b"]}");
        Ok(Response::json(200, out))
    }
}
