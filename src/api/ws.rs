//! `/ws` and `/ws/messages` (SPEC §10).
//!
//! Each client is two tasks. The session task reads the organism's event channel (after
//! replaying retained events for `?since=`), filters, and offers each frame to a bounded
//! queue with `try_send`: it never waits on the client, so a slow client costs the pump
//! nothing. When the queue (or its byte budget) is full, frames are dropped for that client
//! and counted; a `dropped` frame (`count`, `from_seq`, `to_seq`) goes out as soon as there is
//! room. The writer task drains the queue into the socket with a write timeout. Pings go out
//! every heartbeat; a client silent for two heartbeats is closed.

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

use super::auth::{
    command_need, command_organism_wide, unauthorized, unknown_thread, AuthPending, Principal,
    Refused, Scope, Seen,
};
use super::error::{ApiError, Params};
use super::filter::Filter;
use super::frame::{event_frame, message_frame};
use super::inject::{inject, InjectBody};
use super::rest::reload_blocking;
use super::{ApiState, Endpoint};
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

/// Who opens a session: known from the upgrade request, or (`principal: None`) still to
/// present a credential in its first frame; and from which address.
pub struct Who {
    principal: Option<Principal>,
    remote: Option<std::net::IpAddr>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, ApiError> {
        let remote = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        match (
            parts.extensions.get::<Principal>(),
            parts.extensions.get::<AuthPending>(),
        ) {
            (Some(p), _) => Ok(Who {
                principal: Some(p.clone()),
                remote,
            }),
            (None, Some(_)) => Ok(Who {
                principal: None,
                remote,
            }),
            (None, None) => Err(unauthorized(&Refused::Missing)),
        }
    }
}

/// How long a session whose upgrade carried no credential may take to send it.
pub const AUTH_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Close codes of sessions refused or ended for their credential.
const CLOSE_UNAUTHORIZED: u16 = 4401;

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

/// Frames not sent to this client, waiting to be reported.
#[derive(Debug, Clone, Copy)]
struct Dropped {
    count: u64,
    from_seq: u64,
    to_seq: u64,
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
    /// Set when a control frame (an answer) found the client's queue full: the client sends
    /// commands but does not read, and is closed.
    overflow: bool,
}

fn text(value: &Value) -> Message {
    Message::Text(Utf8Bytes::from(value.to_string()))
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
            None => match first_frame_auth(&state, &mut stream, remote).await {
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
        let (tx, mut rx) = mpsc::channel::<Message>(options.client_queue.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let writer_queued = queued.clone();
        let write_timeout = options.heartbeat * 2;
        let mut writer = tokio::spawn(async move {
            // Frames already queued go out together: fed one by one, flushed (written to the
            // socket) once, so a busy client costs one write per batch, not per frame.
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
        });

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
            overflow: false,
        };
        if let Some(oldest) = sub.resync_from {
            session.control(json!({
                "event": "resync_required",
                "seq": sub.seq,
                "timestamp": Timestamp::now(),
                "since": since,
                "oldest_seq": oldest,
            }));
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
        let reader = tokio::spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                if in_tx.send(Some(msg)).await.is_err() {
                    return;
                }
            }
            let _ = in_tx.send(None).await;
        });
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
        loop {
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

    /// What the session's principal sees now.
    fn scope(&mut self) -> Scope {
        let Some((config, scope)) = &mut self.tenant_view else {
            return Scope::default();
        };
        let now = self.state.inner.organism.config();
        if !Arc::ptr_eq(config, &now) {
            *scope = self.principal.scope(&now);
            *config = now;
        }
        scope.clone()
    }

    /// Whether a tenant's session sees `ev` (every event, for an organism-wide one).
    fn sees(&mut self, ev: &Event) -> bool {
        if self.tenant_view.is_none() {
            return true;
        }
        let scope = self.scope();
        let threads = self.state.inner.organism.threads();
        let thread = |id: &str| {
            threads
                .info(id)
                .is_some_and(|t| scope.sees_thread(&t.participants))
        };
        match &ev.kind {
            EventKind::AgentState { agent, .. } | EventKind::Log { agent, .. } => scope.sees(agent),
            EventKind::Message { message } => {
                scope.sees_message(&message.from, message.to.as_deref())
            }
            EventKind::MessageStatus { about: Some(a), .. } => {
                scope.sees_message(&a.from, a.to.as_deref())
            }
            EventKind::MessageStatus { thread_id, .. }
            | EventKind::ThreadUpdated { thread_id, .. } => thread(thread_id),
            EventKind::ThreadCreated { thread: t } => {
                scope.sees_thread(&t.participants) || thread(&t.id)
            }
            EventKind::Error { agent: Some(a), .. } => scope.sees(a),
            EventKind::Error {
                thread_id: Some(t), ..
            } => thread(t),
            EventKind::Reload { agent: Some(a), .. } => scope.sees(a),
            EventKind::OrganismState { .. } => true,
            EventKind::Error { .. } | EventKind::Reload { .. } | EventKind::Audit { .. } => false,
        }
    }

    fn snapshot(&mut self, seq: u64) -> Value {
        let scope = self.scope();
        let organism = &self.state.inner.organism;
        let info = super::view::Organism::from(organism.info());
        match self.ep {
            Endpoint::Messages => json!({
                "event": "connected",
                "seq": seq,
                "timestamp": Timestamp::now(),
                "organism": info,
                "filter": self.filter,
            }),
            Endpoint::Events => {
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
                json!({
                    "event": "connected",
                    "seq": seq,
                    "timestamp": Timestamp::now(),
                    "organism": info,
                    "agents": agents.into_iter().map(super::view::Agent::from).collect::<Vec<_>>(),
                    "threads": threads.into_iter().map(super::view::Thread::from).collect::<Vec<_>>(),
                    "filter": self.filter,
                })
            }
        }
    }

    /// Whether the session's credential still holds (looked up off the async workers).
    async fn still_valid(&self) -> bool {
        let Some(auth) = self.state.inner.auth.clone() else {
            return true;
        };
        let p = self.principal.clone();
        tokio::task::spawn_blocking(move || auth.still_valid(&p))
            .await
            .unwrap_or(false)
    }

    fn close_unauthorized(&self) {
        tracing::info!(
            endpoint = self.ep.path(),
            principal = ?self.principal.name,
            "closing a WebSocket session: its credential was revoked or expired"
        );
        let _ = self.tx.try_send(Message::Close(Some(CloseFrame {
            code: CLOSE_UNAUTHORIZED,
            reason: Utf8Bytes::from_static("credential revoked or expired"),
        })));
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
        if let Some(d) = self.dropped {
            // Report the gap first; if even that does not fit, this one joins it.
            if self.try_queue(dropped_frame(d)) {
                self.dropped = None;
            } else {
                self.drop_one(ev.seq);
                return;
            }
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
        self.dropped = Some(match self.dropped {
            None => Dropped {
                count,
                from_seq,
                to_seq,
            },
            Some(d) => Dropped {
                count: d.count + count,
                from_seq: d.from_seq,
                to_seq,
            },
        });
    }

    async fn command(&mut self, raw: &str) {
        let mut audited = None;
        let reply = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(map)) => {
                audited = audited_command(&map);
                self.execute(map).await
            }
            Ok(_) | Err(_) => Err((
                Value::Null,
                String::new(),
                ApiError::bad_request("a command is a JSON object with a `cmd` field"),
            )),
        };
        if let Some((action, target)) = audited {
            let p = &self.principal;
            let result = match &reply {
                Ok(_) => "ack".to_string(),
                Err((_, _, e)) => e.status.as_u16().to_string(),
            };
            self.state
                .audit(crate::store::audit::AuditRow {
                    ts: crate::time::Timestamp::now(),
                    who: p.name.clone(),
                    role: Some(p.role.to_string()),
                    tenant: p.tenant.clone(),
                    action,
                    target: Some(target),
                    result,
                    remote: self.remote.map(|ip| ip.to_string()),
                })
                .await;
        }
        // Not the hub's latest: an answer never carries a `seq` ahead of the events this
        // connection has been offered, so a client resuming from the highest `seq` it saw
        // loses nothing.
        let seq = self.seen;
        let frame = match reply {
            Ok((request_id, cmd, mut fields)) => {
                let mut frame = json!({
                    "event": "ack",
                    "seq": seq,
                    "timestamp": Timestamp::now(),
                    "request_id": request_id,
                    "cmd": cmd,
                });
                if let Some(obj) = frame.as_object_mut() {
                    obj.append(&mut fields);
                }
                frame
            }
            Err((request_id, cmd, e)) => json!({
                "event": "error",
                "seq": seq,
                "timestamp": Timestamp::now(),
                "request_id": request_id,
                "cmd": cmd,
                "status": e.status.as_u16(),
                "code": e.body.code,
                "error": e.body.message,
                "details": e.body.details,
                "where": e.body.location,
            }),
        };
        self.control(frame);
    }

    /// Runs one command. Ok: the ack's extra fields. Err: the error, with the request id.
    async fn execute(
        &mut self,
        mut map: Map<String, Value>,
    ) -> Result<(Value, String, Map<String, Value>), (Value, String, ApiError)> {
        let request_id = map.remove("request_id").unwrap_or(Value::Null);
        let cmd = match map.remove("cmd") {
            Some(Value::String(c)) => c,
            _ => {
                return Err((
                    request_id,
                    String::new(),
                    ApiError::bad_request("a command needs a `cmd` string").at("cmd"),
                ))
            }
        };
        let fail = |e: ApiError| (request_id.clone(), cmd.clone(), e);
        let names_agent = matches!(map.get("agent"), Some(Value::String(_)));
        let need = command_need(&cmd, names_agent);
        if !self.principal.may(need) {
            return Err(fail(super::auth::forbidden(&self.principal, need)));
        }
        if self.principal.tenant.is_some() && command_organism_wide(&cmd, names_agent) {
            return Err(fail(super::auth::tenant_forbidden()));
        }
        let scope = self.scope();
        if let Some(Value::String(a)) = map.get("agent") {
            if !scope.sees(a) {
                return Err(fail(
                    crate::pump::ControlError::UnknownListener(a.clone()).into(),
                ));
            }
        }
        let organism = self.state.inner.organism.clone();
        let mut out = Map::new();
        match (cmd.as_str(), self.ep) {
            ("subscribe", _) => {
                let spec = match map.remove("filter") {
                    Some(f) if map.is_empty() => f,
                    Some(_) => {
                        return Err(fail(ApiError::bad_request(
                            "give the filter either under `filter` or at the top level, not both",
                        )))
                    }
                    None => Value::Object(map),
                };
                let mut filter: Filter = serde_json::from_value(spec)
                    .map_err(|e| fail(ApiError::bad_request(format!("bad filter: {e}")).at("filter")))?;
                filter
                    .prepare(&organism.config().limits)
                    .map_err(|(m, at)| fail(ApiError::bad_request(m).at(at)))?;
                self.filter = filter;
                out.insert("filter".into(), json!(self.filter));
            }
            (_, Endpoint::Messages) => {
                return Err(fail(ApiError::bad_request(format!(
                    "`{cmd}` is not a command of /ws/messages (only `subscribe`); use /ws"
                ))
                .at("cmd")))
            }
            ("inject", _) => {
                let body: InjectBody = serde_json::from_value(Value::Object(map))
                    .map_err(|e| fail(ApiError::bad_request(format!("bad inject: {e}"))))?;
                self.state.limit_inject(&self.principal).map_err(fail)?;
                let seen = Seen {
                    principal: self.principal.clone(),
                    scope,
                };
                let receipt = inject(&organism, &seen, WS_IDENTITY, body).map_err(fail)?;
                out.insert("thread_id".into(), json!(receipt.thread_id));
                out.insert("message_id".into(), json!(receipt.message_id));
            }
            ("pause" | "resume", _) => {
                let pause = cmd == "pause";
                match map.get("agent") {
                    None | Some(Value::Null) => {
                        if pause {
                            organism.pause()
                        } else {
                            organism.resume()
                        }
                    }
                    Some(Value::String(a)) => {
                        let r = if pause {
                            organism.pause_listener(a)
                        } else {
                            organism.resume_listener(a)
                        };
                        r.map_err(|e| fail(e.into()))?;
                        out.insert("agent".into(), json!(a));
                    }
                    Some(_) => {
                        return Err(fail(ApiError::bad_request("`agent` must be a name").at("agent")))
                    }
                }
            }
            ("kill", _) => {
                let Some(Value::String(t)) = map.get("thread_id") else {
                    return Err(fail(
                        ApiError::bad_request("`kill` needs a `thread_id`").at("thread_id"),
                    ));
                };
                let visible = organism
                    .thread_info(t)
                    .map_err(|e| fail(e.into()))?
                    .is_some_and(|info| scope.sees_thread(&info.participants));
                if !visible {
                    return Err(fail(unknown_thread(t)));
                }
                organism.kill_thread(t).map_err(|e| fail(e.into()))?;
                out.insert("thread_id".into(), json!(t));
            }
            ("reload", _) => match map.get("agent") {
                Some(Value::String(a)) => {
                    let a = a.clone();
                    let o = organism.clone();
                    let r = tokio::task::spawn_blocking(move || o.reload_listener(&a))
                        .await
                        .map_err(|e| fail(ApiError::bad_request(e.to_string())))?;
                    r.map_err(|e| fail(e.into()))?;
                    out.insert("agent".into(), map.get("agent").cloned().unwrap_or(Value::Null));
                }
                None => {
                    let if_rev = match map.get("if_rev") {
                        None | Some(Value::Null) => None,
                        Some(v) => Some(v.as_u64().ok_or_else(|| {
                            fail(ApiError::bad_request("`if_rev` must be a revision number").at("if_rev"))
                        })?),
                    };
                    let report = reload_blocking(&organism, if_rev).await.map_err(fail)?;
                    if let Ok(Value::Object(fields)) = serde_json::to_value(report) {
                        out.extend(fields);
                    }
                }
                Some(_) => {
                    return Err(fail(ApiError::bad_request("`agent` must be a name").at("agent")))
                }
            },
            ("stop", _) => self.state.request_stop(),
            (other, _) => {
                return Err(fail(ApiError::bad_request(format!(
                    "unknown command `{other}` (known: subscribe, inject, pause, resume, kill, reload, stop)"
                ))
                .at("cmd")))
            }
        }
        Ok((request_id, cmd, out))
    }
}

/// Waits up to [`AUTH_FRAME_TIMEOUT`] for `{"cmd": "auth", "token": …}` as the session's
/// first frame. Err: the close reason (the same whatever was wrong; the log has the detail).
async fn first_frame_auth(
    state: &ApiState,
    stream: &mut futures_util::stream::SplitStream<WebSocket>,
    from: Option<std::net::IpAddr>,
) -> Result<Principal, &'static str> {
    let auth = state.inner.auth.clone();
    let failed = || match (&auth, from) {
        (Some(a), Some(ip)) if a.limits.failed_auth(ip).is_err() => {
            "too many failed authentications from this address"
        }
        _ => REFUSED,
    };
    const REFUSED: &str = "unauthorized: send {\"cmd\": \"auth\", \"token\": …} first";
    let Some(auth) = state.inner.auth.clone() else {
        return Ok(Principal::implicit());
    };
    let first = loop {
        match tokio::time::timeout(AUTH_FRAME_TIMEOUT, stream.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => break t,
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            Err(_) => {
                tracing::info!("WebSocket session sent no credential in time");
                return Err(failed());
            }
            _ => return Err(failed()),
        }
    };
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AuthFrame {
        cmd: String,
        token: String,
    }
    let token = match serde_json::from_str::<AuthFrame>(first.as_str()) {
        Ok(f) if f.cmd == "auth" => f.token,
        _ => {
            tracing::info!("WebSocket session's first frame is not an auth command");
            return Err(failed());
        }
    };
    match tokio::task::spawn_blocking(move || auth.verify(&token)).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(Refused::Invalid(why))) => {
            tracing::info!("WebSocket credential refused: {why}");
            Err(failed())
        }
        _ => Err(failed()),
    }
}

/// The audit entry's action and target of a `/ws` control command (`None` for `subscribe`,
/// `inject` and anything unknown).
fn audited_command(map: &Map<String, Value>) -> Option<(String, String)> {
    let cmd = map.get("cmd")?.as_str()?;
    if !matches!(cmd, "pause" | "resume" | "reload" | "kill" | "stop") {
        return None;
    }
    let named = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
    let target = named("agent")
        .or_else(|| named("thread_id"))
        .unwrap_or_else(|| "organism".into());
    Some((format!("ws {cmd}"), target))
}

fn dropped_frame(d: Dropped) -> Message {
    text(&json!({
        "event": "dropped",
        "seq": d.to_seq,
        "timestamp": Timestamp::now(),
        "count": d.count,
        "from_seq": d.from_seq,
        "to_seq": d.to_seq,
    }))
}

fn frame_len(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.len(),
        _ => 0,
    }
}
