//! Humans in the loop over HTTP. The inbox: `GET /api/v1/inputs` (a page, newest first,
//! filtered), `GET /api/v1/inputs/{id}`, and the decisions `POST …/{id}/approve` (with a
//! payload: an edit) and `POST …/{id}/reject`. Viewers read; deciding needs the gate's
//! approvers (an operator by default). A tenant's credential sees and decides only its
//! tenant's inputs; any other answers 404, as what does not exist. And
//! `POST /api/v1/threads/{id}/abort`: stop a thread's work and keep the thread usable.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{unknown_thread, Seen, VisibleThread};
use super::error::{ApiError, ErrorResponse, JsonBody, Params};
use super::rest::page;
use super::view::{InputKind, InputStatus, Paged, Timestamp};
use super::ApiState;
use crate::pump::{Answer, DecideError, Decider, Verdict};
use crate::threads::{InputFilter, InputRow};

type ApiResult<T> = Result<T, ApiError>;

/// An input: a message held at an approval gate, and its decision once taken.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Input {
    pub id: String,
    pub kind: InputKind,
    pub status: InputStatus,
    pub thread_id: String,
    /// The held message.
    pub message_id: String,
    /// The listener whose gate holds it.
    pub listener: String,
    /// The held message's sender.
    pub from: String,
    pub payload_type: String,
    /// The held payload as JSON, typed by the listener's schema.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    pub payload_xml: String,
    /// The gate's `prompt`, filled from the payload.
    pub prompt: Option<String>,
    pub created_at: Timestamp,
    /// When the gate's `on_timeout` applies; `null`: never (`on_timeout: keep`).
    pub expires_at: Option<Timestamp>,
    /// What a decider may do with it now: `approve`, `reject`, `edit`.
    pub allow: Vec<String>,
    /// `key:NAME`, a token's subject, `timeout`, or `system`.
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
    /// `approve`, `edit` or `reject`; for a cancellation, its cause.
    pub decision: Option<String>,
    pub reason: Option<String>,
    /// The message an edit let through instead of the held one.
    pub result_message_id: Option<String>,
    /// What a decision may send, while the input is open: for a question, each receiver
    /// and payload type an answer may be (the listener's peers in its scope, and the one
    /// who asked); for a held message, the types an edit may be. Each names where its
    /// fields are described (`GET /agents/{to}/fields?type=T`).
    pub answers: Vec<AnswerTarget>,
}

/// A receiver and a payload type a decision may send.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AnswerTarget {
    pub to: String,
    pub payload_type: String,
    /// The route describing the type's fields.
    pub fields: String,
}

/// What the open input `r` may send: an edit's types, or an answer's receivers and types.
fn answer_targets(r: &InputRow, config: &crate::config::OrganismConfig) -> Vec<AnswerTarget> {
    let target = |to: &crate::config::ListenerConfig, t: &crate::xml::PayloadType| AnswerTarget {
        to: to.name.to_string(),
        payload_type: t.to_string(),
        fields: format!("/api/v1/agents/{}/fields?type={}", to.name, t.local_name()),
    };
    let Some(me) = config.listener(&r.listener) else {
        return Vec::new();
    };
    if r.kind == crate::threads::InputKind::Approval {
        return me.accepts.iter().map(|(t, _)| target(me, t)).collect();
    }
    config
        .listeners
        .iter()
        .filter(|to| to.name != me.name)
        .filter(|to| {
            let asked = to.name.as_str() == &*r.from;
            let named = me.names_peer(to.name.as_str());
            asked || ((me.peers.is_none() || named) && me.may_reach(to, named))
        })
        .flat_map(|to| to.accepts.iter().map(move |(t, _)| target(to, t)))
        .collect()
}

impl Input {
    pub fn of(r: &InputRow, organism: &crate::Organism) -> Self {
        let schemas = organism.schemas();
        let schema = schemas.get(&r.listener, &r.payload_type);
        let open = r.status == crate::threads::InputStatus::Open;
        let answers = if open {
            answer_targets(r, &organism.config())
        } else {
            Vec::new()
        };
        let allow = if open {
            organism
                .inputs()
                .allowed(&r.id)
                .iter()
                .map(|d| d.to_string())
                .collect()
        } else {
            Vec::new()
        };
        Input {
            id: r.id.to_string(),
            kind: r.kind.into(),
            status: r.status.into(),
            thread_id: r.thread_id.to_string(),
            message_id: r.message_id.to_string(),
            listener: r.listener.to_string(),
            from: r.from.to_string(),
            payload_type: r.payload_type.to_string(),
            payload: crate::schema::payload_json(schema.map(|s| &**s), &r.payload_xml),
            payload_xml: r.payload_xml.to_string(),
            prompt: r.prompt.clone(),
            created_at: r.created.into(),
            expires_at: r.expires.map(Into::into),
            allow,
            decided_by: r.decided_by.clone(),
            decided_at: r.decided.map(Into::into),
            decision: r.decision.clone(),
            reason: r.reason.clone(),
            result_message_id: r.result.clone(),
            answers,
        }
    }
}

/// An input without its payload, as a `connected` frame (the pump's and a gateway's)
/// lists it: bounded whatever the payloads weigh.
pub fn summary(r: &InputRow) -> serde_json::Value {
    serde_json::json!({
        "id": r.id,
        "kind": InputKind::from(r.kind),
        "status": InputStatus::from(r.status),
        "thread_id": r.thread_id,
        "message_id": r.message_id,
        "listener": r.listener,
        "from": r.from,
        "payload_type": r.payload_type,
        "prompt": r.prompt,
        "created_at": Timestamp::from(r.created),
        "expires_at": r.expires.map(Timestamp::from),
    })
}

/// Filters of `/inputs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InputQuery {
    pub status: Option<InputStatus>,
    /// The listener whose gate holds it.
    pub listener: Option<String>,
    /// Thread id.
    pub thread: Option<String>,
    pub kind: Option<InputKind>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

/// A decision's body: why (kept on the input and in the audit log), and for an approval,
/// optionally the payload to let through instead (an edit), as JSON or as XML.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Why: kept on the input (at most `limits.max_error_bytes`).
    pub reason: Option<String>,
    /// The edited payload as JSON (approve only), written as the held type's XML.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
    /// The edited payload as XML (approve only).
    pub payload_xml: Option<String>,
    /// The edited payload's type, when `payload` is JSON and the listener accepts several.
    pub payload_type: Option<String>,
}

/// One payload of an answer: JSON or XML, and where it goes.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerPayload {
    /// The payload as JSON, written as the XML of `payload_type` (or the one type its
    /// receiver accepts); its receiver is `to`, or the one who asked.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
    /// The payload as XML.
    pub payload_xml: Option<String>,
    pub payload_type: Option<String>,
    /// Send it to this listener; without it, it is routed as the human listener's output
    /// (by type among its peers, or back to the one who asked).
    pub to: Option<String>,
}

/// An answer's body: one payload (`payload` or `payload_xml`, with `payload_type` and
/// `to`), or several (`payloads`). All are checked before any is routed.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
    pub payload_xml: Option<String>,
    pub payload_type: Option<String>,
    pub to: Option<String>,
    /// Several payloads, routed in order.
    pub payloads: Option<Vec<AnswerPayload>>,
    /// Kept on the input.
    pub reason: Option<String>,
}

/// Payloads one answer may hold.
pub const MAX_ANSWER_PAYLOADS: usize = 100;

/// A rejection's body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectBody {
    /// Why: kept on the input and in the declined message's error (at most
    /// `limits.max_error_bytes`).
    pub reason: Option<String>,
}

fn decider(seen: &Seen) -> Decider {
    let p = &seen.principal;
    Decider {
        name: p.name.clone(),
        role: p.role,
        tenant: p.tenant.clone(),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_input",
        format!("no input `{id}`"),
    )
    .at("id")
}

impl From<DecideError> for ApiError {
    fn from(e: DecideError) -> Self {
        let message = e.to_string();
        match e {
            DecideError::NotFound(id) => not_found(&id),
            DecideError::AlreadyDecided(first) => {
                let first = serde_json::json!({
                    "status": InputStatus::from(first.status),
                    "decided_by": first.decided_by,
                    "decision": first.decision,
                    "reason": first.reason,
                    "decided_at": first.decided.map(Timestamp::from),
                });
                ApiError::new(StatusCode::CONFLICT, "already_decided", message)
                    .details(vec![first.to_string()])
            }
            DecideError::NotAnApprover(_) => {
                ApiError::new(StatusCode::FORBIDDEN, "not_an_approver", message)
            }
            DecideError::NotAllowed { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "decision_not_allowed", message)
            }
            DecideError::Invalid(e) => ApiError::from(e),
            DecideError::InvalidAnswer(problems) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payload", message)
                    .details(problems)
                    .at("payloads")
            }
            DecideError::Stopping => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", message)
            }
            DecideError::Store(e) => ApiError::from(e),
        }
    }
}

#[utoipa::path(get, path = "/api/v1/inputs", tag = "inputs", params(InputQuery),
    responses((status = 200, description = "Inputs, newest first", body = Paged<Input>),
              (status = 400, description = "A bad query parameter", body = ErrorResponse)))]
pub async fn list_inputs(
    State(s): State<ApiState>,
    seen: Seen,
    Params(q): Params<InputQuery>,
) -> ApiResult<Json<Paged<Input>>> {
    let kind = q.kind.map(Into::into);
    let filter = InputFilter {
        status: q.status.map(Into::into),
        listener: q.listener,
        thread: q.thread,
        kind,
        tenant: seen.principal.tenant.clone(),
    };
    let organism = &s.inner.organism;
    let found = organism
        .inputs()
        .list(&filter, page(q.limit, q.offset))
        .map_err(ApiError::from)?;
    Ok(Json(Paged::map(found, |r| Input::of(&r, organism))))
}

/// The input `id` as `seen` may see it (a tenant's own), or 404.
fn visible(organism: &crate::Organism, seen: &Seen, id: &str) -> ApiResult<InputRow> {
    organism
        .inputs()
        .get(id)?
        .filter(|r| seen.principal.tenant.is_none() || r.tenant == seen.principal.tenant)
        .ok_or_else(|| not_found(id))
}

#[utoipa::path(get, path = "/api/v1/inputs/{id}", tag = "inputs",
    params(("id" = String, Path, description = "Input id")),
    responses((status = 200, description = "The input", body = Input),
              (status = 404, description = "No such input (in this credential's scope)", body = ErrorResponse),
              (status = 503, description = "`store_failed`: the store could not be read", body = ErrorResponse)))]
pub async fn get_input(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
) -> ApiResult<Json<Input>> {
    let row = visible(&s.inner.organism, &seen, &id)?;
    Ok(Json(Input::of(&row, &s.inner.organism)))
}

/// The edited payload of an approval, as XML: `payload_xml`, or `payload` (JSON) written as
/// the type the listener accepts (`payload_type`, else the held message's).
fn edited_xml(
    organism: &crate::Organism,
    row: &InputRow,
    body: &DecisionBody,
) -> ApiResult<Option<String>> {
    match (&body.payload, &body.payload_xml) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "give `payload` (JSON) or `payload_xml`, not both",
        )
        .at("payload")),
        (None, Some(xml)) => Ok(Some(xml.clone())),
        (Some(json), None) => {
            let wanted = body.payload_type.as_deref().unwrap_or(&row.payload_type);
            let config = organism.config();
            let listener = config.listener(&row.listener).ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "unknown_listener",
                    format!(
                        "`{}` was removed by a reload: its held message cannot be edited",
                        row.listener
                    ),
                )
            })?;
            super::inject::json_to_xml(listener, Some(wanted), json).map(Some)
        }
    }
}

#[utoipa::path(post, path = "/api/v1/inputs/{id}/approve", tag = "inputs",
    params(("id" = String, Path, description = "Input id")), request_body = DecisionBody,
    responses((status = 200, description = "Approved: the message is queued (or, with a payload, the edited one)", body = Input),
              (status = 403, description = "Not one of the gate's approvers, or a decision the gate does not allow", body = ErrorResponse),
              (status = 404, description = "No such input (in this credential's scope)", body = ErrorResponse),
              (status = 409, description = "Already decided: `details` carries the first decision", body = ErrorResponse),
              (status = 422, description = "The edited payload is malformed or invalid", body = ErrorResponse),
              (status = 503, description = "`stopping`: the organism is stopping; `store_failed`: the store could not be read", body = ErrorResponse)))]
pub async fn approve_input(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
    body: Option<JsonBody<DecisionBody>>,
) -> ApiResult<Json<Input>> {
    let body = body.map(|JsonBody(b)| b).unwrap_or_default();
    let row = approve(&s.inner.organism, &seen, &id, body).await?;
    Ok(Json(Input::of(&row, &s.inner.organism)))
}

/// A decision's answer, once the store has committed it: a 200 means it is on disk (at most
/// [`crate::pump::READ_CATCH_UP`] later; the decision holds in memory either way).
async fn on_disk(organism: &crate::Organism, row: std::sync::Arc<InputRow>) -> ApiResult<InputRow> {
    if let Some(store) = organism.history().store() {
        store.committed(crate::pump::READ_CATCH_UP).await;
    }
    Ok(std::sync::Arc::unwrap_or_clone(row))
}

/// Approves the input `id` as `seen` (REST and `/ws`): with a payload, an edit.
pub(super) async fn approve(
    organism: &crate::Organism,
    seen: &Seen,
    id: &str,
    body: DecisionBody,
) -> ApiResult<InputRow> {
    let row = visible(organism, seen, id)?;
    let payload_xml = edited_xml(organism, &row, &body)?;
    let row = organism.inputs().decide(
        id,
        &decider(seen),
        Verdict::Approve {
            reason: body.reason,
            payload_xml,
        },
    )?;
    on_disk(organism, row).await
}

/// Rejects the input `id` as `seen` (REST and `/ws`).
pub(super) async fn reject(
    organism: &crate::Organism,
    seen: &Seen,
    id: &str,
    reason: Option<String>,
) -> ApiResult<InputRow> {
    visible(organism, seen, id)?;
    let row = organism
        .inputs()
        .decide(id, &decider(seen), Verdict::Reject { reason })?;
    on_disk(organism, row).await
}

#[utoipa::path(post, path = "/api/v1/inputs/{id}/reject", tag = "inputs",
    params(("id" = String, Path, description = "Input id")), request_body = RejectBody,
    responses((status = 200, description = "Rejected: the message is `declined`", body = Input),
              (status = 403, description = "Not one of the gate's approvers, or a decision the gate does not allow", body = ErrorResponse),
              (status = 404, description = "No such input (in this credential's scope)", body = ErrorResponse),
              (status = 409, description = "Already decided: `details` carries the first decision", body = ErrorResponse),
              (status = 503, description = "`stopping`: the organism is stopping; `store_failed`: the store could not be read", body = ErrorResponse)))]
pub async fn reject_input(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
    body: Option<JsonBody<RejectBody>>,
) -> ApiResult<Json<Input>> {
    let body = body.map(|JsonBody(b)| b).unwrap_or_default();
    let row = reject(&s.inner.organism, &seen, &id, body.reason).await?;
    Ok(Json(Input::of(&row, &s.inner.organism)))
}

#[utoipa::path(post, path = "/api/v1/inputs/{id}/answer", tag = "inputs",
    params(("id" = String, Path, description = "Input id")), request_body = AnswerBody,
    responses((status = 200, description = "Answered: the payloads are routed as the human listener's outputs", body = Input),
              (status = 403, description = "Not one of the listener's approvers, or not a question", body = ErrorResponse),
              (status = 404, description = "No such input (in this credential's scope)", body = ErrorResponse),
              (status = 409, description = "Already answered: `details` carries the first decision", body = ErrorResponse),
              (status = 422, description = "A payload is malformed, has no route, or is invalid: nothing was routed", body = ErrorResponse),
              (status = 503, description = "`stopping`: the organism is stopping; `store_failed`: the store could not be read", body = ErrorResponse)))]
pub async fn answer_input(
    State(s): State<ApiState>,
    seen: Seen,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<AnswerBody>,
) -> ApiResult<Json<Input>> {
    let row = answer(&s.inner.organism, &seen, &id, body).await?;
    Ok(Json(Input::of(&row, &s.inner.organism)))
}

/// Answers the question `id` as `seen` (REST and `/ws`).
pub(super) async fn answer(
    organism: &crate::Organism,
    seen: &Seen,
    id: &str,
    body: AnswerBody,
) -> ApiResult<InputRow> {
    let row = visible(organism, seen, id)?;
    let single = AnswerPayload {
        payload: body.payload,
        payload_xml: body.payload_xml,
        payload_type: body.payload_type,
        to: body.to,
    };
    let given = single.payload.is_some() || single.payload_xml.is_some();
    let parts = match (given, body.payloads) {
        (true, Some(_)) => {
            return Err(ApiError::bad_request(
                "give one payload (`payload` or `payload_xml`) or `payloads`, not both",
            )
            .at("payloads"))
        }
        (true, None) => vec![single],
        (false, Some(many)) => many,
        (false, None) => {
            return Err(ApiError::bad_request(
                "an answer needs `payload`, `payload_xml` or `payloads`",
            )
            .at("payload"))
        }
    };
    if parts.len() > MAX_ANSWER_PAYLOADS {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "too_many_payloads",
            format!(
                "an answer holds at most {MAX_ANSWER_PAYLOADS} payloads (this one {})",
                parts.len()
            ),
        )
        .at("payloads"));
    }
    let config = organism.config();
    let mut answers = Vec::with_capacity(parts.len());
    for (i, p) in parts.into_iter().enumerate() {
        let at = format!("payloads[{i}]");
        let payload_xml = match (p.payload, p.payload_xml) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give `payload` (JSON) or `payload_xml`, not both",
                )
                .at(at))
            }
            (None, None) => {
                return Err(
                    ApiError::bad_request("a payload needs `payload` or `payload_xml`").at(at),
                )
            }
            (None, Some(xml)) => xml,
            (Some(json), None) => {
                let target = p.to.as_deref().unwrap_or(&row.from);
                let listener = config
                    .listener(target)
                    .filter(|_| seen.scope.sees(target))
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "no_schema",
                            format!("`{target}` is not a listener whose schema can write JSON as XML: give `payload_xml`"),
                        )
                        .at(at.clone())
                    })?;
                super::inject::json_to_xml(listener, p.payload_type.as_deref(), &json)?
            }
        };
        answers.push(Answer {
            payload_xml,
            to: p.to,
        });
    }
    let row = organism
        .inputs()
        .answer(id, &decider(seen), answers, body.reason)?;
    on_disk(organism, row).await
}

/// An abort's body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbortBody {
    /// Why: the error of every message the abort stops (at most `limits.max_error_bytes`).
    pub reason: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/threads/{id}/abort", tag = "control",
    params(("id" = String, Path, description = "Thread id")), request_body = AbortBody,
    responses((status = 200, description = "Aborted: running handlers cancelled, queued and held messages `killed`, open inputs cancelled; the next inject revives it", body = super::view::Thread),
              (status = 404, description = "No such thread", body = ErrorResponse),
              (status = 409, description = "The thread was killed", body = ErrorResponse)))]
pub async fn abort_thread(
    State(s): State<ApiState>,
    seen: Seen,
    VisibleThread { id, .. }: VisibleThread,
    body: Option<JsonBody<AbortBody>>,
) -> ApiResult<Json<super::view::Thread>> {
    let body = body.map(|JsonBody(b)| b).unwrap_or_default();
    let organism = &s.inner.organism;
    abort(organism, &seen, &id, body.reason, "api")?;
    organism
        .threads()
        .info(&id)
        .map(|t| Json(t.into()))
        .ok_or_else(|| unknown_thread(&id))
}

/// Aborts thread `id` (already found visible) as `seen`, whose identity without a name is
/// `default`: every message it stops says who and why.
pub(super) fn abort(
    organism: &crate::Organism,
    seen: &Seen,
    id: &str,
    reason: Option<String>,
    default: &str,
) -> ApiResult<()> {
    let who = seen.principal.identity(default);
    let why = match reason {
        Some(r) => format!("aborted by {who}: {r}"),
        None => format!("aborted by {who}"),
    };
    let why = crate::clip::clip(why, organism.config().limits.max_error_bytes);
    organism.control().abort_thread(id, &why)?;
    Ok(())
}
