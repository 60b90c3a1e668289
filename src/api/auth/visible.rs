//! Extractors that hand a handler only what its principal may see: the principal's
//! [`Scope`], a listener named in the path ([`VisibleAgent`]), a thread named in the path
//! ([`VisibleThread`]). What is not visible is refused exactly as what does not exist.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::{Principal, Scope};
use crate::api::{ApiError, ApiState};
use crate::pump::ControlError;
use crate::threads::ThreadInfo;

/// The principal of a request (every routed request has one; see `guard`).
fn principal(parts: &Parts) -> Principal {
    parts
        .extensions
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Principal::implicit)
}

/// The principal and what it may see now.
pub struct Seen {
    pub principal: Principal,
    pub scope: Scope,
}

impl FromRequestParts<ApiState> for Seen {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &ApiState) -> Result<Self, ApiError> {
        let principal = principal(parts);
        let scope = principal.scope(&s.inner.organism.config());
        Ok(Seen { principal, scope })
    }
}

/// The listener `{name}` of the path, if the principal sees it; else 404 `unknown_listener`,
/// as for a name that does not exist.
pub struct VisibleAgent(pub String);

impl FromRequestParts<ApiState> for VisibleAgent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &ApiState) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, s)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let seen = Seen::from_request_parts(parts, s).await?;
        if !seen.scope.sees(&name) {
            return Err(ControlError::UnknownListener(name).into());
        }
        Ok(VisibleAgent(name))
    }
}

/// The thread `{id}` of the path, if it exists and the principal sees it (one of its
/// listeners took part); else 404 `unknown_thread`.
pub struct VisibleThread {
    pub id: String,
    pub info: ThreadInfo,
    pub scope: Scope,
    /// The principal's tenant.
    pub tenant: Option<String>,
}

/// The 404 of a thread that does not exist or is not visible.
pub fn unknown_thread(id: &str) -> ApiError {
    ApiError::not_found("unknown_thread", format!("no thread `{id}`"))
}

/// How the id of a thread a tenant's credential opens with an id of its choosing begins
/// (`acme-`), so that no tenant takes, or learns of, an id another tenant chose. `None` for
/// a tenant whose name holds a `.`, which ids may not: its new threads' ids are the server's.
fn chosen_id_prefix(tenant: &str) -> Option<String> {
    let fits = tenant
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    (fits && !tenant.is_empty()).then(|| format!("{tenant}-"))
}

/// Whether a credential of `tenant` may choose `id` for a new thread or message: it begins
/// with the tenant's [`chosen_id_prefix`].
fn may_choose(tenant: &str, id: &str) -> bool {
    chosen_id_prefix(tenant).is_some_and(|p| id.starts_with(&p))
}

/// Refuses `id`, given as `{what}_id` for a new `what` (thread, message), with `400
/// invalid_{what}_id` unless it is an id (`threads::ID_RULE`) and, chosen by a credential of
/// `tenant` (none: organism-wide, which chooses any), begins with the tenant's
/// [`chosen_id_prefix`]. Asked before the id is looked up, so that a tenant learns nothing
/// of another's ids.
pub fn chosen_id(tenant: Option<&str>, id: &str, what: &str) -> Result<(), ApiError> {
    let rule = if !crate::threads::valid_thread_id(id) {
        format!("{what}_id {}", crate::threads::ID_RULE)
    } else if let Some(tenant) = tenant.filter(|t| !may_choose(t, id)) {
        chosen_id_rule(tenant, what)
    } else {
        return Ok(());
    };
    let code = format!("invalid_{what}_id");
    Err(ApiError::new(axum::http::StatusCode::BAD_REQUEST, &code, rule).at(format!("{what}_id")))
}

/// What a tenant's credential may choose as the id of a new `what` (thread, message), said
/// where one is refused.
fn chosen_id_rule(tenant: &str, what: &str) -> String {
    match chosen_id_prefix(tenant) {
        Some(p) => format!(
            "the id of a new {what} chosen by a credential of tenant `{tenant}` begins with `{p}`"
        ),
        None => format!(
            "a credential of tenant `{tenant}` (a name with a `.`) leaves a new {what}'s id to the server"
        ),
    }
}

/// Whether a credential of `tenant` (seeing `scope`) may name thread `t` in an inject: one
/// it sees is continued; one that does not exist is opened if its id begins with the
/// tenant's [`chosen_id_prefix`]. Any other is refused exactly as a thread that does not
/// exist, whether one does or not. An organism-wide credential names any thread.
pub fn may_name_thread(
    organism: &crate::Organism,
    scope: &Scope,
    tenant: Option<&str>,
    t: &str,
) -> Result<(), ApiError> {
    let Some(tenant) = tenant else {
        return Ok(());
    };
    match organism.history().thread_info(t)? {
        Some(info) if scope.sees_thread(&info.participants) => Ok(()),
        None if may_choose(tenant, t) => Ok(()),
        _ => Err(ApiError::not_found(
            "unknown_thread",
            format!("no thread `{t}` ({})", chosen_id_rule(tenant, "thread")),
        )
        .at("thread_id")),
    }
}

impl FromRequestParts<ApiState> for VisibleThread {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &ApiState) -> Result<Self, ApiError> {
        let Path(id) = Path::<String>::from_request_parts(parts, s)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let seen = Seen::from_request_parts(parts, s).await?;
        match s.inner.organism.history().thread_info(&id)? {
            Some(info) if seen.scope.sees_thread(&info.participants) => Ok(VisibleThread {
                id,
                info,
                scope: seen.scope,
                tenant: seen.principal.tenant,
            }),
            _ => Err(unknown_thread(&id)),
        }
    }
}

/// Whether a tenant's principal (of `principal_tenant`, seeing `scope`) sees `ev`; `thread`
/// says whether it sees the thread of that id. What `/ws` and a thread's event stream show.
pub fn sees_event(
    scope: &crate::access::Scope,
    principal_tenant: Option<&str>,
    ev: &crate::events::Event,
    thread: impl Fn(&str) -> bool,
) -> bool {
    use crate::events::EventKind;
    match &ev.kind {
        EventKind::AgentState { agent, .. } => scope.sees(agent),
        EventKind::Log { agent, .. } => scope.sees(agent),
        EventKind::Delta(d) => scope.sees(&d.agent),
        EventKind::Usage(u) => scope.sees(&u.listener),
        EventKind::Message { message } => scope.sees_message(&message.from, message.to.as_deref()),
        EventKind::MessageStatus { about: Some(a), .. } => {
            scope.sees_message(&a.from, a.to.as_deref())
        }
        EventKind::MessageStatus { thread_id, .. } => thread(thread_id),
        EventKind::ThreadUpdated { thread_id, .. } => thread(thread_id),
        EventKind::ThreadSettings { thread_id, .. }
        | EventKind::ThreadLabels { thread_id, .. }
        | EventKind::ThreadRewound { thread_id, .. } => thread(thread_id),
        EventKind::ThreadCreated { thread: t } => {
            scope.sees_thread(&t.participants) || thread(&t.id)
        }
        EventKind::Error { agent: Some(a), .. } => scope.sees(a),
        EventKind::Error {
            thread_id: Some(t), ..
        } => thread(t),
        EventKind::Reload { agent: Some(a), .. } => scope.sees(a),
        EventKind::Deployment { tenant, .. } => {
            tenant.is_some() && tenant.as_deref() == principal_tenant
        }
        EventKind::InputRequested { input } | EventKind::InputResolved { input } => {
            scope.sees(&input.listener)
        }
        EventKind::OrganismState { .. } => true,
        EventKind::Error { .. }
        | EventKind::Reload { .. }
        | EventKind::Audit { .. }
        | EventKind::Omitted => false,
    }
}
