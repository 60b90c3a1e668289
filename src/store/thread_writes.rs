//! A thread row's fields beyond its counters as the writer sets them (`settings`,
//! `labels`, `rewinds`, and its tenant in `thread_owners`), each after the thread rows its
//! transaction holds so far (read back in `thread_fields.rs` and `query.rs`).

use rusqlite::params;

use super::writes::Writes;

impl Writes<'_, '_, '_> {
    /// A thread's `settings`, after the thread rows this batch holds so far (one of which
    /// may be its).
    pub(super) fn settings(
        &mut self,
        id: &str,
        settings: Option<&crate::threads::ThreadSettings>,
    ) -> rusqlite::Result<()> {
        self.insert_pending()?;
        let json = settings.and_then(|s| serde_json::to_string(s).ok());
        self.tx
            .prepare_cached("UPDATE threads SET settings = ?2 WHERE id = ?1")?
            .execute(params![id, json])?;
        Ok(())
    }

    /// A thread's labels: shown (`threads.labels`) and found (`thread_labels`), after the
    /// thread rows this batch holds so far.
    pub(super) fn labels(
        &mut self,
        id: &str,
        labels: Option<&crate::threads::Labels>,
    ) -> rusqlite::Result<()> {
        self.insert_pending()?;
        let Some(n) = self.thread_number(id)? else {
            return Ok(());
        };
        let json = labels.and_then(|l| serde_json::to_string(l).ok());
        self.tx
            .prepare_cached("UPDATE threads SET labels = ?2 WHERE n = ?1")?
            .execute(params![n, json])?;
        self.tx
            .prepare_cached("DELETE FROM thread_labels WHERE thread = ?1")?
            .execute(params![n])?;
        let mut add = self.tx.prepare_cached(
            "INSERT OR IGNORE INTO thread_labels (key, value, thread) VALUES (?1, ?2, ?3)",
        )?;
        for (k, v) in labels.into_iter().flatten() {
            add.execute(params![k, v, n])?;
        }
        Ok(())
    }

    /// A thread rewound: added to its `rewinds` (JSON), after the thread rows this batch
    /// holds so far.
    pub(super) fn rewound(&mut self, id: &str, r: crate::threads::Rewind) -> rusqlite::Result<()> {
        self.insert_pending()?;
        self.tx
            .prepare_cached(
                "UPDATE threads SET rewinds = json_insert(COALESCE(rewinds, '[]'), '$[#]', \
                 json_object('after', ?2, 'before', ?3)) WHERE id = ?1",
            )?
            .execute(params![id, r.after as i64, r.before as i64])?;
        Ok(())
    }

    /// The tenants of the threads this transaction created for one, after every thread row
    /// it writes (a thread's owner is set once: when it is created).
    pub(super) fn owners(&mut self) -> rusqlite::Result<()> {
        if self.owned.is_empty() {
            return Ok(());
        }
        let mut set = self.tx.prepare_cached(
            "INSERT OR IGNORE INTO thread_owners (n, owner) SELECT n, ?2 FROM threads WHERE id = ?1",
        )?;
        for (id, owner) in self.owned.drain(..) {
            set.execute(params![id, owner])?;
        }
        Ok(())
    }
}
