//! A thread's error: the first its messages met (it ends `error`), and its forgetting when
//! a failure is retried.

use super::{lock, ThreadRegistry};

impl ThreadRegistry {
    /// Records a failure on the thread (the first one is kept).
    pub fn record_error(&self, thread: &str, error: &str) {
        let mut shard = lock(self.shard(thread));
        if let Some(e) = shard.threads.get_mut(thread) {
            if e.error.is_none() {
                e.error = Some(error.to_string());
            }
        }
    }

    /// Forgets the thread's error: a failure is being retried (it ends `error` again only if
    /// something fails after).
    pub fn clear_error(&self, thread: &str) {
        if let Some(e) = lock(self.shard(thread)).threads.get_mut(thread) {
            e.error = None;
        }
    }
}
