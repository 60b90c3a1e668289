//! The labels of the threads a gateway has heard of, for its sessions' label filters: set
//! from the mirrored events as they are read (`thread_created`, `thread_updated`,
//! `thread_labels`) and from the snapshot's threads, before an event reaches the hub, so a
//! session tests an event against its thread's labels as the gateway last heard them (as the
//! pump tests against its registry's). Bounded by [`LABELLED_THREADS`] and
//! [`LABEL_BYTES`]: the threads labelled longest ago are forgotten first (their events then
//! pass only tests a thread without labels passes, as a thread the pump no longer holds).

use std::sync::Arc;

use crate::events::EventKind;
use crate::recent::Recent;
use crate::threads::Labels;

/// Labelled threads a gateway remembers, at most.
pub const LABELLED_THREADS: usize = 65_536;

/// Bytes of labels (keys, values, thread ids) a gateway remembers, at most.
pub const LABEL_BYTES: usize = 32 << 20;

/// Each labelled thread's labels, the threads labelled longest ago first.
pub(super) struct ThreadLabels(Recent<Arc<Labels>>);

impl Default for ThreadLabels {
    fn default() -> Self {
        ThreadLabels(Recent::new(LABELLED_THREADS, LABEL_BYTES))
    }
}

impl ThreadLabels {
    /// The labels `thread` has, as last heard.
    pub(super) fn get(&self, thread: &str) -> Option<Arc<Labels>> {
        self.0.get(thread).cloned()
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
        let Some(labels) = labels.filter(|l| !l.is_empty()) else {
            self.0.remove(thread);
            return;
        };
        let weight = thread.len()
            + labels
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>();
        self.0.insert(Arc::from(thread), labels, weight);
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
        assert_eq!(t.0.len(), LABELLED_THREADS);
        assert_eq!(t.get("a"), None, "the oldest forgotten");
        assert!(t.get(&format!("t{}", LABELLED_THREADS + 9)).is_some());
        assert!(t.0.order_len() <= 2 * LABELLED_THREADS);
        // A thread set again often keeps one live entry, and stale ones are dropped.
        for _ in 0..5 * LABELLED_THREADS {
            t.set("hot", labels("y"));
        }
        assert!(t.0.order_len() <= 2 * LABELLED_THREADS + 1);
        assert_eq!(t.get("hot"), labels("y"));
        assert_eq!(t.0.len(), LABELLED_THREADS);
        assert_eq!(t.0.weights(), t.0.bytes());
        assert!(t.0.bytes() <= LABEL_BYTES);
    }
}
