//! What a session queues for its client: events offered (filtered, folded, or dropped and
//! counted when the client's queue is full), control frames, and the notices of what was
//! dropped or folded.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes};
use serde_json::Value;

use super::frames::frame_len;
use super::session::{Session, Source};
use super::{dropped_frame, text, Dropped, Folded, Folding};
use crate::api::frame::merged_frame;
use crate::api::Endpoint;
use crate::events::{Event, EventKind, Receiver};

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
        let queued = self.queued.load(Ordering::Relaxed);
        if queued > 0 && queued + len > self.options.client_queue_bytes {
            self.overflow = true;
            return;
        }
        if !self.try_queue(msg) {
            self.overflow = true;
        }
    }

    /// Offers one event: filtered, then queued or counted as dropped. On `/ws/messages` a
    /// frame is held a while before it is queued (`held.rs`): a status change that comes
    /// meanwhile goes in its message's frame instead of a frame of its own.
    pub(super) fn offer(&mut self, ev: &Event) {
        if ev.seq <= self.seen {
            return;
        }
        self.seen = ev.seq;
        if !self.snapshot_ids.is_empty() {
            if let crate::events::EventKind::Message { message } = &ev.kind {
                if self.snapshot_ids.remove(&message.id) {
                    return;
                }
            }
            if ev.seq >= self.history_until {
                self.snapshot_ids.clear();
            }
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
        let Some(frame) = self.source.frame(self.ep, ev) else {
            return;
        };
        if self.ep == Endpoint::Events {
            let message = matches!(ev.kind, EventKind::Message { .. });
            return self.send(frame.clone(), ev.seq, message);
        }
        match &ev.kind {
            EventKind::MessageStatus { about: Some(a), .. } if a.message_seq > 0 => {
                if let Some(held) = self.held.message(a.message_seq) {
                    if let Some(merged) = merged_frame(ev, held) {
                        *held = merged.clone();
                        return;
                    }
                }
                self.hold(frame.clone(), ev.seq, false);
            }
            EventKind::Message { .. } => self.hold(frame.clone(), ev.seq, true),
            _ => self.hold(frame.clone(), ev.seq, false),
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

    fn hold(&mut self, frame: Utf8Bytes, seq: u64, message: bool) {
        if self.held.push(frame, seq, message) {
            self.send_held();
        }
    }

    /// The end of a holding period: what was held through all of it goes out.
    pub(super) fn send_due(&mut self) {
        while let Some(h) = self.held.next_due() {
            self.send(h.frame, h.seq, h.message);
        }
    }

    /// Queues every frame held, in order.
    pub(super) fn send_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        while let Some(h) = self.held.next() {
            self.send(h.frame, h.seq, h.message);
        }
    }

    /// Queues the frame of event `seq`, or counts it as dropped (a message's, if `message`).
    fn send(&mut self, frame: Utf8Bytes, seq: u64, message: bool) {
        let dropped = |s: &mut Self| s.note_dropped(1, seq, seq, u64::from(message), 0);
        if !self.gap_told() {
            // Even the gap's notice does not fit: this one joins the gap.
            return dropped(self);
        }
        let budget = self.options.client_queue_bytes;
        if self.queued.load(Ordering::Relaxed) + frame.len() > budget
            || !self.try_queue(Message::Text(frame))
        {
            dropped(self);
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
        if self.tx.capacity() == 0 || !self.try_queue(dropped_frame(d)) {
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
        let len = frame_len(&msg);
        self.queued.fetch_add(len, Ordering::Relaxed);
        if self.tx.send(msg).await.is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Queues a frame if there is room, keeping the byte count the writer pays back.
    pub(super) fn try_queue(&self, msg: Message) -> bool {
        // A full queue takes nothing: said before its byte count is touched.
        if self.tx.capacity() == 0 {
            return false;
        }
        let len = frame_len(&msg);
        self.queued.fetch_add(len, Ordering::Relaxed);
        if self.tx.try_send(msg).is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
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
