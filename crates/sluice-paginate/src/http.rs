//! The HTTP client to the search engine: basic auth or an API key, TLS with a
//! custom CA, timeouts, and retries with backoff on 429, 5xx and dropped
//! connections. A plain `http://` source is read through
//! [`crate::plain`]'s connections, an `https://` one through ureq.

use crate::error::{Error, Result};
use base64::Engine as _;
use rand::Rng;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Largest response body accepted: a page of big documents fits many times.
pub const MAX_RESPONSE_BYTES: u64 = 1 << 30;
/// Most retries of one request.
pub const MAX_RETRIES: u32 = 32;

/// How requests authenticate.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// No credentials.
    #[default]
    None,
    /// HTTP basic authentication.
    Basic {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// The `id:key` pair or its base64 form, sent as `Authorization: ApiKey …`.
    ApiKey(String),
}

/// Where the source is and how to talk to it.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `http://host:port` or `https://host:port`, optionally with a path prefix.
    pub url: String,
    /// Credentials.
    pub auth: Auth,
    /// PEM file of the CA that signed the source's certificate.
    pub ca_cert: Option<PathBuf>,
    /// Time to connect.
    pub connect_timeout_ms: u64,
    /// Whole request, answer included.
    pub request_timeout_ms: u64,
    /// Retries of a request that failed in a way worth retrying (429, 5xx, a dropped connection).
    pub max_retries: u32,
    /// First retry's backoff; it doubles per retry.
    pub retry_base_ms: u64,
    /// Longest backoff.
    pub retry_max_ms: u64,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            url: "http://127.0.0.1:9200".into(),
            auth: Auth::None,
            ca_cert: None,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 120_000,
            max_retries: 6,
            retry_base_ms: 100,
            retry_max_ms: 5_000,
        }
    }
}

/// An answer of the source.
#[derive(Debug)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The body (in a recycled buffer).
    pub body: crate::buffers::Body,
    /// The `X-Elastic-Product` header (Elasticsearch 7.14+ sends it on
    /// every answer).
    pub elastic_product: Option<String>,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `type: reason` of an OpenSearch/Elasticsearch error body, or its start.
    pub fn error_summary(&self) -> String {
        error_summary(&self.body)
    }
}

/// An HTTP client of one source (cheap to clone; connections are pooled).
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    /// For a plain `http://` source: connections read without a copy.
    plain: Option<Arc<crate::plain::PlainPool>>,
    base: String,
    authorization: Option<String>,
    options: HttpOptions,
    /// Answers the source refused or failed to build (see
    /// [`Client::send_or_refused`]), shared by the client's clones.
    refusals: Arc<std::sync::atomic::AtomicU64>,
}

impl Client {
    /// A client for `options`; refuses values out of range and an unreadable CA file.
    pub fn new(options: &HttpOptions) -> Result<Client> {
        if options.max_retries > MAX_RETRIES {
            return Err(Error::Config(format!(
                "--retries {} is more than {MAX_RETRIES}",
                options.max_retries
            )));
        }
        let (base, url_auth) = split_credentials(&options.url)?;
        let auth = match (&options.auth, url_auth) {
            (Auth::None, Some(a)) => a,
            (a, _) => a.clone(),
        };
        let authorization = match auth {
            Auth::None => None,
            Auth::Basic { user, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )),
            Auth::ApiKey(key) => Some(format!("ApiKey {}", api_key_base64(&key))),
        };
        // Timeouts per read and write, set once on each connection: an
        // overall deadline makes the client set the socket's timeout again
        // before every read of a multi-megabyte answer. The whole request's
        // deadline is checked between reads instead (`send_once`).
        let request_timeout = Duration::from_millis(options.request_timeout_ms);
        let mut builder = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_millis(options.connect_timeout_ms))
            .timeout_read(request_timeout)
            .timeout_write(request_timeout)
            .max_idle_connections_per_host(64);
        if let Some(ca) = &options.ca_cert {
            builder = builder.tls_config(Arc::new(tls_config(ca)?));
        }
        let plain = crate::plain::PlainPool::for_url(
            base.trim_end_matches('/'),
            Duration::from_millis(options.connect_timeout_ms),
            request_timeout,
        )
        .map(Arc::new);
        Ok(Client {
            agent: builder.build(),
            plain,
            base: base.trim_end_matches('/').to_string(),
            authorization,
            options: options.clone(),
            refusals: Arc::default(),
        })
    }

    /// The source URL without credentials, for messages and the export header.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends a request, retrying on 429, 5xx and transport errors. Any
    /// other status comes back as a `Response` for the caller to judge.
    pub fn send(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Response> {
        let url = format!("{}{}", self.base, path);
        let mut attempt = 0u32;
        loop {
            let outcome = self.send_once(method, &url, body);
            let retry_reason = match &outcome {
                Ok(r) if r.status == 429 || r.status >= 500 => {
                    format!("HTTP {} ({})", r.status, r.error_summary())
                }
                Ok(_) => return outcome.map_err(Error::Source),
                Err(e) => e.clone(),
            };
            if attempt >= self.options.max_retries {
                return match outcome {
                    Ok(_) => Err(Error::Source(format!(
                        "{method} {url} failed after {} attempts: {retry_reason}",
                        attempt + 1
                    ))),
                    Err(_) => Err(Error::Source(format!(
                        "cannot reach the source at {}: {retry_reason} (after {} attempts); check that it runs and that --source is right",
                        self.base,
                        attempt + 1
                    ))),
                };
            }
            let delay = backoff_ms(&self.options, attempt);
            log::warn!(
                "{method} {url}: {retry_reason}; retry {} in {delay} ms",
                attempt + 1
            );
            std::thread::sleep(Duration::from_millis(delay));
            attempt += 1;
        }
    }

    /// Sends a request once. `Ok(Err(why))` when the source could not
    /// build the answer (429, 5xx, a dropped connection or a timeout):
    /// the caller may ask for less and try again after
    /// [`Client::backoff`]; `Ok(Ok(response))` otherwise.
    pub fn send_or_refused(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> std::result::Result<Response, String> {
        let url = format!("{}{}", self.base, path);
        let outcome = match self.send_once(method, &url, body) {
            Ok(r) if r.status == 429 || r.status >= 500 => {
                Err(format!("HTTP {} ({})", r.status, r.error_summary()))
            }
            other => other,
        };
        if outcome.is_err() {
            self.refusals
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        outcome
    }

    /// Answers [`Client::send_or_refused`] found refused or failed so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The wait before retry `attempt` (0-based), with jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        Duration::from_millis(backoff_ms(&self.options, attempt))
    }

    /// Retries a request may take.
    pub fn max_retries(&self) -> u32 {
        self.options.max_retries
    }

    fn send_once(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
    ) -> std::result::Result<Response, String> {
        let deadline =
            std::time::Instant::now() + Duration::from_millis(self.options.request_timeout_ms);
        if let Some(plain) = &self.plain {
            let path = url.strip_prefix(self.base.as_str()).unwrap_or(url);
            let answer = plain.send(&crate::plain::PlainRequest {
                method,
                path,
                body: body.map(|b| (b, content_type(url))),
                authorization: self.authorization.as_deref(),
                deadline,
                max_body_bytes: MAX_RESPONSE_BYTES as usize,
            })?;
            return Ok(Response {
                status: answer.status,
                body: answer.body,
                elastic_product: answer.elastic_product,
            });
        }
        let mut request = self.agent.request(method, url);
        if let Some(auth) = &self.authorization {
            request = request.set("Authorization", auth);
        }
        let result = match body {
            Some(b) => request.set("Content-Type", content_type(url)).send_bytes(b),
            None => request.call(),
        };
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => return Err(t.to_string()),
        };
        let status = response.status();
        let elastic_product = response.header("X-Elastic-Product").map(String::from);
        // Sized from Content-Length up front, read into a recycled buffer:
        // search answers are megabytes.
        let expected = response
            .header("Content-Length")
            .and_then(|l| l.parse::<usize>().ok())
            .unwrap_or(0);
        let body = crate::buffers::Body::read_from(
            &mut response.into_reader(),
            expected,
            MAX_RESPONSE_BYTES as usize,
            Some(deadline),
        )
        .map_err(|e| format!("reading the answer: {e}"))?;
        Ok(Response {
            status,
            body,
            elastic_product,
        })
    }
}

fn content_type(url: &str) -> &'static str {
    if url.contains("/_bulk") {
        "application/x-ndjson"
    } else {
        "application/json"
    }
}

fn backoff_ms(options: &HttpOptions, attempt: u32) -> u64 {
    let exp = options
        .retry_base_ms
        .saturating_mul(1u64 << attempt.min(20))
        .min(options.retry_max_ms);
    // Full jitter on the upper half: slices retrying together spread out.
    exp / 2 + rand::thread_rng().gen_range(0..=exp / 2)
}

/// Takes `user:password@` out of a URL.
fn split_credentials(url: &str) -> Result<(String, Option<Auth>)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::Config(format!(
            "source URL {url:?} has no scheme; write it as http://host:port or https://host:port"
        )));
    };
    if scheme != "http" && scheme != "https" {
        return Err(Error::Config(format!(
            "source URL {url:?}: scheme {scheme:?} is not http or https"
        )));
    }
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        None => Ok((url.to_string(), None)),
        Some((userinfo, host)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            Ok((
                format!("{scheme}://{host}{path}"),
                Some(Auth::Basic {
                    user: user.to_string(),
                    password: password.to_string(),
                }),
            ))
        }
    }
}

fn api_key_base64(key: &str) -> String {
    if key.contains(':') {
        base64::engine::general_purpose::STANDARD.encode(key)
    } else {
        key.to_string()
    }
}

fn tls_config(ca_path: &std::path::Path) -> Result<rustls::ClientConfig> {
    let pem = std::fs::read(ca_path).map_err(|e| {
        Error::Config(format!(
            "cannot read CA certificate {}: {e}",
            ca_path.display()
        ))
    })?;
    let mut roots = rustls::RootCertStore::empty();
    let mut count = 0;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| {
            Error::Config(format!(
                "CA file {} is not valid PEM: {e}",
                ca_path.display()
            ))
        })?;
        roots.add(cert).map_err(|e| {
            Error::Config(format!(
                "CA file {} holds a certificate rustls refuses: {e}",
                ca_path.display()
            ))
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(Error::Config(format!(
            "CA file {} holds no PEM certificate",
            ca_path.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// `type: reason` of an error body, else its first 300 bytes.
pub fn error_summary(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let e = &v["error"];
        if let Some(text) = e.as_str() {
            return text.to_string();
        }
        let line = |x: &serde_json::Value| {
            format!(
                "{}: {}",
                x["type"].as_str().unwrap_or_default(),
                x["reason"].as_str().unwrap_or_default()
            )
        };
        if e.is_object() {
            let mut summary = line(e);
            // The root cause says more than a wrapper such as "all shards failed".
            if let Some(root) = e["root_cause"].as_array().and_then(|r| r.first()) {
                let root = line(root);
                if root != summary {
                    summary = format!("{summary} ({root})");
                }
            }
            return summary;
        }
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    if text.trim().is_empty() {
        "empty answer".into()
    } else {
        text.trim().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_taken_out_of_the_url() {
        let (base, auth) = split_credentials("https://ann:s3cret@db:9200/prefix").unwrap();
        assert_eq!(base, "https://db:9200/prefix");
        assert!(
            matches!(auth, Some(Auth::Basic { user, password }) if user == "ann" && password == "s3cret")
        );
        assert!(split_credentials("db:9200").is_err());
        assert!(split_credentials("ftp://db").is_err());
    }

    #[test]
    fn error_bodies_are_summarised() {
        let body = br#"{"error":{"root_cause":[{"type":"index_not_found_exception","reason":"no such index [x]"}],"type":"index_not_found_exception","reason":"no such index [x]"},"status":404}"#;
        assert_eq!(
            error_summary(body),
            "index_not_found_exception: no such index [x]"
        );
        assert_eq!(error_summary(b"Unauthorized"), "Unauthorized");
        let wrapped = br#"{"error":{"root_cause":[{"type":"query_shard_exception","reason":"No mapping found for [_shard_doc]"}],"type":"search_phase_execution_exception","reason":"all shards failed"}}"#;
        assert_eq!(
            error_summary(wrapped),
            "search_phase_execution_exception: all shards failed (query_shard_exception: No mapping found for [_shard_doc])"
        );
    }

    /// A server on a free port that answers each connection's first
    /// request with a 200 whose body trickles out a byte per `gap`, or
    /// (`gap` None) never comes.
    fn trickling_server(gap: Option<Duration>) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request);
                    let body = b"{\"acknowledged\":true}";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes());
                    let Some(gap) = gap else {
                        std::thread::sleep(Duration::from_secs(30));
                        return;
                    };
                    for b in body {
                        std::thread::sleep(gap);
                        if stream.write_all(&[*b]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    fn client_of(url: String, request_timeout_ms: u64) -> Client {
        Client::new(&HttpOptions {
            url,
            request_timeout_ms,
            max_retries: 0,
            ..HttpOptions::default()
        })
        .unwrap()
    }

    #[test]
    fn the_request_timeout_bounds_the_whole_answer_not_each_read() {
        // Bytes keep coming, each well within the timeout, but the whole
        // answer takes longer than it.
        let slow = client_of(trickling_server(Some(Duration::from_millis(40))), 300);
        let started = std::time::Instant::now();
        let err = slow.send("GET", "/", None).err().unwrap().to_string();
        assert!(err.contains("longer than the request timeout"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // A server that stops sending is cut off too.
        let stalled = client_of(trickling_server(None), 300);
        let started = std::time::Instant::now();
        assert!(stalled.send("GET", "/", None).is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
        // Within the timeout the answer comes whole.
        let fine = client_of(trickling_server(Some(Duration::from_millis(1))), 5_000);
        let answer = fine.send("GET", "/", None).unwrap();
        assert_eq!(&answer.body[..], b"{\"acknowledged\":true}");
    }

    #[test]
    fn backoff_grows_and_stays_under_the_cap() {
        let o = HttpOptions::default();
        for attempt in 0..40 {
            let d = backoff_ms(&o, attempt);
            assert!(d <= o.retry_max_ms);
        }
        assert!(backoff_ms(&o, 0) <= o.retry_base_ms);
    }

    #[test]
    fn unreachable_source_says_so() {
        let options = HttpOptions {
            url: "http://127.0.0.1:1".into(),
            max_retries: 1,
            retry_base_ms: 1,
            ..HttpOptions::default()
        };
        let err = Client::new(&options)
            .unwrap()
            .send("GET", "/", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot reach the source at http://127.0.0.1:1"),
            "{err}"
        );
        assert!(err.contains("2 attempts"), "{err}");
    }
}
