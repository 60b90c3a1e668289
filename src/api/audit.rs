//! `GET /api/v1/audit` (admin, organism-wide): the audit log, newest first, with filters and
//! pages like `/messages`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorResponse, Params};
use super::view::{Paged, Timestamp};
use super::ApiState;
use crate::store::audit::{AuditFilter, AuditRow};

/// One entry of the audit log.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub timestamp: Timestamp,
    /// The principal (`key:NAME`, a token's `sub`); null for a refused credential.
    pub who: Option<String>,
    pub role: Option<String>,
    pub tenant: Option<String>,
    /// `POST /api/v1/organism/pause`, `ws pause`, `authenticate`, …
    pub action: String,
    /// The request's path, or the agent, thread or key a command named.
    pub target: Option<String>,
    /// The answer's status, `ack`, or why a credential was refused.
    pub result: String,
    /// The client's address.
    pub remote: Option<String>,
}

impl From<AuditRow> for AuditEntry {
    fn from(r: AuditRow) -> Self {
        AuditEntry {
            timestamp: r.ts.into(),
            who: r.who,
            role: r.role,
            tenant: r.tenant,
            action: r.action,
            target: r.target,
            result: r.result,
            remote: r.remote,
        }
    }
}

/// Filters of `/audit`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// The principal.
    pub who: Option<String>,
    /// An action's exact text, or its first word (`POST`, `ws`, `authenticate`).
    pub action: Option<String>,
    /// At or after (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Before (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "keys", params(AuditQuery),
    responses((status = 200, description = "The audit log, newest first", body = Paged<AuditEntry>),
              (status = 400, description = "Bad query parameter", body = ErrorResponse),
              (status = 409, description = "The organism has no `auth.methods`: nothing is audited", body = ErrorResponse)))]
pub async fn list_audit(
    State(s): State<ApiState>,
    Params(q): Params<AuditQuery>,
) -> Result<Json<Paged<AuditEntry>>, ApiError> {
    let Some(auth) = s.inner.auth.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "audit_off",
            "the organism has no auth.methods: every client is the implicit admin, and nothing is audited",
        ));
    };
    let filter = AuditFilter {
        who: q.who,
        action: q.action,
        since: super::rest::time_param("since", q.since.as_deref())?,
        until: super::rest::time_param("until", q.until.as_deref())?,
    };
    let page = super::rest::page(q.limit, q.offset);
    let rows = tokio::task::spawn_blocking(move || auth.audit.page(&filter, page))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    Ok(Json(Paged::map(rows, AuditEntry::from)))
}
