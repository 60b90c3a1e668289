//! A thread's `settings`: what a client chose for the `kind: llm` listeners that handle its
//! messages (`PATCH /threads/{id}`, the `/ws` `settings` command). Each listener applies only
//! what its `overridable` names; a model is applied only if the listener may choose it.

use std::sync::Arc;

pub use crate::config::llm::ThreadSettings;

use super::{lock, ThreadError, ThreadRegistry};

impl ThreadRegistry {
    /// The thread's settings, if it has any.
    pub fn settings(&self, thread: &str) -> Option<Arc<ThreadSettings>> {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .and_then(|e| e.settings.clone())
    }

    /// Replaces the thread's settings.
    pub fn set_settings(
        &self,
        thread: &str,
        settings: Option<Arc<ThreadSettings>>,
    ) -> Result<(), ThreadError> {
        let mut shard = lock(self.shard(thread));
        let e = shard
            .threads
            .get_mut(thread)
            .ok_or_else(|| ThreadError::NotFound(thread.to_string()))?;
        e.settings = settings;
        Ok(())
    }
}
