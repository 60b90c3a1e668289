//! The event hub: every state change the pump makes, numbered by a monotonic `seq`, fanned out
//! to observers through a bounded broadcast channel.
//!
//! Publishing never blocks and never waits on an observer: a subscriber that falls behind the
//! channel's capacity loses the oldest events and is told how many (`Lagged`), and the pump
//! carries on. The short lock in [`EventHub::publish`] only makes `seq` order equal channel
//! order; it is never held across an `.await`.

use std::sync::Arc;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::threads::{MessageRecord, MessageStatus, ThreadInfo, ThreadStatus};
use crate::time::Timestamp;

/// Events kept for subscribers that are behind.
pub const DEFAULT_CAPACITY: usize = 16_384;

/// One published event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub seq: u64,
    pub timestamp: Timestamp,
    #[serde(flatten)]
    pub kind: EventKind,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    Idle,
    Processing,
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
}

struct Inner {
    seq: u64,
    tx: broadcast::Sender<Arc<Event>>,
}

impl EventHub {
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        EventHub {
            inner: Mutex::new(Inner { seq: 0, tx }),
        }
    }

    /// Numbers and publishes an event; returns its `seq`. Never blocks on observers.
    pub fn publish(&self, kind: EventKind) -> u64 {
        let mut inner = match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        inner.seq += 1;
        let seq = inner.seq;
        if inner.tx.receiver_count() > 0 {
            let _ = inner.tx.send(Arc::new(Event {
                seq,
                timestamp: Timestamp::now(),
                kind,
            }));
        }
        seq
    }

    /// A new subscription that sees every event published after this call.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        match self.inner.lock() {
            Ok(g) => g.tx.subscribe(),
            Err(poisoned) => poisoned.into_inner().tx.subscribe(),
        }
    }

    /// The `seq` of the last published event.
    pub fn last_seq(&self) -> u64 {
        match self.inner.lock() {
            Ok(g) => g.seq,
            Err(poisoned) => poisoned.into_inner().seq,
        }
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
    }
}
