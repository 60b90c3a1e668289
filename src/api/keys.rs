//! `/api/v1/keys` (admin): create, list and revoke the organism's API keys. A new key's
//! secret is in the answer to its creation and nowhere else.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorResponse, JsonBody};
use super::view::Timestamp;
use super::ApiState;
use crate::access::{new_key_with_rate, KeySource, NewKeyError, Role};
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

/// [`access::new_key_with_rate`](crate::access::new_key_with_rate)'s refusal as the API
/// answers it: 400 naming the field, or 500 when no randomness was to be had.
impl From<NewKeyError> for ApiError {
    fn from(e: NewKeyError) -> ApiError {
        match e {
            NewKeyError::Field { field, message } => ApiError::bad_request(message).at(field),
            NewKeyError::Random(e) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e)
            }
        }
    }
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
