//! API errors and the extractors that turn bad requests into them.
//!
//! Every error is `{"error": {"code", "message", "details"?, "where"?}}` with a fitting status:
//! what was wrong (`message`, the validator's lines in `details`) and where (`where`: a JSON
//! path, a line and column, or a parameter name).

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::pump::{ControlError, InjectError};
use crate::threads::ThreadError;
use crate::xml::XmlError;

/// An API error: status plus the JSON body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    /// Headers the answer carries besides the body (`WWW-Authenticate`, `Retry-After`).
    /// (Boxed: an error travels in many `Result`s, most without headers.)
    pub headers: Option<Box<axum::http::HeaderMap>>,
}

/// The `error` object of every error response.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code such as `unknown_listener` or `invalid_payload`.
    pub code: String,
    /// What was wrong, for a person.
    pub message: String,
    /// The validator's messages, one per problem, with their line in the payload.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// Where: a JSON path, `line L, column C`, or a parameter name.
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// The error response document.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// Longest `message` of an error answer, in bytes.
pub const MAX_ANSWER_TEXT: usize = 4096;

/// Bytes of an error answer's `details` together.
pub const MAX_DETAILS_BYTES: usize = 32 * 1024;

impl ApiError {
    /// `message` is cut at [`MAX_ANSWER_TEXT`] bytes: it may quote what a client sent.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                code: code.to_string(),
                message: crate::clip::clip(message.into(), MAX_ANSWER_TEXT),
                details: Vec::new(),
                location: None,
            },
            headers: None,
        }
    }

    pub fn with_header(mut self, name: header::HeaderName, value: header::HeaderValue) -> Self {
        self.headers
            .get_or_insert_with(Default::default)
            .insert(name, value);
        self
    }

    /// `Retry-After`: `wait` in whole seconds, rounded up, at least 1.
    pub fn retry_after(self, wait: std::time::Duration) -> Self {
        let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
        let value = header::HeaderValue::from_str(&secs.to_string())
            .unwrap_or(header::HeaderValue::from_static("1"));
        self.with_header(header::RETRY_AFTER, value)
    }

    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.body.location = Some(crate::clip::clip(location.into(), 256));
        self
    }

    /// `details`, each cut at [`MAX_ANSWER_TEXT`] bytes and all together at
    /// [`MAX_DETAILS_BYTES`]: past it, one last line says how many more were left out.
    pub fn details(mut self, details: Vec<String>) -> Self {
        let total = details.len();
        let mut used = 0;
        for d in details {
            let d = crate::clip::clip(d, MAX_ANSWER_TEXT);
            if used + d.len() > MAX_DETAILS_BYTES {
                break;
            }
            used += d.len();
            self.body.details.push(d);
        }
        let left_out = total - self.body.details.len();
        if left_out > 0 {
            self.body
                .details
                .push(format!("… and {left_out} more not shown"));
        }
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(code: &str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(ErrorResponse { error: self.body })).into_response();
        if let Some(headers) = self.headers {
            response.headers_mut().extend(*headers);
        }
        response
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        let code = if e.timed_out {
            "query_timeout"
        } else {
            "store_failed"
        };
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, e.to_string())
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::UnknownListener(_) => {
                ApiError::not_found("unknown_listener", e.to_string())
            }
            ControlError::UnknownThread(_) => ApiError::not_found("unknown_thread", e.to_string()),
            ControlError::ThreadKilled(_) => {
                ApiError::new(StatusCode::CONFLICT, "thread_killed", e.to_string())
            }
            ControlError::NotReloadable(_) => {
                ApiError::new(StatusCode::CONFLICT, "not_reloadable", e.to_string())
            }
            ControlError::ReloadFailed { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "reload_failed",
                e.to_string(),
            ),
        }
    }
}

impl From<InjectError> for ApiError {
    fn from(e: InjectError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            InjectError::Stopping => (StatusCode::SERVICE_UNAVAILABLE, "stopping"),
            InjectError::Overloaded { .. } | InjectError::OverloadedBytes { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "overloaded")
            }
            InjectError::UnknownListener(_) => (StatusCode::NOT_FOUND, "unknown_listener"),
            InjectError::ForgedIdentity(_) => (StatusCode::BAD_REQUEST, "forged_identity"),
            InjectError::Malformed(XmlError::TooLarge { .. }) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
            }
            InjectError::Malformed(_) => (StatusCode::UNPROCESSABLE_ENTITY, "malformed_xml"),
            InjectError::NotAccepted { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "not_accepted"),
            InjectError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload"),
            InjectError::Thread(ThreadError::InvalidId) => {
                (StatusCode::BAD_REQUEST, "invalid_thread_id")
            }
            InjectError::Thread(ThreadError::Killed(_)) => (StatusCode::CONFLICT, "thread_killed"),
            InjectError::Thread(ThreadError::BudgetExceeded { .. }) => {
                (StatusCode::CONFLICT, "thread_budget_exceeded")
            }
            InjectError::Thread(ThreadError::NotFound(_)) => {
                (StatusCode::NOT_FOUND, "unknown_thread")
            }
            InjectError::Thread(ThreadError::Exists(_)) => (StatusCode::CONFLICT, "thread_exists"),
            InjectError::Thread(ThreadError::TooManyActive { .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_threads")
            }
            InjectError::Thread(
                ThreadError::TooManyPending { .. } | ThreadError::TooManyPendingBytes { .. },
            ) => (StatusCode::TOO_MANY_REQUESTS, "too_many_pending"),
            InjectError::Thread(ThreadError::TooManyHeld { .. }) => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_held")
            }
            InjectError::NoTarget => (StatusCode::BAD_REQUEST, "no_target"),
            InjectError::ThreadBusy(_) => (StatusCode::CONFLICT, "thread_busy"),
            InjectError::MessageIdTaken(_) => (StatusCode::CONFLICT, "message_id_taken"),
            InjectError::StoreBehind => (StatusCode::TOO_MANY_REQUESTS, "store_behind"),
            InjectError::StoreFailed(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_failed"),
            InjectError::BudgetExhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "budget_exhausted"),
            InjectError::Label(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_label"),
        };
        let mut err = ApiError::new(status, code, message);
        match e {
            InjectError::Invalid(v) => {
                err = err.details(v.messages).at("payload");
            }
            InjectError::Malformed(
                XmlError::Malformed { line, .. }
                | XmlError::TrailingContent { line }
                | XmlError::TooManyAttributes { line, .. },
            ) => {
                err = err.at(format!("payload line {line}"));
            }
            InjectError::Malformed(_) => err = err.at("payload"),
            InjectError::Thread(ThreadError::InvalidId | ThreadError::Exists(_)) => {
                err = err.at("thread_id")
            }
            InjectError::Label(l) => err = err.at(crate::api::labels::location(&l)),
            InjectError::BudgetExhausted(b) => {
                err = err
                    .at(format!("tenants.{}.{}", b.tenant, b.key))
                    .retry_after(std::time::Duration::from_secs(b.retry_after));
            }
            _ => {}
        }
        err
    }
}

/// A body that could not be read: too large (413) or broken (400).
pub fn body_unreadable(e: axum::extract::rejection::BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.body_text())
    } else {
        ApiError::bad_request(format!("cannot read the body: {}", e.body_text()))
    }
}

/// A JSON request body: `Content-Type: application/json` required (415 otherwise), size
/// limited (413), and parse errors answered with their line and column (400).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim();
        let is_json = essence.eq_ignore_ascii_case("application/json")
            || essence.to_ascii_lowercase().ends_with("+json");
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "the body must be JSON with `Content-Type: application/json` (got `{}`)",
                    if content_type.is_empty() {
                        "none"
                    } else {
                        content_type
                    }
                ),
            )
            .at("Content-Type"));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(body_unreadable)?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not the JSON expected: {e}"),
            )
            .at(format!("line {}, column {}", e.line(), e.column()))
        })
    }
}

/// A body that may be left out: none at all (no `Content-Type`, no bytes) is `None`; any
/// bytes are read as [`JsonBody`] is.
impl<T: DeserializeOwned, S: Send + Sync> axum::extract::OptionalFromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        if req.headers().contains_key(header::CONTENT_TYPE) {
            return <JsonBody<T> as FromRequest<S>>::from_request(req, state)
                .await
                .map(Some);
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(body_unreadable)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be JSON with `Content-Type: application/json` (got `none`)",
        )
        .at("Content-Type"))
    }
}

/// Query parameters; a bad one is a 400 naming it.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e: QueryRejection| {
                let text = e.body_text();
                let (param, problem) = query_problem(&text);
                let message = match param {
                    Some(p) => format!("bad query parameter `{p}`: {problem}"),
                    None => format!("bad query parameter: {problem}"),
                };
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
                    .at(param.unwrap_or("query").to_string())
            })
    }
}

/// The parameter a query rejection names, and what is wrong with it. axum words it
/// "Failed to deserialize query string: limit: invalid digit found in string"; anything
/// else is passed on whole, naming no parameter.
fn query_problem(text: &str) -> (Option<&str>, &str) {
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    match detail.split_once(": ") {
        Some((param, problem))
            if !param.is_empty()
                && param
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') =>
        {
            (Some(param), problem)
        }
        _ => (None, detail),
    }
}

#[cfg(test)]
mod tests {
    use super::{query_problem, ApiError, MAX_ANSWER_TEXT, MAX_DETAILS_BYTES};

    #[test]
    fn a_query_rejection_names_its_parameter_when_it_can() {
        assert_eq!(
            query_problem(
                "Failed to deserialize query string: limit: invalid digit found in string"
            ),
            (Some("limit"), "invalid digit found in string")
        );
        // Wording axum might use instead: passed on whole, naming no parameter.
        assert_eq!(
            query_problem("Failed to deserialize query string: expected `,` here: x"),
            (None, "expected `,` here: x")
        );
        assert_eq!(query_problem("something else"), (None, "something else"));
    }

    #[test]
    fn details_are_bounded_by_bytes_and_say_what_was_left_out() {
        let many: Vec<String> = (0..10_000)
            .map(|i| format!("{i}: {}", "x".repeat(100)))
            .collect();
        let e = ApiError::bad_request("m").details(many);
        let bytes: usize = e.body.details.iter().map(String::len).sum();
        assert!(bytes <= MAX_DETAILS_BYTES + 64, "{bytes}");
        let last = e.body.details.last().unwrap();
        assert!(
            last.starts_with("… and ") && last.ends_with("more not shown"),
            "{last}"
        );
        let one = ApiError::bad_request("m").details(vec!["y".repeat(100_000)]);
        assert!(one.body.details[0].len() <= MAX_ANSWER_TEXT);
        assert_eq!(one.body.details.len(), 1);
    }
}
