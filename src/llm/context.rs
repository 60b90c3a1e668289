//! A thread's earlier messages as the conversation before the message handled
//! (`context: {history: thread}`): each message to this listener a `user` turn, each it
//! sent an `assistant` turn, as JSON (`{from|to, type, payload}`); superseded, refused and
//! undeliverable ones left out; the newest `max_messages`, and no more than
//! [`MAX_CONTEXT_BYTES`] of them.

use serde_json::{json, Value};

use crate::config::ListenerConfig;
use crate::threads::{MessageRecord, MessageStatus};
use crate::xml::PayloadType;

/// A context's payloads, in bytes, at most: the newest that fit.
pub const MAX_CONTEXT_BYTES: usize = 1024 * 1024;

/// A thread's messages, as the organism holds them.
pub trait ThreadHistory: Send + Sync {
    fn messages(&self, thread: &str) -> Vec<MessageRecord>;
}

/// The turns before message `current` of `thread`, for `me`.
pub(super) fn turns(
    history: &dyn ThreadHistory,
    me: &ListenerConfig,
    thread: &str,
    current: &str,
    max_messages: usize,
) -> Vec<Value> {
    let messages = history.messages(thread);
    let before = messages
        .iter()
        .position(|m| &*m.id == current)
        .unwrap_or(messages.len());
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for m in messages[..before].iter().rev() {
        if out.len() == max_messages {
            break;
        }
        if matches!(
            m.status,
            MessageStatus::Superseded | MessageStatus::Rejected | MessageStatus::Undeliverable
        ) {
            continue;
        }
        let to_me = m.to.as_deref() == Some(me.name.as_str());
        let from_me = *m.from == *me.name.as_str();
        if !to_me && !from_me {
            continue;
        }
        bytes += m.payload_xml.len();
        if bytes > MAX_CONTEXT_BYTES {
            break;
        }
        out.push(turn(m, me, to_me));
    }
    out.reverse();
    out
}

fn turn(m: &MessageRecord, me: &ListenerConfig, to_me: bool) -> Value {
    let ty = m.payload_type.as_deref().unwrap_or_default();
    if to_me {
        return user_turn(me, &m.from, &PayloadType::parse(ty), &m.payload_xml);
    }
    let content = json!({
        "to": m.to.as_deref(),
        "type": ty,
        "payload": crate::schema::payload_json(None, &m.payload_xml),
    });
    json!({"role": "assistant", "content": content.to_string()})
}

/// A message to `me` as the model reads it: a `user` turn, `{from, type, payload}` as JSON,
/// the payload typed by the schema `me` accepts it with (the message handled, or an earlier
/// one of its thread).
pub(super) fn user_turn(me: &ListenerConfig, from: &str, ty: &PayloadType, xml: &str) -> Value {
    let schema = me.schema_for(ty).map(|s| &**s);
    let content = json!({
        "from": from,
        "type": ty.to_string(),
        "payload": crate::schema::payload_json(schema, xml),
    });
    json!({"role": "user", "content": content.to_string()})
}
