//! The callback of external agents (SPEC §11.4):
//! `POST /api/v1/external/{agent}/threads/{thread_id}/messages` with an XML body.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;

use super::error::{body_unreadable, ApiError, ErrorResponse, Params};
use super::view::ReplyReceipt;
use super::ApiState;
use crate::pump::{ExternalReply, ReplyError};

/// Optional query parameters of a callback.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplyQuery {
    /// Send every payload to this listener (or, naming the awaited message's sender, back to
    /// it). Default: routed by payload type.
    pub to: Option<String>,
    /// The delivered message this answers. Default: the oldest one awaiting this agent's
    /// reply in the thread.
    pub message_id: Option<String>,
}

impl From<ReplyError> for ApiError {
    fn from(e: ReplyError) -> Self {
        let message = e.to_string();
        match e {
            ReplyError::UnknownAgent(_) => {
                ApiError::not_found("unknown_agent", message).at("agent")
            }
            ReplyError::Unauthorized(_) => {
                ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).at("Authorization")
            }
            ReplyError::UnknownThread(_) => {
                ApiError::not_found("unknown_thread", message).at("thread_id")
            }
            ReplyError::Killed(_) => {
                ApiError::new(StatusCode::CONFLICT, "thread_killed", message).at("thread_id")
            }
            ReplyError::NotWaiting { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not_waiting", message).at("thread_id")
            }
            ReplyError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            ReplyError::Malformed(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "malformed_payload",
                message,
            ),
            ReplyError::Invalid(problems) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload", message)
                    .details(problems)
            }
            ReplyError::Stopping => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", message)
            }
            ReplyError::Store(e) => e.into(),
        }
    }
}

/// The token of `Authorization: Bearer <token>`, if that is what the header holds.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The callback URL of `agent` in `thread` on the API at `base` (`http://host:port`): the
/// route below, which `tests` hold equal to it.
pub fn callback_url(base: &str, agent: &str, thread: &str) -> String {
    format!("{base}/api/v1/external/{agent}/threads/{thread}/messages")
}

#[utoipa::path(post, path = "/api/v1/external/{agent}/threads/{thread_id}/messages", tag = "external",
    params(("agent" = String, Path, description = "The external listener replying"),
           ("thread_id" = String, Path, description = "The thread of the delivery it answers"),
           ReplyQuery),
    request_body(content = String, content_type = "application/xml",
        description = "One or several payloads (stray text between them is ignored); each is validated strictly"),
    responses((status = 202, description = "Accepted: the payloads entered the pump as the agent's output", body = ReplyReceipt),
              (status = 401, description = "Missing or wrong bearer token (when the agent has `token_env`)", body = ErrorResponse),
              (status = 404, description = "No such external agent, or no such thread", body = ErrorResponse),
              (status = 409, description = "The thread was killed, or no reply is owed (never asked, answered, timed out)", body = ErrorResponse),
              (status = 413, description = "Body larger than `limits.max_message_bytes`", body = ErrorResponse),
              (status = 422, description = "No payload found, or a payload is invalid or cannot be routed (reasons in `details`); nothing was accepted", body = ErrorResponse),
              (status = 503, description = "The organism is stopping (`stopping`), or the store could not be asked about a thread not held in memory (`store_failed`)", body = ErrorResponse)))]
pub async fn external_reply(
    State(s): State<ApiState>,
    Path((agent, thread_id)): Path<(String, String)>,
    Params(q): Params<ReplyQuery>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<ReplyReceipt>), ApiError> {
    let body = body.map_err(body_unreadable)?;
    let text = std::str::from_utf8(&body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "malformed_payload",
            format!("the body is not UTF-8: {e}"),
        )
        .at(format!("byte {}", e.valid_up_to()))
    })?;
    let receipt = s.inner.organism.external_reply(ExternalReply {
        agent: &agent,
        thread_id: &thread_id,
        token: bearer(&headers),
        body: text,
        to: q.to.as_deref(),
        message_id: q.message_id.as_deref(),
    })?;
    Ok((StatusCode::ACCEPTED, Json(receipt.into())))
}

#[cfg(test)]
mod tests {
    use utoipa::Path;

    /// The callback URL an external agent is given is the route that takes its reply.
    #[test]
    fn the_callback_url_is_the_documented_route() {
        assert_eq!(
            super::callback_url("", "{agent}", "{thread_id}"),
            super::__path_external_reply::path()
        );
    }
}
