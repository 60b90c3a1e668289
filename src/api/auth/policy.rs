//! The one table of who may do what: each route's and each WebSocket command's least role.
//! README's "Security" section prints the same table; `tests/auth.rs` drives every route of
//! the served OpenAPI document through it.

use axum::http::Method;
use serde::{Deserialize, Serialize};

/// What a principal may do, each role including the ones below it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every read: GETs, `/ws` without commands, `/ws/messages`.
    Viewer,
    /// Adds inject, pause and resume of agents, kill, agent reload.
    Operator,
    /// Adds organism pause, resume, reload and stop, keys.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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

/// Routes whose need is not "GET: viewer, anything else: admin".
const ROUTES: &[(Method, &str, Need)] = &[
    (Method::GET, "/healthz", Need::Open),
    (Method::GET, "/readyz", Need::Open),
    (Method::GET, "/api/v1/openapi.json", Need::Open),
    (
        Method::POST,
        "/api/v1/external/{agent}/threads/{thread_id}/messages",
        Need::Open,
    ),
    (Method::GET, "/metrics", Need::Metrics),
    (Method::GET, "/ws", Need::Stream),
    (Method::GET, "/ws/messages", Need::Stream),
    (Method::GET, "/api/v1/keys", Need::Role(Role::Admin)),
    (Method::GET, "/api/v1/audit", Need::Role(Role::Admin)),
    (Method::POST, "/api/v1/inject", Need::Role(Role::Operator)),
    (
        Method::POST,
        "/api/v1/threads/{id}/kill",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/pause",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/resume",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/reload",
        Need::Role(Role::Operator),
    ),
    (Method::POST, "/api/v1/agents", Need::Role(Role::Operator)),
    (
        Method::DELETE,
        "/api/v1/agents/{name}",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/scripts",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/deployments",
        Need::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/agents/{name}/scripts/{version}/test",
        Need::Role(Role::Operator),
    ),
];

/// The least a request to `path` (the route's template, such as `/api/v1/threads/{id}`)
/// with `method` needs. A route the table does not name needs a viewer to read it and an
/// admin for anything else, so a new control route is closed until it is placed.
pub fn route_need(method: &Method, path: &str) -> Need {
    ROUTES
        .iter()
        .find(|(m, p, _)| m == method && *p == path)
        .map(|(_, _, n)| *n)
        .unwrap_or(if matches!(*method, Method::GET | Method::HEAD) {
            Need::Role(Role::Viewer)
        } else {
            Need::Role(Role::Admin)
        })
}

/// Routes about the whole organism, which a tenant's credential may not use whatever its
/// role: its file, its control, its keys, its metrics.
const ORGANISM_WIDE: &[(Method, &str)] = &[
    (Method::GET, "/api/v1/organism/config"),
    (Method::GET, "/metrics"),
    (Method::GET, "/api/v1/keys"),
    (Method::GET, "/api/v1/audit"),
    (Method::POST, "/api/v1/keys"),
    (Method::DELETE, "/api/v1/keys/{name}"),
    (Method::POST, "/api/v1/organism/pause"),
    (Method::POST, "/api/v1/organism/resume"),
    (Method::POST, "/api/v1/organism/reload"),
    (Method::POST, "/api/v1/organism/stop"),
];

/// Whether a route is about the whole organism (not for a tenant's credential).
pub fn organism_wide(method: &Method, path: &str) -> bool {
    ORGANISM_WIDE.iter().any(|(m, p)| m == method && *p == path)
}

/// The least role a `/ws` command needs. `agent` says whether it names one listener
/// (`pause`, `resume`, `reload`), which an operator may do, rather than the organism (which
/// needs an admin without a tenant, as [`organism_wide`] routes do). An unknown command needs
/// nothing: it is answered as unknown.
pub fn command_need(cmd: &str, agent: bool) -> Role {
    match cmd {
        "inject" | "kill" => Role::Operator,
        "pause" | "resume" | "reload" if agent => Role::Operator,
        "pause" | "resume" | "reload" | "stop" => Role::Admin,
        _ => Role::Viewer,
    }
}

/// Whether a `/ws` command acts on the whole organism.
pub fn command_organism_wide(cmd: &str, agent: bool) -> bool {
    matches!(cmd, "pause" | "resume" | "reload" | "stop") && !agent
}
