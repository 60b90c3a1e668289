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
    /// What each share gave, in the shares' order.
    pub(super) given: Vec<u64>,
}

/// What each holder had stored (none: no thread is a tenant's), when that was read, and
/// what reading it cost: read again once older than [`HELD_COST_RATIO`] times that cost (a
/// second at least), so summing every tenant's threads takes a small part of a busy store's
/// time; what pruning takes from each holder is taken off meanwhile.
pub(super) struct Held {
    at: std::time::Instant,
    cost: Duration,
    holders: Option<Vec<(Holder, u64)>>,
}

/// How many times its own cost the holders' counts are kept before being read again.
const HELD_COST_RATIO: u32 = 20;

/// Whose finished threads a share of the messages to prune comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Holder {
    /// Anyone's: the organism has no tenant's threads.
    Anyone,
    /// The organism's own threads.
    Organism,
    Tenant(String),
}

/// One pruning transaction on the writer's connection: deletes finished threads past
/// `cutoff` (oldest first), then each holder's oldest finished threads while its share of
/// messages remains to go, about `chunk` messages in all (whole threads, at least one).
pub(super) fn prune_chunk(
    conn: &mut Connection,
    shares: &[(Holder, u64)],
    cutoff: Option<i64>,
    chunk: u64,
) -> rusqlite::Result<Pruned> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut deltas = Deltas::default();
    let mut out = Pruned {
        by_age: 0,
        by_count: 0,
        more_by_age: false,
        given: Vec::with_capacity(shares.len()),
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
        tx.prepare_cached("DELETE FROM thread_owners WHERE n = ?1")?
            .execute(params![n])?;
        tx.prepare_cached("DELETE FROM thread_labels WHERE thread = ?1")?
            .execute(params![n])?;
        Ok(gone)
    };
    // The oldest finished threads (of a holder), at most `limit`.
    let oldest = |tx: &rusqlite::Transaction<'_>,
                  cutoff: i64,
                  holder: &Holder,
                  limit: u64|
     -> rusqlite::Result<Vec<i64>> {
        // In activity order (`threads_activity`), each looked up in `thread_owners` by number.
        const FINISHED: &str = "t.status NOT IN ('active', 'waiting') AND t.last_activity < ?1";
        const ORDER: &str = "ORDER BY t.last_activity, t.n LIMIT ?2";
        let limit = limit.min(i64::MAX as u64) as i64;
        let (sql, owner) = match holder {
            Holder::Anyone => (format!("WHERE {FINISHED} {ORDER}"), None),
            Holder::Organism => (
                format!(
                    "WHERE {FINISHED} AND NOT EXISTS \
                     (SELECT 1 FROM thread_owners o WHERE o.n = t.n) {ORDER}"
                ),
                None,
            ),
            Holder::Tenant(who) => (
                format!(
                    "WHERE {FINISHED} AND EXISTS \
                     (SELECT 1 FROM thread_owners o WHERE o.n = t.n AND o.owner = ?3) {ORDER}"
                ),
                Some(who),
            ),
        };
        let mut stmt = tx.prepare_cached(&format!("SELECT t.n FROM threads t {sql}"))?;
        match owner {
            Some(t) => stmt
                .query_map(params![cutoff, limit, t], |r| r.get(0))?
                .collect(),
            None => stmt
                .query_map(params![cutoff, limit], |r| r.get(0))?
                .collect(),
        }
    };
    if let Some(cutoff) = cutoff {
        let ids = oldest(&tx, cutoff, &Holder::Anyone, chunk)?;
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
    if !out.more_by_age {
        for (holder, share) in shares {
            let room = chunk.saturating_sub(out.by_age + out.by_count);
            let want = (*share).min(room);
            let mut given = 0;
            for n in oldest(&tx, i64::MAX, holder, want)? {
                if given >= want {
                    break;
                }
                given += delete(&tx, n)?;
            }
            out.by_count += given;
            out.given.push(given);
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
            // Whose threads give, by what they hold.
            let shares = match excess {
                0 => Vec::new(),
                _ => self
                    .holders()?
                    .map_or_else(|| vec![(Holder::Anyone, excess)], |h| shares(h, excess)),
            };
            let (done, wait) = mpsc::channel();
            self.send(Op::Prune {
                shares: shares.clone(),
                cutoff,
                done,
            });
            let chunk = wait
                .recv()
                .map_err(|_| err(&self.path, "the store writer has stopped"))?
                .map_err(|e| err(&self.path, e))?;
            self.took(&shares, &chunk.given);
            deleted += chunk.by_age + chunk.by_count;
            excess = excess.saturating_sub(chunk.by_count);
            let progress = chunk.by_age + chunk.by_count > 0;
            if !(chunk.more_by_age || (excess > 0 && progress)) {
                return Ok(deleted);
            }
        }
    }

    /// What each holder has stored ([`Held`]): as last read, or read now.
    fn holders(&self) -> Result<Option<Vec<(Holder, u64)>>, StoreError> {
        let mut held = crate::sync::lock(&self.held);
        let fresh =
            |h: &Held| h.at.elapsed() < (h.cost * HELD_COST_RATIO).max(Duration::from_secs(1));
        if let Some(h) = held.as_ref().filter(|h| fresh(h)) {
            return Ok(h.holders.clone());
        }
        let at = std::time::Instant::now();
        let holders = self.read(holders)?;
        *held = Some(Held {
            at,
            cost: at.elapsed(),
            holders: holders.clone(),
        });
        Ok(holders)
    }

    /// Takes what each share gave off its holder's count as last read.
    fn took(&self, shares: &[(Holder, u64)], given: &[u64]) {
        let mut held = crate::sync::lock(&self.held);
        let Some(holders) = held.as_mut().and_then(|h| h.holders.as_mut()) else {
            return;
        };
        for ((holder, _), gave) in shares.iter().zip(given) {
            if let Some((_, n)) = holders.iter_mut().find(|(h, _)| h == holder) {
                *n = n.saturating_sub(*gave);
            }
        }
    }

    /// Messages pruned since the store was opened.
    pub fn pruned(&self) -> u64 {
        self.health.pruned.load(Ordering::Relaxed)
    }
}

/// What each holder has stored: the organism's own threads and each tenant's (none when no
/// thread is a tenant's). Tenants' sums are of their threads' counts; the organism's is the
/// rest.
fn holders(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Option<Vec<(Holder, u64)>>> {
    let tenants = tx
        .prepare_cached(
            "SELECT o.owner, SUM(t.message_count) FROM thread_owners o \
             JOIN threads t ON t.n = o.n GROUP BY o.owner",
        )?
        .query_map([], |r| Ok((Holder::Tenant(r.get(0)?), get_u64(r, 1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if tenants.is_empty() {
        return Ok(None);
    }
    let theirs: u64 = tenants.iter().map(|(_, n)| n).sum();
    let own = stored_total(tx)?.saturating_sub(theirs);
    Ok(Some(
        std::iter::once((Holder::Organism, own))
            .chain(tenants)
            .collect(),
    ))
}

/// How many of `excess` messages each holder gives: whoever holds the most gives first,
/// down to the next one's level, then both alike, and so on, so one holder's volume prunes
/// its own history before anyone else's. Largest first; holders that give nothing left out.
pub(super) fn shares(mut holders: Vec<(Holder, u64)>, excess: u64) -> Vec<(Holder, u64)> {
    holders.sort_by_key(|h| std::cmp::Reverse(h.1));
    let above = |level: u64| -> u64 { holders.iter().map(|(_, n)| n.saturating_sub(level)).sum() };
    // The lowest level down to which the holders above it give no more than `excess`.
    let (mut lo, mut hi) = (0, holders.first().map_or(0, |h| h.1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if above(mid) <= excess {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    // What is left gives one more each from those at the level, the largest first.
    let mut left = if lo > 0 { excess - above(lo) } else { 0 };
    holders
        .into_iter()
        .filter_map(|(h, n)| {
            let mut give = n.saturating_sub(lo);
            if left > 0 && n >= lo {
                give += 1;
                left -= 1;
            }
            (give > 0).then_some((h, give))
        })
        .collect()
}
