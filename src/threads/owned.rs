//! The messages pending in a tenant's threads, counted together against the tenant's
//! `max_pending_messages` (its active threads are counted in `mod.rs`): an inject is
//! refused at it, a handler's output fails at twice it; so one tenant's agents, however
//! they fan out, cannot fill the organism's queues for the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{Quota, ThreadError, ThreadRegistry};
use crate::sync::lock;

/// What a tenant's threads share: their pending messages, and the bound as the latest
/// inject of it that opened (or tried to open) a thread read it from the configuration, so
/// a reload's change holds for all its threads from then on.
#[derive(Default)]
pub(super) struct Owned {
    count: AtomicUsize,
    max: AtomicUsize,
    /// The setting the bound comes from (`tenants.acme.max_pending_messages`).
    key: Mutex<Arc<str>>,
}

/// A thread's hold on its owner's [`Owned`].
pub(super) struct OwnerPending {
    owner: Arc<str>,
    shared: Arc<Owned>,
}

impl OwnerPending {
    fn count_and_max(&self) -> (usize, usize) {
        let s = &self.shared;
        (
            s.count.load(Ordering::Relaxed),
            s.max.load(Ordering::Relaxed),
        )
    }

    /// The refusal, if the owner has as many messages pending as it may.
    pub(super) fn full(&self) -> Option<ThreadError> {
        let (n, max) = self.count_and_max();
        (n >= max).then(|| ThreadError::TooManyPending {
            owner: self.owner.to_string(),
            max,
            quota: lock(&self.shared.key).to_string(),
        })
    }

    /// Why a handler's output fails, if the owner's threads hold twice as many messages
    /// pending as its injects may bring: room for the work under way to finish (each output
    /// of a message handled at the bound), none for a fan-out to grow without end.
    pub(super) fn overflow(&self) -> Option<String> {
        let (n, max) = self.count_and_max();
        (n >= max.saturating_mul(2)).then(|| {
            format!(
                "tenant `{}` has {n} messages pending in its threads, twice its limit ({}: {max})",
                self.owner,
                lock(&self.shared.key)
            )
        })
    }

    pub(super) fn add(&self) {
        self.shared.count.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` of the owner's pending messages are done (as many in all as [`Self::add`]ed).
    pub(super) fn done(&self, n: u64) {
        self.shared.count.fetch_sub(n as usize, Ordering::Relaxed);
    }
}

impl ThreadRegistry {
    /// A hold on what `owner`'s threads share, its bound set as `quota` says.
    pub(super) fn owner_pending(&self, owner: &Arc<str>, quota: &Quota<'_>) -> Box<OwnerPending> {
        let shared = lock(&self.pending_owned)
            .entry(owner.clone())
            .or_default()
            .clone();
        shared.max.store(quota.max_pending, Ordering::Relaxed);
        let mut key = lock(&shared.key);
        if **key != *quota.pending_key {
            *key = Arc::from(quota.pending_key);
        }
        drop(key);
        Box::new(OwnerPending {
            owner: owner.clone(),
            shared,
        })
    }

    /// Messages pending in the threads `owner` opened (those from before a restart apart).
    pub fn pending_owned(&self, owner: &str) -> usize {
        lock(&self.pending_owned)
            .get(owner)
            .map_or(0, |c| c.count.load(Ordering::Relaxed))
    }
}
