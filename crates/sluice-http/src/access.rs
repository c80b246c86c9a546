//! Who may come in: credentials (basic auth, API keys), protected mode
//! without them, and the connection limit's refusal.

use crate::config::HttpConfig;
use crate::error::ApiError;
use crate::wire::{self, Response};
use std::io::BufWriter;
use std::net::{SocketAddr, TcpStream};

/// Answers a connection over the limit with 429 and closes it.
pub(crate) fn refuse(stream: TcpStream, limit: usize) {
    let e = ApiError::new(429, "es_rejected_execution_exception", format!("rejected: the server holds its limit of {limit} HTTP connections (--http-max-connections)"));
    // A fresh socket's send buffer takes these few hundred bytes at once.
    let _ = stream.set_nonblocking(true);
    let mut out = BufWriter::new(&stream);
    let _ = wire::write_response(
        &mut out,
        Response::json(429, e.body().to_string().into_bytes()),
        false,
        false,
        false,
    );
}

/// Most body bytes read from a request that is not authorized, so that
/// the connection can answer it and go on; a larger body is not read at
/// all (the answer closes the connection).
pub const MAX_UNAUTHORIZED_BODY_BYTES: usize = 64 << 10;

fn authorized(req: &wire::Request, config: &HttpConfig) -> bool {
    let Some(value) = req.header("authorization") else {
        return false;
    };
    let (scheme, encoded) = value.split_once(' ').unwrap_or((value, ""));
    use base64::Engine;
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let Some(colon) = decoded.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, secret) = (&decoded[..colon], &decoded[colon + 1..]);
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    let known = if scheme.eq_ignore_ascii_case("basic") {
        &config.users
    } else if scheme.eq_ignore_ascii_case("apikey") {
        &config.api_keys
    } else {
        return false;
    };
    known.check(name, secret)
}

/// The answer to a request that may not run, if it may not: one without
/// the credentials the server asks for, or one from a client beyond
/// loopback when the server has none to ask for (protected mode).
pub(crate) fn refusal(
    request: &wire::Request,
    peer: &SocketAddr,
    config: &HttpConfig,
) -> Option<Response> {
    if config.users.is_empty() && config.api_keys.is_empty() {
        if !config.protected_mode || config.clients_verified || sluice_auth::is_local_peer(peer) {
            return None;
        }
        let e = ApiError::new(
            403,
            "security_exception",
            format!(
                "the HTTP API has no users, so it serves only clients on 127.0.0.1 and ::1 (protected mode), and this request [{}] came from {}: give the server --http-users-file FILE or --http-api-keys-file FILE and send credentials, or start it with --protected-mode no on a network you trust",
                request.path,
                peer.ip()
            ),
        );
        return Some(Response::json(403, e.body().to_string().into_bytes()));
    }
    (!authorized(request, config)).then(|| unauthorized(request))
}

fn unauthorized(request: &wire::Request) -> Response {
    let challenge = "Basic realm=\"security\" charset=\"UTF-8\"";
    let e = ApiError::new(
        401,
        "security_exception",
        format!(
            "missing authentication credentials for REST request [{}]",
            request.path
        ),
    )
    .with(
        "header",
        serde_json::json!({ "WWW-Authenticate": challenge }),
    );
    let mut r = Response::json(401, e.body().to_string().into_bytes());
    r.headers.push(("WWW-Authenticate", challenge.into()));
    r
}
