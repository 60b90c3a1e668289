//! `GET /api/v1/usage`: the usage account's daily sums (`store::usage`), grouped as asked;
//! a tenant's credential sees its own tenant's only.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Seen;
use super::error::{ApiError, ErrorResponse, Params};
use super::rest::ApiResult;
use super::ApiState;
use crate::store::usage::{UsageQuery, UsageRow};

/// `/usage` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UsageParams {
    /// First day, `YYYY-MM-DD` (UTC), inclusive.
    #[param(pattern = r"^([0-9]{4}-[0-9]{2}-[0-9]{2})?$")]
    pub from: Option<String>,
    /// Last day, `YYYY-MM-DD` (UTC), inclusive.
    #[param(pattern = r"^([0-9]{4}-[0-9]{2}-[0-9]{2})?$")]
    pub to: Option<String>,
    /// Comma-separated: `day`, `tenant`, `listener`, `model` (none: one sum of all).
    #[param(pattern = r"^((day|tenant|listener|model)(,(day|tenant|listener|model))*)?$")]
    pub group_by: Option<String>,
    /// One tenant's (`-`: the organism's own); a tenant's credential sees only its own.
    pub tenant: Option<String>,
}

/// The sums, a row for each group.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Usage {
    pub items: Vec<UsageItem>,
}

/// One group's sums; the keys it is not grouped by are `null`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UsageItem {
    pub day: Option<String>,
    pub tenant: Option<String>,
    pub listener: Option<String>,
    pub model: Option<String>,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// By the models' `price`, in millionths of the operator's currency unit.
    pub cost_micros: u64,
    /// Calls whose tokens were estimated (the server reported none).
    pub estimated_calls: u64,
    /// Messages the listeners handled (every kind), in the group (`model`: `null`).
    pub messages: u64,
    /// Time their handlers took, in milliseconds.
    pub handler_ms: u64,
    /// CPU time of Lua listeners' sandboxes, in milliseconds (other kinds: 0).
    pub cpu_ms: u64,
}

impl From<UsageRow> for UsageItem {
    fn from(r: UsageRow) -> Self {
        UsageItem {
            day: r.day,
            tenant: r.tenant,
            listener: r.listener,
            model: r.model,
            calls: r.calls,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cached_tokens: r.cached_tokens,
            cost_micros: r.cost_micros,
            estimated_calls: r.estimated_calls,
            messages: r.messages,
            handler_ms: r.handler_us / 1000,
            cpu_ms: r.cpu_us / 1000,
        }
    }
}

#[utoipa::path(get, path = "/api/v1/usage", tag = "agents", params(UsageParams),
    responses((status = 200, description = "What `kind: llm` listeners' calls took, and every listener's work (messages, handler time, Lua CPU time), summed by day and grouped as asked (at most 10,000 groups); kept apart from the messages, so pruning them changes nothing here", body = Usage),
              (status = 400, description = "A malformed day or grouping", body = ErrorResponse),
              (status = 503, description = "The organism keeps no store", body = ErrorResponse)))]
pub async fn get_usage(
    State(s): State<ApiState>,
    seen: Seen,
    Params(p): Params<UsageParams>,
) -> ApiResult<Json<Usage>> {
    // An empty parameter (`?from=`) is one not given.
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let p = UsageParams {
        from: given(p.from),
        to: given(p.to),
        group_by: given(p.group_by),
        tenant: given(p.tenant),
    };
    let mut q = UsageQuery::default();
    for (value, at) in [(&p.from, "from"), (&p.to, "to")] {
        if let Some(v) = value {
            if !is_day(v) {
                return Err(ApiError::bad_request(format!("`{at}` is a day, YYYY-MM-DD")).at(at));
            }
        }
    }
    q.from = p.from;
    q.to = p.to;
    for key in p
        .group_by
        .iter()
        .flat_map(|g| g.split(','))
        .filter(|k| !k.is_empty())
    {
        match key {
            "day" => q.by_day = true,
            "tenant" => q.by_tenant = true,
            "listener" => q.by_listener = true,
            "model" => q.by_model = true,
            other => {
                return Err(ApiError::bad_request(format!(
                    "cannot group by `{other}` (day, tenant, listener, model)"
                ))
                .at("group_by"))
            }
        }
    }
    q.tenant = match (&seen.principal.tenant, p.tenant.as_deref()) {
        (Some(own), _) => Some(own.clone()),
        (None, Some("-")) => Some(String::new()),
        (None, t) => t.map(str::to_string),
    };
    let organism = s.inner.organism.clone();
    let rows = tokio::task::spawn_blocking(move || organism.history().usage(&q))
        .await
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                e.to_string(),
            )
        })?
        .ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "no_store",
                "the organism keeps no store (`store: memory`), so no usage account",
            )
        })??;
    Ok(Json(Usage {
        items: rows.into_iter().map(UsageItem::from).collect(),
    }))
}

/// Tenants' token windows now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Budgets {
    pub items: Vec<BudgetWindow>,
}

/// One tenant's window.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BudgetWindow {
    pub tenant: String,
    /// `tokens_per_day` or `tokens_per_month`.
    pub key: String,
    /// `YYYY-MM-DD` or `YYYY-MM` (UTC).
    pub period: String,
    pub limit: u64,
    pub used: u64,
    /// Held for calls under way.
    pub reserved: u64,
    pub remaining: u64,
    /// RFC 3339: the window's end.
    pub resets_at: String,
}

#[utoipa::path(get, path = "/api/v1/usage/budgets", tag = "agents",
    responses((status = 200, description = "Each window with a limit (`tenants.X.tokens_per_day`, `tokens_per_month`) of the tenants with LLM listeners: limit, used, reserved, remaining, when it resets; a tenant's credential sees its own", body = Budgets)))]
pub async fn get_budgets(State(s): State<ApiState>, seen: Seen) -> Json<Budgets> {
    let organism = s.inner.organism.clone();
    let tenants: Vec<String> = match seen.principal.tenant {
        Some(t) => vec![t],
        None => organism
            .config()
            .llm_tenants()
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    let items = tokio::task::spawn_blocking(move || {
        tenants
            .iter()
            .flat_map(|t| organism.history().budgets(t))
            .map(|w| BudgetWindow {
                tenant: w.tenant,
                key: w.key.to_string(),
                period: w.period,
                limit: w.limit,
                used: w.used,
                reserved: w.reserved,
                remaining: w.remaining,
                resets_at: w.resets_at,
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    Json(Budgets { items })
}

/// `YYYY-MM-DD`, digits where they go.
fn is_day(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
}
