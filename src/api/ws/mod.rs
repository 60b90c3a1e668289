//! `/ws` and `/ws/messages` (SPEC §10).
//!
//! Each client is two tasks. The session task reads the organism's event channel (after
//! replaying retained events for `?since=`), filters, and offers each frame to a bounded
//! queue with `try_send`: it never waits on the client, so a slow client costs the pump
//! nothing. When the queue (or its byte budget) is full, frames are dropped for that client
//! and counted; a `dropped` frame (`count`, `from_seq`, `to_seq`) goes out as soon as there is
//! room. The writer task drains the queue into the socket with a write timeout. Pings go out
//! every heartbeat; a client silent for two heartbeats is closed.

mod access;
mod commands;
mod frames;

pub use access::Who;
pub(in crate::api) use access::{first_frame_auth, CLOSE_UNAUTHORIZED};
use frames::frame_len;
pub(in crate::api) use frames::{
    dropped_frame, protocol_close, resync_frame, text, Dropped, Folding,
};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::error::{ApiError, Params};
use super::filter::Filter;
use super::frame::{event_frame, message_frame};
use super::inject::{inject, InjectBody};
use super::rest::reload_blocking;
use super::{ApiState, Endpoint};
use crate::api::auth::{
    command_least, command_rule, unauthorized, unknown_thread, AuthPending, Need, On, Principal,
    Refused, Scope, Seen,
};
use crate::events::{Event, EventKind, RecvError, TryRecvError};
use crate::time::Timestamp;

/// The identity `/ws` injects carry.
pub const WS_IDENTITY: &str = "ws";
/// Threads listed in a `connected` snapshot besides the active ones.
const RECENT_THREADS: usize = 100;

/// Connection options: resume point and the initial filter (comma-separated lists), applied
/// before anything is replayed.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WsQuery {
    /// Resume after this `seq`: retained events after it are replayed, then live ones follow.
    pub since: Option<u64>,
    /// Thread ids, comma-separated.
    pub threads: Option<String>,
    /// Agent names or globs (`shout*`), comma-separated.
    pub agents: Option<String>,
    /// Event types, comma-separated (`/ws` only).
    pub events: Option<String>,
    /// Payload types, comma-separated.
    pub payload_types: Option<String>,
    /// `/ws`: send each agent's latest `agent_state` only, every this many milliseconds
    /// (10 to 60000), in one `agent_states` frame.
    pub coalesce_ms: Option<u64>,
    /// `/ws`: `message` and `message_status` events past this many a second are not sent;
    /// `folded` frames count them.
    pub max_messages_per_s: Option<u64>,
}

#[utoipa::path(get, path = "/ws", tag = "streams", params(WsQuery),
    responses((status = 101, description = "WebSocket: a `connected` snapshot, then every event (JSON frames with `event`, `seq`, `timestamp`); commands `subscribe`, `inject`, `pause`, `resume`, `kill`, `reload`, `stop`, answered by `ack` or `error` with the `request_id`"),
              (status = 400, description = "Bad query parameter", body = super::error::ErrorResponse)))]
pub async fn ws_events(
    ws: WebSocketUpgrade,
    State(state): State<ApiState>,
    who: Who,
    Params(q): Params<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, state, Endpoint::Events, who, q)
}

#[utoipa::path(get, path = "/ws/messages", tag = "streams", params(WsQuery),
    responses((status = 101, description = "WebSocket: the message log as a stream; each frame is the message object with `event: message`, `seq` and `slot_index`; command `subscribe` with `filter: {agents, threads, payload_types}`"),
              (status = 400, description = "Bad query parameter", body = super::error::ErrorResponse)))]
pub async fn ws_messages(
    ws: WebSocketUpgrade,
    State(state): State<ApiState>,
    who: Who,
    Params(q): Params<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, state, Endpoint::Messages, who, q)
}

fn upgrade(
    ws: WebSocketUpgrade,
    state: ApiState,
    ep: Endpoint,
    who: Who,
    q: WsQuery,
) -> Result<Response, ApiError> {
    let mut filter = Filter::from_query(
        q.threads.as_deref(),
        q.agents.as_deref(),
        q.events.as_deref(),
        q.payload_types.as_deref(),
    );
    filter.coalesce_ms = q.coalesce_ms;
    filter.max_messages_per_s = q.max_messages_per_s;
    filter
        .prepare(&state.inner.organism.config().limits)
        .map_err(|(m, at)| ApiError::bad_request(m).at(at))?;
    let limit = state.frame_limit();
    Ok(ws
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| async move {
            Session::run(socket, state, ep, who, filter, q.since).await
        }))
}

struct Session {
    state: ApiState,
    ep: Endpoint,
    principal: Principal,
    /// The client's address, for the audit log.
    remote: Option<std::net::IpAddr>,
    /// What a tenant's principal sees, with the config it was made from (made again after
    /// a reload); `None` for an organism-wide principal, which sees everything.
    tenant_view: Option<(Arc<crate::config::OrganismConfig>, Scope)>,
    filter: Filter,
    tx: mpsc::Sender<Message>,
    queued: Arc<AtomicUsize>,
    /// The last event `seq` this session has looked at.
    seen: u64,
    dropped: Option<Dropped>,
    folding: Folding,
    /// Set when a control frame (an answer) found the client's queue full: the client sends
    /// commands but does not read, and is closed.
    overflow: bool,
}

/// Frames written to a client's socket per flush, at most.
const WRITE_BATCH: usize = 256;

/// Events a session takes from the hub in one turn of its loop, at most (then it checks its
/// client, heartbeat and shutdown again).
const OFFER_BATCH: usize = 256;

impl Session {
    async fn run(
        socket: WebSocket,
        state: ApiState,
        ep: Endpoint,
        who: Who,
        filter: Filter,
        since: Option<u64>,
    ) {
        let _client = state.client_guard(ep);
        let options = state.inner.options.clone();
        let (mut sink, mut stream) = socket.split();
        let remote = who.remote;
        let principal = match who.principal {
            Some(p) => p,
            None => match first_frame_auth(state.inner.auth.clone(), &mut stream, remote).await {
                Ok(p) => p,
                Err(reason) => {
                    let _ = tokio::time::timeout(
                        options.heartbeat,
                        sink.send(Message::Close(Some(CloseFrame {
                            code: CLOSE_UNAUTHORIZED,
                            reason: Utf8Bytes::from(reason),
                        }))),
                    )
                    .await;
                    return;
                }
            },
        };
        let (tx, rx) = mpsc::channel::<Message>(options.client_queue.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let writer_queued = queued.clone();
        let write_timeout = options.heartbeat * 2;
        let mut writer = tokio::spawn(write_frames(sink, rx, writer_queued, write_timeout));

        let hub = state.inner.organism.events();
        let sub = hub.subscribe_since(since);
        let mut session = Session {
            state: state.clone(),
            ep,
            tenant_view: principal.tenant.is_some().then(|| {
                let config = state.inner.organism.config();
                let scope = principal.scope(&config);
                (config, scope)
            }),
            principal,
            remote,
            filter,
            tx: tx.clone(),
            queued,
            seen: sub.seq,
            dropped: None,
            folding: Folding::default(),
            overflow: false,
        };
        if let Some(oldest) = sub.resync_from {
            session.control(resync_frame(sub.seq, since, oldest));
        }
        if since.is_none() || sub.resync_from.is_some() {
            let snapshot = session.snapshot(sub.seq);
            session.control(snapshot);
        } else if let Some(s) = since {
            session.seen = s;
        }
        for ev in &sub.replay {
            session.offer(ev);
        }
        let mut live = sub.live;

        // The client's frames are read by their own task: polling the socket from the loop
        // below would try a read (and prepare a read buffer) for every event offered.
        let (in_tx, mut incoming) = mpsc::channel::<Option<Message>>(16);
        let reader = tokio::spawn(read_frames(stream, in_tx));
        let reserve_tx = tx.clone();
        drop(tx);
        let closing = state.inner.closing.clone();
        let mut heartbeat = tokio::time::interval(options.heartbeat);
        heartbeat.tick().await;
        let mut last_heard = Instant::now();
        let mut writer_done = false;
        // Made once: a fresh `cancelled()` per loop turn costs a notifier registration for
        // every event offered.
        let stopping = closing.cancelled();
        tokio::pin!(stopping);
        // A session on a credential that can end (a key, an expiring token) looks at it
        // again every second, and at once when the API revokes a key.
        let auth = state.inner.auth.clone();
        let watched = auth.is_some()
            && (session.principal.key_id.is_some() || session.principal.expires.is_some());
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        // What folding holds back goes out this often (a subscription may change it).
        let mut flush_every = session.flush_every();
        let mut flush = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if session.flush_every() != flush_every {
                // A new subscription: what the old one held back goes out first.
                session.flush_folded();
                flush_every = session.flush_every();
                flush = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
                flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
            let revoked = async {
                match &auth {
                    Some(a) if watched => a.revoked.notified().await,
                    _ => std::future::pending().await,
                }
            };
            // Biased, with the event stream last: the client's commands, the dropped notice
            // and the heartbeat are never starved by a busy stream.
            tokio::select! {
                biased;
                _ = &mut stopping => {
                    let _ = session.tx.try_send(Message::Close(Some(CloseFrame {
                        code: axum::extract::ws::close_code::AWAY,
                        reason: Utf8Bytes::from_static("server stopping"),
                    })));
                    break;
                }
                _ = revoked, if watched => {
                    if !session.still_valid().await {
                        session.close_unauthorized();
                        break;
                    }
                }
                _ = recheck.tick(), if watched => {
                    if !session.still_valid().await {
                        session.close_unauthorized();
                        break;
                    }
                }
                frame = incoming.recv() => match frame {
                    Some(Some(Message::Text(t))) => {
                        last_heard = Instant::now();
                        session.command(t.as_str()).await;
                        if session.overflow {
                            tracing::info!(endpoint = ep.path(), "closing a WebSocket client that sends commands but does not read their answers");
                            let _ = session.tx.try_send(Message::Close(Some(CloseFrame {
                                code: axum::extract::ws::close_code::POLICY,
                                reason: Utf8Bytes::from_static("not reading: answers over the client queue"),
                            })));
                            break;
                        }
                    }
                    // The reader's close for a protocol error: sent, then the session ends.
                    Some(Some(Message::Close(Some(frame)))) if frame.code >= 1002 => {
                        let _ = session.tx.try_send(Message::Close(Some(frame)));
                        break;
                    }
                    Some(Some(Message::Close(_))) | Some(None) | None => break,
                    Some(Some(_)) => last_heard = Instant::now(),
                },
                permit = reserve_tx.reserve(), if session.dropped.is_some() => {
                    if let (Ok(permit), Some(d)) = (permit, session.dropped.take()) {
                        let frame = dropped_frame(d);
                        session.queued.fetch_add(frame_len(&frame), Ordering::Relaxed);
                        permit.send(frame);
                    }
                }
                _ = flush.tick(), if flush_every.is_some() => session.flush_folded(),
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > options.heartbeat * 2 {
                        tracing::info!(endpoint = ep.path(), "closing a WebSocket client that stopped answering");
                        break;
                    }
                    let _ = session.tx.try_send(Message::Ping(Default::default()));
                }
                _ = &mut writer => {
                    writer_done = true;
                    break;
                }
                r = live.recv() => {
                    match r {
                        Ok(ev) => session.offer(&ev),
                        Err(RecvError::Lagged(n)) => session.lost(n),
                        Err(RecvError::Closed) => break,
                    }
                    // Take what else is already published before selecting again.
                    for _ in 0..OFFER_BATCH {
                        // Lent, not cloned: 50 sessions taking a reference to each event
                        // on two cores contend for its count.
                        match live.try_recv_with(|ev| session.offer(ev)) {
                            Ok(()) => {}
                            Err(TryRecvError::Lagged(n)) => session.lost(n),
                            Err(_) => break,
                        }
                    }
                }
            }
        }
        reader.abort();
        // A client closed for not reading gets a second to take its close frame; others
        // get the write timeout to take what is queued.
        let wait = if session.overflow {
            Duration::from_secs(1)
        } else {
            write_timeout
        };
        drop(session);
        drop(reserve_tx);
        if !writer_done && tokio::time::timeout(wait, &mut writer).await.is_err() {
            writer.abort();
        }
    }

    fn snapshot(&mut self, seq: u64) -> Value {
        let scope = self.scope();
        let organism = &self.state.inner.organism;
        let info = crate::api::view::Organism::from(organism.info());
        match self.ep {
            Endpoint::Messages => json!({
                "event": "connected",
                "seq": seq,
                "timestamp": Timestamp::now(),
                "organism": info,
                "filter": self.filter,
            }),
            Endpoint::Events => {
                let (agents, threads) = snapshot_lists(organism, &scope);
                json!({
                    "event": "connected",
                    "seq": seq,
                    "timestamp": Timestamp::now(),
                    "organism": info,
                    "agents": agents,
                    "threads": threads,
                    "filter": self.filter,
                })
            }
        }
    }

    /// Queues a control frame (snapshot, resync, ack, error). It counts against the client's
    /// queue like any frame; one that does not fit (by frames or bytes) is not queued, and
    /// marks the session `overflow`: its client is closed. The first frames of a session
    /// always fit (the queue is empty).
    fn control(&mut self, frame: Value) {
        let msg = text(&frame);
        let len = frame_len(&msg);
        let queued = self.queued.load(Ordering::Relaxed);
        if queued > 0 && queued + len > self.state.inner.options.client_queue_bytes {
            self.overflow = true;
            return;
        }
        if !self.try_queue(msg) {
            self.overflow = true;
        }
    }

    /// Offers one event: filtered, then queued or counted as dropped.
    fn offer(&mut self, ev: &Event) {
        if ev.seq <= self.seen {
            return;
        }
        self.seen = ev.seq;
        if !self.sees(ev) {
            return;
        }
        let frame = match self.ep {
            Endpoint::Events if self.filter.passes(ev) => {
                // Held back before it is written out: a folded event costs no rendering.
                if self.fold(ev) {
                    return;
                }
                event_frame(ev, &self.state.inner.organism)
            }
            Endpoint::Events => None,
            Endpoint::Messages => {
                if self.filter.passes_message(ev) {
                    message_frame(ev, &self.state.inner.organism)
                } else {
                    None
                }
            }
        };
        let Some(frame) = frame else { return };
        if !self.gap_told() {
            // Even the gap's notice does not fit: this one joins the gap.
            self.drop_one(ev.seq);
            return;
        }
        let budget = self.state.inner.options.client_queue_bytes;
        if self.queued.load(Ordering::Relaxed) + frame.len() > budget {
            self.drop_one(ev.seq);
            return;
        }
        if !self.try_queue(Message::Text(frame.clone())) {
            self.drop_one(ev.seq);
        }
    }

    /// How often held-back frames go out: the coalescing interval, or every second for the
    /// message rate alone; `None` when the client folds nothing.
    fn flush_every(&self) -> Option<Duration> {
        Folding::every(&self.filter)
    }

    /// Sends the notice of frames dropped, if any is owed, before anything later (its `seq`
    /// is its gap's end, so nothing sent after the gap may go first). False if it is owed
    /// and does not fit.
    fn gap_told(&mut self) -> bool {
        let Some(d) = self.dropped else {
            return true;
        };
        if !self.try_queue(dropped_frame(d)) {
            return false;
        }
        self.dropped = None;
        true
    }

    /// `/ws`: holds back an event the client asked to fold (true), or lets it go (false).
    fn fold(&mut self, ev: &Event) -> bool {
        self.folding.hold(&self.filter, ev)
    }

    /// Sends what folding held back: the agents' latest states in one `agent_states` frame,
    /// and a `folded` frame counting the message events not sent. Both carry the `seq` of
    /// the last event offered, as answers do, so `seq` never goes back.
    fn flush_folded(&mut self) {
        if self.folding.is_empty() || !self.gap_told() {
            // Held on until the gap's notice has gone out.
            return;
        }
        if let Some(frame) = self.folding.states_frame(self.seen) {
            if !self.try_queue(frame) {
                self.drop_one(self.seen);
            }
        }
        if let Some((frame, f)) = self.folding.folded_frame(self.seen) {
            if !self.try_queue(frame) {
                self.folding.folded = Some(f);
            }
        }
    }

    /// Queues a frame if there is room, keeping the byte count the writer pays back.
    fn try_queue(&self, msg: Message) -> bool {
        let len = frame_len(&msg);
        self.queued.fetch_add(len, Ordering::Relaxed);
        if self.tx.try_send(msg).is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn drop_one(&mut self, seq: u64) {
        self.note_dropped(1, seq, seq);
    }

    /// The channel skipped `n` events after the last one seen.
    fn lost(&mut self, n: u64) {
        let from = self.seen + 1;
        self.seen += n;
        self.note_dropped(n, from, self.seen);
    }

    fn note_dropped(&mut self, count: u64, from_seq: u64, to_seq: u64) {
        self.state.count_dropped(self.ep, count);
        self.dropped = Some(Dropped::add(self.dropped, count, from_seq, to_seq));
    }
}

/// The writer task: drains a session's queue into its socket. Frames already queued go out
/// together: fed one by one, flushed (written to the socket) once, so a busy client costs
/// one write per batch, not per frame. Each batch has `write_timeout`; the bytes it carried
/// are paid back to `queued`. Ends at a close frame, a failed write or the queue's end.
async fn write_frames(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Message>,
    writer_queued: Arc<AtomicUsize>,
    write_timeout: Duration,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(_) => break,
            }
        }
        let len: usize = batch.iter().map(frame_len).sum();
        let closing = batch.iter().any(|m| matches!(m, Message::Close(_)));
        let frames = std::mem::take(&mut batch);
        let sent = tokio::time::timeout(write_timeout, async {
            for msg in frames {
                let last = matches!(msg, Message::Close(_));
                sink.feed(msg).await?;
                if last {
                    break;
                }
            }
            sink.flush().await
        })
        .await;
        writer_queued.fetch_sub(len, Ordering::Relaxed);
        if !matches!(sent, Ok(Ok(()))) || closing {
            break;
        }
    }
    let _ = tokio::time::timeout(write_timeout, sink.close()).await;
}

/// The reader task: a client's frames into `in_tx` (`None` once it is gone); a protocol
/// error becomes the close frame it owes (1009, 1007, 1002).
async fn read_frames(
    mut stream: futures_util::stream::SplitStream<WebSocket>,
    in_tx: mpsc::Sender<Option<Message>>,
) {
    loop {
        match stream.next().await {
            Some(Ok(msg)) => {
                if in_tx.send(Some(msg)).await.is_err() {
                    return;
                }
            }
            // A protocol error ends the session with its close code.
            Some(Err(e)) => {
                if let Some(frame) = protocol_close(e) {
                    let _ = in_tx.send(Some(Message::Close(Some(frame)))).await;
                }
                break;
            }
            None => break,
        }
    }
    let _ = in_tx.send(None).await;
}

/// The agents and threads a `connected` snapshot shows a principal of `scope`: every agent
/// it sees; every active thread it sees and the [`RECENT_THREADS`] latest others.
pub(in crate::api) fn snapshot_lists(
    organism: &crate::Organism,
    scope: &Scope,
) -> (Vec<crate::api::view::Agent>, Vec<crate::api::view::Thread>) {
    let mut threads = organism.threads().list();
    threads.retain(|t| scope.sees_thread(&t.participants));
    let mut agents = organism.agents();
    agents.retain(|a| scope.sees(&a.name));
    let mut recent = 0;
    threads.retain(|t| {
        t.status == crate::threads::ThreadStatus::Active || {
            recent += 1;
            recent <= RECENT_THREADS
        }
    });
    (
        agents
            .into_iter()
            .map(crate::api::view::Agent::from)
            .collect(),
        threads
            .into_iter()
            .map(crate::api::view::Thread::from)
            .collect(),
    )
}
