//! Who a client is, and what it may do: checked once, at the API's edge.
//!
//! A request or WebSocket session carries one [`Principal`]: `{name, role, tenant}`, made
//! by [`guard`] (the one middleware) from whatever credential came, or the implicit admin
//! when the organism has no `auth.methods`. Nothing downstream reads credentials. What each
//! route and command needs is in [`policy`]; handlers take the principal as an extension
//! and use its name as the injector identity (SPEC §3).
//!
//! A refused credential is answered the same whatever the reason (401 with
//! `WWW-Authenticate`, no hint whether a key exists, expired or was revoked); the reason
//! goes to the log.

pub mod policy;
pub mod visible;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, ApiState};
pub(crate) use crate::access::{Authenticator, Principal, Refused, Scope};
use crate::time::Timestamp;
pub use policy::{
    command_least, command_rule, organism_wide, route_need, route_rule, Need, On, Role, Rule, Via,
    TABLE,
};
pub use visible::{
    chosen_id, may_name_thread, sees_event, unknown_thread, Seen, VisibleAgent, VisibleThread,
};

/// The longest credential read; a longer one is refused unread.
pub use crate::access::MAX_CREDENTIAL_BYTES;

/// A session that must still present its credential (a WebSocket whose upgrade carried
/// none: it has five seconds to send `{"cmd": "auth", "token": …}`).
#[derive(Debug, Clone, Copy)]
pub struct AuthPending;

/// The principal of a request's credential (`Authorization: Bearer …` or `X-API-Key: …`).
pub fn authenticate(auth: &Authenticator, headers: &HeaderMap) -> Result<Principal, Refused> {
    auth.verify(credential(headers)?)
}

/// The credential a request presents: `Authorization: Bearer …`, or `X-API-Key: …`.
fn credential(headers: &HeaderMap) -> Result<&str, Refused> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v
            .to_str()
            .map_err(|_| Refused::Invalid("Authorization is not text".into()))?;
        let (scheme, token) = v
            .split_once(' ')
            .ok_or_else(|| Refused::Invalid("Authorization is not `Bearer <credential>`".into()))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Refused::Invalid(format!(
                "Authorization scheme `{}` (expected Bearer)",
                crate::clip::clip(scheme.to_string(), 32)
            )));
        }
        return Ok(token.trim());
    }
    match headers.get("x-api-key") {
        Some(v) => v
            .to_str()
            .map(str::trim)
            .map_err(|_| Refused::Invalid("X-API-Key is not text".into())),
        None => Err(Refused::Missing),
    }
}

/// 401: the same answer whatever was wrong with the credential.
pub fn unauthorized(refused: &Refused) -> ApiError {
    let (message, challenge) = match refused {
        Refused::Missing => (
            "this needs a credential: an API key or token in `Authorization: Bearer …`",
            "Bearer realm=\"agentserver\"",
        ),
        Refused::Invalid(_) => (
            "the credential was refused",
            "Bearer realm=\"agentserver\", error=\"invalid_token\"",
        ),
    };
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).with_header(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    )
}

/// 429 with `Retry-After`: over a rate limit.
impl From<crate::access::Throttled> for ApiError {
    fn from(t: crate::access::Throttled) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", t.to_string())
            .retry_after(t.wait)
    }
}

/// 403: known, but its role is below what the action needs.
pub fn forbidden(p: &Principal, need: Role) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "this needs the role `{need}`; the credential has `{}`",
            p.role
        ),
    )
}

/// 403: a tenant's credential asked for something about the whole organism.
pub fn tenant_forbidden() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this is about the whole organism: a tenant's credential may not",
    )
}

/// Whether a request reads the history: every `GET`, and a batch (which finds what it acts
/// on by a filter).
fn reads(method: &axum::http::Method, path: &str) -> bool {
    const BATCHES: [&str; 2] = ["/api/v1/messages/retry", "/api/v1/threads/batch"];
    method == axum::http::Method::GET
        || (method == axum::http::Method::POST && BATCHES.contains(&path))
}

/// The one middleware: finds the principal of every routed request and refuses what its
/// role does not allow, before any handler runs.
pub(super) async fn guard(
    State(state): State<ApiState>,
    matched: Option<MatchedPath>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = state.inner.auth.clone() else {
        request.extensions_mut().insert(Principal::implicit());
        return next.run(request).await;
    };
    let path = matched.as_ref().map_or("", |m| m.as_str());
    let need = match route_need(request.method(), path) {
        Need::Open => return next.run(request).await,
        Need::Metrics if auth.public_metrics => return next.run(request).await,
        Need::Metrics => Role::Viewer,
        Need::Stream => match authenticate(&auth, request.headers()) {
            Err(Refused::Missing) => {
                request.extensions_mut().insert(AuthPending);
                return next.run(request).await;
            }
            Err(refused) => {
                let (response, row) = refusal(&auth, &request, refused);
                state.audit_maybe(row).await;
                return response;
            }
            Ok(p) => {
                request.extensions_mut().insert(p);
                return next.run(request).await;
            }
        },
        Need::Role(r) => r,
    };
    let p = match authenticate(&auth, request.headers()) {
        // A browser's `EventSource` cannot send `Authorization`: a thread's event stream
        // takes a stream token instead.
        Err(Refused::Missing) if path == super::stream::THREAD_EVENTS => {
            match stream_token(&state, &request) {
                Some(p) => p,
                None => {
                    let refused = Refused::Invalid("the stream token was refused".into());
                    let (response, row) = refusal(&auth, &request, refused);
                    state.audit_maybe(row).await;
                    return response;
                }
            }
        }
        Err(refused) => {
            let (response, row) = refusal(&auth, &request, refused);
            state.audit_maybe(row).await;
            return response;
        }
        Ok(p) => p,
    };
    let entry = audited(request.method(), path).then(|| Entry::of(&p, &request, path));
    let refusal = if !p.may(need) {
        tracing::info!(principal = ?p.name, %need, path, "API request forbidden");
        Some(forbidden(&p, need))
    } else if p.tenant.is_some() && organism_wide(request.method(), path) {
        tracing::info!(principal = ?p.name, path, "organism-wide request by a tenant");
        Some(tenant_forbidden())
    } else {
        None
    };
    let response = match refusal {
        Some(e) => e.into_response(),
        None => {
            // Reads take turns (`api::turns`): a tenant's, and the organism's own.
            let read = reads(request.method(), path);
            let tenant = p.tenant.clone();
            request.extensions_mut().insert(p);
            if read {
                let turn = state.inner.turns.take(tenant.as_deref(), next.run(request));
                turn.await
            } else {
                next.run(request).await
            }
        }
    };
    if let Some(entry) = entry {
        // A batch names what it matched and did.
        let status = response.status().as_u16().to_string();
        let result = match response.extensions().get::<crate::api::retry::AuditNote>() {
            Some(note) => format!("{status} {}", note.0),
            None => status,
        };
        state.audit(entry.row(result)).await;
    }
    response
}

/// The principal of the request's `?st=` stream token, for the thread of its path; the
/// token is used up.
fn stream_token(state: &ApiState, request: &Request) -> Option<Principal> {
    let token = request
        .uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("st="))?;
    let thread = request
        .uri()
        .path()
        .strip_prefix("/api/v1/threads/")?
        .strip_suffix("/events")?;
    state.inner.stream_tokens.redeem(token, thread)
}

/// Whether a request is kept in the audit log: every request that may change something,
/// but injects (they are in the message log) and the agents' callbacks.
fn audited(method: &axum::http::Method, path: &str) -> bool {
    !matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD)
        && path != "/api/v1/inject"
        && route_need(method, path) != Need::Open
}

/// The parts of an audit entry known before the answer.
struct Entry {
    who: Option<String>,
    role: Option<String>,
    tenant: Option<String>,
    action: String,
    target: String,
    remote: Option<String>,
}

impl Entry {
    fn of(p: &Principal, request: &Request, path: &str) -> Entry {
        Entry {
            who: p.name.clone(),
            role: Some(p.role.to_string()),
            tenant: p.tenant.clone(),
            action: format!("{} {path}", request.method()),
            target: request.uri().path().to_string(),
            remote: remote(request).map(|ip| ip.to_string()),
        }
    }

    fn row(self, result: String) -> crate::store::audit::AuditRow {
        crate::store::audit::AuditRow {
            ts: Timestamp::now(),
            who: self.who,
            role: self.role,
            tenant: self.tenant,
            action: self.action,
            target: Some(self.target),
            result,
            remote: self.remote,
        }
    }
}

fn remote(request: &Request) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The answer to a refused credential: 401, or 429 once its address failed too often; and
/// the audit entry to keep for a wrong credential (not a missing one), with why it was
/// refused, while its address is under its limit (so a flood cannot fill the disk).
fn refusal(
    auth: &Authenticator,
    request: &Request,
    refused: Refused,
) -> (Response, Option<crate::store::audit::AuditRow>) {
    let Refused::Invalid(why) = &refused else {
        return (unauthorized(&refused).into_response(), None);
    };
    tracing::info!(path = %request.uri().path(), "API credential refused: {why}");
    let from = remote(request);
    if let Some(ip) = from {
        if let Err(limited) = auth.limits.failed_auth(ip) {
            tracing::info!(%ip, "failed authentications over the limit");
            return (ApiError::from(limited).into_response(), None);
        }
    }
    let row = crate::store::audit::AuditRow {
        ts: Timestamp::now(),
        who: None,
        role: None,
        tenant: None,
        action: "authenticate".into(),
        target: Some(request.uri().path().to_string()),
        result: format!("401: {why}"),
        remote: from.map(|ip| ip.to_string()),
    };
    (unauthorized(&refused).into_response(), Some(row))
}

/// Writes the access rules into the OpenAPI document: the two ways to present a credential
/// (`securitySchemes`), and on each operation what it needs (`security`, `x-least-role`,
/// and its 401 and 403 answers), from the same table [`guard`] enforces. They apply when
/// the organism has `auth.methods`.
pub fn document(mut doc: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    doc["components"]["securitySchemes"] = json!({
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "An API key (`ask_…`) or a JWT"},
        "api_key": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    });
    let error =
        json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}});
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let Ok(m) = axum::http::Method::from_bytes(method.to_uppercase().as_bytes()) else {
                continue;
            };
            declare_input_refusals(op, &error);
            let (role, note) = match route_need(&m, path) {
                Need::Open => {
                    op["security"] = json!([{}]);
                    continue;
                }
                Need::Metrics => (Role::Viewer, "viewer, or anyone with `auth.public_metrics`"),
                Need::Stream => (
                    Role::Viewer,
                    "viewer; the credential may come in the upgrade request or as the first frame `{\"cmd\": \"auth\", \"token\": …}`",
                ),
                Need::Role(r) => (r, r.as_str()),
            };
            op["security"] = json!([{"bearer": []}, {"api_key": []}]);
            op["x-least-role"] = json!(role.as_str());
            let responses = &mut op["responses"];
            responses["401"] = json!({
                "description": "No credential, or one refused (with `WWW-Authenticate`)",
                "content": error,
            });
            responses["403"] = json!({
                "description": format!("The credential's role is below the least this needs: {note}"),
                "content": error,
            });
            if responses.get("429").is_none() {
                responses["429"] = json!({
                    "description": "`rate_limited`: over the credential's (or its tenant's) `inject_per_s`, or too many wrong credentials from this address; with `Retry-After`",
                    "headers": {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}},
                    "content": error,
                });
            }
        }
    }
    doc
}

/// The refusals every operation with a body, a query or a path parameter can answer before
/// its handler runs, declared where the operation does not already say more.
fn declare_input_refusals(op: &mut serde_json::Value, error: &serde_json::Value) {
    use serde_json::json;
    let params = op["parameters"].as_array().cloned().unwrap_or_default();
    let takes = |place: &str| params.iter().any(|p| p["in"] == place);
    let mut bad = Vec::new();
    if op.get("requestBody").is_some() {
        bad.push("`invalid_json`: the body is not the JSON this takes (where: line and column)");
        if op["responses"].get("415").is_none() {
            op["responses"]["415"] = json!({
                "description": "`unsupported_media_type`: the body is not `Content-Type: application/json`",
                "content": error,
            });
        }
    }
    if takes("query") {
        bad.push("`invalid_query`: a query parameter that is unknown or does not parse (where: its name)");
    }
    if takes("path") {
        bad.push("`bad_request`: a path parameter that does not parse");
    }
    if bad.is_empty() {
        return;
    }
    match op["responses"]["400"]["description"].as_str() {
        // The operation's own words first, then what any such request may get.
        Some(own) => {
            let said = format!("{own}; also {}", bad.join("; "));
            op["responses"]["400"]["description"] = json!(said);
        }
        None => {
            op["responses"]["400"] = json!({
                "description": bad.join("; "),
                "content": error,
            });
        }
    }
}
