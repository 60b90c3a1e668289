//! What a stream session sends besides events: the frames that tell a client what it
//! missed (`dropped`, `folded`, `resync_required`), what `/ws` folding holds back
//! (`agent_states`), and the close a protocol error gets.

use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};
use serde_json::{json, Value};

use super::super::filter::Filter;
use crate::events::{Event, EventKind};
use crate::time::Timestamp;

pub(in crate::api) fn text(value: &Value) -> Message {
    Message::Text(Utf8Bytes::from(value.to_string()))
}

/// Frames not sent to this client, waiting to be reported: `count` in all, of which
/// `messages` were `message` events dropped at the client's queue and `lagged` events the
/// session fell behind the hub for (their kinds unknown).
#[derive(Debug, Clone, Copy)]
pub(in crate::api) struct Dropped {
    count: u64,
    messages: u64,
    lagged: u64,
    from_seq: u64,
    to_seq: u64,
}

impl Dropped {
    pub(in crate::api) fn add(
        this: Option<Dropped>,
        count: u64,
        from_seq: u64,
        to_seq: u64,
    ) -> Dropped {
        match this {
            None => Dropped {
                count,
                messages: 0,
                lagged: 0,
                from_seq,
                to_seq,
            },
            Some(d) => Dropped {
                count: d.count + count,
                from_seq: d.from_seq,
                to_seq,
                ..d
            },
        }
    }

    /// Says how many of those just added were messages, and how many lost behind the hub.
    pub(in crate::api) fn of_which(mut self, messages: u64, lagged: u64) -> Dropped {
        self.messages += messages;
        self.lagged += lagged;
        self
    }
}

/// An agent's latest state held back: its `seq`, state and thread.
type Held = (u64, crate::events::AgentState, Option<std::sync::Arc<str>>);

/// What a `/ws` session holds back when its client asked for fewer frames
/// (`coalesce_ms`, `max_messages_per_s`), until the next flush.
#[derive(Default)]
pub(in crate::api) struct Folding {
    /// Each agent's latest state: its `seq`, state and thread.
    states: crate::hash::SeededMap<std::sync::Arc<str>, Held>,
    /// States replaced by a later one of the same agent before a flush.
    replaced: u64,
    /// The current second of message traffic: when it began, and how many were sent in it.
    window: Option<(Instant, u64)>,
    /// Message events not sent, not yet told.
    pub(super) folded: Option<Dropped>,
}

impl Folding {
    /// How often what `filter` folds goes out: the coalescing interval, or every second for
    /// the message rate alone; `None` when it folds nothing.
    pub(in crate::api) fn every(filter: &Filter) -> Option<Duration> {
        match (filter.coalesce_ms, filter.max_messages_per_s) {
            (Some(ms), _) => Some(Duration::from_millis(ms)),
            (None, Some(_)) => Some(Duration::from_secs(1)),
            (None, None) => None,
        }
    }

    /// Holds back an event `filter` asks to fold (true), or lets it go (false).
    pub(in crate::api) fn hold(&mut self, filter: &Filter, ev: &Event) -> bool {
        match &ev.kind {
            EventKind::AgentState {
                agent,
                state,
                current_thread,
            } if filter.coalesce_ms.is_some() => {
                let held = (ev.seq, *state, current_thread.clone());
                if self.states.insert(agent.clone(), held).is_some() {
                    self.replaced += 1;
                }
                true
            }
            EventKind::Message { .. } | EventKind::MessageStatus { .. } => {
                let Some(rate) = filter.max_messages_per_s else {
                    return false;
                };
                let now = Instant::now();
                let (start, sent) = match self.window {
                    Some((start, sent)) if now.duration_since(start) < Duration::from_secs(1) => {
                        (start, sent)
                    }
                    _ => (now, 0),
                };
                if sent < rate {
                    self.window = Some((start, sent + 1));
                    return false;
                }
                self.window = Some((start, sent));
                self.folded = Some(Dropped::add(self.folded, 1, ev.seq, ev.seq));
                true
            }
            _ => false,
        }
    }

    pub(in crate::api) fn is_empty(&self) -> bool {
        self.states.is_empty() && self.folded.is_none()
    }

    /// The agents' latest states held back, in one `agent_states` frame (emptied), at
    /// `seen`, the `seq` of the last event offered, so `seq` never goes back.
    pub(in crate::api) fn states_frame(&mut self, seen: u64) -> Option<Message> {
        if self.states.is_empty() {
            return None;
        }
        let mut states: Vec<_> = self.states.drain().collect();
        states.sort_by_key(|(_, (seq, _, _))| *seq);
        let states: Vec<Value> = states
            .into_iter()
            .map(|(agent, (seq, state, thread))| {
                json!({
                    "agent": agent,
                    "state": crate::api::view::AgentState::from(state),
                    "current_thread": thread,
                    "seq": seq,
                })
            })
            .collect();
        Some(text(&json!({
            "event": "agent_states",
            "seq": seen,
            "timestamp": Timestamp::now(),
            "states": states,
            "replaced": std::mem::take(&mut self.replaced),
        })))
    }

    /// The `folded` frame counting the message events not sent (taken; put it back if the
    /// frame cannot go out), at `seen`.
    pub(in crate::api) fn folded_frame(&mut self, seen: u64) -> Option<(Message, Dropped)> {
        let f = self.folded.take()?;
        let frame = text(&json!({
            "event": "folded",
            "seq": seen,
            "timestamp": Timestamp::now(),
            "kind": "message",
            "count": f.count,
            "from_seq": f.from_seq,
            "to_seq": f.to_seq,
        }));
        Some((frame, f))
    }
}

/// A client asked to resume `since` a point no longer held: the oldest held is `oldest`.
pub(in crate::api) fn resync_frame(seq: u64, since: Option<u64>, oldest: u64) -> Value {
    json!({
        "event": "resync_required",
        "seq": seq,
        "timestamp": Timestamp::now(),
        "since": since,
        "oldest_seq": oldest,
    })
}

pub(in crate::api) fn dropped_frame(d: Dropped) -> Message {
    text(&json!({
        "event": "dropped",
        "seq": d.to_seq,
        "timestamp": Timestamp::now(),
        "count": d.count,
        "messages": d.messages,
        "lagged": d.lagged,
        "from_seq": d.from_seq,
        "to_seq": d.to_seq,
    }))
}

pub(super) fn frame_len(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.len(),
        _ => 0,
    }
}

/// The close frame a client's protocol error gets (RFC 6455 §7.4.1): 1009 for a message over
/// the size limit, 1007 for text that is not UTF-8, 1002 for any other violation; `None` for
/// a connection that failed (nothing can be sent on it).
pub(in crate::api) fn protocol_close(e: axum::Error) -> Option<CloseFrame> {
    use tokio_tungstenite::tungstenite::Error;
    let inner = e.into_inner();
    let (code, reason) = match inner.downcast_ref::<Error>()? {
        Error::Capacity(_) => (1009, "message too big"),
        Error::Utf8(_) => (1007, "text that is not UTF-8"),
        Error::Protocol(_) => (1002, "protocol error"),
        _ => return None,
    };
    Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    })
}
