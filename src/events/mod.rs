//! The event hub: every state change the pump makes, numbered by a monotonic `seq`, fanned out
//! to observers through a bounded broadcast channel, and retained in a bounded ring so that an
//! observer can resume after a given `seq` without loss.
//!
//! Publishing never blocks and never waits on an observer: a subscriber that falls behind the
//! channel's capacity loses the oldest events and is told how many (`Lagged`), and the pump
//! carries on. The short lock in [`EventHub::publish`] only makes `seq` order equal channel
//! and ring order; it is never held across an `.await`. Each event's JSON is rendered at most
//! once, however many observers send it.

use axum::extract::ws::Utf8Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::threads::{MessageRecord, MessageStatus, ThreadInfo, ThreadStatus};
use crate::time::Timestamp;

/// Events kept for subscribers that are behind, and retained for resumption (`?since=`).
pub const DEFAULT_CAPACITY: usize = 16_384;

/// One published event.
#[derive(Debug, Serialize)]
pub struct Event {
    pub seq: u64,
    pub timestamp: Timestamp,
    #[serde(flatten)]
    pub kind: EventKind,
    /// The rendered frames, as shared bytes: every WebSocket client sends the same buffer
    /// (a reference count, not a copy per client).
    #[serde(skip)]
    json: OnceLock<Utf8Bytes>,
    #[serde(skip)]
    message_json: OnceLock<Option<Utf8Bytes>>,
}

impl Event {
    /// Event `seq`, stamped now. (The hub numbers what it publishes; this is for feeding a
    /// [`crate::store::Store`] directly.)
    pub fn new(seq: u64, kind: EventKind) -> Self {
        Event {
            seq,
            timestamp: Timestamp::now(),
            kind,
            json: OnceLock::new(),
            message_json: OnceLock::new(),
        }
    }

    /// The event as one JSON object (`event`, `seq`, `timestamp`, fields), rendered once.
    pub fn json(&self) -> &Utf8Bytes {
        self.json
            .get_or_init(|| Utf8Bytes::from(serde_json::to_string(self).unwrap_or_default()))
    }

    /// For a `message` event, the `/ws/messages` frame: the message object with `event` and
    /// `seq` beside its fields. Rendered once. `None` for other events.
    pub fn message_json(&self) -> Option<&Utf8Bytes> {
        self.message_json
            .get_or_init(|| match &self.kind {
                EventKind::Message { message } => {
                    #[derive(Serialize)]
                    struct Frame<'a> {
                        event: &'static str,
                        seq: u64,
                        #[serde(flatten)]
                        message: &'a MessageRecord,
                    }
                    serde_json::to_string(&Frame {
                        event: "message",
                        seq: self.seq,
                        message,
                    })
                    .ok()
                    .map(Utf8Bytes::from)
                }
                _ => None,
            })
            .as_ref()
    }

    /// The event's type name as it appears in `event`.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }
}

/// What happened. Shapes follow the seed API (`001_…txt`) with our additions.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    AgentState {
        agent: String,
        state: AgentState,
        current_thread: Option<String>,
    },
    Message {
        message: MessageRecord,
    },
    MessageStatus {
        id: String,
        thread_id: String,
        status: MessageStatus,
        error: Option<String>,
    },
    ThreadCreated {
        thread: ThreadInfo,
    },
    ThreadUpdated {
        thread_id: String,
        status: ThreadStatus,
        message_count: u64,
        error: Option<String>,
    },
    Error {
        thread_id: Option<String>,
        agent: Option<String>,
        error: String,
    },
    OrganismState {
        status: OrganismStatus,
    },
    /// A reload was attempted: one listener's script (`agent`), or the organism.
    Reload {
        agent: Option<String>,
        ok: bool,
        error: Option<String>,
        /// A refused organism reload: each problem, with its listener and key.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        problems: Vec<crate::pump::ReloadProblem>,
        /// A successful organism reload: `rev, added, removed, changed, unchanged`.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        diff: Option<crate::pump::ReloadReport>,
    },
    /// A line a handler logged (Lua `log.info/warn/error`).
    Log {
        agent: String,
        thread_id: Option<String>,
        level: String,
        message: String,
    },
}

impl EventKind {
    /// The type name as it appears in `event`.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::AgentState { .. } => "agent_state",
            EventKind::Message { .. } => "message",
            EventKind::MessageStatus { .. } => "message_status",
            EventKind::ThreadCreated { .. } => "thread_created",
            EventKind::ThreadUpdated { .. } => "thread_updated",
            EventKind::Error { .. } => "error",
            EventKind::OrganismState { .. } => "organism_state",
            EventKind::Log { .. } => "log",
            EventKind::Reload { .. } => "reload",
        }
    }

    /// The thread this event is about, if any.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            EventKind::Message { message } => Some(&message.thread_id),
            EventKind::MessageStatus { thread_id, .. }
            | EventKind::ThreadUpdated { thread_id, .. } => Some(thread_id),
            EventKind::ThreadCreated { thread } => Some(&thread.id),
            EventKind::Error { thread_id, .. } | EventKind::Log { thread_id, .. } => {
                thread_id.as_deref()
            }
            EventKind::AgentState { .. }
            | EventKind::OrganismState { .. }
            | EventKind::Reload { .. } => None,
        }
    }

    /// The agents this event names (sender and receiver of a message), if any.
    pub fn agents(&self) -> Vec<&str> {
        match self {
            EventKind::AgentState { agent, .. } => vec![agent.as_str()],
            EventKind::Message { message } => {
                let mut v = vec![&*message.from];
                v.extend(message.to.as_deref());
                v
            }
            EventKind::Error { agent, .. } => agent.as_deref().into_iter().collect(),
            EventKind::Log { agent, .. } => vec![agent.as_str()],
            EventKind::Reload { agent, .. } => agent.as_deref().into_iter().collect(),
            _ => Vec::new(),
        }
    }
}

/// The names of every event type the pump publishes.
pub const EVENT_NAMES: [&str; 9] = [
    "agent_state",
    "message",
    "message_status",
    "thread_created",
    "thread_updated",
    "error",
    "organism_state",
    "log",
    "reload",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Idle,
    Processing,
    /// An external agent owes a reply (and is not handling a delivery right now).
    Waiting,
    /// Idle, and its last handler call failed; the next successful call clears it.
    Error,
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrganismStatus {
    Running,
    Paused,
    Stopping,
    Stopped,
}

/// Shared by the pump (publisher) and every observer (subscribers).
pub struct EventHub {
    inner: Mutex<Inner>,
    retain: usize,
    sink: Option<Sink>,
}

/// Receives every event in `seq` order, under the publish lock (the durable store): the
/// shared event itself, which it may keep (a reference count, not a copy).
pub type Sink = Box<dyn Fn(&Arc<Event>) + Send + Sync>;

struct Inner {
    seq: u64,
    tx: broadcast::Sender<Arc<Event>>,
    /// The last `retain` events, oldest first, for resumption.
    ring: VecDeque<Arc<Event>>,
}

/// A subscription opened at a known point: what to replay, then the live channel.
pub struct Subscription {
    /// Retained events after the requested `seq`, oldest first.
    pub replay: Vec<Arc<Event>>,
    /// Live events; the first one it yields follows the last replayed (or `seq`).
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The last `seq` published when the subscription opened.
    pub seq: u64,
    /// Set when the requested point is no longer retained (or lies in the future): the
    /// observer must resynchronize from a fresh snapshot. Holds the oldest retained `seq`.
    pub resync_from: Option<u64>,
}

impl EventHub {
    /// A hub whose channel and resumption ring each hold `capacity` events.
    pub fn new(capacity: usize) -> Self {
        EventHub::with_sink(capacity, 0, None)
    }

    /// A hub whose first event is `start_seq + 1`, feeding `sink` with every event in order.
    pub fn with_sink(capacity: usize, start_seq: u64, sink: Option<Sink>) -> Self {
        let capacity = capacity.max(1);
        let (tx, _) = broadcast::channel(capacity);
        EventHub {
            inner: Mutex::new(Inner {
                seq: start_seq,
                tx,
                ring: VecDeque::with_capacity(capacity),
            }),
            retain: capacity,
            sink,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Numbers and publishes an event; returns its `seq`. Never blocks on observers.
    pub fn publish(&self, kind: EventKind) -> u64 {
        let (seq, retired) = {
            let mut inner = self.lock();
            inner.seq += 1;
            let seq = inner.seq;
            let event = Arc::new(Event::new(seq, kind));
            if let Some(sink) = &self.sink {
                sink(&event);
            }
            let retired = if inner.ring.len() == self.retain {
                inner.ring.pop_front()
            } else {
                None
            };
            inner.ring.push_back(event.clone());
            if inner.tx.receiver_count() > 0 {
                let _ = inner.tx.send(event);
            }
            (seq, retired)
        };
        // The event the ring let go of is often the last reference to it (and to its
        // message's payload): freed after the lock, so publishers on other cores do not
        // wait for it.
        drop(retired);
        seq
    }

    /// A new subscription that sees every event published after this call.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.lock().tx.subscribe()
    }

    /// Opens a subscription atomically with respect to publishing. With `since = Some(s)`,
    /// the retained events after `s` are returned for replay, and the live channel continues
    /// exactly after them; if events after `s` are no longer retained, `resync_from` says so.
    pub fn subscribe_since(&self, since: Option<u64>) -> Subscription {
        let inner = self.lock();
        let live = inner.tx.subscribe();
        let seq = inner.seq;
        let oldest = inner.ring.front().map(|e| e.seq).unwrap_or(seq + 1);
        let (replay, resync_from) = match since {
            None => (Vec::new(), None),
            Some(s) if s > seq || s + 1 < oldest => (Vec::new(), Some(oldest)),
            Some(s) => {
                let skip = (s + 1 - oldest) as usize;
                (inner.ring.iter().skip(skip).cloned().collect(), None)
            }
        };
        Subscription {
            replay,
            live,
            seq,
            resync_from,
        }
    }

    /// The `seq` of the last published event.
    pub fn last_seq(&self) -> u64 {
        self.lock().seq
    }

    /// Observers currently subscribed to the live channel.
    pub fn subscribers(&self) -> usize {
        self.lock().tx.receiver_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_flat_with_their_type_seq_and_timestamp() {
        let hub = EventHub::new(4);
        let mut rx = hub.subscribe();
        hub.publish(EventKind::ThreadUpdated {
            thread_id: "t".into(),
            status: ThreadStatus::Completed,
            message_count: 3,
            error: None,
        });
        let ev = rx.try_recv().unwrap();
        let json = serde_json::to_value(&*ev).unwrap();
        assert_eq!(json["event"], "thread_updated");
        assert_eq!(json["seq"], 1);
        assert_eq!(json["status"], "completed");
        assert_eq!(json["message_count"], 3);
        assert!(json["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(hub.last_seq(), 1);
        assert_eq!(ev.json().as_str(), serde_json::to_string(&*ev).unwrap());
    }

    fn organism_state(hub: &EventHub) -> u64 {
        hub.publish(EventKind::OrganismState {
            status: OrganismStatus::Running,
        })
    }

    #[test]
    fn resumption_replays_retained_events_then_continues_live() {
        let hub = EventHub::new(4);
        for _ in 0..3 {
            organism_state(&hub);
        }
        let mut sub = hub.subscribe_since(Some(1));
        assert_eq!(sub.resync_from, None);
        let replayed: Vec<u64> = sub.replay.iter().map(|e| e.seq).collect();
        assert_eq!(replayed, vec![2, 3]);
        organism_state(&hub);
        assert_eq!(sub.live.try_recv().unwrap().seq, 4);

        // Up to date: nothing to replay.
        assert!(hub.subscribe_since(Some(4)).replay.is_empty());
    }

    #[test]
    fn resumption_from_a_point_no_longer_retained_or_in_the_future_needs_a_resync() {
        let hub = EventHub::new(2);
        for _ in 0..5 {
            organism_state(&hub);
        }
        // Retained: 4 and 5. After 3 is still complete; after 2 is not.
        assert_eq!(hub.subscribe_since(Some(3)).resync_from, None);
        assert_eq!(hub.subscribe_since(Some(2)).resync_from, Some(4));
        assert_eq!(hub.subscribe_since(Some(9)).resync_from, Some(4));
        // A fresh hub: since 0 is complete.
        assert_eq!(EventHub::new(2).subscribe_since(Some(0)).resync_from, None);
    }
}
