//! The stream pump: ingress, routing, per-(listener, thread) ordered dispatch, and control.
//!
//! [`Organism`] is a cheap handle (`Arc<Shared>`) on one running organism. State has one owner
//! each: listener queues live in their `dispatch::Listener` behind a per-listener mutex,
//! threads in the sharded [`ThreadRegistry`], events in the [`EventHub`]. No lock is global
//! per message and none is held across an `.await`. Validation runs inline on the worker
//! that routes. Memory is bounded: inject is refused past `max_pending_messages`, and a thread
//! past `max_messages_per_thread` fails.
//!
//! The pump knows nothing of HTTP: the API and the CLI call the methods here.

mod dispatch;
mod external;
mod gate;
mod reload;
mod route;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::{self, ConfigErrors, ListenerName, OrganismConfig};
use crate::events::{AgentState, EventHub, EventKind, OrganismStatus, DEFAULT_CAPACITY};
use crate::listener::{Handler, HandlerRegistry};
use crate::schema::ValidationError;
use crate::threads::{
    MessageRecord, MessageStatus, NewMessage, ThreadError, ThreadRegistry, ThreadStatus,
};
use crate::time::Timestamp;
use crate::xml::{normalize_payload, parse_envelope, NormalizedPayload, XmlError, XmlLimits};

use dispatch::Listener;
pub use dispatch::ListenerSnapshot;
pub use external::{ExternalReply, ReplyError, ReplyReceipt};
pub use reload::{ReloadError, ReloadProblem, ReloadReport};
pub use route::SYSTEM_IDENTITY;

/// How often retention runs (and at once after a reload that changes
/// `organism.store_retention`). A pass with nothing to prune costs one small read.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(1);

/// Finished threads kept in memory for the API and `send`.
pub const RETAINED_FINISHED_THREADS: usize = 10_000;

/// Kinds of failure, each counted (SPEC §8). The discriminant indexes the counters, so
/// `InjectRefused` must stay last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    Malformed,
    Invalid,
    Undeliverable,
    HandlerError,
    HandlerPanic,
    Budget,
    Killed,
    /// An external agent's reply did not come within `reply_timeout`.
    ReplyTimeout,
    /// A callback was refused (token, thread, size, payloads).
    ReplyRefused,
    InjectRefused,
    /// Left `pending` by a process that ended: failed when the store was opened again.
    Interrupted,
}

impl FailureKind {
    /// How many kinds there are: the size of the counter array.
    const COUNT: usize = FailureKind::Interrupted as usize + 1;

    /// Every kind, in discriminant order.
    pub const ALL: [FailureKind; FailureKind::COUNT] = [
        FailureKind::Malformed,
        FailureKind::Invalid,
        FailureKind::Undeliverable,
        FailureKind::HandlerError,
        FailureKind::HandlerPanic,
        FailureKind::Budget,
        FailureKind::Killed,
        FailureKind::ReplyTimeout,
        FailureKind::ReplyRefused,
        FailureKind::InjectRefused,
        FailureKind::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Malformed => "malformed",
            FailureKind::Invalid => "invalid",
            FailureKind::Undeliverable => "undeliverable",
            FailureKind::HandlerError => "handler_error",
            FailureKind::HandlerPanic => "handler_panic",
            FailureKind::Budget => "thread_budget",
            FailureKind::Killed => "killed",
            FailureKind::ReplyTimeout => "reply_timeout",
            FailureKind::ReplyRefused => "reply_refused",
            FailureKind::InjectRefused => "inject_refused",
            FailureKind::Interrupted => "interrupted",
        }
    }
}

/// Why an inject was refused. Each maps to one HTTP status in the API.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InjectError {
    #[error("the organism is stopping")]
    Stopping,
    #[error("over load: {pending} messages pending (limit {max})")]
    Overloaded { pending: usize, max: usize },
    #[error("no listener named `{0}`")]
    UnknownListener(String),
    #[error("`{0}` cannot be used as an injector identity (it is empty, a listener, or `system`)")]
    ForgedIdentity(String),
    #[error("{0}")]
    Malformed(#[from] XmlError),
    #[error("`{listener}` does not accept payload type `{payload_type}`")]
    NotAccepted {
        listener: String,
        payload_type: String,
    },
    #[error("payload is invalid: {0}")]
    Invalid(ValidationError),
    #[error("{0}")]
    Thread(#[from] ThreadError),
    #[error("the envelope has no <to>: say which listener receives it")]
    NoTarget,
    #[error("the message store is behind; try again shortly")]
    StoreBehind,
    #[error("the message store cannot write, so nothing new is accepted: {0}")]
    StoreFailed(String),
}

/// Why a control call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ControlError {
    #[error("no listener named `{0}`")]
    UnknownListener(String),
    #[error("no thread `{0}`")]
    UnknownThread(String),
    #[error("`{0}` has nothing to reload: native handlers are compiled in")]
    NotReloadable(String),
    #[error("reload of `{listener}` failed, the old version keeps running: {message}")]
    ReloadFailed { listener: String, message: String },
}

/// Why an organism could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    #[error("listener `{listener}`: {message}")]
    Handler { listener: String, message: String },
    #[error("an organism must be built inside a tokio runtime")]
    NoRuntime,
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
}

/// A message to inject from outside the organism.
#[derive(Debug, Clone)]
pub struct InjectRequest {
    /// The injector's identity (`api`, `ws`, `cli`, or an API key's name); never a listener.
    pub from: String,
    pub to: String,
    pub payload_xml: String,
    /// Continue this thread; `None` opens a new one.
    pub thread_id: Option<String>,
}

/// The answer to an accepted inject.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct InjectReceipt {
    pub thread_id: String,
    pub message_id: String,
}

/// A listener as observers see it: the seed's Agent object plus `kind`, `accepts` and
/// counters.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Agent)]
pub struct AgentInfo {
    pub name: String,
    pub description: String,
    pub kind: String,
    pub is_agent: bool,
    pub peers: Vec<String>,
    /// The first accepted payload type (the seed's field; see `accepts` for all).
    pub payload_class: Option<String>,
    pub accepts: Vec<String>,
    pub state: AgentState,
    pub current_thread: Option<String>,
    pub queue_depth: usize,
    pub last_activity: Option<Timestamp>,
    /// Handler calls made.
    pub handled: u64,
    /// Handler calls that failed or panicked.
    pub errors: u64,
    /// Mean handler time, milliseconds.
    pub mean_handler_ms: f64,
    /// 99th percentile handler time, milliseconds (within 25 %).
    pub p99_handler_ms: f64,
}

/// How long a list read waits for the store to commit what was published before it.
pub const READ_CATCH_UP: Duration = Duration::from_secs(1);

/// The organism as observers see it: the seed's Organism object plus our additions.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Organism)]
pub struct OrganismInfo {
    pub name: String,
    pub status: OrganismStatus,
    pub uptime_seconds: u64,
    pub started_at: Timestamp,
    pub agent_count: usize,
    pub active_threads: usize,
    pub total_messages: u64,
    /// Messages queued or being handled.
    pub pending_messages: usize,
    /// Bumped by every successful reload.
    pub config_rev: u64,
    /// The `seq` of the last event.
    pub last_seq: u64,
}

/// What `stop` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopReport {
    /// Every pending message finished within the grace period.
    pub drained: bool,
    /// Threads killed because the grace period ran out.
    pub killed_threads: usize,
    /// Changes the store could not commit by the end of the stop (a full disk, an I/O
    /// error), and the store's last error: they are not in the file.
    pub uncommitted: Option<Uncommitted>,
}

/// What a stop left out of the store (see [`StopReport::uncommitted`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uncommitted {
    /// The store's file.
    pub path: PathBuf,
    /// Changes (messages, status changes, thread states) still held by the writer.
    pub changes: usize,
    /// The last write error.
    pub error: String,
}

/// The listeners in service and the config they come from. Replaced whole by a reload;
/// readers take a snapshot ([`Shared::topo`]) and never hold the lock.
pub(crate) struct Topology {
    pub(crate) config: Arc<OrganismConfig>,
    pub(crate) listeners: crate::hash::SeededMap<ListenerName, Arc<Listener>>,
    /// Config order.
    pub(crate) order: Vec<Arc<Listener>>,
}

pub(crate) struct Shared {
    topology: std::sync::RwLock<Arc<Topology>>,
    /// Organism-wide limits: fixed for the process (changing them needs a restart).
    limits: config::Limits,
    threads: ThreadRegistry,
    events: Arc<EventHub>,
    store: Option<Arc<crate::store::Store>>,
    /// Messages logged before this process started (from the store).
    earlier_messages: u64,
    gate: gate::Gate,
    xml_limits: XmlLimits,
    pending: AtomicUsize,
    idle: Notify,
    /// Wakes the retention task: a reload changed `organism.store_retention`.
    retention_changed: Notify,
    /// Cancelled by [`Organism::stop`]: ends the background tasks.
    stopped: tokio_util::sync::CancellationToken,
    /// The background tasks (retention, store health, file watch), awaited by
    /// [`Organism::stop`], so that once it returns none of them holds the organism (nor its
    /// store, whose file is then free once the caller's handles are gone).
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    status: AtomicU8,
    paused: AtomicBool,
    failures: [AtomicU64; FailureKind::COUNT],
    runtime: tokio::runtime::Handle,
    started: std::time::Instant,
    started_at: Timestamp,
    config_rev: AtomicU64,
    /// Native handler factories, for the listeners a reload builds.
    registry: HandlerRegistry,
    /// Applied to every config a reload loads, as at build.
    overrides: Overrides,
    /// Where Lua outputs resolve: every listener in service, updated by reloads.
    lua_targets: Arc<crate::lua::OutputTargets>,
    /// One reload at a time.
    reload_lock: std::sync::Mutex<()>,
    /// The last reload failed: the file differs from what runs.
    config_stale: AtomicBool,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Replies owed by external agents.
    waits: external::Waits,
    /// [`Organism::wait_thread`] callers, woken when their thread stops being active.
    thread_waiters: std::sync::Mutex<
        crate::hash::SeededMap<String, Vec<tokio::sync::oneshot::Sender<ThreadStatus>>>,
    >,
    /// The API's base URL once a server is bound (external agents' `callback_url`).
    api_base: Arc<std::sync::OnceLock<String>>,
}

const STATUS_RUNNING: u8 = 0;
const STATUS_STOPPING: u8 = 1;
const STATUS_STOPPED: u8 = 2;

impl Shared {
    /// Error text as it is stored, published and answered: at most `limits.max_error_bytes`.
    pub(crate) fn clip_error(&self, error: String) -> String {
        crate::clip::clip(error, self.limits.max_error_bytes)
    }

    /// Puts `next` in service: routing reads it from the next snapshot on.
    pub(crate) fn set_topology(&self, next: Arc<Topology>) {
        *crate::sync::write(&self.topology) = next;
    }

    /// The listeners in service now.
    pub(crate) fn topo(&self) -> Arc<Topology> {
        crate::sync::read(&self.topology).clone()
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    fn add_pending(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::SeqCst);
    }

    /// One pending message of `thread` is done (handled, dropped or cancelled).
    fn release(&self, thread: &str) {
        if let Some(change) = self.threads.finish_one(thread) {
            self.publish_thread(change);
        }
        if self.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    fn publish_thread(&self, c: crate::threads::StatusChange) {
        if c.status != ThreadStatus::Active {
            let waiting = crate::sync::lock(&self.thread_waiters).remove(c.thread_id.as_str());
            for tx in waiting.into_iter().flatten() {
                let _ = tx.send(c.status);
            }
        }
        self.events.publish(EventKind::ThreadUpdated {
            thread_id: c.thread_id,
            status: c.status,
            message_count: c.message_count,
            error: c.error,
        });
    }

    fn count_failure(&self, kind: FailureKind) {
        self.failures[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Builds an [`Organism`]: a config (from a file or already loaded) plus native handlers.
#[derive(Default)]
pub struct OrganismBuilder {
    registry: HandlerRegistry,
    event_capacity: Option<usize>,
    overrides: Overrides,
}

/// Settings given outside the file (the command line's `--listen`, `--store`) that replace
/// the file's, at build and at every reload.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    /// `Some(None)`: memory only.
    pub store: Option<Option<std::path::PathBuf>>,
}

impl Overrides {
    pub(crate) fn apply(&self, config: &mut OrganismConfig) {
        if let Some(l) = &self.listen {
            config.listen = l.clone();
        }
        if let Some(s) = &self.store {
            config.store = s.clone();
        }
    }
}

/// Loads `path` with every check the running code knows of: `registry`'s handler names and
/// the Lua compiler's syntax check (handed to `config`, which imports neither).
pub(crate) fn load_config(
    path: &Path,
    registry: &HandlerRegistry,
) -> Result<OrganismConfig, config::ConfigErrors> {
    let handlers = registry.names();
    config::load_file(
        path,
        config::Known {
            handlers: &handlers,
            check_script: crate::lua::check_syntax,
        },
    )
}

impl OrganismBuilder {
    /// Replaces the file's `listen` / `store`, now and at every reload.
    pub fn overrides(mut self, overrides: Overrides) -> Self {
        self.overrides = overrides;
        self
    }

    /// Registers a native handler under `name`, for listeners with `handler: name`.
    pub fn handler<H: Handler>(mut self, name: &str, handler: H) -> Self {
        let shared: Arc<dyn Handler> = Arc::new(handler);
        self.registry.register(name, move |_| Ok(shared.clone()));
        self
    }

    /// Registers a handler factory that sees the listener's config.
    pub fn handler_factory<F>(mut self, name: &str, factory: F) -> Self
    where
        F: Fn(&config::ListenerConfig) -> Result<Arc<dyn Handler>, String> + Send + Sync + 'static,
    {
        self.registry.register(name, factory);
        self
    }

    /// How many events the hub retains for observers that resume with `?since=` (and buffers
    /// for observers that fall behind). Default [`DEFAULT_CAPACITY`].
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = Some(capacity);
        self
    }

    /// The native handler names available to a config.
    pub fn handler_names(&self) -> Vec<&str> {
        self.registry.names()
    }

    /// Loads and checks `path` (against this builder's handlers and the Lua compiler)
    /// without building anything: what `agentserver validate` does.
    pub fn load_config(&self, path: &Path) -> Result<OrganismConfig, config::ConfigErrors> {
        load_config(path, &self.registry)
    }

    /// Loads `path` and builds the organism. Must run inside a tokio runtime.
    pub fn load(self, path: &Path) -> Result<Organism, BuildError> {
        let config = self.load_config(path)?;
        self.build(config)
    }

    /// Builds the organism from a validated config. Must run inside a tokio runtime.
    pub fn build(self, mut config: OrganismConfig) -> Result<Organism, BuildError> {
        self.overrides.apply(&mut config);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let store = match &config.store {
            Some(path) => Some(Arc::new(crate::store::Store::open(path)?)),
            None => None,
        };
        let recovered = store.as_ref().map(|s| s.recovered()).unwrap_or_default();
        let sink: Option<crate::events::Sink> = store.clone().map(|s| {
            Box::new(move |event: &Arc<crate::events::Event>| s.record_event(event))
                as crate::events::Sink
        });
        let events = Arc::new(EventHub::with_sink(
            self.event_capacity.unwrap_or(DEFAULT_CAPACITY),
            recovered.next_seq_floor(),
            sink,
        ));
        let limits = config.limits;
        // What memory holds of history, by bytes: a quarter for the event ring, the rest for
        // finished threads' messages (the store, when on, keeps everything).
        events.set_byte_budget(limits.max_retained_bytes / 4);
        let scheduling = config.scheduling;
        let lua_targets = crate::lua::OutputTargets::of(&config);
        let config = Arc::new(config);
        let shared = Arc::new(Shared {
            // Listeners are built below, by the same code a reload uses.
            topology: std::sync::RwLock::new(Arc::new(Topology {
                config: config.clone(),
                listeners: Default::default(),
                order: Vec::new(),
            })),
            limits,
            registry: self.registry,
            overrides: self.overrides,
            lua_targets,
            reload_lock: std::sync::Mutex::new(()),
            config_stale: AtomicBool::new(false),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            threads: ThreadRegistry::new(
                limits.max_messages_per_thread,
                RETAINED_FINISHED_THREADS,
                limits.max_retained_bytes - limits.max_retained_bytes / 4,
            ),
            events,
            store,
            earlier_messages: recovered.total_messages,
            gate: gate::Gate::new(limits.max_concurrent_handlers, scheduling),
            xml_limits: XmlLimits {
                max_bytes: limits.max_message_bytes,
                max_depth: limits.max_depth,
                max_attributes: limits.max_attributes,
            },
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            retention_changed: Notify::new(),
            stopped: Default::default(),
            background: Default::default(),
            status: AtomicU8::new(STATUS_RUNNING),
            paused: AtomicBool::new(false),
            failures: Default::default(),
            runtime,
            started: std::time::Instant::now(),
            started_at: Timestamp::now(),
            config_rev: AtomicU64::new(1),
            waits: Default::default(),
            thread_waiters: Default::default(),
            api_base: Arc::default(),
        });
        let mut listeners = crate::hash::SeededMap::default();
        let mut order = Vec::new();
        for lc in &config.listeners {
            let handler =
                shared
                    .build_handler(lc, None)
                    .map_err(|message| BuildError::Handler {
                        listener: lc.name.to_string(),
                        message,
                    })?;
            let l = Arc::new(Listener::new(lc.clone(), handler, None));
            listeners.insert(lc.name.clone(), l.clone());
            order.push(l);
        }
        shared.set_topology(Arc::new(Topology {
            config,
            listeners,
            order,
        }));
        let organism = Organism { shared };
        organism.report_interrupted(&recovered);
        organism.start_retention();
        organism.watch_store_health();
        Ok(organism)
    }
}

/// A running organism. Cheap to clone: every clone is a handle on the same pump.
#[derive(Clone)]
pub struct Organism {
    shared: Arc<Shared>,
}

impl Organism {
    pub fn builder() -> OrganismBuilder {
        OrganismBuilder::default()
    }

    /// Work the last run left unfinished (SPEC §8: never silent): logged, counted as
    /// `interrupted` failures (one per message), and published as an `error` event.
    fn report_interrupted(&self, recovered: &crate::store::Recovered) {
        let (threads, messages) = (recovered.interrupted, recovered.interrupted_messages);
        if threads + messages == 0 {
            return;
        }
        let text = format!(
            "the last run ended with work unfinished: {threads} active thread(s) are now `error` and {messages} pending message(s) `failed`, both `interrupted`"
        );
        tracing::warn!(threads, messages, "{text}");
        self.shared.failures[FailureKind::Interrupted as usize]
            .fetch_add(messages, Ordering::Relaxed);
        self.shared.events.publish(EventKind::Error {
            thread_id: None,
            agent: None,
            error: text,
        });
    }

    /// The config in service (a reload replaces it).
    pub fn config(&self) -> Arc<OrganismConfig> {
        self.shared.topo().config.clone()
    }

    /// Tells the organism where its API is served (`http://host:port`), so external agents
    /// get an absolute `callback_url`. The first call wins.
    pub fn set_api_base(&self, url: &str) {
        let _ = self
            .shared
            .api_base
            .set(url.trim_end_matches('/').to_string());
    }

    pub fn events(&self) -> &EventHub {
        &self.shared.events
    }

    pub fn threads(&self) -> &ThreadRegistry {
        &self.shared.threads
    }

    /// Prunes the store every [`RETENTION_INTERVAL`] per `organism.store_retention` as the
    /// topology holds it now (a reload can add, change or remove it; it wakes this task),
    /// off the pump's threads. Ends when the organism stops.
    fn start_retention(&self) {
        let Some(store) = self.shared.store.clone() else {
            return;
        };
        let organism = self.clone();
        self.spawn_background(|stopped| async move {
            let mut tick = tokio::time::interval(RETENTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                    _ = organism.shared.retention_changed.notified() => {}
                }
                let retention = organism.shared.topo().config.retention;
                if retention == config::Retention::default() {
                    continue;
                }
                let store = store.clone();
                let pruned = tokio::task::spawn_blocking(move || {
                    store.prune(retention.max_messages, retention.max_age)
                })
                .await;
                match pruned {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "store retention failed"),
                    Err(e) => tracing::error!(error = %e, "store retention task failed"),
                }
            }
        });
    }

    /// Runs a background task on the organism's runtime. It is given a token cancelled
    /// when the organism stops, and must then end at its next wait (work under way, a
    /// retention pass or a reload, finishes first); [`Organism::stop`] waits for it.
    pub(crate) fn spawn_background<F>(
        &self,
        task: impl FnOnce(tokio_util::sync::CancellationToken) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let handle = self.shared.runtime.spawn(task(self.shared.stopped.clone()));
        let mut background = crate::sync::lock(&self.shared.background);
        background.retain(|h| !h.is_finished());
        background.push(handle);
    }

    /// Publishes an `error` event when store writes start failing, and again when they
    /// recover, checking once a second. Ends when the organism stops.
    fn watch_store_health(&self) {
        let Some(store) = self.shared.store.clone() else {
            return;
        };
        let organism = self.clone();
        self.spawn_background(|stopped| async move {
            let mut failing = false;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let failure = store.failure();
                if failure.is_some() != failing {
                    failing = failure.is_some();
                    organism.shared.events.publish(EventKind::Error {
                        thread_id: None,
                        agent: None,
                        error: match failure {
                            Some(e) => format!(
                                "store {}: writes fail, injects are refused: {e}",
                                store.path().display()
                            ),
                            None => {
                                format!("store {}: writes succeed again", store.path().display())
                            }
                        },
                    });
                }
            }
        });
    }

    /// Messages removed from the store by retention since start.
    pub fn pruned_messages(&self) -> u64 {
        self.shared.store.as_ref().map_or(0, |s| s.pruned())
    }

    /// The durable store, unless the organism runs with `store: memory`.
    pub fn store(&self) -> Option<&Arc<crate::store::Store>> {
        self.shared.store.as_ref()
    }

    /// One page of the message log: from the store when there is one, else from memory.
    pub fn query_messages(
        &self,
        filter: &crate::threads::MessageFilter,
        page: crate::threads::Page,
    ) -> Result<crate::threads::Paged<MessageRecord>, crate::store::StoreError> {
        match &self.shared.store {
            Some(store) => {
                store.catch_up(READ_CATCH_UP);
                store.query_messages(filter, page)
            }
            None => Ok(self.shared.threads.query_messages(filter, page)),
        }
    }

    /// One page of threads: from the store when there is one (after it has committed what
    /// was published before the call, [`READ_CATCH_UP`] at most), else from memory.
    pub fn query_threads(
        &self,
        filter: &crate::threads::ThreadFilter,
        page: crate::threads::Page,
    ) -> Result<crate::threads::Paged<crate::threads::ThreadInfo>, crate::store::StoreError> {
        match &self.shared.store {
            Some(store) => {
                store.catch_up(READ_CATCH_UP);
                store.query_threads(filter, page)
            }
            None => Ok(self.shared.threads.query_threads(filter, page)),
        }
    }

    /// One thread: live from memory while the organism holds it (so a thread is found the
    /// moment its inject is answered, before the store's writer commits it), else from the
    /// store.
    pub fn thread_info(
        &self,
        id: &str,
    ) -> Result<Option<crate::threads::ThreadInfo>, crate::store::StoreError> {
        match (self.shared.threads.info(id), &self.shared.store) {
            (Some(live), _) => Ok(Some(live)),
            (None, Some(store)) => store.thread(id),
            (None, None) => Ok(None),
        }
    }

    /// One page of a thread's messages in slot order, `None` for an unknown thread. What
    /// the organism holds in memory is live (every message, current statuses); slots before
    /// it (a thread continued after a restart) and threads no longer held come from the
    /// store.
    pub fn thread_page(
        &self,
        id: &str,
        page: crate::threads::Page,
    ) -> Result<Option<crate::threads::Paged<MessageRecord>>, crate::store::StoreError> {
        let filter = crate::threads::MessageFilter {
            thread: Some(id.to_string()),
            ..Default::default()
        };
        match (self.shared.threads.log(id), &self.shared.store) {
            (Some((0, live)), _) | (Some((_, live)), None) => Ok(Some(page.cut(live))),
            (Some((base, live)), Some(store)) => {
                let mut log: Vec<MessageRecord> = store
                    .query_messages(&filter, crate::threads::Page::ALL)?
                    .items
                    .into_iter()
                    .filter(|m| m.slot_index < base)
                    .collect();
                log.extend(live);
                Ok(Some(page.cut(log)))
            }
            (None, Some(store)) => match store.thread(id)? {
                Some(_) => store.query_messages(&filter, page).map(Some),
                None => Ok(None),
            },
            (None, None) => Ok(None),
        }
    }

    /// Messages queued or being handled, organism-wide.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::SeqCst)
    }

    /// How many failures of `kind` happened.
    pub fn failure_count(&self, kind: FailureKind) -> u64 {
        self.shared.failures[kind as usize].load(Ordering::Relaxed)
    }

    pub fn status(&self) -> OrganismStatus {
        match self.shared.status.load(Ordering::SeqCst) {
            STATUS_STOPPING => OrganismStatus::Stopping,
            STATUS_STOPPED => OrganismStatus::Stopped,
            _ if self.shared.is_paused() => OrganismStatus::Paused,
            _ => OrganismStatus::Running,
        }
    }

    /// The organism's identity and counters.
    pub fn info(&self) -> OrganismInfo {
        let s = &self.shared;
        let topo = s.topo();
        OrganismInfo {
            name: topo.config.name.clone(),
            status: self.status(),
            uptime_seconds: s.started.elapsed().as_secs(),
            started_at: s.started_at,
            agent_count: topo.order.len(),
            active_threads: s.threads.active_count(),
            total_messages: s.earlier_messages + s.threads.total_messages(),
            pending_messages: self.pending(),
            config_rev: s.config_rev.load(Ordering::Relaxed),
            last_seq: s.events.last_seq(),
        }
    }

    /// Every listener with its live state, in config order.
    pub fn agents(&self) -> Vec<AgentInfo> {
        self.shared
            .topo()
            .order
            .iter()
            .map(|l| self.agent_info(l))
            .collect()
    }

    /// One listener with its live state.
    pub fn agent(&self, name: &str) -> Result<AgentInfo, ControlError> {
        Ok(self.agent_info(self.listener(name)?.as_ref()))
    }

    /// Each listener's handler-specific metrics (Lua calls, errors by kind, memory, …).
    pub fn handler_metrics(&self) -> Vec<(String, Vec<crate::listener::HandlerMetric>)> {
        self.shared
            .topo()
            .order
            .iter()
            .map(|l| (l.name().to_string(), l.handler.metrics()))
            .filter(|(_, m)| !m.is_empty())
            .collect()
    }

    /// The handler-time histogram of a listener.
    pub fn handler_time(&self, name: &str) -> Option<Arc<crate::stats::Histogram>> {
        self.shared
            .topo()
            .listeners
            .get(name)
            .map(|l| l.stats.handler_time.clone())
    }

    fn agent_info(&self, l: &Listener) -> AgentInfo {
        let snap = l.snapshot(self.shared.is_paused());
        let time = l.stats.handler_time.summary();
        let last = l.stats.last_activity.load(Ordering::Relaxed);
        let accepts: Vec<String> = l
            .config
            .accepts
            .iter()
            .map(|(t, _)| t.to_string())
            .collect();
        AgentInfo {
            name: l.name().to_string(),
            description: l.config.description.clone(),
            kind: l.config.kind.to_string(),
            is_agent: l.config.agent,
            peers: l
                .config
                .peers
                .iter()
                .flatten()
                .map(|p| p.to_string())
                .collect(),
            payload_class: accepts.first().cloned(),
            accepts,
            state: snap.state,
            current_thread: snap.current_thread,
            queue_depth: snap.queue_depth,
            last_activity: (last > 0).then_some(Timestamp(last)),
            handled: l.stats.handled.load(Ordering::Relaxed),
            errors: l.stats.errors.load(Ordering::Relaxed),
            mean_handler_ms: time.mean_ms,
            p99_handler_ms: time.p99_ms,
        }
    }

    /// Injects one payload for a listener. Validated before this returns: an accepted inject
    /// is queued and logged; a refused one is counted and published as an `error` event.
    pub fn inject(&self, req: InjectRequest) -> Result<InjectReceipt, InjectError> {
        let result = (|| {
            let payload = normalize_payload(&req.payload_xml, &self.shared.xml_limits)?;
            self.inject_normalized(&req.from, &req.to, payload, req.thread_id.as_deref())
        })();
        self.note_refusal(&result, &req.to);
        result
    }

    /// Injects a whole `<message>` envelope. The envelope's `from` is ignored: the message is
    /// from `identity`. Its `thread`, if any, names the thread to continue.
    pub fn inject_envelope(&self, identity: &str, xml: &str) -> Result<InjectReceipt, InjectError> {
        let mut to = String::new();
        let result = (|| {
            let env = parse_envelope(xml, &self.shared.xml_limits)?;
            to = env.to.clone().ok_or(InjectError::NoTarget)?;
            self.inject_normalized(identity, &to, env.payload, env.thread.as_deref())
        })();
        self.note_refusal(&result, &to);
        result
    }

    fn note_refusal(&self, result: &Result<InjectReceipt, InjectError>, to: &str) {
        if let Err(e) = result {
            self.shared.count_failure(FailureKind::InjectRefused);
            self.shared.events.publish(EventKind::Error {
                thread_id: None,
                agent: Some(to.to_string()).filter(|t| !t.is_empty()),
                error: self.shared.clip_error(format!("inject refused: {e}")),
            });
        }
    }

    fn inject_normalized(
        &self,
        from: &str,
        to: &str,
        payload: NormalizedPayload,
        thread_id: Option<&str>,
    ) -> Result<InjectReceipt, InjectError> {
        let s = &self.shared;
        if s.status.load(Ordering::SeqCst) != STATUS_RUNNING {
            return Err(InjectError::Stopping);
        }
        let topo = s.topo();
        if topo.listeners.contains_key(from) || from.is_empty() || from == SYSTEM_IDENTITY {
            return Err(InjectError::ForgedIdentity(from.to_string()));
        }
        let listener = topo
            .listeners
            .get(to)
            .cloned()
            .ok_or_else(|| InjectError::UnknownListener(to.to_string()))?;
        let schema = listener
            .config
            .schema_for(&payload.payload_type)
            .ok_or_else(|| InjectError::NotAccepted {
                listener: to.to_string(),
                payload_type: payload.payload_type.to_string(),
            })?;
        let valid = schema.validate(payload).map_err(InjectError::Invalid)?;
        if let Some(store) = &s.store {
            if let Some(e) = store.failure() {
                return Err(InjectError::StoreFailed(e));
            }
            if store.backlogged() {
                return Err(InjectError::StoreBehind);
            }
            // A thread from before a restart, or evicted from memory, continues where its
            // stored history ends.
            if let Some(id) = thread_id.filter(|id| !s.threads.contains(id)) {
                if let Ok(Some(info)) = store.thread(id) {
                    s.threads.adopt(&info);
                }
            }
        }
        let pending = s.pending.load(Ordering::SeqCst);
        if pending >= s.limits.max_pending_messages {
            return Err(InjectError::Overloaded {
                pending,
                max: s.limits.max_pending_messages,
            });
        }
        let opened = s.threads.open(thread_id)?;
        if let Some(info) = opened.created {
            s.events.publish(EventKind::ThreadCreated { thread: info });
        }
        if let Some(change) = opened.reactivated {
            s.publish_thread(change);
        }
        let record = s.threads.append(
            &opened.id,
            NewMessage {
                id: route::new_id(),
                parent_id: None,
                from: Arc::from(from),
                to: Some(listener.config.name.arc()),
                payload_type: Some(valid.payload_type().to_string()),
                payload_xml: valid.xml_arc(),
                status: MessageStatus::Pending,
                error: None,
                schema: Some(schema.clone()),
            },
        )?;
        s.events.publish(EventKind::Message {
            message: record.clone(),
        });
        if record.status != MessageStatus::Pending {
            // Over the thread's budget: logged as failed; the thread settles.
            if let Some(change) = s.threads.settle(&opened.id) {
                s.publish_thread(change);
            }
            return Err(InjectError::Thread(ThreadError::BudgetExceeded {
                id: opened.id.to_string(),
                max: s.limits.max_messages_per_thread,
            }));
        }
        let receipt = InjectReceipt {
            thread_id: opened.id.to_string(),
            message_id: record.id.to_string(),
        };
        s.add_pending(1);
        s.enqueue(
            &listener,
            dispatch::Job {
                record,
                payload: valid,
            },
        );
        Ok(receipt)
    }

    fn listener(&self, name: &str) -> Result<Arc<Listener>, ControlError> {
        self.shared
            .topo()
            .listeners
            .get(name)
            .cloned()
            .ok_or_else(|| ControlError::UnknownListener(name.to_string()))
    }

    /// Pauses one listener: its messages wait in its queue.
    pub fn pause_listener(&self, name: &str) -> Result<(), ControlError> {
        let l = self.listener(name)?;
        l.set_paused(true);
        self.shared.kick(&l);
        Ok(())
    }

    /// Resumes one listener: its queue is delivered in order.
    pub fn resume_listener(&self, name: &str) -> Result<(), ControlError> {
        let l = self.listener(name)?;
        l.set_paused(false);
        self.shared.kick(&l);
        Ok(())
    }

    /// Reloads one listener's code (a Lua script: new sandboxes are built and `init` run
    /// beside the old ones, then swapped in; calls in flight finish on the old ones). On any
    /// error the old code keeps running. Either way a `reload` event says what happened.
    pub fn reload_listener(&self, name: &str) -> Result<(), ControlError> {
        let l = self.listener(name)?;
        let result = match l.handler.reload() {
            None => return Err(ControlError::NotReloadable(name.to_string())),
            Some(r) => r,
        };
        self.shared.events.publish(EventKind::Reload {
            agent: Some(name.to_string()),
            ok: result.is_ok(),
            error: result.as_ref().err().cloned(),
            problems: Vec::new(),
            diff: None,
        });
        result.map_err(|message| ControlError::ReloadFailed {
            listener: name.to_string(),
            message,
        })
    }

    /// Pauses every listener.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        self.after_organism_state_change();
    }

    /// Resumes the organism (listeners paused one by one stay paused).
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
        self.after_organism_state_change();
    }

    fn after_organism_state_change(&self) {
        self.shared.events.publish(EventKind::OrganismState {
            status: self.status(),
        });
        for l in &self.shared.topo().order {
            self.shared.kick(l);
        }
    }

    /// Kills a thread: queued messages dropped (logged `killed`), running handlers cancelled,
    /// further injects refused. Killing a killed thread is a no-op.
    pub fn kill_thread(&self, id: &str) -> Result<(), ControlError> {
        let s = &self.shared;
        if let Some(store) = s.store.as_ref().filter(|_| !s.threads.contains(id)) {
            if let Ok(Some(info)) = store.thread(id) {
                s.threads.adopt(&info);
            }
        }
        let change = s
            .threads
            .kill(id)
            .map_err(|_| ControlError::UnknownThread(id.to_string()))?;
        let Some(change) = change else { return Ok(()) };
        s.publish_thread(change);
        s.drop_waits(id);
        for l in &s.topo().order {
            for job in l.drop_thread(id) {
                s.finish_message(
                    &job.record,
                    MessageStatus::Killed,
                    Some("thread killed".into()),
                );
                s.count_failure(FailureKind::Killed);
                s.release(id);
            }
            s.kick(l);
        }
        Ok(())
    }

    /// Waits until the thread is no longer active; returns its status (`None`: no such thread).
    /// Each waiter is woken by its own thread's change only, so many waiters cost nothing per
    /// event.
    pub async fn wait_thread(&self, id: &str) -> Option<ThreadStatus> {
        loop {
            match self.shared.threads.status(id) {
                Some(ThreadStatus::Active) => {}
                other => return other,
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            crate::sync::lock(&self.shared.thread_waiters)
                .entry(id.to_string())
                .or_default()
                .push(tx);
            // It may have settled between the check and the registration: then withdraw.
            match self.shared.threads.status(id) {
                Some(ThreadStatus::Active) => {}
                other => {
                    drop(rx);
                    let mut w = crate::sync::lock(&self.shared.thread_waiters);
                    if let Some(list) = w.get_mut(id) {
                        list.retain(|tx| !tx.is_closed());
                        if list.is_empty() {
                            w.remove(id);
                        }
                    }
                    return other;
                }
            }
            match rx.await {
                Ok(status) if status != ThreadStatus::Active => return Some(status),
                // Dropped (the organism went away) or reactivated: look again.
                _ => {
                    if self.status() == OrganismStatus::Stopped {
                        return self.shared.threads.status(id);
                    }
                }
            }
        }
    }

    /// The thread's messages, in slot order.
    pub fn thread_messages(&self, id: &str) -> Option<Vec<MessageRecord>> {
        self.shared.threads.messages(id)
    }

    /// Graceful stop: refuse new injects, let pending work finish within the grace period
    /// (`limits.stop_grace_ms`), then kill what remains, end the background tasks and
    /// flush the store. Once it has returned and every handle is dropped, the store's file
    /// is free for another organism. Idempotent.
    pub async fn stop(&self) -> StopReport {
        let s = &self.shared;
        if s.status
            .compare_exchange(
                STATUS_RUNNING,
                STATUS_STOPPING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            self.wait_idle(Duration::from_millis(s.limits.stop_grace_ms))
                .await;
            return StopReport {
                drained: self.pending() == 0,
                killed_threads: 0,
                uncommitted: None,
            };
        }
        s.events.publish(EventKind::OrganismState {
            status: OrganismStatus::Stopping,
        });
        let grace = Duration::from_millis(s.limits.stop_grace_ms);
        let held = self.paused_backlog();
        tracing::info!(pending = self.pending(), paused_backlog = ?held, grace_ms = s.limits.stop_grace_ms, "stopping: draining what can move");
        let drained = self.wait_drained(grace).await;
        let mut killed_threads = 0;
        if !drained {
            for id in s.threads.active_ids() {
                if self.kill_thread(&id).is_ok() {
                    killed_threads += 1;
                }
            }
            // Cancelled handlers return promptly; give them a moment to record it.
            self.wait_idle(Duration::from_secs(1)).await;
        }
        s.status.store(STATUS_STOPPED, Ordering::SeqCst);
        s.events.publish(EventKind::OrganismState {
            status: OrganismStatus::Stopped,
        });
        s.stopped.cancel();
        let background = std::mem::take(&mut *crate::sync::lock(&s.background));
        for task in background {
            let _ = task.await;
        }
        let mut uncommitted = None;
        if let Some(store) = s.store.clone() {
            let last = s.events.last_seq();
            let flushed = store.clone();
            let _ = tokio::task::spawn_blocking(move || flushed.flush(last)).await;
            uncommitted = store.failure().map(|error| Uncommitted {
                path: store.path().to_path_buf(),
                changes: store.queued(),
                error,
            });
        }
        StopReport {
            drained,
            killed_threads,
            uncommitted,
        }
    }

    /// The listeners whose queues cannot drain because they (or the organism) are paused,
    /// with how many messages each holds.
    pub fn paused_backlog(&self) -> Vec<(String, usize)> {
        let organism_paused = self.shared.is_paused();
        self.shared
            .topo()
            .order
            .iter()
            .map(|l| (l.name().to_string(), l.held_by_pause(organism_paused)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Waits until nothing is pending but what paused queues hold, up to `limit`: messages
    /// that cannot start do not hold a stop for its grace period. Returns whether nothing at
    /// all is pending then.
    async fn wait_drained(&self, limit: Duration) -> bool {
        let held = || self.paused_backlog().iter().map(|(_, n)| n).sum::<usize>();
        // Idle is announced at zero only: a paused backlog is looked at again often.
        self.wait_for(
            limit,
            || self.pending() <= held(),
            Some(Duration::from_millis(50)),
        )
        .await;
        self.pending() == 0
    }

    /// Waits until nothing is pending, up to `limit`. Returns whether it got there.
    async fn wait_idle(&self, limit: Duration) -> bool {
        self.wait_for(limit, || self.pending() == 0, None).await
    }

    /// Waits until `done` holds, up to `limit`, looking again whenever the organism goes
    /// idle (and every `every`, if given). Returns whether `done` held.
    async fn wait_for(
        &self,
        limit: Duration,
        done: impl Fn() -> bool,
        every: Option<Duration>,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done() {
                return true;
            }
            let look_again = every.map_or(deadline, |e| {
                (tokio::time::Instant::now() + e).min(deadline)
            });
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(look_again) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return done();
            }
        }
    }
}
