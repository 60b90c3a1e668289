//! An LLM listener's outputs as function tools: for each payload type of `outputs`, a tool
//! `send_<listener>__<Type>` for each listener it may send to that accepts it, whose
//! parameters are that listener's JSON Schema of the type; a type no such listener accepts
//! is `reply__<Type>`, back to the sender. Made from the listeners in service now, so a
//! reload that changes a peer changes the tools.

use serde_json::{json, Value};

use crate::config::ListenerConfig;

/// A tool's name at most, in characters (OpenAI's limit).
const MAX_TOOL_NAME: usize = 64;

/// One tool: where its calls go and as what.
#[derive(Debug, Clone)]
pub(super) struct Tool {
    pub name: String,
    /// The listener; `None`: the sender of the message handled.
    pub to: Option<String>,
    pub payload_type: String,
    /// As the protocol sends it (`{"type": "function", "function": {…}}`).
    pub spec: Value,
}

/// The tools of `me` with `outputs`, among `listeners`.
pub(super) fn tools(
    me: &ListenerConfig,
    outputs: &[String],
    listeners: &[ListenerConfig],
) -> Vec<Tool> {
    let mut out: Vec<Tool> = Vec::new();
    for ty in outputs {
        let mut sent = false;
        for l in listeners {
            let named = me.names_peer(l.name.as_str());
            let allowed = match &me.peers {
                Some(_) => named,
                None => !me.agent,
            };
            if l.name == me.name || !allowed || !me.may_reach(l, named) {
                continue;
            }
            let Some((t, schema)) = l.accepts.iter().find(|(t, _)| t.is_named(ty)) else {
                continue;
            };
            sent = true;
            let parameters = schema
                .json_schema(t.local_name())
                .unwrap_or_else(|| json!({"type": "object"}));
            let description = format!("Send a `{ty}` to `{}`: {}", l.name, l.description.trim());
            push(
                &mut out,
                format!("send_{}__{}", l.name, t.local_name()),
                Some(l.name.to_string()),
                ty,
                description,
                parameters,
            );
        }
        if !sent {
            // Written as the sender's schema says, when the sender is a listener.
            let parameters = listeners
                .iter()
                .flat_map(|l| &l.accepts)
                .find(|(t, _)| t.is_named(ty))
                .and_then(|(t, s)| s.json_schema(t.local_name()))
                .unwrap_or_else(|| json!({"type": "object"}));
            push(
                &mut out,
                format!("reply__{ty}"),
                None,
                ty,
                format!("Answer the sender with a `{ty}`"),
                parameters,
            );
        }
    }
    out
}

/// Adds a tool, its name made fit for the protocol (`[A-Za-z0-9_-]`, at most 64
/// characters) and unique.
fn push(
    out: &mut Vec<Tool>,
    wanted: String,
    to: Option<String>,
    ty: &str,
    description: String,
    parameters: Value,
) {
    let mut name: String = wanted
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_TOOL_NAME)
        .collect();
    if out.iter().any(|t| t.name == name) {
        let suffix = format!("_{}", out.len());
        name.truncate(MAX_TOOL_NAME - suffix.len());
        name.push_str(&suffix);
    }
    let spec = json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    });
    out.push(Tool {
        name,
        to,
        payload_type: ty.to_string(),
        spec,
    });
}
