//! `POST /api/v1/threads/{id}/fork` and `…/rewind`, and the `/ws` `fork` and `rewind`
//! commands. A fork is a new thread holding copies of the messages before one of a
//! thread's (`pump::fork`), then that message (or its edited payload, or to another
//! receiver) admitted again; a rewind supersedes every message after one in the same
//! thread and admits that one again (`pump::rewind`); either, with `dry_run`, only says
//! what would run. Every message copied, superseded or admitted again must be in the
//! credential's scope, as the thread must (else 404, as for one that does not exist).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::{chosen_id, VisibleThread};
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::retry::{made_or_planned, RunsAgain};
use super::ApiState;
use crate::pump::{ForkCopy, ForkError, ForkPlan, ForkRequest};

/// What a fork copies before the message it is forked at.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CopyMode {
    /// Its causal path: its parent, its parent's parent, … to the first message.
    #[default]
    Path,
    /// Every earlier message of the thread.
    Prefix,
}

/// `POST /api/v1/threads/{id}/fork` and the `/ws` `fork` command.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The message of this thread to fork at: admitted again in the new thread.
    pub at: String,
    /// Its payload, edited, as JSON (as inject's `payload`); else its own.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
    /// Its payload, edited, as XML; else its own.
    pub payload_xml: Option<String>,
    /// Which accepted type `payload` is, when its receiver accepts more than one.
    pub payload_type: Option<String>,
    /// Another receiver for it; else its own.
    pub to: Option<String>,
    /// The new thread's id (else a new one): `[A-Za-z0-9_-]{1,128}` but not `batch`, `count`
    /// or `retry`, unused (else 409 `thread_exists`); a tenant's credential's begins with its
    /// tenant's name and `-`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub thread_id: Option<String>,
    /// Labels for the new thread, over those it inherits (inject's rules).
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub copy: CopyMode,
    /// Say what would run; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A fork made (or that would be).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Forked {
    /// The new thread, and the message admitted in it (none for a dry run).
    pub thread_id: Option<String>,
    pub message_id: Option<String>,
    /// Messages copied before it.
    pub copied: usize,
    /// The thread forked and the message forked at.
    pub forked_from: super::view::ForkedFrom,
    /// Who runs it again.
    #[serde(flatten)]
    pub runs: RunsAgain,
}

impl Forked {
    fn of(thread: &str, plan: &ForkPlan, made: Option<(String, String)>) -> Self {
        let (thread_id, message_id) = made.unzip();
        Forked {
            thread_id,
            message_id,
            copied: plan.copies.len(),
            forked_from: super::view::ForkedFrom {
                thread: thread.to_string(),
                message: plan.at.id.to_string(),
            },
            runs: RunsAgain::of(&plan.to, plan.kind),
        }
    }
}

#[utoipa::path(post, path = "/api/v1/threads/{id}/fork", tag = "threads",
    params(("id" = String, Path, description = "Thread id")), request_body = ForkBody,
    responses((status = 201, description = "A new thread: copies of the messages before `at` (`origin {kind: fork, of}`, their statuses kept), then `at` (or its edit) admitted again through validation, peers, approval gates and quotas; labelled `agentserver.forked_from` and `agentserver.forked_at`, with the thread's labels. The thread forked is not touched", body = Forked),
              (status = 200, description = "`dry_run`: what would run; nothing changed", body = Forked),
              (status = 400, description = "A malformed body or thread id", body = ErrorResponse),
              (status = 404, description = "No such thread, message in it, or receiver (in this credential's scope: every message copied must be)", body = ErrorResponse),
              (status = 409, description = "`thread_exists` (`thread_id` is taken), `fork_too_long` (more messages than a thread holds), `no_route` (the receiver is gone, or the sender's peers no longer reach it)", body = ErrorResponse),
              (status = 422, description = "The payload is not valid for its receiver", body = ErrorResponse),
              (status = 429, description = "A quota or limit an inject meets", body = ErrorResponse)))]
pub async fn fork_thread(
    State(s): State<ApiState>,
    VisibleThread {
        id, scope, tenant, ..
    }: VisibleThread,
    JsonBody(body): JsonBody<ForkBody>,
) -> Result<Response, ApiError> {
    let answer = fork(&s.inner.organism, &scope, tenant.as_deref(), &id, body).await?;
    let made = answer.thread_id.is_some();
    Ok(made_or_planned(answer, made))
}

/// Forks `thread` (seen by `scope`, a credential of `tenant`) as `body` says, off the async
/// workers: the answer of the REST route and the `/ws` `fork` command.
pub(super) async fn fork(
    organism: &crate::Organism,
    scope: &crate::access::Scope,
    tenant: Option<&str>,
    thread: &str,
    body: ForkBody,
) -> Result<Forked, ApiError> {
    if let Some(t) = body.thread_id.as_deref() {
        chosen_id(tenant, t, "thread")?;
    }
    let exists = |to: &str| organism.config().listener(to).is_some();
    if let Some(to) = body.to.as_deref().filter(|t| !scope.sees(t) || !exists(t)) {
        return Err(unknown_listener(to));
    }
    let payload_xml = edited(
        organism,
        thread,
        &body.at,
        body.to.as_deref(),
        (&body.payload, &body.payload_xml, &body.payload_type),
    )?;
    let (organism, thread, scope) = (organism.clone(), thread.to_string(), scope.clone());
    crate::events::spawn_blocking(move || {
        let req = request(&body, payload_xml.as_deref());
        let plan = organism.plan_fork(&thread, &req).map_err(refusal)?;
        let hidden = plan
            .copies
            .iter()
            .chain(std::iter::once(&plan.at))
            .any(|m| !scope.sees_message(&m.from, m.to.as_deref()));
        if hidden {
            return Err(unknown_message(&thread, &body.at));
        }
        if body.dry_run {
            return Ok(Forked::of(&thread, &plan, None));
        }
        let (plan, receipt) = organism.fork(&thread, &req).map_err(refusal)?;
        let made = (
            receipt.thread_id.to_string(),
            receipt.message_id.to_string(),
        );
        Ok(Forked::of(&thread, &plan, Some(made)))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
}

/// An edited payload (`payload` as JSON, written as the receiver's XML, or `payload_xml`)
/// for message `at` of `thread`, going to `to` (else its own receiver); none if not edited.
pub(super) fn edited(
    organism: &crate::Organism,
    thread: &str,
    at: &str,
    to: Option<&str>,
    (payload, payload_xml, payload_type): (&Option<Value>, &Option<String>, &Option<String>),
) -> Result<Option<String>, ApiError> {
    let json = match (payload, payload_xml) {
        (Some(_), Some(_)) => {
            return Err(
                ApiError::bad_request("give `payload` or `payload_xml`, not both").at("payload"),
            )
        }
        (Some(json), None) => json,
        (None, xml) => return Ok(xml.clone()),
    };
    let to = match to {
        Some(to) => to.to_string(),
        None => organism
            .history()
            .message(at)?
            .filter(|m| &*m.thread_id == thread)
            .and_then(|m| m.to.clone())
            .map(|to| to.to_string())
            .ok_or_else(|| unknown_message(thread, at))?,
    };
    let config = organism.config();
    let listener = config.listener(&to).ok_or_else(|| unknown_listener(&to))?;
    super::inject::json_to_xml(listener, payload_type.as_deref(), json).map(Some)
}

/// A receiver that is not one (or not the credential's): as an inject to it is answered.
fn unknown_listener(to: &str) -> ApiError {
    ApiError::from(crate::pump::InjectError::UnknownListener(to.to_string())).at("to")
}

fn request<'a>(body: &'a ForkBody, payload_xml: Option<&'a str>) -> ForkRequest<'a> {
    ForkRequest {
        at: &body.at,
        payload_xml,
        to: body.to.as_deref(),
        thread_id: body.thread_id.as_deref(),
        labels: body.labels.as_ref(),
        copy: match body.copy {
            CopyMode::Path => ForkCopy::Path,
            CopyMode::Prefix => ForkCopy::Prefix,
        },
    }
}

pub(super) fn unknown_message(thread: &str, at: &str) -> ApiError {
    ApiError::not_found(
        "unknown_message",
        format!("no message `{at}` in thread `{thread}`"),
    )
    .at("at")
}

fn refusal(e: ForkError) -> ApiError {
    let message = e.to_string();
    match e {
        ForkError::NotFound { thread, at } => unknown_message(&thread, &at),
        ForkError::TooLong { .. } => ApiError::new(StatusCode::CONFLICT, "fork_too_long", message),
        ForkError::Gate(e) => super::retry::refusal(e),
    }
}
