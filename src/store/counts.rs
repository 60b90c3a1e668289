//! The counts a store keeps beside its rows (`blocks`, `message_counts`): a message as they
//! see it (`Counted`), and the changes one transaction makes to them (`Deltas`), written once
//! at its end.

use super::*;

/// Changes to the counts (`blocks`, and their sums in `message_counts`) and to the blocks'
/// time ranges, gathered over a transaction and written once at its end.
#[derive(Default)]
pub(super) struct Deltas {
    /// (agent, block, type, status) → change; agent 0 counts every message once.
    pub(super) counts: FastMap<(i64, i64, i64, &'static str), i64>,
    /// Block → (earliest, latest) timestamp written into it.
    pub(super) times: FastMap<i64, (i64, i64)>,
}

/// A stored message as the counts see it: its place and its numbered attributes.
#[derive(Clone, Copy)]
pub(super) struct Counted {
    pub(super) seq: i64,
    pub(super) from: i64,
    pub(super) to: Option<i64>,
    /// 0 for none.
    pub(super) payload_type: i64,
    pub(super) status: &'static str,
}

impl Deltas {
    /// Message `m` appears (`+1`) or goes (`-1`): it counts once in the total (agent 0) and
    /// once for each distinct agent it names, in its block.
    pub(super) fn add(&mut self, m: Counted, d: i64) {
        let block = m.seq >> BLOCK_BITS;
        let to = m.to.filter(|t| *t != m.from);
        for agent in [0, m.from].into_iter().chain(to) {
            *self
                .counts
                .entry((agent, block, m.payload_type, m.status))
                .or_default() += d;
        }
    }

    /// Stored message `was` changes status to `status`: it moves from one count to another.
    pub(super) fn restate(&mut self, was: Counted, status: &'static str) {
        if was.status != status {
            self.add(was, -1);
            self.add(Counted { status, ..was }, 1);
        }
    }

    /// Message `seq`, stamped `ts`, is written.
    pub(super) fn stamp(&mut self, seq: i64, ts: i64) {
        let range = self
            .times
            .entry(seq >> BLOCK_BITS)
            .or_insert((i64::MAX, i64::MIN));
        range.0 = range.0.min(ts);
        range.1 = range.1.max(ts);
    }

    pub(super) fn write(self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        // (No `RETURNING`: SQLite builds a temporary table for each statement that has one.)
        let mut add = tx.prepare_cached(
            "INSERT INTO blocks (agent, block, type, status, n) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        let mut take = tx.prepare_cached(
            "UPDATE blocks SET n = n + ?5 WHERE agent = ?1 AND block = ?2 AND type = ?3 AND status = ?4",
        )?;
        let mut empty = tx.prepare_cached(
            "DELETE FROM blocks WHERE agent = ?1 AND block = ?2 AND type = ?3 AND status = ?4 AND n <= 0",
        )?;
        let mut sums: FastMap<(i64, i64, &'static str), i64> = FastMap::default();
        let mut emptied = Vec::new();
        for ((agent, b, payload_type, status), d) in self.counts {
            if d == 0 {
                continue;
            }
            *sums.entry((agent, payload_type, status)).or_default() += d;
            if d > 0 {
                add.execute(params![agent, b, payload_type, status, d])?;
            } else {
                // A message counted here is going: its row exists.
                take.execute(params![agent, b, payload_type, status, d])?;
                if empty.execute(params![agent, b, payload_type, status])? > 0 && agent == 0 {
                    emptied.push(b);
                }
            }
        }
        let mut sum = tx.prepare_cached(
            "INSERT INTO message_counts (agent, type, status, n) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        for ((agent, payload_type, status), d) in sums {
            if d != 0 {
                sum.execute(params![agent, payload_type, status, d])?;
            }
        }
        let mut time = tx.prepare_cached(
            "INSERT INTO block_times (block, min_ts, max_ts) VALUES (?1, ?2, ?3)
             ON CONFLICT DO UPDATE SET min_ts = MIN(min_ts, excluded.min_ts), max_ts = MAX(max_ts, excluded.max_ts)",
        )?;
        for (b, (min, max)) in self.times {
            time.execute(params![b, min, max])?;
        }
        // A block all of whose messages are gone (pruned) loses its time range too.
        let mut gone = tx.prepare_cached(
            "DELETE FROM block_times WHERE block = ?1 AND NOT EXISTS (SELECT 1 FROM blocks WHERE agent = 0 AND block = ?1)",
        )?;
        for b in emptied {
            gone.execute(params![b])?;
        }
        Ok(())
    }
}

/// The static word for a status read back from the file.
pub(super) fn stored_word(s: &str) -> &'static str {
    parse_status::<MessageStatus>(s)
        .map(status_str)
        .unwrap_or("failed")
}

/// A stored message as the counts see it, from a row of `seq, sender, receiver,
/// payload_type, status`.
pub(super) fn stored_counted(r: &rusqlite::Row<'_>) -> rusqlite::Result<Counted> {
    Ok(Counted {
        seq: r.get(0)?,
        from: r.get(1)?,
        to: r.get(2)?,
        payload_type: r.get(3)?,
        status: stored_word(&r.get::<_, String>(4)?),
    })
}
