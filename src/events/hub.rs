//! The hub itself: the ring of slots indexed by `seq`, publishing into it, and the receivers
//! that read it in order and resume after a given `seq`.
//!
//! ## Inside
//!
//! `EventHub`: numbers every state change (`seq`, an atomic counter) and puts it in slot `seq %
//! N` of a ring of the last N events; there is no lock over the hub. Every observer is a
//! `Receiver` with a cursor: it reads the ring in `seq` order, waits in a slot still empty for
//! the event on its way there, and when the ring has moved past it is told how many it lost
//! (`Lagged`). Resumption (`subscribe_since`) is the same cursor started after a `seq`: no gap,
//! no duplicate. Waiting receivers set one flag and wait on a `Notify`; a publisher wakes them
//! only when it finds the flag set, so publishing touches nothing shared beyond the counter and
//! its slot while receivers keep up or none exist. A slot keeps its event's `seq` beside it, so
//! a publisher never reads the cold event it replaces. A reader may take an event lent in its
//! slot (`try_recv_with`) instead of a reference to it: the WebSocket sessions drain their
//! backlog that way, so 50 sessions on two cores do not contend for each event's count. The
//! hub remembers each event's kind (a message, a status change, or other) beside its `seq`
//! longer than the ring holds it: a receiver that lagged counts the messages it lost there,
//! and a reader of messages passes over the other events without locking their slots. The
//! ring is bounded by bytes too (`set_byte_budget`, a quarter of `limits.max_retained_bytes`):
//! each slot keeps its event's `weight`, one counter sums them, and a publisher that finds the
//! sum over the budget lets go of the oldest events (one publisher at a time, `trimming`),
//! raising `floor`; a receiver behind `floor` is told it lagged, as if the ring had come round.
//! Each `Event` keeps the frames the API renders from it (`Event::frame`), so each is
//! rendered once, into shared bytes: every client's queue holds a reference, not a copy. The event a slot lets go
//! of is dropped after the slot's lock, since freeing it (and often its message) would hold
//! that slot's readers.

use super::*;

#[cfg(test)]
mod tests;

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
    /// What each of the last [`KINDS_PER_SLOT`] rings' worth of events was, kept after its
    /// event is gone: `seq << KIND_BITS | ` its [`kind_of`]. A receiver that lagged counts
    /// the messages it lost here ([`Receiver::messages_among`]); a reader of messages passes
    /// over the other events without reading their slots ([`Receiver::pass_over_others`]).
    kinds: Box<[AtomicU64]>,
}

/// The low bits of a [`Ring::kinds`] entry: what kind of event it was.
const KIND_BITS: u32 = 2;
const KIND_MASK: u64 = (1 << KIND_BITS) - 1;
const KIND_OTHER: u64 = 0;
const KIND_MESSAGE: u64 = 1;
const KIND_STATUS: u64 = 2;

fn kind_of(kind: &EventKind) -> u64 {
    match kind {
        EventKind::Message { .. } => KIND_MESSAGE,
        EventKind::MessageStatus { .. } => KIND_STATUS,
        _ => KIND_OTHER,
    }
}

/// At most this many events passed over in one call of [`Receiver::pass_over_others`].
const PASS_OVER_MAX: u64 = 1024;

/// `n` kinds, all 0 (never published), from zeroed memory: the allocator hands fresh pages
/// over as they are, so a start neither writes nor touches the megabytes an organism's
/// first events have yet to reach.
fn zeroed_kinds(n: usize) -> Box<[AtomicU64]> {
    use std::alloc::{handle_alloc_error, Layout};
    use zerocopy::FromZeros;
    <[AtomicU64]>::new_box_zeroed_with_elems(n).unwrap_or_else(|_| {
        handle_alloc_error(Layout::array::<AtomicU64>(n).unwrap_or(Layout::new::<AtomicU64>()))
    })
}

/// How many rings' worth of events [`Ring::kinds`] remembers (at most [`MAX_KINDS`]).
const KINDS_PER_SLOT: usize = 16;
const MAX_KINDS: usize = 1 << 20;

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

    /// Of the events `from..=to` (ones this receiver lost), how many were `message` events,
    /// and how many are no longer known (published longer ago than the hub remembers, or
    /// still on their way).
    pub fn messages_among(&self, from: u64, to: u64) -> (u64, u64) {
        let kinds = &self.ring.kinds;
        let (mut messages, mut unknown) = (0, 0);
        for seq in from..=to {
            let kind = kinds[(seq % kinds.len() as u64) as usize].load(Ordering::Acquire);
            if kind >> KIND_BITS != seq {
                unknown += 1;
            } else if kind & KIND_MASK == KIND_MESSAGE {
                messages += 1;
            }
        }
        (messages, unknown)
    }

    /// Passes over the next events published that are neither a `message` nor a
    /// `message_status` (a reader of messages takes nothing from them), by what the hub
    /// remembers of their kinds: their slots are neither locked nor read. The `seq` of the
    /// last passed over, if any. (A lag among them goes untold: none of them is wanted.)
    pub fn pass_over_others(&mut self) -> Option<u64> {
        let kinds = &self.ring.kinds;
        let start = self.next;
        while self.next - start < PASS_OVER_MAX {
            let kind = kinds[(self.next % kinds.len() as u64) as usize].load(Ordering::Acquire);
            if kind >> KIND_BITS != self.next || kind & KIND_MASK != KIND_OTHER {
                break;
            }
            self.next += 1;
        }
        (self.next > start).then(|| self.next - 1)
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
                kinds: zeroed_kinds((capacity * KINDS_PER_SLOT).min(MAX_KINDS)),
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

    /// Event `seq`, if the ring still holds it.
    pub fn event(&self, seq: u64) -> Option<Arc<Event>> {
        take(&self.ring, &mut { seq }).ok()
    }

    /// Numbers and publishes an event; returns its `seq`. Never blocks on observers.
    pub fn publish(&self, kind: EventKind) -> u64 {
        let seq = self.ring.head.fetch_add(1, Ordering::AcqRel) + 1;
        self.place(Arc::new(Event::new(seq, kind)));
        seq
    }

    /// Publishes an event numbered elsewhere (another process's hub, read back from its
    /// mirror), keeping its `seq`: for a hub with this one publisher only. An event at or
    /// before the last one is ignored (`false`); one past a gap makes receivers behind the
    /// gap lag, as if the ring had come round.
    pub fn publish_numbered(&self, event: Event) -> bool {
        let ring = &*self.ring;
        let head = ring.head.load(Ordering::Acquire);
        if event.seq <= head {
            return false;
        }
        if event.seq > head + 1 {
            ring.floor.fetch_max(event.seq, Ordering::AcqRel);
        }
        ring.head.store(event.seq, Ordering::Release);
        self.place(Arc::new(event));
        true
    }

    /// Puts `event` in its slot, wakes receivers, feeds the sink, trims to the budget.
    fn place(&self, event: Arc<Event>) {
        let ring = &*self.ring;
        let seq = event.seq;
        let weight = event.weight();
        let kinds = &ring.kinds;
        kinds[(seq % kinds.len() as u64) as usize]
            .store(seq << KIND_BITS | kind_of(&event.kind), Ordering::Release);
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
