//! `PATCH /api/v1/threads/{id}` and the `/ws` `settings` command: a thread's `settings` for
//! its `kind: llm` listeners (`pump::settings` checks and keeps them).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Deserializer};

use super::auth::VisibleThread;
use super::error::{ApiError, ErrorResponse, JsonBody};
use super::view::Thread;
use super::ApiState;
use crate::access::Scope;
use crate::pump::{SettingsError, SettingsPatch};

/// A thread's change: JSON merge-patch semantics, a key absent is left as it is, `null`
/// clears it.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadPatch {
    #[serde(default)]
    pub settings: Option<SettingsBody>,
    /// Labels to set (`"k": "v"`) or remove (`"k": null`): at most 16 in all, keys
    /// `[a-z0-9_.-]{1,64}`, values at most 256 bytes.
    #[serde(default)]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Option<String>>>)]
    pub labels: Option<crate::threads::LabelPatch>,
}

/// What a thread's `kind: llm` listeners use instead of their own, each where the
/// listener's `overridable` names it.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsBody {
    /// A model of `models:` (`GET /models`) that a listener in scope may choose; `null`:
    /// each listener's own.
    #[serde(default, deserialize_with = "set_or_null")]
    #[schema(value_type = Option<String>, nullable, min_length = 1, max_length = 128)]
    pub model: Option<Option<String>>,
    /// 0 to 2; `null`: each listener's own.
    #[serde(default, deserialize_with = "set_or_null")]
    #[schema(value_type = Option<f64>, nullable, minimum = 0, maximum = 2)]
    pub temperature: Option<Option<f64>>,
}

/// A key given (`Some`), as a value or `null`; absent keys stay `None` by `default`.
fn set_or_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[utoipa::path(patch, path = "/api/v1/threads/{id}", tag = "threads",
    params(("id" = String, Path, description = "Thread id")), request_body = ThreadPatch,
    responses((status = 200, description = "The thread with its settings now", body = Thread),
              (status = 400, description = "Not the JSON expected", body = ErrorResponse),
              (status = 404, description = "No such thread", body = ErrorResponse),
              (status = 409, description = "The thread was killed", body = ErrorResponse),
              (status = 422, description = "`invalid_settings`: a model unknown or not one a listener in scope may choose, a temperature out of range, or a key no listener in scope lets a thread change (`location` names it)", body = ErrorResponse)))]
pub async fn patch_thread(
    State(s): State<ApiState>,
    VisibleThread { id, scope, .. }: VisibleThread,
    JsonBody(patch): JsonBody<ThreadPatch>,
) -> Result<Json<Thread>, ApiError> {
    let organism = &s.inner.organism;
    change(organism, &scope, &id, patch)?;
    organism
        .history()
        .thread_info(&id)?
        .map(|t| Json(t.into()))
        .ok_or_else(|| super::auth::unknown_thread(&id))
}

/// Applies `patch` to thread `id`, which `scope` sees.
pub(super) fn change(
    organism: &crate::Organism,
    scope: &Scope,
    id: &str,
    patch: ThreadPatch,
) -> Result<(), ApiError> {
    // Both checked before either is made.
    if let Some(labels) = &patch.labels {
        crate::threads::patched(organism.threads().labels(id).as_deref(), labels)
            .map_err(SettingsError::from)?;
    }
    if let Some(settings) = patch.settings {
        let settings = SettingsPatch {
            model: settings.model,
            temperature: settings.temperature,
        };
        organism
            .control()
            .change_settings(id, &settings, &|agent| scope.sees(agent))?;
    }
    if let Some(labels) = &patch.labels {
        organism.control().change_labels(id, labels)?;
    }
    Ok(())
}

/// [`change`], answered as the `/ws` command's `ack` fields: the thread and its settings.
pub(super) fn change_answered(
    organism: &crate::Organism,
    scope: &Scope,
    id: &str,
    patch: ThreadPatch,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    change(organism, scope, id, patch)?;
    let now = organism.threads().settings(id);
    let mut out = serde_json::Map::new();
    out.insert("thread_id".into(), serde_json::json!(id));
    out.insert(
        "settings".into(),
        serde_json::json!(now.as_deref().map(super::view::ThreadSettings::from)),
    );
    Ok(out)
}

/// A refused label, as an answer: 422 `invalid_label` where it was.
pub(super) fn label_refused(e: &crate::threads::LabelError) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_label",
        e.to_string(),
    )
    .at(super::labels::location(e))
}

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> Self {
        let message = e.to_string();
        match e {
            SettingsError::UnknownThread(id) => super::auth::unknown_thread(&id),
            SettingsError::ThreadKilled(_) => {
                ApiError::new(StatusCode::CONFLICT, "thread_killed", message)
            }
            SettingsError::Invalid { key, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_settings",
                message,
            )
            .at(format!("settings.{key}")),
            SettingsError::Label(l) => label_refused(&l),
        }
    }
}
