//! The messages pending in a tenant's threads, counted together against the tenant's
//! `max_pending_messages` (its active threads are counted in `mod.rs`): an inject is
//! refused at it, a handler's output fails at twice it; so one tenant's agents, however
//! they fan out, cannot fill the organism's queues for the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Quota, ThreadError, ThreadRegistry};
use crate::sync::lock;

/// The count a tenant's threads share, and its bound, as a thread of it holds them.
pub(super) struct OwnerPending {
    owner: Arc<str>,
    count: Arc<AtomicUsize>,
    max: usize,
    key: Arc<str>,
}

impl OwnerPending {
    /// The refusal, if the owner has as many messages pending as it may.
    pub(super) fn full(&self) -> Option<ThreadError> {
        (self.count.load(Ordering::Relaxed) >= self.max).then(|| ThreadError::TooManyPending {
            owner: self.owner.to_string(),
            max: self.max,
            quota: self.key.to_string(),
        })
    }

    /// Why a handler's output fails, if the owner's threads hold twice as many messages
    /// pending as its injects may bring: room for the work under way to finish (each output
    /// of a message handled at the bound), none for a fan-out to grow without end.
    pub(super) fn overflow(&self) -> Option<String> {
        let n = self.count.load(Ordering::Relaxed);
        (n >= self.max.saturating_mul(2)).then(|| {
            format!(
                "tenant `{}` has {n} messages pending in its threads, twice its limit ({}: {})",
                self.owner, self.key, self.max
            )
        })
    }

    pub(super) fn add(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` of the owner's pending messages are done (as many in all as [`Self::add`]ed).
    pub(super) fn done(&self, n: u64) {
        self.count.fetch_sub(n as usize, Ordering::Relaxed);
    }
}

impl ThreadRegistry {
    /// The count `owner`'s threads share, bounded as `quota` says.
    pub(super) fn owner_pending(&self, owner: &Arc<str>, quota: &Quota<'_>) -> Box<OwnerPending> {
        let count = lock(&self.pending_owned)
            .entry(owner.clone())
            .or_default()
            .clone();
        Box::new(OwnerPending {
            owner: owner.clone(),
            count,
            max: quota.max_pending,
            key: Arc::from(quota.pending_key),
        })
    }

    /// Messages pending in the threads `owner` opened (those from before a restart apart).
    pub fn pending_owned(&self, owner: &str) -> usize {
        lock(&self.pending_owned)
            .get(owner)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}
