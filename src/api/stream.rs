//! A thread's event stream (`GET /api/v1/threads/{id}/events`, Server-Sent Events): first a
//! `thread_snapshot` read from the history (the thread, its messages in parts of at most
//! [`MAX_SNAPSHOT_PART_BYTES`], its open inputs, `as_of_seq`), then every live event of the
//! thread the principal sees, each with `id: <seq>`. The hub is subscribed before the
//! history is read, so nothing falls between; a message the snapshot holds is not sent
//! again. `Last-Event-ID` (or `?since=`) inside the hub's ring resumes exactly; past it, or
//! after the stream fell behind, a fresh snapshot. Comments every [`HEARTBEAT`] keep proxies
//! from closing an idle stream. Browsers (`EventSource` cannot send `Authorization`) present
//! a stream token (`POST /api/v1/stream-tokens`): single-use, [`TOKEN_TTL`], bound to the
//! principal and the thread, accepted as `?st=` on this route only. A stream ends when its
//! credential is revoked or expires, as a WebSocket session does.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use super::auth::{sees_event, unknown_thread, Seen, VisibleThread};
use super::error::{ApiError, ErrorResponse, JsonBody, Params};
use super::view::{Message, Thread, Timestamp};
use super::ApiState;
use crate::access::{Principal, Scope};
use crate::events::{Event, Receiver, RecvError};
use crate::sync::lock;
use crate::threads::{InputFilter, InputStatus, Page};
use crate::Organism;

/// The route's template (the auth guard takes a stream token on it alone).
pub const THREAD_EVENTS: &str = "/api/v1/threads/{id}/events";
/// Bytes of messages in one `thread_snapshot` part, at most (a larger message goes alone).
pub const MAX_SNAPSHOT_PART_BYTES: usize = 1024 * 1024;
/// Messages in one snapshot part, at most (besides [`MAX_SNAPSHOT_PART_BYTES`]).
const SNAPSHOT_PAGE: usize = 2048;
/// How often an idle stream sends a comment.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long a stream token may wait to be used.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// Stream tokens waiting to be used, at most (one more is 429 `too_many_stream_tokens`).
pub const MAX_STREAM_TOKENS: usize = 10_000;
/// Stream tokens of one principal waiting to be used, at most (so one cannot take them all).
pub const MAX_STREAM_TOKENS_EACH: usize = 100;
/// Stream tokens of one tenant's principals together, at most (so a tenant of many
/// credentials cannot take them all from the others).
pub const MAX_STREAM_TOKENS_PER_TENANT: usize = 1000;

/// The stream tokens waiting to be used: token → (whose, which thread, until when).
#[derive(Default)]
pub struct StreamTokens(Mutex<HashMap<String, (Principal, String, Instant)>>);

impl StreamTokens {
    fn issue(&self, p: &Principal, thread: &str) -> Result<String, ApiError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_randomness",
                e.to_string(),
            )
        })?;
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut tokens = lock(&self.0);
        let now = Instant::now();
        tokens.retain(|_, (_, _, until)| *until > now);
        let mine = tokens.values().filter(|(q, _, _)| q.name == p.name).count();
        let tenants = match &p.tenant {
            Some(t) => tokens
                .values()
                .filter(|(q, _, _)| q.tenant.as_ref() == Some(t))
                .count(),
            None => 0,
        };
        if tokens.len() >= MAX_STREAM_TOKENS
            || mine >= MAX_STREAM_TOKENS_EACH
            || tenants >= MAX_STREAM_TOKENS_PER_TENANT
        {
            let tenant = match &p.tenant {
                Some(t) => format!(
                    ", {tenants} of tenant `{t}`'s ({MAX_STREAM_TOKENS_PER_TENANT} at most)"
                ),
                None => String::new(),
            };
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_stream_tokens",
                format!(
                    "{mine} of this credential's stream tokens ({MAX_STREAM_TOKENS_EACH} at most){tenant} and {} in all ({MAX_STREAM_TOKENS} at most) wait to be used; use them or let them expire first",
                    tokens.len()
                ),
            ));
        }
        tokens.insert(
            token.clone(),
            (p.clone(), thread.to_string(), now + TOKEN_TTL),
        );
        Ok(token)
    }

    /// The principal of `token`, if it is unused, unexpired and for `thread`; used up
    /// either way.
    pub fn redeem(&self, token: &str, thread: &str) -> Option<Principal> {
        let (p, bound, until) = lock(&self.0).remove(token)?;
        (bound == thread && until > Instant::now()).then_some(p)
    }
}

/// `POST /api/v1/stream-tokens`'s body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamTokenBody {
    /// The thread whose event stream the token opens.
    pub thread_id: String,
}

/// A stream token.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamToken {
    /// Present as `?st=` on `GET /api/v1/threads/{thread_id}/events`, once.
    pub token: String,
    pub thread_id: String,
    pub expires_at: Timestamp,
    /// The stream's path with the token.
    pub url: String,
}

#[utoipa::path(post, path = "/api/v1/stream-tokens", tag = "threads", request_body = StreamTokenBody,
    responses((status = 201, description = "A single-use token for one thread's event stream, valid 60 s", body = StreamToken),
              (status = 404, description = "No such thread (in this credential's scope)", body = ErrorResponse),
              (status = 429, description = "Too many tokens wait to be used", body = ErrorResponse)))]
pub async fn create_stream_token(
    State(s): State<ApiState>,
    seen: Seen,
    JsonBody(body): JsonBody<StreamTokenBody>,
) -> Result<(StatusCode, Json<StreamToken>), ApiError> {
    let id = body.thread_id;
    match s.inner.organism.history().thread_info(&id)? {
        Some(info) if seen.scope.sees_thread(&info.participants) => {}
        _ => return Err(unknown_thread(&id).at("thread_id")),
    }
    let token = s.inner.stream_tokens.issue(&seen.principal, &id)?;
    let ttl = u64::try_from(TOKEN_TTL.as_millis()).unwrap_or(u64::MAX);
    let expires = crate::time::Timestamp(crate::time::Timestamp::now().0.saturating_add(ttl));
    Ok((
        StatusCode::CREATED,
        Json(StreamToken {
            url: format!("/api/v1/threads/{id}/events?st={token}"),
            token,
            thread_id: id,
            expires_at: expires.into(),
        }),
    ))
}

/// `GET /api/v1/threads/{id}/events`'s query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Resume after this `seq` (as `Last-Event-ID`).
    pub since: Option<u64>,
    /// A stream token (`POST /api/v1/stream-tokens`), for a client that cannot send
    /// `Authorization` (a browser's `EventSource`).
    #[allow(dead_code)] // redeemed by the auth guard, before the handler
    pub st: Option<String>,
}

/// The `seq` a client's `Last-Event-ID` names (an id this stream sent: a whole number).
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    match value.to_str().ok().and_then(|v| v.trim().parse().ok()) {
        Some(seq) => Ok(Some(seq)),
        None => Err(ApiError::bad_request(
            "`Last-Event-ID` is the `id` of an event this stream sent: a whole number",
        )
        .at("Last-Event-ID")),
    }
}

/// One event of a thread's event stream (`text/event-stream`), as an SSE parser such as a
/// browser's `EventSource` hands it over.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documents what `thread_events` streams
pub struct StreamEvent {
    /// `thread_snapshot`, the event's kind (`message`, `message_status`, …), or
    /// `stream_error` (its `data` an error body: the store could not be read; the stream
    /// ends).
    pub event: String,
    /// The event, JSON text: a snapshot part, or the event as `/ws` frames it.
    pub data: String,
    /// Its `seq`: every live event's, and the snapshot's last part's (the `seq` it was read
    /// at); the parts before it have none.
    #[schema(pattern = "^[0-9]+$")]
    pub id: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/threads/{id}/events", tag = "threads",
    params(("id" = String, Path, description = "Thread id"), EventsQuery,
           ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this `seq` (not a whole number: 400)")),
    responses((status = 200, description = "`text/event-stream`: `thread_snapshot` part(s), then the thread's events, each `id: <seq>`", content_type = "text/event-stream", body = StreamEvent),
              (status = 400, description = "Bad query parameter, or a `Last-Event-ID` that is not a whole number", body = ErrorResponse),
              (status = 404, description = "No such thread (in this credential's scope)", body = ErrorResponse),
              (status = 429, description = "`too_many_streams`: the credential's tenant has `tenants.<t>.max_streams` event streams open; or `rate_limited`: too many wrong credentials from this address; with `Retry-After`", body = ErrorResponse,
               headers(("Retry-After" = u64, description = "Seconds to wait")))))]
pub async fn thread_events(
    State(s): State<ApiState>,
    thread: VisibleThread,
    seen: Seen,
    Params(q): Params<EventsQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let since = last_event_id(&headers)?;
    let since = q.since.or(since);
    let config = s.inner.organism.config();
    let slot = s
        .inner
        .streams
        .take(&config, seen.principal.tenant.as_deref())
        .map_err(|why| {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", why)
                .retry_after(HEARTBEAT)
        })?;
    let organism = s.inner.organism.clone();
    let sub = organism.events().subscribe_since(since);
    let start = match (since, sub.resync_from) {
        (Some(_), None) => Phase::Replay(sub.replay.into()),
        _ => Phase::Snapshot(0),
    };
    // A stream on a credential that can end (a key, an expiring token) ends with it, as a
    // WebSocket session does: looked at every second, and at once on a revocation.
    let check = s.inner.auth.clone().filter(|_| seen.principal.can_lapse());
    let state = Reader {
        organism,
        thread: thread.id,
        scope: thread.scope,
        tenant: seen.principal.tenant.clone(),
        check: check.map(|a| (a, seen.principal)),
        live: sub.live,
        as_of: sub.seq,
        phase: start,
        sent: HashSet::new(),
        _slot: slot,
    };
    let closing = s.inner.closing.clone();
    let stream = futures_util::stream::unfold(state, |mut r| async move {
        let ev = r.next().await?;
        Some((Ok(ev), r))
    });
    let stream = futures_util::StreamExt::take_until(stream, closing.cancelled_owned());
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT)))
}

/// Where a stream stands.
enum Phase {
    /// Writing the snapshot; the next part starts at this slot.
    Snapshot(u64),
    /// Resuming: the retained events after the client's `seq`.
    Replay(VecDeque<Arc<Event>>),
    Live,
    /// A read failed and was told (`stream_error`): nothing follows.
    Ended,
}

/// One client's stream of one thread.
struct Reader {
    organism: Organism,
    thread: String,
    scope: Scope,
    tenant: Option<String>,
    live: Receiver,
    /// The last `seq` handed out when the hub was subscribed (the snapshot's cursor).
    as_of: u64,
    phase: Phase,
    /// The messages the snapshot held (not sent again live).
    sent: HashSet<Arc<str>>,
    /// The credential to look at again while the stream lasts, and whose it is.
    check: Option<(Arc<crate::access::Authenticator>, Principal)>,
    /// Its place among its tenant's streams (`tenants.<t>.max_streams`).
    _slot: Option<super::streams::StreamSlot>,
}

/// One `thread_snapshot` part.
#[derive(Serialize)]
struct SnapshotPart<'a> {
    event: &'static str,
    thread_id: &'a str,
    /// The thread as it was read (the first part only).
    #[serde(skip_serializing_if = "Option::is_none")]
    thread: Option<Thread>,
    messages: Vec<Message<'a>>,
    /// Its open inputs (the first part only).
    #[serde(skip_serializing_if = "Option::is_none")]
    inputs: Option<Vec<super::inputs::Input>>,
    as_of_seq: u64,
    /// The slot this part starts at.
    part: usize,
    /// More parts follow.
    more: bool,
}

impl Reader {
    /// The next event of the stream; `None` when it ends (the hub closed).
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            match &mut self.phase {
                Phase::Snapshot(from) => {
                    let from = *from;
                    return Some(self.snapshot_part(from).await);
                }
                Phase::Replay(events) => match events.pop_front() {
                    Some(ev) => {
                        if let Some(out) = self.live_event(&ev) {
                            return Some(out);
                        }
                    }
                    None => self.phase = Phase::Live,
                },
                Phase::Live => match self.recv().await? {
                    Ok(ev) => {
                        if let Some(out) = self.live_event(&ev) {
                            return Some(out);
                        }
                    }
                    // Fell behind the hub: start again from a fresh snapshot.
                    Err(RecvError::Lagged(_)) => {
                        let sub = self.organism.events().subscribe_since(None);
                        self.live = sub.live;
                        self.as_of = sub.seq;
                        self.sent.clear();
                        self.phase = Phase::Snapshot(0);
                    }
                    Err(RecvError::Closed) => return None,
                },
                Phase::Ended => return None,
            }
        }
    }

    /// The next event of the hub; `None` once the credential no longer holds.
    async fn recv(&mut self) -> Option<Result<Arc<Event>, RecvError>> {
        let Some((auth, p)) = &self.check else {
            return Some(self.live.recv().await);
        };
        loop {
            tokio::select! {
                // Cancel-safe: a call given up loses no event.
                r = self.live.recv() => return Some(r),
                _ = auth.revoked.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if !auth.still_holds(p).await {
                return None;
            }
        }
    }

    /// The event `ev` as this client sees it, if it is of the thread, visible, and not a
    /// message the snapshot held.
    fn live_event(&mut self, ev: &Event) -> Option<SseEvent> {
        if ev.kind.thread_id() != Some(self.thread.as_str()) {
            return None;
        }
        if !self.scope.everything()
            && !sees_event(&self.scope, self.tenant.as_deref(), ev, |t| {
                t == self.thread
            })
        {
            return None;
        }
        if let crate::events::EventKind::Message { message } = &ev.kind {
            if self.sent.remove(&message.id) {
                return None;
            }
        }
        let frame = super::frame::event_frame(ev, &self.organism)?;
        Some(
            SseEvent::default()
                .id(ev.seq.to_string())
                .event(ev.kind.name())
                .data(frame.as_str()),
        )
    }

    /// The snapshot's part from slot `from` ([`snapshot_part`]); the last part carries the
    /// snapshot's `id` (so a client cut off within a snapshot asks for a fresh one).
    async fn snapshot_part(&mut self, from: u64) -> SseEvent {
        let who = (&self.scope, self.tenant.as_deref());
        let part = match snapshot_part(&self.organism, who, &self.thread, from, self.as_of).await {
            Ok(part) => part,
            Err(e) => {
                // The stream ends with why: a client never takes a failed read for history.
                self.phase = Phase::Ended;
                let body = serde_json::json!({ "error": e.body });
                return SseEvent::default()
                    .event("stream_error")
                    .data(body.to_string());
            }
        };
        self.sent.extend(part.ids);
        let ev = SseEvent::default().event("thread_snapshot").data(part.json);
        if part.more {
            self.phase = Phase::Snapshot(part.next);
            ev
        } else {
            self.phase = Phase::Live;
            ev.id(self.as_of.to_string())
        }
    }
}

/// One part of a thread's snapshot.
pub(super) struct Part {
    /// The `thread_snapshot` frame.
    pub json: String,
    /// The slot the next part starts at.
    pub next: u64,
    pub more: bool,
    /// The messages it holds (not to be sent again live).
    pub ids: Vec<Arc<str>>,
}

/// The part of `thread`'s snapshot from slot `from`, as a principal of `scope` (and tenant)
/// sees it: the thread and its open inputs with the first part, messages up to
/// [`MAX_SNAPSHOT_PART_BYTES`], `as_of_seq` the `seq` its live events follow. Read off the
/// runtime's workers (`api::reads`); a read that fails says why (503 `store_failed` or
/// `query_timeout`), never an empty snapshot.
pub(super) async fn snapshot_part(
    organism: &Organism,
    (scope, tenant): (&Scope, Option<&str>),
    thread: &str,
    from: u64,
    as_of: u64,
) -> Result<Part, ApiError> {
    let (o, scope, tenant) = (organism.clone(), scope.clone(), tenant.map(str::to_string));
    let thread = thread.to_string();
    let read = move || read_snapshot_part(&o, (&scope, tenant.as_deref()), &thread, from, as_of);
    Ok(super::reads::off_runtime(read).await??)
}

fn read_snapshot_part(
    organism: &Organism,
    (scope, tenant): (&Scope, Option<&str>),
    thread: &str,
    from: u64,
    as_of: u64,
) -> Result<Part, crate::store::StoreError> {
    let history = organism.history();
    let first = from == 0;
    let info = if first {
        history.thread_info(thread)?
    } else {
        None
    };
    let (slice, more) = history
        .thread_slice(thread, from, SNAPSHOT_PAGE, MAX_SNAPSHOT_PART_BYTES)?
        .unwrap_or_default();
    let next = slice.last().map_or(from, |m| m.slot_index + 1);
    // A tenant's principal sees the messages of its listeners.
    let records: Vec<_> = slice
        .into_iter()
        .filter(|m| scope.sees_message(&m.from, m.to.as_deref()))
        .collect();
    let inputs = if first {
        Some(open_inputs(organism, tenant, thread)?)
    } else {
        None
    };
    let schemas = organism.schemas();
    // Every message, those a rewind superseded marked so.
    let rewinds = history.rewinds(thread)?;
    let part = SnapshotPart {
        event: "thread_snapshot",
        thread_id: thread,
        thread: info.map(Thread::from),
        messages: Message::marked(&records, &schemas, &rewinds),
        inputs,
        as_of_seq: as_of,
        part: usize::try_from(from).unwrap_or(usize::MAX),
        more,
    };
    Ok(Part {
        json: serde_json::to_string(&part).unwrap_or_default(),
        next,
        more,
        ids: records.iter().map(|m| m.id.clone()).collect(),
    })
}

/// The thread's open inputs a principal of `tenant` sees (as `GET /inputs` lists them: a
/// tenant's own).
fn open_inputs(
    organism: &Organism,
    tenant: Option<&str>,
    thread: &str,
) -> Result<Vec<super::inputs::Input>, crate::store::StoreError> {
    let filter = InputFilter {
        status: Some(InputStatus::Open),
        thread: Some(thread.to_string()),
        tenant: tenant.map(str::to_string),
        ..Default::default()
    };
    let page = Page {
        limit: 1000,
        offset: 0,
    };
    let rows = organism.inputs().list(&filter, page)?.items;
    Ok(rows
        .iter()
        .map(|r| super::inputs::Input::of(r, organism))
        .collect())
}
