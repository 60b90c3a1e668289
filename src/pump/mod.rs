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
//!
//! ## Inside
//!
//! `mod.rs`: `Organism` (a cheap `Arc<Shared>` handle) and its views (info, agents, metrics);
//! `Shared`, in named sub-states; the `Topology` (config + listeners in service) that a reload
//! replaces whole, read as a snapshot (`Shared::topo`). `builder.rs` builds an organism;
//! `inject.rs` checks what comes from outside; `admit.rs` is the one front door (log as
//! pending, publish, count, queue) that inject and routed delivery share; `route.rs`: ingress
//! of handler outputs, routing, validation per receiver, the failure path and `<huh>`
//! (`Organism::route_preview` answers the routing step without sending); `dispatch.rs`:
//! per-listener queues and worker tasks; `gate.rs`: the organism-wide handler limit and the
//! breadth/depth-first choice; `control.rs`: pause, resume, reload one listener, kill, stop;
//! `history.rs`: pages of the log and one thread; `background.rs`: the organism's background
//! tasks (the file watch); `reload.rs`: hot reload (build beside, diff by fingerprint, swap, hand over
//! from retired listeners) and the file watch; `external.rs`: replies owed by external agents
//! (`Waits`, keyed by agent and thread) and `Organism::external_reply`, the callback path:
//! checks, then all payloads validated before any is routed as the agent's output.

mod admit;
pub mod agents;
mod background;
mod builder;
mod client_ids;
mod control;
mod dispatch;
mod external;
mod fork;
mod gate;
mod history;
mod inject;
mod inputs;
mod metered;
mod metrics;
mod reload;
mod retry;
mod rewind;
mod route;
mod settings;
mod work;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::{self, ConfigErrors, ListenerName, OrganismConfig};
use crate::events::{AgentState, EventHub, EventKind, OrganismStatus};
use crate::listener::HandlerRegistry;
use crate::schema::ValidationError;
use crate::threads::{ThreadError, ThreadRegistry, ThreadStatus};
use crate::time::Timestamp;
use crate::xml::{XmlError, XmlLimits};

pub use crate::store::RETENTION_INTERVAL;
pub use agents::Uploads;
pub(crate) use builder::load_config_layered;
pub use builder::{OrganismBuilder, Overrides};
pub use control::Control;
use dispatch::Listener;
pub use dispatch::ListenerSnapshot;
pub use external::{ExternalReply, ReplyError, ReplyReceipt};
pub use fork::{ForkCopy, ForkError, ForkPlan, ForkRequest};
pub use history::History;
pub use inputs::{notify_signature, Answer, DecideError, Decider, Inputs, Verdict};
pub use metrics::Metrics;
pub use reload::{ReloadError, ReloadProblem, ReloadReport};
pub use retry::{RetryError, RetryPlan, MAX_RETRY_DEPTH};
pub use rewind::{IfActive, RewindError, RewindPlan, RewindRequest};
pub use route::SYSTEM_IDENTITY;
pub use settings::{SettingsError, SettingsPatch};

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
    #[error(
        "over load: {bytes} bytes of payloads pending (limit {max}: limits.max_pending_bytes)"
    )]
    OverloadedBytes { bytes: usize, max: usize },
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
    #[error("{0}")]
    Label(#[from] crate::threads::LabelError),
    #[error("the envelope has no <to>: say which listener receives it")]
    NoTarget,
    #[error(
        "thread `{0}` is busy (work queued or running), and the inject said `if_busy: reject`"
    )]
    ThreadBusy(String),
    #[error("a message with the id `{0}` exists: a message id names one message")]
    MessageIdTaken(String),
    #[error("the message store is behind; try again shortly")]
    StoreBehind,
    #[error("the message store cannot write, so nothing new is accepted: {0}")]
    StoreFailed(String),
    #[error("{0}")]
    BudgetExhausted(crate::llm::Exhausted),
}

/// What an inject does to a thread with work queued or running ([`Control::steer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfBusy {
    /// Queue after the work under way.
    Enqueue,
    /// Refuse the inject.
    Reject,
    /// Supersede the thread's queued messages (running handlers finish), then deliver.
    Interrupt,
    /// Abort the thread first.
    Rollback,
}

/// Why a control call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ControlError {
    #[error("no listener named `{0}`")]
    UnknownListener(String),
    #[error("no thread `{0}`")]
    UnknownThread(String),
    #[error("thread `{0}` was killed: a killed thread cannot be aborted")]
    ThreadKilled(String),
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectReceipt {
    /// Shared with the thread's records (not copied).
    pub thread_id: Arc<str>,
    pub message_id: Arc<str>,
}

/// A listener as observers see it: the seed's Agent object plus `kind`, `accepts` and
/// counters.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone)]
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
/// A snapshot of which schema each listener accepts each payload type with
/// ([`Organism::schemas`]).
#[derive(Clone)]
pub struct PayloadSchemas(Arc<Topology>);

impl PayloadSchemas {
    /// The schema `listener` accepts `payload_type` (`{namespace}Local` or `Local`) with;
    /// `None` when `listener` is not a listener in service or does not accept that type.
    pub fn get(&self, listener: &str, payload_type: &str) -> Option<&Arc<crate::schema::Schema>> {
        let l = self.0.listeners.get(listener)?;
        l.config
            .accepts
            .iter()
            .find(|(t, _)| t.is_written_as(payload_type))
            .map(|(_, s)| s)
    }
}

pub(crate) struct Topology {
    pub(crate) config: Arc<OrganismConfig>,
    pub(crate) listeners: crate::hash::SeededMap<ListenerName, Arc<Listener>>,
    /// Config order.
    pub(crate) order: Vec<Arc<Listener>>,
}

pub(crate) struct Shared {
    /// Threads' messages as handlers read them (an LLM's context).
    history: Arc<dyn crate::llm::ThreadHistory>,
    /// Tenants' token budgets, for their LLM listeners' calls.
    budgets: Arc<crate::llm::Budgets>,
    topology: std::sync::RwLock<Arc<Topology>>,
    /// Organism-wide limits: fixed for the process (changing them needs a restart).
    limits: config::Limits,
    threads: ThreadRegistry,
    events: Arc<EventHub>,
    store: Option<Arc<crate::store::Store>>,
    gate: gate::Gate,
    xml_limits: XmlLimits,
    life: Lifecycle,
    load: Load,
    reloading: Reloading,
    external: Externals,
    /// The link to workers, with `organism.nats` (fixed for the process).
    placed: Option<Arc<crate::nats::Placed>>,
    /// [`History::wait_thread`](history::History::wait_thread) callers, woken when their thread stops being active.
    thread_waiters: std::sync::Mutex<
        crate::hash::SeededMap<String, Vec<tokio::sync::oneshot::Sender<ThreadStatus>>>,
    >,
    /// Messages held at approval gates, and their decisions.
    inbox: inputs::Inbox,
    /// Message ids chosen by clients, taken lately.
    client_ids: client_ids::ClientIds,
}

/// Running, stopping or stopped, and paused: written by build, `pause`/`resume` and `stop`;
/// read by inject (refused unless running) and dispatch (nothing starts while paused).
struct Lifecycle {
    status: AtomicU8,
    paused: AtomicBool,
    /// Cancelled by [`Organism::stop`]: ends the background tasks.
    stopped: tokio_util::sync::CancellationToken,
    /// The background tasks (the file watch), awaited by [`Organism::stop`], so that once it
    /// returns none of them holds the organism.
    background: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The store's own tasks (retention, health), told of retention changes by reloads and
    /// stopped by [`Organism::stop`], so that once it returns nothing holds the store and
    /// its file is free once the caller's handles are gone.
    maintenance: std::sync::Mutex<Option<crate::store::Maintenance>>,
    runtime: tokio::runtime::Handle,
    started: std::time::Instant,
    started_at: Timestamp,
}

/// The work in flight and what became of it: written by the pump for every message
/// (admitted, finished, failed); read by inject (the pending cap), stop (draining) and the
/// API's metrics.
struct Load {
    pending: AtomicUsize,
    /// The bytes of the pending messages' payloads.
    pending_bytes: AtomicUsize,
    /// Woken when `pending` reaches 0.
    idle: Notify,
    failures: [AtomicU64; FailureKind::COUNT],
    /// Messages logged before this process started (from the store).
    earlier_messages: u64,
}

/// What a reload needs and leaves behind: written by reloads, one at a time
/// (`reload_lock`); read by the API (`config_rev`, `config_stale`, the counters).
struct Reloading {
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
    config_rev: AtomicU64,
    /// The agents created through the API: the layer every reload lays over the file.
    agents: agents::ApiAgents,
}

/// External agents: the replies they owe (written when a delivery is forwarded, taken by
/// the callback), and where their callbacks go (set once, when the API server binds).
struct Externals {
    /// Replies owed by external agents.
    waits: external::Waits,
    /// Where external agents' callbacks go, once an API server is bound.
    callbacks: Arc<std::sync::OnceLock<crate::listener::CallbackUrl>>,
}

const STATUS_RUNNING: u8 = 0;
const STATUS_STOPPING: u8 = 1;
const STATUS_STOPPED: u8 = 2;

impl Shared {
    /// Error text as it is stored, published and answered: at most `limits.max_error_bytes`.
    pub(crate) fn clip_error(&self, error: String) -> String {
        crate::clip::clip(error, self.limits.max_error_bytes)
    }

    /// Says what went wrong, in a thread or at a listener if given, as an `error` event,
    /// its text clipped as [`Shared::clip_error`] does.
    pub(crate) fn say_error(&self, thread_id: Option<&str>, agent: Option<&str>, error: String) {
        self.events.publish(EventKind::Error {
            thread_id: thread_id.map(str::to_string),
            agent: agent.map(str::to_string),
            error: self.clip_error(error),
        });
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
        self.life.paused.load(Ordering::SeqCst)
    }

    /// One more message pending, its payload `bytes` long.
    fn add_pending(&self, bytes: usize) {
        self.load.pending_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.load.pending.fetch_add(1, Ordering::SeqCst);
    }

    /// One pending message of `record`'s thread is done (handled, dropped or cancelled):
    /// `record` is the one [`Self::add_pending`] counted.
    fn release(&self, record: &crate::threads::MessageRecord) {
        if let Some(change) = self.threads.finish_one(&record.thread_id) {
            self.publish_thread(change);
        }
        crate::sync::take_off(&self.load.pending_bytes, record.payload_xml.len());
        if self.load.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.load.idle.notify_waiters();
        }
    }

    fn publish_thread(&self, c: crate::threads::StatusChange) {
        if c.status != ThreadStatus::Active {
            let waiting = crate::sync::lock(&self.thread_waiters).remove(&*c.thread_id);
            for tx in waiting.into_iter().flatten() {
                let _ = tx.send(c.status);
            }
        }
        self.events.publish(EventKind::ThreadUpdated {
            thread_id: c.thread_id,
            status: c.status,
            message_count: c.message_count,
            error: c.error,
            paused: c.paused,
            labels: c.labels,
        });
    }

    fn count_failure(&self, kind: FailureKind) {
        self.load.failures[kind as usize].fetch_add(1, Ordering::Relaxed);
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

    /// The time on the organism's clock (the system's, unless a test set its own): what
    /// timeouts and windows are counted on.
    pub fn now(&self) -> crate::time::Timestamp {
        self.shared.inbox.clock.now()
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
        self.shared.load.failures[FailureKind::Interrupted as usize]
            .fetch_add(messages, Ordering::Relaxed);
        self.shared.say_error(None, None, text);
    }

    /// The config in service (a reload replaces it).
    pub fn config(&self) -> Arc<OrganismConfig> {
        self.shared.topo().config.clone()
    }

    /// Tells the organism where external agents' callbacks go (the API serving the callback
    /// route sets it when it binds), so each delivery carries an absolute `callback_url`.
    /// The first call wins.
    pub fn set_callback_url(&self, url: crate::listener::CallbackUrl) {
        let _ = self.shared.external.callbacks.set(url);
    }

    /// The schemas the listeners in service now accept their payload types with: what types
    /// a message's JSON view.
    pub fn schemas(&self) -> PayloadSchemas {
        PayloadSchemas(self.shared.topo())
    }

    /// The event hub, shared: for an observer that outlives a borrow (the event mirror).
    pub fn event_hub(&self) -> Arc<EventHub> {
        self.shared.events.clone()
    }

    /// Says what went wrong as an `error` event, its text clipped to
    /// `limits.max_error_bytes`, for a part of the server outside the pump.
    pub fn say_error(&self, error: String) {
        self.shared.say_error(None, None, error);
    }

    pub fn events(&self) -> &EventHub {
        &self.shared.events
    }

    pub fn threads(&self) -> &ThreadRegistry {
        &self.shared.threads
    }

    pub fn status(&self) -> OrganismStatus {
        match self.shared.life.status.load(Ordering::SeqCst) {
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
            uptime_seconds: s.life.started.elapsed().as_secs(),
            started_at: s.life.started_at,
            agent_count: topo.order.len(),
            active_threads: s.threads.active_count(),
            total_messages: s.load.earlier_messages + s.threads.total_messages(),
            pending_messages: self.metrics().pending(),
            config_rev: s.reloading.config_rev.load(Ordering::Relaxed),
            last_seq: s.events.last_seq(),
        }
    }

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
}
