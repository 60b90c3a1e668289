//! What the registry tells of its threads: a thread's status, log, token and summary, and
//! counts over them all.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{lock, MessageRecord, MessageStatus, ThreadInfo, ThreadRegistry, ThreadStatus};

impl ThreadRegistry {
    /// Whether `thread` was killed, or is not held.
    pub fn is_cancelled(&self, thread: &str) -> bool {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .is_none_or(|e| e.status == ThreadStatus::Killed)
    }

    /// The thread's cancellation token, cancelled by its next stop (already cancelled for a
    /// killed thread).
    pub fn cancel_token(&self, thread: &str) -> Option<CancellationToken> {
        let mut shard = lock(self.shard(thread));
        let e = shard.threads.get_mut(thread)?;
        if e.status == ThreadStatus::Killed {
            let token = CancellationToken::new();
            token.cancel();
            return Some(token);
        }
        Some(e.cancel.get_or_insert_with(CancellationToken::new).clone())
    }

    pub fn status(&self, thread: &str) -> Option<ThreadStatus> {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .map(|e| e.status)
    }

    pub fn info(&self, thread: &str) -> Option<ThreadInfo> {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .map(|e| e.info(thread))
    }

    /// The thread's message log, in slot order.
    pub fn messages(&self, thread: &str) -> Option<Vec<MessageRecord>> {
        self.log(thread, 0, usize::MAX)
            .map(|(_, messages)| messages)
    }

    /// The part of the thread's log held here: the slot it starts at (above 0 for a thread
    /// continued after a restart, whose earlier messages are only in the store) and at most
    /// `limit` of its messages from slot `from` on (or from there), in slot order.
    pub fn log(&self, thread: &str, from: u64, limit: usize) -> Option<(u64, Vec<MessageRecord>)> {
        let shard = lock(self.shard(thread));
        let e = shard.threads.get(thread)?;
        let skip = usize::try_from(from.saturating_sub(e.slot_base)).unwrap_or(usize::MAX);
        let part = e.messages.iter().skip(skip).take(limit).cloned().collect();
        Some((e.slot_base, part))
    }

    /// Every retained thread, newest first.
    pub fn list(&self) -> Vec<ThreadInfo> {
        let mut all: Vec<ThreadInfo> = self
            .shards
            .iter()
            .flat_map(|s| {
                let s = lock(s);
                s.threads
                    .iter()
                    .map(|(id, e)| e.info(id))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        all
    }

    /// Messages logged since start.
    pub fn total_messages(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).appended).sum()
    }

    /// Messages that reached a final status, by receiver (`""` if none) and status.
    pub fn final_counts(&self) -> Vec<(String, MessageStatus, u64)> {
        let mut all: HashMap<(Arc<str>, MessageStatus), u64> = HashMap::new();
        for s in &self.shards {
            for (k, n) in &lock(s).finals {
                *all.entry(k.clone()).or_default() += n;
            }
        }
        let mut v: Vec<_> = all
            .into_iter()
            .map(|((to, st), n)| (to.to_string(), st, n))
            .collect();
        v.sort_by(|a, b| (&a.0, a.1 as u8).cmp(&(&b.0, b.1 as u8)));
        v
    }

    /// Threads that are active.
    pub fn active_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .threads
                    .values()
                    .filter(|e| e.status == ThreadStatus::Active)
                    .count()
            })
            .sum()
    }

    /// Ids of threads that are active.
    pub fn active_ids(&self) -> Vec<String> {
        self.shards
            .iter()
            .flat_map(|s| {
                let s = lock(s);
                s.threads
                    .iter()
                    .filter(|(_, e)| e.status == ThreadStatus::Active)
                    .map(|(id, _)| id.to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}
