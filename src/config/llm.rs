//! `models:` (the language models an organism's `kind: llm` listeners call: operator-owned,
//! keys only by environment variable) and a `kind: llm` listener's own keys (`model`,
//! `system`, `outputs`, `reply`, `limits`), as written and as checked.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::check_sections::env_secret;
use super::{within, Collector};
use super::{ListenerKind, ListenerSection};

/// How long one call to a model may take, by default.
pub const DEFAULT_MODEL_TIMEOUT_MS: u64 = 60_000;
/// Calls to one model at once, by default.
pub const DEFAULT_MODEL_CONCURRENCY: usize = 8;
/// A reply's tokens at most, by default (`limits.max_tokens`).
pub const DEFAULT_MAX_TOKENS: u32 = 1024;
/// Calls to the model for one message at most, by default (`limits.max_rounds`): the first,
/// and repairs of outputs the schema refused.
pub const DEFAULT_MAX_ROUNDS: u32 = 3;
/// Most rounds a listener may allow.
pub const MAX_ROUNDS: u32 = 10;
/// A system prompt's bytes at most.
pub const MAX_SYSTEM_BYTES: usize = 256 * 1024;

/// `models.NAME` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelSection {
    #[serde(default)]
    provider: ProviderKind,
    base_url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
    timeout_ms: Option<u64>,
    max_concurrency: Option<usize>,
    price: Option<Price>,
    responses: Option<Vec<TurnSection>>,
}

/// What a model's tokens cost, per million, in the operator's currency (`usage`'s
/// `cost_micros` is in millionths of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(default)]
    pub input_per_mtok: f64,
    #[serde(default)]
    pub output_per_mtok: f64,
}

impl Price {
    /// The cost of `input` and `output` tokens, in millionths (of a currency unit per million
    /// tokens, so one token at a price of 1.0 costs 1).
    pub fn micros(&self, input: u64, output: u64) -> u64 {
        let cost = input as f64 * self.input_per_mtok + output as f64 * self.output_per_mtok;
        cost.round().clamp(0.0, u64::MAX as f64) as u64
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ProviderKind {
    /// Any server speaking OpenAI's chat-completions protocol.
    #[default]
    Openai,
    /// Answers from a list, in turn: for demos and tests, never a real model.
    Scripted,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnSection {
    text: Option<String>,
    tool: Option<String>,
    arguments: Option<serde_json::Value>,
}

/// A model the organism's `kind: llm` listeners may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    pub provider: Provider,
    /// How long one call may take.
    pub timeout: Duration,
    /// Calls to it at once, from one listener.
    pub max_concurrency: usize,
    /// What its tokens cost (none: 0).
    pub price: Price,
}

/// Who answers.
#[derive(Clone, PartialEq)]
pub enum Provider {
    /// `POST {base_url}/chat/completions`.
    OpenAi {
        base_url: String,
        model: String,
        api_key_env: Option<String>,
        /// Read when the config is loaded. Never shown (`Debug` hides it).
        api_key: Option<String>,
    },
    /// The answers of `responses`, one a call, in turn (round the list).
    Scripted { turns: Vec<Turn> },
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provider::OpenAi {
                base_url,
                model,
                api_key_env,
                api_key,
            } => f
                .debug_struct("OpenAi")
                .field("base_url", &super::display_url(base_url))
                .field("model", model)
                .field("api_key_env", api_key_env)
                .field("api_key", &api_key.as_ref().map(|_| "<hidden>"))
                .finish(),
            Provider::Scripted { turns } => {
                f.debug_struct("Scripted").field("turns", turns).finish()
            }
        }
    }
}

/// One scripted answer: text, or one call of a tool with its arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    Text(String),
    Tool {
        name: String,
        arguments: serde_json::Value,
    },
}

/// `models:`: each model checked (a problem named by its key), the good ones by name.
pub(super) fn models(
    v: Option<&yaml_serde::Value>,
    c: &mut Collector,
) -> BTreeMap<String, Arc<ModelConfig>> {
    let mut out = BTreeMap::new();
    let Some(v) = v else {
        return out;
    };
    let Some(entries) = v.as_mapping() else {
        c.push(None, Some("models"), "is a map of model names to models");
        return out;
    };
    for (name, entry) in entries {
        let name = name.as_str().unwrap_or_default().to_string();
        let secrets = super::secret::literals(entry);
        for (path, key) in &secrets {
            c.push(
                None,
                Some(&format!("models.{name}.{path}")),
                format!(
                    "holds a secret in the file; put it in an environment variable and name \
                     the variable instead (`{key}_env: VARIABLE`)"
                ),
            );
        }
        if !secrets.is_empty() {
            continue;
        }
        match super::read::read::<ModelSection>(entry) {
            Ok(m) => {
                if let Some(model) = model(&name, m, c) {
                    out.insert(name, Arc::new(model));
                }
            }
            Err(e) => c.push(
                None,
                Some(&within(&format!("models.{name}"), e.key)),
                e.message,
            ),
        }
    }
    out
}

fn model(name: &str, m: ModelSection, c: &mut Collector) -> Option<ModelConfig> {
    let before = c.errors.len();
    let key = |k: &str| format!("models.{name}.{k}");
    if !super::valid_tenant(name) {
        c.push(
            None,
            Some(&format!("models.{name}")),
            "a model's name is 1-64 letters, digits, `.`, `_` or `-`",
        );
    }
    let timeout_ms = m.timeout_ms.unwrap_or(DEFAULT_MODEL_TIMEOUT_MS);
    if timeout_ms == 0 {
        c.push(None, Some(&key("timeout_ms")), "must be at least 1");
    }
    let max_concurrency = m.max_concurrency.unwrap_or(DEFAULT_MODEL_CONCURRENCY);
    let price = m.price.unwrap_or_default();
    if !(price.input_per_mtok >= 0.0 && price.output_per_mtok >= 0.0) {
        c.push(None, Some(&key("price")), "prices are 0 or more");
    }
    if max_concurrency == 0 {
        c.push(None, Some(&key("max_concurrency")), "must be at least 1");
    }
    let provider = match m.provider {
        ProviderKind::Openai => {
            if m.responses.is_some() {
                c.push(
                    None,
                    Some(&key("responses")),
                    "is for `provider: scripted` only",
                );
            }
            let base_url = m.base_url.unwrap_or_default();
            match reqwest::Url::parse(&base_url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {}
                _ => c.push(
                    None,
                    Some(&key("base_url")),
                    "required: the server's http:// or https:// URL, up to `/v1`",
                ),
            }
            let model = m.model.unwrap_or_default();
            if model.trim().is_empty() {
                c.push(
                    None,
                    Some(&key("model")),
                    "required: the model's name on its server",
                );
            }
            let api_key = m.api_key_env.as_deref().and_then(|var| {
                env_secret(var, None, &key("api_key_env"), "the model's API key", c)
            });
            Provider::OpenAi {
                base_url: base_url.trim_end_matches('/').to_string(),
                model,
                api_key_env: m.api_key_env,
                api_key,
            }
        }
        ProviderKind::Scripted => {
            for (k, given) in [
                ("base_url", m.base_url.is_some()),
                ("model", m.model.is_some()),
                ("api_key_env", m.api_key_env.is_some()),
            ] {
                if given {
                    c.push(
                        None,
                        Some(&key(k)),
                        "does not apply to `provider: scripted`",
                    );
                }
            }
            let turns = scripted(m.responses.unwrap_or_default(), &key("responses"), c);
            Provider::Scripted { turns }
        }
    };
    (c.errors.len() == before).then(|| ModelConfig {
        name: name.to_string(),
        provider,
        timeout: Duration::from_millis(timeout_ms),
        max_concurrency,
        price,
    })
}

fn scripted(turns: Vec<TurnSection>, key: &str, c: &mut Collector) -> Vec<Turn> {
    if turns.is_empty() {
        c.push(
            None,
            Some(key),
            "a scripted model needs at least one response",
        );
    }
    let mut out = Vec::new();
    for (i, t) in turns.into_iter().enumerate() {
        let at = format!("{key}[{i}]");
        match (t.text, t.tool, t.arguments) {
            (Some(text), None, None) => out.push(Turn::Text(text)),
            (None, Some(name), arguments) => out.push(Turn::Tool {
                name,
                arguments: arguments.unwrap_or_else(|| serde_json::json!({})),
            }),
            _ => c.push(
                None,
                Some(&at),
                "a response is `{text: …}` or `{tool: NAME, arguments: {…}}`",
            ),
        }
    }
    out
}

/// A `kind: llm` listener's own settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The name of its model in `models:`.
    pub model: Arc<ModelConfig>,
    pub system: SystemPrompt,
    /// The payload types it may send, each by a tool: to each listener it may reach that
    /// accepts it, or, when none does, back to the sender.
    pub outputs: Vec<String>,
    /// What a plain-text answer becomes: this payload type, the text in this field, to the
    /// sender. Without it, a plain-text answer sends nothing.
    pub reply: Option<Reply>,
    pub max_tokens: u32,
    pub max_rounds: u32,
    pub temperature: Option<f64>,
    /// Its answers streamed: each piece published as a `delta` event as it comes.
    pub stream: bool,
    /// `context: {history: thread}`: at most this many of the thread's earlier messages to
    /// and from it become the conversation before the message handled. `None`: none.
    pub history: Option<usize>,
    /// `budget: {tokens_per_thread}`: the tokens its calls may take in one thread.
    pub tokens_per_thread: Option<u64>,
    /// What a thread's `settings` may change for it (`overridable:`).
    pub overridable: Vec<Overridable>,
    /// The models a thread's `settings` may choose for it: every model of `models:` when
    /// `model` is overridable, those of its tenant's `models` for a tenant's listener.
    pub choices: Vec<Arc<ModelConfig>>,
}

/// A thread's settings; every key optional, absent meaning the listener's own.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadSettings {
    /// A model of `models:` by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

impl ThreadSettings {
    pub fn is_empty(&self) -> bool {
        self.model.is_none() && self.temperature.is_none()
    }

    /// As kept: `None` when nothing is set.
    pub fn kept(self) -> Option<Arc<ThreadSettings>> {
        (!self.is_empty()).then(|| Arc::new(self))
    }
}

/// A setting a thread may change for a `kind: llm` listener that names it in `overridable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overridable {
    Model,
    Temperature,
}

impl LlmConfig {
    /// Whether a thread's `settings` may change `what` for it.
    pub fn may_override(&self, what: Overridable) -> bool {
        self.overridable.contains(&what)
    }

    /// The model a thread's settings choose, if it may choose it.
    pub fn choice(&self, name: &str) -> Option<&Arc<ModelConfig>> {
        self.choices.iter().find(|m| m.name == name)
    }
}

/// A listener's `budget:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetSection {
    tokens_per_thread: u64,
}

/// A listener's `context:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ContextSection {
    history: HistoryMode,
    max_messages: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum HistoryMode {
    Thread,
    None,
}

/// Earlier messages a listener's context holds, by default.
pub const DEFAULT_CONTEXT_MESSAGES: usize = 30;
/// ... and at most.
pub const MAX_CONTEXT_MESSAGES: usize = 1000;

/// The system prompt: inline text, or a file read when the handler is built and again at
/// each reload of the listener.
#[derive(Debug, Clone, PartialEq)]
pub enum SystemPrompt {
    Inline(String),
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    #[serde(rename = "type")]
    pub payload_type: String,
    pub text_field: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    max_tokens: Option<u32>,
    max_rounds: Option<u32>,
    temperature: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SystemFile {
    file: String,
}

/// A `kind: llm` listener's keys, checked against `models`; `None` for another kind (whose
/// use of them `check_keys_apply` reports) or when a problem was found.
pub(super) fn check_llm(
    s: &ListenerSection,
    base: &Path,
    models: &BTreeMap<String, Arc<ModelConfig>>,
    c: &mut Collector,
) -> Option<Arc<LlmConfig>> {
    if s.kind != ListenerKind::Llm {
        return None;
    }
    let l = Some(s.name.as_str());
    let before = c.errors.len();
    let model = match s.model.as_deref() {
        None => {
            c.push(l, Some("model"), "required: one of `models:`");
            None
        }
        Some(m) => {
            let found = models.get(m).cloned();
            if found.is_none() {
                let known: Vec<&str> = models.keys().map(String::as_str).collect();
                c.push(
                    l,
                    Some("model"),
                    format!(
                        "no model named `{m}` in `models:` (defined: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
            }
            found
        }
    };
    let system = system_prompt(s, base, c);
    let outputs = s.outputs.clone().unwrap_or_default();
    for o in &outputs {
        if o.is_empty() || o.contains(char::is_whitespace) {
            c.push(
                l,
                Some("outputs"),
                format!("`{o}` is not a payload type name"),
            );
        }
    }
    if let Some(r) = &s.reply {
        if r.text_field.is_empty() || r.payload_type.is_empty() {
            c.push(l, Some("reply"), "needs `type` and `text_field`");
        }
    }
    let mut limits = LimitsSection::default();
    if let Some(v) = &s.limits {
        match yaml_serde::from_value::<LimitsSection>(v.clone()) {
            Ok(lim) => limits = lim,
            Err(e) => c.push(l, Some("limits"), e.to_string()),
        }
    }
    let max_rounds = limits.max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS);
    if !(1..=MAX_ROUNDS).contains(&max_rounds) {
        c.push(
            l,
            Some("limits"),
            format!("max_rounds must be 1 to {MAX_ROUNDS}"),
        );
    }
    let max_tokens = limits.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 {
        c.push(l, Some("limits"), "max_tokens must be at least 1");
    }
    if limits
        .temperature
        .is_some_and(|t| !(0.0..=2.0).contains(&t))
    {
        c.push(l, Some("limits"), "temperature must be 0 to 2");
    }
    let history = match &s.context {
        Some(ContextSection {
            history: HistoryMode::Thread,
            max_messages,
        }) => {
            let n = max_messages.unwrap_or(DEFAULT_CONTEXT_MESSAGES);
            if !(1..=MAX_CONTEXT_MESSAGES).contains(&n) {
                c.push(
                    l,
                    Some("context"),
                    format!("max_messages must be 1 to {MAX_CONTEXT_MESSAGES}"),
                );
            }
            Some(n)
        }
        _ => None,
    };
    let overridable = overridable(s);
    if c.errors.len() != before {
        return None;
    }
    Some(Arc::new(LlmConfig {
        model: model?,
        system: system?,
        outputs,
        reply: s.reply.clone(),
        max_tokens,
        max_rounds,
        temperature: limits.temperature,
        stream: s.stream.unwrap_or(false),
        history,
        tokens_per_thread: s.budget.as_ref().map(|b| b.tokens_per_thread),
        choices: if overridable.contains(&Overridable::Model) {
            models.values().cloned().collect()
        } else {
            Vec::new()
        },
        overridable,
    }))
}

/// A listener's `overridable`, each setting once.
fn overridable(s: &ListenerSection) -> Vec<Overridable> {
    let mut o = s.overridable.clone().unwrap_or_default();
    o.sort_unstable_by_key(|o| *o as u8);
    o.dedup();
    o
}

fn system_prompt(s: &ListenerSection, base: &Path, c: &mut Collector) -> Option<SystemPrompt> {
    let l = Some(s.name.as_str());
    let v = s.system.as_ref().or_else(|| {
        c.push(
            l,
            Some("system"),
            "required: the instructions, inline or `{file: PATH}`",
        );
        None
    })?;
    if let Some(text) = v.as_str() {
        if text.len() > MAX_SYSTEM_BYTES {
            c.push(
                l,
                Some("system"),
                format!("is over {MAX_SYSTEM_BYTES} bytes"),
            );
        }
        return Some(SystemPrompt::Inline(text.to_string()));
    }
    match yaml_serde::from_value::<SystemFile>(v.clone()) {
        Ok(f) => {
            let path = base.join(&f.file);
            match read_system(&path) {
                Ok(_) => Some(SystemPrompt::File(path)),
                Err(e) => {
                    c.push(l, Some("system"), e);
                    None
                }
            }
        }
        Err(_) => {
            c.push(
                l,
                Some("system"),
                "is the instructions as text, or `{file: PATH}`",
            );
            None
        }
    }
}

/// Each tenant's LLM listeners against its rules: a model of `tenants.X.models` (each of
/// which `models:` defines), at most `max_llm_agents` of them.
pub(super) fn check_tenants(
    listeners: &mut [super::ListenerConfig],
    tenants: &super::Tenants,
    models: &BTreeMap<String, Arc<ModelConfig>>,
    c: &mut Collector,
) {
    for (name, rules) in &tenants.llm {
        for m in rules.models.iter().flatten() {
            if !models.contains_key(m) {
                c.push(
                    None,
                    Some(&format!("tenants.{name}.models")),
                    format!("no model named `{m}` in `models:`"),
                );
            }
        }
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in listeners.iter_mut().filter(|l| l.kind == ListenerKind::Llm) {
        let (Some(tenant), Some(llm)) = (l.tenant.as_deref(), &mut l.llm) else {
            continue;
        };
        let (rules, key) = tenants.llm_of(tenant);
        if let Some(allowed) = &rules.models {
            Arc::make_mut(llm)
                .choices
                .retain(|m| allowed.contains(&m.name));
            if !allowed.contains(&llm.model.name) {
                let list = if allowed.is_empty() {
                    "no model".to_string()
                } else {
                    allowed.join(", ")
                };
                c.push(
                    Some(l.name.as_str()),
                    Some("model"),
                    format!("tenant `{tenant}` may use only {list} ({key}.models)"),
                );
            }
        }
        let n = counts.entry(tenant).or_default();
        *n += 1;
        if rules.max_llm_agents.is_some_and(|max| *n == max + 1) {
            c.push(
                Some(l.name.as_str()),
                Some("kind"),
                format!(
                    "tenant `{tenant}` may have at most {} llm listeners ({key}.max_llm_agents)",
                    rules.max_llm_agents.unwrap_or_default()
                ),
            );
        }
    }
}

impl super::OrganismConfig {
    /// The tenants that have `kind: llm` listeners, each once, in order.
    pub fn llm_tenants(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .listeners
            .iter()
            .filter(|l| l.llm.is_some())
            .filter_map(|l| l.tenant.as_deref())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A system prompt's file, read: UTF-8, at most [`MAX_SYSTEM_BYTES`].
pub fn read_system(path: &Path) -> Result<String, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > MAX_SYSTEM_BYTES as u64 {
        return Err(format!(
            "{} is over {MAX_SYSTEM_BYTES} bytes",
            path.display()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}
