//! `GET /api/v1/models`: the models the organism's `kind: llm` listeners call, as a client
//! may know them: never a key (its variable's name only), the URL without credentials or
//! query. A tenant's credential sees the models its tenant's listeners use.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::auth::Seen;
use super::ApiState;
use crate::config::llm::Provider;

/// The models in the credential's scope.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Models {
    pub items: Vec<Model>,
}

/// A model of `models:`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Model {
    pub name: String,
    /// `openai` (any OpenAI-compatible server) or `scripted` (a list of answers).
    pub provider: &'static str,
    /// The model's name on its server.
    pub model: Option<String>,
    /// The server, without credentials or query.
    pub base_url: Option<String>,
    /// The environment variable holding its key, if it has one (never the key).
    pub api_key_env: Option<String>,
    pub timeout_ms: u64,
    pub max_concurrency: usize,
    /// The listeners in scope that call it.
    pub listeners: Vec<String>,
}

#[utoipa::path(get, path = "/api/v1/models", tag = "agents",
    responses((status = 200, description = "The models `kind: llm` listeners call (never a key); a tenant's credential sees those its tenant's listeners use", body = Models)))]
pub async fn list_models(State(s): State<ApiState>, seen: Seen) -> Json<Models> {
    let config = s.inner.organism.config();
    let wide = seen.principal.tenant.is_none();
    let mut items = Vec::new();
    for (name, m) in &config.models {
        let listeners: Vec<String> = config
            .listeners
            .iter()
            .filter(|l| l.llm.as_ref().is_some_and(|c| c.model.name == *name))
            .filter(|l| seen.scope.sees(l.name.as_str()))
            .map(|l| l.name.to_string())
            .collect();
        if !wide && listeners.is_empty() {
            continue;
        }
        let (provider, model, base_url, api_key_env) = match &m.provider {
            Provider::OpenAi {
                base_url,
                model,
                api_key_env,
                ..
            } => (
                "openai",
                Some(model.clone()),
                Some(crate::config::display_url(base_url)),
                api_key_env.clone(),
            ),
            Provider::Scripted { .. } => ("scripted", None, None, None),
        };
        items.push(Model {
            name: name.clone(),
            provider,
            model,
            base_url,
            api_key_env,
            timeout_ms: u64::try_from(m.timeout.as_millis()).unwrap_or(u64::MAX),
            max_concurrency: m.max_concurrency,
            listeners,
        });
    }
    Json(Models { items })
}
