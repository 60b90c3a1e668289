//! What the pump and workers send each other, as JSON.

use serde::{Deserialize, Serialize};

use crate::config::ListenerConfig;

/// One delivery to a placed listener (subject `<prefix>.work.<listener>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkItem {
    /// The delivered message's id; also the item's `Nats-Msg-Id`.
    pub message_id: String,
    pub thread_id: String,
    pub from: String,
    pub listener: String,
    /// The payload as the pump validated it (normalized XML); the worker validates it
    /// again against its own copy of the listener's schema.
    pub payload_xml: String,
    /// Random, per delivery: a result must echo it to be accepted.
    pub nonce: String,
    /// [`listener_version`] of the listener as the pump runs it: a worker whose file
    /// differs reloads it, and refuses the delivery if it still differs.
    pub version: String,
    /// The approval that let it through a gate, if one did (Lua `meta.approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::listener::Approved>,
    /// The thread's `settings` (for a `kind: llm` listener).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<crate::threads::ThreadSettings>,
}

/// A worker's answer to one [`WorkItem`] (subject `<prefix>.results`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkResult {
    pub message_id: String,
    pub nonce: String,
    /// The worker that ran it, for the log.
    #[serde(default)]
    pub worker: String,
    /// The handler's outputs, as raw text: the pump reads and validates them.
    #[serde(default)]
    pub outputs: Vec<WorkOutput>,
    /// The handler failed (or the worker could not run it): why.
    #[serde(default)]
    pub error: Option<String>,
    /// The lines the handler logged (Lua `log.*`) while it ran, in order.
    #[serde(default)]
    pub logs: Vec<WorkLog>,
    /// A `kind: llm` handler's calls to its model, as the pump accounts them (at most
    /// [`MAX_USAGE_ROWS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<WorkUsage>,
}

/// One call of a `kind: llm` handler on a worker to its model. The pump takes the tokens
/// and the model's name (one the listener may use, or its own), and prices it itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkUsage {
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    #[serde(default)]
    pub estimated: bool,
    #[serde(default)]
    pub ms: u64,
}

/// Calls a result reports, at most: a handler makes at most `limits.max_rounds` (at most
/// 10) a message.
pub const MAX_USAGE_ROWS: usize = 16;

/// One line a handler logged on a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkLog {
    pub level: String,
    pub message: String,
}

/// Lines a result carries back, at most (more are counted in one last line).
pub const MAX_LOG_LINES: usize = 100;

/// Bytes of one log line carried back, at most.
pub const MAX_LOG_LINE_BYTES: usize = 4096;

/// One handler output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkOutput {
    pub payload: String,
    #[serde(default)]
    pub to: Option<String>,
}

/// What a listener's handler is made of, hashed: its kind, handler name, `config`, script
/// text, Lua limits and schemas (not the files' paths, which differ between machines).
/// Equal on the pump and a worker when both run the same listener.
pub fn listener_version(l: &ListenerConfig) -> String {
    use sha2::Digest;
    let script = l
        .script
        .as_ref()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default());
    let schemas: Vec<String> = l
        .accepts
        .iter()
        .map(|(t, s)| format!("{t}={}", s.xsd()))
        .collect();
    let text = format!(
        "{:?}",
        (
            l.kind.to_string(),
            &l.handler,
            l.config.to_string(),
            script,
            l.lua_limits.cpu_ms,
            l.lua_limits.memory_mb,
            schemas,
        )
    );
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}
