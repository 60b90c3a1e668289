//! What a session queues for its client: events offered (filtered, folded, or dropped and
//! counted when the client's queue is full), control frames, and the notices of what was
//! dropped or folded.

use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use serde_json::Value;

use super::frames::frame_len;
use super::session::{Session, Source};
use super::socket::Out;
use super::{dropped_frame, text, Dropped, Folded, Folding};
use crate::api::frame::merged_frame;
use crate::api::Endpoint;
use crate::events::{Event, EventKind, Receiver, TryRecvError};

impl<S: Source> Session<S> {
    /// Queues a control frame (snapshot, resync, ack, error). It counts against the client's
    /// queue like any frame; one that does not fit (by frames or bytes) is not queued, and
    /// marks the session `overflow`: its client is closed. The first frames of a session
    /// always fit (the queue is empty).
    pub(in crate::api) fn control(&mut self, frame: Value) {
        self.control_message(text(&frame));
    }

    pub(in crate::api) fn control_message(&mut self, msg: Message) {
        // Frames held go first: an answer's `seq` is the last event offered.
        self.send_held();
        let len = frame_len(&msg);
        let queued = self.queued.bytes();
        if queued > 0 && queued + len > self.options.client_queue_bytes {
            self.overflow = true;
            return;
        }
        if !self.try_queue(msg) {
            self.overflow = true;
        }
    }

    /// Offers the next event the hub has published, if any. On `/ws/messages` the events
    /// before it that are not about messages are passed over first, unread (their slots not
    /// locked): no filter lets them through there.
    pub(super) fn offer_next(&mut self, live: &mut Receiver) -> Result<(), TryRecvError> {
        if self.ep == Endpoint::Messages {
            if let Some(seq) = live.pass_over_others() {
                self.looked_at(seq);
            }
        }
        live.try_recv_with(|ev| self.offer(ev))
    }

    /// The events up to `seq` have been looked at: past `history_until`, no message a
    /// `thread_snapshot` held can come again.
    fn looked_at(&mut self, seq: u64) {
        self.seen = self.seen.max(seq);
        if seq >= self.history_until && !self.snapshot_ids.is_empty() {
            self.snapshot_ids.clear();
        }
    }

    /// Offers one event of the hub's: filtered, then queued or counted as dropped. On
    /// `/ws/messages` a frame is held a while before it is queued (`held.rs`): a status
    /// change that comes meanwhile goes in its message's frame instead of a frame of its own.
    pub(super) fn offer(&mut self, ev: &Event) {
        self.offer_from(ev, true);
    }

    /// [`Session::offer`] for an event the hub holds (`in_hub`: a message's frame is taken
    /// from there when it goes out) or one read back from the store (its frame held now).
    pub(super) fn offer_from(&mut self, ev: &Event, in_hub: bool) {
        if ev.seq <= self.seen {
            return;
        }
        // A message a `thread_snapshot` held is not sent again.
        let in_snapshot = match &ev.kind {
            EventKind::Message { message } if !self.snapshot_ids.is_empty() => {
                self.snapshot_ids.remove(&message.id)
            }
            _ => false,
        };
        self.looked_at(ev.seq);
        if in_snapshot {
            return;
        }
        if !self.sees(ev) {
            return;
        }
        let passes = match self.ep {
            Endpoint::Events => self.filter.passes(ev),
            Endpoint::Messages => self.filter.passes_message(ev),
        } && self.labels_pass(ev);
        // Held back before it is written out: a folded event costs no rendering.
        if !passes || (self.ep == Endpoint::Events && self.folding.hold(&self.filter, ev)) {
            return;
        }
        let message = matches!(ev.kind, EventKind::Message { .. });
        if self.ep == Endpoint::Messages {
            if message && in_hub {
                // Its frame stays the hub's until it goes out (or a status merges into it).
                return self.hold(None, ev.seq, true);
            }
            if self.merge(ev) {
                return;
            }
        }
        let Some(frame) = self.source.frame(self.ep, ev) else {
            return;
        };
        match self.ep {
            Endpoint::Events => self.send(frame.clone(), ev.seq, message),
            Endpoint::Messages => self.hold(Some(frame.clone()), ev.seq, message),
        }
    }

    /// The `/ws/messages` frame of the message event `seq`, while the hub holds it.
    fn message_frame(&self, seq: u64) -> Option<Utf8Bytes> {
        let ev = self.source.event(seq)?;
        self.source.frame(Endpoint::Messages, &ev).cloned()
    }

    /// A status change of a message whose frame this session still holds goes into that
    /// frame (true), so its own frame is neither rendered nor sent.
    fn merge(&mut self, ev: &Event) -> bool {
        let EventKind::MessageStatus { about: Some(a), .. } = &ev.kind else {
            return false;
        };
        let Some(i) = self.held.message(a.message_seq) else {
            return false;
        };
        let held = || (self.held.frame(i).cloned()).or_else(|| self.message_frame(a.message_seq));
        match merged_frame(ev, held) {
            Some(merged) => {
                self.held.replace(i, merged.clone());
                true
            }
            None => false,
        }
    }

    /// Whether the thread of `ev` (if it has one) passes the filter's label tests, with its
    /// labels as they are now.
    fn labels_pass(&self, ev: &Event) -> bool {
        let tests = self.filter.label_tests();
        let Some(thread) = ev.kind.thread_id().filter(|_| !tests.is_empty()) else {
            return true;
        };
        let labels = self.source.thread_labels(thread);
        tests.iter().all(|t| t.holds(labels.as_deref()))
    }

    fn hold(&mut self, frame: Option<Utf8Bytes>, seq: u64, message: bool) {
        if self.held.push(frame, seq, message) {
            self.send_held();
        }
    }

    /// The end of a holding period: what was held through all of it goes out.
    pub(super) fn send_due(&mut self) {
        let mut going = Going::default();
        while let Some(h) = self.held.next_due() {
            self.add_held(&mut going, h);
        }
        self.queue_going(&mut going);
    }

    /// Queues every frame held, in order.
    pub(super) fn send_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut going = Going::default();
        while let Some(h) = self.held.next() {
            self.add_held(&mut going, h);
        }
        self.queue_going(&mut going);
    }

    /// [`Session::add`] for a frame held; a message's frame the hub no longer holds is
    /// counted as dropped.
    fn add_held(&mut self, going: &mut Going, h: super::held::HeldFrame) {
        match h.frame.or_else(|| self.message_frame(h.seq)) {
            Some(frame) => self.add(going, frame, h.seq, h.message),
            None => self.note_dropped(1, h.seq, h.seq, u64::from(h.message), 0),
        }
    }

    /// Queues the frame of event `seq`, or counts it as dropped (a message's, if `message`).
    fn send(&mut self, frame: Utf8Bytes, seq: u64, message: bool) {
        let mut going = Going::default();
        self.add(&mut going, frame, seq, message);
        self.queue_going(&mut going);
    }

    /// Adds the frame of event `seq` to the frames `going` out together if it fits the
    /// client's queue with them, else counts it as dropped (a message's, if `message`). A
    /// gap's notice goes between the frames before the gap and those after it.
    fn add(&mut self, going: &mut Going, frame: Utf8Bytes, seq: u64, message: bool) {
        if self.dropped.is_some() {
            self.queue_going(going);
            if !self.gap_told() {
                // Even the gap's notice does not fit: this one joins the gap.
                return self.note_dropped(1, seq, seq, u64::from(message), 0);
            }
        }
        let bytes = self.queued.bytes() + going.bytes + frame.len();
        let frames = self.queued.frames() + going.texts.len() + 1;
        if bytes > self.options.client_queue_bytes || frames > self.options.client_queue.max(1) {
            return self.note_dropped(1, seq, seq, u64::from(message), 0);
        }
        going.from_seq = going.from_seq.min(seq);
        going.to_seq = seq;
        going.messages += u64::from(message);
        going.bytes += frame.len();
        going.texts.push(frame);
    }

    /// Queues the frames `going` out together (one frame alone, several as one
    /// [`Out::Texts`]); should the queue refuse them, they are counted as dropped.
    fn queue_going(&mut self, going: &mut Going) {
        let Going {
            mut texts,
            bytes,
            from_seq,
            to_seq,
            messages,
        } = std::mem::take(going);
        let count = texts.len() as u64;
        let out = match texts.len() {
            0 => return,
            1 => Out::One(Message::Text(texts.swap_remove(0))),
            _ => Out::Texts { texts, bytes },
        };
        if !self.try_queue_out(out) {
            self.note_dropped(count, from_seq, to_seq, messages, 0);
        }
    }

    /// How often held-back frames go out: the coalescing interval, or every second for the
    /// message rate alone; `None` when the client folds nothing.
    pub(super) fn flush_every(&self) -> Option<Duration> {
        Folding::every(&self.filter)
    }

    /// Sends the notice of frames dropped, if any is owed, before anything later (its `seq`
    /// is its gap's end, so nothing sent after the gap may go first). False if it is owed
    /// and does not fit.
    pub(super) fn gap_told(&mut self) -> bool {
        let Some(d) = self.dropped else {
            return true;
        };
        // A full queue takes nothing: the notice is not written only to be thrown away
        // (at every frame offered while the client is behind).
        if !self.try_queue(dropped_frame(d)) {
            return false;
        }
        self.dropped = None;
        true
    }

    /// Sends what folding held back: the agents' latest states in one `agent_states` frame,
    /// and a `folded` frame counting the message events not sent. Both carry the `seq` of
    /// the last event offered, as answers do, so `seq` never goes back.
    pub(super) fn flush_folded(&mut self) {
        if self.folding.is_empty() || !self.gap_told() {
            // Held on until the gap's notice has gone out.
            return;
        }
        if let Some(frame) = self.folding.states_frame(self.seen) {
            if !self.try_queue(frame) {
                self.note_dropped(1, self.seen, self.seen, 0, 0);
            }
        }
        for kind in [Folded::Message, Folded::Delta] {
            if let Some((frame, f)) = self.folding.folded_frame(self.seen, kind) {
                if !self.try_queue(frame) {
                    self.folding.put_back(kind, f);
                }
            }
        }
    }

    /// Queues a frame, waiting for room (a snapshot the client asked for is not dropped);
    /// false if the connection is gone.
    pub(super) async fn queue_waiting(&self, msg: Message) -> bool {
        let Ok(permit) = self.tx.reserve().await else {
            return false;
        };
        let out = Out::from(msg);
        self.queued.add(&out);
        permit.send(out);
        true
    }

    /// Queues a frame if there is room, keeping the counts the writer pays back.
    pub(super) fn try_queue(&self, msg: Message) -> bool {
        self.try_queue_out(Out::from(msg))
    }

    /// Queues `out` if there is room for its frames, keeping the counts the writer pays
    /// back. A full queue takes nothing: said before its counts are touched.
    fn try_queue_out(&self, out: Out) -> bool {
        if self.queued.frames() + out.frames() > self.options.client_queue.max(1) {
            return false;
        }
        let Ok(permit) = self.tx.try_reserve() else {
            return false;
        };
        self.queued.add(&out);
        permit.send(out);
        true
    }

    /// The hub skipped `n` events after the last one seen: the messages among them are
    /// counted as dropped where this session would have sent every message (no filter that
    /// narrows them, no tenant's scope); the others, and events the hub no longer
    /// remembers, as `lagged`.
    pub(super) fn lost(&mut self, n: u64, live: &Receiver) {
        // What came before the gap goes out before its notice.
        self.send_held();
        let from = self.seen + 1;
        self.seen += n;
        let (messages, unknown) = live.messages_among(from, self.seen);
        let every = self.tenant_view.is_none()
            && self.filter.takes_every_message(self.ep == Endpoint::Events);
        let (messages, lagged) = if every {
            (messages, unknown)
        } else {
            (0, messages + unknown)
        };
        self.note_dropped(n, from, self.seen, messages, lagged);
    }

    pub(super) fn note_dropped(
        &mut self,
        count: u64,
        from_seq: u64,
        to_seq: u64,
        messages: u64,
        lagged: u64,
    ) {
        self.source.count_dropped(self.ep, count);
        let d = Dropped::add(self.dropped, count, from_seq, to_seq).of_which(messages, lagged);
        self.dropped = Some(d);
    }
}

/// Frames that go out together, in `seq` order: what they weigh, and which events they are
/// (should the queue refuse them, they are counted as dropped).
struct Going {
    texts: Vec<Utf8Bytes>,
    bytes: usize,
    from_seq: u64,
    to_seq: u64,
    messages: u64,
}

impl Default for Going {
    fn default() -> Self {
        Going {
            texts: Vec::new(),
            bytes: 0,
            from_seq: u64::MAX,
            to_seq: 0,
            messages: 0,
        }
    }
}
