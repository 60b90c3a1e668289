//! The event hub: every state change the pump makes, numbered by a monotonic `seq`, retained
//! in a bounded ring indexed by `seq`, from which every observer reads in `seq` order and from
//! which an observer can resume after a given `seq` without loss.
//!
//! Publishing never blocks and never waits on an observer, and takes no lock over the whole
//! hub: a `seq` from an atomic counter, then one slot of the ring. A receiver that falls
//! behind the ring's capacity loses the oldest events and is told how many (`Lagged`), and the
//! pump carries on. Each event's JSON is rendered at most once, however many observers send
//! it.

use axum::extract::ws::Utf8Bytes;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use serde::Serialize;
use tokio::sync::Notify;

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

    /// The `/ws/messages` frame, rendered once: for a `message` event the message object with
    /// `event` and `seq` beside its fields; for a `message_status` event its own frame (`id`,
    /// `thread_id`, `from`, `to`, `payload_type`, `slot_index`, `status`, `error`). `None`
    /// for other events.
    pub fn message_json(&self) -> Option<&Utf8Bytes> {
        self.message_json
            .get_or_init(|| match &self.kind {
                EventKind::MessageStatus { about: Some(_), .. } => Some(self.json().clone()),
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

    /// About how many bytes holding this event costs: its texts, and its JSON frames (the
    /// payload as XML and as JSON), rendered once for every client.
    pub fn weight(&self) -> usize {
        const OVERHEAD: usize = 256;
        let text = |t: Option<&String>| 2 * t.map_or(0, String::len);
        match &self.kind {
            // The record, and its two frames (`/ws`, `/ws/messages`) holding the payload.
            EventKind::Message { message } => message.weight() + 2 * message.payload_xml.len(),
            EventKind::MessageStatus { error, .. } => OVERHEAD + text(error.as_ref()),
            EventKind::Error { error, .. } => OVERHEAD + text(Some(error)),
            EventKind::Log { message, .. } => OVERHEAD + text(Some(message)),
            _ => OVERHEAD,
        }
    }
}

/// The message a `message_status` event is about.
#[derive(Debug, Clone, Serialize)]
pub struct StatusAbout {
    pub from: Arc<str>,
    pub to: Option<Arc<str>>,
    pub payload_type: Option<String>,
    pub slot_index: u64,
}

impl StatusAbout {
    pub fn of(m: &MessageRecord) -> Self {
        StatusAbout {
            from: m.from.clone(),
            to: m.to.clone(),
            payload_type: m.payload_type.clone(),
            slot_index: m.slot_index,
        }
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
        /// Which message this is (sender, receiver, type, slot): lets `/ws/messages` filter
        /// and show a status change without looking the message up.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        about: Option<StatusAbout>,
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
        problems: Vec<crate::config::diff::ReloadProblem>,
        /// A successful organism reload: `rev, added, removed, changed, unchanged`.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        diff: Option<crate::config::diff::ReloadReport>,
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

/// Shared by the pump (publishers) and every observer (receivers).
pub struct EventHub {
    ring: Arc<Ring>,
    sink: Option<Sink>,
}

/// Receives every event once, from the publishing thread, before [`EventHub::publish`]
/// returns (the durable store): the shared event itself, which it may keep (a reference
/// count, not a copy). Events published one after the other (one caused by the other) reach
/// it in that order; two published at the same moment on two cores may reach it in either.
pub type Sink = Box<dyn Fn(&Arc<Event>) + Send + Sync>;

/// The hub's state, shared with its receivers: a ring of slots indexed by `seq`. Publishing
/// takes a `seq` from an atomic counter and writes that one slot; there is no lock over the
/// whole hub (SPEC §16). Each slot has a lock of its own, contended only by a publisher and
/// the receivers of that one event.
struct Ring {
    /// The last `seq` handed out. Its event may still be on its way into its slot.
    head: AtomicU64,
    /// The first `seq` this hub publishes (a store's history holds the ones before).
    first: u64,
    /// Event `seq` lives in slot `seq % slots.len()` until `seq + slots.len()` replaces it.
    slots: Box<[RwLock<Slot>]>,
    /// Set by a receiver that found nothing and is about to wait; the next publisher clears
    /// it and wakes the waiting receivers. A publisher whose receivers are all busy (or that
    /// has none) never touches `wake`.
    sleeping: AtomicBool,
    wake: Notify,
    closed: AtomicBool,
    receivers: AtomicUsize,
    /// Bytes the events in the slots weigh ([`Event::weight`]), and the most they may: past
    /// it the oldest are let go of before the ring comes round to them.
    bytes: AtomicUsize,
    byte_budget: AtomicUsize,
    /// Events before this `seq` were let go of for the byte budget: receivers behind it
    /// have lost them (`Lagged`), as if the ring had come round.
    floor: AtomicU64,
    /// Held by the one publisher letting go of old events at a time.
    trimming: std::sync::Mutex<()>,
}

/// One place in the ring. The event's `seq` is kept beside it, so telling which event a slot
/// holds never reads the event (a publisher finds there one published a ring ago, long gone
/// from the cache).
#[derive(Default)]
struct Slot {
    seq: u64,
    event: Option<Arc<Event>>,
    /// The event's [`Event::weight`], counted in [`Ring::bytes`].
    weight: usize,
}

impl Ring {
    fn slot(&self, seq: u64) -> &RwLock<Slot> {
        &self.slots[(seq % self.slots.len() as u64) as usize]
    }

    /// The oldest `seq` the ring can still hold, when `head` is the last handed out.
    fn oldest(&self, head: u64) -> u64 {
        (head.saturating_sub(self.slots.len() as u64) + 1)
            .max(self.first)
            .max(self.floor.load(Ordering::Acquire))
    }

    /// Lets go of the oldest events until the ring weighs no more than its budget (never
    /// the newest, `head`). One publisher at a time does it; the others go on.
    fn trim(&self, head: u64) {
        let Ok(_one) = self.trimming.try_lock() else {
            return;
        };
        let budget = self.byte_budget.load(Ordering::Relaxed);
        let mut seq = self.oldest(head);
        while self.bytes.load(Ordering::Relaxed) > budget && seq < head {
            let freed = {
                let mut slot = crate::sync::write(self.slot(seq));
                let freed = if slot.seq == seq {
                    self.bytes.fetch_sub(slot.weight, Ordering::Relaxed);
                    slot.weight = 0;
                    slot.event.take()
                } else {
                    None
                };
                // Under the slot's lock: a receiver that finds the slot empty reads a floor
                // past it.
                self.floor.fetch_max(seq + 1, Ordering::AcqRel);
                freed
            };
            drop(freed);
            seq += 1;
        }
    }
}

/// Why [`Receiver::recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The receiver fell more than the hub's capacity behind: this many events were replaced
    /// before it read them. The next call returns the oldest event still held.
    #[error("lagged behind by {0} events")]
    Lagged(u64),
    /// The hub is gone: no event will follow.
    #[error("the event hub is closed")]
    Closed,
}

/// Why [`Receiver::try_recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// Nothing published yet after the last event received.
    #[error("no event yet")]
    Empty,
    #[error("lagged behind by {0} events")]
    Lagged(u64),
    #[error("the event hub is closed")]
    Closed,
}

/// Reads the hub's events in `seq` order, from where it was opened. Never slows a
/// publisher: a receiver more than the hub's capacity behind loses the oldest events and is
/// told how many ([`RecvError::Lagged`]).
pub struct Receiver {
    ring: Arc<Ring>,
    /// The `seq` of the next event to return.
    next: u64,
}

impl Receiver {
    fn new(ring: &Arc<Ring>, next: u64) -> Self {
        ring.receivers.fetch_add(1, Ordering::Relaxed);
        Receiver {
            ring: ring.clone(),
            next,
        }
    }

    /// The next event, if it is published.
    pub fn try_recv(&mut self) -> Result<Arc<Event>, TryRecvError> {
        take(&self.ring, &mut self.next)
    }

    /// [`Receiver::try_recv`], with the event lent to `f` in its slot instead of returned.
    /// No reference count is taken and given back: many receivers of one event on several
    /// cores would contend for it. `f` runs under the slot's read lock, which only a
    /// publisher a whole ring later waits for.
    pub fn try_recv_with<R>(&mut self, f: impl FnOnce(&Event) -> R) -> Result<R, TryRecvError> {
        take_slot(&self.ring, &mut self.next, |e: &Arc<Event>| f(e))
    }

    /// The next event, waiting until it is published. Cancel-safe: a dropped call loses no
    /// event.
    pub async fn recv(&mut self) -> Result<Arc<Event>, RecvError> {
        let (ring, next) = (&*self.ring, &mut self.next);
        // An event, or why none will come; `None` while there is nothing yet.
        let ready = |r: Result<Arc<Event>, TryRecvError>| match r {
            Ok(e) => Some(Ok(e)),
            Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
            Err(TryRecvError::Closed) => Some(Err(RecvError::Closed)),
            Err(TryRecvError::Empty) => None,
        };
        loop {
            if let Some(r) = ready(take(ring, next)) {
                return r;
            }
            let notified = ring.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Either the publisher of the next event sees `sleeping` (and wakes this
            // receiver, registered above), or this second look sees its event.
            ring.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if let Some(r) = ready(take(ring, next)) {
                return r;
            }
            notified.await;
        }
    }
}

/// Event `*next` from `ring`, advancing `*next` past it, or past what was lost.
fn take(ring: &Ring, next: &mut u64) -> Result<Arc<Event>, TryRecvError> {
    take_slot(ring, next, Arc::clone)
}

/// Runs `f` on event `*next` in its slot, advancing `*next` past it, or past what was lost.
fn take_slot<R>(
    ring: &Ring,
    next: &mut u64,
    f: impl FnOnce(&Arc<Event>) -> R,
) -> Result<R, TryRecvError> {
    let held = {
        let slot = crate::sync::read(ring.slot(*next));
        match &slot.event {
            Some(e) if slot.seq == *next => {
                *next += 1;
                return Ok(f(e));
            }
            _ => slot.seq,
        }
    };
    if held > *next || ring.floor.load(Ordering::Acquire) > *next {
        // Replaced: the ring has moved past this receiver.
        let oldest = ring
            .oldest(ring.head.load(Ordering::Acquire))
            .max(*next + 1);
        let lost = oldest - *next;
        *next = oldest;
        return Err(TryRecvError::Lagged(lost));
    }
    // Not yet in its slot: not handed out, or handed out and on its way.
    if ring.closed.load(Ordering::Acquire) {
        Err(TryRecvError::Closed)
    } else {
        Err(TryRecvError::Empty)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.ring.receivers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A subscription opened at a known point: what to replay, then the live receiver.
pub struct Subscription {
    /// Retained events after the requested `seq`, oldest first.
    pub replay: Vec<Arc<Event>>,
    /// Live events; the first one it yields follows the last replayed (or `seq`).
    pub live: Receiver,
    /// The last `seq` handed out when the subscription opened.
    pub seq: u64,
    /// Set when the requested point is no longer retained (or lies in the future): the
    /// observer must resynchronize from a fresh snapshot. Holds the oldest retained `seq`.
    pub resync_from: Option<u64>,
}

impl EventHub {
    /// A hub that retains `capacity` events for its receivers and for resumption.
    pub fn new(capacity: usize) -> Self {
        EventHub::with_sink(capacity, 0, None)
    }

    /// A hub whose first event is `start_seq + 1`, feeding `sink` with every event.
    pub fn with_sink(capacity: usize, start_seq: u64, sink: Option<Sink>) -> Self {
        let capacity = capacity.max(1);
        EventHub {
            ring: Arc::new(Ring {
                head: AtomicU64::new(start_seq),
                first: start_seq + 1,
                slots: (0..capacity).map(|_| RwLock::default()).collect(),
                sleeping: AtomicBool::new(false),
                wake: Notify::new(),
                closed: AtomicBool::new(false),
                receivers: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                byte_budget: AtomicUsize::new(usize::MAX),
                floor: AtomicU64::new(0),
                trimming: std::sync::Mutex::new(()),
            }),
            sink,
        }
    }

    /// Bounds the bytes the retained events weigh ([`Event::weight`]): past `bytes`, the
    /// oldest are let go of (receivers behind them are told they lagged), so a run of large
    /// payloads cannot hold the ring's whole capacity of them. Unbounded by default.
    pub fn set_byte_budget(&self, bytes: usize) {
        self.ring.byte_budget.store(bytes, Ordering::Relaxed);
    }

    /// Bytes the retained events weigh now.
    pub fn retained_bytes(&self) -> usize {
        self.ring.bytes.load(Ordering::Relaxed)
    }

    /// Numbers and publishes an event; returns its `seq`. Never blocks on observers.
    pub fn publish(&self, kind: EventKind) -> u64 {
        let ring = &*self.ring;
        let seq = ring.head.fetch_add(1, Ordering::AcqRel) + 1;
        let event = Arc::new(Event::new(seq, kind));
        let weight = event.weight();
        let retired = {
            let mut slot = crate::sync::write(ring.slot(seq));
            if slot.seq > seq {
                // A publisher a whole ring ahead has been here (this one was held up that
                // long): the newer event stays, and receivers count this one as lost.
                None
            } else {
                slot.seq = seq;
                // One change of the count, by the difference.
                let old = std::mem::replace(&mut slot.weight, weight);
                if weight >= old {
                    ring.bytes.fetch_add(weight - old, Ordering::Relaxed);
                } else {
                    ring.bytes.fetch_sub(old - weight, Ordering::Relaxed);
                }
                slot.event.replace(event.clone())
            }
        };
        fence(Ordering::SeqCst);
        if ring.sleeping.load(Ordering::Relaxed) && ring.sleeping.swap(false, Ordering::SeqCst) {
            ring.wake.notify_waiters();
        }
        if let Some(sink) = &self.sink {
            sink(&event);
        }
        // The event the slot let go of is often the last reference to it (and to its
        // message's payload): freed outside the slot's lock.
        drop(retired);
        if ring.bytes.load(Ordering::Relaxed) > ring.byte_budget.load(Ordering::Relaxed) {
            ring.trim(seq);
        }
        seq
    }

    /// A receiver of every event published after this call.
    pub fn subscribe(&self) -> Receiver {
        Receiver::new(&self.ring, self.ring.head.load(Ordering::Acquire) + 1)
    }

    /// Opens a subscription at a known point. With `since = Some(s)`, the retained events
    /// after `s` are returned for replay, and the live receiver continues exactly after them;
    /// if events after `s` are no longer retained, `resync_from` says so.
    pub fn subscribe_since(&self, since: Option<u64>) -> Subscription {
        let ring = &self.ring;
        let head = ring.head.load(Ordering::Acquire);
        let oldest = ring.oldest(head);
        let (replay, next, resync_from) = match since {
            None => (Vec::new(), head + 1, None),
            Some(s) if s > head || s + 1 < oldest => (Vec::new(), head + 1, Some(oldest)),
            Some(s) => {
                let mut replay = Vec::new();
                let mut next = s + 1;
                while next <= head {
                    // Read on a copy of the cursor: an event on its way into its slot (the
                    // live receiver waits for it) or replaced since `oldest` was read (the
                    // live receiver reports the loss) ends the replay where it is.
                    let mut probe = next;
                    let Ok(e) = take(ring, &mut probe) else { break };
                    replay.push(e);
                    next = probe;
                }
                (replay, next, None)
            }
        };
        Subscription {
            replay,
            live: Receiver::new(ring, next),
            seq: head,
            resync_from,
        }
    }

    /// The `seq` of the last event handed out.
    pub fn last_seq(&self) -> u64 {
        self.ring.head.load(Ordering::Acquire)
    }

    /// Receivers currently open.
    pub fn subscribers(&self) -> usize {
        self.ring.receivers.load(Ordering::Relaxed)
    }
}

impl Drop for EventHub {
    /// Receivers that have read everything get [`RecvError::Closed`].
    fn drop(&mut self) {
        self.ring.closed.store(true, Ordering::SeqCst);
        self.ring.wake.notify_waiters();
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

    fn log(hub: &EventHub, bytes: usize) -> u64 {
        hub.publish(EventKind::Log {
            agent: "a".into(),
            thread_id: None,
            level: "info".into(),
            message: "x".repeat(bytes),
        })
    }

    #[test]
    fn a_byte_budget_lets_go_of_the_oldest_events_and_laggards_are_told() {
        let hub = EventHub::new(1024);
        hub.set_byte_budget(10_000);
        let mut behind = hub.subscribe();
        for _ in 0..100 {
            log(&hub, 1_000);
        }
        // Each weighs about 2,256 bytes: four fit under 10,000, with the newest always kept.
        assert!(hub.retained_bytes() <= 10_000, "{}", hub.retained_bytes());
        let oldest = hub.ring.oldest(hub.last_seq());
        assert!(oldest > 90 && oldest <= 100, "{oldest}");
        match behind.try_recv() {
            Err(TryRecvError::Lagged(n)) => assert_eq!(n, oldest - 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(behind.try_recv().unwrap().seq, oldest);
        // Resumption from before the floor needs a resync; small events fill the ring again.
        assert_eq!(hub.subscribe_since(Some(50)).resync_from, Some(oldest));
        for _ in 0..1000 {
            organism_state(&hub);
        }
        assert!(hub.retained_bytes() <= 10_000);
        let seq = hub.last_seq();
        assert_eq!(hub.subscribe_since(Some(seq - 20)).replay.len(), 20);
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
    #[test]
    fn a_receiver_more_than_the_capacity_behind_is_told_how_many_it_lost() {
        let hub = EventHub::new(4);
        let mut rx = hub.subscribe();
        for _ in 0..10 {
            organism_state(&hub);
        }
        // Held: 7..=10. Lost: 1..=6.
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Lagged(6));
        let rest: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok().map(|e| e.seq)).collect();
        assert_eq!(rest, vec![7, 8, 9, 10]);
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
        assert_eq!(hub.subscribers(), 1);
        drop(rx);
        assert_eq!(hub.subscribers(), 0);
    }

    #[test]
    fn a_lent_event_is_the_next_one_and_lag_is_reported_the_same() {
        let hub = EventHub::new(4);
        let mut rx = hub.subscribe();
        organism_state(&hub);
        assert_eq!(rx.try_recv_with(|e| e.seq), Ok(1));
        assert_eq!(rx.try_recv_with(|e| e.seq), Err(TryRecvError::Empty));
        for _ in 0..6 {
            organism_state(&hub);
        }
        // Held: 4..=7. Lost: 2 and 3.
        assert_eq!(rx.try_recv_with(|e| e.seq), Err(TryRecvError::Lagged(2)));
        assert_eq!(rx.try_recv_with(|e| e.seq), Ok(4));
        assert_eq!(rx.try_recv().unwrap().seq, 5);
    }

    #[test]
    fn a_hub_that_continues_a_stored_history_starts_after_it() {
        let hub = EventHub::with_sink(4, 100, None);
        let mut rx = hub.subscribe();
        assert_eq!(organism_state(&hub), 101);
        assert_eq!(rx.try_recv().unwrap().seq, 101);
        // Before 101 is the store's history, not the hub's.
        assert_eq!(hub.subscribe_since(Some(99)).resync_from, Some(101));
        assert_eq!(hub.subscribe_since(Some(100)).replay.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_receivers_wake_for_each_event_and_close_with_the_hub() {
        let hub = Arc::new(EventHub::new(64));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let mut rx = hub.subscribe();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    loop {
                        match rx.recv().await {
                            Ok(e) => seen.push(e.seq),
                            Err(RecvError::Closed) => return seen,
                            Err(RecvError::Lagged(n)) => panic!("lost {n}"),
                        }
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            organism_state(&hub);
            // Let the readers catch up and wait again, so every event wakes them.
            tokio::task::yield_now().await;
        }
        drop(Arc::into_inner(hub).expect("the only reference"));
        for r in readers {
            let seen = tokio::time::timeout(std::time::Duration::from_secs(10), r)
                .await
                .expect("closed in time")
                .unwrap();
            assert_eq!(seen, (1..=20).collect::<Vec<u64>>());
        }
    }

    #[test]
    fn publishers_on_many_threads_reach_every_receiver_in_seq_order_and_the_sink_once_each() {
        const THREADS: u64 = 4;
        const EACH: u64 = 5_000;
        let sunk = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = sunk.clone();
        let hub = Arc::new(EventHub::with_sink(
            1 << 16,
            0,
            Some(Box::new(move |e: &Arc<Event>| {
                s.lock().unwrap().push(e.seq)
            })),
        ));
        let mut readers: Vec<Receiver> = (0..3).map(|_| hub.subscribe()).collect();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let read: Vec<_> = readers
            .drain(..)
            .map(|mut rx| {
                runtime.spawn(async move {
                    let mut seen = Vec::new();
                    while (seen.len() as u64) < THREADS * EACH {
                        seen.push(rx.recv().await.expect("nothing lost").seq);
                    }
                    seen
                })
            })
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..EACH {
                        organism_state(&hub);
                    }
                });
            }
        });
        let all: Vec<u64> = (1..=THREADS * EACH).collect();
        for r in read {
            assert_eq!(runtime.block_on(r).unwrap(), all);
        }
        let mut sunk = sunk.lock().unwrap().clone();
        sunk.sort_unstable();
        assert_eq!(sunk, all);
        assert_eq!(hub.last_seq(), THREADS * EACH);
    }
}
