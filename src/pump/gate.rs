//! The organism-wide limit on running handlers (`limits.max_concurrent_handlers`).
//!
//! Uncontended, a permit is one atomic compare-and-swap: no lock. Only when every permit is
//! taken does a caller queue under a mutex; a released permit then goes to the waiter chosen by
//! policy: tenants in turn (the one served longest ago first, so a tenant with many threads
//! or agents cannot starve another; listeners of no tenant are one more), then that tenant's
//! threads in turn (round robin, so one busy thread cannot starve the others), and within the
//! chosen thread the oldest message (`breadth-first`) or the newest (`depth-first`) by slot
//! index.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::config::Scheduling;
use crate::hash::SeededMap;

pub(crate) struct Gate {
    max: usize,
    running: AtomicUsize,
    waiting: AtomicUsize,
    scheduling: Scheduling,
    queue: Mutex<Waiters>,
}

/// Tenants remembered when they have nothing waiting, at most (beyond it, they are
/// forgotten, and rank as never served when they come back).
const REMEMBERED_TENANTS: usize = 256;

#[derive(Default)]
struct Waiters {
    list: Vec<Waiter>,
    arrivals: u64,
    last_thread: Option<Arc<str>>,
    /// Permits handed over, ever, and the count when each tenant was last served.
    turns: u64,
    served: SeededMap<Option<Arc<str>>, u64>,
}

struct Waiter {
    tenant: Option<Arc<str>>,
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

    /// A permit for a call of a listener of `tenant` in `thread`, on message `slot`.
    pub(crate) async fn acquire(
        &self,
        tenant: Option<&str>,
        thread: &Arc<str>,
        slot: u64,
    ) -> Permit<'_> {
        if self.try_take() {
            return Permit { gate: self };
        }
        let rx = {
            let mut q = self.lock();
            let (tx, rx) = oneshot::channel();
            q.arrivals += 1;
            let arrival = q.arrivals;
            q.list.push(Waiter {
                tenant: tenant.map(Arc::from),
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
            q.turns += 1;
            let turn = q.turns;
            q.served.insert(waiter.tenant.clone(), turn);
            if q.served.len() > REMEMBERED_TENANTS {
                let list = &q.list;
                q.served.retain(|t, _| list.iter().any(|w| &w.tenant == t));
            }
            if waiter.tx.send(()).is_err() {
                // The waiter went away (its task was cancelled): return the permit.
                self.running.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn choose(&self, q: &Waiters) -> usize {
        // The tenant served longest ago (never: first), ties to the earliest waiter.
        let tenant = q
            .list
            .iter()
            .min_by_key(|w| (q.served.get(&w.tenant).copied().unwrap_or(0), w.arrival))
            .map(|w| w.tenant.clone());
        let mine = |w: &&Waiter| Some(&w.tenant) == tenant.as_ref();
        // Its threads in order of their earliest waiter; take the first that is not the
        // thread served last, so threads alternate.
        let mut threads: Vec<(&Arc<str>, u64)> = Vec::new();
        for w in q.list.iter().filter(mine) {
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
            if Some(&w.thread) != thread.as_ref() || !mine(&w) {
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
