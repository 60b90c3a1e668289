//! The labels of the threads a gateway has heard of, for its sessions' label filters: set
//! from the mirrored events as they are read (`thread_created`, `thread_updated`,
//! `thread_labels`) and from the snapshot's threads, before an event reaches the hub, so a
//! session tests an event against its thread's labels as the gateway last heard them (as the
//! pump tests against its registry's). Open threads (last heard active or waiting) and
//! finished ones are kept apart, each bounded by [`LABELLED_THREADS`] and [`LABEL_BYTES`],
//! the threads labelled longest ago forgotten first (their events then pass only tests a
//! thread without labels passes, as a thread the pump no longer holds). A finished thread
//! makes room only among the finished: one tenant's many threads, each finished in turn,
//! never make another tenant's open thread forgotten (the pump bounds a tenant's open
//! threads: `max_active_threads`, `max_open_inputs`). A thread the gateway has not heard of
//! is counted among the finished.

use std::sync::Arc;

use crate::events::EventKind;
use crate::recent::Recent;
use crate::threads::{Labels, ThreadStatus};

/// Labelled threads a gateway remembers, at most: open ones, and finished ones apart.
pub const LABELLED_THREADS: usize = 65_536;

/// Bytes of labels (keys, values, thread ids) a gateway remembers, at most: of open
/// threads, and of finished ones apart.
pub const LABEL_BYTES: usize = 32 << 20;

/// Each labelled thread's labels, the threads labelled longest ago first: the open threads'
/// and the finished threads' apart.
pub(super) struct ThreadLabels {
    open: Recent<Arc<Labels>>,
    finished: Recent<Arc<Labels>>,
}

impl Default for ThreadLabels {
    fn default() -> Self {
        ThreadLabels {
            open: Recent::new(LABELLED_THREADS, LABEL_BYTES),
            finished: Recent::new(LABELLED_THREADS, LABEL_BYTES),
        }
    }
}

impl ThreadLabels {
    /// The labels `thread` has, as last heard.
    pub(super) fn get(&self, thread: &str) -> Option<Arc<Labels>> {
        self.open
            .get(thread)
            .or_else(|| self.finished.get(thread))
            .cloned()
    }

    /// Notes what `kind` says of a thread's labels.
    pub(super) fn note(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ThreadCreated { thread } => {
                self.set(&thread.id, thread.labels.clone(), Some(thread.status))
            }
            EventKind::ThreadUpdated {
                thread_id,
                labels,
                status,
                ..
            } => self.set(thread_id, labels.clone(), Some(*status)),
            EventKind::ThreadLabels { thread_id, labels } => {
                self.set(thread_id, labels.clone(), None)
            }
            _ => {}
        }
    }

    /// Notes the labels of a snapshot's thread (its JSON view).
    pub(super) fn note_view(&mut self, thread: &serde_json::Value) {
        let Some(id) = thread["id"].as_str() else {
            return;
        };
        let labels = serde_json::from_value::<Labels>(thread["labels"].clone()).ok();
        let status = serde_json::from_value::<ThreadStatus>(thread["status"].clone()).ok();
        self.set(id, labels.map(Arc::new), status);
    }

    /// Notes `thread`'s labels, and whether it is open or finished by `status` (none: as
    /// last heard; a thread not heard of is counted among the finished).
    fn set(&mut self, thread: &str, labels: Option<Arc<Labels>>, status: Option<ThreadStatus>) {
        let was_open = self.open.remove(thread).is_some();
        self.finished.remove(thread);
        let Some(labels) = labels.filter(|l| !l.is_empty()) else {
            return;
        };
        let open = status.map_or(was_open, |s| !s.is_finished());
        let weight = thread.len()
            + labels
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>();
        let side = if open {
            &mut self.open
        } else {
            &mut self.finished
        };
        side.insert(Arc::from(thread), labels, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::ThreadInfo;
    use crate::time::Timestamp;

    fn labels(v: &str) -> Option<Arc<Labels>> {
        Some(Arc::new([("customer".to_string(), v.to_string())].into()))
    }

    fn created(id: &str, v: &str) -> EventKind {
        EventKind::ThreadCreated {
            thread: ThreadInfo {
                id: id.to_string(),
                status: ThreadStatus::Active,
                participants: Vec::new(),
                message_count: 0,
                created_at: Timestamp::now(),
                last_activity: Timestamp::now(),
                error: None,
                settings: None,
                labels: labels(v),
                paused: false,
                owner: None,
            },
        }
    }

    fn updated(id: &str, status: ThreadStatus, v: &str) -> EventKind {
        EventKind::ThreadUpdated {
            thread_id: id.into(),
            status,
            message_count: 1,
            error: None,
            paused: false,
            labels: labels(v),
        }
    }

    #[test]
    fn labels_follow_their_thread_and_the_oldest_go_first() {
        let mut t = ThreadLabels::default();
        let open = Some(ThreadStatus::Active);
        t.set("a", labels("1"), open);
        t.set("b", labels("2"), open);
        t.set("a", labels("3"), open);
        assert_eq!(t.get("a"), labels("3"));
        t.set("b", None, open);
        assert_eq!(t.get("b"), None);
        for i in 0..LABELLED_THREADS + 10 {
            t.set(&format!("t{i}"), labels("x"), open);
        }
        assert_eq!(t.open.len(), LABELLED_THREADS);
        assert_eq!(t.get("a"), None, "the oldest forgotten");
        assert!(t.get(&format!("t{}", LABELLED_THREADS + 9)).is_some());
        assert!(t.open.order_len() <= 2 * LABELLED_THREADS);
        // A thread set again often keeps one live entry, and stale ones are dropped.
        for _ in 0..5 * LABELLED_THREADS {
            t.set("hot", labels("y"), open);
        }
        assert!(t.open.order_len() <= 2 * LABELLED_THREADS + 1);
        assert_eq!(t.get("hot"), labels("y"));
        assert_eq!(t.open.len(), LABELLED_THREADS);
        assert_eq!(t.open.weights(), t.open.bytes());
        assert!(t.open.bytes() <= LABEL_BYTES);
    }

    /// The attacker is a tenant opening and finishing labelled threads (or relabelling ones
    /// the gateway forgot) for as long as it likes; the victim is another tenant's thread
    /// waiting for a person's answer, labelled before all of them.
    #[test]
    fn one_tenants_finished_threads_never_make_anothers_open_thread_forgotten() {
        let mut t = ThreadLabels::default();
        t.note(&created("beta-waiting", "beta"));
        t.note(&updated("beta-waiting", ThreadStatus::Waiting, "beta"));
        for i in 0..2 * LABELLED_THREADS {
            let id = format!("acme-{i}");
            t.note(&created(&id, "acme"));
            t.note(&updated(&id, ThreadStatus::Completed, "acme"));
        }
        // Relabelling threads the gateway no longer knows counts them among the finished.
        for i in 0..LABELLED_THREADS {
            t.note(&EventKind::ThreadLabels {
                thread_id: format!("acme-{i}").into(),
                labels: labels("again"),
            });
        }
        assert_eq!(
            t.get("beta-waiting"),
            labels("beta"),
            "beta's open thread kept"
        );
        assert_eq!(t.open.len(), 1);
        assert_eq!(t.finished.len(), LABELLED_THREADS);
        // A finished thread heard of again keeps its place; revived, it is open again.
        let last = format!("acme-{}", 2 * LABELLED_THREADS - 1);
        t.note(&EventKind::ThreadLabels {
            thread_id: last.as_str().into(),
            labels: labels("kept"),
        });
        assert!(t.finished.contains(&last));
        t.note(&updated(&last, ThreadStatus::Active, "kept"));
        assert!(t.open.contains(&last) && !t.finished.contains(&last));
        // Relabelling an open thread keeps it open; its labels removed, it is forgotten.
        t.note(&EventKind::ThreadLabels {
            thread_id: "beta-waiting".into(),
            labels: labels("beta2"),
        });
        assert!(t.open.contains("beta-waiting"));
        t.note(&EventKind::ThreadLabels {
            thread_id: "beta-waiting".into(),
            labels: None,
        });
        assert_eq!(t.get("beta-waiting"), None);
        // A snapshot's thread is open or finished by its status.
        t.note_view(&serde_json::json!({"id": "v1", "status": "waiting", "labels": {"k": "v"}}));
        t.note_view(&serde_json::json!({"id": "v2", "status": "error", "labels": {"k": "v"}}));
        assert!(t.open.contains("v1") && t.finished.contains("v2"));
    }
}
