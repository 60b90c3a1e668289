//! `POST /api/v1/messages/{id}/retry` and `POST /api/v1/messages/retry`: a message that
//! ended `failed`, `rejected`, `undeliverable` or `killed` admitted again (`pump::retry`),
//! one, or every one a filter matches (up to a limit, spaced out), or only what would run
//! (`dry_run`).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Seen;
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::rest::time_param;
use super::view::MessageStatus;
use super::ApiState;
use crate::config::ListenerKind;
use crate::pump::{RetryError, RetryPlan};
use crate::threads::{MessageFilter, Page};

/// A caller who may act on many threads or messages at once: a tenant's operator (over its
/// tenant's), or an admin (over every tenant's); checked before the body is read.
pub(super) struct BulkCaller(pub Seen);

impl axum::extract::FromRequestParts<ApiState> for BulkCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        s: &ApiState,
    ) -> Result<Self, ApiError> {
        let seen = Seen::from_request_parts(parts, s).await?;
        let admin = crate::config::Role::Admin;
        if seen.principal.tenant.is_none() && !seen.principal.may(admin) {
            return Err(super::auth::forbidden(&seen.principal, admin));
        }
        Ok(BulkCaller(seen))
    }
}

/// Messages one bulk retry takes at most.
pub const MAX_BULK_RETRY: u32 = 5000;
/// Bytes of one skipped message's reason, at most.
pub const SKIP_WHY_BYTES: usize = 1024;
/// A bulk retry's wait between two retries, at most...
pub const MAX_STAGGER_MS: u64 = 1000;
/// ...and what its waits add up to, at most.
pub const MAX_STAGGER_TOTAL_MS: u64 = 60_000;

/// A retry's options.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Say what would run again; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Who a retry, fork or rewind runs again, and whether that reaches beyond the organism.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunsAgain {
    /// Its receiver, and its kind.
    pub to: String,
    pub kind: String,
    /// The receiver acts beyond the organism (`external`) or costs tokens (`llm`).
    pub side_effects: bool,
}

impl RunsAgain {
    pub(super) fn of(to: &str, kind: ListenerKind) -> Self {
        RunsAgain {
            to: to.to_string(),
            kind: kind.to_string(),
            side_effects: matches!(kind, ListenerKind::External | ListenerKind::Llm),
        }
    }
}

/// `201` with what was made, or `200` with what would be (a dry run).
pub(super) fn made_or_planned(answer: impl Serialize, made: bool) -> Response {
    let status = if made {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(answer)).into_response()
}

/// A message retried (or that would be).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Retried {
    /// The message retried.
    pub retried: String,
    pub thread_id: String,
    /// The new message (none for a dry run).
    pub message_id: Option<String>,
    /// Who runs it again.
    #[serde(flatten)]
    pub runs: RunsAgain,
    /// Its place in its chain of retries (1: a retry of a first try; at most 5).
    pub depth: u32,
}

impl Retried {
    fn of(plan: &RetryPlan, message_id: Option<String>) -> Self {
        Retried {
            retried: plan.message.id.to_string(),
            thread_id: plan.message.thread_id.to_string(),
            message_id,
            runs: RunsAgain::of(&plan.to, plan.kind),
            depth: plan.depth,
        }
    }
}

#[utoipa::path(post, path = "/api/v1/messages/{id}/retry", tag = "messages",
    params(("id" = String, Path, description = "Message id")), request_body = RetryBody,
    responses((status = 201, description = "Admitted again: a new message to the same receiver in the same thread, same sender and parent, `origin {kind: retry, of}`", body = Retried),
              (status = 200, description = "`dry_run`: what would run again; nothing changed", body = Retried),
              (status = 404, description = "No such message (in this credential's scope)", body = ErrorResponse),
              (status = 409, description = "`not_retryable` (not failed, rejected, undeliverable or killed), `already_retried` (retry its retry), `retry_limit` (its chain holds 5 retries), `no_route` (its receiver is gone, or the sender's peers no longer reach it), `thread_killed`", body = ErrorResponse),
              (status = 422, description = "Its payload is not valid for its receiver now", body = ErrorResponse),
              (status = 429, description = "A quota or limit an inject meets", body = ErrorResponse)))]
pub async fn retry_message(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
    body: Option<JsonBody<RetryBody>>,
) -> Result<Response, ApiError> {
    let dry_run = body.is_some_and(|JsonBody(b)| b.dry_run);
    let answer = retry_one(&s.inner.organism, &seen.scope, &id, dry_run).await?;
    let made = answer.message_id.is_some();
    Ok(made_or_planned(answer, made))
}

/// Retries message `id`, which `scope` must see (else 404), or says what would run: the
/// answer of the REST route and the `/ws` `retry` command.
pub(super) async fn retry_one(
    organism: &crate::Organism,
    scope: &crate::access::Scope,
    id: &str,
    dry_run: bool,
) -> Result<Retried, ApiError> {
    let unknown = || ApiError::not_found("unknown_message", format!("no message `{id}`")).at("id");
    match organism.history().message(id)? {
        Some(m) if scope.sees_message(&m.from, m.to.as_deref()) => {}
        _ => return Err(unknown()),
    }
    attempt(organism, id, dry_run).await?.map_err(refusal)
}

/// Retries message `id` (or checks it, for a dry run) off the async workers.
async fn attempt(
    organism: &crate::Organism,
    id: &str,
    dry_run: bool,
) -> Result<Result<Retried, RetryError>, ApiError> {
    let (organism, one) = (organism.clone(), id.to_string());
    crate::events::spawn_blocking(move || {
        let plan = organism.plan_retry(&one)?;
        let receipt = if dry_run {
            None
        } else {
            Some(organism.retry(&one)?)
        };
        Ok(Retried::of(
            &plan,
            receipt.map(|r| r.message_id.to_string()),
        ))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

/// Which messages a bulk retry takes: `/messages`'s filters (`status` `failed` unless given:
/// `failed`, `rejected`, `undeliverable` or `killed`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryFilter {
    /// Sender or receiver (a glob).
    pub agent: Option<String>,
    pub thread: Option<String>,
    pub payload_type: Option<String>,
    pub status: Option<RetryStatus>,
    /// Logged at or after (RFC 3339).
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Logged before (RFC 3339).
    #[schema(format = DateTime)]
    pub until: Option<String>,
}

/// The statuses a message is retried from.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryStatus {
    Failed,
    Rejected,
    Undeliverable,
    Killed,
}

impl From<RetryStatus> for MessageStatus {
    fn from(s: RetryStatus) -> Self {
        match s {
            RetryStatus::Failed => MessageStatus::Failed,
            RetryStatus::Rejected => MessageStatus::Rejected,
            RetryStatus::Undeliverable => MessageStatus::Undeliverable,
            RetryStatus::Killed => MessageStatus::Killed,
        }
    }
}

/// `POST /api/v1/messages/retry`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRetry {
    #[serde(default)]
    pub filter: RetryFilter,
    /// At most this many, the oldest first (as `/messages` lists them; default 100, at most
    /// 5000).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 5000)]
    pub limit: Option<u32>,
    /// Wait this long between two retries (at most 1,000; the waits of one request add up
    /// to 60 s at most, the retries past that go one after the other).
    #[serde(default, deserialize_with = "super::whole::opt_u64")]
    #[schema(maximum = 1000)]
    pub stagger_ms: Option<u64>,
    #[serde(default)]
    pub dry_run: bool,
}

/// One message a bulk retry did not retry, and why.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Skipped {
    pub id: String,
    pub why: String,
}

/// What a bulk retry did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkRetried {
    /// Messages the filter matches (all of them, past `limit` too).
    pub matched: u64,
    /// Retried (or, for a dry run, that would be).
    pub applied: u64,
    pub skipped: Vec<Skipped>,
    pub retried: Vec<Retried>,
    pub dry_run: bool,
}

/// A bulk retry's note in the audit log: its filter and counts.
#[derive(Debug, Clone)]
pub struct AuditNote(pub String);

#[utoipa::path(post, path = "/api/v1/messages/retry", tag = "messages", request_body = BulkRetry,
    responses((status = 200, description = "Each message the filter matches, oldest first, up to `limit`, retried as `…/{id}/retry` does (or, with `dry_run`, checked); the rest of what matched is counted in `matched`", body = BulkRetried),
              (status = 400, description = "A malformed filter, a status that is never retried, or a limit or spacing out of bounds", body = ErrorResponse),
              (status = 403, description = "An organism-wide credential that is not an admin", body = ErrorResponse)))]
pub async fn retry_messages(
    State(s): State<ApiState>,
    BulkCaller(seen): BulkCaller,
    JsonBody(body): JsonBody<BulkRetry>,
) -> Result<Response, ApiError> {
    let limit = body.limit.unwrap_or(100);
    if !(1..=MAX_BULK_RETRY).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` is 1 to {MAX_BULK_RETRY}")).at("limit"));
    }
    let stagger = body.stagger_ms.unwrap_or(0);
    if stagger > MAX_STAGGER_MS {
        return Err(
            ApiError::bad_request(format!("`stagger_ms` is at most {MAX_STAGGER_MS}"))
                .at("stagger_ms"),
        );
    }
    let mut waited = 0;
    let f = body.filter;
    let status = MessageStatus::from(f.status.unwrap_or(RetryStatus::Failed));
    let filter = MessageFilter {
        agent: f.agent,
        thread: f.thread,
        payload_type: f.payload_type,
        status: Some(status.into()),
        since: time_param("filter.since", f.since.as_deref())?,
        until: time_param("filter.until", f.until.as_deref())?,
        within: seen.scope.within(),
    };
    let organism = s.inner.organism.clone();
    let found = {
        let organism = organism.clone();
        let filter = filter.clone();
        let page = Page {
            limit: limit as usize,
            offset: 0,
        };
        super::reads::off_runtime(move || organism.history().query_messages(&filter, page))
            .await??
    };
    let mut out = BulkRetried {
        matched: found.total,
        applied: 0,
        skipped: Vec::new(),
        retried: Vec::new(),
        dry_run: body.dry_run,
    };
    for (i, m) in found.items.iter().enumerate() {
        if i > 0 && stagger > 0 && !body.dry_run && waited < MAX_STAGGER_TOTAL_MS {
            tokio::time::sleep(Duration::from_millis(stagger)).await;
            waited += stagger;
        }
        let why = match attempt(&organism, &m.id, body.dry_run).await {
            Ok(Ok(retried)) => {
                out.applied += 1;
                out.retried.push(retried);
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.body.message,
        };
        out.skipped.push(Skipped {
            id: m.id.to_string(),
            why: crate::clip::clip(why, SKIP_WHY_BYTES),
        });
    }
    let note = format!(
        "matched {}, {} {}, skipped {}; status={}{}",
        out.matched,
        if out.dry_run {
            "would retry"
        } else {
            "retried"
        },
        out.applied,
        out.skipped.len(),
        format!("{status:?}").to_lowercase(),
        [
            ("agent", &filter.agent),
            ("thread", &filter.thread),
            ("payload_type", &filter.payload_type)
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!(" {k}={v}")))
        .collect::<String>()
    );
    let mut response = Json(out).into_response();
    response.extensions_mut().insert(AuditNote(note));
    Ok(response)
}

/// A refused retry, as an answer.
pub(super) fn refusal(e: RetryError) -> ApiError {
    let message = e.to_string();
    match e {
        RetryError::NotFound(_) => ApiError::not_found("unknown_message", message).at("id"),
        RetryError::NotRetryable { .. } => {
            ApiError::new(StatusCode::CONFLICT, "not_retryable", message)
        }
        RetryError::Limit { .. } => ApiError::new(StatusCode::CONFLICT, "retry_limit", message),
        RetryError::Retried { .. } => {
            ApiError::new(StatusCode::CONFLICT, "already_retried", message)
        }
        RetryError::NoRoute { .. } => ApiError::new(StatusCode::CONFLICT, "no_route", message),
        RetryError::Inject(e) => e.into(),
        RetryError::Store(e) => e.into(),
    }
}
