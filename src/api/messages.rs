//! `GET /api/v1/messages/{id}`: one message, whoever's thread it is in (in the credential's
//! scope).

use axum::extract::{Path, State};
use axum::response::Response;

use super::auth::Seen;
use super::error::{ApiError, ErrorResponse};
use super::rest::{json, ApiResult};
use super::view::Message;
use super::ApiState;

#[utoipa::path(get, path = "/api/v1/messages/{id}", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    responses((status = 200, description = "The message", body = Message),
              (status = 404, description = "No such message (in this credential's scope)", body = ErrorResponse)))]
pub async fn get_message(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let organism = &s.inner.organism;
    let (o, wanted) = (organism.clone(), id.clone());
    let found = super::reads::off_runtime(move || o.history().message(&wanted)).await??;
    match found {
        Some(m) if seen.scope.sees_message(&m.from, m.to.as_deref()) => {
            Ok(json(&Message::of(&m, &organism.schemas())))
        }
        _ => Err(ApiError::not_found("unknown_message", format!("no message `{id}`")).at("id")),
    }
}
