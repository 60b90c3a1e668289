//! The dashboard: a page and its files under `dashboard/`, embedded in the binary at build
//! time, served at `/` and `/dashboard/…` (`organism.dashboard: false` leaves them out). It
//! is a client of the public API like any other: the files hold no data, so they are open;
//! what the page shows it fetches with the user's credential.
//!
//! Every answer carries a strict `Content-Security-Policy` (the page's own files and its own
//! origin only, no inline script, no framing) and `X-Content-Type-Options: nosniff`. The
//! page and its own files are revalidated on each load (`no-cache`, with an `ETag`: a 304
//! when unchanged); vendored libraries, whose names carry their version, are cached for a
//! day.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;
use super::ApiState;

#[derive(rust_embed::Embed)]
#[folder = "dashboard/"]
struct Files;

/// Who may frame, script or connect: the page's own origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes (merged outside the API's authentication: the files are public).
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/", get(index))
        .route("/favicon.ico", get(favicon))
        .route("/dashboard/{*path}", get(file))
}

/// The page, marked `data-auth="required"` when the organism asks for a credential: the
/// page then shows its sign-in form at once instead of learning it from a refused request
/// (which a browser logs as an error).
async fn index(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let auth = state.inner.auth.is_some();
    let variant = if auth { "-auth" } else { "" };
    serve_with("index.html", &headers, "no-cache", variant, |page| {
        if !auth {
            return page;
        }
        let text = String::from_utf8_lossy(&page).replacen(
            "<html lang=\"en\">",
            "<html lang=\"en\" data-auth=\"required\">",
            1,
        );
        text.into_bytes()
    })
}

/// The icon browsers ask for at `/favicon.ico` (an SVG, which they all take).
async fn favicon(headers: HeaderMap) -> Response {
    serve("favicon.svg", &headers, "public, max-age=86400")
}

async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    let cache = if path.starts_with("vendor/") {
        "public, max-age=86400"
    } else {
        "no-cache"
    };
    serve(&path, &headers, cache)
}

fn serve(path: &str, headers: &HeaderMap, cache: &'static str) -> Response {
    serve_with(path, headers, cache, "", |page| page)
}

/// `path` as `shape` makes it; `variant` names the shape in the `ETag` (the file's hash).
fn serve_with(
    path: &str,
    headers: &HeaderMap,
    cache: &'static str,
    variant: &str,
    shape: impl FnOnce(Vec<u8>) -> Vec<u8>,
) -> Response {
    let Some(f) = Files::get(path) else {
        return ApiError::not_found("not_found", format!("no dashboard file `{path}`"))
            .into_response();
    };
    let etag = format!(
        "\"{}{variant}\"",
        crate::hash::to_hex(&f.metadata.sha256_hash()[..16])
    );
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, content_type(path))],
            shape(f.data.into_owned()),
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "text/plain; charset=utf-8",
    }
}
