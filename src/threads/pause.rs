//! A thread paused: its queued messages wait (the pump's workers pass it by), other
//! threads of the same listeners go on; resumed, they are delivered in order. Kept in
//! memory: a restart resumes every thread (its queued messages are gone with it anyway).

use std::sync::atomic::Ordering;

use super::{lock, StatusChange, ThreadError, ThreadRegistry};

impl ThreadRegistry {
    /// Pauses (or resumes) the thread: its change, or none if it was so already.
    pub fn set_paused(
        &self,
        thread: &str,
        paused: bool,
    ) -> Result<Option<StatusChange>, ThreadError> {
        let mut shard = lock(self.shard(thread));
        let e = shard
            .threads
            .get_mut(thread)
            .ok_or_else(|| ThreadError::NotFound(thread.to_string()))?;
        if e.paused == paused {
            return Ok(None);
        }
        e.paused = paused;
        if paused {
            self.paused.fetch_add(1, Ordering::SeqCst);
        } else {
            self.paused.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(Some(e.change()))
    }

    /// Whether the thread is paused; without a lock while no thread is.
    pub fn is_paused(&self, thread: &str) -> bool {
        self.paused.load(Ordering::SeqCst) > 0
            && lock(self.shard(thread))
                .threads
                .get(thread)
                .is_some_and(|e| e.paused)
    }

    /// A thread let go of (`paused` as it was).
    pub(super) fn forget_pause(&self, paused: bool) {
        if paused {
            self.paused.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
