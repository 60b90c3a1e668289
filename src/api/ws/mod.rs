//! `/ws` and `/ws/messages` (SPEC §10): the pump's events and commands served by the one
//! stream session ([`session`]), which a gateway's streams share.

mod access;
mod commands;
mod frames;
mod held;
mod history;
mod queue;
mod replay;
pub(in crate::api) mod session;
mod socket;

pub use access::Who;
pub(in crate::api) use access::{first_frame_auth, CLOSE_TOO_MANY_STREAMS, CLOSE_UNAUTHORIZED};
pub(in crate::api) use frames::{
    dropped_frame, protocol_close, resync_frame, text, Dropped, Folded, Folding,
};

use std::sync::Arc;

use axum::extract::ws::{Utf8Bytes, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::{ApiError, Params};
use super::frame::{event_frame, message_frame};
use super::streams::StreamSlot;
use super::{ApiState, Endpoint};
use crate::api::auth::{Principal, Scope};
use crate::events::Event;
use crate::time::Timestamp;
use session::{query_filter, Session, Source};

/// The identity `/ws` injects carry.
pub const WS_IDENTITY: &str = "ws";
/// Open inputs listed in a `connected` snapshot at most (`inputs_total` counts them all).
const CONNECTED_INPUTS: usize = 100;

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
    /// `/ws`: `delta` events past this many a second are not sent; `folded` frames of
    /// `kind: delta` count them.
    pub max_deltas_per_s: Option<u64>,
}

#[utoipa::path(get, path = "/ws", tag = "streams", params(WsQuery),
    responses((status = 101, description = "WebSocket: a `connected` snapshot, then every event (JSON frames with `event`, `seq`, `timestamp`); commands `subscribe`, `inject`, `pause`, `resume`, `kill`, `abort`, `settings`, `retry`, `fork`, `rewind`, `approve`, `reject`, `answer`, `reload`, `stop`, answered by `ack` or `error` with the `request_id`"),
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
    let filter = query_filter(&q, ep, &state.inner.organism.config().limits)?;
    let limit = state.frame_limit();
    Ok(ws
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| async move {
            let _client = state.client_guard(ep);
            let options = state.inner.options.clone();
            session::run(socket, Pump(state), ep, who, filter, q.since, options).await
        }))
}

/// The pump's events and commands, as a session's [`Source`].
struct Pump(ApiState);

impl Source for Pump {
    type Basis = Arc<crate::config::OrganismConfig>;
    const STOPPING: &'static str = "server stopping";

    fn basis(&self) -> Self::Basis {
        self.0.inner.organism.config()
    }

    fn same(a: &Self::Basis, b: &Self::Basis) -> bool {
        Arc::ptr_eq(a, b)
    }

    fn thread_labels(&self, thread: &str) -> Option<Arc<crate::threads::Labels>> {
        self.0.inner.organism.threads().labels(thread)
    }

    fn scope(&self, p: &Principal, config: &Self::Basis) -> Scope {
        p.scope(config)
    }

    fn sees_thread(&self, scope: &Scope, id: &str) -> bool {
        self.0
            .inner
            .organism
            .threads()
            .info(id)
            .is_some_and(|t| scope.sees_thread(&t.participants))
    }

    fn frame<'e>(&self, ep: Endpoint, ev: &'e Event) -> Option<&'e Utf8Bytes> {
        match ep {
            Endpoint::Events => event_frame(ev, &self.0.inner.organism),
            Endpoint::Messages => message_frame(ev, &self.0.inner.organism),
        }
    }

    fn event(&self, seq: u64) -> Option<Arc<Event>> {
        self.0.inner.organism.events().event(seq)
    }

    fn limits(&self) -> crate::config::Limits {
        self.0.inner.organism.config().limits
    }

    fn auth(&self) -> Option<Arc<crate::api::auth::Authenticator>> {
        self.0.inner.auth.clone()
    }

    fn closing(&self) -> tokio_util::sync::CancellationToken {
        self.0.inner.closing.clone()
    }

    fn count_dropped(&self, ep: Endpoint, n: u64) {
        self.0.count_dropped(ep, n);
    }

    fn stream_slot(&self, p: &Principal) -> Result<Option<StreamSlot>, String> {
        let config = self.0.inner.organism.config();
        self.0.inner.streams.take(&config, p.tenant.as_deref())
    }

    async fn open(
        s: &mut Session<Self>,
        since: Option<u64>,
    ) -> Option<(crate::events::Subscription, Option<u64>)> {
        let sub = s.source.0.inner.organism.events().subscribe_since(since);
        if let (Some(from), Some(_), Endpoint::Messages) = (since, sub.resync_from, s.ep) {
            if from <= sub.seq {
                if let Some((sub, until)) = replay::from_store(s, from, sub.seq).await {
                    return Some((sub, Some(until)));
                }
            }
        }
        if let Some(oldest) = sub.resync_from {
            s.control(resync_frame(sub.seq, since, oldest));
        }
        if since.is_none() || sub.resync_from.is_some() {
            let snapshot = snapshot(s, sub.seq);
            s.control(snapshot);
        }
        Some((sub, since))
    }

    async fn execute(
        s: &mut Session<Self>,
        cmd: &str,
        map: Map<String, Value>,
    ) -> Result<Map<String, Value>, ApiError> {
        commands::execute(s, cmd, map).await
    }
}

/// The `connected` frame a pump session starts with.
fn snapshot(s: &mut Session<Pump>, seq: u64) -> Value {
    let scope = s.scope();
    let organism = &s.source.0.inner.organism;
    let info = crate::api::view::Organism::from(organism.info());
    let mut frame = json!({
        "event": "connected",
        "seq": seq,
        "timestamp": Timestamp::now(),
        "conn": s.conn,
        "organism": info,
    });
    if s.ep == Endpoint::Events {
        let (agents, threads) = snapshot_lists(organism, &scope);
        frame["agents"] = json!(agents);
        frame["threads"] = json!(threads);
        // The open inputs it may see, newest first, at most a page.
        let filter = crate::threads::InputFilter {
            status: Some(crate::threads::InputStatus::Open),
            tenant: s.principal.tenant.clone(),
            ..Default::default()
        };
        let page = crate::threads::Page::new(Some(CONNECTED_INPUTS), None);
        let (items, total) = match organism.inputs().list(&filter, page) {
            Ok(p) => (p.items, p.total),
            Err(_) => (Vec::new(), 0),
        };
        frame["inputs"] = json!(items
            .iter()
            .map(crate::api::inputs::summary)
            .collect::<Vec<_>>());
        frame["inputs_total"] = json!(total);
    }
    frame["filter"] = json!(s.filter);
    frame
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
        !t.status.is_finished() || {
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
