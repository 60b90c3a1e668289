//! A thread's labels: `key: value` pairs a client attaches (inject's `labels`,
//! `PATCH /threads/{id}`) and finds threads by (`/threads?label=k:v`). At most
//! [`MAX_LABELS`], keys `[a-z0-9_.-]{1,64}`, values at most [`MAX_LABEL_VALUE_BYTES`]; a key
//! that names a secret (`token`, `password`, …) is refused, and keys under
//! [`RESERVED_PREFIX`] are the server's.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{lock, ThreadError, ThreadRegistry};

/// A thread's labels, by key.
pub type Labels = BTreeMap<String, String>;

/// A change of labels: each key set, or removed (`None`).
pub type LabelPatch = BTreeMap<String, Option<String>>;

/// Labels a thread holds at most.
pub const MAX_LABELS: usize = 16;
/// Bytes of a label's value, at most.
pub const MAX_LABEL_VALUE_BYTES: usize = 256;
/// Keys under this prefix are written by the server only (and not counted in
/// [`MAX_LABELS`]).
pub const RESERVED_PREFIX: &str = "agentserver.";
/// A fork's labels: the thread it was forked from, and the message it was forked at.
pub const FORKED_FROM: &str = "agentserver.forked_from";
pub const FORKED_AT: &str = "agentserver.forked_at";

/// A label refused: its key (empty: the labels as a whole), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if key.is_empty() { "labels: ".to_string() } else { format!("label `{key}`: ") })]
pub struct LabelError {
    pub key: String,
    pub message: String,
}

/// Checks one label as a client writes it.
pub fn check_label(key: &str, value: Option<&str>) -> Result<(), LabelError> {
    let bad = |message: &str| LabelError {
        key: crate::clip::clip(key.to_string(), 80),
        message: message.to_string(),
    };
    let well_formed = (1..=64).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if !well_formed {
        return Err(bad("a key is 1 to 64 of a-z 0-9 _ . -"));
    }
    if key.starts_with(RESERVED_PREFIX) {
        return Err(bad("keys under `agentserver.` are the server's"));
    }
    if crate::config::secret::is_secret_key(key) {
        return Err(bad(
            "names a secret; labels are shown to every reader of the thread",
        ));
    }
    if value.is_some_and(|v| v.len() > MAX_LABEL_VALUE_BYTES) {
        return Err(bad("a value is at most 256 bytes"));
    }
    Ok(())
}

/// Labels to add, as a patch that sets each.
pub fn as_patch(labels: &Labels) -> LabelPatch {
    labels
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect()
}

/// `now` with `patch` applied, checked whole: every key, and at most [`MAX_LABELS`].
pub fn patched(now: Option<&Labels>, patch: &LabelPatch) -> Result<Labels, LabelError> {
    let mut out = now.cloned().unwrap_or_default();
    for (k, v) in patch {
        check_label(k, v.as_deref())?;
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    if out
        .keys()
        .filter(|k| !k.starts_with(RESERVED_PREFIX))
        .count()
        > MAX_LABELS
    {
        return Err(LabelError {
            key: String::new(),
            message: format!("a thread holds at most {MAX_LABELS} labels"),
        });
    }
    Ok(out)
}

impl ThreadRegistry {
    /// The thread's labels, if it has any.
    pub fn labels(&self, thread: &str) -> Option<Arc<Labels>> {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .and_then(|e| e.labels.clone())
    }

    /// Replaces the thread's labels (none when empty).
    pub fn set_labels(&self, thread: &str, labels: Labels) -> Result<(), ThreadError> {
        let mut shard = lock(self.shard(thread));
        let e = shard
            .threads
            .get_mut(thread)
            .ok_or_else(|| ThreadError::NotFound(thread.to_string()))?;
        e.labels = (!labels.is_empty()).then(|| Arc::new(labels));
        Ok(())
    }
}
