//! `agentserver worker`: runs the handlers of listeners placed on workers, for a pump, through
//! NATS JetStream (see [`crate::nats`] for the protocol and its guarantees).
//!
//! A worker loads the same organism file as the pump and builds only the listeners it is
//! told to serve, with the same handler code, sandboxes and limits as in-process. Every
//! delivery's payload is validated again here against the worker's own copy of the
//! listener's schema before its handler sees it. Outputs go back as raw text: the pump reads,
//! routes and validates them.
//!
//! Each listener has `concurrency` slots (or `--concurrency`); each slot pulls one delivery
//! at a time from the listener's durable consumer, which every worker of it shares, so the
//! work spreads over the workers that have a free slot.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::AckKind;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use super::reload::{local_handler, HandlerParts};
use crate::config::{ListenerConfig, OrganismConfig, Placement};
use crate::events::{EventHub, EventKind, TryRecvError};
use crate::listener::{Delivery, Handler, HandlerRegistry, Meta};
use crate::nats::{
    listener_version, Link, WorkItem, WorkLog, WorkOutput, WorkResult, WorkUsage, ALIVE_EVERY,
    MAX_LOG_LINES, MAX_LOG_LINE_BYTES, MAX_USAGE_ROWS,
};
use crate::xml::{normalize_payload, XmlLimits};

/// What `agentserver worker` was asked to do.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub organism: PathBuf,
    /// The listeners to serve (each `placement: workers` in the file).
    pub listeners: Vec<String>,
    /// Replaces `organism.nats.url`.
    pub nats_url: Option<String>,
    /// Deliveries of each listener run at once in this process; default: its `concurrency`.
    pub concurrency: Option<usize>,
    /// This worker's name in results and logs.
    pub name: String,
}

/// One listener as this worker runs it.
struct Served {
    config: ListenerConfig,
    handler: Arc<dyn Handler>,
    version: String,
}

struct Worker {
    path: PathBuf,
    name: String,
    registry: HandlerRegistry,
    xml_limits: XmlLimits,
    link: Link,
    /// Where handlers here publish what they log; each delivery's lines go back with its
    /// result.
    events: Arc<EventHub>,
    ack_wait: Duration,
    served: std::sync::RwLock<HashMap<String, Arc<Served>>>,
    /// One reload of the file at a time.
    reloading: tokio::sync::Mutex<()>,
    stop: CancellationToken,
    /// Deliveries answered (their results published and the deliveries acked).
    answered: std::sync::atomic::AtomicU64,
}

fn load(path: &std::path::Path, registry: &HandlerRegistry) -> Result<OrganismConfig, String> {
    super::builder::load_config(path, registry).map_err(|errors| {
        let lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        format!("{}: {}", path.display(), lines.join("; "))
    })
}

/// Builds `names`' handlers from `config`, each checked to be placed on workers.
fn build(
    config: &OrganismConfig,
    names: &[String],
    registry: &HandlerRegistry,
    events: &Arc<EventHub>,
) -> Result<HashMap<String, Arc<Served>>, String> {
    let lua_targets = crate::lua::OutputTargets::of(config);
    let callbacks = Arc::default();
    let parts = HandlerParts {
        registry,
        max_message_bytes: config.limits.max_message_bytes,
        lua_targets: &lua_targets,
        events,
        callbacks: &callbacks,
        history: None,
        budgets: None,
    };
    let mut served = HashMap::new();
    for name in names {
        let lc = config
            .listeners
            .iter()
            .find(|l| l.name.as_str() == name)
            .ok_or_else(|| format!("the organism has no listener `{name}`"))?;
        if lc.placement != Placement::Workers {
            return Err(format!(
                "listener `{name}` is not placed on workers (give it `placement: workers`)"
            ));
        }
        let handler =
            local_handler(lc, &parts, None).map_err(|e| format!("listener `{name}`: {e}"))?;
        served.insert(
            name.clone(),
            Arc::new(Served {
                version: listener_version(lc),
                config: lc.clone(),
                handler,
            }),
        );
    }
    Ok(served)
}

/// Runs until `stop` is cancelled: deliveries under way finish and are answered first.
/// Fails at once if the file, the listeners or the NATS URL are wrong. Returns how many
/// deliveries it answered.
pub async fn run_worker(
    options: WorkerOptions,
    registry: HandlerRegistry,
    stop: CancellationToken,
) -> Result<u64, String> {
    if options.listeners.is_empty() {
        return Err("name the listeners to serve: --listeners NAME,…".into());
    }
    let config = load(&options.organism, &registry)?;
    let mut nats = config.nats.clone().ok_or_else(|| {
        format!(
            "{}: no `organism.nats`: a worker reaches its pump through NATS",
            options.organism.display()
        )
    })?;
    if let Some(url) = options.nats_url {
        nats.url = url;
    }
    let events = Arc::new(EventHub::new(LOG_RING));
    let served = build(&config, &options.listeners, &registry, &events)?;
    let name = options.name;
    let link = Link::connect(&nats, &format!("agentserver {name}")).await?;
    tracing::info!(worker = %name, url = %link.url(), listeners = ?options.listeners, "worker started");
    // One line a user sees without RUST_LOG: which listeners, through which server.
    eprintln!(
        "agentserver worker {name}: serving {} through NATS at {}",
        options.listeners.join(", "),
        link.url()
    );
    let worker = Arc::new(Worker {
        path: options.organism,
        name,
        registry,
        xml_limits: config.limits.xml_limits(),
        link,
        events,
        ack_wait: nats.ack_wait,
        served: std::sync::RwLock::new(served),
        reloading: tokio::sync::Mutex::new(()),
        stop,
        answered: Default::default(),
    });
    let Some(streams) = worker.link.streams_or_stop(&worker.stop).await else {
        return Ok(0);
    };
    let mut tasks = tokio::task::JoinSet::new();
    for listener in &options.listeners {
        let Some(served) = worker.get(listener) else {
            continue;
        };
        let consumer: PullConsumer = loop {
            let durable = worker.link.names.work_consumer(listener);
            let made = streams
                .work
                .get_or_create_consumer(
                    &durable,
                    pull::Config {
                        durable_name: Some(durable.clone()),
                        filter_subject: worker.link.names.work_subject(listener),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: nats.ack_wait,
                        max_deliver: i64::from(nats.max_deliver),
                        ..Default::default()
                    },
                )
                .await;
            match made {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(listener = %listener, error = %e, "cannot set up the work consumer; retrying");
                    if !crate::nats::retry_after(&worker.stop).await {
                        return Ok(0);
                    }
                }
            }
        };
        tasks.spawn(worker.clone().announce(listener.clone()));
        let slots = options
            .concurrency
            .unwrap_or(served.config.concurrency)
            .max(1);
        for _ in 0..slots {
            tasks.spawn(worker.clone().slot(consumer.clone()));
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(worker.answered.load(std::sync::atomic::Ordering::Relaxed))
}

/// Events a worker's handlers' log lines are held in until their deliveries end.
const LOG_RING: usize = 4096;

/// The lines `item`'s handler logged (its listener, its thread), at most
/// [`MAX_LOG_LINES`], then one line counting the rest and any the ring let go of; and the
/// calls it made to a model, at most [`MAX_USAGE_ROWS`].
fn reports_of(rx: &mut crate::events::Receiver, item: &WorkItem) -> (Vec<WorkLog>, Vec<WorkUsage>) {
    let mut lines = Vec::new();
    let mut usage = Vec::new();
    let (mut over, mut lost) = (0u64, 0u64);
    loop {
        match rx.try_recv() {
            Ok(ev) => {
                if let EventKind::Usage(u) = &ev.kind {
                    if *u.listener == *item.listener
                        && *u.message_id == *item.message_id
                        && usage.len() < MAX_USAGE_ROWS
                    {
                        usage.push(WorkUsage {
                            model: u.model.clone(),
                            input_tokens: u.input_tokens,
                            output_tokens: u.output_tokens,
                            cached_tokens: u.cached_tokens,
                            estimated: u.estimated,
                            ms: u.ms,
                        });
                    }
                } else if let EventKind::Log {
                    agent,
                    thread_id,
                    level,
                    message,
                } = &ev.kind
                {
                    if *agent == item.listener && thread_id.as_deref() == Some(&item.thread_id) {
                        if lines.len() < MAX_LOG_LINES {
                            lines.push(WorkLog {
                                level: level.clone(),
                                message: crate::clip::clip(message.clone(), MAX_LOG_LINE_BYTES),
                            });
                        } else {
                            over += 1;
                        }
                    }
                }
            }
            Err(TryRecvError::Lagged(n)) => lost += n,
            Err(_) => break,
        }
    }
    if over > 0 {
        lines.push(WorkLog {
            level: "warn".into(),
            message: format!("{over} more lines logged on the worker were not carried back"),
        });
    }
    if lost > 0 {
        lines.push(WorkLog {
            level: "warn".into(),
            message: format!(
                "the worker's log ring let go of {lost} lines (of any delivery) before they \
                 could be carried back: some of this one's may be missing"
            ),
        });
    }
    (lines, usage)
}

impl Worker {
    fn get(&self, listener: &str) -> Option<Arc<Served>> {
        self.served
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(listener)
            .cloned()
    }

    /// Tells pumps this worker serves `listener`, every [`ALIVE_EVERY`].
    async fn announce(self: Arc<Self>, listener: String) {
        let subject = self.link.names.alive_subject(&listener);
        loop {
            let _ = self
                .link
                .client
                .publish(subject.clone(), self.name.clone().into())
                .await;
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(ALIVE_EVERY) => {}
            }
        }
    }

    /// Pulls and runs one delivery at a time until stopped.
    async fn slot(self: Arc<Self>, consumer: PullConsumer) {
        while !self.stop.is_cancelled() {
            let batch = consumer
                .batch()
                .max_messages(1)
                .expires(Duration::from_secs(5))
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => b,
                Err(_) if crate::nats::retry_after(&self.stop).await => continue,
                Err(_) => return,
            };
            loop {
                let Some(next) = crate::nats::next_or_stop(&self.stop, &mut batch).await else {
                    return;
                };
                match next {
                    Some(Ok(msg)) => self.run(msg).await,
                    Some(Err(_)) => {}
                    None => break,
                }
            }
        }
    }

    /// Runs one delivery and answers it; acks it only once the answer is in the results
    /// stream (a worker that dies before leaves it to another).
    async fn run(&self, msg: async_nats::jetstream::Message) {
        let item: WorkItem = match serde_json::from_slice(&msg.payload) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "a work item that is not the pump's; dropped");
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            }
        };
        let progress = async {
            let every = (self.ack_wait / 3).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(every).await;
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        };
        let answer = async {
            let result = self.answer(&item).await;
            self.publish(&result).await
        };
        let published = tokio::select! {
            p = answer => p,
            () = progress => false,
        };
        if published {
            let _ = msg.ack().await;
            self.answered
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The result of running `item` here: outputs, or why there are none, and what the
    /// handler logged meanwhile.
    async fn answer(&self, item: &WorkItem) -> WorkResult {
        let mut logged = self.events.subscribe();
        let mut result = WorkResult {
            message_id: item.message_id.clone(),
            nonce: item.nonce.clone(),
            worker: self.name.clone(),
            outputs: Vec::new(),
            error: None,
            logs: Vec::new(),
            usage: Vec::new(),
        };
        match self.call(item).await {
            Ok(outputs) => {
                result.outputs = outputs
                    .into_iter()
                    .map(|o| WorkOutput {
                        payload: o.payload,
                        to: o.to,
                    })
                    .collect()
            }
            Err(e) => result.error = Some(e),
        }
        (result.logs, result.usage) = reports_of(&mut logged, item);
        result
    }

    async fn call(&self, item: &WorkItem) -> Result<Vec<crate::listener::Output>, String> {
        let served = self.current(&item.listener, &item.version).await?;
        let normalized = normalize_payload(&item.payload_xml, &self.xml_limits)
            .map_err(|e| format!("the delivered payload is not readable here: {e}"))?;
        let payload_type = normalized.payload_type.clone();
        let schema = served
            .config
            .accepts
            .iter()
            .find(|(t, _)| *t == payload_type)
            .map(|(_, s)| s.clone())
            .ok_or_else(|| format!("`{}` does not accept `{payload_type}` here", item.listener))?;
        let payload = schema
            .validate(normalized)
            .map_err(|e| format!("the delivered payload is not valid here: {e}"))?;
        let delivery = Delivery {
            meta: Meta {
                thread_id: item.thread_id.as_str().into(),
                message_id: item.message_id.as_str().into(),
                from: item.from.as_str().into(),
                own_name: served.config.name.clone(),
                payload_type,
                approval: item.approval.clone().map(std::sync::Arc::new),
                settings: item
                    .settings
                    .clone()
                    .and_then(crate::threads::ThreadSettings::kept),
            },
            payload,
        };
        let handler = served.handler.clone();
        let call = std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(delivery)))
            .map_err(|p| format!("handler panicked: {}", super::dispatch::panic_text(&p)))?;
        match AssertUnwindSafe(call).catch_unwind().await {
            Ok(Ok(outputs)) => Ok(outputs),
            Ok(Err(e)) => Err(e.0),
            Err(p) => Err(format!(
                "handler panicked: {}",
                super::dispatch::panic_text(&p)
            )),
        }
    }

    /// The listener as the pump runs it (`version`): what this worker has, or, when that
    /// differs, what its file holds now.
    async fn current(&self, listener: &str, version: &str) -> Result<Arc<Served>, String> {
        let served = self
            .get(listener)
            .ok_or_else(|| format!("this worker does not serve `{listener}`"))?;
        if served.version == version {
            return Ok(served);
        }
        let _one = self.reloading.lock().await;
        if let Some(s) = self.get(listener).filter(|s| s.version == version) {
            return Ok(s);
        }
        let names = vec![listener.to_string()];
        let rebuilt = load(&self.path, &self.registry)
            .and_then(|config| build(&config, &names, &self.registry, &self.events))?;
        let Some(fresh) = rebuilt.get(listener).cloned() else {
            return Err(format!("this worker does not serve `{listener}`"));
        };
        self.served
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(listener.to_string(), fresh.clone());
        if fresh.version != version {
            return Err(format!(
                "this worker's `{listener}` (version {}) differs from the pump's (version \
                 {version}): give workers the same organism file and scripts as the pump",
                fresh.version
            ));
        }
        tracing::info!(listener = %listener, version = %version, "reloaded from the organism file");
        Ok(fresh)
    }

    /// Publishes a result, retrying while NATS is away; false if stopped first.
    async fn publish(&self, result: &WorkResult) -> bool {
        let Ok(mut body) = serde_json::to_vec(result) else {
            return false;
        };
        // Outputs too large for NATS can never go: the pump is told so instead.
        if let Err(too_big) = self.link.fits(body.len()) {
            let refused = WorkResult {
                message_id: result.message_id.clone(),
                nonce: result.nonce.clone(),
                worker: result.worker.clone(),
                outputs: Vec::new(),
                error: Some(format!("the handler's answer is {too_big}")),
                logs: Vec::new(),
                // The calls were made: they are still accounted.
                usage: result.usage.clone(),
            };
            let Ok(b) = serde_json::to_vec(&refused) else {
                return false;
            };
            body = b;
        }
        let body: bytes::Bytes = body.into();
        let subject = self.link.names.results_subject();
        loop {
            match self
                .link
                .publish(&subject, body.clone(), &result.message_id)
                .await
            {
                Ok(_) => return true,
                Err(e) => tracing::debug!(error = %e, "result not yet published; retrying"),
            }
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}
