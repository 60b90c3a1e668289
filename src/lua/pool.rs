//! A listener's pool of sandboxes: `concurrency` Luau states, each on its own OS thread,
//! fed from one queue; a sandbox that failed (or was abandoned by the watchdog) is replaced.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use serde_json::Value as Json;

use super::sandbox::{CallError, Cost, LogLine, Sandbox};
use super::LuaLimits;

pub(super) struct Job {
    pub(super) payload: Json,
    pub(super) meta: Json,
    pub(super) cancel: Arc<AtomicBool>,
    /// Set by the caller when the watchdog gave up: the thread retires after this call.
    pub(super) abandoned: Arc<AtomicBool>,
    /// Read the thread's CPU clock around the call ([`LuaHandler::measured`]).
    pub(super) clock: bool,
    pub(super) reply: tokio::sync::oneshot::Sender<Answer>,
}

/// A sandbox's answer to one call.
pub(super) struct Answer {
    pub(super) result: Result<Json, CallError>,
    pub(super) logs: Vec<LogLine>,
    /// What the state holds after the call.
    pub(super) memory: usize,
    pub(super) cost: Cost,
}

/// The calls waiting for one pool's sandboxes. Every sandbox thread takes from it, and a call
/// wakes one sleeping thread at most (a channel receiver shared behind a mutex woke two: the
/// receiver, then the next thread waiting for the mutex).
#[derive(Default)]
pub(super) struct Queue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
    /// Sandbox threads serving the queue.
    pub(super) serving: AtomicUsize,
}

#[derive(Default)]
struct Jobs {
    waiting: std::collections::VecDeque<Job>,
    /// Set when the pool is replaced or dropped: threads finish what is queued, then end.
    closed: bool,
}

impl Queue {
    /// Queues a call; false (the call dropped) when no sandbox thread serves the pool.
    fn push(&self, job: Job) -> bool {
        if self.serving.load(Ordering::SeqCst) == 0 {
            return false;
        }
        crate::sync::lock(&self.jobs).waiting.push_back(job);
        self.ready.notify_one();
        true
    }

    /// The next call, waiting for one; `None` once the pool is closed and drained.
    fn take(&self) -> Option<Job> {
        let mut jobs = crate::sync::lock(&self.jobs);
        loop {
            if let Some(job) = jobs.waiting.pop_front() {
                return Some(job);
            }
            if jobs.closed {
                return None;
            }
            jobs = self
                .ready
                .wait(jobs)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn close(&self) {
        crate::sync::lock(&self.jobs).closed = true;
        self.ready.notify_all();
    }
}

/// A set of sandboxes built from one version of the script.
pub(super) struct Pool {
    pub(super) queue: Arc<Queue>,
    spec: Arc<Spec>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// What a sandbox is built from.
pub(super) struct Spec {
    pub(super) name: String,
    pub(super) source: String,
    pub(super) config: Json,
    pub(super) limits: LuaLimits,
    /// The CPU time its sandbox threads spent, in microseconds (`LuaStats::cpu_us`).
    pub(super) cpu_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Pool {
    /// Builds `n` sandboxes, each on its own thread; fails if any does not compile or `init`
    /// fails.
    /// Queues a call for the next free sandbox; false once the pool is closed.
    pub(super) fn push(&self, job: Job) -> bool {
        self.queue.push(job)
    }

    /// The script this pool runs.
    pub(super) fn source(&self) -> &str {
        &self.spec.source
    }

    pub(super) fn start(spec: Spec, n: usize) -> Result<Pool, String> {
        let spec = Arc::new(spec);
        let pool = Pool {
            queue: Arc::new(Queue::default()),
            spec,
        };
        for _ in 0..n {
            pool.spawn_sandbox()?;
        }
        Ok(pool)
    }

    /// One sandbox thread: builds its state, reports whether that worked, then serves jobs.
    pub(super) fn spawn_sandbox(&self) -> Result<(), String> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let queue = self.queue.clone();
        let spec = self.spec.clone();
        std::thread::Builder::new()
            .name(format!("lua-{}", spec.name))
            .spawn(move || sandbox_thread(spec, queue, ready_tx))
            .map_err(|e| format!("cannot start a sandbox thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the sandbox thread ended before it was ready".to_string())?
    }
}

fn sandbox_thread(spec: Arc<Spec>, queue: Arc<Queue>, ready: mpsc::Sender<Result<(), String>>) {
    let build = || Sandbox::new(&spec.name, &spec.source, &spec.config, spec.limits);
    let sandbox = match build() {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    /// Counts this thread as serving the queue until it ends, however it ends.
    struct Serving<'q>(&'q Queue);
    impl Drop for Serving<'_> {
        fn drop(&mut self) {
            self.0.serving.fetch_sub(1, Ordering::SeqCst);
        }
    }
    queue.serving.fetch_add(1, Ordering::SeqCst);
    let _serving = Serving(&queue);
    let _ = ready.send(Ok(()));
    serve(&spec, &queue, sandbox, build);
}

/// A sandbox thread's calls, until the pool closes, the thread is abandoned by the watchdog,
/// or its sandbox cannot be rebuilt.
fn serve(
    spec: &Spec,
    queue: &Queue,
    mut sandbox: Sandbox,
    build: impl Fn() -> Result<Sandbox, String>,
) {
    // The thread's CPU clock, read once a call after its answer is sent (one system call,
    // off the caller's path): what the thread spent is the listener's CPU time.
    let mut cpu_seen = crate::time::thread_cpu_time();
    loop {
        let Some(job) = queue.take() else {
            return; // the pool was replaced or dropped
        };
        let (result, logs, cost) =
            sandbox.call(&job.payload, &job.meta, job.cancel.clone(), job.clock);
        let rebuild = matches!(&result, Err(e) if e.kind.rebuilds());
        let _ = job.reply.send(Answer {
            result,
            logs,
            memory: sandbox.used_memory(),
            cost,
        });
        let now = crate::time::thread_cpu_time();
        let spent = now.saturating_sub(cpu_seen).as_micros();
        spec.cpu_us
            .fetch_add(u64::try_from(spent).unwrap_or(u64::MAX), Ordering::Relaxed);
        cpu_seen = now;
        if job.abandoned.load(Ordering::Relaxed) {
            return; // a replacement already runs
        }
        if rebuild {
            match build() {
                Ok(s) => sandbox = s,
                Err(e) => {
                    tracing::error!(listener = %spec.name, error = %e, "cannot rebuild a Lua sandbox");
                    return;
                }
            }
        }
    }
}
