//! Per-listener queues and the workers that drain them.
//!
//! Each listener owns one [`Queue`] behind its own mutex (never held across an `.await`):
//! a FIFO per thread, so one (listener, thread) pair is handled one message at a time in
//! arrival order, and a ring of ready threads served in turn, so a busy thread cannot starve
//! another. Up to `concurrency` worker tasks take jobs from the ring; a worker exits when the
//! ring is empty or the listener is paused, and enqueue starts workers again.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Instant;

use futures_util::FutureExt;

use super::{FailureKind, Shared};
use crate::config::ListenerConfig;
use crate::events::{AgentState, EventKind};
use crate::hash::{SeededMap, SeededSet};
use crate::listener::{Delivery, Handler, HandlerResult, Meta};
use crate::schema::ValidatedPayload;
use crate::stats::Histogram;
use crate::threads::{MessageRecord, MessageStatus};
use crate::time::Timestamp;

/// A listener at run time: its config, its handler, its queue, its counters.
pub(crate) struct Listener {
    pub(crate) config: ListenerConfig,
    /// What it was built from ([`crate::config::diff::fingerprint`]): a reload compares it.
    pub(crate) fingerprint: String,
    pub(crate) handler: Arc<dyn Handler>,
    queue: Mutex<Queue>,
    /// Counters, kept by the listener that replaces this one in a reload.
    pub(crate) stats: Arc<ListenerStats>,
}

/// A listener's counters, shared with its successor across a reload.
#[derive(Default)]
pub(crate) struct ListenerStats {
    pub(crate) handled: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// Time spent in the handler per call.
    pub(crate) handler_time: Arc<Histogram>,
    /// When a call last started or finished (ms since the epoch; 0 = never).
    pub(crate) last_activity: AtomicU64,
}

/// What a retired listener hands over.
pub(crate) struct Retired {
    pub(crate) jobs: SeededMap<Arc<str>, VecDeque<Job>>,
    busy: SeededSet<Arc<str>>,
    waiting: isize,
    failed: bool,
    paused: bool,
}

/// A validated message waiting for its listener.
pub(crate) struct Job {
    pub(crate) record: MessageRecord,
    pub(crate) payload: ValidatedPayload,
    /// Let through an approval gate by a person: shown to the handler.
    pub(crate) approval: Option<Arc<crate::listener::Approved>>,
}

/// Emptied per-thread queues a listener keeps for reuse, at most.
const SPARE_QUEUES: usize = 64;

/// A listener's worker that keeps finding its next job ready gives the runtime a turn
/// (`yield_now`: sockets polled, other tasks run) after this many handler calls, so a busy
/// pump does not starve the stream writers and requests that share its workers.
const YIELD_EVERY: u32 = 32;

#[derive(Default)]
struct Queue {
    per_thread: SeededMap<Arc<str>, VecDeque<Job>>,
    /// Emptied per-thread queues kept for the next threads (at most [`SPARE_QUEUES`]), so a
    /// hop does not allocate one.
    spare: Vec<VecDeque<Job>>,
    ready: VecDeque<Arc<str>>,
    busy: SeededSet<Arc<str>>,
    workers: usize,
    depth: usize,
    paused: bool,
    /// Replies this (external) listener owes. Signed: during a reload a successor can see a
    /// wait end before it inherits the count that wait was part of.
    waiting: isize,
    /// The last call failed (state `error` until a call succeeds).
    failed: bool,
    state: Option<AgentState>,
    /// Replaced or removed by a reload: takes no new work; its calls in flight finish.
    retired: bool,
    /// The listener that replaced it (changed), or none (removed).
    successor: Option<Arc<Listener>>,
    /// A successor not yet given its predecessor's work: it starts nothing until
    /// [`Listener::inherit`], so no thread of the predecessor's can start here twice.
    held: bool,
    /// Threads the predecessor finished before [`Listener::inherit`] ran.
    released_early: SeededSet<Arc<str>>,
}

/// A snapshot of a listener's run-time state.
#[derive(Debug, Clone)]
pub struct ListenerSnapshot {
    pub state: AgentState,
    pub queue_depth: usize,
    pub current_thread: Option<String>,
}

impl Listener {
    pub(crate) fn new(
        config: ListenerConfig,
        handler: Arc<dyn Handler>,
        stats: Option<Arc<ListenerStats>>,
    ) -> Self {
        Listener {
            fingerprint: crate::config::diff::fingerprint(&config),
            config,
            handler,
            queue: Mutex::new(Queue::default()),
            stats: stats.unwrap_or_default(),
        }
    }

    /// A successor built by a reload: it takes work only once it has inherited.
    pub(crate) fn successor_of(
        config: ListenerConfig,
        handler: Arc<dyn Handler>,
        stats: Arc<ListenerStats>,
    ) -> Self {
        let l = Listener::new(config, handler, Some(stats));
        l.lock().held = true;
        l
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::sync::lock(&self.queue)
    }

    pub(crate) fn name(&self) -> &str {
        self.config.name.as_str()
    }

    /// May this listener send to `target` (other than as a reply)? SPEC §6 rule 3.
    pub(crate) fn allows(&self, target: &str) -> bool {
        match &self.config.peers {
            Some(peers) => peers.iter().any(|p| p.as_str() == target),
            None => !self.config.agent,
        }
    }

    pub(crate) fn snapshot(&self, organism_paused: bool) -> ListenerSnapshot {
        let q = self.lock();
        ListenerSnapshot {
            state: state_of(&q, organism_paused, self.handler.unavailable()),
            queue_depth: q.depth,
            current_thread: q.busy.iter().next().map(|t| t.to_string()),
        }
    }

    /// Messages queued here that cannot start while it (or the organism) is paused.
    pub(crate) fn held_by_pause(&self, organism_paused: bool) -> usize {
        let q = self.lock();
        if q.paused || organism_paused {
            q.depth
        } else {
            0
        }
    }

    fn touch(&self) {
        self.stats
            .last_activity
            .store(Timestamp::now().0, Ordering::Relaxed);
    }

    /// Takes this listener out of service for a reload: it accepts no new work, and its
    /// queued jobs, the threads it is handling and the replies it is owed are handed over
    /// (to `successor`, or returned for a removed listener).
    pub(crate) fn retire(&self, successor: Option<Arc<Listener>>) -> Retired {
        let mut q = self.lock();
        q.retired = true;
        q.successor = successor;
        q.ready.clear();
        q.depth = 0;
        Retired {
            jobs: std::mem::take(&mut q.per_thread),
            busy: q.busy.clone(),
            waiting: std::mem::take(&mut q.waiting),
            failed: q.failed,
            paused: q.paused,
        }
    }

    /// Receives what a retired predecessor handed over. Threads it is still handling stay
    /// busy here until it finishes them ([`Listener::release_inherited`]), so one thread is
    /// still handled one message at a time.
    pub(crate) fn inherit(&self, from: Retired) {
        let mut q = self.lock();
        q.held = false;
        q.failed = from.failed;
        q.paused = from.paused;
        q.waiting += from.waiting;
        for thread in from.busy {
            if !q.released_early.remove(&thread) {
                q.busy.insert(thread);
            }
        }
        q.released_early.clear();
        // Routed here since the swap: behind the predecessor's jobs of the same thread, and
        // not ready while the predecessor still handles that thread.
        let busy = q.busy.clone();
        q.ready.retain(|t| !busy.contains(t));
        for (thread, mut jobs) in from.jobs {
            q.depth += jobs.len();
            let later = q.per_thread.remove(&thread);
            let already_ready = later.is_some() && !busy.contains(&thread);
            jobs.extend(later.into_iter().flatten());
            q.per_thread.insert(thread.clone(), jobs);
            if !already_ready && !busy.contains(&thread) {
                q.ready.push_back(thread);
            }
        }
    }

    /// The predecessor finished its call for `thread` (possibly before this listener
    /// inherited: then it is remembered, and not marked busy at inheritance).
    fn release_inherited(&self, thread: &Arc<str>) {
        let mut q = self.lock();
        if q.held {
            q.released_early.insert(thread.clone());
        } else if q.busy.remove(thread) && q.per_thread.contains_key(thread) {
            q.ready.push_back(thread.clone());
        }
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.lock().paused = paused;
    }

    /// `thread` resumed: ready again if it has jobs here and is neither busy nor ready.
    pub(crate) fn resume_thread(&self, thread: &Arc<str>) {
        let mut q = self.lock();
        if q.per_thread.contains_key(thread)
            && !q.busy.contains(thread)
            && !q.ready.contains(thread)
        {
            q.ready.push_back(thread.clone());
        }
    }

    /// Removes every queued job of `thread`, for a kill.
    pub(crate) fn drop_thread(&self, thread: &str) -> Vec<Job> {
        let mut q = self.lock();
        let Some(jobs) = q.per_thread.remove(thread) else {
            return Vec::new();
        };
        q.ready.retain(|t| &**t != thread);
        q.depth -= jobs.len();
        jobs.into_iter().collect()
    }
}

/// `unavailable`: its handler cannot run now (a listener placed on workers with none
/// running), so what it is busy with waits.
fn state_of(q: &Queue, organism_paused: bool, unavailable: bool) -> AgentState {
    if q.paused || organism_paused {
        AgentState::Paused
    } else if !q.busy.is_empty() && unavailable {
        AgentState::Waiting
    } else if !q.busy.is_empty() {
        AgentState::Processing
    } else if q.waiting > 0 {
        AgentState::Waiting
    } else if q.failed {
        AgentState::Error
    } else {
        AgentState::Idle
    }
}

impl Shared {
    /// Queues a validated job for `listener` and starts workers if needed.
    pub(crate) fn enqueue(self: &Arc<Self>, listener: &Arc<Listener>, job: Job) {
        {
            let mut q = listener.lock();
            if q.retired {
                // Routed just before a reload retired it: the successor takes it, and a
                // removed listener's message is undeliverable.
                let successor = q.successor.clone();
                drop(q);
                match successor {
                    Some(next) => self.enqueue(&next, job),
                    None => self.fail_removed(listener.name(), job),
                }
                return;
            }
            let thread = job.record.thread_id.clone();
            let q = &mut *q;
            let spare = &mut q.spare;
            let jobs = q
                .per_thread
                .entry(thread.clone())
                .or_insert_with(|| spare.pop().unwrap_or_default());
            jobs.push_back(job);
            let newly_waiting = jobs.len() == 1;
            q.depth += 1;
            if newly_waiting && !q.busy.contains(&thread) {
                q.ready.push_back(thread);
            }
        }
        self.kick(listener);
    }

    /// Starts as many workers as there are ready threads, up to the listener's concurrency.
    pub(crate) fn kick(self: &Arc<Self>, listener: &Arc<Listener>) {
        let (start, change) = {
            let mut q = listener.lock();
            let change = self.note_state(listener, &mut q, None);
            if self.held_back(&q) {
                (0, change)
            } else {
                let free = listener.config.concurrency.saturating_sub(q.workers);
                let idle_workers = q.workers.saturating_sub(q.busy.len());
                let start = free.min(q.ready.len().saturating_sub(idle_workers));
                q.workers += start;
                (start, change)
            }
        };
        self.publish_state(change);
        for _ in 0..start {
            let shared = self.clone();
            let listener = listener.clone();
            self.life
                .runtime
                .spawn(async move { shared.work(listener).await });
        }
    }

    /// Whether the listener's workers take no job now: it is paused or held (a reload), or
    /// the organism is paused.
    fn held_back(&self, q: &Queue) -> bool {
        q.paused || q.held || self.is_paused()
    }

    /// Computes the listener's state and, if it changed, returns the event to publish.
    fn note_state(
        &self,
        listener: &Listener,
        q: &mut Queue,
        current: Option<&Arc<str>>,
    ) -> Option<EventKind> {
        let state = state_of(q, self.is_paused(), listener.handler.unavailable());
        if q.state == Some(state) || q.retired {
            return None;
        }
        q.state = Some(state);
        Some(EventKind::AgentState {
            // The config's shared name: published twice a hop, never copied.
            agent: listener.config.name.arc(),
            state,
            current_thread: current.cloned(),
        })
    }

    /// Computes `listener`'s state again and publishes it if it changed.
    pub(crate) fn refresh_state(&self, listener: &Listener) {
        let change = {
            let mut q = listener.lock();
            let current = q.busy.iter().next().cloned();
            self.note_state(listener, &mut q, current.as_ref())
        };
        self.publish_state(change);
    }

    /// One more (`+1`) or one fewer (`-1`) reply owed by `listener`. A listener a reload
    /// retired has handed its count over, so the change goes to its successor (to none if
    /// it was removed: its waits ended with it).
    pub(crate) fn add_waiting(&self, listener: &Listener, delta: isize) {
        let mut next: Option<Arc<Listener>> = None;
        loop {
            let l = next.as_deref().unwrap_or(listener);
            let change = {
                let mut q = l.lock();
                if q.retired {
                    match q.successor.clone() {
                        Some(s) => {
                            drop(q);
                            next = Some(s);
                            continue;
                        }
                        None => return,
                    }
                }
                q.waiting += delta;
                self.note_state(l, &mut q, None)
            };
            self.publish_state(change);
            return;
        }
    }

    fn publish_state(&self, change: Option<EventKind>) {
        if let Some(kind) = change {
            self.events.publish(kind);
        }
    }

    async fn work(self: Arc<Self>, listener: Arc<Listener>) {
        let mut calls = 0u32;
        loop {
            let (job, change) = {
                let mut q = listener.lock();
                let next = if self.held_back(&q) {
                    None
                } else {
                    q.ready.pop_front()
                };
                let Some(thread) = next else {
                    q.workers -= 1;
                    let change = self.note_state(&listener, &mut q, None);
                    drop(q);
                    self.publish_state(change);
                    return;
                };
                // A paused thread's jobs wait where they are, not ready until it resumes.
                if self.threads.is_paused(&thread) {
                    continue;
                }
                let (job, now_empty) = match q.per_thread.get_mut(&thread) {
                    Some(jobs) => (jobs.pop_front(), jobs.is_empty()),
                    None => (None, true),
                };
                if now_empty {
                    let emptied = q.per_thread.remove(&thread);
                    if q.spare.len() < SPARE_QUEUES {
                        q.spare.extend(emptied.filter(|j| j.capacity() <= 8));
                    }
                }
                let Some(job) = job else { continue };
                q.depth -= 1;
                q.busy.insert(thread.clone());
                let change = self.note_state(&listener, &mut q, Some(&thread));
                (job, change)
            };
            self.publish_state(change);

            let thread = job.record.thread_id.clone();
            listener.touch();
            let failed = self.run_job(&listener, job).await;
            listener.touch();

            let (change, successor) = {
                let mut q = listener.lock();
                q.busy.remove(&thread);
                if let Some(failed) = failed {
                    q.failed = failed;
                }
                if q.per_thread.contains_key(&thread) {
                    q.ready.push_back(thread.clone());
                }
                // A worker that takes the next ready thread at once leaves the listener
                // processing: its state is told when it takes it (or finds it cannot), not
                // as an idle moment between two calls.
                let goes_on = !(q.ready.is_empty() || self.held_back(&q));
                let change = if goes_on {
                    None
                } else {
                    self.note_state(&listener, &mut q, None)
                };
                (change, q.successor.clone())
            };
            self.publish_state(change);
            if let Some(next) = successor {
                // Retired while handling this thread: its successor may take it up now.
                if let Some(failed) = failed {
                    next.lock().failed = failed;
                }
                next.release_inherited(&thread);
                self.kick(&next);
            }
            calls = calls.wrapping_add(1);
            if calls.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
    }

    /// Runs one handler call and routes its outputs, holding an organism-wide permit.
    /// Returns whether the handler failed (`None`: it did not run).
    async fn run_job(self: &Arc<Self>, listener: &Arc<Listener>, job: Job) -> Option<bool> {
        let record = job.record;
        let thread = record.thread_id.clone();
        let permit = self
            .gate
            .acquire(
                listener.config.tenant.as_deref(),
                &thread,
                record.slot_index,
            )
            .await;
        let mut failed = None;

        let stopped = || {
            if self.threads.aborted_at(&thread, record.slot_index) {
                "thread aborted"
            } else {
                "thread killed"
            }
        };
        if self.threads.is_cancelled(&thread) {
            self.finish_message(&record, MessageStatus::Killed, Some(stopped().into()));
        } else {
            let delivery = Delivery {
                meta: Meta {
                    thread_id: thread.clone(),
                    message_id: record.id.clone(),
                    from: record.from.clone(),
                    own_name: listener.config.name.clone(),
                    payload_type: job.payload.payload_type().clone(),
                    approval: job.approval,
                    settings: listener
                        .config
                        .llm
                        .as_ref()
                        .and_then(|_| self.threads.settings(&thread)),
                },
                payload: job.payload,
            };
            // What it was given, so an output that repeats it is not read again.
            let given = delivery.payload.clone();
            // An agent may call back before its POST is answered: the wait opens first.
            let wait = if listener.handler.awaits_reply() {
                self.begin_wait(listener, &record)
            } else {
                None
            };
            let started = Instant::now();
            let call =
                std::panic::catch_unwind(AssertUnwindSafe(|| listener.handler.handle(delivery)));
            let outcome: Outcome = match call {
                Err(panic) => Outcome::Panicked(panic_text(&panic)),
                Ok(future) => {
                    let mut guarded = std::pin::pin!(AssertUnwindSafe(future).catch_unwind());
                    // A handler that answers at once (a native one) is not raced against
                    // the thread's cancellation: the token is taken (and waited on, which
                    // locks its node) only for a handler that has to wait.
                    let first =
                        std::future::poll_fn(|cx| Poll::Ready(guarded.as_mut().poll(cx))).await;
                    match first {
                        Poll::Ready(r) => Outcome::from(r),
                        Poll::Pending => match self.threads.cancel_token(&thread) {
                            Some(token) => tokio::select! {
                                biased;
                                _ = token.cancelled() => Outcome::Cancelled,
                                r = &mut guarded => Outcome::from(r),
                            },
                            None => Outcome::from(guarded.await),
                        },
                    }
                }
            };
            listener.stats.handler_time.record(started.elapsed());
            listener.stats.handled.fetch_add(1, Ordering::Relaxed);
            failed = Some(matches!(outcome, Outcome::Failed(_) | Outcome::Panicked(_)));
            if let Some(id) = wait.filter(|_| !matches!(outcome, Outcome::Done(_))) {
                self.cancel_wait(listener, &record, id);
            }
            match outcome {
                Outcome::Done(outputs) => {
                    self.finish_message(&record, MessageStatus::Delivered, None);
                    for output in outputs {
                        self.route_output(listener, &record, Some(&given), output);
                    }
                }
                Outcome::Failed(reason) => {
                    listener.stats.errors.fetch_add(1, Ordering::Relaxed);
                    self.fail_message(
                        &record,
                        FailureKind::HandlerError,
                        format!("handler of `{}` failed: {reason}", listener.name()),
                    );
                }
                Outcome::Panicked(reason) => {
                    listener.stats.errors.fetch_add(1, Ordering::Relaxed);
                    self.fail_message(
                        &record,
                        FailureKind::HandlerPanic,
                        format!("handler of `{}` panicked: {reason}", listener.name()),
                    );
                }
                Outcome::Cancelled => {
                    self.finish_message(
                        &record,
                        MessageStatus::Killed,
                        Some(format!("{} while handling", stopped())),
                    );
                }
            }
        }
        drop(permit);
        self.release(&record);
        failed
    }
}

enum Outcome {
    Done(Vec<crate::listener::Output>),
    Failed(String),
    Panicked(String),
    Cancelled,
}

impl From<Result<HandlerResult, Box<dyn std::any::Any + Send>>> for Outcome {
    fn from(r: Result<HandlerResult, Box<dyn std::any::Any + Send>>) -> Self {
        match r {
            Ok(Ok(outputs)) => Outcome::Done(outputs),
            Ok(Err(e)) => Outcome::Failed(e.0),
            Err(panic) => Outcome::Panicked(panic_text(&panic)),
        }
    }
}

pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Listener;
    use crate::events::AgentState;
    use crate::pump::Organism;

    const ORGANISM: &str = r#"
organism: { name: waits, store: memory }
listeners:
  - name: ext
    description: Owes replies
    kind: native
    handler: sink
    fields:
      Ping: { n: integer }
"#;

    /// A reply's wait can begin or end while a reload hands its listener over: at the
    /// predecessor after it retired, or at the successor before it inherited. The count
    /// must come out right either way.
    #[tokio::test]
    async fn replies_owed_are_counted_right_across_a_reload_hand_over() {
        let names = crate::listener::HandlerRegistry::default();
        let config = crate::config::load_str(
            ORGANISM,
            "waits.yaml",
            std::path::Path::new("."),
            crate::config::Known {
                handlers: &names.names(),
                check_script: crate::lua::check_syntax,
            },
        )
        .unwrap();
        let organism = Organism::builder().build(config).unwrap();
        let shared = &organism.shared;
        let old = shared.topo().listeners["ext"].clone();
        let new = Arc::new(Listener::successor_of(
            old.config.clone(),
            old.handler.clone(),
            old.stats.clone(),
        ));
        shared.add_waiting(&old, 1);
        shared.add_waiting(&old, 1);
        let handed = old.retire(Some(new.clone()));
        // One wait ends at the successor (found by name after the swap) before it inherits,
        // another at the retired predecessor (found before the swap).
        shared.add_waiting(&new, -1);
        shared.add_waiting(&old, -1);
        new.inherit(handed);
        assert_eq!(new.lock().waiting, 0);
        assert_eq!(new.snapshot(false).state, AgentState::Idle);
        // A call still in flight at the predecessor opens a wait: the successor owes it.
        shared.add_waiting(&old, 1);
        assert_eq!(new.snapshot(false).state, AgentState::Waiting);
        shared.add_waiting(&new, -1);
        assert_eq!(new.snapshot(false).state, AgentState::Idle);
        organism.stop().await;
    }
}
