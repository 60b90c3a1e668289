//! Pruning: whole finished threads (neither active nor waiting for a person), oldest first,
//! by count and by age, in chunks the writer runs between its batches.

use super::*;

/// Messages in the log, from the kept counts (agent `''` counts each message once).
pub(super) fn stored_total(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT COALESCE(SUM(n), 0) FROM message_counts WHERE agent = 0",
        [],
        |r| get_u64(r, 0),
    )
}

/// What one pruning transaction deleted.
pub(super) struct Pruned {
    /// Messages of threads past the age limit.
    pub(super) by_age: u64,
    /// Messages of the oldest threads, for the count limit.
    pub(super) by_count: u64,
    /// More threads past the age limit remain.
    pub(super) more_by_age: bool,
}

/// One pruning transaction on the writer's connection: deletes finished threads past
/// `cutoff` (oldest first), then the oldest finished threads while `excess` messages remain to
/// go, about `chunk` messages in all (whole threads, at least one).
pub(super) fn prune_chunk(
    conn: &mut Connection,
    excess: u64,
    cutoff: Option<i64>,
    chunk: u64,
) -> rusqlite::Result<Pruned> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut deltas = Deltas::default();
    let mut out = Pruned {
        by_age: 0,
        by_count: 0,
        more_by_age: false,
    };
    let mut delete = |tx: &rusqlite::Transaction<'_>, n: i64| -> rusqlite::Result<u64> {
        let gone = delete_messages(tx, n, &mut deltas)?;
        // Its calls' rows: they count only towards its own `tokens_per_thread` (the day sums,
        // which hold the tenants' windows, stay).
        tx.prepare_cached(
            "DELETE FROM usage WHERE thread = (SELECT id FROM threads WHERE n = ?1)",
        )?
        .execute(params![n])?;
        tx.prepare_cached("DELETE FROM threads WHERE n = ?1")?
            .execute(params![n])?;
        tx.prepare_cached("DELETE FROM thread_labels WHERE thread = ?1")?
            .execute(params![n])?;
        Ok(gone)
    };
    let oldest = |tx: &rusqlite::Transaction<'_>, cutoff: i64| -> rusqlite::Result<Vec<i64>> {
        tx.prepare_cached(
            "SELECT n FROM threads WHERE last_activity < ?1 AND status NOT IN ('active', 'waiting') \
             ORDER BY last_activity, n LIMIT ?2",
        )?
        .query_map(params![cutoff, chunk.min(i64::MAX as u64) as i64], |r| {
            r.get(0)
        })?
        .collect()
    };
    if let Some(cutoff) = cutoff {
        let ids = oldest(&tx, cutoff)?;
        // A full page may have more behind it, even when all of it was deleted.
        out.more_by_age = ids.len() as u64 >= chunk;
        for n in ids {
            if out.by_age >= chunk {
                out.more_by_age = true;
                break;
            }
            out.by_age += delete(&tx, n)?;
        }
    }
    let room = chunk.saturating_sub(out.by_age).min(excess);
    if room > 0 && !out.more_by_age {
        for n in oldest(&tx, i64::MAX)? {
            if out.by_count >= room {
                break;
            }
            out.by_count += delete(&tx, n)?;
        }
    }
    deltas.write(&tx)?;
    tx.commit()?;
    Ok(out)
}

impl Store {
    /// Deletes whole threads, oldest activity first, until at most `max_messages` remain, and
    /// every thread whose last activity is older than `max_age`. Returns messages deleted.
    ///
    /// One pass: how much is too much is fixed when the pass starts, so a pass ends even
    /// while messages keep arriving (they are the next pass's business). The writer does the
    /// deleting, one transaction at a time between its batches, each of at least
    /// [`PRUNE_CHUNK`] messages and at least twice what was written since the last one: the
    /// next chunk is asked for only when the last is done, so it queues behind the writes
    /// that arrived meanwhile, a large prune holds the pump's writes back by one chunk at
    /// most (and never competes with them for SQLite's lock), and pruning outpaces arrivals,
    /// the writer's backlog (inject's 429) paying for it.
    pub fn prune(
        &self,
        max_messages: Option<u64>,
        max_age: Option<Duration>,
    ) -> Result<u64, StoreError> {
        let cutoff =
            max_age.map(|age| Timestamp::now().0.saturating_sub(age.as_millis() as u64) as i64);
        let mut excess = match max_messages {
            Some(max) => self.read(|tx| stored_total(tx))?.saturating_sub(max),
            None => 0,
        };
        if excess == 0 && cutoff.is_none() {
            return Ok(0);
        }
        let mut deleted = 0u64;
        loop {
            let (done, wait) = mpsc::channel();
            self.send(Op::Prune {
                excess,
                cutoff,
                done,
            });
            let chunk = wait
                .recv()
                .map_err(|_| err(&self.path, "the store writer has stopped"))?
                .map_err(|e| err(&self.path, e))?;
            deleted += chunk.by_age + chunk.by_count;
            excess = excess.saturating_sub(chunk.by_count);
            let progress = chunk.by_age + chunk.by_count > 0;
            if !(chunk.more_by_age || (excess > 0 && progress)) {
                return Ok(deleted);
            }
        }
    }

    /// Messages pruned since the store was opened.
    pub fn pruned(&self) -> u64 {
        self.health.pruned.load(Ordering::Relaxed)
    }
}
