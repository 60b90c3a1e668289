//! What a web page in the operator's browser cannot make the server do.
//!
//! Three checks run on every request before any handler:
//!
//! - **Host** (DNS rebinding): a page whose name was re-pointed at this server sends its own
//!   name as `Host`. Allowed: no `Host` (not a browser), an IP literal (cannot be rebound),
//!   `localhost` and `*.localhost`, the host of `organism.listen`, and the names listed in
//!   `organism.allowed_hosts`. Anything else gets 421 `host_not_allowed`.
//! - **Origin** (cross-site requests and WebSocket hijacking): a WebSocket upgrade, or any
//!   request that is not `GET`/`HEAD`/`OPTIONS`, carrying an `Origin` that is neither this
//!   server's own (`scheme://` + the request's `Host`) nor listed in
//!   `organism.allowed_origins` gets 403 `cross_origin`. No `Origin` (not a browser) passes.
//! - **Content type** (CORS "simple requests"): a request with a method that may change state
//!   carries no body, or a body typed `application/json` (or `application/xml`/`text/xml`
//!   for the external agents' callback). Form and `text/plain` bodies, which a page can send
//!   cross-site without a preflight, get 415 `unsupported_media_type`.

use axum::http::{header, HeaderMap, Method, StatusCode};

use super::ApiError;
use crate::config::OrganismConfig;

/// Content types a method that may change state can carry: none of them is one a browser
/// sends cross-site without asking first.
const BODY_TYPES: [&str; 3] = ["application/json", "application/xml", "text/xml"];

/// What a server answers besides its own address and loopback names: its listen address
/// and the organism's `allowed_hosts` and `allowed_origins`.
pub(super) struct Allowed<'a> {
    pub listen: &'a str,
    pub hosts: &'a [String],
    pub origins: &'a [String],
}

impl<'a> Allowed<'a> {
    pub fn of(config: &'a OrganismConfig) -> Allowed<'a> {
        Allowed {
            listen: &config.listen,
            hosts: &config.allowed_hosts,
            origins: &config.allowed_origins,
        }
    }
}

/// Checks one request's headers; the error is the answer.
pub(super) fn check(
    config: &Allowed<'_>,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let host = match headers.get(header::HOST) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| host_refused("(not text)"))?),
    };
    if let Some(host) = host {
        if !host_allowed(config, host) {
            return Err(host_refused(host));
        }
    }
    let upgrade = headers.contains_key(header::UPGRADE);
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if upgrade || !safe {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("null");
            if !origin_allowed(config, origin, host) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "cross_origin",
                    format!(
                        "requests from the web page at `{}` are refused: it is not this \
                         server's origin; list it in organism.allowed_origins to allow it",
                        clip(origin)
                    ),
                )
                .at("Origin"));
            }
        }
    }
    if !safe {
        check_body_type(headers)?;
    }
    Ok(())
}

fn host_refused(host: &str) -> ApiError {
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "host_not_allowed",
        format!(
            "this server does not answer to the name `{}` (a page on another site may have \
             pointed that name here); use an IP address or localhost, or list the name in \
             organism.allowed_hosts",
            clip(host)
        ),
    )
    .at("Host")
}

/// At most 256 bytes of a client's header in an error.
fn clip(s: &str) -> String {
    crate::clip::clip(s.to_string(), 256)
}

/// `name` of `name:port`, `[v6]:port`, `name` or `[v6]`, lowercased, without a final dot.
fn host_name(authority: &str) -> String {
    crate::config::host_part(authority)
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

fn host_allowed(config: &Allowed<'_>, host: &str) -> bool {
    let name = host_name(host);
    if name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || name == host_name(config.listen)
    {
        return true;
    }
    config.hosts.iter().any(|allowed| {
        let allowed = allowed.to_ascii_lowercase();
        allowed == host.to_ascii_lowercase() || allowed == name
    })
}

fn origin_allowed(config: &Allowed<'_>, origin: &str, host: Option<&str>) -> bool {
    let origin = origin.trim_end_matches('/');
    if config
        .origins
        .iter()
        .any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h.trim()))
}

fn check_body_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE) {
        Some(ct) => {
            let ct = ct.to_str().unwrap_or("");
            let essence = ct.split(';').next().unwrap_or("").trim();
            if BODY_TYPES.iter().any(|t| essence.eq_ignore_ascii_case(t)) {
                Ok(())
            } else {
                Err(body_type_refused(format!(
                    "a body of type `{}` is refused (a web page can send it from another \
                     site); send JSON with `Content-Type: application/json`, or no body",
                    clip(ct)
                )))
            }
        }
        None => {
            let length = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .map(str::trim);
            let empty = matches!(length, None | Some("0"))
                && !headers.contains_key(header::TRANSFER_ENCODING);
            if empty {
                Ok(())
            } else {
                Err(body_type_refused(
                    "a body without a Content-Type is refused; send JSON with \
                     `Content-Type: application/json`, or no body"
                        .to_string(),
                ))
            }
        }
    }
}

fn body_type_refused(message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        message,
    )
    .at("Content-Type")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_cut_from_their_ports() {
        assert_eq!(host_name("Example.COM:80"), "example.com");
        assert_eq!(host_name("[::1]:8765"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("localhost."), "localhost");
    }
}
