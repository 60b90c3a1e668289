//! The observability and control API (SPEC §9, §10): REST under `/api/v1`, the `/ws` event
//! stream and `/ws/messages` message stream, `/metrics`, `/healthz`, `/readyz`.
//!
//! The API is an observer and a caller: it reads the [`EventHub`](crate::events::EventHub)
//! and the thread registry, and calls [`Organism`] methods. The pump never waits on it.
//! Routes are registered through `utoipa-axum`, so `/api/v1/openapi.json` is generated from
//! the same handler declarations that serve requests.
//!
//! ## Inside
//!
//! The HTTP/WebSocket API (axum). `mod.rs`: `ApiServer` (bind, serve, `stop_requested`,
//! `shutdown`), `ApiState`, the router built with `utoipa-axum` so every served route is the
//! documented one. `rest.rs`: REST handlers. `ws/`: `/ws` and `/ws/messages` sessions
//! (resume, filters, bounded per-client queue, drops, heartbeat, commands; an answer counts
//! against the client's queue like any frame, and a client that does not read its answers is
//! closed; an answer's `seq` is the last event offered to the connection, so `seq` never goes
//! back on it). A session's loop is a biased `select!` with the event stream last (commands,
//! the `dropped` notice and heartbeats are never starved) and offers every event already
//! published (up to 256) per turn; its client's frames are read by their own task and its
//! queued frames written with one flush. `inject.rs`: the one inject path REST and WS share.
//! `error.rs`: `ApiError` (status + `{"error": {code, message, details, where}}`, the message
//! cut at 4 kB) and the extractors that produce it (JSON body with content-type and size
//! checks, query parameters). `filter.rs`: subscription filters, bounded in entries and bytes,
//! agent globs compiled into one regex. `browser.rs`: the checks against web pages, run on
//! every request before any handler (Host against DNS rebinding, Origin on upgrades and
//! state-changing methods, body types a page could send cross-site). `conn.rs`: the accept loop
//! (hyper with a header-read timer; `max_connections`, one more answered 503; an idle timeout
//! on the socket; `TCP_NODELAY`). `metrics.rs`: Prometheus text from live state. `sanitize.rs`:
//! secret redaction of config. `external.rs`: the external agents' callback endpoint.
//! `view.rs` and `frame.rs`: the JSON the API shows, mapped from core values. `auth/`: the
//! `Principal` of each request (`guard`), the policy table, keys, and the `Scope` a tenant's
//! principal sees, pushed into the history's filters (`within`) and each session's events;
//! `keys.rs`: the keys API.

mod agents;
mod agents_scope;
mod audit;
pub mod auth;
mod batch;
mod browser;
mod cause;
mod conn;
mod dashboard;
mod doc;
mod error;
mod external;
mod filter;
mod fork;
mod frame;
pub mod gateway;
mod idempotency;
mod inject;
mod inputs;
pub mod keys;
mod labels;
mod messages;
mod metrics;
mod mirror;
mod models;
mod reads;
mod rest;
mod retry;
mod rewind;
mod sanitize;
mod schema;
mod settings;
pub(crate) mod stream;
mod streams;
mod test_vectors;
mod thread_control;
mod turns;
mod usage;
pub mod view;
mod whole;
mod ws;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode, Uri};
use axum::Router;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, ErrorBody};
pub use filter::Filter;
pub use inject::InjectBody;
pub use mirror::mirror_events;
pub use rest::REST_IDENTITY;
pub use sanitize::{redact, REDACTED};
pub use ws::WS_IDENTITY;

use crate::Organism;

/// Tunables of the API server. The defaults are what `agentserver run` uses.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// WebSocket ping interval; a client silent for two intervals is closed.
    pub heartbeat: Duration,
    /// Frames queued per WebSocket client before frames are dropped for it: room for about
    /// 0.2 s of a busy organism's messages (40k a second), so a client's short pause loses
    /// none, while `client_queue_bytes` bounds its memory.
    pub client_queue: usize,
    /// Bytes queued per WebSocket client before frames are dropped for it.
    pub client_queue_bytes: usize,
    /// Serve beyond loopback without authentication (`--insecure-no-auth`): refused
    /// otherwise, and warned about every minute when given.
    pub insecure_no_auth: bool,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            heartbeat: Duration::from_secs(15),
            client_queue: 8192,
            client_queue_bytes: 16 * 1024 * 1024,
            insecure_no_auth: false,
        }
    }
}

/// The two WebSocket endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Events,
    Messages,
}

impl Endpoint {
    pub const ALL: [Endpoint; 2] = [Endpoint::Events, Endpoint::Messages];

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Events => "/ws",
            Endpoint::Messages => "/ws/messages",
        }
    }
}

struct Inner {
    organism: Organism,
    options: ApiOptions,
    /// `None` when the organism has no `auth.methods`: every client is the implicit admin.
    auth: Option<Arc<auth::Authenticator>>,
    /// Cancelled when a client asked the organism to stop and it has stopped.
    stop_requested: CancellationToken,
    /// Cancelled when the server shuts down: WebSocket sessions close.
    closing: CancellationToken,
    clients: [AtomicUsize; 2],
    /// Notified whenever a WebSocket session ends, so shutdown can wait for them.
    session_ended: tokio::sync::Notify,
    dropped: [AtomicU64; 2],
    /// Refused requests by HTTP status (the bad inputs that never reached the pump included).
    refused: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    /// Test-vector runs under way, by tenant (`None`: the organism's own credentials):
    /// `limits.max_tests_at_once` permits each.
    tests_running: std::sync::Mutex<TestSlots>,
    /// Injects' idempotency keys (`Idempotency-Key`).
    keys: idempotency::Keys,
    /// Stream tokens waiting to be used (`POST /api/v1/stream-tokens`).
    stream_tokens: stream::StreamTokens,
    /// Each tenant's event streams open (`tenants.<t>.max_streams`).
    streams: Arc<streams::Streams>,
    /// Reads' turns: a tenant's one at a time, each side's and everyone's bounded (`turns.rs`).
    turns: turns::Turns,
}

/// Each tenant's test-vector slots: the limit they were made with, and the semaphore.
type TestSlots = std::collections::HashMap<Option<String>, (usize, Arc<tokio::sync::Semaphore>)>;

/// Shared by every handler.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

/// Counts a connected WebSocket client for as long as it lives.
struct ClientGuard {
    state: ApiState,
    ep: Endpoint,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.state.inner.clients[self.ep as usize].fetch_sub(1, Ordering::Relaxed);
        self.state.inner.session_ended.notify_waiters();
    }
}

impl ApiState {
    /// A slot for one test-vector run of `tenant`'s, or 429 `too_many_tests` when its
    /// `limits.max_tests_at_once` are all taken. Held for the run; freed when dropped.
    fn test_slot(
        &self,
        tenant: Option<&str>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let max = self.inner.organism.config().limits.max_tests_at_once;
        let slots = {
            let mut all = crate::sync::lock(&self.inner.tests_running);
            let entry = all
                .entry(tenant.map(str::to_string))
                .or_insert_with(|| (max, Arc::new(tokio::sync::Semaphore::new(max))));
            if entry.0 != max {
                // The limit changed with a reload: runs under way keep the old slots.
                *entry = (max, Arc::new(tokio::sync::Semaphore::new(max)));
            }
            entry.1.clone()
        };
        slots.try_acquire_owned().map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "too_many_tests",
                format!(
                    "{max} test runs of this tenant are under way (limits.max_tests_at_once); \
                     retry when one has answered"
                ),
            )
            .retry_after(Duration::from_secs(1))
        })
    }

    fn client_guard(&self, ep: Endpoint) -> ClientGuard {
        self.inner.clients[ep as usize].fetch_add(1, Ordering::Relaxed);
        ClientGuard {
            state: self.clone(),
            ep,
        }
    }

    fn clients(&self, ep: Endpoint) -> usize {
        self.inner.clients[ep as usize].load(Ordering::Relaxed)
    }

    fn dropped(&self, ep: Endpoint) -> u64 {
        self.inner.dropped[ep as usize].load(Ordering::Relaxed)
    }

    /// Refused requests by status.
    fn refused(&self) -> Vec<(u16, u64)> {
        crate::sync::lock(&self.inner.refused)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    fn count_dropped(&self, ep: Endpoint, n: u64) {
        self.inner.dropped[ep as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Largest inbound body or WebSocket frame: a payload at the size limit, escaped as
    /// JSON, with room for the other fields.
    fn frame_limit(&self) -> usize {
        self.inner
            .organism
            .config()
            .limits
            .max_message_bytes
            .saturating_mul(2)
            .saturating_add(64 * 1024)
    }

    /// Keeps an entry in the audit log (off the async workers); nothing without `auth`.
    async fn audit(&self, row: crate::store::audit::AuditRow) {
        let Some(auth) = self.inner.auth.clone() else {
            return;
        };
        let organism = self.inner.organism.clone();
        let _ =
            crate::events::spawn_blocking(move || auth.audit.record(row, organism.events())).await;
    }

    async fn audit_maybe(&self, row: Option<crate::store::audit::AuditRow>) {
        if let Some(row) = row {
            self.audit(row).await;
        }
    }

    /// Counts an inject against its tenant's rate (`tenants.<t>.inject_per_s`) and its
    /// credential's (`auth.inject_per_s`, or the key's own).
    fn limit_inject(&self, p: &auth::Principal) -> Result<(), ApiError> {
        let Some(a) = &self.inner.auth else {
            return Ok(());
        };
        let tenant_rate = p
            .tenant
            .as_deref()
            .and_then(|t| self.inner.organism.config().tenants.of(t).0.inject_per_s);
        Ok(a.limits.inject(p, tenant_rate)?)
    }

    /// Stops the organism (drain within the grace period), then tells the server's owner.
    fn request_stop(&self) {
        let state = self.clone();
        tokio::spawn(async move {
            state.inner.organism.stop().await;
            state.inner.stop_requested.cancel();
        });
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "agentserver",
        description = "Observe and control a running organism: agents, threads and messages as they happen. Errors are `{\"error\": {\"code\", \"message\", \"details\"?, \"where\"?}}`."
    ),
    components(schemas(
        error::ErrorResponse,
        view::AgentState,
        view::OrganismStatus,
        view::MessageStatus,
        view::ThreadStatus
    ))
)]
struct ApiDoc;

/// The API's routes, and what utoipa gathers of them for the OpenAPI document: gathered once
/// for the process (utoipa's schema building is a third of a start's CPU) and cloned by every
/// server, which adds its own state and layers.
fn routes() -> Router<ApiState> {
    static ROUTES: std::sync::OnceLock<Router<ApiState>> = std::sync::OnceLock::new();
    ROUTES
        .get_or_init(|| {
            let (routes, spec) = OpenApiRouter::with_openapi(ApiDoc::openapi())
                .routes(routes!(rest::get_organism))
                .routes(routes!(rest::me))
                .routes(routes!(models::list_models))
                .routes(routes!(usage::get_usage))
                .routes(routes!(usage::get_budgets))
                .routes(routes!(rest::get_organism_config))
                .routes(routes!(rest::list_agents))
                .routes(routes!(rest::get_agent))
                .routes(routes!(rest::get_agent_config))
                .routes(routes!(schema::get_agent_schema))
                .routes(routes!(schema::get_agent_fields))
                .routes(routes!(rest::list_threads))
                .routes(routes!(batch::count_threads))
                .routes(routes!(batch::batch))
                .routes(routes!(rest::get_thread, settings::patch_thread))
                .routes(routes!(rest::thread_messages))
                .routes(routes!(rest::list_messages))
                .routes(routes!(rest::inject))
                .routes(routes!(thread_control::kill_thread))
                .routes(routes!(thread_control::pause_thread))
                .routes(routes!(thread_control::resume_thread))
                .routes(routes!(inputs::abort_thread))
                .routes(routes!(inputs::list_inputs))
                .routes(routes!(inputs::get_input))
                .routes(routes!(messages::get_message))
                .routes(routes!(retry::retry_message))
                .routes(routes!(retry::retry_messages))
                .routes(routes!(fork::fork_thread))
                .routes(routes!(rewind::rewind_thread))
                .routes(routes!(stream::thread_events))
                .routes(routes!(stream::create_stream_token))
                .routes(routes!(inputs::approve_input))
                .routes(routes!(inputs::reject_input))
                .routes(routes!(inputs::answer_input))
                .routes(routes!(rest::pause_agent))
                .routes(routes!(rest::resume_agent))
                .routes(routes!(rest::pause_organism))
                .routes(routes!(rest::resume_organism))
                .routes(routes!(rest::reload_organism))
                .routes(routes!(rest::reload_agent))
                .routes(routes!(rest::stop_organism))
                .routes(routes!(external::external_reply))
                .routes(routes!(agents::create_agent))
                .routes(routes!(agents::delete_agent))
                .routes(routes!(agents::upload_script, agents::list_scripts))
                .routes(routes!(agents::get_script))
                .routes(routes!(agents::test_script))
                .routes(routes!(agents::deploy, agents::list_deployments))
                .routes(routes!(keys::create_key, keys::list_keys))
                .routes(routes!(keys::revoke_key))
                .routes(routes!(audit::list_audit))
                .routes(routes!(rest::openapi))
                .routes(routes!(rest::metrics))
                .routes(routes!(rest::healthz))
                .routes(routes!(rest::readyz))
                .routes(routes!(ws::ws_events))
                .routes(routes!(ws::ws_messages))
                .split_for_parts();
            doc::gathered(spec);
            routes
        })
        .clone()
}

fn router(
    organism: Organism,
    options: ApiOptions,
    auth: Option<Arc<auth::Authenticator>>,
) -> (Router, ApiState) {
    let routes = routes();
    let keys = idempotency::Keys::load(&organism);
    let state = ApiState {
        inner: Arc::new(Inner {
            organism,
            options,
            auth,
            stop_requested: CancellationToken::new(),
            closing: CancellationToken::new(),
            clients: Default::default(),
            session_ended: tokio::sync::Notify::new(),
            dropped: Default::default(),
            refused: Default::default(),
            tests_running: Default::default(),
            keys,
            stream_tokens: Default::default(),
            streams: Default::default(),
            turns: Default::default(),
        }),
    };
    let limit = state.frame_limit();
    let mut app = routes.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::guard,
    ));
    if state.inner.organism.config().dashboard {
        app = app.merge(dashboard::routes());
    }
    let app = app
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            browser_guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            record_refusals,
        ))
        .layer(axum::middleware::from_fn(cause::request_id))
        .with_state(state.clone());
    (app, state)
}

/// Every refused request is logged and counted (`agentserver_http_refused_total{status}`),
/// including those refused before any handler ran (bad JSON, wrong content type, too large).
async fn record_refusals(
    axum::extract::State(state): axum::extract::State<ApiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        tracing::info!(%method, %path, status = status.as_u16(), "API request refused");
        {
            let mut refused = crate::sync::lock(&state.inner.refused);
            *refused.entry(status.as_u16()).or_default() += 1;
        }
        return as_json_error(response, &path).await;
    }
    response
}

/// A refusal made as plain text by the framework (a path parameter that does not parse, a
/// plain GET of a WebSocket endpoint) answered as every other: the JSON error envelope.
async fn as_json_error(response: axum::response::Response, path: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"));
    if !plain {
        return response;
    }
    let status = response.status();
    let text = axum::body::to_bytes(response.into_body(), error::MAX_ANSWER_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).to_string())
        .unwrap_or_default();
    let code = match status.as_u16() {
        400 if path.starts_with("/ws") => "not_websocket",
        400 => "bad_request",
        404 => "not_found",
        405 => "method_not_allowed",
        413 => "too_large",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        _ => "error",
    };
    let message = if code == "not_websocket" {
        format!("{text}: {path} is a WebSocket endpoint; connect with a WebSocket client")
    } else {
        text
    };
    ApiError::new(status, code, message)
        .at(path.to_string())
        .into_response()
}

/// Refuses what a web page could make the server do (`browser`: Host, Origin, body type).
async fn browser_guard(
    axum::extract::State(state): axum::extract::State<ApiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let config = state.inner.organism.config();
    if let Err(e) = browser::check(
        &browser::Allowed::of(&config),
        request.method(),
        request.headers(),
    ) {
        return e.into_response();
    }
    drop(config);
    next.run(request).await
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found("no_route", format!("no route {method} {}", uri.path()))
        .at(uri.path().to_string())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {} (see /api/v1/openapi.json)",
            uri.path()
        ),
    )
    .at(uri.path().to_string())
}

/// What the server does every few seconds until it closes: records when keys were last
/// used, and warns each minute that it serves without authentication beyond loopback.
async fn housekeeping(
    auth: Option<Arc<auth::Authenticator>>,
    insecure: bool,
    addr: SocketAddr,
    closing: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = closing.cancelled() => break,
        }
        if insecure && ticks.is_multiple_of(12) {
            tracing::warn!(
                "the API on {addr} has no authentication (--insecure-no-auth): anyone who can \
                 reach it can read every message and inject, pause, kill, reload and stop"
            );
        }
        ticks += 1;
        if let Some(a) = &auth {
            a.limits.tidy();
            let a = a.clone();
            let _ = tokio::task::spawn_blocking(move || a.flush_used()).await;
        }
    }
    if let Some(a) = auth {
        let _ = tokio::task::spawn_blocking(move || a.flush_used()).await;
    }
}

/// A running API server.
pub struct ApiServer {
    addr: SocketAddr,
    /// `http`, or `https` with `organism.tls`.
    scheme: &'static str,
    state: ApiState,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ApiServer {
    /// Binds `addr` (port 0 picks a free port) and serves `organism`.
    pub async fn bind(
        organism: Organism,
        addr: &str,
        options: ApiOptions,
    ) -> std::io::Result<ApiServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        ApiServer::serve(organism, listener, options)
    }

    /// Serves `organism` on an already bound listener.
    pub fn serve(
        organism: Organism,
        listener: tokio::net::TcpListener,
        options: ApiOptions,
    ) -> std::io::Result<ApiServer> {
        let addr = listener.local_addr()?;
        let config = organism.config();
        let auth = auth::Authenticator::new(&config)
            .map_err(|e| std::io::Error::other(format!("auth: {e}")))?
            .map(Arc::new);
        let exposed = !addr.ip().is_loopback();
        if auth.is_none() && exposed && !options.insecure_no_auth {
            return Err(std::io::Error::other(format!(
                "{addr} is beyond this machine and the organism has no authentication: add \
                 `auth: {{methods: [keys]}}` to the organism file and create a key with \
                 `agentserver keys create`, listen on 127.0.0.1, or (only on a network that \
                 is yours alone) pass --insecure-no-auth"
            )));
        }
        let tls = match &config.tls {
            Some(files) => Some(conn::tls_acceptor(files).map_err(std::io::Error::other)?),
            None => None,
        };
        drop(config);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{addr}");
        organism.set_callback_url(std::sync::Arc::new(move |agent, thread| {
            external::callback_url(&base, agent, thread)
        }));
        let limits = conn::ConnLimits::of(&organism.config().limits);
        let insecure = auth.is_none() && exposed;
        let (app, state) = router(organism, options, auth.clone());
        let closing = state.inner.closing.clone();
        tokio::spawn(housekeeping(auth, insecure, addr, closing.clone()));
        let task = tokio::spawn(conn::serve(listener, app, limits, closing, tls));
        Ok(ApiServer {
            addr,
            scheme,
            state,
            task,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, or `https://ADDR` with `organism.tls`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The OpenAPI document this server serves.
    pub fn openapi_json(&self) -> &str {
        doc::text()
    }

    /// Resolves once a client asked for a stop (`POST /api/v1/organism/stop` or the `/ws`
    /// `stop` command) and the organism has stopped.
    pub async fn stop_requested(&self) {
        self.state.inner.stop_requested.cancelled().await
    }

    /// Closes every WebSocket client (each gets a close frame) and stops serving; waits for
    /// open requests and sessions to finish, up to 10 s.
    pub async fn shutdown(self) {
        let inner = &self.state.inner;
        inner.closing.cancel();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let _ = tokio::time::timeout_at(deadline, self.task).await;
        let sessions_closed = async {
            loop {
                let ended = inner.session_ended.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if Endpoint::ALL.iter().all(|ep| self.state.clients(*ep) == 0) {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout_at(deadline, sessions_closed).await;
    }
}

/// `organism.tls` as `run` will use it: its files read, the key matched to the certificate.
/// Err: the problem, at the line of `tls` in the organism's file.
pub fn check_tls(config: &crate::config::OrganismConfig) -> Result<(), crate::config::ConfigError> {
    match &config.tls {
        None => Ok(()),
        Some(files) => conn::tls_acceptor(files)
            .map(|_| ())
            .map_err(|e| crate::config::ConfigError::about(config, None, Some("tls"), e)),
    }
}
