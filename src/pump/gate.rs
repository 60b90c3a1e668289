//! The organism-wide limit on running handlers (`limits.max_concurrent_handlers`).
//!
//! Uncontended, a permit is one atomic compare-and-swap: no lock. Only when every permit is
//! taken does a caller queue under a mutex; a released permit then goes to the waiter chosen by
//! policy: threads in turn (round robin, so one busy thread cannot starve the others), and
//! within the chosen thread the oldest message (`breadth-first`) or the newest
//! (`depth-first`) by slot index.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::config::Scheduling;

pub(crate) struct Gate {
    max: usize,
    running: AtomicUsize,
    waiting: AtomicUsize,
    scheduling: Scheduling,
    queue: Mutex<Waiters>,
}

#[derive(Default)]
struct Waiters {
    list: Vec<Waiter>,
    arrivals: u64,
    last_thread: Option<Arc<str>>,
}

struct Waiter {
    thread: Arc<str>,
    slot: u64,
    arrival: u64,
    tx: oneshot::Sender<()>,
}

/// A running-handler slot, returned to the gate on drop.
pub(crate) struct Permit<'a> {
    gate: &'a Gate,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.gate.running.fetch_sub(1, Ordering::SeqCst);
        if self.gate.waiting.load(Ordering::SeqCst) > 0 {
            let mut q = self.gate.lock();
            self.gate.hand_over(&mut q);
        }
    }
}

impl Gate {
    pub(crate) fn new(max: usize, scheduling: Scheduling) -> Self {
        Gate {
            max: max.max(1),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            scheduling,
            queue: Mutex::new(Waiters::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        crate::sync::lock(&self.queue)
    }

    fn try_take(&self) -> bool {
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    pub(crate) async fn acquire(&self, thread: &Arc<str>, slot: u64) -> Permit<'_> {
        if self.try_take() {
            return Permit { gate: self };
        }
        let rx = {
            let mut q = self.lock();
            let (tx, rx) = oneshot::channel();
            q.arrivals += 1;
            let arrival = q.arrivals;
            q.list.push(Waiter {
                thread: thread.clone(),
                slot,
                arrival,
                tx,
            });
            self.waiting.fetch_add(1, Ordering::SeqCst);
            // A permit may have been released between the failed take and the push.
            self.hand_over(&mut q);
            rx
        };
        // The sender is only dropped after sending, so this cannot fail; if it ever did, the
        // slot was still counted for us.
        let _ = rx.await;
        Permit { gate: self }
    }

    /// Gives free permits to waiters chosen by policy. Called with the waiters locked.
    fn hand_over(&self, q: &mut Waiters) {
        while !q.list.is_empty() && self.try_take() {
            let index = self.choose(q);
            let waiter = q.list.swap_remove(index);
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            q.last_thread = Some(waiter.thread.clone());
            if waiter.tx.send(()).is_err() {
                // The waiter went away (its task was cancelled): return the permit.
                self.running.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn choose(&self, q: &Waiters) -> usize {
        // Threads in order of their earliest waiter; take the first that is not the thread
        // served last, so threads alternate.
        let mut threads: Vec<(&Arc<str>, u64)> = Vec::new();
        for w in &q.list {
            match threads.iter_mut().find(|(t, _)| *t == &w.thread) {
                Some(entry) => entry.1 = entry.1.min(w.arrival),
                None => threads.push((&w.thread, w.arrival)),
            }
        }
        threads.sort_by_key(|(_, first)| *first);
        let thread = threads
            .iter()
            .find(|(t, _)| Some(*t) != q.last_thread.as_ref())
            .or_else(|| threads.first())
            .map(|(t, _)| (*t).clone());
        let mut best: Option<(usize, u64)> = None;
        for (i, w) in q.list.iter().enumerate() {
            if Some(&w.thread) != thread.as_ref() {
                continue;
            }
            let better = match best {
                None => true,
                Some((_, slot)) => match self.scheduling {
                    Scheduling::BreadthFirst => w.slot < slot,
                    Scheduling::DepthFirst => w.slot > slot,
                },
            };
            if better {
                best = Some((i, w.slot));
            }
        }
        best.map(|(i, _)| i).unwrap_or(0)
    }
}
