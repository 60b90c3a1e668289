//! `POST /api/v1/threads/{id}/rewind` and the `/ws` `rewind` command: every message after
//! one of a thread's superseded (kept, and listed with `include_superseded=true`), then
//! that message (or its edited payload) admitted again in the same thread (`pump::rewind`);
//! or, with `dry_run`, only what would run. Every message superseded or admitted again must
//! be in the credential's scope, as the thread must (else 404).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::VisibleThread;
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::fork::{edited, unknown_message};
use super::retry::{made_or_planned, RunsAgain};
use super::ApiState;
use crate::pump::{IfActive, RewindError, RewindPlan, RewindRequest};

/// What a rewind does to a thread with work under way.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IfActiveBody {
    /// Refuse (409 `thread_active`).
    #[default]
    Reject,
    /// Abort the thread first.
    Abort,
}

/// `POST /api/v1/threads/{id}/rewind` and the `/ws` `rewind` command.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindBody {
    /// The message of this thread to rewind to: admitted again.
    pub to: String,
    /// Its payload, edited, as JSON (as inject's `payload`); else its own.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
    /// Its payload, edited, as XML; else its own.
    pub payload_xml: Option<String>,
    /// Which accepted type `payload` is, when its receiver accepts more than one.
    pub payload_type: Option<String>,
    #[serde(default)]
    pub if_active: IfActiveBody,
    /// Say what would run; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A rewind made (or that would be).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Rewound {
    pub thread_id: String,
    /// The message rewound to.
    pub to_message: String,
    /// The message admitted again (none for a dry run).
    pub message_id: Option<String>,
    /// Messages superseded.
    pub superseded: usize,
    /// Who runs it again.
    #[serde(flatten)]
    pub runs: RunsAgain,
}

impl Rewound {
    fn of(thread: &str, plan: &RewindPlan, message_id: Option<String>) -> Self {
        Rewound {
            thread_id: thread.to_string(),
            to_message: plan.at.id.to_string(),
            message_id,
            superseded: plan.superseded.len(),
            runs: RunsAgain::of(&plan.to, plan.kind),
        }
    }
}

#[utoipa::path(post, path = "/api/v1/threads/{id}/rewind", tag = "threads",
    params(("id" = String, Path, description = "Thread id")), request_body = RewindBody,
    responses((status = 201, description = "Rewound: every message after `to` superseded (kept; `include_superseded=true` lists them), a `thread_rewound` event, then `to` (or its edit) admitted again at a new slot, `origin {kind: rewind, of}`", body = Rewound),
              (status = 200, description = "`dry_run`: what would run; nothing changed", body = Rewound),
              (status = 400, description = "A malformed body", body = ErrorResponse),
              (status = 404, description = "No such thread or message in it (in this credential's scope: every message superseded must be)", body = ErrorResponse),
              (status = 409, description = "`thread_active` (work under way and `if_active: reject`), `thread_killed`, `no_route` (the receiver is gone, or the sender's peers no longer reach it)", body = ErrorResponse),
              (status = 422, description = "The payload is not valid for its receiver", body = ErrorResponse),
              (status = 429, description = "A quota or limit an inject meets", body = ErrorResponse)))]
pub async fn rewind_thread(
    State(s): State<ApiState>,
    VisibleThread { id, scope, .. }: VisibleThread,
    JsonBody(body): JsonBody<RewindBody>,
) -> Result<Response, ApiError> {
    let answer = rewind(&s.inner.organism, &scope, &id, body).await?;
    let made = answer.message_id.is_some();
    Ok(made_or_planned(answer, made))
}

/// Rewinds `thread` (seen by `scope`) as `body` says, off the async workers: the answer
/// of the REST route and the `/ws` `rewind` command.
pub(super) async fn rewind(
    organism: &crate::Organism,
    scope: &crate::access::Scope,
    thread: &str,
    body: RewindBody,
) -> Result<Rewound, ApiError> {
    let edit = (&body.payload, &body.payload_xml, &body.payload_type);
    let payload_xml = edited(organism, thread, &body.to, None, edit)?;
    let (organism, thread, scope) = (organism.clone(), thread.to_string(), scope.clone());
    crate::events::spawn_blocking(move || {
        let req = RewindRequest {
            to: &body.to,
            payload_xml: payload_xml.as_deref(),
            if_active: match body.if_active {
                IfActiveBody::Reject => IfActive::Reject,
                IfActiveBody::Abort => IfActive::Abort,
            },
        };
        let plan = organism.plan_rewind(&thread, &req).map_err(refusal)?;
        let hidden = plan
            .superseded
            .iter()
            .chain(std::iter::once(&plan.at))
            .any(|m| !scope.sees_message(&m.from, m.to.as_deref()));
        if hidden {
            return Err(unknown_message(&thread, &body.to).at("to"));
        }
        if body.dry_run {
            return Ok(Rewound::of(&thread, &plan, None));
        }
        let (plan, receipt) = organism.rewind(&thread, &req).map_err(refusal)?;
        Ok(Rewound::of(
            &thread,
            &plan,
            Some(receipt.message_id.to_string()),
        ))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
}

fn refusal(e: RewindError) -> ApiError {
    let message = e.to_string();
    match e {
        RewindError::NotFound { thread, at } => unknown_message(&thread, &at).at("to"),
        RewindError::Active(_) => ApiError::new(StatusCode::CONFLICT, "thread_active", message),
        RewindError::Gate(e) => super::retry::refusal(e),
    }
}
