//! The one table of who may do what: each route's and each WebSocket command's least role.
//! README's "Security" section prints the same table; `tests/auth.rs` drives every route of
//! the served OpenAPI document through it.

pub use crate::config::Role;
use axum::http::Method;

/// A role in the API's document: one of its names.
impl utoipa::PartialSchema for Role {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "What a principal may do, each role including the ones below it.",
            ))
            .enum_values(Some(Role::ALL.map(Role::as_str)))
            .into()
    }
}

impl utoipa::ToSchema for Role {
    fn name() -> std::borrow::Cow<'static, str> {
        "Role".into()
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Anyone: health, readiness, the OpenAPI document, and the external agents' callback
    /// (which carries the agent's own token, checked by the pump).
    Open,
    /// `/metrics`: a viewer, unless `auth.public_metrics`.
    Metrics,
    /// A WebSocket stream: a viewer, whose credential may come in the first frame instead
    /// of the upgrade request (browsers cannot set headers on it).
    Stream,
    Role(Role),
}

/// What a `/ws` command acts on, from what it does (not from which fields it carries): a
/// `stop` acts on the organism whatever else the frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// The session itself (`subscribe`).
    Session,
    /// One listener (`inject`, and `pause`, `resume`, `reload` naming an agent).
    Agent,
    /// One thread (`kill`, `abort`).
    Thread,
    /// One input (`approve`, `reject`).
    Input,
    /// One message (`retry`).
    Message,
    /// The whole organism (`pause`, `resume`, `reload` naming no agent; `stop`).
    Organism,
}

/// How a rule is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A REST route: its method and template (`/api/v1/threads/{id}`).
    Route(Method, &'static str),
    /// A `/ws` command and what it acts on.
    Command(&'static str, On),
}

/// One row of the table: what a request or command needs, and whether it is about the whole
/// organism (refused to a tenant's credential whatever its role).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub via: Via,
    pub need: Need,
    pub organism_wide: bool,
}

const fn route(method: Method, path: &'static str, need: Need, organism_wide: bool) -> Rule {
    Rule {
        via: Via::Route(method, path),
        need,
        organism_wide,
    }
}

const fn command(cmd: &'static str, on: On, role: Role) -> Rule {
    Rule {
        via: Via::Command(cmd, on),
        need: Need::Role(role),
        organism_wide: matches!(on, On::Organism),
    }
}

const VIEWER: Need = Need::Role(Role::Viewer);
const OPERATOR: Need = Need::Role(Role::Operator);
const ADMIN: Need = Need::Role(Role::Admin);
const GET: Method = Method::GET;
const POST: Method = Method::POST;
const DELETE: Method = Method::DELETE;
const PATCH: Method = Method::PATCH;

/// Every REST route and every `/ws` command. A route it does not name needs an admin of no
/// tenant (closed until placed); `tests/auth.rs` checks that every route of the OpenAPI
/// document is named, and walks every row for every role, with and without a tenant.
pub const TABLE: &[Rule] = &[
    route(GET, "/healthz", Need::Open, false),
    route(GET, "/readyz", Need::Open, false),
    route(GET, "/api/v1/openapi.json", Need::Open, false),
    // The external agents' callback carries the agent's own token, checked by the pump.
    route(
        POST,
        "/api/v1/external/{agent}/threads/{thread_id}/messages",
        Need::Open,
        false,
    ),
    route(GET, "/metrics", Need::Metrics, true),
    route(GET, "/ws", Need::Stream, false),
    route(GET, "/ws/messages", Need::Stream, false),
    route(GET, "/api/v1/organism", VIEWER, false),
    route(GET, "/api/v1/me", VIEWER, false),
    route(GET, "/api/v1/models", VIEWER, false),
    route(GET, "/api/v1/usage", VIEWER, false),
    route(GET, "/api/v1/usage/budgets", VIEWER, false),
    route(GET, "/api/v1/organism/config", VIEWER, true),
    route(GET, "/api/v1/agents", VIEWER, false),
    route(GET, "/api/v1/agents/{name}", VIEWER, false),
    route(GET, "/api/v1/agents/{name}/config", VIEWER, false),
    route(GET, "/api/v1/agents/{name}/schema", VIEWER, false),
    route(GET, "/api/v1/agents/{name}/fields", VIEWER, false),
    route(GET, "/api/v1/agents/{name}/scripts", VIEWER, false),
    route(
        GET,
        "/api/v1/agents/{name}/scripts/{version}",
        VIEWER,
        false,
    ),
    route(GET, "/api/v1/agents/{name}/deployments", VIEWER, false),
    route(GET, "/api/v1/threads", VIEWER, false),
    route(GET, "/api/v1/threads/count", VIEWER, false),
    route(GET, "/api/v1/threads/{id}", VIEWER, false),
    route(GET, "/api/v1/threads/{id}/messages", VIEWER, false),
    route(GET, "/api/v1/threads/{id}/events", VIEWER, false),
    route(POST, "/api/v1/stream-tokens", VIEWER, false),
    route(GET, "/api/v1/messages", VIEWER, false),
    route(GET, "/api/v1/messages/{id}", VIEWER, false),
    route(POST, "/api/v1/inject", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/kill", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/abort", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/fork", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/rewind", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/pause", OPERATOR, false),
    route(POST, "/api/v1/threads/{id}/resume", OPERATOR, false),
    route(PATCH, "/api/v1/threads/{id}", OPERATOR, false),
    route(POST, "/api/v1/messages/{id}/retry", OPERATOR, false),
    route(POST, "/api/v1/messages/retry", OPERATOR, false),
    route(POST, "/api/v1/threads/batch", OPERATOR, false),
    route(GET, "/api/v1/inputs", VIEWER, false),
    route(GET, "/api/v1/inputs/{id}", VIEWER, false),
    route(POST, "/api/v1/inputs/{id}/approve", OPERATOR, false),
    route(POST, "/api/v1/inputs/{id}/reject", OPERATOR, false),
    route(POST, "/api/v1/inputs/{id}/answer", OPERATOR, false),
    route(POST, "/api/v1/agents/{name}/pause", OPERATOR, false),
    route(POST, "/api/v1/agents/{name}/resume", OPERATOR, false),
    route(POST, "/api/v1/agents/{name}/reload", OPERATOR, false),
    route(POST, "/api/v1/agents", OPERATOR, false),
    route(DELETE, "/api/v1/agents/{name}", OPERATOR, false),
    route(POST, "/api/v1/agents/{name}/scripts", OPERATOR, false),
    route(POST, "/api/v1/agents/{name}/deployments", OPERATOR, false),
    route(
        POST,
        "/api/v1/agents/{name}/scripts/{version}/test",
        OPERATOR,
        false,
    ),
    route(POST, "/api/v1/organism/pause", ADMIN, true),
    route(POST, "/api/v1/organism/resume", ADMIN, true),
    route(POST, "/api/v1/organism/reload", ADMIN, true),
    route(POST, "/api/v1/organism/stop", ADMIN, true),
    route(GET, "/api/v1/keys", ADMIN, true),
    route(POST, "/api/v1/keys", ADMIN, true),
    route(DELETE, "/api/v1/keys/{name}", ADMIN, true),
    route(GET, "/api/v1/audit", ADMIN, true),
    command("subscribe", On::Session, Role::Viewer),
    command("inject", On::Agent, Role::Operator),
    command("kill", On::Thread, Role::Operator),
    command("abort", On::Thread, Role::Operator),
    command("settings", On::Thread, Role::Operator),
    command("retry", On::Message, Role::Operator),
    command("fork", On::Thread, Role::Operator),
    command("rewind", On::Thread, Role::Operator),
    command("approve", On::Input, Role::Operator),
    command("reject", On::Input, Role::Operator),
    command("answer", On::Input, Role::Operator),
    command("pause", On::Agent, Role::Operator),
    command("resume", On::Agent, Role::Operator),
    command("reload", On::Agent, Role::Operator),
    command("pause", On::Organism, Role::Admin),
    command("resume", On::Organism, Role::Admin),
    command("reload", On::Organism, Role::Admin),
    command("stop", On::Organism, Role::Admin),
];

/// What a route the table does not name gets: an admin's, and not a tenant's.
static UNLISTED: Rule = route(Method::OPTIONS, "", ADMIN, true);

/// The rule of a request to `path` (the route's template, such as `/api/v1/threads/{id}`)
/// with `method`; a route the table does not name is closed to all but an admin of no
/// tenant until it is placed.
pub fn route_rule(method: &Method, path: &str) -> &'static Rule {
    TABLE
        .iter()
        .find(|r| matches!(&r.via, Via::Route(m, p) if m == method && *p == path))
        .unwrap_or(&UNLISTED)
}

/// The least a request to `path` with `method` needs ([`route_rule`]).
pub fn route_need(method: &Method, path: &str) -> Need {
    route_rule(method, path).need
}

/// Whether a route is about the whole organism (not for a tenant's credential).
pub fn organism_wide(method: &Method, path: &str) -> bool {
    route_rule(method, path).organism_wide
}

/// The rule of a `/ws` command acting on `on`; `None` for a command the table does not know
/// (answered as unknown).
pub fn command_rule(cmd: &str, on: On) -> Option<&'static Rule> {
    TABLE
        .iter()
        .find(|r| matches!(&r.via, Via::Command(c, o) if *c == cmd && *o == on))
}

/// The least role any form of `cmd` needs: checked before the frame is read, so a role too
/// low is told 403 whatever else the frame holds.
pub fn command_least(cmd: &str) -> Option<Role> {
    TABLE
        .iter()
        .filter_map(|r| match (&r.via, r.need) {
            (Via::Command(c, _), Need::Role(role)) if *c == cmd => Some(role),
            _ => None,
        })
        .min()
}
