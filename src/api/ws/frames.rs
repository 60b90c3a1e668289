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
            // The gap spans both, whichever came first (a queue that refuses frames it
            // had room for, its writer gone, can hand an earlier range after a later one).
            Some(d) => Dropped {
                count: d.count + count,
                from_seq: d.from_seq.min(from_seq),
                to_seq: d.to_seq.max(to_seq),
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
    /// The same for `delta` events (`max_deltas_per_s`).
    delta_window: Option<(Instant, u64)>,
    pub(super) folded_deltas: Option<Dropped>,
}

/// What a `folded` frame counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::api) enum Folded {
    Message,
    Delta,
}

/// Whether event `seq` is past `rate` a second in `window` (then counted in `folded`).
fn over_rate(
    window: &mut Option<(Instant, u64)>,
    folded: &mut Option<Dropped>,
    rate: u64,
    seq: u64,
) -> bool {
    let now = Instant::now();
    let (start, sent) = match *window {
        Some((start, sent)) if now.duration_since(start) < Duration::from_secs(1) => (start, sent),
        _ => (now, 0),
    };
    if sent < rate {
        *window = Some((start, sent + 1));
        return false;
    }
    *window = Some((start, sent));
    *folded = Some(Dropped::add(*folded, 1, seq, seq));
    true
}

impl Folding {
    /// How often what `filter` folds goes out: the coalescing interval, or every second for
    /// the message rate alone; `None` when it folds nothing.
    pub(in crate::api) fn every(filter: &Filter) -> Option<Duration> {
        match (
            filter.coalesce_ms,
            filter.max_messages_per_s,
            filter.max_deltas_per_s,
        ) {
            (Some(ms), ..) => Some(Duration::from_millis(ms)),
            (None, None, None) => None,
            (None, ..) => Some(Duration::from_secs(1)),
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
            EventKind::Message { .. } | EventKind::MessageStatus { .. } => filter
                .max_messages_per_s
                .is_some_and(|rate| over_rate(&mut self.window, &mut self.folded, rate, ev.seq)),
            EventKind::Delta(_) => filter.max_deltas_per_s.is_some_and(|rate| {
                over_rate(
                    &mut self.delta_window,
                    &mut self.folded_deltas,
                    rate,
                    ev.seq,
                )
            }),
            _ => false,
        }
    }

    pub(in crate::api) fn is_empty(&self) -> bool {
        self.states.is_empty() && self.folded.is_none() && self.folded_deltas.is_none()
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

    /// The `folded` frame counting the events of `kind` not sent (taken; put it back with
    /// [`Folding::put_back`] if the frame cannot go out), at `seen`.
    pub(in crate::api) fn folded_frame(
        &mut self,
        seen: u64,
        kind: Folded,
    ) -> Option<(Message, Dropped)> {
        let (f, name) = match kind {
            Folded::Message => (self.folded.take()?, "message"),
            Folded::Delta => (self.folded_deltas.take()?, "delta"),
        };
        let frame = text(&json!({
            "event": "folded",
            "seq": seen,
            "timestamp": Timestamp::now(),
            "kind": name,
            "count": f.count,
            "from_seq": f.from_seq,
            "to_seq": f.to_seq,
        }));
        Some((frame, f))
    }

    /// A `folded` notice that could not go out, kept for the next flush.
    pub(in crate::api) fn put_back(&mut self, kind: Folded, f: Dropped) {
        match kind {
            Folded::Message => self.folded = Some(f),
            Folded::Delta => self.folded_deltas = Some(f),
        }
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

#[cfg(test)]
mod tests {
    use super::Dropped;

    /// A gap's notice spans every range added to it, in whatever order they came.
    #[test]
    fn a_gap_spans_every_range_added_to_it_in_any_order() {
        let d = Dropped::add(None, 2, 10, 11);
        let d = Dropped::add(Some(d), 1, 5, 5);
        let d = Dropped::add(Some(d), 3, 12, 14);
        assert_eq!((d.count, d.from_seq, d.to_seq), (6, 5, 14));
    }
}
