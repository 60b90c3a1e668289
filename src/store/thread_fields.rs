//! What a thread row holds beyond its counters: its `settings`, `labels` and `rewinds` read
//! back from their JSON columns, and `/threads`'s label tests as clauses over
//! `thread_labels`.

use super::{in_list, Where};
use crate::threads::ThreadFilter;

/// `/threads`'s label tests and `q`, as clauses over `thread_labels` (by key and value).
pub(super) fn label_clauses(w: &mut Where, filter: &ThreadFilter, payloads: bool) {
    use crate::threads::LabelTest;
    use rusqlite::types::Value as V;
    // The threads a test names, found by key and value (the table's key): the set SQLite
    // reads first, then each thread by its number.
    const WITH: &str = "SELECT thread FROM thread_labels WHERE key = ?";
    for test in &filter.labels {
        match test {
            LabelTest::Is(k, vs) => w.and(
                format!("n IN ({WITH} AND value IN ({}))", in_list(vs.len())),
                std::iter::once(V::Text(k.clone())).chain(vs.iter().map(|v| V::Text(v.clone()))),
            ),
            LabelTest::IsNot(k, v) => w.and(
                format!("n NOT IN ({WITH} AND value = ?)"),
                [V::Text(k.clone()), V::Text(v.clone())],
            ),
            LabelTest::Has(k) => w.and(format!("n IN ({WITH})"), [V::Text(k.clone())]),
            LabelTest::Lacks(k) => w.and(format!("n NOT IN ({WITH})"), [V::Text(k.clone())]),
        }
    }
    if let Some(q) = &filter.q {
        // The labels' set is read once (not per thread): a scan of `thread_labels`.
        let mentions = "instr(id, ?) > 0 OR instr(COALESCE(error, ''), ?) > 0 OR n IN \
             (SELECT thread FROM thread_labels WHERE instr(key, ?) > 0 OR instr(value, ?) > 0)";
        let text = std::iter::repeat_n(V::Text(q.clone()), 4);
        match super::search::phrase(q).filter(|_| payloads) {
            Some(phrase) => w.and(
                format!("({mentions} OR n IN {})", super::search::THREADS_MATCHING),
                text.chain([V::Text(phrase)]),
            ),
            None => w.and(format!("({mentions})"), text),
        }
    }
}

/// A thread's `labels` column read back (JSON; what cannot be read is none).
pub(super) fn labels_of(text: Option<String>) -> Option<std::sync::Arc<crate::threads::Labels>> {
    text.and_then(|t| serde_json::from_str::<crate::threads::Labels>(&t).ok())
        .filter(|l| !l.is_empty())
        .map(std::sync::Arc::new)
}

/// A thread's `settings` column read back (JSON; what cannot be read is none).
pub(super) fn settings_of(
    text: Option<String>,
) -> Option<std::sync::Arc<crate::threads::ThreadSettings>> {
    text.and_then(|t| serde_json::from_str::<crate::threads::ThreadSettings>(&t).ok())
        .and_then(crate::threads::ThreadSettings::kept)
}

impl super::Store {
    /// A thread's rewinds as the store has them (none for a thread it does not have).
    pub fn rewinds(&self, thread: &str) -> Result<Vec<crate::threads::Rewind>, super::StoreError> {
        use rusqlite::OptionalExtension;
        let text: Option<Option<String>> = self.read(|tx| {
            tx.prepare_cached("SELECT rewinds FROM threads WHERE id = ?1")?
                .query_row([thread], |r| r.get(0))
                .optional()
        })?;
        Ok(text
            .flatten()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }
}
