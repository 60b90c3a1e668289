//! The event stream mirrored to JetStream (`<prefix>_events`, subject `<prefix>.events`):
//! every event the pump publishes, in `seq` order, each a JSON [`MirroredEvent`] with its
//! `seq` as its `Nats-Msg-Id` (so a re-sent event is dropped) and in the header
//! `Agentserver-Seq`. Limits retention, by bytes and age (`organism.nats.events_max_bytes`,
//! `events_max_age`), the oldest first.
//!
//! [`mirror`] is an observer of the hub like a WebSocket session: it never slows the pump.
//! It sends asynchronously with a window of unacknowledged publishes; when NATS fails or
//! goes away it starts again from the last event the stream holds (the hub replays what it
//! still retains). Events the hub let go of before they could be sent (NATS away longer than
//! the ring holds) are a gap in the stream, logged with their count.
//!
//! [`read`] is the other side (the gateway, restore): events from a point of the stream on,
//! in order.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::event_wire::{WireKind, FORMAT};
use super::link::Link;
use crate::events::{Event, EventHub, EventKind, RecvError};
use crate::time::Timestamp;

/// The header carrying an event's `seq`.
pub const SEQ_HEADER: &str = "Agentserver-Seq";

/// Publishes awaiting JetStream's acknowledgement, at most.
const WINDOW: usize = 256;

/// One mirrored event as read back ([`parse`]).
#[derive(Debug, Deserialize)]
pub struct MirroredEvent {
    /// The format's version ([`FORMAT`]); absent before versions were written: 1.
    #[serde(default = "first_format")]
    pub v: u32,
    pub seq: u64,
    pub timestamp: Timestamp,
    #[serde(deserialize_with = "kind_from_wire")]
    pub kind: EventKind,
    /// The `/ws` frame the pump rendered.
    #[serde(default)]
    pub frame: Option<Box<RawValue>>,
    /// The `/ws/messages` frame the pump rendered (typed by its schemas), for message
    /// events; for message status events it is the `/ws` frame.
    #[serde(default)]
    pub message_frame: Option<Box<RawValue>>,
    /// The `seq` of the event mirrored before this one, when the events between were not
    /// mirrored on purpose (a model's streamed pieces, without `mirror_deltas`): a reader
    /// that has that event misses nothing. Absent when the event follows the one before.
    #[serde(default)]
    pub after: Option<u64>,
}

/// Which events the mirror leaves out on purpose (`delta`, unless `mirror_deltas`), and
/// the last event it mirrored before a run of them, which the next one names (`after`).
#[derive(Debug, Default)]
pub struct Omitting {
    pub deltas: bool,
    after: Option<u64>,
}

impl Omitting {
    /// Whether `ev` is left out; its place is noted.
    fn skips(&mut self, ev: &Event) -> bool {
        let skip = !self.deltas && matches!(ev.kind, EventKind::Delta(_));
        if skip && self.after.is_none() {
            self.after = Some(ev.seq.saturating_sub(1));
        }
        skip
    }

    /// What the next event mirrored names as `after` (taken).
    fn take(&mut self) -> Option<u64> {
        self.after.take()
    }

    /// Events were lost (not left out on purpose): the next one claims nothing.
    fn lost(&mut self) {
        self.after = None;
    }
}

fn first_format() -> u32 {
    1
}

fn kind_from_wire<'de, D: serde::Deserializer<'de>>(d: D) -> Result<EventKind, D::Error> {
    WireKind::deserialize(d).map(EventKind::from)
}

/// Reads one mirrored event: refused when it is of a format newer than this build reads
/// (a newer pump's), rather than misread.
pub fn parse(bytes: &[u8]) -> Result<MirroredEvent, String> {
    #[derive(Deserialize)]
    struct Version {
        #[serde(default = "first_format")]
        v: u32,
    }
    let newer = |v: u32| {
        format!(
            "an event of format {v} (this build reads up to {FORMAT}): run the same version \
             as the pump"
        )
    };
    // Read once; only an event that does not read is looked at again, for its version.
    match serde_json::from_slice::<MirroredEvent>(bytes) {
        Ok(ev) if ev.v > FORMAT => Err(newer(ev.v)),
        Ok(ev) => Ok(ev),
        Err(e) => match serde_json::from_slice::<Version>(bytes) {
            Ok(Version { v }) if v > FORMAT => Err(newer(v)),
            _ => Err(e.to_string()),
        },
    }
}

/// An event's frames as the API renders them: for `/ws`, and for `/ws/messages` (when it
/// has one).
pub struct Frames {
    pub frame: Option<String>,
    pub message_frame: Option<String>,
}

/// The body of one mirrored event: its `seq`, time, kind and frames (already JSON, written
/// as they are; a status event's `/ws/messages` frame is its `/ws` frame, sent once).
pub(super) fn body_of(ev: &Event, frames: &Frames, after: Option<u64>) -> Option<bytes::Bytes> {
    let kind = serde_json::to_string(&WireKind::from(&ev.kind)).ok()?;
    let timestamp = serde_json::to_string(&ev.timestamp).ok()?;
    let frame = frames.frame.as_deref().unwrap_or("null");
    let message_frame = match &frames.message_frame {
        Some(m) if Some(m) == frames.frame.as_ref() => "\"same\"",
        Some(m) => m.as_str(),
        None => "null",
    };
    let after = after.map_or(String::new(), |a| format!(",\"after\":{a}"));
    Some(
        format!(
            "{{\"v\":{FORMAT},\"seq\":{},\"timestamp\":{timestamp},\"kind\":{kind},\"frame\":{frame},\"message_frame\":{message_frame}{after}}}",
            ev.seq,
        )
        .into(),
    )
}

impl MirroredEvent {
    /// Its `/ws/messages` frame (a status event's is its `/ws` frame).
    pub fn message_frame(&self) -> Option<&RawValue> {
        match self.message_frame.as_deref() {
            Some(m) if m.get() == "\"same\"" => self.frame.as_deref(),
            other => other,
        }
    }
}

/// What is published for `ev`: its body, its `seq` as `Nats-Msg-Id` and in [`SEQ_HEADER`].
/// An event too large for the server's `max_payload` goes without its frames (gateways
/// then skip it), and one too large even so is left out (a gap, logged): neither can ever
/// be sent, and retrying would stop the mirror for good.
fn publication(
    link: &Link,
    ev: &Event,
    render: &impl Fn(&Event) -> Frames,
    after: Option<u64>,
) -> Option<jetstream::message::PublishMessage> {
    let mut body = body_of(ev, &render(ev), after)?;
    if link.fits(body.len()).is_err() {
        let bare = Frames {
            frame: None,
            message_frame: None,
        };
        body = body_of(ev, &bare, after)?;
        if let Err(too_big) = link.fits(body.len()) {
            tracing::warn!(seq = ev.seq, "event not mirrored: it is {too_big}");
            return None;
        }
        tracing::warn!(
            seq = ev.seq,
            "event mirrored without its frames: with them it is over the NATS server's max_payload"
        );
    }
    let seq = ev.seq.to_string();
    Some(
        jetstream::message::PublishMessage::build()
            .payload(body)
            .message_id(&seq)
            .header(SEQ_HEADER, seq.as_str()),
    )
}

/// The `seq` of the last event the stream holds (0 when empty).
async fn last_mirrored(events: &stream::Stream) -> Result<u64, String> {
    let mut events = events.clone();
    let state = events
        .info()
        .await
        .map_err(|e| e.to_string())?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(0);
    }
    let last = events
        .get_raw_message(state.last_sequence)
        .await
        .map_err(|e| e.to_string())?;
    let parsed = parse(&last.payload)?;
    Ok(parsed.seq)
}

/// Mirrors `hub`'s events to the stream until `stop`; `render` renders an event's frames
/// (the API's renderer).
pub async fn mirror(
    link: Link,
    hub: Arc<EventHub>,
    render: impl Fn(&Event) -> Frames + Send + 'static,
    deltas: bool,
    stop: CancellationToken,
) {
    let subject = link.names.events_subject();
    loop {
        let Some(streams) = link.streams_or_stop(&stop).await else {
            return;
        };
        let last = match last_mirrored(&streams.events).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "events stream not readable yet");
                if super::retry_after(&stop).await {
                    continue;
                }
                return;
            }
        };
        if last > hub.last_seq() {
            tracing::error!(
                stream = %link.names.events_stream(),
                stream_seq = last,
                organism_seq = hub.last_seq(),
                "not mirroring events: the stream holds later events than this organism has \
                 published (a memory store restarted); give the organism a store, or delete \
                 the stream"
            );
            stop.cancelled().await;
            return;
        }
        let mut omitting = Omitting {
            deltas,
            after: None,
        };
        let sub = hub.subscribe_since(Some(last));
        if let Some(oldest) = sub.resync_from {
            tracing::warn!(
                lost = oldest.saturating_sub(last + 1),
                from_seq = last + 1,
                "events the organism no longer holds were not mirrored"
            );
        }
        let mut pending = FuturesOrdered::new();
        let mut replay = sub.replay.into_iter();
        let mut live = sub.live;
        let failed = loop {
            let ev = match replay.next() {
                Some(ev) => ev,
                None => {
                    let next = tokio::select! {
                        _ = stop.cancelled() => {
                            drain(&link, &subject, &mut live, &render, &mut omitting, pending).await;
                            return;
                        }
                        Some(done) = pending.next(), if !pending.is_empty() => {
                            if done { continue } else { break true }
                        }
                        r = live.recv() => r,
                    };
                    match next {
                        Ok(ev) => ev,
                        Err(RecvError::Lagged(n)) => {
                            tracing::warn!(
                                lost = n,
                                "the event mirror fell behind; events lost from the stream"
                            );
                            omitting.lost();
                            continue;
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            };
            if omitting.skips(&ev) {
                continue;
            }
            let Some(message) = publication(&link, &ev, &render, omitting.take()) else {
                continue;
            };
            match link.jetstream.send_publish(subject.clone(), message).await {
                Ok(ack) => pending.push_back(async move { ack.await.is_ok() }),
                Err(_) => break true,
            }
            while pending.len() >= WINDOW {
                match pending.next().await {
                    Some(true) => {}
                    _ => break,
                }
            }
        };
        if failed && !super::retry_after(&stop).await {
            return;
        }
    }
}

/// At stop: sends what the hub published before it, and waits (a few seconds at most) for
/// the stream to take it all.
async fn drain<F: Future<Output = bool>>(
    link: &Link,
    subject: &str,
    live: &mut crate::events::Receiver,
    render: &impl Fn(&Event) -> Frames,
    omitting: &mut Omitting,
    mut pending: FuturesOrdered<F>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut acks = FuturesOrdered::new();
    while let Ok(ev) = live.try_recv() {
        if omitting.skips(&ev) {
            continue;
        }
        let Some(message) = publication(link, &ev, render, omitting.take()) else {
            continue;
        };
        match link
            .jetstream
            .send_publish(subject.to_string(), message)
            .await
        {
            Ok(ack) => acks.push_back(async move { ack.await.is_ok() }),
            Err(_) => break,
        }
    }
    let _ = tokio::time::timeout_at(deadline, async {
        while pending.next().await.is_some() {}
        while acks.next().await.is_some() {}
    })
    .await;
}

/// Where a [`read`] starts.
#[derive(Debug, Clone, Copy)]
pub enum ReadFrom {
    /// The oldest event the stream holds.
    Oldest,
    /// At most this many events before the newest.
    Last(u64),
    /// The first event after this `seq`.
    After(u64),
}

/// The stream sequence of the first event after `seq` (found by bisection: the stream holds
/// events in `seq` order); one past the last if there is none.
async fn stream_seq_after(events: &stream::Stream, first: u64, last: u64, seq: u64) -> u64 {
    let (mut lo, mut hi) = (first, last + 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let at = match events.get_raw_message(mid).await {
            Ok(m) => parse(&m.payload).map(|e| e.seq).unwrap_or(0),
            Err(_) => 0,
        };
        if at > seq {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// The stream's events from `from` on, in order, until `stop`. With `until_caught_up`, ends
/// once it has read what the stream held when it began.
pub async fn read(
    link: &Link,
    from: ReadFrom,
    until_caught_up: bool,
    stop: CancellationToken,
    mut each: impl FnMut(MirroredEvent),
) -> Result<(), String> {
    let Some(mut streams) = link.streams_or_stop(&stop).await else {
        return Ok(());
    };
    let info = streams
        .events
        .info()
        .await
        .map_err(|e| format!("stream {}: {e}", link.names.events_stream()))?;
    let state = info.state.clone();
    if until_caught_up && state.messages == 0 {
        return Ok(());
    }
    // An empty stream's first and last sequence are 0; its next message will be 1.
    let deliver_policy = match from {
        ReadFrom::Oldest => consumer::DeliverPolicy::All,
        ReadFrom::Last(n) => consumer::DeliverPolicy::ByStartSequence {
            start_sequence: state
                .last_sequence
                .saturating_sub(n.saturating_sub(1))
                .max(state.first_sequence)
                .max(1),
        },
        ReadFrom::After(seq) => consumer::DeliverPolicy::ByStartSequence {
            start_sequence: stream_seq_after(
                &streams.events,
                state.first_sequence,
                state.last_sequence,
                seq,
            )
            .await
            .max(1),
        },
    };
    let consumer = streams
        .events
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", link.names.events_stream()))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("stream {}: {e}", link.names.events_stream()))?;
    loop {
        let Some(next) = super::next_or_stop(&stop, &mut messages).await else {
            return Ok(());
        };
        let msg = match next {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "events stream");
                continue;
            }
            None => return Ok(()),
        };
        let stream_seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        match parse(&msg.payload) {
            Ok(ev) => each(ev),
            Err(e) => {
                tracing::warn!(error = %e, stream_seq, "an event in the stream that is not the pump's; skipped")
            }
        }
        if until_caught_up && stream_seq >= state.last_sequence {
            return Ok(());
        }
    }
}

/// How often the organism's snapshot is mirrored (when events happened since the last).
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);

/// Mirrors the organism's snapshot (`render(seq)`: its state as of event `seq`) to
/// `<prefix>.snapshot` every [`SNAPSHOT_EVERY`] when events happened since the last, until
/// `stop`. The stream keeps the latest only.
pub async fn mirror_snapshots(
    link: Link,
    hub: Arc<EventHub>,
    render: impl Fn(u64) -> Option<bytes::Bytes> + Send + 'static,
    stop: CancellationToken,
) {
    let subject = link.names.snapshot_subject();
    // The first as soon as the streams exist.
    if link.streams_or_stop(&stop).await.is_none() {
        return;
    }
    let mut sent = None;
    let mut every = tokio::time::interval(SNAPSHOT_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let seq = hub.last_seq();
        if sent == Some(seq) {
            continue;
        }
        let Some(body) = render(seq) else { continue };
        if let Err(too_big) = link.fits(body.len()) {
            // Never sendable: gateways keep the last one that was.
            tracing::warn!(seq, "snapshot not mirrored: it is {too_big}");
            sent = Some(seq);
            continue;
        }
        if link
            .publish(&subject, body, &format!("snapshot-{seq}"))
            .await
            .is_ok()
        {
            sent = Some(seq);
        }
    }
}

/// A mirrored snapshot: the organism as of event `seq`.
#[derive(Debug, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    pub organism: serde_json::Value,
    #[serde(default)]
    pub agents: Vec<serde_json::Value>,
    #[serde(default)]
    pub threads: Vec<serde_json::Value>,
    /// Each tenant's listener and its tenant (the file's and the API's agents alike), which
    /// a gateway's tenant scopes come from; absent from a pump that does not send it.
    #[serde(default)]
    pub tenants: Option<std::collections::BTreeMap<String, String>>,
    /// The open inputs, newest first (at most [`SNAPSHOT_INPUTS`]), each without its
    /// payload (`id, kind, status, thread_id, message_id, listener, from, payload_type,
    /// prompt, created_at, expires_at`).
    #[serde(default)]
    pub inputs: Vec<serde_json::Value>,
}

/// Open inputs a mirrored snapshot lists at most.
pub const SNAPSHOT_INPUTS: usize = 1000;

/// Every snapshot from the latest on, until `stop`.
pub async fn follow_snapshots(
    link: &Link,
    stop: CancellationToken,
    mut each: impl FnMut(Snapshot),
) -> Result<(), String> {
    let Some(streams) = link.streams_or_stop(&stop).await else {
        return Ok(());
    };
    let name = link.names.snapshot_stream();
    let consumer = streams
        .snapshot
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::Last,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {name}: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("stream {name}: {e}"))?;
    loop {
        match super::next_or_stop(&stop, &mut messages).await {
            None | Some(None) => return Ok(()),
            Some(Some(Ok(msg))) => match serde_json::from_slice::<Snapshot>(&msg.payload) {
                Ok(s) => each(s),
                Err(e) => tracing::warn!(error = %e, "a snapshot that is not the pump's; skipped"),
            },
            Some(Some(Err(e))) => tracing::debug!(error = %e, "snapshot stream"),
        }
    }
}
