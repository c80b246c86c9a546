//! Errors in Elasticsearch's shape: `{"error":{"root_cause":[…],"type",
//! "reason",…},"status":N}`, with the types and statuses it uses.

use serde_json::{json, Map, Value};

/// An API error: the HTTP status, Elasticsearch's exception type and a
/// reason that says what was wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Elasticsearch's exception name (`index_not_found_exception`).
    pub kind: &'static str,
    /// What was wrong, and what to do where that helps.
    pub reason: String,
    /// More members of the error object (`index`, `resource.id`, ...).
    pub extra: Vec<(&'static str, Value)>,
    /// What `root_cause` lists when it is not this error itself.
    pub root_cause: Option<Value>,
    /// Elasticsearch raises it on each shard of a search, so it reaches the
    /// client wrapped in a `search_phase_execution_exception`.
    pub on_shards: bool,
}

/// The node id failures name (Sluice is one node).
pub const NODE_ID: &str = "sluice-node-0";

/// Results of the API.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error of `kind` with `status`.
    pub fn new(status: u16, kind: &'static str, reason: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            reason: reason.into(),
            extra: Vec::new(),
            root_cause: None,
            on_shards: false,
        }
    }

    /// Marks an error Elasticsearch raises on each shard of a search.
    pub fn on_shards(mut self) -> ApiError {
        self.on_shards = true;
        self
    }

    /// A shard-level error as a search answers it: `all shards failed`,
    /// one grouped failure per index, this error as cause and root cause.
    pub fn as_search_failure(self, indices: &[&str]) -> ApiError {
        if !self.on_shards {
            return self;
        }
        let cause = self.cause();
        let mut caused_by = cause.clone();
        if let Value::Object(m) = &mut caused_by {
            m.insert("caused_by".into(), cause.clone());
        }
        let failed: Vec<Value> = indices
            .iter()
            .map(|i| json!({"shard": 0, "index": i, "node": NODE_ID, "reason": cause}))
            .collect();
        ApiError::new(
            self.status,
            "search_phase_execution_exception",
            "all shards failed",
        )
        .with("phase", json!("query"))
        .with("grouped", json!(true))
        .with("failed_shards", Value::Array(failed))
        .with("caused_by", caused_by)
        .rooted_in(cause)
    }

    /// A request the API cannot parse (400 `parsing_exception`).
    pub fn parsing(reason: impl Into<String>) -> ApiError {
        ApiError::new(400, "parsing_exception", reason)
    }

    /// A bad argument (400 `illegal_argument_exception`).
    pub fn illegal(reason: impl Into<String>) -> ApiError {
        ApiError::new(400, "illegal_argument_exception", reason)
    }

    /// A body that is not JSON (400 `x_content_parse_exception`... as
    /// Elasticsearch names a body it cannot read).
    pub fn not_json(what: &str, e: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            400,
            "x_content_parse_exception",
            format!("{what} is not JSON: {e}"),
        )
    }

    /// No such index.
    pub fn no_index(index: &str) -> ApiError {
        ApiError::new(
            404,
            "index_not_found_exception",
            format!("no such index [{index}]"),
        )
        .with("index", json!(index))
        .with("resource.type", json!("index_or_alias"))
        .with("resource.id", json!(index))
        .with("index_uuid", json!("_na_"))
    }

    /// The store failed underneath.
    pub fn store(e: impl std::fmt::Display) -> ApiError {
        ApiError::new(500, "sluice_store_exception", e.to_string())
    }

    /// A write to `index` the store did not take. Refused for room, it is
    /// what Elasticsearch answers past its flood-stage disk watermark
    /// (429 `cluster_block_exception`, read-only-allow-delete: clients
    /// and bulk helpers back off and retry, deletes still go through);
    /// a flush failing, 503; anything else, 500.
    pub fn write_refused(index: &str, e: &sluice_store::StoreError) -> ApiError {
        use sluice_store::{StoreError, WritesRefused};
        match e {
            StoreError::WritesRefused(WritesRefused::SpaceLow { .. }) | StoreError::DeviceFull { .. } => {
                ApiError::new(
                    429,
                    "cluster_block_exception",
                    format!(
                        "index [{index}] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage \
                         watermark, index has read-only-allow-delete block]; {e}"
                    ),
                )
            }
            StoreError::WritesRefused(WritesRefused::FlushFailing { .. }) => {
                ApiError::new(503, "sluice_store_exception", e.to_string())
            }
            _ => ApiError::store(e),
        }
    }

    /// Adds a member to the error object.
    pub fn with(mut self, name: &'static str, value: Value) -> ApiError {
        self.extra.push((name, value));
        self
    }

    /// Names the error at the root of this one.
    pub fn rooted_in(mut self, cause: Value) -> ApiError {
        self.root_cause = Some(cause);
        self
    }

    /// The error object (what `root_cause` lists and bulk items carry).
    pub fn cause(&self) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), json!(self.kind));
        m.insert("reason".into(), json!(self.reason));
        for (k, v) in &self.extra {
            m.insert((*k).into(), v.clone());
        }
        Value::Object(m)
    }

    /// The whole response body.
    pub fn body(&self) -> Value {
        let cause = self.cause();
        let mut outer = cause.clone();
        if let Value::Object(m) = &mut outer {
            let root = self.root_cause.clone().unwrap_or(cause);
            m.insert("root_cause".into(), json!([root]));
        }
        json!({ "error": outer, "status": self.status })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.kind, self.status, self.reason)
    }
}

impl std::error::Error for ApiError {}
