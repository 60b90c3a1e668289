//! The REST handlers of `/api/v1` (SPEC §9) and the operational endpoints. Each handler is
//! documented with `#[utoipa::path]`, which is also how it is routed, so the OpenAPI document
//! cannot drift from what is served.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{unknown_thread, Scope, Seen, VisibleAgent, VisibleThread};
use super::error::{ApiError, ErrorResponse, JsonBody, Params};
use super::idempotency::inject as idempotent_inject;
use super::inject::InjectBody;
use super::reads::{all_messages, off_runtime, thread_page};
use super::sanitize::{listener_view, organism_view, ConfigView};
use super::view::{
    Agent, InjectReceipt, Message, MessageStatus, Organism, Paged, ReloadReport, Thread,
    ThreadStatus,
};
use super::ApiState;
use crate::events::OrganismStatus;
use crate::pump::ReloadError;
use crate::threads::{MessageFilter, MessageRecord, Page, ThreadFilter};
use crate::time::Timestamp;

/// The identity REST injects carry.
pub const REST_IDENTITY: &str = "api";

pub(super) type ApiResult<T> = Result<T, ApiError>;

pub(super) fn time_param(name: &str, value: Option<&str>) -> ApiResult<Option<Timestamp>> {
    match value {
        None => Ok(None),
        Some(v) => Timestamp::parse_rfc3339_bound(v).map(Some).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!(
                    "bad query parameter `{name}`: must be an RFC 3339 date-time such as 2026-01-15T10:30:00Z (got `{v}`)"
                ),
            )
            .at(name.to_string())
        }),
    }
}

/// Pagination of every list: `limit` (default 50, at most 1000; larger is clamped) and
/// `offset`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size: default 50, at most 1000 (a larger value is clamped; 0 returns only `total`).
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub limit: Option<u32>,
    /// Items to skip.
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

impl PageQuery {
    pub(super) fn page(&self) -> Page {
        page(self.limit, self.offset)
    }
}

/// The page a list's `limit` and `offset` ask for (clamped to `MAX_PAGE`).
pub(super) fn page(limit: Option<u32>, offset: Option<u32>) -> Page {
    Page::new(limit.map(|n| n as usize), offset.map(|n| n as usize))
}

/// Filters of `/messages`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MessageQuery {
    /// Sender or receiver.
    pub agent: Option<String>,
    /// Thread id.
    pub thread: Option<String>,
    /// `Local` or `{namespace}Local`.
    pub payload_type: Option<String>,
    pub status: Option<MessageStatus>,
    /// Logged at or after (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Logged before (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

/// A thread with its message history.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadDetail<'a> {
    #[serde(flatten)]
    pub thread: Thread,
    pub messages: Vec<Message<'a>>,
}

/// `v` as a JSON answer, written now (a view borrows the records it shows).
pub(super) fn json<T: Serialize>(v: &T) -> Response {
    Json(v).into_response()
}

/// A page of messages as a JSON answer, typed against one snapshot of the schemas.
fn messages_page(
    organism: &crate::Organism,
    mut page: crate::threads::Paged<MessageRecord>,
    rewinds: &[crate::threads::Rewind],
) -> Response {
    // A page is bounded by bytes too: one that would pass `MAX_PAGE_BYTES` ends early and
    // says so by its `limit` (the number of items served), so `offset + limit` stays the
    // next page.
    let fit = fitting(&page.items);
    if fit < page.items.len() {
        page.items.truncate(fit);
        page.limit = fit;
    }
    let schemas = organism.schemas();
    json(&Paged {
        items: Message::marked(&page.items, &schemas, rewinds),
        total: page.total,
        limit: page.limit,
        offset: page.offset,
    })
}

/// The most one answer's messages may weigh, in bytes (each counted as its payload twice,
/// for the XML and the JSON, plus its error and fields): a page past it ends early; an
/// inject's `?wait=` answer keeps the first messages that fit.
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;

/// How many of `messages`, from the first, fit in [`MAX_PAGE_BYTES`] (at least one).
fn fitting(messages: &[MessageRecord]) -> usize {
    let mut used = 0usize;
    for (i, m) in messages.iter().enumerate() {
        let weight = 2 * m.payload_xml.len() + m.error.as_ref().map_or(0, |e| e.len()) + 512;
        used = used.saturating_add(weight);
        if used > MAX_PAGE_BYTES {
            return i.max(1);
        }
    }
    messages.len()
}

/// `/healthz` and `/readyz` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    pub status: String,
}

/// Who the request's credential is (`GET /api/v1/me`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Me {
    /// `key:NAME`, or a token's `sub`; null without authentication.
    pub name: Option<String>,
    /// `viewer`, `operator` or `admin` (`admin` without authentication).
    pub role: String,
    /// The tenant it acts for; null for the whole organism.
    pub tenant: Option<String>,
    /// Whether the server asks for a credential at all.
    pub auth: bool,
}

#[utoipa::path(get, path = "/api/v1/me", tag = "organism",
    responses((status = 200, description = "Who the credential is: what a client shows and which controls it offers", body = Me)))]
pub async fn me(State(s): State<ApiState>, seen: Seen) -> Json<Me> {
    let p = seen.principal;
    Json(Me {
        name: p.name,
        role: p.role.to_string(),
        tenant: p.tenant,
        auth: s.inner.auth.is_some(),
    })
}

#[utoipa::path(get, path = "/api/v1/organism", tag = "organism",
    responses((status = 200, description = "The organism and its counters", body = Organism)))]
pub async fn get_organism(State(s): State<ApiState>) -> Json<Organism> {
    Json(s.inner.organism.info().into())
}

#[utoipa::path(get, path = "/api/v1/organism/config", tag = "organism",
    responses((status = 200, description = "The organism file, sanitized: secret values never appear", body = ConfigView)))]
pub async fn get_organism_config(State(s): State<ApiState>) -> Json<ConfigView> {
    Json(organism_view(&s.inner.organism.config()))
}

#[utoipa::path(get, path = "/api/v1/agents", tag = "agents", params(PageQuery),
    responses((status = 200, description = "Every agent with its live state, in config order", body = Paged<Agent>),
              (status = 400, description = "Bad query parameter", body = ErrorResponse)))]
pub async fn list_agents(
    State(s): State<ApiState>,
    seen: Seen,
    Params(q): Params<PageQuery>,
) -> Json<Paged<Agent>> {
    let mut agents = s.inner.organism.agents();
    agents.retain(|a| seen.scope.sees(&a.name));
    Json(Paged::map(q.page().cut(agents), Agent::from))
}

#[utoipa::path(get, path = "/api/v1/agents/{name}", tag = "agents",
    params(("name" = String, Path, description = "Listener name")),
    responses((status = 200, description = "One agent with its counters", body = Agent),
              (status = 404, description = "No such listener", body = ErrorResponse)))]
pub async fn get_agent(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
) -> ApiResult<Json<Agent>> {
    Ok(Json(s.inner.organism.agent(&name)?.into()))
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/config", tag = "agents",
    params(("name" = String, Path, description = "Listener name")),
    responses((status = 200, description = "The listener's section of the organism file, sanitized", body = ConfigView),
              (status = 404, description = "No such listener", body = ErrorResponse)))]
pub async fn get_agent_config(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
) -> ApiResult<Json<ConfigView>> {
    s.inner.organism.agent(&name)?;
    listener_view(&s.inner.organism.config(), &name)
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(
                "unknown_listener",
                format!("no config section for `{name}`"),
            )
        })
}

#[utoipa::path(get, path = "/api/v1/threads", tag = "threads", params(super::labels::ThreadQuery, super::labels::LabelQuery),
    responses((status = 200, description = "Threads, newest first", body = Paged<Thread>),
              (status = 400, description = "Bad query parameter", body = ErrorResponse)))]
pub async fn list_threads(
    State(s): State<ApiState>,
    seen: Seen,
    params: super::labels::ThreadParams,
) -> ApiResult<Json<Paged<Thread>>> {
    let page = page(params.query.limit, params.query.offset);
    let filter = thread_filter(params, &seen.scope)?;
    let o = s.inner.organism.clone();
    let threads = off_runtime(move || o.history().query_threads(&filter, page)).await??;
    Ok(Json(Paged::map(threads, Thread::from)))
}

/// The filter `/threads`'s parameters say, within `scope`.
pub(super) fn thread_filter(
    params: super::labels::ThreadParams,
    scope: &Scope,
) -> ApiResult<ThreadFilter> {
    let q = params.query;
    Ok(ThreadFilter {
        status: q.status.map(Into::into),
        agent: q.agent.clone(),
        since: time_param("since", q.since.as_deref())?,
        until: time_param("until", q.until.as_deref())?,
        within: scope.within(),
        labels: params.labels,
        q: params.q,
    })
}

#[utoipa::path(get, path = "/api/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, description = "Thread id"), super::labels::SupersededQuery),
    responses((status = 200, description = "The thread with its message history (without what a rewind superseded, unless `include_superseded=true`)", body = ThreadDetail),
              (status = 404, description = "No such thread", body = ErrorResponse)))]
pub async fn get_thread(
    State(s): State<ApiState>,
    t: VisibleThread,
    Params(q): Params<super::labels::SupersededQuery>,
) -> ApiResult<Response> {
    let organism = &s.inner.organism;
    let (page, rewinds) = thread_page(organism, &t.id, &t.scope, Page::ALL, q.include)
        .await?
        .ok_or_else(|| unknown_thread(&t.id))?;
    Ok(json(&ThreadDetail {
        thread: t.info.into(),
        messages: Message::marked(&page.items, &organism.schemas(), &rewinds),
    }))
}

#[utoipa::path(get, path = "/api/v1/threads/{id}/messages", tag = "threads",
    params(("id" = String, Path, description = "Thread id"), PageQuery, super::labels::SupersededQuery),
    responses((status = 200, description = "The thread's messages in slot order (without those a rewind superseded, unless `include_superseded=true`)", body = Paged<Message>),
              (status = 404, description = "No such thread", body = ErrorResponse)))]
pub async fn thread_messages(
    State(s): State<ApiState>,
    t: VisibleThread,
    Params(q): Params<PageQuery>,
    Params(sup): Params<super::labels::SupersededQuery>,
) -> ApiResult<Response> {
    let organism = &s.inner.organism;
    let (page, rewinds) = thread_page(organism, &t.id, &t.scope, q.page(), sup.include)
        .await?
        .ok_or_else(|| unknown_thread(&t.id))?;
    Ok(messages_page(organism, page, &rewinds))
}

#[utoipa::path(get, path = "/api/v1/messages", tag = "messages", params(MessageQuery),
    responses((status = 200, description = "The message log, oldest first", body = Paged<Message>),
              (status = 400, description = "Bad query parameter", body = ErrorResponse)))]
pub async fn list_messages(
    State(s): State<ApiState>,
    seen: Seen,
    Params(q): Params<MessageQuery>,
) -> ApiResult<Response> {
    let filter = MessageFilter {
        agent: q.agent.clone(),
        thread: q.thread.clone(),
        payload_type: q.payload_type.clone(),
        status: q.status.map(Into::into),
        since: time_param("since", q.since.as_deref())?,
        until: time_param("until", q.until.as_deref())?,
        within: seen.scope.within(),
    };
    let page = page(q.limit, q.offset);
    let o = s.inner.organism.clone();
    let found = off_runtime(move || o.history().query_messages(&filter, page)).await??;
    Ok(messages_page(&s.inner.organism, found, &[]))
}

/// `?wait=SECONDS` on inject: answer once the thread is no longer active.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InjectQuery {
    /// Wait up to this many seconds (at most 60) for the thread to be no longer active, and
    /// answer 200 with its messages; without it, answer 202 at once.
    #[param(maximum = 60)]
    pub wait: Option<u64>,
}

/// `POST /inject`'s header.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // read from the headers themselves; this is the document's
pub struct IdempotencyHeader {
    /// Names this inject: the same key with the same body, from the same principal, within
    /// `limits.idempotency_window_ms`, answers the first answer again (with
    /// `Idempotency-Replayed: true`) and creates nothing.
    #[serde(rename = "Idempotency-Key")]
    #[param(pattern = "^[!-~]{1,255}$", min_length = 1, max_length = 255)]
    pub key: Option<String>,
}

/// The longest `?wait=` on inject, in seconds.
pub const MAX_INJECT_WAIT: u64 = 60;

/// The answer to an inject that waited (`?wait=`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InjectResult<'a> {
    pub thread_id: String,
    pub message_id: String,
    /// The thread's status when the answer was made: `active` if the wait ran out first.
    pub thread_status: ThreadStatus,
    /// The thread's messages, in slot order: the first that fit in 16 MiB;
    /// `GET /threads/{id}/messages` pages through them all.
    pub messages: Vec<Message<'a>>,
}

#[utoipa::path(post, path = "/api/v1/inject", tag = "control", request_body = InjectBody,
    params(InjectQuery, IdempotencyHeader),
    responses((status = 202, description = "Validated and queued", body = InjectReceipt),
              (status = 200, description = "With `?wait=`: the thread settled (or the wait ran out: `thread_status` says which); its messages", body = InjectResult),
              (status = 400, description = "Bad JSON, missing or conflicting fields, bad thread id", body = ErrorResponse),
              (status = 404, description = "No such listener", body = ErrorResponse),
              (status = 409, description = "The thread was killed or is over its budget; or `idempotency_conflict`: the key was used with another body", body = ErrorResponse),
              (status = 413, description = "Body or payload too large", body = ErrorResponse),
              (status = 415, description = "Not `application/json`", body = ErrorResponse),
              (status = 422, description = "Payload malformed, not accepted, or invalid (validator messages in `details`)", body = ErrorResponse),
              (status = 429, description = "`rate_limited` (`inject_per_s`, with `Retry-After`), `overloaded` (the organism's `limits.max_pending_messages` or `limits.max_pending_bytes`), `store_behind`, `too_many_held`, `too_many_idempotency_keys`; a tenant's `too_many_threads`, `too_many_pending` or `budget_exhausted` (the quota named in the message)", body = ErrorResponse),
              (status = 503, description = "The organism is stopping", body = ErrorResponse)))]
pub async fn inject(
    State(s): State<ApiState>,
    seen: Seen,
    Params(q): Params<InjectQuery>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<InjectBody>,
) -> ApiResult<Response> {
    if q.wait.is_some_and(|w| w > MAX_INJECT_WAIT) {
        return Err(
            ApiError::bad_request(format!("wait is at most {MAX_INJECT_WAIT} seconds")).at("wait"),
        );
    }
    let organism = &s.inner.organism;
    s.limit_inject(&seen.principal)?;
    let key = match headers.get("idempotency-key") {
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::bad_request("an idempotency key is visible ASCII").at("Idempotency-Key")
        })?),
        None => None,
    };
    let once = idempotent_inject(&s.inner.keys, organism, &seen, REST_IDENTITY, body, key).await?;
    let receipt = once.receipt;
    let replayed = [(
        "idempotency-replayed",
        if once.replayed { "true" } else { "false" },
    )];
    let Some(wait) = q.wait else {
        let answer = Json(InjectReceipt::from(receipt));
        return Ok((StatusCode::ACCEPTED, replayed, answer).into_response());
    };
    let waited = tokio::time::timeout(
        std::time::Duration::from_secs(wait),
        organism.history().wait_thread(&receipt.thread_id),
    )
    .await;
    let thread_status = match waited {
        Ok(Some(status)) => status,
        _ => crate::threads::ThreadStatus::Active,
    };
    let mut messages = all_messages(organism, &receipt.thread_id, &seen.scope).await?;
    messages.truncate(fitting(&messages));
    let answer = json(&InjectResult {
        thread_id: receipt.thread_id.to_string(),
        message_id: receipt.message_id.to_string(),
        thread_status: thread_status.into(),
        messages: Message::all(&messages, &organism.schemas()),
    });
    Ok((replayed, answer).into_response())
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/pause", tag = "control",
    params(("name" = String, Path, description = "Listener name")),
    responses((status = 200, description = "Paused: its messages wait in its queue", body = Agent),
              (status = 404, description = "No such listener", body = ErrorResponse)))]
pub async fn pause_agent(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
) -> ApiResult<Json<Agent>> {
    s.inner.organism.control().pause_listener(&name)?;
    Ok(Json(s.inner.organism.agent(&name)?.into()))
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/resume", tag = "control",
    params(("name" = String, Path, description = "Listener name")),
    responses((status = 200, description = "Resumed: its queue is delivered in order", body = Agent),
              (status = 404, description = "No such listener", body = ErrorResponse)))]
pub async fn resume_agent(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
) -> ApiResult<Json<Agent>> {
    s.inner.organism.control().resume_listener(&name)?;
    Ok(Json(s.inner.organism.agent(&name)?.into()))
}

#[utoipa::path(post, path = "/api/v1/organism/pause", tag = "control",
    responses((status = 200, description = "Every listener paused", body = Organism)))]
pub async fn pause_organism(State(s): State<ApiState>) -> Json<Organism> {
    s.inner.organism.control().pause();
    Json(s.inner.organism.info().into())
}

#[utoipa::path(post, path = "/api/v1/organism/resume", tag = "control",
    responses((status = 200, description = "Resumed (listeners paused one by one stay paused)", body = Organism)))]
pub async fn resume_organism(State(s): State<ApiState>) -> Json<Organism> {
    s.inner.organism.control().resume();
    Json(s.inner.organism.info().into())
}

impl From<ReloadError> for ApiError {
    fn from(e: ReloadError) -> Self {
        let message = e.to_string();
        match e {
            ReloadError::RevMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "rev_mismatch", message).at("if_rev")
            }
            ReloadError::NoSource => ApiError::new(StatusCode::CONFLICT, "not_reloadable", message),
            ReloadError::Stopping => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", message)
            }
            ReloadError::Refused(problems) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "reload_failed",
                "reload refused: the running organism is unchanged",
            )
            .details(problems.iter().map(|p| p.to_string()).collect()),
        }
    }
}

/// Reloads the organism off the async workers (building Lua sandboxes runs `init`).
pub async fn reload_blocking(
    organism: &crate::Organism,
    if_rev: Option<u64>,
) -> ApiResult<ReloadReport> {
    let o = organism.clone();
    crate::events::spawn_blocking(move || o.reload(if_rev))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map(|r| ReloadReport::from(&r))
        .map_err(ApiError::from)
}

/// `POST /organism/reload` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReloadQuery {
    /// Reload only if the running config is this revision (`config_rev`); 409 otherwise.
    pub if_rev: Option<u64>,
}

#[utoipa::path(post, path = "/api/v1/organism/reload", tag = "control", params(ReloadQuery),
    responses((status = 200, description = "Reloaded from the organism file: `{rev, added, removed, changed, unchanged}`", body = ReloadReport),
              (status = 409, description = "`if_rev` is not the running revision, or the organism has no file", body = ErrorResponse),
              (status = 422, description = "The new config was refused (YAML, schema, script, `init`, or a setting that needs a restart), one reason per line in `details`; nothing changed", body = ErrorResponse),
              (status = 503, description = "The organism is stopping", body = ErrorResponse)))]
pub async fn reload_organism(
    State(s): State<ApiState>,
    Params(q): Params<ReloadQuery>,
) -> ApiResult<Json<ReloadReport>> {
    reload_blocking(&s.inner.organism, q.if_rev).await.map(Json)
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/reload", tag = "control",
    params(("name" = String, Path, description = "Listener name")),
    responses((status = 200, description = "The listener's script was reloaded: new sandboxes ran `init` and took over", body = Agent),
              (status = 404, description = "No such listener", body = ErrorResponse),
              (status = 409, description = "A native listener: nothing to reload", body = ErrorResponse),
              (status = 422, description = "The new script does not compile or its `init` failed; the old one keeps running", body = ErrorResponse)))]
pub async fn reload_agent(
    State(s): State<ApiState>,
    VisibleAgent(name): VisibleAgent,
) -> ApiResult<Json<Agent>> {
    let organism = s.inner.organism.clone();
    let target = name.clone();
    // Building sandboxes compiles and runs `init`: keep it off the async workers.
    crate::events::spawn_blocking(move || organism.control().reload_listener(&target))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    Ok(Json(s.inner.organism.agent(&name)?.into()))
}

#[utoipa::path(post, path = "/api/v1/organism/stop", tag = "control",
    responses((status = 202, description = "Stopping: new injects are refused, running handlers finish within the grace period, then the process exits 0 (1 if the store could not commit everything)", body = Organism)))]
pub async fn stop_organism(State(s): State<ApiState>) -> (StatusCode, Json<Organism>) {
    s.request_stop();
    let mut info = s.inner.organism.info();
    if info.status != OrganismStatus::Stopped {
        info.status = OrganismStatus::Stopping;
    }
    (StatusCode::ACCEPTED, Json(info.into()))
}

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This document (OpenAPI 3)", content_type = "application/json")))]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::doc::text(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics(State(s): State<ApiState>) -> Response {
    let text = tokio::task::spawn_blocking(move || super::metrics::render(&s))
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The process is serving", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses((status = 200, description = "Ready for injects", body = Health),
              (status = 503, description = "Not ready; the message names what", body = ErrorResponse)))]
pub async fn readyz(State(s): State<ApiState>) -> ApiResult<Json<Health>> {
    if let Some(e) = s
        .inner
        .organism
        .history()
        .store()
        .and_then(|st| st.failure())
    {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("store: {e}"),
        ));
    }
    if let Some((false, url)) = s.inner.organism.metrics().nats_link() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!(
                "nats: the link to {url} is down; listeners placed on workers and the event \
                 mirror wait for it"
            ),
        ));
    }
    let unserved = s.inner.organism.metrics().unserved_listeners();
    if !unserved.is_empty() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!(
                "no worker serves {} (start `agentserver worker --listeners {}`)",
                unserved.join(", "),
                unserved.join(",")
            ),
        ));
    }
    match s.inner.organism.status() {
        OrganismStatus::Running | OrganismStatus::Paused => Ok(Json(Health {
            status: "ready".into(),
        })),
        other => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!(
                "organism: {}",
                serde_json::to_value(super::view::OrganismStatus::from(other))
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ),
        )),
    }
}
