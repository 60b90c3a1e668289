//! `X-Request-Id`: every REST request has one, the client's (printable ASCII, at most
//! [`MAX_REQUEST_ID`] bytes) or a new one, echoed in the answer; the request runs as its
//! [`Cause`], so each event it makes carries `origin {request_id, conn: null}`.

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue};
use axum::response::IntoResponse;

use super::error::ApiError;
use crate::events::{valid_request_id, Cause, MAX_REQUEST_ID};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The middleware: the request's id read or made, its handler run as its cause, the id
/// echoed. A malformed id is 400, echoed as nothing.
pub(super) async fn request_id(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let id = match request.headers().get(&REQUEST_ID) {
        Some(v) => match v.to_str().ok().filter(|s| valid_request_id(s)) {
            Some(s) => s.to_string(),
            None => {
                return ApiError::bad_request(format!(
                    "X-Request-Id must be 1 to {MAX_REQUEST_ID} printable ASCII characters \
                     without spaces"
                ))
                .at("header X-Request-Id")
                .into_response()
            }
        },
        None => crate::threads::new_id().to_string(),
    };
    let header = HeaderValue::from_str(&id).ok();
    let cause = Arc::new(Cause {
        request_id: serde_json::Value::String(id),
        conn: None,
    });
    let mut response = Cause::scope(Some(cause), next.run(request)).await;
    if let Some(h) = header {
        response.headers_mut().insert(REQUEST_ID, h);
    }
    response
}
