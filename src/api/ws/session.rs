//! One stream session, whoever serves it: the pump's `/ws` and `/ws/messages`, and a
//! gateway's. What differs is the [`Source`]: where events, snapshots and scopes come from,
//! and which commands it runs (a gateway's are read-only).
//!
//! Each client is three tasks. The session task reads the source's event hub (after
//! replaying retained events for `?since=`), filters, and offers each frame to a bounded
//! queue with `try_send` (on `/ws/messages` after holding it briefly, `held.rs`): it never
//! waits on the client, so a slow client costs the pump nothing. When the queue (or its
//! byte budget) is full, frames are dropped for that client and counted; a `dropped` frame
//! (`count`, `from_seq`, `to_seq`) goes out as soon as there is room. The writer task
//! drains the queue into the socket with a write timeout; the reader task hands the
//! client's frames to the session. Pings go out every heartbeat; a client silent for two
//! heartbeats is closed.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{close_code, CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::socket::{read_frames, write_frames, Out, Queued};
use super::{dropped_frame, first_frame_auth, Dropped, Folded, Folding, Who};
use super::{WsQuery, CLOSE_TOO_MANY_STREAMS, CLOSE_UNAUTHORIZED};
use crate::api::auth::{Authenticator, Principal, Scope};
use crate::api::error::ApiError;
use crate::api::filter::Filter;
use crate::api::streams::StreamSlot;
use crate::api::{ApiOptions, Endpoint};
use crate::config::Limits;
use crate::events::{Cause, Event, Receiver, RecvError, Subscription, TryRecvError};
use crate::time::Timestamp;

/// Events a session takes from the hub in one turn of its loop, at most (then it checks its
/// client, heartbeat and shutdown again).
const OFFER_BATCH: usize = 256;

/// How long a session may take, when the server stops, to tell its client what it missed
/// and close.
pub const FINISH: Duration = Duration::from_secs(5);

/// Events a stopping session takes from the hub, at most.
const FINISH_EVENTS: usize = 1 << 16;

/// What serves a session: its events, its `connected` snapshot, its principals' scopes and
/// its commands.
pub(in crate::api) trait Source: Sized + Send + Sync + 'static {
    /// What a tenant's scope is made from (the organism's config, the latest mirrored
    /// snapshot): when it changes, scopes are made again.
    type Basis: Send + Sync;

    /// The close reason a client gets when the server stops.
    const STOPPING: &'static str;

    fn basis(&self) -> Self::Basis;
    fn same(a: &Self::Basis, b: &Self::Basis) -> bool;
    fn scope(&self, p: &Principal, basis: &Self::Basis) -> Scope;

    /// Whether a principal of `scope` sees the thread `id` (false when it is not known).
    fn sees_thread(&self, scope: &Scope, id: &str) -> bool;

    /// The frame `ev` goes out as on `ep` (`None`: not one of that stream's).
    fn frame<'e>(&self, ep: Endpoint, ev: &'e Event) -> Option<&'e Utf8Bytes>;

    /// Event `seq`, if the hub still holds it.
    fn event(&self, seq: u64) -> Option<Arc<Event>>;

    /// The limits a `subscribe` filter is checked against.
    fn limits(&self) -> Limits;
    fn auth(&self) -> Option<Arc<Authenticator>>;
    /// Cancelled when the server stops.
    fn closing(&self) -> CancellationToken;
    /// `n` frames were not sent to a client of `ep`.
    fn count_dropped(&self, _ep: Endpoint, _n: u64) {}
    /// A thread's labels now, for a filter's label tests.
    fn thread_labels(&self, thread: &str) -> Option<Arc<crate::threads::Labels>>;
    /// A slot for one more stream of `p`'s tenant (`tenants.<t>.max_streams`), held for the
    /// session; `Err`: why not. (None where nothing is counted.)
    fn stream_slot(&self, _p: &Principal) -> Result<Option<StreamSlot>, String> {
        Ok(None)
    }

    /// Subscribes the session to the events after `since` (or the latest), queueing what
    /// comes before them (`resync_required`, `connected`); with the `since` it resumes
    /// from. `None` ends the session.
    fn open(
        s: &mut Session<Self>,
        since: Option<u64>,
    ) -> impl Future<Output = Option<(Subscription, Option<u64>)>> + Send;

    /// Runs one command (its `request_id` and `cmd` taken out): the ack's extra fields.
    fn execute(
        s: &mut Session<Self>,
        cmd: &str,
        map: Map<String, Value>,
    ) -> impl Future<Output = Result<Map<String, Value>, ApiError>> + Send;
}

/// The filter a connection's query asks for, checked against `limits`. The `/ws`-only
/// options are ignored on `/ws/messages`.
pub(in crate::api) fn query_filter(
    q: &WsQuery,
    ep: Endpoint,
    limits: &Limits,
) -> Result<Filter, ApiError> {
    let events = ep == Endpoint::Events;
    let mut filter = Filter::from_query(
        q.threads.as_deref(),
        q.agents.as_deref(),
        q.events.as_deref().filter(|_| events),
        q.payload_types.as_deref(),
    );
    if events {
        filter.coalesce_ms = q.coalesce_ms;
        filter.max_messages_per_s = q.max_messages_per_s;
        filter.max_deltas_per_s = q.max_deltas_per_s;
    }
    filter
        .prepare(limits)
        .map_err(|(m, at)| ApiError::bad_request(m).at(at))?;
    Ok(filter)
}

/// The filter a `subscribe` command gives: under `filter`, or its other fields.
pub(in crate::api) fn subscribe_spec(mut map: Map<String, Value>) -> Result<Value, ApiError> {
    match map.remove("filter") {
        Some(f) if map.is_empty() => Ok(f),
        Some(_) => Err(ApiError::bad_request(
            "give the filter either under `filter` or at the top level, not both",
        )),
        None => Ok(Value::Object(map)),
    }
}

pub(in crate::api) struct Session<S: Source> {
    pub(in crate::api) source: S,
    pub(in crate::api) ep: Endpoint,
    pub(in crate::api) principal: Principal,
    /// The client's address, for the audit log.
    pub(in crate::api) remote: Option<std::net::IpAddr>,
    /// What a tenant's principal sees, with what it was made from; `None` for an
    /// organism-wide principal, which sees everything.
    pub(super) tenant_view: Option<(S::Basis, Scope)>,
    pub(in crate::api) filter: Filter,
    pub(super) options: ApiOptions,
    pub(super) tx: mpsc::Sender<Out>,
    pub(super) queued: Arc<Queued>,
    /// The connection's id (`conn` of its `connected` frame and answers, and of the
    /// `origin` of events its commands cause).
    pub(in crate::api) conn: Arc<str>,
    /// The last event `seq` this session has looked at.
    pub(in crate::api) seen: u64,
    /// Messages a `thread_snapshot` held (`history.rs`): not sent again as they come, until
    /// the session has looked at every event up to `history_until`.
    pub(super) snapshot_ids: std::collections::HashSet<Arc<str>>,
    pub(super) history_until: u64,
    pub(super) dropped: Option<Dropped>,
    pub(super) folding: Folding,
    /// `/ws/messages`: frames held before they are queued (`held.rs`).
    pub(super) held: super::held::Held,
    /// Set when a control frame (an answer) found the client's queue full: the client sends
    /// commands but does not read, and is closed.
    pub(super) overflow: bool,
}

/// What ended a session's loop.
enum End {
    /// The writer ended (the client is gone or did not take its frames).
    Writer,
    Other,
}

/// Serves one client of `ep` from `source` until either side ends: its credential first
/// (from the upgrade, or its first frame), then what the source opens with, then events.
pub(in crate::api) async fn run<S: Source>(
    socket: WebSocket,
    source: S,
    ep: Endpoint,
    who: Who,
    filter: Filter,
    since: Option<u64>,
    options: ApiOptions,
) {
    let (mut sink, mut stream) = socket.split();
    let remote = who.remote;
    let principal = match who.principal {
        Some(p) => p,
        None => match first_frame_auth(source.auth(), &mut stream, remote).await {
            Ok(p) => p,
            Err(reason) => {
                let _ = tokio::time::timeout(
                    options.heartbeat,
                    sink.send(close(CLOSE_UNAUTHORIZED, Utf8Bytes::from(reason))),
                )
                .await;
                return;
            }
        },
    };
    let _slot = match source.stream_slot(&principal) {
        Ok(slot) => slot,
        Err(reason) => {
            tracing::info!(principal = ?principal.name, "{reason}");
            // A close frame's reason is at most 123 bytes (RFC 6455).
            let reason = Utf8Bytes::from(crate::clip::clip(reason, 123));
            let refused = sink.send(close(CLOSE_TOO_MANY_STREAMS, reason));
            let _ = tokio::time::timeout(options.heartbeat, refused).await;
            return;
        }
    };
    let (tx, rx) = mpsc::channel::<Out>(options.client_queue.max(1));
    let queued = Arc::new(Queued::default());
    let write_timeout = options.heartbeat * 2;
    let mut writer = tokio::spawn(write_frames(sink, rx, queued.clone(), write_timeout));
    let tenant_view = principal.tenant.is_some().then(|| {
        let basis = source.basis();
        let scope = source.scope(&principal, &basis);
        (basis, scope)
    });
    let mut session = Session {
        source,
        ep,
        principal,
        remote,
        tenant_view,
        filter,
        options,
        tx: tx.clone(),
        queued,
        conn: crate::threads::new_id(),
        seen: 0,
        snapshot_ids: Default::default(),
        history_until: 0,
        dropped: None,
        folding: Folding::default(),
        held: Default::default(),
        overflow: false,
    };
    let end = match S::open(&mut session, since).await {
        Some((sub, since)) => {
            session.seen = match (since, sub.resync_from) {
                (Some(s), None) => s,
                _ => sub.seq,
            };
            for ev in &sub.replay {
                session.offer(ev);
            }
            session.send_held();
            session.serve(stream, sub.live, &mut writer, tx).await
        }
        None => {
            // The queue ends with the session, and the writer with it.
            drop(tx);
            End::Other
        }
    };
    // A client closed for not reading gets a second to take its close frame; others
    // get the write timeout to take what is queued.
    let wait = if session.overflow {
        Duration::from_secs(1)
    } else {
        write_timeout
    };
    drop(session);
    if matches!(end, End::Other) && tokio::time::timeout(wait, &mut writer).await.is_err() {
        writer.abort();
    }
}

fn close(code: u16, reason: Utf8Bytes) -> Message {
    Message::Close(Some(CloseFrame { code, reason }))
}

/// How often what folding holds back goes out (a subscription may change it).
struct Flush {
    every: Option<Duration>,
    tick: tokio::time::Interval,
}

impl Flush {
    fn new(every: Option<Duration>) -> Flush {
        let mut tick = tokio::time::interval(every.unwrap_or(Duration::from_secs(3600)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Flush { every, tick }
    }
}

impl<S: Source> Session<S> {
    /// The loop: the client's frames, the credential, the dropped notice, folding's flush,
    /// the heartbeat and the events, until one ends it.
    async fn serve(
        &mut self,
        stream: SplitStream<WebSocket>,
        mut live: Receiver,
        writer: &mut JoinHandle<()>,
        reserve_tx: mpsc::Sender<Out>,
    ) -> End {
        // The client's frames are read by their own task: polling the socket from the loop
        // below would try a read (and prepare a read buffer) for every event offered.
        let (in_tx, mut incoming) = mpsc::channel::<Option<Message>>(16);
        let reader = tokio::spawn(read_frames(stream, in_tx));
        let closing = self.source.closing();
        // Made once: a fresh `cancelled()` per loop turn costs a notifier registration for
        // every event offered.
        let stopping = closing.cancelled();
        tokio::pin!(stopping);
        let mut heartbeat = tokio::time::interval(self.options.heartbeat);
        heartbeat.tick().await;
        let mut last_heard = Instant::now();
        // A session on a credential that can end (a key, an expiring token) looks at it
        // again every second, and at once when the API revokes a key.
        let auth = self.source.auth();
        let watched = auth.is_some() && self.principal.can_lapse();
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        let mut flush = Flush::new(self.flush_every());
        // When held frames go out (`/ws/messages`): set again when a new hold begins.
        let hold = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(hold);
        let mut armed = None;
        let end = loop {
            if self.held.until != armed {
                if let Some(t) = self.held.until {
                    hold.as_mut().reset(t);
                }
                armed = self.held.until;
            }
            if self.flush_every() != flush.every {
                // A new subscription: what the old one held back goes out first.
                self.flush_folded();
                flush = Flush::new(self.flush_every());
            }
            let revoked = async {
                match &auth {
                    Some(a) if watched => a.revoked.notified().await,
                    _ => std::future::pending().await,
                }
            };
            // Biased, with the event stream last: the client's commands, the dropped notice
            // and the heartbeat are never starved by a busy stream.
            let ended = tokio::select! {
                biased;
                _ = &mut stopping => {
                    self.finish(&mut live, &reserve_tx).await;
                    Some(End::Other)
                }
                _ = revoked, if watched => self.recheck().await,
                _ = recheck.tick(), if watched => self.recheck().await,
                frame = incoming.recv() => self.heard(frame, &mut last_heard).await,
                permit = reserve_tx.reserve(), if self.dropped.is_some() => {
                    if let (Ok(permit), Some(d)) = (permit, self.dropped.take()) {
                        self.send_reserved(permit, dropped_frame(d));
                    }
                    None
                }
                () = &mut hold, if self.held.until.is_some() => {
                    self.send_due();
                    armed = None;
                    None
                }
                _ = flush.tick.tick(), if flush.every.is_some() => {
                    self.flush_folded();
                    None
                }
                _ = heartbeat.tick() => self.beat(last_heard),
                _ = &mut *writer => Some(End::Writer),
                r = live.recv() => self.take(r, &mut live),
            };
            if let Some(end) = ended {
                break end;
            }
        };
        reader.abort();
        end
    }

    /// The server stops: the events the hub holds now are offered, what was dropped or
    /// folded is told, then the close goes, each waiting for room in the client's queue (up
    /// to [`FINISH`] in all). So a reader's messages received and announced add up when it
    /// is closed, as at any other moment.
    async fn finish(&mut self, live: &mut Receiver, room: &mpsc::Sender<Out>) {
        let deadline = tokio::time::Instant::now() + FINISH;
        // At most a ring's worth: an organism still running keeps publishing.
        for _ in 0..FINISH_EVENTS {
            match self.offer_next(live) {
                Ok(()) => {}
                Err(TryRecvError::Lagged(n)) => self.lost(n, live),
                Err(_) => break,
            }
        }
        self.send_held();
        let mut last = Vec::with_capacity(4);
        last.extend(self.dropped.take().map(dropped_frame));
        last.extend(self.folding.states_frame(self.seen));
        for kind in [Folded::Message, Folded::Delta] {
            last.extend(
                self.folding
                    .folded_frame(self.seen, kind)
                    .map(|(frame, _)| frame),
            );
        }
        last.push(close(close_code::AWAY, Utf8Bytes::from_static(S::STOPPING)));
        for frame in last {
            let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, room.reserve()).await else {
                return;
            };
            self.send_reserved(permit, frame);
        }
    }

    /// Sends `frame` in the room `permit` holds in the client's queue, counting its bytes.
    fn send_reserved(&self, permit: mpsc::Permit<'_, Out>, frame: Message) {
        let out = Out::from(frame);
        self.queued.add(&out);
        permit.send(out);
    }

    /// A frame from the client (`None`: it is gone).
    async fn heard(
        &mut self,
        frame: Option<Option<Message>>,
        last_heard: &mut Instant,
    ) -> Option<End> {
        match frame {
            Some(Some(frame @ (Message::Text(_) | Message::Binary(_)))) => {
                *last_heard = Instant::now();
                match frame {
                    Message::Text(t) => self.command(t.as_str()).await,
                    _ => {
                        let refused = ApiError::bad_request(
                            "a command is a JSON object in a text frame: a binary frame is not read",
                        );
                        self.answer(Value::Null, String::new(), Err(refused));
                    }
                }
                if self.overflow {
                    tracing::info!(endpoint = self.ep.path(), "closing a WebSocket client that sends commands but does not read their answers");
                    let reason = "not reading: answers over the client queue";
                    let _ = self
                        .tx
                        .try_send(close(close_code::POLICY, Utf8Bytes::from_static(reason)).into());
                    return Some(End::Other);
                }
                None
            }
            // The reader's close for a protocol error: sent, then the session ends.
            Some(Some(Message::Close(Some(frame)))) if frame.code >= 1002 => {
                let _ = self.tx.try_send(Message::Close(Some(frame)).into());
                Some(End::Other)
            }
            Some(Some(Message::Close(_))) | Some(None) | None => Some(End::Other),
            Some(Some(_)) => {
                *last_heard = Instant::now();
                None
            }
        }
    }

    /// The heartbeat: a ping, or the end of a client silent for two heartbeats.
    fn beat(&self, last_heard: Instant) -> Option<End> {
        if last_heard.elapsed() > self.options.heartbeat * 2 {
            tracing::info!(
                endpoint = self.ep.path(),
                "closing a WebSocket client that stopped answering"
            );
            return Some(End::Other);
        }
        let _ = self.tx.try_send(Message::Ping(Default::default()).into());
        None
    }

    /// An event from the hub, and what else is already published.
    fn take(&mut self, r: Result<Arc<Event>, RecvError>, live: &mut Receiver) -> Option<End> {
        match r {
            Ok(ev) => self.offer(&ev),
            Err(RecvError::Lagged(n)) => self.lost(n, live),
            Err(RecvError::Closed) => return Some(End::Other),
        }
        for _ in 0..OFFER_BATCH {
            // Lent, not cloned: 50 sessions taking a reference to each event on two cores
            // contend for its count.
            match self.offer_next(live) {
                Ok(()) => {}
                Err(TryRecvError::Lagged(n)) => self.lost(n, live),
                Err(_) => break,
            }
        }
        None
    }

    /// Looks at the credential again; ends a session whose credential no longer holds.
    async fn recheck(&mut self) -> Option<End> {
        if self.still_valid().await {
            return None;
        }
        tracing::info!(
            endpoint = self.ep.path(),
            principal = ?self.principal.name,
            "closing a WebSocket session: its credential was revoked or expired"
        );
        let reason = Utf8Bytes::from_static("credential revoked or expired");
        let _ = self.tx.try_send(close(CLOSE_UNAUTHORIZED, reason).into());
        Some(End::Other)
    }

    /// Whether the session's credential still holds (looked up off the async workers).
    async fn still_valid(&self) -> bool {
        match self.source.auth() {
            Some(auth) => auth.still_holds(&self.principal).await,
            None => true,
        }
    }

    /// What the session's principal sees now.
    pub(in crate::api) fn scope(&mut self) -> Scope {
        let Some((basis, scope)) = &mut self.tenant_view else {
            return Scope::default();
        };
        let now = self.source.basis();
        if !S::same(basis, &now) {
            *scope = self.source.scope(&self.principal, &now);
            *basis = now;
        }
        scope.clone()
    }

    /// Whether a tenant's session sees `ev` (every event, for an organism-wide one).
    pub(super) fn sees(&mut self, ev: &Event) -> bool {
        if self.tenant_view.is_none() {
            return true;
        }
        let scope = self.scope();
        let tenant = self.principal.tenant.as_deref();
        crate::api::auth::sees_event(&scope, tenant, ev, |id| self.source.sees_thread(&scope, id))
    }

    /// Answers one command frame with `ack` or `error`, carrying its `request_id`.
    async fn command(&mut self, raw: &str) {
        let mut request_id = Value::Null;
        let mut cmd = String::new();
        let reply = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(mut map)) => {
                request_id = map.remove("request_id").unwrap_or(Value::Null);
                match (map.remove("cmd"), self.cause(&request_id)) {
                    (_, Err(e)) => Err(e),
                    (Some(Value::String(c)), Ok(cause)) => {
                        cmd = c;
                        Cause::scope(cause, S::execute(self, &cmd, map)).await
                    }
                    _ => Err(ApiError::bad_request("a command needs a `cmd` string").at("cmd")),
                }
            }
            Ok(_) => Err(ApiError::bad_request(
                "a command is a JSON object with a `cmd` field",
            )),
            Err(e) => Err(ApiError::bad_request(format!(
                "a command is a JSON object with a `cmd` field, and this is not JSON: {e}"
            ))
            .at(format!("line {}, column {}", e.line(), e.column()))),
        };
        self.answer(request_id, cmd, reply);
    }

    /// Answers a command (`cmd`, carrying `request_id`) with `ack` and the fields of `reply`,
    /// or `error`.
    fn answer(
        &mut self,
        request_id: Value,
        cmd: String,
        reply: Result<Map<String, Value>, ApiError>,
    ) {
        // Not the hub's latest: an answer never carries a `seq` ahead of the events this
        // connection has been offered, so a client resuming from the highest `seq` it saw
        // loses nothing.
        let mut frame = json!({
            "event": "ack",
            "seq": self.seen,
            "timestamp": Timestamp::now(),
            "request_id": request_id,
            "cmd": cmd,
            "conn": self.conn,
        });
        let extra = match reply {
            Ok(fields) => fields,
            Err(e) => {
                frame["event"] = json!("error");
                let mut fields = Map::new();
                fields.insert("status".into(), json!(e.status.as_u16()));
                fields.insert("code".into(), json!(e.body.code));
                fields.insert("error".into(), json!(e.body.message));
                fields.insert("details".into(), json!(e.body.details));
                fields.insert("where".into(), json!(e.body.location));
                fields
            }
        };
        if let Some(obj) = frame.as_object_mut() {
            obj.extend(extra);
        }
        self.control(frame);
    }

    /// The cause of what a command with `request_id` makes: none without one; a string
    /// (printable ASCII, at most `MAX_REQUEST_ID` bytes) or a number, else refused.
    fn cause(&self, request_id: &Value) -> Result<Option<Arc<Cause>>, ApiError> {
        let ok = match request_id {
            Value::Null => return Ok(None),
            Value::Number(_) => true,
            Value::String(s) => crate::events::valid_request_id(s),
            _ => false,
        };
        if !ok {
            return Err(ApiError::bad_request(format!(
                "`request_id` is a number or 1 to {} printable ASCII characters without spaces",
                crate::events::MAX_REQUEST_ID
            ))
            .at("request_id"));
        }
        Ok(Some(Arc::new(Cause {
            request_id: request_id.clone(),
            conn: Some(self.conn.clone()),
        })))
    }

    /// `subscribe`: the session's filter becomes `spec`; the ack's fields.
    pub(in crate::api) fn subscribe(
        &mut self,
        spec: Value,
    ) -> Result<Map<String, Value>, ApiError> {
        let mut filter: Filter = serde_json::from_value(spec)
            .map_err(|e| ApiError::bad_request(format!("bad filter: {e}")).at("filter"))?;
        filter
            .prepare(&self.source.limits())
            .map_err(|(m, at)| ApiError::bad_request(m).at(at))?;
        self.filter = filter;
        let mut out = Map::new();
        out.insert("filter".into(), json!(self.filter));
        Ok(out)
    }
}
