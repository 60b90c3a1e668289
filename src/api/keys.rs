//! `/api/v1/keys` (admin): create, list and revoke the organism's API keys. A new key's
//! secret is in the answer to its creation and nowhere else.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{KeySource, Role};
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::view::Timestamp;
use super::ApiState;
use crate::store::keys::{AddKeyError, KeyRow};

/// A key as listed: everything but its secret (which is not kept) and its hash.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyInfo {
    /// The public part of the key (`ask_<id>_…`).
    pub id: String,
    pub name: String,
    pub role: Role,
    pub tenant: Option<String>,
    pub created: Timestamp,
    pub expires: Option<Timestamp>,
    /// When it last authenticated a request (recorded every few seconds).
    pub last_used: Option<Timestamp>,
    pub revoked: Option<Timestamp>,
    /// Its own inject rate and burst, over `auth.inject_per_s` and `auth.burst`.
    pub inject_per_s: Option<u32>,
    pub burst: Option<u32>,
}

impl KeyInfo {
    fn of(k: KeyRow) -> Self {
        KeyInfo {
            role: k.role,
            id: k.id,
            name: k.name,
            tenant: k.tenant,
            created: k.created.into(),
            expires: k.expires.map(Into::into),
            last_used: k.last_used.map(Into::into),
            revoked: k.revoked.map(Into::into),
            inject_per_s: k.inject_per_s,
            burst: k.burst,
        }
    }
}

/// A new key: its description, and the key itself, shown this once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewKey {
    #[serde(flatten)]
    pub info: KeyInfo,
    /// The key to present (`Authorization: Bearer …`). It is not kept: save it now.
    pub key: String,
}

/// `POST /api/v1/keys`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// Unique among live keys: letters, digits, `.`, `_`, `-`, at most 64.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    pub role: Role,
    /// The tenant the key acts for; none for the whole organism.
    pub tenant: Option<String>,
    /// How long it lives: `30d`, `12h`, `15m` (none: until revoked).
    pub expires: Option<String>,
    /// Its own injects per second (over `auth.inject_per_s`), and burst.
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1)]
    pub inject_per_s: Option<u32>,
    #[serde(default, deserialize_with = "super::whole::opt_u32")]
    #[schema(minimum = 1)]
    pub burst: Option<u32>,
}

/// A key's own inject rate: `(per second, burst)`, each at least 1, burst only with a rate.
pub type KeyRate = (Option<u32>, Option<u32>);

/// Checks a key's name, tenant and lifetime, and makes the row and the key to show once.
pub fn new_key(
    name: &str,
    role: Role,
    tenant: Option<&str>,
    expires: Option<&str>,
) -> Result<(String, KeyRow), ApiError> {
    new_key_with_rate(name, role, tenant, expires, (None, None))
}

/// [`new_key`], with the key's own inject rate.
pub fn new_key_with_rate(
    name: &str,
    role: Role,
    tenant: Option<&str>,
    expires: Option<&str>,
    (inject_per_s, burst): KeyRate,
) -> Result<(String, KeyRow), ApiError> {
    if inject_per_s == Some(0) || burst == Some(0) || (burst.is_some() && inject_per_s.is_none()) {
        return Err(ApiError::bad_request(
            "inject_per_s and burst are at least 1, and burst needs inject_per_s",
        )
        .at(if inject_per_s == Some(0) || inject_per_s.is_none() {
            "inject_per_s"
        } else {
            "burst"
        }));
    }
    let ok_name = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    if !ok_name(name) {
        return Err(
            ApiError::bad_request("a key's name is 1-64 letters, digits, `.`, `_` or `-`")
                .at("name"),
        );
    }
    if tenant.is_some_and(|t| !crate::config::valid_tenant(t)) {
        return Err(
            ApiError::bad_request("a tenant is 1-64 letters, digits, `.`, `_` or `-`").at("tenant"),
        );
    }
    let now = crate::time::Timestamp::now();
    let expires = match expires {
        None => None,
        Some(e) => {
            let d = crate::config::parse_age(e)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`{}` is not a lifetime such as 30d, 12h or 15m",
                        crate::clip::clip(e.to_string(), 64)
                    ))
                    .at("expires")
                })?;
            Some(crate::time::Timestamp(
                now.0.saturating_add(d.as_millis() as u64),
            ))
        }
    };
    let (key, id, hash) = super::auth::key::generate()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e))?;
    Ok((
        key,
        KeyRow {
            id,
            name: name.to_string(),
            hash,
            role,
            tenant: tenant.map(str::to_string),
            created: now,
            expires,
            last_used: None,
            revoked: None,
            inject_per_s,
            burst,
        },
    ))
}

/// The keys this server manages through the API: those in the store file.
fn table(s: &ApiState) -> Result<&KeySource, ApiError> {
    let keys = s
        .inner
        .auth
        .as_deref()
        .and_then(|a| a.keys())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "keys_off",
                "this organism does not use API keys (auth.methods has no `keys`)",
            )
        })?;
    match keys {
        KeySource::Table(_) => Ok(keys),
        KeySource::File(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "keys_in_file",
            format!(
                "the keys are in {} (the store is memory): manage them with `agentserver keys`",
                keys.describe()
            ),
        )),
    }
}

#[utoipa::path(post, path = "/api/v1/keys", tag = "keys", request_body = CreateKey,
    responses((status = 201, description = "Created: the key is in `key`, shown this once", body = NewKey),
              (status = 400, description = "Bad name, tenant or lifetime", body = ErrorResponse),
              (status = 409, description = "A live key has that name, or keys are not managed here", body = ErrorResponse)))]
pub async fn create_key(
    State(s): State<ApiState>,
    JsonBody(body): JsonBody<CreateKey>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    let keys = table(&s)?;
    let (key, row) = new_key_with_rate(
        &body.name,
        body.role,
        body.tenant.as_deref(),
        body.expires.as_deref(),
        (body.inject_per_s, body.burst),
    )?;
    keys.add(&row).map_err(|e| match e {
        AddKeyError::NameTaken(_) => {
            ApiError::new(StatusCode::CONFLICT, "key_exists", e.to_string()).at("name")
        }
        AddKeyError::Store(e) => e.into(),
    })?;
    Ok((
        StatusCode::CREATED,
        Json(NewKey {
            info: KeyInfo::of(row),
            key,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/keys", tag = "keys",
    responses((status = 200, description = "Every key, revoked ones included, oldest first; never a secret", body = Vec<KeyInfo>),
              (status = 409, description = "Keys are not managed here", body = ErrorResponse)))]
pub async fn list_keys(State(s): State<ApiState>) -> Result<Json<Vec<KeyInfo>>, ApiError> {
    let keys = table(&s)?.list()?;
    Ok(Json(keys.into_iter().map(KeyInfo::of).collect()))
}

#[utoipa::path(delete, path = "/api/v1/keys/{name}", tag = "keys",
    params(("name" = String, Path, description = "The key's name or id")),
    responses((status = 200, description = "Revoked: refused from now on, and its open WebSocket sessions are closed", body = KeyInfo),
              (status = 404, description = "No live key has that name or id", body = ErrorResponse),
              (status = 409, description = "Keys are not managed here", body = ErrorResponse)))]
pub async fn revoke_key(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<KeyInfo>, ApiError> {
    let gone = table(&s)?
        .revoke(&name, crate::time::Timestamp::now())?
        .ok_or_else(|| {
            ApiError::not_found(
                "unknown_key",
                format!("no live key named `{}`", crate::clip::clip(name, 64)),
            )
        })?;
    if let Some(a) = s.inner.auth.as_deref() {
        a.revoked.notify_waiters();
    }
    Ok(Json(KeyInfo::of(gone)))
}
