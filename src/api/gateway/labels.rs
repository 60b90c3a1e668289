//! The labels of the threads a gateway has heard of, for its sessions' label filters: set
//! from the mirrored events as they are read (`thread_created`, `thread_updated`,
//! `thread_labels`) and from the snapshot's threads, before an event reaches the hub, so a
//! session tests an event against its thread's labels as the gateway last heard them (as the
//! pump tests against its registry's). Bounded by [`LABELLED_THREADS`] and
//! [`LABEL_BYTES`]: the threads labelled longest ago are forgotten first (their events then
//! pass only tests a thread without labels passes, as a thread the pump no longer holds).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::events::EventKind;
use crate::threads::Labels;

/// Labelled threads a gateway remembers, at most.
pub const LABELLED_THREADS: usize = 65_536;

/// Bytes of labels (keys, values, thread ids) a gateway remembers, at most.
pub const LABEL_BYTES: usize = 32 << 20;

#[derive(Default)]
pub(super) struct ThreadLabels {
    /// Each labelled thread's labels, what they weigh, and when they were set.
    by_thread: HashMap<Arc<str>, (Arc<Labels>, usize, u64)>,
    /// Threads in the order their labels were set, with when: an entry whose thread was set
    /// again since is stale, passed over when it comes to the front.
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    sets: u64,
}

impl ThreadLabels {
    /// The labels `thread` has, as last heard.
    pub(super) fn get(&self, thread: &str) -> Option<Arc<Labels>> {
        self.by_thread.get(thread).map(|(l, _, _)| l.clone())
    }

    /// Notes what `kind` says of a thread's labels.
    pub(super) fn note(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ThreadCreated { thread } => self.set(&thread.id, thread.labels.clone()),
            EventKind::ThreadUpdated {
                thread_id, labels, ..
            } => self.set(thread_id, labels.clone()),
            EventKind::ThreadLabels { thread_id, labels } => self.set(thread_id, labels.clone()),
            _ => {}
        }
    }

    /// Notes the labels of a snapshot's thread (its JSON view).
    pub(super) fn note_view(&mut self, thread: &serde_json::Value) {
        let Some(id) = thread["id"].as_str() else {
            return;
        };
        let labels = serde_json::from_value::<Labels>(thread["labels"].clone()).ok();
        self.set(id, labels.map(Arc::new));
    }

    fn set(&mut self, thread: &str, labels: Option<Arc<Labels>>) {
        if let Some((_, weight, _)) = self.by_thread.remove(thread) {
            self.bytes -= weight;
        }
        let Some(labels) = labels.filter(|l| !l.is_empty()) else {
            return;
        };
        let weight = thread.len()
            + labels
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>();
        self.sets += 1;
        let id: Arc<str> = Arc::from(thread);
        self.by_thread
            .insert(id.clone(), (labels, weight, self.sets));
        self.order.push_back((id, self.sets));
        self.bytes += weight;
        while self.by_thread.len() > LABELLED_THREADS || self.bytes > LABEL_BYTES {
            let Some((oldest, set)) = self.order.pop_front() else {
                break;
            };
            if self.by_thread.get(&oldest).is_some_and(|e| e.2 == set) {
                if let Some((_, weight, _)) = self.by_thread.remove(&oldest) {
                    self.bytes -= weight;
                }
            }
        }
        // Stale entries are dropped once they are as many as the live ones.
        if self.order.len() > 2 * self.by_thread.len().max(1024) {
            let live = &self.by_thread;
            self.order
                .retain(|(id, set)| live.get(id).is_some_and(|e| e.2 == *set));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &str) -> Option<Arc<Labels>> {
        Some(Arc::new([("customer".to_string(), v.to_string())].into()))
    }

    #[test]
    fn labels_follow_their_thread_and_the_oldest_go_first() {
        let mut t = ThreadLabels::default();
        t.set("a", labels("1"));
        t.set("b", labels("2"));
        t.set("a", labels("3"));
        assert_eq!(t.get("a"), labels("3"));
        t.set("b", None);
        assert_eq!(t.get("b"), None);
        for i in 0..LABELLED_THREADS + 10 {
            t.set(&format!("t{i}"), labels("x"));
        }
        assert_eq!(t.by_thread.len(), LABELLED_THREADS);
        assert_eq!(t.get("a"), None, "the oldest forgotten");
        assert!(t.get(&format!("t{}", LABELLED_THREADS + 9)).is_some());
        assert!(t.order.len() <= 2 * LABELLED_THREADS);
        // A thread set again often keeps one live entry, and stale ones are dropped.
        for _ in 0..5 * LABELLED_THREADS {
            t.set("hot", labels("y"));
        }
        assert!(t.order.len() <= 2 * LABELLED_THREADS + 1);
        assert_eq!(t.get("hot"), labels("y"));
        let weights: usize = t.by_thread.values().map(|e| e.1).sum();
        assert_eq!(weights, t.bytes);
        assert!(t.bytes <= LABEL_BYTES);
    }
}
