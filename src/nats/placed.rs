//! The pump's side: [`Placed`] (the link, the deliveries awaiting an answer, the workers
//! seen) and [`PlacedHandler`], a placed listener's handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use subtle::ConstantTimeEq;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::link::{Link, Streams};
use super::wire::{listener_version, WorkItem, WorkResult, WorkUsage, MAX_USAGE_ROWS};
use super::ALIVE_WITHIN;
use crate::config::{ListenerConfig, NatsConfig};
use crate::listener::{
    Delivery, Handler, HandlerError, HandlerFuture, HandlerMetric, HandlerResult, Output,
};

/// Listeners remembered as announced by workers, at most (announcements for more, which
/// only a misbehaving client sends, are ignored).
const MAX_ANNOUNCED: usize = 4096;

/// A warning about refused results is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Whether `alive` holds an announcement for `listener` within [`ALIVE_WITHIN`].
fn announced(alive: &HashMap<String, Instant>, listener: &str) -> bool {
    alive
        .get(listener)
        .is_some_and(|t| t.elapsed() <= ALIVE_WITHIN)
}

struct Open {
    nonce: String,
    tx: oneshot::Sender<WorkResult>,
}

#[derive(Clone)]
struct Ready {
    link: Link,
    streams: Streams,
}

/// The organism's link to its workers: one per organism with `organism.nats`.
pub struct Placed {
    pub names: super::Names,
    url: String,
    deliver_timeout: Duration,
    /// Shared by every delivery under way (one clone of the link and streams, not one
    /// each).
    ready: watch::Receiver<Option<Arc<Ready>>>,
    /// Deliveries awaiting an answer, by message id.
    open: Mutex<HashMap<String, Open>>,
    /// When a worker last announced itself, by listener.
    alive: Mutex<HashMap<String, Instant>>,
    /// Results refused: not the expected shape, or a nonce that does not match.
    refused: AtomicU64,
    /// Results for no open delivery: duplicates, or answers after the timeout.
    late: AtomicU64,
    warned: Mutex<Option<Instant>>,
    stop: CancellationToken,
}

impl Placed {
    /// Starts connecting (in the background) and returns at once. Must run inside a tokio
    /// runtime; `stop` ends its tasks.
    pub fn start(config: &NatsConfig, organism: &str, stop: CancellationToken) -> Arc<Placed> {
        let (tx, rx) = watch::channel(None);
        let placed = Arc::new(Placed {
            names: super::Names::new(&config.stream_prefix),
            url: config.url.clone(),
            deliver_timeout: config.deliver_timeout,
            ready: rx,
            open: Mutex::default(),
            alive: Mutex::default(),
            refused: AtomicU64::new(0),
            late: AtomicU64::new(0),
            warned: Mutex::new(None),
            stop,
        });
        let config = config.clone();
        let name = format!("agentserver pump {organism}");
        let p = placed.clone();
        tokio::spawn(async move {
            let link = match Link::connect(&config, &name).await {
                Ok(link) => link,
                Err(e) => {
                    tracing::error!(error = %e, "placed listeners cannot run");
                    return;
                }
            };
            let Some(streams) = link.streams_or_stop(&p.stop).await else {
                return;
            };
            let ready = Arc::new(Ready { link, streams });
            let _ = tx.send(Some(ready.clone()));
            tokio::spawn(p.clone().watch_workers(ready.link.clone()));
            p.take_results(ready).await;
        });
        placed
    }

    async fn ready(&self, deadline: Instant) -> Option<Arc<Ready>> {
        super::first_some(&self.ready, Some(deadline)).await
    }

    /// Of `listeners`, those no worker has announced itself for lately.
    pub fn unserved<'a>(&self, listeners: impl Iterator<Item = &'a str>) -> Vec<String> {
        let alive = crate::sync::lock(&self.alive);
        listeners
            .filter(|l| !announced(&alive, l))
            .map(str::to_string)
            .collect()
    }

    /// Whether the link to NATS is up now (connected, its streams set up), and the server's
    /// URL.
    pub fn link_state(&self) -> (bool, &str) {
        let up = self
            .ready
            .borrow()
            .as_ref()
            .is_some_and(|r| r.link.connected());
        (up, &self.url)
    }

    /// Whether a worker has announced itself for `listener` lately.
    pub fn served(&self, listener: &str) -> bool {
        announced(&crate::sync::lock(&self.alive), listener)
    }

    /// Results refused (malformed, or a nonce that does not match) and results for no open
    /// delivery (duplicates, late answers).
    pub fn result_counts(&self) -> (u64, u64) {
        (
            self.refused.load(Ordering::Relaxed),
            self.late.load(Ordering::Relaxed),
        )
    }

    async fn watch_workers(self: Arc<Self>, link: Link) {
        let mut sub = loop {
            match link.client.subscribe(link.names.alive_all()).await {
                Ok(s) => break s,
                Err(_) => {
                    if !super::retry_after(&self.stop).await {
                        return;
                    }
                }
            }
        };
        loop {
            let Some(Some(msg)) = super::next_or_stop(&self.stop, &mut sub).await else {
                return;
            };
            if let Some(listener) = link.names.alive_listener(msg.subject.as_str()) {
                let mut alive = crate::sync::lock(&self.alive);
                if alive.len() < MAX_ANNOUNCED || alive.contains_key(listener) {
                    alive.insert(listener.to_string(), Instant::now());
                }
            }
        }
    }

    /// Takes every result from the results stream, for as long as the organism runs.
    async fn take_results(self: Arc<Self>, ready: Arc<Ready>) {
        let name = ready.link.names.results_consumer();
        loop {
            let consumer = ready
                .streams
                .results
                .get_or_create_consumer(
                    name,
                    pull::Config {
                        durable_name: Some(name.to_string()),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(30),
                        ..Default::default()
                    },
                )
                .await;
            let messages = match consumer {
                Ok(c) => c.messages().await.ok(),
                Err(_) => None,
            };
            let Some(mut messages) = messages else {
                if super::retry_after(&self.stop).await {
                    continue;
                }
                return;
            };
            loop {
                let Some(next) = super::next_or_stop(&self.stop, &mut messages).await else {
                    return;
                };
                match next {
                    Some(Ok(msg)) => {
                        self.accept(&msg.payload);
                        let _ = msg.ack().await;
                    }
                    // Missed heartbeats while the server is away: the stream carries on.
                    Some(Err(e)) => tracing::debug!(error = %e, "results stream"),
                    None => break,
                }
            }
        }
    }

    /// Hands a result to the delivery it answers, if it is open and the nonce matches.
    fn accept(&self, bytes: &[u8]) {
        let result: WorkResult = match serde_json::from_slice(bytes) {
            Ok(r) => r,
            Err(e) => {
                self.refuse(format_args!("a result that is not a worker's answer ({e})"));
                return;
            }
        };
        let mut open = crate::sync::lock(&self.open);
        let matches = match open.get(&result.message_id) {
            None => {
                drop(open);
                self.late.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Some(o) => bool::from(o.nonce.as_bytes().ct_eq(result.nonce.as_bytes())),
        };
        if !matches {
            drop(open);
            self.refuse(format_args!(
                "a result for message {} with the wrong nonce (not from a worker it was \
                 delivered to)",
                crate::clip::clip(result.message_id.clone(), 80)
            ));
            return;
        }
        if let Some(o) = open.remove(&result.message_id) {
            let _ = o.tx.send(result);
        }
    }

    fn refuse(&self, what: std::fmt::Arguments<'_>) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut warned = crate::sync::lock(&self.warned);
        if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *warned = Some(Instant::now());
            tracing::warn!(refused_total = n, "refused {what}");
        }
    }

    /// Publishes one item (`body`, the delivery of `message_id`), retrying (NATS away,
    /// stream full) until `deadline`, or until its call is `gone`; returns where it is in the
    /// work stream.
    async fn publish(
        &self,
        subject: String,
        body: bytes::Bytes,
        message_id: String,
        deadline: Instant,
        gone: impl Fn() -> bool,
    ) -> Result<InStream, HandlerError> {
        let mut last = String::from("it did not answer");
        loop {
            if gone() {
                return Err(HandlerError("the call was given up".into()));
            }
            let Some(ready) = self.ready(deadline).await else {
                return Err(HandlerError(format!(
                    "NATS at {} is not reachable (JetStream not set up within {} ms)",
                    self.url,
                    self.deliver_timeout.as_millis()
                )));
            };
            ready.link.fits(body.len()).map_err(|too_big| {
                HandlerError(format!(
                    "the delivery cannot go to workers: it is {too_big}"
                ))
            })?;
            let sent = tokio::time::timeout_at(
                deadline,
                ready.link.publish(&subject, body.clone(), &message_id),
            )
            .await;
            match sent {
                Ok(Ok(ack)) => {
                    return Ok(InStream {
                        ready,
                        seq: ack.sequence,
                        armed: true,
                    })
                }
                Ok(Err(e)) => last = e,
                Err(_) => {}
            }
            if Instant::now() + Duration::from_millis(200) >= deadline {
                return Err(HandlerError(format!(
                    "cannot hand the delivery to workers through NATS at {} within {} ms: {last}",
                    self.url,
                    self.deliver_timeout.as_millis()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Removes its delivery from the open ones when the call ends, however it ends (answered,
/// timed out, the thread killed), and takes an unanswered one back out of the work stream.
struct Opened {
    placed: Arc<Placed>,
    message_id: String,
    published: Option<InStream>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        let was_open = crate::sync::lock(&self.placed.open)
            .remove(&self.message_id)
            .is_some();
        // Answered: the worker has taken it. Otherwise it goes with `published`.
        if let Some(p) = self.published.as_mut() {
            p.armed = was_open;
        }
    }
}

/// A delivery in the work stream: taken back out when this goes while `armed` (its call
/// ended unanswered, or was given up while the delivery was on its way and never claimed it).
struct InStream {
    ready: Arc<Ready>,
    seq: u64,
    armed: bool,
}

impl Drop for InStream {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (ready, seq) = (self.ready.clone(), self.seq);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = ready.streams.work.delete_message(seq).await;
            });
        }
    }
}

#[derive(Default)]
struct Counts {
    /// Calls under way: published or about to be, not yet answered or given up.
    in_flight: AtomicU64,
    delivered: AtomicU64,
    answered: AtomicU64,
    unanswered: AtomicU64,
}

/// What the pump does around each delivery of a placed `kind: llm` listener (`pump`
/// implements it over `llm::Meter`): holds what it may take against budgets before it goes,
/// or refuses it.
pub trait Metering: Send + Sync {
    fn hold(&self, item: &WorkItem) -> Result<Box<dyn Metered>, String>;
}

/// A delivery's hold, until it ends.
pub trait Metered: Send {
    /// The delivery ended: `usage` is the calls the worker reported in the result taken
    /// (none when none was taken), each accounted once.
    fn settle(self: Box<Self>, usage: Vec<WorkUsage>);
}

/// A hold settled however the delivery ends: with the result's calls, or with none.
struct Settle(Option<Box<dyn Metered>>);

impl Settle {
    fn with(mut self, mut usage: Vec<WorkUsage>) {
        usage.truncate(MAX_USAGE_ROWS);
        if let Some(m) = self.0.take() {
            m.settle(usage);
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            m.settle(Vec::new());
        }
    }
}

/// The handler of a listener placed on workers.
pub struct PlacedHandler {
    placed: Arc<Placed>,
    metering: Option<Arc<dyn Metering>>,
    /// The pump's hub, where the lines the handler logged on a worker are published.
    events: Arc<crate::events::EventHub>,
    listener: String,
    subject: String,
    version: String,
    counts: Arc<Counts>,
}

impl PlacedHandler {
    pub fn new(
        placed: Arc<Placed>,
        events: Arc<crate::events::EventHub>,
        listener: &ListenerConfig,
        metering: Option<Arc<dyn Metering>>,
    ) -> PlacedHandler {
        PlacedHandler {
            metering,
            events,
            listener: listener.name.to_string(),
            subject: placed.names.work_subject(listener.name.as_str()),
            version: listener_version(listener),
            counts: Arc::default(),
            placed,
        }
    }

    async fn call(
        placed: Arc<Placed>,
        events: Arc<crate::events::EventHub>,
        item: WorkItem,
        subject: String,
        counts: Arc<Counts>,
        metering: Option<Arc<dyn Metering>>,
    ) -> HandlerResult {
        let held = Settle(match metering {
            Some(m) => Some(m.hold(&item).map_err(HandlerError)?),
            None => None,
        });
        let deadline = Instant::now() + placed.deliver_timeout;
        counts.in_flight.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight(counts.clone());
        let (tx, rx) = oneshot::channel();
        crate::sync::lock(&placed.open).insert(
            item.message_id.clone(),
            Open {
                nonce: item.nonce.clone(),
                tx,
            },
        );
        let mut opened = Opened {
            placed: placed.clone(),
            message_id: item.message_id.clone(),
            published: None,
        };
        let body: bytes::Bytes = serde_json::to_vec(&item)
            .map_err(|e| HandlerError(format!("cannot write the delivery: {e}")))?
            .into();
        // Published by a task of its own: a call given up meanwhile (its thread killed) may
        // go while the stream has the delivery and its place is not known yet; the place
        // then comes to nobody, and the delivery is taken back (`InStream`, dropped armed).
        let (sent_tx, sent_rx) = oneshot::channel();
        let (publisher, message_id) = (placed.clone(), item.message_id.clone());
        tokio::spawn(async move {
            let gone = || sent_tx.is_closed();
            let sent = publisher
                .publish(subject, body, message_id, deadline, gone)
                .await;
            let _ = sent_tx.send(sent);
        });
        opened.published =
            Some(sent_rx.await.map_err(|_| {
                HandlerError("the delivery's publishing ended unfinished".into())
            })??);
        counts.delivered.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(mut result)) => {
                counts.answered.fetch_add(1, Ordering::Relaxed);
                held.with(std::mem::take(&mut result.usage));
                for line in result.logs.into_iter().take(super::MAX_LOG_LINES + 1) {
                    let level = match line.level.as_str() {
                        "warn" | "error" => line.level,
                        _ => "info".to_string(),
                    };
                    events.publish(crate::events::EventKind::Log {
                        agent: item.listener.clone(),
                        thread_id: Some(item.thread_id.clone()),
                        level,
                        message: crate::clip::clip(line.message, super::MAX_LOG_LINE_BYTES),
                    });
                }
                match result.error {
                    Some(e) => Err(HandlerError(format!(
                        "on worker {}: {e}",
                        crate::clip::clip(result.worker.clone(), 120)
                    ))),
                    None => Ok(result
                        .outputs
                        .into_iter()
                        .map(|o| Output {
                            payload: o.payload,
                            to: o.to,
                        })
                        .collect()),
                }
            }
            Ok(Err(_)) => Err(HandlerError("the organism stopped".into())),
            Err(_) => {
                counts.unanswered.fetch_add(1, Ordering::Relaxed);
                Err(HandlerError(format!(
                    "no worker answered within {} ms ({})",
                    placed.deliver_timeout.as_millis(),
                    if placed.served(&item.listener) {
                        "workers of it are running: they are busy or failing"
                    } else {
                        "no worker of it is running: start `agentserver worker`"
                    }
                )))
            }
        }
    }
}

/// One call under way, counted until it ends, however it ends.
struct InFlight(Arc<Counts>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// 128 random bits, as hex.
fn nonce() -> Result<String, HandlerError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| HandlerError(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Handler for PlacedHandler {
    fn handle(&self, delivery: Delivery) -> HandlerFuture {
        let nonce = match nonce() {
            Ok(n) => n,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let item = WorkItem {
            message_id: delivery.meta.message_id.to_string(),
            thread_id: delivery.meta.thread_id.to_string(),
            from: delivery.meta.from.to_string(),
            listener: self.listener.clone(),
            payload_xml: delivery.payload.xml().to_string(),
            nonce,
            version: self.version.clone(),
            approval: delivery.meta.approval.as_deref().cloned(),
            settings: delivery.meta.settings.as_deref().cloned(),
        };
        let subject = self.subject.clone();
        Box::pin(Self::call(
            self.placed.clone(),
            self.events.clone(),
            item,
            subject,
            self.counts.clone(),
            self.metering.clone(),
        ))
    }

    fn unavailable(&self) -> bool {
        !self.placed.served(&self.listener)
    }

    fn metrics(&self) -> Vec<HandlerMetric> {
        let c = |name, help, v: &AtomicU64| {
            HandlerMetric::counter(name, help, Vec::new(), v.load(Ordering::Relaxed) as f64)
        };
        vec![
            HandlerMetric::gauge(
                "agentserver_worker_in_flight",
                "Deliveries handed to workers and not yet answered.",
                Vec::new(),
                self.counts.in_flight.load(Ordering::Relaxed) as f64,
            ),
            c(
                "agentserver_worker_deliveries_total",
                "Deliveries handed to workers through NATS.",
                &self.counts.delivered,
            ),
            c(
                "agentserver_worker_answers_total",
                "Deliveries a worker answered.",
                &self.counts.answered,
            ),
            c(
                "agentserver_worker_unanswered_total",
                "Deliveries no worker answered within organism.nats.deliver_timeout_ms.",
                &self.counts.unanswered,
            ),
        ]
    }
}
