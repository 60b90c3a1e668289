//! A thread rewound to one of its messages: every message after it is superseded (kept,
//! hidden from its listings unless asked for, left out of an LLM listener's context), and
//! the message enters again at a new slot (slots never go back). A rewind is kept as the
//! slots it superseded: those between its message and the slot the thread had reached.

use super::{lock, ThreadError, ThreadRegistry};

/// One rewind: the messages with a slot above `after` and below `before` were superseded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rewind {
    pub after: u64,
    pub before: u64,
}

/// Whether the message at `slot` was superseded by one of `rewinds`.
pub fn superseded(rewinds: &[Rewind], slot: u64) -> bool {
    rewinds.iter().any(|r| slot > r.after && slot < r.before)
}

impl ThreadRegistry {
    /// Rewinds the thread to the message at slot `after`: the rewind kept (every message
    /// logged since is superseded).
    pub fn rewind(&self, thread: &str, after: u64) -> Result<Rewind, ThreadError> {
        let mut shard = lock(self.shard(thread));
        let e = shard
            .threads
            .get_mut(thread)
            .ok_or_else(|| ThreadError::NotFound(thread.to_string()))?;
        let r = Rewind {
            after,
            before: e.count(),
        };
        e.rewinds.push(r);
        Ok(r)
    }

    /// The thread's rewinds while it is held here (since it was).
    pub fn rewinds(&self, thread: &str) -> Vec<Rewind> {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .map(|e| e.rewinds.clone())
            .unwrap_or_default()
    }
}
