//! Agents created through the API (`/api/v1/agents`, `…/scripts`, `…/deployments`): a
//! tenant writes a Lua handler (or an LLM agent's system prompt), uploads versions, deploys
//! one and rolls back, on the live organism. The pump does the work (`pump::agents`); this is the HTTP edge: bodies, the
//! caller's tenant, and the answers.
//!
//! A tenant's credential creates agents of its tenant only, and sees only its tenant's; an
//! organism-wide credential may create an agent for any tenant (`tenant` in the body).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::agents_scope::{for_caller, foreign_name, report_for};
use super::auth::visible::Seen;
use super::error::{ApiError, ErrorResponse, JsonBody, Params};
use super::rest::PageQuery;
use super::test_vectors::{
    cases_of, check_count, checked_cases, run_cases, TestCase, TestReport, TestRequest,
};
use super::view::{Paged, ReloadReport, Timestamp};
use super::ApiState;

type ApiResult<T> = Result<T, ApiError>;
use crate::pump::agents::{AgentChange, AgentError, NewAgent, NewVersion};
use crate::store::agents::{DeploymentRow, VersionRow};

/// `POST /api/v1/agents`: a Lua or LLM listener's fields, as the organism file takes them,
/// with version 1's text in `script` (Lua) or `system` (an LLM's system prompt).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAgent {
    /// Unique in the organism; a tenant's credential's begins with its tenant's name and `-`.
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,128}$")]
    pub name: String,
    #[schema(min_length = 1)]
    pub description: String,
    /// `lua` (the default) or `llm`.
    #[schema(pattern = "^(lua|llm)$")]
    pub kind: Option<String>,
    /// The Lua source of version 1 (`kind: lua`).
    pub script: Option<String>,
    /// The system prompt of version 1 (`kind: llm`).
    pub system: Option<String>,
    /// `kind: llm`: one of `models:`, of the tenant's `models` (`GET /models`).
    pub model: Option<String>,
    /// `kind: llm`: the payload types it may send, each a tool.
    pub outputs: Option<Vec<String>>,
    /// `kind: llm`: `{type, text_field}`, what a plain-text answer becomes.
    #[schema(value_type = Option<Object>)]
    pub reply: Option<serde_json::Value>,
    /// `kind: llm`: `{history: thread, max_messages}`.
    #[schema(value_type = Option<Object>)]
    pub context: Option<serde_json::Value>,
    /// `kind: llm`: publish its answer's pieces as `delta` events.
    pub stream: Option<bool>,
    /// `kind: llm`: `{tokens_per_thread}`.
    #[schema(value_type = Option<Object>)]
    pub budget: Option<serde_json::Value>,
    /// `kind: llm`: what a thread's `settings` may change (`model`, `temperature`).
    pub overridable: Option<Vec<String>>,
    /// A note on version 1.
    pub message: Option<String>,
    /// The payload types as the DSL (`fields:` of the file); or `xsd`.
    #[schema(value_type = Option<Object>)]
    pub fields: Option<serde_json::Value>,
    /// An XSD text; or `fields`.
    pub xsd: Option<String>,
    pub accepts: Option<Vec<String>>,
    #[serde(default)]
    pub agent: bool,
    /// Listeners it may send to: its tenant's, or listeners marked `shared: true`.
    pub peers: Option<Vec<String>>,
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    /// Lua: `{cpu_ms, memory_mb}` per call; LLM: `{max_tokens, max_rounds, temperature}`.
    #[schema(value_type = Option<Object>)]
    pub limits: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "super::whole::opt_usize")]
    #[schema(minimum = 1)]
    pub concurrency: Option<usize>,
    /// The tenant it belongs to; a tenant's credential may only name its own (the default).
    pub tenant: Option<String>,
    /// Test cases kept with version 1 (as `…/test` takes them).
    #[schema(value_type = Option<Vec<TestCase>>, min_items = 1, max_items = 50)]
    pub cases: Option<serde_json::Value>,
}

/// `POST /api/v1/agents/{name}/scripts`: a new version.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadScript {
    /// A Lua agent's new source.
    pub script: Option<String>,
    /// An LLM agent's new system prompt.
    pub system: Option<String>,
    pub message: Option<String>,
    /// New payload types (DSL), else the live version's.
    #[schema(value_type = Option<Object>)]
    pub fields: Option<serde_json::Value>,
    /// A new XSD, else the live version's.
    pub xsd: Option<String>,
    /// A new `config` block, else the live version's.
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    /// Test cases kept with the version (as `…/test` takes them); a deploy runs them first.
    #[schema(value_type = Option<Vec<TestCase>>, min_items = 1, max_items = 50)]
    pub cases: Option<serde_json::Value>,
}

/// `?dry_run=true`: check the version and run its cases, keep nothing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    #[serde(default)]
    pub dry_run: bool,
}

/// A dry run's answer: the version as it would be kept, and its cases' verdicts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DryRun {
    pub version: ScriptVersion,
    pub tests: Option<TestReport>,
}

/// `POST /api/v1/agents/{name}/deployments`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Deploy {
    #[serde(deserialize_with = "super::whole::u64")]
    pub version: u64,
    /// Only if the running config is this revision (409 otherwise).
    #[serde(default, deserialize_with = "super::whole::opt_u64")]
    pub if_rev: Option<u64>,
    /// Deploy even if the version's kept test cases fail.
    #[serde(default)]
    pub force: bool,
}

/// A script version as listed (`GET …/scripts`), without its source.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ScriptVersion {
    pub version: u64,
    pub sha256: String,
    pub author: Option<String>,
    pub created: Timestamp,
    pub message: Option<String>,
    /// Whether it is the one running.
    pub live: bool,
    pub bytes: usize,
}

impl ScriptVersion {
    fn of(v: &VersionRow, live: u64) -> Self {
        ScriptVersion {
            version: v.version,
            sha256: v.sha256.clone(),
            author: v.author.clone(),
            created: v.created.into(),
            message: v.message.clone(),
            live: v.version == live,
            bytes: v.script.len(),
        }
    }
}

/// One version with its source (`GET …/scripts/{version}`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ScriptSource {
    #[serde(flatten)]
    pub version: ScriptVersion,
    pub script: String,
    #[schema(value_type = Option<Object>)]
    pub fields: Option<serde_json::Value>,
    pub xsd: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
}

/// An entry of an agent's deployment history.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Deployment {
    /// `create`, `deploy`, `rollback` or `delete`; for a Lua listener of the file, `file`:
    /// its script as a load of the file (at start, or a reload) found it.
    pub action: String,
    pub version: Option<u64>,
    pub from_version: Option<u64>,
    pub author: Option<String>,
    pub time: Timestamp,
}

impl From<&DeploymentRow> for Deployment {
    fn from(d: &DeploymentRow) -> Self {
        Deployment {
            action: d.action.clone(),
            version: d.version,
            from_version: d.from_version,
            author: d.author.clone(),
            time: d.ts.into(),
        }
    }
}

/// What a create, deploy or delete did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentChanged {
    pub agent: String,
    /// The version now live (none after a delete).
    pub version: Option<u64>,
    /// The version live before (none for a create).
    pub from_version: Option<u64>,
    pub reload: ReloadReport,
}

/// What a change of agent `name` did, as the caller may see it.
fn changed(name: &str, c: &AgentChange, seen: &Seen) -> AgentChanged {
    AgentChanged {
        agent: name.to_string(),
        version: c.version,
        from_version: c.from_version,
        reload: report_for(name, c, seen),
    }
}

fn error(e: AgentError) -> ApiError {
    let message = e.to_string();
    match e {
        AgentError::NotFound(_) => ApiError::not_found("unknown_agent", message),
        AgentError::NoVersion { .. } => ApiError::not_found("unknown_version", message),
        AgentError::FileListener(_) => {
            ApiError::new(StatusCode::CONFLICT, "file_listener", message)
        }
        AgentError::Exists(_) => ApiError::new(StatusCode::CONFLICT, "agent_exists", message),
        AgentError::Bad(_) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_agent", message)
        }
        AgentError::Invalid(problems) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_agent",
            "refused: the running organism is unchanged",
        )
        // Without the organism file's line numbers: an agent is not in the file, and the
        // file is the operator's (its log has them).
        .details(
            problems
                .iter()
                .map(|p| {
                    crate::config::diff::ReloadProblem {
                        line: None,
                        ..p.clone()
                    }
                    .to_string()
                })
                .collect(),
        ),
        AgentError::RevMismatch { .. } => {
            ApiError::new(StatusCode::CONFLICT, "rev_mismatch", message).at("if_rev")
        }
        AgentError::NoSource => ApiError::new(StatusCode::CONFLICT, "not_reloadable", message),
        AgentError::Stopping => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping", message),
        AgentError::Store(e) => e.into(),
    }
}

/// Runs a change of the organism off the async workers (building sandboxes runs `init`).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<Result<T, AgentError>, ApiError> {
    crate::events::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))
}

/// The API agent `name` as the caller may see it: 404 when it is not an API agent, or not
/// the caller's tenant's; 409 for a listener of the file.
fn visible_agent(
    s: &ApiState,
    seen: &Seen,
    name: &str,
) -> Result<crate::store::agents::AgentRow, ApiError> {
    match with_history(s, seen, name)? {
        History::Api(a) => Ok(a),
        History::File(_) => Err(error(AgentError::FileListener(name.to_string()))),
    }
}

/// Whose script history is read: an API agent, or a Lua listener of the file (its script
/// as each load found it, the newest live).
enum History {
    Api(crate::store::agents::AgentRow),
    /// Its live version: the newest kept (0 if none is, as with a failing store).
    File(u64),
}

impl History {
    fn live(&self) -> u64 {
        match self {
            History::Api(a) => a.live_version,
            History::File(v) => *v,
        }
    }
}

/// The history of `name` as the caller may see it: 404 when it is no agent or not the
/// caller's tenant's; 409 for a listener of the file that is not Lua.
fn with_history(s: &ApiState, seen: &Seen, name: &str) -> Result<History, ApiError> {
    let organism = &s.inner.organism;
    if !seen.scope.sees(name) {
        return Err(error(AgentError::NotFound(name.to_string())));
    }
    if let Some(a) = organism.uploads().created_agent(name)? {
        return Ok(History::Api(a));
    }
    match organism.config().listener(name).map(|l| l.kind) {
        Some(crate::config::ListenerKind::Lua) => {
            let newest = organism
                .uploads()
                .agent_versions(name)?
                .first()
                .map(|v| v.version);
            Ok(History::File(newest.unwrap_or(0)))
        }
        Some(_) => Err(error(AgentError::FileListener(name.to_string()))),
        None => Err(error(AgentError::NotFound(name.to_string()))),
    }
}

/// A version's text: a Lua agent's `script`, an LLM agent's `system` prompt; the other
/// field, or neither, is refused where it was (or was not) written.
fn version_text(llm: bool, script: Option<String>, system: Option<String>) -> ApiResult<String> {
    match (llm, script, system) {
        (false, Some(s), None) | (true, None, Some(s)) => Ok(s),
        (false, _, Some(_)) => Err(ApiError::bad_request(
            "only a `kind: llm` agent has a `system` prompt; a Lua agent's text is `script`",
        )
        .at("system")),
        (true, Some(_), _) => Err(ApiError::bad_request(
            "a `kind: llm` agent's text is its `system` prompt, not a `script`",
        )
        .at("script")),
        (false, None, None) => Err(ApiError::bad_request("required: the Lua source").at("script")),
        (true, None, None) => {
            Err(ApiError::bad_request("required: the system prompt").at("system"))
        }
    }
}

#[utoipa::path(post, path = "/api/v1/agents", tag = "agents", request_body = CreateAgent,
    responses((status = 201, description = "Created and live at version 1", body = AgentChanged),
              (status = 400, description = "A body that is not a Lua listener, or a tenant not the caller's", body = ErrorResponse),
              (status = 409, description = "A listener of that name exists, or the organism has no file", body = ErrorResponse),
              (status = 422, description = "The agent does not load (its script, `init`, schema, peers or limits), one reason per line in `details`; nothing changed", body = ErrorResponse)))]
pub async fn create_agent(
    State(s): State<ApiState>,
    seen: Seen,
    JsonBody(body): JsonBody<CreateAgent>,
) -> ApiResult<(StatusCode, Json<AgentChanged>)> {
    let llm = match body.kind.as_deref() {
        None | Some("lua") => false,
        Some("llm") => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                "only `lua` and `llm` agents can be created through the API",
            )
            .at("kind"))
        }
    };
    let text = version_text(llm, body.script, body.system)?;
    let tenant = match (&seen.principal.tenant, body.tenant) {
        (Some(mine), Some(asked)) if *mine != asked => {
            return Err(ApiError::bad_request(
                "a tenant's credential creates agents of its own tenant only",
            )
            .at("tenant"))
        }
        (Some(mine), _) => Some(mine.clone()),
        (None, asked) => asked,
    };
    let mut definition = serde_json::Map::new();
    definition.insert("description".into(), body.description.into());
    if llm {
        definition.insert("kind".into(), "llm".into());
    }
    let optional = [
        ("accepts", body.accepts.map(serde_json::Value::from)),
        ("peers", body.peers.map(serde_json::Value::from)),
        ("limits", body.limits),
        ("concurrency", body.concurrency.map(serde_json::Value::from)),
        ("model", body.model.map(serde_json::Value::from)),
        ("outputs", body.outputs.map(serde_json::Value::from)),
        ("reply", body.reply),
        ("context", body.context),
        ("stream", body.stream.map(serde_json::Value::from)),
        ("budget", body.budget),
        ("overridable", body.overridable.map(serde_json::Value::from)),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            definition.insert(key.into(), v);
        }
    }
    if body.agent {
        definition.insert("agent".into(), true.into());
    }
    let name = body.name;
    if let Some(refused) = foreign_name(&seen, &name) {
        return Err(error(refused));
    }
    let new = NewAgent {
        name: name.clone(),
        tenant,
        definition: serde_json::Value::Object(definition),
        version: NewVersion {
            script: text,
            message: body.message,
            fields: body.fields,
            xsd: body.xsd,
            config: body.config,
            cases: checked_cases(body.cases)?,
        },
    };
    let organism = s.inner.organism.clone();
    let author = seen.principal.name.clone();
    let done = blocking(move || organism.uploads().create_agent(new, author)).await?;
    let change = done.map_err(|e| error(for_caller(e, &seen, &name)))?;
    Ok((StatusCode::CREATED, Json(changed(&name, &change, &seen))))
}

#[utoipa::path(delete, path = "/api/v1/agents/{name}", tag = "agents",
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 200, description = "Removed as a reload removes a listener: calls in flight finish, its queued messages become undeliverable", body = AgentChanged),
              (status = 404, description = "No such agent", body = ErrorResponse),
              (status = 409, description = "A listener of the organism file: change the file", body = ErrorResponse)))]
pub async fn delete_agent(
    State(s): State<ApiState>,
    seen: Seen,
    Path(name): Path<String>,
) -> ApiResult<Json<AgentChanged>> {
    visible_agent(&s, &seen, &name)?;
    let organism = s.inner.organism.clone();
    let author = seen.principal.name.clone();
    let target = name.clone();
    let done = blocking(move || organism.uploads().delete_agent(&target, author)).await?;
    let change = done.map_err(|e| error(for_caller(e, &seen, &name)))?;
    Ok(Json(changed(&name, &change, &seen)))
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/scripts", tag = "agents", request_body = UploadScript,
    params(("name" = String, Path, description = "Agent name"), UploadQuery),
    responses((status = 201, description = "Kept (not live until deployed): it compiled, its `init` ran, its schema compiled", body = ScriptVersion),
              (status = 200, description = "`dry_run=true`: the version as it would be kept and its cases' verdicts; nothing kept", body = DryRun),
              (status = 404, description = "No such agent", body = ErrorResponse),
              (status = 409, description = "A listener of the organism file", body = ErrorResponse),
              (status = 422, description = "It does not load, one reason per line in `details` (Lua errors with their line)", body = ErrorResponse),
              (status = 429, description = "`dry_run=true` with cases while `limits.max_tests_at_once` test runs of the caller's tenant are under way", body = ErrorResponse)))]
pub async fn upload_script(
    State(s): State<ApiState>,
    seen: Seen,
    Path(name): Path<String>,
    Params(q): Params<UploadQuery>,
    JsonBody(body): JsonBody<UploadScript>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let agent = visible_agent(&s, &seen, &name)?;
    let text = version_text(
        crate::pump::agents::is_llm(&agent),
        body.script,
        body.system,
    )?;
    let organism = s.inner.organism.clone();
    let author = seen.principal.name.clone();
    let target = name.clone();
    let new = NewVersion {
        script: text,
        message: body.message,
        fields: body.fields,
        xsd: body.xsd,
        config: body.config,
        cases: checked_cases(body.cases)?,
    };
    if q.dry_run {
        let done =
            blocking(move || organism.uploads().preview_version(&target, new, author)).await?;
        let (v, tester) = done.map_err(|e| error(for_caller(e, &seen, &name)))?;
        let tests = match cases_of(&v)? {
            Some(cases) => Some(run_cases(&s, &seen, &tester, &cases).await?),
            None => None,
        };
        let answer = DryRun {
            version: ScriptVersion::of(&v, agent.live_version),
            tests,
        };
        return Ok(Json(answer).into_response());
    }
    let done = blocking(move || organism.uploads().upload_version(&target, new, author)).await?;
    let v = done.map_err(|e| error(for_caller(e, &seen, &name)))?;
    Ok((
        StatusCode::CREATED,
        Json(ScriptVersion::of(&v, agent.live_version)),
    )
        .into_response())
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/scripts", tag = "agents",
    params(("name" = String, Path, description = "Agent name"), PageQuery),
    responses((status = 200, description = "Its versions, newest first, the live one marked (a Lua listener of the file: its script as each load found it)", body = Paged<ScriptVersion>),
              (status = 404, description = "No such agent", body = ErrorResponse),
              (status = 409, description = "A listener of the file that is not Lua", body = ErrorResponse)))]
pub async fn list_scripts(
    State(s): State<ApiState>,
    seen: Seen,
    Path(name): Path<String>,
    Params(q): Params<PageQuery>,
) -> ApiResult<Json<Paged<ScriptVersion>>> {
    let live = with_history(&s, &seen, &name)?.live();
    let all = s.inner.organism.uploads().agent_versions(&name)?;
    Ok(Json(Paged::map(q.page().cut(all), |v| {
        ScriptVersion::of(&v, live)
    })))
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/scripts/{version}", tag = "agents",
    params(("name" = String, Path, description = "Agent name"), ("version" = u64, Path, description = "Version")),
    responses((status = 200, description = "The version with its source", body = ScriptSource),
              (status = 404, description = "No such agent or version", body = ErrorResponse),
              (status = 409, description = "A listener of the file that is not Lua", body = ErrorResponse)))]
pub async fn get_script(
    State(s): State<ApiState>,
    seen: Seen,
    Path((name, version)): Path<(String, u64)>,
) -> ApiResult<Json<ScriptSource>> {
    let live = with_history(&s, &seen, &name)?.live();
    let v = s
        .inner
        .organism
        .uploads()
        .agent_version(&name, version)?
        .ok_or_else(|| {
            error(AgentError::NoVersion {
                agent: name.clone(),
                version,
            })
        })?;
    Ok(Json(ScriptSource {
        version: ScriptVersion::of(&v, live),
        script: v.script,
        fields: v.fields,
        xsd: v.xsd,
        config: v.config,
    }))
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/deployments", tag = "agents", request_body = Deploy,
    params(("name" = String, Path, description = "Agent name")),
    responses((status = 201, description = "That version is live: new messages go to it, calls in flight finish on the old one", body = AgentChanged),
              (status = 404, description = "No such agent or version", body = ErrorResponse),
              (status = 409, description = "`if_rev` is not the running revision, or a file listener", body = ErrorResponse),
              (status = 422, description = "It does not load any more (the organism changed around it), or a test case kept with it failed (`tests_failed`, each in `details`; `force: true` deploys anyway); nothing changed", body = ErrorResponse),
              (status = 429, description = "Its kept cases would run while `limits.max_tests_at_once` test runs of the caller's tenant are under way", body = ErrorResponse)))]
pub async fn deploy(
    State(s): State<ApiState>,
    seen: Seen,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<Deploy>,
) -> ApiResult<(StatusCode, Json<AgentChanged>)> {
    visible_agent(&s, &seen, &name)?;
    let kept = s
        .inner
        .organism
        .uploads()
        .agent_version(&name, body.version)?;
    let cases = match &kept {
        Some(v) if !body.force => cases_of(v)?,
        _ => None,
    };
    if let Some(cases) = cases {
        let organism = s.inner.organism.clone();
        let (target, version) = (name.clone(), body.version);
        let tester = blocking(move || organism.uploads().prepare_test(&target, version))
            .await?
            .map_err(|e| error(for_caller(e, &seen, &name)))?;
        let report = run_cases(&s, &seen, &tester, &cases).await?;
        if report.failed > 0 {
            let details = report
                .cases
                .iter()
                .enumerate()
                .filter(|(_, c)| !c.pass)
                .map(|(i, c)| {
                    let why: Vec<String> = c.error.iter().chain(&c.mismatches).cloned().collect();
                    format!("case {i}: {}", why.join("; "))
                })
                .collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "tests_failed",
                format!(
                    "{} of the version's {} test cases failed; nothing changed (deploy with `force: true` to deploy anyway)",
                    report.failed,
                    report.cases.len()
                ),
            )
            .details(details));
        }
    }
    let organism = s.inner.organism.clone();
    let author = seen.principal.name.clone();
    let target = name.clone();
    let done = blocking(move || {
        organism
            .uploads()
            .deploy_version(&target, body.version, body.if_rev, author)
    })
    .await?;
    let change = done.map_err(|e| error(for_caller(e, &seen, &name)))?;
    Ok((StatusCode::CREATED, Json(changed(&name, &change, &seen))))
}

#[utoipa::path(get, path = "/api/v1/agents/{name}/deployments", tag = "agents",
    params(("name" = String, Path, description = "Agent name"), PageQuery),
    responses((status = 200, description = "What was made live, when and by whom, newest first", body = Paged<Deployment>),
              (status = 404, description = "No such agent", body = ErrorResponse),
              (status = 409, description = "A listener of the file that is not Lua", body = ErrorResponse)))]
pub async fn list_deployments(
    State(s): State<ApiState>,
    seen: Seen,
    Path(name): Path<String>,
    Params(q): Params<PageQuery>,
) -> ApiResult<Json<Paged<Deployment>>> {
    with_history(&s, &seen, &name)?;
    let all = s.inner.organism.uploads().agent_deployments(&name)?;
    Ok(Json(Paged::map(q.page().cut(all), |d| {
        Deployment::from(&d)
    })))
}

#[utoipa::path(post, path = "/api/v1/agents/{name}/scripts/{version}/test", tag = "agents", request_body = TestRequest,
    params(("name" = String, Path, description = "Agent name"), ("version" = u64, Path, description = "Version")),
    responses((status = 200, description = "Each case's verdict, run in a sandbox of that version apart from the running organism (nothing is delivered or kept)", body = TestReport),
              (status = 400, description = "No cases, or more than 50", body = ErrorResponse),
              (status = 404, description = "No such agent or version", body = ErrorResponse),
              (status = 409, description = "`file_listener`: a listener of the organism file, whose versions are tried by reloading the file", body = ErrorResponse),
              (status = 422, description = "The version does not load any more", body = ErrorResponse),
              (status = 429, description = "`limits.max_tests_at_once` test runs of the caller's tenant are under way (with `Retry-After`)", body = ErrorResponse)))]
pub async fn test_script(
    State(s): State<ApiState>,
    seen: Seen,
    Path((name, version)): Path<(String, u64)>,
    JsonBody(body): JsonBody<TestRequest>,
) -> ApiResult<Json<TestReport>> {
    visible_agent(&s, &seen, &name)?;
    check_count(body.cases.len())?;
    let organism = s.inner.organism.clone();
    let target = name.clone();
    let tester = blocking(move || organism.uploads().prepare_test(&target, version))
        .await?
        .map_err(|e| error(for_caller(e, &seen, &name)))?;
    Ok(Json(run_cases(&s, &seen, &tester, &body.cases).await?))
}
