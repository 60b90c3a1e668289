//! Building an organism: the handler registry, overrides, loading the file, and start-up.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::config;
use crate::config::OrganismConfig;
use crate::events::{EventHub, DEFAULT_CAPACITY};
use crate::listener::{Handler, HandlerRegistry};
use crate::threads::ThreadRegistry;
use crate::time::Timestamp;

use super::dispatch::Listener;
use super::{
    gate, BuildError, Externals, Lifecycle, Load, Organism, Reloading, Shared, Topology,
    RETAINED_FINISHED_THREADS, STATUS_RUNNING,
};

/// Builds an [`Organism`]: a config (from a file or already loaded) plus native handlers.
#[derive(Default)]
pub struct OrganismBuilder {
    registry: HandlerRegistry,
    event_capacity: Option<usize>,
    overrides: Overrides,
    clock: crate::time::Clock,
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
    load_config_layered(path, registry, &[])
}

/// [`load_config`] with the API's agents laid over the file's listeners.
pub(crate) fn load_config_layered(
    path: &Path,
    registry: &HandlerRegistry,
    layer: &[config::layer::LayerListener],
) -> Result<OrganismConfig, config::ConfigErrors> {
    let handlers = registry.names();
    let config = config::load_file_layered(
        path,
        config::Known {
            handlers: &handlers,
            check_script: crate::lua::check_syntax,
        },
        layer,
    )?;
    // A native handler's own `config` (a template's `output`, say) is checked by building
    // it, so `validate` refuses what `run` would, with the line.
    let problems: Vec<config::ConfigError> = config
        .listeners
        .iter()
        .filter(|l| l.kind == config::ListenerKind::Native)
        .filter_map(|l| {
            registry.build(l).err().map(|e| {
                config::ConfigError::about(&config, Some(l.name.as_str()), Some("config"), e)
            })
        })
        .collect();
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(config::ConfigErrors(problems))
    }
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

    /// The clock the organism's wall-clock timers (approval timeouts) read: the system's
    /// by default; a test gives a [`crate::time::Clock::manual`] one to cross a timeout.
    pub fn clock(mut self, clock: crate::time::Clock) -> Self {
        self.clock = clock;
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

    /// Loads `path`, with the agents created through the API (kept in its store) over its
    /// listeners, and builds the organism. Must run inside a tokio runtime.
    pub fn load(self, path: &Path) -> Result<Organism, BuildError> {
        let config = self.load_config(path)?;
        self.build(config)
    }

    /// Builds the organism from a validated config, with the agents created through the API
    /// (kept in its store) laid over its file's listeners, as [`OrganismBuilder::load`] and a
    /// reload do: every start takes this path. Must run inside a tokio runtime.
    pub fn build(self, mut config: OrganismConfig) -> Result<Organism, BuildError> {
        self.overrides.apply(&mut config);
        let agents = super::agents::ApiAgents::for_config(&config)?;
        if config.layer.is_empty() {
            if let Some(path) = config.source.clone() {
                let layer = agents.layer(None)?;
                if !layer.is_empty() {
                    config = load_config_layered(&path, &self.registry, &layer)?;
                }
            }
        }
        self.build_with(config, agents)
    }

    fn build_with(
        self,
        mut config: OrganismConfig,
        agents: super::agents::ApiAgents,
    ) -> Result<Organism, BuildError> {
        self.overrides.apply(&mut config);
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let store = match &config.store {
            Some(path) => Some(Arc::new(crate::store::Store::open(path)?)),
            None => None,
        };
        if let Some(s) = &store {
            s.set_read_budget(std::time::Duration::from_millis(config.limits.max_query_ms));
            s.search_payloads(config.payload_search)?;
            // Threads from before the store kept their tenants get them (once).
            let tenants = config.listeners.iter();
            s.adopt_owners(tenants.filter_map(|l| Some((l.name.as_str(), l.tenant.as_deref()?))))?;
        }
        let recovered = store.as_ref().map(|s| s.recovered()).unwrap_or_default();
        let inputs_table = match &config.store {
            Some(path) => Some(crate::store::inputs::InputsTable::open(path)?),
            None => None,
        };
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
        let stopped = tokio_util::sync::CancellationToken::new();
        let placed = config
            .nats
            .as_ref()
            .map(|n| crate::nats::Placed::start(n, &config.name, stopped.clone()));
        let usage = store
            .clone()
            .map(|s| Arc::new(super::history::StoredUsage(s)) as Arc<dyn crate::llm::UsageSource>);
        let budgets = Arc::new(crate::llm::Budgets::new(config.tenants.clone(), usage));
        // Each tenant's windows read from the usage account now, at start, rather than on
        // an inject's thread later.
        for t in config.llm_tenants() {
            budgets.state(t);
        }
        let shared = Arc::new_cyclic(|me| Shared {
            history: Arc::new(super::history::ThreadLog(me.clone())),
            budgets,
            placed,
            // Listeners are built below, by the same code a reload uses.
            topology: std::sync::RwLock::new(Arc::new(Topology {
                config: config.clone(),
                listeners: Default::default(),
                order: Vec::new(),
            })),
            limits,
            threads: ThreadRegistry::new(
                limits.max_messages_per_thread,
                RETAINED_FINISHED_THREADS,
                limits.max_retained_bytes - limits.max_retained_bytes / 4,
            ),
            events,
            store,
            gate: gate::Gate::new(limits.max_concurrent_handlers, scheduling),
            xml_limits: limits.xml_limits(),
            life: Lifecycle {
                status: AtomicU8::new(STATUS_RUNNING),
                paused: AtomicBool::new(false),
                stopped,
                background: Default::default(),
                maintenance: Default::default(),
                runtime,
                started: std::time::Instant::now(),
                started_at: Timestamp::now(),
            },
            load: Load {
                pending: AtomicUsize::new(0),
                pending_bytes: AtomicUsize::new(0),
                idle: Notify::new(),
                failures: Default::default(),
                earlier_messages: recovered.total_messages,
            },
            reloading: Reloading {
                registry: self.registry,
                overrides: self.overrides,
                lua_targets,
                reload_lock: std::sync::Mutex::new(()),
                config_stale: AtomicBool::new(false),
                reloads_ok: AtomicU64::new(0),
                reloads_failed: AtomicU64::new(0),
                config_rev: AtomicU64::new(1),
                agents,
            },
            external: Externals {
                waits: Default::default(),
                callbacks: Arc::default(),
            },
            thread_waiters: Default::default(),
            inbox: super::inputs::Inbox::new(inputs_table, self.clock),
            client_ids: Default::default(),
        });
        let (listeners, order) = build_listeners(&shared, &config)?;
        shared.set_topology(Arc::new(Topology {
            config,
            listeners,
            order,
        }));
        let organism = Organism { shared };
        organism.begin(&recovered);
        Ok(organism)
    }
}

/// A topology's listeners: by name, and in config order.
type Built = (
    crate::hash::SeededMap<crate::config::ListenerName, Arc<Listener>>,
    Vec<Arc<Listener>>,
);

/// Every listener of `config`, built by the code a reload uses, by name and in config order.
fn build_listeners(shared: &Shared, config: &OrganismConfig) -> Result<Built, BuildError> {
    let mut listeners = crate::hash::SeededMap::default();
    let mut order = Vec::new();
    for lc in &config.listeners {
        let handler = shared
            .build_handler(lc, None)
            .map_err(|message| BuildError::Handler {
                listener: lc.name.to_string(),
                message,
            })?;
        let l = Arc::new(Listener::new(lc.clone(), handler, None));
        listeners.insert(lc.name.clone(), l.clone());
        order.push(l);
    }
    Ok((listeners, order))
}

impl Organism {
    /// What a built organism starts: watching its workers, reporting what a past run left
    /// unfinished, keeping its file's scripts as versions, and the store's maintenance.
    fn begin(&self, recovered: &crate::store::Recovered) {
        if self.shared.placed.is_some() {
            self.watch_placed();
        }
        self.report_interrupted(recovered);
        self.shared.restore_inputs();
        self.expire_inputs();
        self.account_work();
        self.shared.note_file_scripts(|_| true);
        if let Some(store) = &self.shared.store {
            let maintenance = store.start_maintenance(
                &self.shared.life.runtime,
                self.shared.events.clone(),
                self.shared.topo().config.retention,
            );
            *crate::sync::lock(&self.shared.life.maintenance) = Some(maintenance);
        }
    }
}
