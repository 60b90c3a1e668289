//! `agentserver gateway`: the event and message streams (`/ws`, `/ws/messages`) served from
//! an organism's mirrored events (`nats::mirror`), so any number of gateways on any number
//! of machines serve observers without touching the pump. Read-only: every command gets an
//! error frame. Sessions start with the pump's mirrored snapshot and fold as the pump's do
//! (`ws::Folding`).
//!
//! One ordered consumer per gateway feeds a local [`EventHub`] with the pump's own `seq`s
//! and the frames the pump rendered, so every client of this gateway shares one copy of each
//! event, and `?since=` resumes exactly as at the pump within what the gateway retains
//! (`--retain`, loaded from the stream at start); before that, `resync_required` names the
//! oldest `seq` it holds. Filters are the pump's (`api::filter`). A client that does not
//! keep up lags behind the hub and is told what it lost (`dropped`), as at the pump.
//!
//! With the organism's file (`--auth-from`), a gateway checks credentials as the pump does
//! (`Authorization: Bearer …` on the upgrade: keys from the file's store or `keys_file`,
//! JWTs), shows a tenant's credential only its tenant's messages, and closes a session
//! whose credential is revoked or expires (4401). Without it, it serves every message to
//! every client, so it refuses to listen beyond loopback unless told `--insecure-no-auth`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::auth::{Authenticator, Principal, Scope};
use super::error::ApiError;
use super::filter::Filter;
use super::ws::{
    dropped_frame, first_frame_auth, resync_frame, text, Dropped, Folding, WsQuery,
    CLOSE_UNAUTHORIZED,
};
use crate::config::{Limits, NatsConfig, OrganismConfig};
use crate::events::{Event, EventHub, RecvError};
use crate::nats::mirror::{follow_snapshots, read, ReadFrom, Snapshot};
use crate::nats::Link;
use crate::time::Timestamp;

mod view;
use view::{connected, sees};

/// Events a gateway holds for `?since=` and for clients that fall behind, by default.
pub const DEFAULT_RETAIN: usize = 65_536;

/// The most the retained events may weigh ([`crate::events::Event::weight`]); past it the
/// oldest go first, as at the pump.
pub const RETAINED_BYTES: usize = 256 << 20;

/// How long a session waits for the events up to its snapshot to arrive.
const SNAPSHOT_CATCH_UP: Duration = Duration::from_secs(2);

/// The largest frame a client may send (every command is refused anyway).
const MAX_COMMAND_BYTES: usize = 64 << 10;

/// A frame not taken by its client in this long closes the client.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a client is pinged; one silent for two of these is closed.
const HEARTBEAT: Duration = Duration::from_secs(20);

/// Who may connect: the organism's authenticator and the config its tenants' scopes come
/// from.
struct Access {
    auth: Arc<Authenticator>,
    config: OrganismConfig,
}

#[derive(Clone)]
struct Gate {
    access: Option<Arc<Access>>,
    hub: watch::Receiver<Option<Fed>>,
    /// The organism's latest mirrored snapshot, for `connected`.
    snapshot: watch::Receiver<Option<Arc<Snapshot>>>,
    limits: Limits,
    listen: String,
    closing: CancellationToken,
}

/// The local hub, once the first event is read, and the `seq` before that event.
type Fed = (Arc<EventHub>, u64);

/// A running gateway.
pub struct Gateway {
    addr: SocketAddr,
    closing: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    /// Connects to NATS (in the background), starts reading the events stream and serves
    /// on `listen`, checking credentials as `auth_from`'s organism does. Without
    /// `auth_from` (or with no `auth.methods` in it), refuses an address beyond loopback
    /// unless `insecure`.
    pub async fn bind(
        nats: NatsConfig,
        listen: &str,
        retain: usize,
        auth_from: Option<OrganismConfig>,
        insecure: bool,
    ) -> Result<Gateway, String> {
        let access = match auth_from {
            None => None,
            Some(config) => Authenticator::new(&config)
                .map_err(|e| format!("auth: {e}"))?
                .map(|auth| {
                    Arc::new(Access {
                        auth: Arc::new(auth),
                        config,
                    })
                }),
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        if !addr.ip().is_loopback() && !insecure && access.is_none() {
            return Err(format!(
                "{addr} is beyond this machine, and a gateway serves every message to anyone \
                 who connects: give it the organism's file with auth.methods (--auth-from), \
                 listen on 127.0.0.1 behind your own access control, or pass \
                 --insecure-no-auth"
            ));
        }
        // A mistyped organism would serve nothing: refused when the server holds other
        // organisms' streams but not this one's; with none at all, the organism has not run
        // yet and the gateway waits for its stream.
        let (present, others) = crate::nats::events_streams(&nats).await?;
        if !present && !others.is_empty() {
            return Err(crate::nats::missing_stream(&nats, &others));
        }
        if !present {
            tracing::info!(
                stream = %crate::nats::Names::new(&nats.stream_prefix).events_stream(),
                "no organism has mirrored its events to this NATS yet; serving them when it does"
            );
        }
        let link = Link::connect(&nats, "agentserver gateway").await?;
        let closing = CancellationToken::new();
        let (tx, rx) = watch::channel(None);
        let (snapshot_tx, snapshot_rx) = watch::channel(None);
        tokio::spawn(feed_snapshots(link.clone(), snapshot_tx, closing.clone()));
        tokio::spawn(feed(link, retain.max(1), tx, closing.clone()));
        let limits = Limits::default();
        let gate = Gate {
            access,
            hub: rx,
            snapshot: snapshot_rx,
            limits,
            listen: addr.to_string(),
            closing: closing.clone(),
        };
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/ws/messages", get(ws_messages))
            .route("/ws", get(ws_events))
            .fallback(|| async {
                ApiError::not_found(
                    "no_route",
                    "a gateway serves /ws, /ws/messages and /healthz",
                )
            })
            .layer(axum::middleware::from_fn_with_state(gate.clone(), browser))
            .with_state(gate);
        let task = tokio::spawn(super::conn::serve(
            listener,
            app,
            super::conn::ConnLimits::of(&limits),
            closing.clone(),
            None,
        ));
        Ok(Gateway {
            addr,
            closing,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every client and stops reading.
    pub async fn shutdown(self) {
        self.closing.cancel();
        let _ = self.task.await;
    }
}

/// Reads the stream into the hub (made at the first event, numbered from it), for as long
/// as the gateway runs.
async fn feed(
    link: Link,
    retain: usize,
    tx: watch::Sender<Option<Fed>>,
    closing: CancellationToken,
) {
    let mut hub: Option<Arc<EventHub>> = None;
    loop {
        let from = match &hub {
            None => ReadFrom::Last(retain as u64),
            Some(h) => ReadFrom::After(h.last_seq()),
        };
        let read = read(&link, from, false, closing.clone(), |ev| {
            let h = hub.get_or_insert_with(|| {
                let before = ev.seq.saturating_sub(1);
                let h = Arc::new(EventHub::with_sink(retain, before, None));
                h.set_byte_budget(RETAINED_BYTES);
                let _ = tx.send(Some((h.clone(), before)));
                h
            });
            let message_frame: Option<Utf8Bytes> = ev
                .message_frame()
                .map(|raw| Utf8Bytes::from(raw.get().to_string()));
            let frame: Option<Utf8Bytes> = ev
                .frame
                .as_deref()
                .map(|raw| Utf8Bytes::from(raw.get().to_string()));
            h.publish_numbered(Event::numbered(
                ev.seq,
                ev.timestamp,
                ev.kind,
                frame,
                message_frame,
            ));
        })
        .await;
        if closing.is_cancelled() {
            return;
        }
        if let Err(e) = read {
            tracing::warn!(error = %e, "reading the events stream; trying again");
        }
        if !crate::nats::retry_after(&closing).await {
            return;
        }
    }
}

/// Keeps the latest snapshot, for as long as the gateway runs.
async fn feed_snapshots(
    link: Link,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    closing: CancellationToken,
) {
    loop {
        let followed = follow_snapshots(&link, closing.clone(), |s| {
            let _ = tx.send(Some(Arc::new(s)));
        })
        .await;
        if let Err(e) = followed {
            tracing::warn!(error = %e, "reading the snapshot stream; trying again");
        }
        if !crate::nats::retry_after(&closing).await {
            return;
        }
    }
}

async fn browser(
    State(gate): State<Gate>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (hosts, origins) = match &gate.access {
        Some(a) => (&a.config.allowed_hosts[..], &a.config.allowed_origins[..]),
        None => (&[][..], &[][..]),
    };
    let allowed = super::browser::Allowed {
        listen: &gate.listen,
        hosts,
        origins,
    };
    if let Err(e) = super::browser::check(&allowed, request.method(), request.headers()) {
        return e.into_response();
    }
    next.run(request).await
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Which stream a session serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Events,
    Messages,
}

/// A request's parts a session needs: its headers and the client's address.
struct Caller {
    headers: axum::http::HeaderMap,
    from: std::net::IpAddr,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let from = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
        Ok(Caller {
            headers: parts.headers.clone(),
            from,
        })
    }
}

async fn ws_events(
    ws: WebSocketUpgrade,
    State(gate): State<Gate>,
    caller: Caller,
    Query(q): Query<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, gate, caller, q, Stream::Events)
}

async fn ws_messages(
    ws: WebSocketUpgrade,
    State(gate): State<Gate>,
    caller: Caller,
    Query(q): Query<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, gate, caller, q, Stream::Messages)
}

/// Who a session is for: no one to check (no `--auth-from`), a principal from the upgrade's
/// header, or one to come in the first frame (a browser cannot set the header).
enum Credential {
    Unchecked,
    Known(Principal, Scope),
    FirstFrame,
}

fn upgrade(
    ws: WebSocketUpgrade,
    gate: Gate,
    caller: Caller,
    q: WsQuery,
    stream: Stream,
) -> Result<Response, ApiError> {
    let who = match &gate.access {
        None => Credential::Unchecked,
        Some(a) => match crate::api::auth::authenticate(&a.auth, &caller.headers) {
            Ok(principal) => {
                let scope = gate.scope(&principal);
                Credential::Known(principal, scope)
            }
            Err(super::auth::Refused::Missing) => Credential::FirstFrame,
            Err(refused) => {
                if let super::auth::Refused::Invalid(why) = &refused {
                    tracing::info!(from = %caller.from, "gateway refused a credential: {why}");
                }
                if a.auth.limits.failed_auth(caller.from).is_err() {
                    return Err(ApiError::new(
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        "too_many_failures",
                        "too many failed authentications from this address",
                    ));
                }
                return Err(super::auth::unauthorized(&refused));
            }
        },
    };
    let from = caller.from;
    let mut filter = Filter::from_query(
        q.threads.as_deref(),
        q.agents.as_deref(),
        q.events.as_deref().filter(|_| stream == Stream::Events),
        q.payload_types.as_deref(),
    );
    if stream == Stream::Events {
        filter.coalesce_ms = q.coalesce_ms;
        filter.max_messages_per_s = q.max_messages_per_s;
    }
    filter
        .prepare(&gate.limits)
        .map_err(|(m, at)| ApiError::bad_request(m).at(at))?;
    Ok(ws
        .max_message_size(MAX_COMMAND_BYTES)
        .max_frame_size(MAX_COMMAND_BYTES)
        .on_upgrade(move |socket| session(socket, gate, stream, who, from, filter, q.since)))
}

type Sink = futures_util::stream::SplitSink<WebSocket, Message>;

/// The answer to any command: a gateway changes nothing.
fn read_only(command: &str, seq: u64) -> Message {
    let parsed: Option<serde_json::Value> = serde_json::from_str(command).ok();
    let field = |name: &str| parsed.as_ref().and_then(|v| v.get(name)).cloned();
    text(&json!({
        "event": "error",
        "seq": seq,
        "timestamp": Timestamp::now(),
        "request_id": field("request_id"),
        "cmd": field("cmd"),
        "status": 405,
        "code": "read_only",
        "error": "a gateway is read-only: send commands to the organism's own API",
    }))
}

/// Sends one frame; false if the client did not take it within [`SEND_TIMEOUT`].
async fn send(sink: &mut Sink, msg: Message) -> bool {
    matches!(
        tokio::time::timeout(SEND_TIMEOUT, sink.send(msg)).await,
        Ok(Ok(()))
    )
}

async fn session(
    socket: WebSocket,
    gate: Gate,
    stream: Stream,
    who: Credential,
    from: std::net::IpAddr,
    filter: Filter,
    since: Option<u64>,
) {
    let (mut sink, mut incoming) = socket.split();
    let mut who: Option<(Principal, Scope)> = match (who, &gate.access) {
        (Credential::Known(p, s), _) => Some((p, s)),
        (Credential::FirstFrame, Some(a)) => {
            match first_frame_auth(Some(a.auth.clone()), &mut incoming, Some(from)).await {
                Ok(p) => {
                    let scope = gate.scope(&p);
                    Some((p, scope))
                }
                Err(reason) => {
                    let _ = send(
                        &mut sink,
                        Message::Close(Some(CloseFrame {
                            code: CLOSE_UNAUTHORIZED,
                            reason: Utf8Bytes::from(reason),
                        })),
                    )
                    .await;
                    return;
                }
            }
        }
        _ => None,
    };
    let came_first = gate.hub.borrow().is_none();
    let fed = tokio::select! {
        _ = gate.closing.cancelled() => return,
        h = crate::nats::first_some(&gate.hub, None) => h,
    };
    let Some((hub, before)) = fed else { return };
    // A client that came before the first event gets everything from it on; others
    // without `since`, the latest snapshot first and the events after it.
    let latest = gate.snapshot.borrow().clone();
    let snapshot = match latest {
        Some(s) => Some(s),
        // Events, but no snapshot yet: the pump's first is on its way (a little).
        None if since.is_none() && !came_first => {
            let deadline = tokio::time::Instant::now() + SNAPSHOT_CATCH_UP;
            crate::nats::first_some(&gate.snapshot, Some(deadline)).await
        }
        None => None,
    };
    let since = match (since, snapshot) {
        (Some(s), _) => Some(s),
        (None, _) if came_first => Some(before),
        (None, Some(snap)) => {
            // The snapshot may be ahead of the events read so far: wait (a little) for them.
            let mut rx = hub.subscribe();
            let deadline = tokio::time::Instant::now() + SNAPSHOT_CATCH_UP;
            while hub.last_seq() < snap.seq {
                if tokio::time::timeout_at(deadline, rx.recv()).await.is_err() {
                    break;
                }
            }
            if !send(&mut sink, connected(&snap, stream, who.as_ref(), &filter)).await {
                return;
            }
            Some(snap.seq.min(hub.last_seq()))
        }
        (None, None) => None,
    };
    let mut sub = hub.subscribe_since(since);
    if let Some(oldest) = sub.resync_from {
        if !send(&mut sink, text(&resync_frame(sub.seq, since, oldest))).await {
            return;
        }
        // As at the pump: a fresh snapshot, then what follows it.
        let latest = gate.snapshot.borrow().clone();
        if let Some(snap) = latest.filter(|s| s.seq + 1 >= oldest) {
            if !send(&mut sink, connected(&snap, stream, who.as_ref(), &filter)).await {
                return;
            }
            sub = hub.subscribe_since(Some(snap.seq.min(hub.last_seq())));
        }
    }
    // `/ws` folding, as at the pump: agents' states coalesced, message events past a rate
    // counted instead of sent.
    let mut folding = Folding::default();
    let frame_of = |ev: &Event, folding: &mut Folding, who: &Option<(Principal, Scope)>| {
        if who.as_ref().is_some_and(|(_, s)| !sees(s, ev)) {
            return None;
        }
        if stream == Stream::Events && filter.passes(ev) && folding.hold(&filter, ev) {
            return None;
        }
        match stream {
            Stream::Messages if filter.passes_message(ev) => {
                let frame = ev.message_frame::<Option<Utf8Bytes>>(|_| None)?;
                frame.clone().map(Message::Text)
            }
            // An event mirrored without its frame has an empty one here: not sent.
            Stream::Events if filter.passes(ev) => ev
                .frame::<Utf8Bytes>(|_| Utf8Bytes::from_static(""))
                .filter(|f| !f.is_empty())
                .map(|f| Message::Text(f.clone())),
            _ => None,
        }
    };
    for ev in &sub.replay {
        if let Some(m) = frame_of(ev, &mut folding, &who) {
            if !send(&mut sink, m).await {
                return;
            }
        }
    }
    let mut live = sub.live;
    let mut snapshots = gate.snapshot.clone();
    snapshots.mark_unchanged();
    let mut seen = sub.replay.last().map_or(sub.seq, |e| e.seq);
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.tick().await;
    // A credential that can end (a key, an expiring token) is looked at again every second.
    let watched = who
        .as_ref()
        .is_some_and(|(p, _)| p.key_id.is_some() || p.expires.is_some());
    let mut recheck = tokio::time::interval(Duration::from_secs(1));
    let flush_every = Folding::every(&filter);
    let mut flush = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = tokio::time::Instant::now();
    loop {
        let out = tokio::select! {
            _ = flush.tick(), if flush_every.is_some() => {
                // What folding held back goes out, at the last seq offered.
                if let Some(m) = folding.states_frame(seen) {
                    if !send(&mut sink, m).await {
                        return;
                    }
                }
                folding.folded_frame(seen).map(|(m, _)| m)
            }
            _ = gate.closing.cancelled() => {
                let _ = send(&mut sink, Message::Close(Some(CloseFrame {
                    code: axum::extract::ws::close_code::AWAY,
                    reason: Utf8Bytes::from_static("gateway stopping"),
                }))).await;
                return;
            }
            m = incoming.next() => match m {
                Some(Err(e)) => {
                    if let Some(frame) = super::ws::protocol_close(e) {
                        let _ = send(&mut sink, Message::Close(Some(frame))).await;
                    }
                    return;
                }
                Some(Ok(Message::Close(_))) | None => return,
                Some(Ok(Message::Text(t))) => {
                    last_heard = tokio::time::Instant::now();
                    Some(read_only(t.as_str(), seen))
                }
                Some(Ok(_)) => { last_heard = tokio::time::Instant::now(); continue }
            },
            _ = recheck.tick(), if watched => {
                let valid = match (&gate.access, &who) {
                    (Some(a), Some((p, _))) => {
                        let (auth, p) = (a.auth.clone(), p.clone());
                        // A key's lookup reads the store: off the async workers.
                        tokio::task::spawn_blocking(move || auth.still_valid(&p))
                            .await
                            .unwrap_or(false)
                    }
                    _ => true,
                };
                if valid {
                    continue;
                }
                let _ = send(&mut sink, Message::Close(Some(CloseFrame {
                    code: CLOSE_UNAUTHORIZED,
                    reason: Utf8Bytes::from_static("credential revoked or expired"),
                }))).await;
                return;
            }
            _ = heartbeat.tick() => {
                if last_heard.elapsed() > HEARTBEAT * 2 {
                    return;
                }
                Some(Message::Ping(Default::default()))
            }
            r = live.recv() => match r {
                Ok(ev) => {
                    seen = ev.seq;
                    // A reload or an agent change moves the tenants' scopes: the newest
                    // snapshot says how.
                    if snapshots.has_changed().unwrap_or(false) {
                        snapshots.mark_unchanged();
                        if let Some((p, scope)) = who.as_mut() {
                            *scope = gate.scope(p);
                        }
                    }
                    frame_of(&ev, &mut folding, &who)
                }
                Err(RecvError::Lagged(n)) => {
                    let (from, to) = (seen + 1, seen + n);
                    seen = to;
                    Some(dropped_frame(Dropped::add(None, n, from, to)))
                }
                Err(RecvError::Closed) => return,
            },
        };
        if let Some(m) = out {
            if !send(&mut sink, m).await {
                return;
            }
        }
    }
}
