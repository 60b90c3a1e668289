//! The organism file as written (serde, unknown keys refused) and as validated.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::nats::{NatsConfig, NatsSection};
use serde::{Deserialize, Serialize};

use super::limits::Limits;
use crate::schema::Schema;
use crate::xml::PayloadType;

/// The order in which one thread's ready messages are taken when handlers compete for the
/// organism-wide concurrency limit (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduling {
    /// The oldest ready message of the thread first.
    #[default]
    BreadthFirst,
    /// The newest ready message of the thread first.
    DepthFirst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    Native,
    Lua,
    External,
    /// A person is the handler: each delivery opens a question in the inbox, answered by
    /// payloads routed as this listener's outputs.
    Human,
    /// A language model is the handler (`models:`): its tool calls are its outputs.
    Llm,
}

impl fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ListenerKind::Native => "native",
            ListenerKind::Lua => "lua",
            ListenerKind::External => "external",
            ListenerKind::Human => "human",
            ListenerKind::Llm => "llm",
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OrganismSection {
    pub name: String,
    pub listen: Option<String>,
    pub store: Option<String>,
    pub store_retention: Option<RetentionSection>,
    #[serde(default)]
    pub scheduling: Scheduling,
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    pub tls: Option<TlsFiles>,
    /// Serve the dashboard at `/` (default true).
    pub dashboard: Option<bool>,
    pub nats: Option<NatsSection>,
    pub search: Option<SearchSection>,
}

/// `organism.search`: what `q=` on `/threads` looks in beyond ids, labels and errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchSection {
    /// Payload text too, through a full-text index the store keeps (default false).
    #[serde(default)]
    pub payload_text: bool,
}

/// Where a listener's handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// In the pump's process.
    #[default]
    Local,
    /// In `agentserver worker` processes, reached through NATS JetStream.
    Workers,
}

/// `organism.tls`: the API serves HTTPS and WSS with this certificate chain and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionSection {
    pub max_messages: Option<u64>,
    pub max_age: Option<String>,
}

/// How much history the store keeps (`organism.store_retention`). Pruning removes whole
/// finished threads, least recently active first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    pub max_messages: Option<u64>,
    pub max_age: Option<std::time::Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListenerSection {
    pub name: String,
    pub description: Option<String>,
    pub kind: ListenerKind,
    pub handler: Option<String>,
    pub script: Option<String>,
    pub schema: Option<String>,
    pub fields: Option<yaml_serde::Value>,
    pub accepts: Option<Vec<String>>,
    #[serde(default)]
    pub agent: bool,
    pub peers: Option<Vec<String>>,
    pub concurrency: Option<usize>,
    pub config: Option<yaml_serde::Value>,
    pub limits: Option<yaml_serde::Value>,
    pub input_url: Option<String>,
    pub token_env: Option<String>,
    pub timeout_ms: Option<u64>,
    pub reply_timeout: Option<yaml_serde::Value>,
    pub tenant: Option<String>,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub placement: Placement,
    pub approval: Option<super::approval::ApprovalSection>,
    /// For `human`: who may answer.
    pub approvers: Option<super::approval::ApproversSection>,
    /// For `llm` (`config::llm`).
    pub model: Option<String>,
    pub system: Option<yaml_serde::Value>,
    pub outputs: Option<Vec<String>>,
    pub reply: Option<super::llm::Reply>,
    pub stream: Option<bool>,
    pub context: Option<super::llm::ContextSection>,
    pub budget: Option<super::llm::BudgetSection>,
    pub overridable: Option<Vec<super::llm::Overridable>>,
}

/// A listener's name. A newtype so names are not confused with other strings across modules.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ListenerName(Arc<str>);

impl ListenerName {
    pub fn new(name: &str) -> Self {
        ListenerName(Arc::from(name))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// A shared handle on the name.
    pub fn arc(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl fmt::Display for ListenerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for ListenerName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// One validated listener: every reference checked, its schemas compiled.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub name: ListenerName,
    pub description: String,
    pub kind: ListenerKind,
    /// For `native`: the registered handler name.
    pub handler: Option<String>,
    /// Accepted payload types, each with the schema that validates it.
    pub accepts: Vec<(PayloadType, Arc<Schema>)>,
    pub agent: bool,
    /// `None`: any listener (non-agents only). `Some`: only these, plus the sender.
    pub peers: Option<Vec<ListenerName>>,
    pub concurrency: usize,
    /// The listener's `config:` block, as JSON, handed to its handler.
    pub config: serde_json::Value,
    /// Where the schema came from (a file path), for the API.
    pub schema_origin: Option<PathBuf>,
    /// For `lua`: the script file.
    pub script: Option<PathBuf>,
    /// For `lua`: per-call CPU and memory limits.
    pub lua_limits: LuaLimits,
    /// For `external`: where deliveries go and how replies are accepted.
    pub external: Option<ExternalConfig>,
    /// Where its handler runs: in this process, or on workers (through `organism.nats`).
    pub placement: Placement,
    /// The tenant it belongs to; `None`: the organism's own. A tenant's credentials see and
    /// touch only its tenant's listeners.
    pub tenant: Option<String>,
    /// Whether agents that tenants create through the API may name it as a peer.
    pub shared: bool,
    /// Where it is defined: the organism file, or the API (with its live script version).
    pub origin: ListenerOrigin,
    /// Its approval gate: messages it holds until a person decides.
    pub approval: Option<Arc<super::approval::Approval>>,
    /// For `human`: who answers, and how long a question waits.
    pub human: Option<Arc<super::approval::Human>>,
    /// For `llm`: its model, prompt, outputs and limits.
    pub llm: Option<Arc<super::llm::LlmConfig>>,
}

/// Where a listener is defined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListenerOrigin {
    /// The organism file.
    #[default]
    File,
    /// Created through the API (`POST /api/v1/agents`), running this script version.
    Api { version: u64 },
}

/// An external agent (SPEC §11.4): the pump POSTs each delivery to `input_url`; replies come
/// back by callback.
#[derive(Clone, PartialEq, Eq)]
pub struct ExternalConfig {
    pub input_url: String,
    /// The environment variable holding the callback token, if callbacks need one.
    pub token_env: Option<String>,
    /// Its value, read when the config is loaded. Never shown (`Debug` hides it).
    pub token: Option<String>,
    /// How long one POST to `input_url` may take.
    pub timeout: std::time::Duration,
    /// How long a reply is awaited after a delivery was accepted.
    pub reply_timeout: std::time::Duration,
}

impl fmt::Debug for ExternalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalConfig")
            .field("input_url", &display_url(&self.input_url))
            .field("token_env", &self.token_env)
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .field("timeout", &self.timeout)
            .field("reply_timeout", &self.reply_timeout)
            .finish()
    }
}

/// Defaults of an external listener.
pub const DEFAULT_EXTERNAL_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl ListenerConfig {
    /// The schema that validates `payload_type` for this listener, if it accepts it.
    pub fn schema_for(&self, payload_type: &PayloadType) -> Option<&Arc<Schema>> {
        self.accepts
            .iter()
            .find(|(t, _)| t == payload_type)
            .map(|(_, s)| s)
    }

    pub fn accepts_type(&self, payload_type: &PayloadType) -> bool {
        self.schema_for(payload_type).is_some()
    }
}

/// Why [`choose_type`] found no type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoType {
    /// No accepted type has the name asked for.
    NotAccepted,
    /// No name was given, and the listener accepts more than one type (or none) besides
    /// `huh`.
    Ambiguous,
}

/// The one rule for which of a listener's accepted types a sender means (the API's inject,
/// a Lua output, the schema lookup): the type `wanted` names ([`PayloadType::is_named`]); with no name,
/// the one accepted type other than `huh`.
pub fn choose_type<'a>(
    accepts: &'a [(PayloadType, Arc<Schema>)],
    wanted: Option<&str>,
) -> Result<&'a (PayloadType, Arc<Schema>), NoType> {
    match wanted {
        Some(w) => accepts
            .iter()
            .find(|(t, _)| t.is_named(w))
            .ok_or(NoType::NotAccepted),
        None => {
            let huh = PayloadType::huh();
            let mut own = accepts.iter().filter(|(t, _)| *t != huh);
            match (own.next(), own.next()) {
                (Some(one), None) => Ok(one),
                _ => Err(NoType::Ambiguous),
            }
        }
    }
}

/// Why [`json_payload`] wrote no XML.
#[derive(Debug)]
pub enum JsonPayloadError {
    /// No accepted type is the one meant ([`choose_type`]).
    Type(NoType),
    /// The JSON does not fit the type chosen.
    Map(PayloadType, crate::schema::MapError),
}

/// A JSON payload written as the XML of the accepted type `wanted` names (or the only one,
/// [`choose_type`]), in its schema's element order: the one way the API's inject, test
/// vectors and `agentserver send` take JSON.
pub fn json_payload(
    accepts: &[(PayloadType, Arc<Schema>)],
    wanted: Option<&str>,
    json: &serde_json::Value,
) -> Result<String, JsonPayloadError> {
    let (ty, schema) = choose_type(accepts, wanted).map_err(JsonPayloadError::Type)?;
    schema
        .json_to_payload(ty.local_name(), json)
        .map_err(|e| JsonPayloadError::Map(ty.clone(), e))
}

/// A validated organism: pure data, built and checked before anything runs.
#[derive(Debug, Clone)]
pub struct OrganismConfig {
    pub name: String,
    pub listen: String,
    /// `None` when `store: memory`.
    pub store: Option<PathBuf>,
    pub retention: Retention,
    pub scheduling: Scheduling,
    /// Web origins (`scheme://host[:port]`) besides the server's own whose pages may use
    /// the API's WebSockets and control requests (`api::browser`).
    pub allowed_origins: Vec<String>,
    /// Names (`host` or `host:port`) besides IP addresses, `localhost` and the listen host
    /// that the API answers to as `Host`.
    pub allowed_hosts: Vec<String>,
    /// HTTPS and WSS instead of HTTP and WS (paths resolved against the file's directory).
    pub tls: Option<TlsFiles>,
    /// `organism.nats`: set when listeners are placed on workers.
    pub nats: Option<NatsConfig>,
    /// The API serves the dashboard at `/` (`organism.dashboard`, default true; read at
    /// start).
    pub dashboard: bool,
    /// `organism.search.payload_text`: `q=` finds threads by their payloads' text too.
    pub payload_search: bool,
    /// `models:`: what `kind: llm` listeners call, by name.
    pub models: std::collections::BTreeMap<String, Arc<super::llm::ModelConfig>>,
    pub limits: Limits,
    pub auth: AuthConfig,
    pub listeners: Vec<ListenerConfig>,
    /// The file it came from, if any.
    pub source: Option<PathBuf>,
    /// The YAML text it was read from (unsanitized: the API serves a redacted copy).
    pub text: String,
    /// The listeners the API created, laid over the file's (their items as loaded).
    pub layer: Vec<LayerListener>,
    /// What each tenant's agents created through the API may use (`tenants:`).
    pub tenants: Tenants,
}

/// The ceilings of one tenant's agents created through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TenantQuotas {
    pub max_agents: usize,
    pub max_script_bytes: usize,
    pub max_versions: u64,
    pub cpu_ms_max: u64,
    pub memory_mb_max: usize,
    pub max_concurrency: usize,
    /// Injects per second by all the tenant's credentials together (none: no such limit).
    pub inject_per_s: Option<u32>,
    /// Threads opened by an inject to one of the tenant's listeners that may be active at
    /// once (another inject that would open or revive one is refused).
    pub max_active_threads: usize,
    /// Messages queued for or being handled in the threads it opened, at once: an inject
    /// at it is refused (429); a handler's output fails (and its thread) only at twice it,
    /// so work under way finishes and a fan-out does not grow without end.
    pub max_pending_messages: usize,
    /// Bytes of the payloads not yet handled in those threads, at once: bounded as
    /// `max_pending_messages` is.
    pub max_pending_bytes: usize,
    /// Inputs (held messages, questions) of the tenant's listeners open at once; one more
    /// is refused (an inject 429 `too_many_held`, a handler's output `failed`).
    pub max_open_inputs: usize,
    /// Bytes of the payloads of those inputs at once (apart from `limits.max_held_bytes`,
    /// the organism's): one more is refused as past `max_open_inputs`.
    pub max_held_bytes: usize,
    /// Threads waiting on the tenant's inputs at once, apart from `max_active_threads`, so
    /// a backlog of waiting threads does not block new work.
    pub max_waiting_threads: usize,
    /// Event streams (`/ws`, `/ws/messages`, a thread's events) its credentials hold open
    /// at once; one more is refused.
    pub max_streams: usize,
    /// Tokens its `kind: llm` listeners may use in a UTC day, and in a UTC month (none: no
    /// such limit): a call is refused before it is made when what it may take would pass
    /// either.
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
}

impl Default for TenantQuotas {
    fn default() -> Self {
        TenantQuotas {
            max_agents: 20,
            max_script_bytes: 256 * 1024,
            max_versions: 100,
            cpu_ms_max: 1000,
            memory_mb_max: 64,
            max_concurrency: 4,
            inject_per_s: None,
            max_active_threads: 1000,
            max_pending_messages: 10_000,
            max_pending_bytes: 256 * 1024 * 1024,
            max_open_inputs: 1000,
            max_held_bytes: 16 * 1024 * 1024,
            max_waiting_threads: 1000,
            max_streams: 64,
            tokens_per_day: None,
            tokens_per_month: None,
        }
    }
}

/// One entry of `tenants:` as written: each key optional, falling back to `default`'s.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantSection {
    pub max_agents: Option<usize>,
    pub max_script_bytes: Option<usize>,
    pub max_versions: Option<u64>,
    pub cpu_ms_max: Option<u64>,
    pub memory_mb_max: Option<usize>,
    pub max_concurrency: Option<usize>,
    pub inject_per_s: Option<u32>,
    pub max_active_threads: Option<usize>,
    pub max_pending_messages: Option<usize>,
    pub max_pending_bytes: Option<usize>,
    pub max_open_inputs: Option<usize>,
    pub max_held_bytes: Option<usize>,
    pub max_waiting_threads: Option<usize>,
    pub max_streams: Option<usize>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    /// The models its LLM listeners may use (none: any).
    pub models: Option<Vec<String>>,
    /// Its LLM listeners at most (none: no such limit).
    pub max_llm_agents: Option<usize>,
}

/// What a tenant's LLM listeners may be (`tenants.X.models`, `max_llm_agents`), checked
/// when the organism loads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLlm {
    pub models: Option<Vec<String>>,
    pub max_llm_agents: Option<usize>,
}

impl TenantSection {
    /// Its LLM rules over `base`'s (the `default` entry's).
    pub fn llm_over(&self, base: &TenantLlm) -> TenantLlm {
        TenantLlm {
            models: self.models.clone().or_else(|| base.models.clone()),
            max_llm_agents: self.max_llm_agents.or(base.max_llm_agents),
        }
    }

    pub fn over(self, base: TenantQuotas) -> TenantQuotas {
        TenantQuotas {
            max_agents: self.max_agents.unwrap_or(base.max_agents),
            max_script_bytes: self.max_script_bytes.unwrap_or(base.max_script_bytes),
            max_versions: self.max_versions.unwrap_or(base.max_versions),
            cpu_ms_max: self.cpu_ms_max.unwrap_or(base.cpu_ms_max),
            memory_mb_max: self.memory_mb_max.unwrap_or(base.memory_mb_max),
            max_concurrency: self.max_concurrency.unwrap_or(base.max_concurrency),
            inject_per_s: self.inject_per_s.or(base.inject_per_s),
            max_active_threads: self.max_active_threads.unwrap_or(base.max_active_threads),
            max_pending_messages: self
                .max_pending_messages
                .unwrap_or(base.max_pending_messages),
            max_pending_bytes: self.max_pending_bytes.unwrap_or(base.max_pending_bytes),
            max_open_inputs: self.max_open_inputs.unwrap_or(base.max_open_inputs),
            max_held_bytes: self.max_held_bytes.unwrap_or(base.max_held_bytes),
            max_waiting_threads: self.max_waiting_threads.unwrap_or(base.max_waiting_threads),
            max_streams: self.max_streams.unwrap_or(base.max_streams),
            tokens_per_day: self.tokens_per_day.or(base.tokens_per_day),
            tokens_per_month: self.tokens_per_month.or(base.tokens_per_month),
        }
    }
}

/// `tenants:`: quotas by tenant, and the `default` entry for tenants not named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    pub default: TenantQuotas,
    pub each: std::collections::BTreeMap<String, TenantQuotas>,
    /// Each named tenant's LLM rules, and (under `default`) every other tenant's.
    pub llm: std::collections::BTreeMap<String, TenantLlm>,
}

impl Tenants {
    /// The LLM rules of `tenant`, and the key they are written under.
    pub fn llm_of(&self, tenant: &str) -> (TenantLlm, String) {
        match self.llm.get(tenant) {
            Some(r) => (r.clone(), format!("tenants.{tenant}")),
            None => (
                self.llm.get("default").cloned().unwrap_or_default(),
                "tenants.default".to_string(),
            ),
        }
    }

    /// The quotas of `tenant`, and the key they are written under (for messages).
    pub fn of(&self, tenant: &str) -> (TenantQuotas, String) {
        match self.each.get(tenant) {
            Some(q) => (*q, format!("tenants.{tenant}")),
            None => (self.default, "tenants.default".to_string()),
        }
    }
}

impl OrganismConfig {
    pub fn listener(&self, name: &str) -> Option<&ListenerConfig> {
        self.listeners.iter().find(|l| l.name.as_str() == name)
    }
}

/// How API clients prove who they are (`auth:` in the organism file). No method means no
/// authentication: every client is the implicit admin, which only a loopback `listen` (or
/// `--insecure-no-auth`) allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    pub methods: Vec<AuthMethod>,
    /// `/metrics` without a credential.
    pub public_metrics: bool,
    /// With `store: memory`: the file the API keys come from (hashes only).
    pub keys_file: Option<PathBuf>,
    pub jwt: Option<JwtConfig>,
    /// Injects per second per credential (none: unlimited), and the burst above it.
    pub inject_per_s: Option<u32>,
    pub burst: Option<u32>,
    /// Failed authentications per minute per remote address (default 20), then 429.
    pub failed_auth_per_minute: Option<u32>,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        !self.methods.is_empty()
    }

    pub fn uses(&self, m: AuthMethod) -> bool {
        self.methods.contains(&m)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    /// API keys (`ask_…`), kept as hashes in the store or in `keys_file`.
    Keys,
    /// JSON Web Tokens signed by an issuer the organism trusts.
    Jwt,
}

/// How JWTs are verified (`auth.jwt`): HS256 with a secret from the environment, or
/// RS256/EdDSA with the public keys of a JWKS file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The environment variable holding the HS256 secret (never the secret itself).
    pub secret_env: Option<String>,
    /// A JWKS file of public keys (RS256, EdDSA).
    pub jwks_file: Option<PathBuf>,
    /// The `iss` a token must carry, when set.
    pub issuer: Option<String>,
    /// The `aud` a token must carry, when set.
    pub audience: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthSection {
    #[serde(default)]
    pub methods: Vec<AuthMethod>,
    #[serde(default)]
    pub public_metrics: bool,
    pub keys_file: Option<String>,
    pub jwt: Option<JwtConfig>,
    pub inject_per_s: Option<u32>,
    pub burst: Option<u32>,
    pub failed_auth_per_minute: Option<u32>,
}

/// Per-call limits of a Lua listener (`limits:` in its YAML section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LuaLimits {
    /// CPU budget per call, enforced by the VM interrupt.
    pub cpu_ms: u64,
    /// Memory cap of the Lua state.
    pub memory_mb: usize,
}

impl Default for LuaLimits {
    fn default() -> Self {
        LuaLimits {
            cpu_ms: 100,
            memory_mb: 16,
        }
    }
}

impl LuaLimits {
    pub fn cpu(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.cpu_ms)
    }

    /// The state's memory cap in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.memory_mb.saturating_mul(1024 * 1024)
    }

    /// How long a call may take in wall-clock time before the watchdog gives up on it.
    pub fn watchdog(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.cpu_ms.saturating_mul(4).saturating_add(1000))
    }
}

/// The URL with any user, password, query and fragment removed: safe to show in errors,
/// events and the API.
pub fn display_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "<not a URL>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_credentials() {
        assert_eq!(
            display_url("http://user:secret@127.0.0.1:9/in?key=abc#x"),
            "http://127.0.0.1:9/in"
        );
        assert_eq!(display_url("not a url"), "<not a URL>");
    }
}

/// One listener the API created.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerListener {
    /// Its definition as a listener item of the organism file (JSON).
    pub item: serde_json::Value,
    /// The script version it runs.
    pub version: u64,
}

impl LayerListener {
    pub fn name(&self) -> &str {
        self.item
            .get("name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    }
}
