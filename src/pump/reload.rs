//! Hot reload of the whole organism (SPEC §12): build beside, diff, swap, hand over.
//!
//! 1. **Build before touching.** The file is loaded and checked (every XSD compiled, every
//!    script compiled), and a handler is built for every added or changed listener (Lua
//!    sandboxes start and run `init`). Any problem, or a change to a setting that needs a
//!    restart, and nothing changes.
//! 2. **Diff** by listener, on a fingerprint taken when each listener was built (its config,
//!    its schemas' text, its script's text).
//! 3. **Swap** the [`Topology`] in one write. Routing reads snapshots, so a message is routed
//!    either by the old listeners or by the new ones.
//! 4. **Hand over.** An unchanged listener is the same object: its queue, calls in flight and
//!    counters are untouched. A changed one is retired in favour of its successor, which takes
//!    its queued jobs (re-validated if its schemas changed), its owed replies and its counters;
//!    calls in flight finish on the old handler, and their threads stay busy at the successor
//!    until they do, so one thread is still handled one message at a time. A removed one is
//!    retired with no successor: calls in flight finish, queued jobs become undeliverable.
//!    A job routed to a retired listener just before the swap follows the same rule.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::dispatch::{Job, Listener};
use super::{FailureKind, Organism, Shared, Topology};
use crate::config::diff::{fingerprint, needs_restart, same_settings};
pub use crate::config::diff::{ReloadProblem, ReloadReport};
use crate::config::{self, ListenerConfig, OrganismConfig};
use crate::events::EventKind;
use crate::listener::Handler;
use crate::threads::MessageStatus;
use crate::xml::normalize_payload;

/// Why a reload changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    #[error("the running config is revision {actual}, not {expected}")]
    RevMismatch { expected: u64, actual: u64 },
    #[error("the organism was not loaded from a file, so there is nothing to reload")]
    NoSource,
    #[error("the organism is stopping")]
    Stopping,
    #[error("reload refused, the running organism is unchanged: {}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Refused(Vec<ReloadProblem>),
}

/// A new organism built beside the running one, not yet in service.
pub(super) struct Prepared {
    config: OrganismConfig,
    /// New listeners (added or changed), by name.
    built: HashMap<String, Arc<Listener>>,
    report: ReloadReport,
}

/// A change of the running organism under way: the reload lock held, the organism running,
/// the revision checked, and the topology and file it starts from.
pub(super) struct Turn<'a> {
    _one_at_a_time: std::sync::MutexGuard<'a, ()>,
    pub current: Arc<Topology>,
    pub path: PathBuf,
    pub rev: u64,
}

impl Shared {
    /// Starts a change (a reload, or a change to the API's agents): one at a time, only while
    /// running, only from revision `if_rev` when given, only for an organism with a file.
    pub(super) fn turn(&self, if_rev: Option<u64>) -> Result<Turn<'_>, ReloadError> {
        let lock = crate::sync::lock(&self.reloading.reload_lock);
        if self.life.status.load(Ordering::SeqCst) != super::STATUS_RUNNING {
            return Err(ReloadError::Stopping);
        }
        let rev = self.reloading.config_rev.load(Ordering::SeqCst);
        if let Some(expected) = if_rev.filter(|r| *r != rev) {
            return Err(ReloadError::RevMismatch {
                expected,
                actual: rev,
            });
        }
        let current = self.topo();
        let path = current.config.source.clone().ok_or(ReloadError::NoSource)?;
        Ok(Turn {
            _one_at_a_time: lock,
            current,
            path,
            rev,
        })
    }

    /// Counts a reload that succeeded and publishes its `reload` event.
    pub(super) fn reloaded(&self, report: &ReloadReport) {
        self.reloading.reloads_ok.fetch_add(1, Ordering::Relaxed);
        // Only a listener built again can run a script it did not run before.
        self.note_file_scripts(|n| report.added.iter().chain(&report.changed).any(|b| b == n));
        self.events.publish(EventKind::Reload {
            agent: None,
            ok: true,
            error: None,
            problems: Vec::new(),
            diff: Some(report.clone()),
        });
    }

    /// A config's errors as a reload's problems, each cut to `limits.max_error_bytes`.
    pub(super) fn problems_of(&self, e: config::ConfigErrors) -> Vec<ReloadProblem> {
        e.0.into_iter()
            .map(|c| ReloadProblem {
                line: c.line,
                listener: c.listener,
                key: c.key,
                message: self.clip_error(c.message),
            })
            .collect()
    }

    /// Builds a handler for one listener, of whatever kind and placement; `previous` is
    /// the handler it succeeds, if any (its counters carry on).
    pub(crate) fn build_handler(
        &self,
        lc: &ListenerConfig,
        previous: Option<&Arc<dyn Handler>>,
    ) -> Result<Arc<dyn Handler>, String> {
        if lc.placement == config::Placement::Workers {
            let placed = self
                .placed
                .as_ref()
                .ok_or("`placement: workers` needs `organism.nats`")?;
            return Ok(Arc::new(crate::nats::PlacedHandler::new(
                placed.clone(),
                self.events.clone(),
                lc,
                super::metered::PlacedLlm::of(lc, &self.budgets, &self.events),
            )));
        }
        local_handler(
            lc,
            &HandlerParts {
                registry: &self.reloading.registry,
                max_message_bytes: self.limits.max_message_bytes,
                lua_targets: &self.reloading.lua_targets,
                events: &self.events,
                callbacks: &self.external.callbacks,
                history: Some(&self.history),
                budgets: Some(&self.budgets),
            },
            previous,
        )
    }

    /// Steps 1 and 2: load (the file, with `layer`, the API's agents, over it), check,
    /// diff, build. Nothing running is touched.
    pub(super) fn prepare(
        &self,
        current: &Topology,
        path: &Path,
        layer: &[crate::config::layer::LayerListener],
    ) -> Result<Prepared, Vec<ReloadProblem>> {
        let mut config = super::load_config_layered(path, &self.reloading.registry, layer)
            .map_err(|e| self.problems_of(e))?;
        self.reloading.overrides.apply(&mut config);
        let problems = needs_restart(&current.config, &config);
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut report = ReloadReport::default();
        let mut built = HashMap::new();
        let mut problems = Vec::new();
        for lc in &config.listeners {
            let name = lc.name.to_string();
            let print = fingerprint(lc);
            match current.listeners.get(lc.name.as_str()) {
                Some(old) if old.fingerprint == print => {
                    report.unchanged.push(name);
                    continue;
                }
                Some(_) => report.changed.push(name.clone()),
                None => report.added.push(name.clone()),
            }
            let previous = current.listeners.get(lc.name.as_str()).map(|l| &l.handler);
            match self.build_handler(lc, previous) {
                Ok(handler) => {
                    let listener = match current.listeners.get(lc.name.as_str()) {
                        Some(old) => Listener::successor_of(lc.clone(), handler, old.stats.clone()),
                        None => Listener::new(lc.clone(), handler, None),
                    };
                    built.insert(name, Arc::new(listener));
                }
                // A script's own error text (an `init` that raises a megabyte) is cut
                // like every error the organism keeps or answers.
                Err(message) => problems.push(ReloadProblem {
                    line: None,
                    listener: Some(name),
                    key: None,
                    message: self.clip_error(message),
                }),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        report.removed = current
            .order
            .iter()
            .map(|l| l.name().to_string())
            .filter(|n| config.listener(n).is_none())
            .collect();
        Ok(Prepared {
            config,
            built,
            report,
        })
    }

    /// Steps 3 and 4: swap, then hand over from retired listeners.
    pub(super) fn apply(self: &Arc<Self>, current: &Topology, prepared: Prepared) -> ReloadReport {
        let Prepared {
            config,
            built,
            mut report,
        } = prepared;
        let mut listeners = crate::hash::SeededMap::default();
        let mut order = Vec::new();
        for lc in &config.listeners {
            let l = match built.get(lc.name.as_str()) {
                Some(new) => new.clone(),
                None => match current.listeners.get(lc.name.as_str()) {
                    Some(old) => old.clone(),
                    None => continue,
                },
            };
            listeners.insert(lc.name.clone(), l.clone());
            order.push(l);
        }
        self.reloading.lua_targets.set(&config);
        self.budgets.set(config.tenants.clone());
        let retention_changed = config.retention != current.config.retention;
        if config.payload_search != current.config.payload_search {
            if let Some(store) = &self.store {
                if let Err(e) = store.search_payloads(config.payload_search) {
                    tracing::warn!("organism.search.payload_text not changed: {e}");
                }
            }
        }
        let next = Arc::new(Topology {
            config: Arc::new(config),
            listeners,
            order,
        });
        self.set_topology(next);
        if retention_changed {
            if let Some(maintenance) = crate::sync::lock(&self.life.maintenance).as_ref() {
                maintenance.set_retention(self.topo().config.retention);
            }
        }
        for name in &report.changed {
            let (Some(old), Some(new)) = (current.listeners.get(name.as_str()), built.get(name))
            else {
                continue;
            };
            let mut handed = old.retire(Some(new.clone()));
            let schemas_changed = old.config.accepts.len() != new.config.accepts.len()
                || old
                    .config
                    .accepts
                    .iter()
                    .any(|(t, s)| new.config.schema_for(t).is_none_or(|n| n.xsd() != s.xsd()));
            if schemas_changed {
                for jobs in handed.jobs.values_mut() {
                    let kept: Vec<Job> = jobs
                        .drain(..)
                        .filter_map(|job| self.revalidate(new, job))
                        .collect();
                    jobs.extend(kept);
                }
                handed.jobs.retain(|_, jobs| !jobs.is_empty());
            }
            new.inherit(handed);
            self.kick(new);
        }
        for name in &report.removed {
            let Some(old) = current.listeners.get(name.as_str()) else {
                continue;
            };
            let handed = old.retire(None);
            for job in handed.jobs.into_values().flatten() {
                self.fail_removed(name, job);
            }
            self.drop_agent_waits(name);
            self.withdraw_inputs_of(name);
        }
        for name in &report.added {
            if let Some(new) = built.get(name) {
                self.kick(new);
            }
        }
        report.rev = self.reloading.config_rev.fetch_add(1, Ordering::SeqCst) + 1;
        report
    }

    /// A queued job moving to a successor whose schemas changed: still accepted and valid,
    /// or failed here with the reason.
    fn revalidate(&self, to: &Listener, job: Job) -> Option<Job> {
        let ty = job.payload.payload_type().clone();
        let checked = match to.config.schema_for(&ty) {
            None => Err((
                MessageStatus::Undeliverable,
                FailureKind::Undeliverable,
                format!("`{}` no longer accepts `{ty}` after a reload", to.name()),
            )),
            Some(schema) => normalize_payload(job.payload.xml(), &self.xml_limits)
                .map_err(|e| e.to_string())
                .and_then(|p| schema.validate(p).map_err(|e| e.to_string()))
                .map_err(|e| {
                    (
                        MessageStatus::Rejected,
                        FailureKind::Invalid,
                        format!(
                            "payload `{ty}` is invalid for `{}` after a reload: {e}",
                            to.name()
                        ),
                    )
                }),
        };
        match checked {
            Ok(payload) => Some(Job {
                record: job.record,
                payload,
                approval: job.approval,
            }),
            Err((status, kind, error)) => {
                self.fail_job(to.name(), job, status, kind, error);
                None
            }
        }
    }

    /// A job for a listener a reload removed: undeliverable (SPEC §8).
    pub(crate) fn fail_removed(&self, name: &str, job: Job) {
        self.fail_job(
            name,
            job,
            MessageStatus::Undeliverable,
            FailureKind::Undeliverable,
            format!("`{name}` was removed by a reload before it handled this message"),
        );
    }

    fn fail_job(
        &self,
        agent: &str,
        job: Job,
        status: MessageStatus,
        kind: FailureKind,
        error: String,
    ) {
        let record = job.record;
        let error = self.clip_error(error);
        self.finish_message(&record, status, Some(error.clone()));
        self.count_failure(kind);
        self.say_error(Some(&record.thread_id), Some(agent), error);
        self.release(&record);
    }
}

impl Organism {
    /// Reloads the organism from its file (SPEC §12). `if_rev`: only if the running config
    /// is that revision. On success the answer and the `reload` event carry the diff; on any
    /// problem nothing changes, the `reload` event reports it and the config is marked stale
    /// (`agentserver_config_stale`) until a reload succeeds.
    pub fn reload(&self, if_rev: Option<u64>) -> Result<ReloadReport, ReloadError> {
        self.reload_inner(if_rev, false)
            .map(|r| r.unwrap_or_default())
    }

    /// The file watch's reload: does nothing (no event, no new revision) when the files
    /// describe what is running.
    fn reload_if_changed(&self) -> Result<Option<ReloadReport>, ReloadError> {
        self.reload_inner(None, true)
    }

    fn reload_inner(
        &self,
        if_rev: Option<u64>,
        only_if_changed: bool,
    ) -> Result<Option<ReloadReport>, ReloadError> {
        let s = &self.shared;
        let turn = s.turn(if_rev)?;
        let (current, path, rev) = (&*turn.current, turn.path.as_path(), turn.rev);
        let layer = s.reloading.agents.layer(None).map_err(|e| {
            ReloadError::Refused(vec![ReloadProblem {
                line: None,
                listener: None,
                key: None,
                message: format!("the agents created through the API cannot be read: {e}"),
            }])
        })?;
        match s.prepare(current, path, &layer) {
            Err(problems) => {
                s.reloading.config_stale.store(true, Ordering::SeqCst);
                s.reloading.reloads_failed.fetch_add(1, Ordering::Relaxed);
                s.events.publish(EventKind::Reload {
                    agent: None,
                    ok: false,
                    error: Some(ReloadError::Refused(problems.clone()).to_string()),
                    problems: problems.clone(),
                    diff: None,
                });
                let error = ReloadError::Refused(problems);
                Err(error)
            }
            Ok(prepared) => {
                let report = &prepared.report;
                let nothing = report.added.is_empty()
                    && report.removed.is_empty()
                    && report.changed.is_empty()
                    && same_settings(&current.config, &prepared.config);
                s.reloading.config_stale.store(false, Ordering::SeqCst);
                let report = if nothing {
                    // Comments, formatting, a file saved again: what runs stays, and so
                    // does its revision.
                    if only_if_changed {
                        return Ok(None);
                    }
                    let mut report = prepared.report;
                    report.rev = rev;
                    report
                } else {
                    s.apply(current, prepared)
                };
                s.reloaded(&report);
                Ok(Some(report))
            }
        }
    }

    /// Watches the organism file, every XSD and script it references, and the directories
    /// they are in (so a file that appears later, or is saved by rename, is seen), polling
    /// every `interval`; a change stable for one interval triggers a reload. Stops with the
    /// organism.
    pub fn watch_files(&self, interval: Duration) {
        let organism = self.clone();
        // The baseline is what the files are now, before this returns.
        let mut seen = stamps(&watched(&organism.config()));
        self.spawn_background(|stopped| async move {
            let mut pending: Option<Vec<Stamp>> = None;
            let mut tick = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now = stamps(&watched(&organism.config()));
                if now == seen {
                    pending = None;
                    continue;
                }
                if pending.as_ref() != Some(&now) {
                    // Changed: wait one interval for it to settle.
                    pending = Some(now);
                    continue;
                }
                // The state acted on: anything written from now on is a new change (a file
                // may appear while this reload is refused for lacking it). If the reload
                // brings new files under watch, the next tick's no-op reload settles that.
                seen = now;
                pending = None;
                let o = organism.clone();
                let result = tokio::task::spawn_blocking(move || o.reload_if_changed()).await;
                match result {
                    Ok(Ok(Some(r))) => tracing::info!(rev = r.rev, added = ?r.added, removed = ?r.removed, changed = ?r.changed, "organism reloaded"),
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => tracing::warn!(
                        file = %organism.config().source.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                        error = %e,
                        "organism reload failed"
                    ),
                    Err(e) => tracing::error!(error = %e, "organism reload panicked"),
                }
            }
        });
    }
}

type Stamp = (PathBuf, Option<(Option<std::time::SystemTime>, u64)>);

/// The files a config is made of, and their directories.
fn watched(config: &OrganismConfig) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = config.source.iter().cloned().collect();
    for l in &config.listeners {
        files.extend(l.schema_origin.iter().cloned());
        files.extend(l.script.iter().cloned());
    }
    let dirs: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    files.extend(dirs);
    files.sort();
    files.dedup();
    files
}

fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    paths
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p)
                .ok()
                .map(|m| (m.modified().ok(), m.len()));
            (p.clone(), meta)
        })
        .collect()
}

/// What building a handler in this process takes: the pump's, or a worker's own.
pub(crate) struct HandlerParts<'a> {
    pub registry: &'a crate::listener::HandlerRegistry,
    pub max_message_bytes: usize,
    pub lua_targets: &'a Arc<crate::lua::OutputTargets>,
    pub events: &'a Arc<crate::events::EventHub>,
    pub callbacks: &'a Arc<std::sync::OnceLock<crate::listener::CallbackUrl>>,
    /// Threads' messages, for an LLM's context (a worker has none: its LLM listeners see
    /// only the message they handle).
    pub history: Option<&'a Arc<dyn crate::llm::ThreadHistory>>,
    /// Tenants' token budgets (a worker keeps none: its calls are not limited).
    pub budgets: Option<&'a Arc<crate::llm::Budgets>>,
}

/// Builds the handler that runs a listener in this process, whatever its placement (a
/// worker runs placed listeners this way).
pub(crate) fn local_handler(
    lc: &ListenerConfig,
    parts: &HandlerParts<'_>,
    previous: Option<&Arc<dyn Handler>>,
) -> Result<Arc<dyn Handler>, String> {
    match lc.kind {
        config::ListenerKind::Lua => crate::lua::LuaHandler::build_with(
            lc,
            parts.max_message_bytes,
            parts.lua_targets.clone(),
            parts.events.clone(),
            previous
                .and_then(|h| h.carried_stats())
                .and_then(|s| s.downcast::<crate::lua::LuaStats>().ok()),
        )
        .map(|h| Arc::new(h) as Arc<dyn Handler>),
        config::ListenerKind::External => {
            crate::listener::ExternalHandler::new(lc, parts.callbacks.clone())
                .map(|h| Arc::new(h) as Arc<dyn Handler>)
        }
        config::ListenerKind::Native => parts.registry.build(lc),
        // The pump opens a question for each delivery (`inputs::ask`): nothing is called.
        config::ListenerKind::Human => Ok(Arc::new(crate::listener::Unanswerable)),
        config::ListenerKind::Llm => crate::llm::LlmHandler::new(
            lc,
            parts.lua_targets.clone(),
            parts.max_message_bytes,
            parts.events.clone(),
            parts.history.cloned(),
            parts.budgets.cloned(),
        )
        .map(|h| Arc::new(h) as Arc<dyn Handler>),
    }
}
