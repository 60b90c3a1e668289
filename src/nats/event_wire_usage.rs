//! A model call (`usage`) and a partial output (`delta`) as the event mirror carries them
//! (`event_wire`, version 1): the same fields.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::events::{Delta, DeltaKind, Usage};

/// A `usage` on the stream: the same fields.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireUsage {
    tenant: Option<String>,
    listener: Arc<str>,
    thread_id: Arc<str>,
    message_id: Arc<str>,
    model: String,
    input_tokens: u64,
    output_tokens: u64,
    cached_tokens: u64,
    cost_micros: u64,
    estimated: bool,
    ms: u64,
}

impl From<&Usage> for WireUsage {
    fn from(u: &Usage) -> Self {
        let u = u.clone();
        WireUsage {
            tenant: u.tenant,
            listener: u.listener,
            thread_id: u.thread_id,
            message_id: u.message_id,
            model: u.model,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cached_tokens,
            cost_micros: u.cost_micros,
            estimated: u.estimated,
            ms: u.ms,
        }
    }
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Self {
        Usage {
            tenant: u.tenant,
            listener: u.listener,
            thread_id: u.thread_id,
            message_id: u.message_id,
            model: u.model,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cached_tokens,
            cost_micros: u.cost_micros,
            estimated: u.estimated,
            ms: u.ms,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireDelta {
    thread_id: Arc<str>,
    agent: Arc<str>,
    in_reply_to: Arc<str>,
    kind: DeltaKind,
    index: u64,
    delta: String,
}

impl From<&Delta> for WireDelta {
    fn from(d: &Delta) -> Self {
        WireDelta {
            thread_id: d.thread_id.clone(),
            agent: d.agent.clone(),
            in_reply_to: d.in_reply_to.clone(),
            kind: d.kind,
            index: d.index,
            delta: d.delta.clone(),
        }
    }
}

impl From<WireDelta> for Delta {
    fn from(d: WireDelta) -> Self {
        Delta {
            thread_id: d.thread_id,
            agent: d.agent,
            in_reply_to: d.in_reply_to,
            kind: d.kind,
            index: d.index,
            delta: d.delta,
        }
    }
}
