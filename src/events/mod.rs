//! The event hub: every state change the pump makes, numbered by a monotonic `seq`, retained
//! in a bounded ring indexed by `seq`, from which every observer reads in `seq` order and from
//! which an observer can resume after a given `seq` without loss.
//!
//! Publishing never blocks and never waits on an observer, and takes no lock over the whole
//! hub: a `seq` from an atomic counter, then one slot of the ring. A receiver that falls
//! behind the ring's capacity loses the oldest events and is told how many (`Lagged`), and the
//! pump carries on. Each event's JSON is rendered once however many observers send it (by
//! each observer that asks in the same moment, on another core, rather than one waiting for
//! another: the first kept is the one they all send).

mod cause;
mod hub;

pub use cause::{spawn_blocking, valid_request_id, Cause, MAX_REQUEST_ID};
pub use hub::{EventHub, Receiver, RecvError, Sink, Subscription, TryRecvError};

use std::any::Any;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use once_cell::race::OnceBox;

use tokio::sync::Notify;

use crate::threads::{MessageCore, MessageRecord, MessageStatus, ThreadInfo, ThreadStatus};
use crate::time::Timestamp;

/// Events kept for subscribers that are behind, and retained for resumption (`?since=`).
pub const DEFAULT_CAPACITY: usize = 16_384;

/// A frame rendered from an event, of the observer's type.
type Rendered = Box<dyn Any + Send + Sync>;

/// One published event.
#[derive(Debug)]
pub struct Event {
    pub seq: u64,
    pub timestamp: Timestamp,
    pub kind: EventKind,
    /// The client's command that caused it, if one did ([`Cause`]).
    pub cause: Option<Arc<Cause>>,
    /// The frames an observer rendered from this event, kept so that each is rendered once
    /// however many clients send it (set without a lock: observers asking in the same
    /// moment may each render, and all read back the first kept). Their type is the
    /// observer's: the API keeps shared bytes (`api::frame`), so every WebSocket client
    /// sends the same buffer.
    frame: OnceBox<Rendered>,
    message_frame: OnceBox<Rendered>,
    merged_frame: OnceBox<Rendered>,
}

impl Event {
    /// Event `seq`, stamped now (a message's, with the time it was logged, a moment ago),
    /// caused by the command running now ([`Cause::current`]). (The hub numbers what it
    /// publishes; this is for feeding a [`crate::store::Store`] directly.)
    pub fn new(seq: u64, kind: EventKind) -> Self {
        let timestamp = match &kind {
            EventKind::Message { message } => message.timestamp,
            _ => Timestamp::now(),
        };
        Event {
            seq,
            timestamp,
            kind,
            cause: Cause::current(),
            frame: OnceBox::new(),
            message_frame: OnceBox::new(),
            merged_frame: OnceBox::new(),
        }
    }

    /// Event `seq` of another process, as it was stamped there, with its frames as that
    /// process rendered them (the renderer's types, showing its cause), so that they are not
    /// rendered again here.
    pub fn numbered<F: Any + Send + Sync, M: Any + Send + Sync>(
        seq: u64,
        timestamp: Timestamp,
        kind: EventKind,
        frame: Option<F>,
        message_frame: M,
    ) -> Self {
        let event = Event {
            seq,
            timestamp,
            kind,
            cause: None,
            frame: OnceBox::new(),
            message_frame: OnceBox::new(),
            merged_frame: OnceBox::new(),
        };
        if let Some(f) = frame {
            let _ = event.frame.set(Box::new(Box::new(f)));
        }
        let _ = event.message_frame.set(Box::new(Box::new(message_frame)));
        event
    }

    /// The event's frame for the main stream: rendered by `render` for the first client that
    /// asks, then shared by every client. There is one renderer (the API's); `None` only if a
    /// caller asks for another type than the one rendered.
    pub fn frame<T: Any + Send + Sync>(&self, render: impl FnOnce(&Event) -> T) -> Option<&T> {
        self.rendered(&self.frame, render)
    }

    /// The event's frame for the message stream, rendered once as [`Event::frame`] is.
    pub fn message_frame<T: Any + Send + Sync>(
        &self,
        render: impl FnOnce(&Event) -> T,
    ) -> Option<&T> {
        self.rendered(&self.message_frame, render)
    }

    /// For a status event, the frame of the message it is about showing this status (which a
    /// client still holding the message's frame sends instead of both), rendered once as
    /// [`Event::frame`] is.
    pub fn merged_frame<T: Any + Send + Sync>(
        &self,
        render: impl FnOnce(&Event) -> T,
    ) -> Option<&T> {
        self.rendered(&self.merged_frame, render)
    }

    fn rendered<'a, T: Any + Send + Sync>(
        &'a self,
        cell: &'a OnceBox<Rendered>,
        render: impl FnOnce(&Event) -> T,
    ) -> Option<&'a T> {
        cell.get_or_init(|| Box::new(Box::new(render(self))))
            .downcast_ref()
    }

    /// The event's type name as it appears in `event`.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// About how many bytes holding this event costs: its texts, and its JSON frames (the
    /// payload as XML and as JSON), rendered once for every client.
    pub fn weight(&self) -> usize {
        const OVERHEAD: usize = 256;
        let text = |t: Option<&String>| 2 * t.map_or(0, String::len);
        match &self.kind {
            // The record, and its two frames (`/ws`, `/ws/messages`) holding the payload.
            EventKind::Message { message } => message.weight() + 2 * message.payload_xml.len(),
            // The message's payload, which it keeps (`StatusAbout` shares the message's
            // core), and the message's frame showing this status (`merged_frame`).
            EventKind::MessageStatus { error, about, .. } => {
                let merged = about
                    .as_ref()
                    .map_or(0, |a| a.message_bytes.saturating_mul(3));
                OVERHEAD + text(error.as_ref()) + merged
            }
            EventKind::Error { error, .. } => OVERHEAD + text(Some(error)),
            EventKind::Log { message, .. } => OVERHEAD + text(Some(message)),
            EventKind::Delta(d) => OVERHEAD + text(Some(&d.delta)),
            EventKind::InputRequested { input } | EventKind::InputResolved { input } => {
                OVERHEAD + 3 * input.payload_xml.len()
            }
            _ => OVERHEAD,
        }
    }
}

/// The message a `message_status` event is about: its record's shared core (sender,
/// receiver, type and slot, read through `Deref`), not copies of its names.
#[derive(Clone)]
pub struct StatusAbout {
    pub message: Arc<MessageCore>,
    /// The `seq` of the `message` event that published it (0 if not known).
    pub message_seq: u64,
    /// Its payload's length: what the message's frame showing this status weighs.
    pub message_bytes: usize,
}

/// What it says of the message (not the core's other parts).
impl std::fmt::Debug for StatusAbout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusAbout")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("payload_type", &self.payload_type)
            .field("slot_index", &self.slot_index)
            .field("message_seq", &self.message_seq)
            .field("message_bytes", &self.message_bytes)
            .finish()
    }
}

impl std::ops::Deref for StatusAbout {
    type Target = MessageCore;

    fn deref(&self) -> &MessageCore {
        &self.message
    }
}

impl StatusAbout {
    pub fn of(m: &MessageRecord) -> Self {
        StatusAbout {
            message: m.core().clone(),
            message_seq: m.seq,
            message_bytes: m.payload_xml.len(),
        }
    }
}

/// What happened. The API writes each as a frame (`api::frame`), in the seed API's shapes
/// (`001_…txt`) with our additions; the event mirror carries it in its own, versioned
/// format (`nats::event_wire`).
#[derive(Debug, Clone)]
pub enum EventKind {
    /// Names shared with the listener and the thread (`Arc<str>`): published twice a hop,
    /// they are not copied.
    AgentState {
        agent: Arc<str>,
        state: AgentState,
        current_thread: Option<Arc<str>>,
    },
    Message {
        message: MessageRecord,
    },
    MessageStatus {
        id: Arc<str>,
        thread_id: Arc<str>,
        status: MessageStatus,
        error: Option<String>,
        /// Which message this is (sender, receiver, type, slot): lets `/ws/messages` filter
        /// and show a status change without looking the message up.
        about: Option<StatusAbout>,
    },
    ThreadCreated {
        thread: ThreadInfo,
    },
    ThreadUpdated {
        thread_id: Arc<str>,
        status: ThreadStatus,
        message_count: u64,
        error: Option<String>,
        /// Paused (`POST /threads/{id}/pause`): its queued messages wait.
        paused: bool,
        /// Its labels now (none: it has none).
        labels: Option<Arc<crate::threads::Labels>>,
    },
    /// A thread was rewound to message `to`: the messages between it and `rewind.before`
    /// (`superseded` of them) are superseded.
    ThreadRewound {
        thread_id: Arc<str>,
        to: Arc<str>,
        rewind: crate::threads::Rewind,
        superseded: u64,
    },
    /// A thread's labels changed (`None`: it has none now).
    ThreadLabels {
        thread_id: Arc<str>,
        labels: Option<Arc<crate::threads::Labels>>,
    },
    /// A client changed a thread's `settings` (`None`: cleared).
    ThreadSettings {
        thread_id: Arc<str>,
        settings: Option<Arc<crate::threads::ThreadSettings>>,
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
        problems: Vec<crate::config::diff::ReloadProblem>,
        /// A successful organism reload: `rev, added, removed, changed, unchanged`.
        diff: Option<crate::config::diff::ReloadReport>,
    },
    /// An entry of the audit log (a control action, a key change, a refused credential).
    Audit {
        who: Option<String>,
        action: String,
        target: Option<String>,
        result: String,
    },
    /// A change of an agent created through the API: `create`, `upload`, `deploy`,
    /// `rollback` or `delete`, who asked, the versions, and whether it was done.
    Deployment {
        agent: String,
        tenant: Option<String>,
        action: String,
        version: Option<u64>,
        from_version: Option<u64>,
        author: Option<String>,
        ok: bool,
        error: Option<String>,
    },
    /// An input was opened: a message held at its listener's approval gate.
    InputRequested {
        input: Arc<crate::threads::InputRow>,
    },
    /// An input was decided, expired or withdrawn (`input.status` says which).
    InputResolved {
        input: Arc<crate::threads::InputRow>,
    },
    /// A piece of a model's answer as it streams (`kind: llm` with `stream: true`):
    /// ephemeral, never stored or counted as a message; the final message is the record.
    Delta(Delta),
    /// One call of a `kind: llm` listener to its model: what it took (stored, and summed
    /// by day for `/usage`).
    Usage(Box<Usage>),
    /// Events of the organism a gateway's copy of its stream does not have (a model's
    /// streamed pieces, not mirrored): a placeholder for their `seq`s, shown to no client.
    Omitted,
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
            EventKind::ThreadSettings { .. } => "thread_settings",
            EventKind::ThreadLabels { .. } => "thread_labels",
            EventKind::ThreadRewound { .. } => "thread_rewound",
            EventKind::Error { .. } => "error",
            EventKind::OrganismState { .. } => "organism_state",
            EventKind::Log { .. } => "log",
            EventKind::InputRequested { .. } => "input_requested",
            EventKind::InputResolved { .. } => "input_resolved",
            EventKind::Reload { .. } => "reload",
            EventKind::Audit { .. } => "audit",
            EventKind::Deployment { .. } => "deployment",
            EventKind::Delta { .. } => "delta",
            EventKind::Usage(_) => "usage",
            EventKind::Omitted => "omitted",
        }
    }

    /// The thread this event is about, if any.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            EventKind::Message { message } => Some(&message.thread_id),
            EventKind::MessageStatus { thread_id, .. } => Some(thread_id),
            EventKind::ThreadUpdated { thread_id, .. } => Some(thread_id),
            EventKind::ThreadCreated { thread } => Some(&thread.id),
            EventKind::ThreadSettings { thread_id, .. }
            | EventKind::ThreadLabels { thread_id, .. }
            | EventKind::ThreadRewound { thread_id, .. } => Some(thread_id),
            EventKind::Error { thread_id, .. } | EventKind::Log { thread_id, .. } => {
                thread_id.as_deref()
            }
            EventKind::InputRequested { input } | EventKind::InputResolved { input } => {
                Some(&input.thread_id)
            }
            EventKind::Delta(d) => Some(&d.thread_id),
            EventKind::Usage(u) => Some(&u.thread_id),
            EventKind::AgentState { .. }
            | EventKind::OrganismState { .. }
            | EventKind::Reload { .. }
            | EventKind::Audit { .. }
            | EventKind::Omitted
            | EventKind::Deployment { .. } => None,
        }
    }

    /// The agents this event names (sender and receiver of a message), if any.
    pub fn agents(&self) -> Vec<&str> {
        match self {
            EventKind::AgentState { agent, .. } => vec![&**agent],
            EventKind::Message { message } => {
                let mut v = vec![&*message.from];
                v.extend(message.to.as_deref());
                v
            }
            EventKind::Error { agent, .. } => agent.as_deref().into_iter().collect(),
            EventKind::Log { agent, .. } => vec![agent.as_str()],
            EventKind::Reload { agent, .. } => agent.as_deref().into_iter().collect(),
            EventKind::Deployment { agent, .. } => vec![agent.as_str()],
            EventKind::Delta(d) => vec![&*d.agent],
            EventKind::Usage(u) => vec![&*u.listener],
            EventKind::InputRequested { input } | EventKind::InputResolved { input } => {
                vec![&*input.listener]
            }
            _ => Vec::new(),
        }
    }
}

/// The names of every event type the pump publishes.
pub const EVENT_NAMES: [&str; 18] = [
    "agent_state",
    "message",
    "message_status",
    "thread_created",
    "thread_updated",
    "thread_settings",
    "thread_labels",
    "thread_rewound",
    "error",
    "organism_state",
    "log",
    "reload",
    "audit",
    "deployment",
    "input_requested",
    "input_resolved",
    "delta",
    "usage",
];

/// One call to a model, accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub tenant: Option<String>,
    pub listener: Arc<str>,
    pub thread_id: Arc<str>,
    /// The message being handled.
    pub message_id: Arc<str>,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    /// By the model's `price`, in millionths of its currency unit (0 without a price).
    pub cost_micros: u64,
    /// The server reported no usage: the tokens are estimated (about 4 bytes a token).
    pub estimated: bool,
    pub ms: u64,
}

/// A piece of a model's answer as it streams.
#[derive(Debug, Clone)]
pub struct Delta {
    pub thread_id: Arc<str>,
    pub agent: Arc<str>,
    /// The message being handled.
    pub in_reply_to: Arc<str>,
    pub kind: DeltaKind,
    /// From 0, per message handled and kind.
    pub index: u64,
    pub delta: String,
}

/// What a `delta` carries: the answer's text, or the model's reasoning before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaKind {
    Text,
    Thinking,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrganismStatus {
    Running,
    Paused,
    Stopping,
    Stopped,
}
