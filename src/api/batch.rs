//! `GET /api/v1/threads/count` and `POST /api/v1/threads/batch`: how many threads a filter
//! finds, and one action on each of them (kill, abort, pause, resume, label, retry what failed), with a
//! count the client expects checked first and one audit entry naming the filter and counts.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Seen;
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::labels::{tests_of, ThreadParams};
use super::rest::{time_param, ApiResult};
use super::retry::{AuditNote, Skipped, SKIP_WHY_BYTES};
use super::view::ThreadStatus;
use super::ApiState;
use crate::threads::{Page, ThreadFilter};

/// Threads one batch acts on at most.
pub const MAX_BATCH: u32 = 10_000;

/// How many threads match.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Count {
    pub total: u64,
}

#[utoipa::path(get, path = "/api/v1/threads/count", tag = "threads",
    params(super::labels::ThreadQuery, super::labels::LabelQuery),
    responses((status = 200, description = "How many threads `/threads` would list with these filters (exact)", body = Count),
              (status = 400, description = "Bad query parameter", body = ErrorResponse)))]
pub async fn count_threads(
    State(s): State<ApiState>,
    seen: Seen,
    params: ThreadParams,
) -> ApiResult<Json<Count>> {
    let filter = super::rest::thread_filter(params, &seen.scope)?;
    let page = Page {
        limit: 0,
        offset: 0,
    };
    let total = s
        .inner
        .organism
        .history()
        .query_threads(&filter, page)?
        .total;
    Ok(Json(Count { total }))
}

/// What a batch does to each thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchAction {
    /// Kill it (final).
    Kill,
    /// Abort it (`reason`): its work stops, the thread stays usable.
    Abort,
    /// Pause it: its queued messages wait.
    Pause,
    /// Resume it.
    Resume,
    /// Change its labels as `labels` says.
    Label,
    /// Retry each of its messages that failed (and was not retried already).
    RetryFailed,
}

/// Which threads: `/threads`'s filters, the label tests as lists.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchFilter {
    pub status: Option<ThreadStatus>,
    pub agent: Option<String>,
    #[schema(format = DateTime)]
    pub since: Option<String>,
    #[schema(format = DateTime)]
    pub until: Option<String>,
    /// `key:value` or `key:v1,v2`; all must hold.
    #[serde(default)]
    #[schema(max_items = 16)]
    pub label: Vec<LabelPair>,
    #[serde(default, rename = "label!")]
    #[schema(max_items = 16)]
    pub not_label: Vec<LabelPair>,
    #[serde(default)]
    #[schema(max_items = 16)]
    pub has_label: Vec<LabelKey>,
    #[serde(default)]
    #[schema(max_items = 16)]
    pub no_label: Vec<LabelKey>,
    #[schema(max_length = 256)]
    pub q: Option<String>,
}

/// `key:value` (or `key:v1,v2`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(pattern = "^[a-z0-9_.-]{1,64}:.{0,256}$")]
pub struct LabelPair(pub String);

/// A label's key.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(pattern = "^[a-z0-9_.-]{1,64}$")]
pub struct LabelKey(pub String);

/// `POST /api/v1/threads/batch`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    pub action: BatchAction,
    /// The threads `/threads` finds with these filters (`{}`: every thread in scope)...
    pub filter: BatchFilter,
    /// ...and, if given, among these only (at most 10,000).
    #[schema(max_items = 10000)]
    pub ids: Option<Vec<String>>,
    /// How many threads the client expects to match: another count is 409
    /// `count_mismatch`, and nothing is done.
    #[serde(default, deserialize_with = "super::whole::opt_u64")]
    pub expected_count: Option<u64>,
    /// At most this many, newest first (default 1,000, at most 10,000).
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub dry_run: bool,
    /// Why (an abort's), at most `limits.max_error_bytes`.
    pub reason: Option<String>,
    /// For `label`: each set, or (`null`) removed.
    #[schema(value_type = Option<std::collections::BTreeMap<String, Option<String>>>)]
    pub labels: Option<crate::threads::LabelPatch>,
}

/// What a batch did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchDone {
    /// Threads the filter (or the ids, as far as the credential sees them) matches.
    pub matched: u64,
    /// Acted on (or, for a dry run, that would be).
    pub applied: u64,
    pub skipped: Vec<Skipped>,
    pub dry_run: bool,
}

#[utoipa::path(post, path = "/api/v1/threads/batch", tag = "threads", request_body = Batch,
    responses((status = 200, description = "The action done on each matching thread, newest first, up to `limit`", body = BatchDone),
              (status = 400, description = "A malformed filter, or a limit out of bounds", body = ErrorResponse),
              (status = 403, description = "An organism-wide credential that is not an admin", body = ErrorResponse),
              (status = 409, description = "`count_mismatch`: `expected_count` is not what matched; nothing was done", body = ErrorResponse),
              (status = 422, description = "`labels` refused (`invalid_label`)", body = ErrorResponse)))]
pub async fn batch(
    State(s): State<ApiState>,
    super::retry::BulkCaller(seen): super::retry::BulkCaller,
    JsonBody(body): JsonBody<Batch>,
) -> Result<Response, ApiError> {
    let limit = body.limit.unwrap_or(1000);
    if !(1..=MAX_BATCH).contains(&limit) {
        return Err(ApiError::bad_request(format!("`limit` is 1 to {MAX_BATCH}")).at("limit"));
    }
    // Each label checked once, before anything is done (whatever the action).
    for (k, v) in body.labels.iter().flatten() {
        crate::threads::check_label(k, v.as_deref())
            .map_err(|e| super::settings::label_refused(&e))?;
    }
    let patch = match body.action {
        // No labels: nothing to change.
        BatchAction::Label => Some(body.labels.clone().unwrap_or_default()),
        _ => None,
    };
    let organism = s.inner.organism.clone();
    let filter = batch_filter(body.filter, &seen)?;
    if body
        .ids
        .as_ref()
        .is_some_and(|ids| ids.len() > MAX_BATCH as usize)
    {
        return Err(ApiError::bad_request("at most 10,000 `ids`").at("ids"));
    }
    // A filter's read takes up to `limits.max_query_ms`: off the runtime's workers.
    let (o, given) = (organism.clone(), body.ids);
    let (matched, ids) =
        super::reads::off_runtime(move || matching(&o, &filter, given, limit)).await??;
    if let Some(expected) = body.expected_count.filter(|e| *e != matched) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "count_mismatch",
            format!("{matched} threads match, not {expected}: nothing was done"),
        )
        .at("expected_count"));
    }
    let mut done = BatchDone {
        matched,
        applied: 0,
        skipped: Vec::new(),
        dry_run: body.dry_run,
    };
    for id in &ids {
        let result = if body.dry_run {
            Ok(())
        } else {
            act(
                &organism,
                &seen,
                id,
                body.action,
                &body.reason,
                patch.as_ref(),
            )
            .await
        };
        match result {
            Ok(()) => done.applied += 1,
            Err(why) => done.skipped.push(Skipped {
                id: id.clone(),
                why: crate::clip::clip(why, SKIP_WHY_BYTES),
            }),
        }
    }
    let note = format!(
        "{:?} matched {}, applied {}, skipped {}{}",
        body.action,
        done.matched,
        done.applied,
        done.skipped.len(),
        if done.dry_run { " (dry run)" } else { "" }
    )
    .to_lowercase();
    let mut response = Json(done).into_response();
    response.extensions_mut().insert(AuditNote(note));
    Ok(response)
}

/// The threads a batch acts on (at most `limit`, newest first) and how many match: those
/// `filter` finds, or those of `ids` it matches.
fn matching(
    organism: &crate::Organism,
    filter: &ThreadFilter,
    ids: Option<Vec<String>>,
    limit: u32,
) -> Result<(u64, Vec<String>), ApiError> {
    let history = organism.history();
    let Some(ids) = ids else {
        let page = Page {
            limit: limit as usize,
            offset: 0,
        };
        let found = history.query_threads(filter, page)?;
        return Ok((found.total, found.items.into_iter().map(|t| t.id).collect()));
    };
    let (mut found, mut asked) = (Vec::new(), std::collections::HashSet::new());
    for id in ids {
        if !asked.insert(id.clone()) {
            continue;
        }
        // `within` of the filter is the credential's scope.
        if history
            .thread_info(&id)?
            .is_some_and(|t| filter.matches(&t))
        {
            found.push(id);
        }
    }
    let matched = found.len() as u64;
    found.truncate(limit as usize);
    Ok((matched, found))
}

/// The filter of a batch's body, within the credential's scope.
fn batch_filter(f: BatchFilter, seen: &Seen) -> Result<ThreadFilter, ApiError> {
    let most = super::labels::MAX_Q_BYTES;
    if f.q.as_ref().is_some_and(|q| q.len() > most) {
        return Err(ApiError::bad_request(format!("at most {most} bytes")).at("filter.q"));
    }
    Ok(ThreadFilter {
        status: f.status.map(Into::into),
        agent: f.agent,
        since: time_param("filter.since", f.since.as_deref())?,
        until: time_param("filter.until", f.until.as_deref())?,
        within: seen.scope.within(),
        labels: {
            let text = |v: Vec<LabelPair>| v.into_iter().map(|p| p.0).collect::<Vec<_>>();
            let keys = |v: Vec<LabelKey>| v.into_iter().map(|k| k.0).collect::<Vec<_>>();
            let (is, not) = (text(f.label), text(f.not_label));
            tests_of(&is, &not, &keys(f.has_label), &keys(f.no_label))?
        },
        q: f.q.filter(|q| !q.is_empty()),
    })
}

/// Does `action` to thread `id`; why not, if it was not done.
async fn act(
    organism: &crate::Organism,
    seen: &Seen,
    id: &str,
    action: BatchAction,
    reason: &Option<String>,
    labels: Option<&crate::threads::LabelPatch>,
) -> Result<(), String> {
    match action {
        BatchAction::Kill => organism
            .control()
            .kill_thread(id)
            .map_err(|e| e.to_string()),
        BatchAction::Abort => super::inputs::abort(organism, seen, id, reason.clone(), "api")
            .map_err(|e| e.body.message),
        BatchAction::Pause => organism
            .control()
            .pause_thread(id)
            .map_err(|e| e.to_string()),
        BatchAction::Resume => organism
            .control()
            .resume_thread(id)
            .map_err(|e| e.to_string()),
        BatchAction::Label => organism
            .control()
            .change_labels(id, labels.unwrap_or(&Default::default()))
            .map(|_| ())
            .map_err(|e| e.to_string()),
        BatchAction::RetryFailed => {
            let (o, id) = (organism.clone(), id.to_string());
            crate::events::spawn_blocking(move || o.retry_failures(&id).map(|_| ()))
                .await
                .map_err(|e| e.to_string())?
        }
    }
}
