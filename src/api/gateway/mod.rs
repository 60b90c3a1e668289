//! `agentserver gateway`: the event and message streams (`/ws`, `/ws/messages`) served from
//! an organism's mirrored events (`nats::mirror`), so any number of gateways on any number
//! of machines serve observers without touching the pump. Its sessions are the pump's
//! (`ws::session`, with this mirror as their `Source`): they start with the pump's mirrored
//! snapshot, filter, fold and report what a client missed as the pump's do. Read-only:
//! `subscribe` changes a session's filter, every other command gets a `read_only` error.
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

use axum::extract::ws::{Utf8Bytes, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::auth::{Authenticator, Principal, Scope};
use super::error::{ApiError, Params};
use super::streams::{StreamSlot, Streams};
use super::ws::session::{self, query_filter, subscribe_spec, Session, Source};
use super::ws::{resync_frame, Who, WsQuery};
use super::{ApiOptions, Endpoint};
use crate::config::{Limits, NatsConfig, OrganismConfig};
use crate::events::{Event, EventHub, Subscription};
use crate::nats::mirror::{follow_snapshots, read, ReadFrom, Snapshot};
use crate::nats::Link;

mod labels;
mod view;
use view::connected;

/// The labels of the threads the gateway has heard of (`labels.rs`), shared by the feed
/// and the sessions.
type Labelled = Arc<std::sync::Mutex<labels::ThreadLabels>>;

/// Events a gateway holds for `?since=` and for clients that fall behind, by default.
pub const DEFAULT_RETAIN: usize = 65_536;

/// The most the retained events may weigh ([`crate::events::Event::weight`]); past it the
/// oldest go first, as at the pump.
pub const RETAINED_BYTES: usize = 256 << 20;

/// How long a session waits for the events up to its snapshot to arrive.
const SNAPSHOT_CATCH_UP: Duration = Duration::from_secs(2);

/// The largest frame a client may send (every command is refused anyway).
const MAX_COMMAND_BYTES: usize = 64 << 10;

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
    labels: Labelled,
    /// Each tenant's sessions open here (`tenants.<t>.max_streams` of `auth_from`).
    streams: Arc<Streams>,
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
        let labels = Labelled::default();
        tokio::spawn(feed_snapshots(
            link.clone(),
            snapshot_tx,
            labels.clone(),
            closing.clone(),
        ));
        tokio::spawn(feed(
            link,
            retain.max(1),
            tx,
            labels.clone(),
            closing.clone(),
        ));
        let limits = Limits::default();
        let gate = Gate {
            access,
            hub: rx,
            snapshot: snapshot_rx,
            limits,
            listen: addr.to_string(),
            closing: closing.clone(),
            labels,
            streams: Default::default(),
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
    labels: Labelled,
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
            // Events the pump left out on purpose (deltas) after the last one here: their
            // `seq`s are held by placeholders no client sees, so no reader is told of a gap
            // (at most a ring's worth; a longer run is a gap, as the ring coming round).
            if let Some(after) = ev.after.filter(|a| *a == h.last_seq()) {
                let from = (after + 1).max(ev.seq.saturating_sub(retain as u64));
                for seq in from..ev.seq {
                    h.publish_numbered(Event::numbered(
                        seq,
                        ev.timestamp,
                        crate::events::EventKind::Omitted,
                        None::<Utf8Bytes>,
                        None::<Utf8Bytes>,
                    ));
                }
            }
            // A thread's labels as this event leaves them, before a session tests it.
            crate::sync::lock(&labels).note(&ev.kind);
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

/// Keeps the latest snapshot, for as long as the gateway runs. The first one gives the
/// labels of the threads it lists that the events read so far did not name.
async fn feed_snapshots(
    link: Link,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    labels: Labelled,
    closing: CancellationToken,
) {
    let mut first = true;
    loop {
        let followed = follow_snapshots(&link, closing.clone(), |s| {
            if std::mem::take(&mut first) {
                let mut known = crate::sync::lock(&labels);
                for t in &s.threads {
                    if t["id"].as_str().is_some_and(|id| known.get(id).is_none()) {
                        known.note_view(t);
                    }
                }
            }
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
    Params(q): Params<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, gate, caller, q, Endpoint::Events)
}

async fn ws_messages(
    ws: WebSocketUpgrade,
    State(gate): State<Gate>,
    caller: Caller,
    Params(q): Params<WsQuery>,
) -> Result<Response, ApiError> {
    upgrade(ws, gate, caller, q, Endpoint::Messages)
}

/// Who a session is for: no one to check (no `--auth-from`: the implicit principal), a
/// principal from the upgrade's header, or one to come in the first frame (a browser cannot
/// set the header).
fn upgrade(
    ws: WebSocketUpgrade,
    gate: Gate,
    caller: Caller,
    q: WsQuery,
    ep: Endpoint,
) -> Result<Response, ApiError> {
    let principal = match &gate.access {
        None => None,
        Some(a) => match crate::api::auth::authenticate(&a.auth, &caller.headers) {
            Ok(principal) => Some(principal),
            Err(super::auth::Refused::Missing) => None,
            Err(refused) => {
                if let super::auth::Refused::Invalid(why) = &refused {
                    tracing::info!(from = %caller.from, "gateway refused a credential: {why}");
                }
                // The pump's answer: 429 `rate_limited` with `Retry-After`.
                if let Err(limited) = a.auth.limits.failed_auth(caller.from) {
                    return Err(ApiError::from(limited));
                }
                return Err(super::auth::unauthorized(&refused));
            }
        },
    };
    let who = Who {
        principal,
        remote: Some(caller.from),
    };
    let filter = query_filter(&q, ep, &gate.limits)?;
    let options = ApiOptions {
        heartbeat: HEARTBEAT,
        ..ApiOptions::default()
    };
    Ok(ws
        .max_message_size(MAX_COMMAND_BYTES)
        .max_frame_size(MAX_COMMAND_BYTES)
        .on_upgrade(move |socket| session::run(socket, gate, ep, who, filter, q.since, options)))
}

/// The mirrored events and snapshots, as a session's [`Source`]: read-only.
impl Source for Gate {
    type Basis = Option<Arc<Snapshot>>;
    const STOPPING: &'static str = "gateway stopping";

    fn basis(&self) -> Self::Basis {
        self.snapshot.borrow().clone()
    }

    fn same(a: &Self::Basis, b: &Self::Basis) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    fn scope(&self, p: &Principal, basis: &Self::Basis) -> Scope {
        self.scope_in(p, basis.as_deref())
    }

    /// A gateway keeps no threads: a tenant sees what names its listeners.
    fn sees_thread(&self, _: &Scope, _: &str) -> bool {
        false
    }

    fn frame<'e>(&self, ep: Endpoint, ev: &'e Event) -> Option<&'e Utf8Bytes> {
        match ep {
            Endpoint::Messages => ev
                .message_frame::<Option<Utf8Bytes>>(|_| None)
                .and_then(Option::as_ref),
            // An event mirrored without its frame has an empty one here: not sent.
            Endpoint::Events => ev
                .frame::<Utf8Bytes>(|_| Utf8Bytes::from_static(""))
                .filter(|f| !f.is_empty()),
        }
    }

    fn event(&self, seq: u64) -> Option<Arc<Event>> {
        let fed = self.hub.borrow();
        fed.as_ref().and_then(|(hub, _)| hub.event(seq))
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn thread_labels(&self, thread: &str) -> Option<Arc<crate::threads::Labels>> {
        crate::sync::lock(&self.labels).get(thread)
    }

    fn auth(&self) -> Option<Arc<Authenticator>> {
        self.access.as_ref().map(|a| a.auth.clone())
    }

    fn closing(&self) -> CancellationToken {
        self.closing.clone()
    }

    fn stream_slot(&self, p: &Principal) -> Result<Option<StreamSlot>, String> {
        match &self.access {
            Some(a) => self.streams.take(&a.config, p.tenant.as_deref()),
            None => Ok(None),
        }
    }

    async fn open(
        s: &mut Session<Self>,
        since: Option<u64>,
    ) -> Option<(Subscription, Option<u64>)> {
        open(s, since).await
    }

    /// `subscribe` changes what the session shows; anything else changes the organism,
    /// which a gateway does not.
    async fn execute(
        s: &mut Session<Self>,
        cmd: &str,
        map: Map<String, Value>,
    ) -> Result<Map<String, Value>, ApiError> {
        if cmd == "subscribe" {
            return s.subscribe(subscribe_spec(map)?);
        }
        Err(ApiError::new(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            "read_only",
            "a gateway is read-only: send commands to the organism's own API",
        ))
    }
}

/// A session's start: a client that came before the first event gets everything from it
/// on; others without `since`, the latest snapshot first and the events after it; one
/// whose `since` is no longer held, `resync_required` and a fresh snapshot, as at the pump.
async fn open(s: &mut Session<Gate>, since: Option<u64>) -> Option<(Subscription, Option<u64>)> {
    let gate = s.source.clone();
    let came_first = gate.hub.borrow().is_none();
    let fed = tokio::select! {
        _ = gate.closing.cancelled() => return None,
        h = crate::nats::first_some(&gate.hub, None) => h,
    };
    let (hub, before) = fed?;
    let latest = gate.snapshot.borrow().clone();
    let snapshot = match latest.clone() {
        Some(s) => Some(s),
        // Events, but no snapshot yet: the pump's first is on its way (a little).
        None if since.is_none() && !came_first => {
            let deadline = tokio::time::Instant::now() + SNAPSHOT_CATCH_UP;
            crate::nats::first_some(&gate.snapshot, Some(deadline)).await
        }
        None => None,
    };
    let mut since = match (since, snapshot) {
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
            let scope = s.scope();
            s.control_message(connected(&snap, s.ep, &scope, &s.filter));
            Some(snap.seq.min(hub.last_seq()))
        }
        (None, None) => None,
    };
    let mut sub = hub.subscribe_since(since);
    if let Some(oldest) = sub.resync_from {
        s.control(resync_frame(sub.seq, since, oldest));
        // As at the pump: a fresh snapshot, then what follows it.
        let latest = gate.snapshot.borrow().clone();
        if let Some(snap) = latest.filter(|snap| snap.seq + 1 >= oldest) {
            let scope = s.scope();
            s.control_message(connected(&snap, s.ep, &scope, &s.filter));
            since = Some(snap.seq.min(hub.last_seq()));
            sub = hub.subscribe_since(since);
        }
    }
    Some((sub, since))
}
