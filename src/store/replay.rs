//! The messages published between two event `seq`s, read back for a `/ws/messages` client
//! that reconnects from past the hub's ring (schema v14: each message's `event_seq`, and the
//! `event_marks` that say where to start reading).

use super::*;

/// What [`Store::replay`] found.
#[derive(Debug)]
pub enum Replay {
    /// Every message published after `since` and at or before `until`, in `seq` order, each
    /// with the `seq` of its event and as it is now (its current status).
    Whole(Vec<(u64, MessageRecord)>),
    /// The store cannot give the whole gap: more than the bounds allow, a message of it
    /// pruned, or messages written before event numbers were kept.
    Unavailable(&'static str),
}

impl Store {
    /// The messages published after event `since` and at or before `until`, at most
    /// `max_messages` of them and `max_bytes` of payload; [`Replay::Unavailable`] when the
    /// store does not hold all of them within those bounds. The caller first waits for the
    /// writer ([`Store::catch_up`]) so that everything up to `until` is committed.
    pub fn replay(
        &self,
        since: u64,
        until: u64,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<Replay, StoreError> {
        let (since, until) = (since as i64, until as i64);
        self.read(|tx| {
            let meta = |key: &str| -> rusqlite::Result<Option<i64>> {
                tx.prepare_cached("SELECT value FROM meta WHERE key = ?1")?
                    .query_row(params![key], |r| r.get(0))
                    .optional()
            };
            if meta("pruned_event_seq")?.is_some_and(|p| p > since) {
                return Ok(Replay::Unavailable("messages of the gap were pruned"));
            }
            // Every message up to `from` was published at or before `since`; one up to
            // `to` (a transaction after the first that went past `until`) may be of the gap.
            let mark = |sql: &str, at: i64| -> rusqlite::Result<Option<i64>> {
                let found = tx.prepare_cached(sql)?.query_row(params![at], |r| r.get(0));
                Ok(found.optional()?.flatten())
            };
            let from = mark(
                "SELECT MAX(message_seq) FROM event_marks WHERE last_seq <= ?1",
                since,
            )?
            .unwrap_or(0);
            let to = mark(
                "SELECT message_seq FROM event_marks WHERE last_seq > ?1 ORDER BY last_seq LIMIT 1 OFFSET 1",
                until,
            )?
            .unwrap_or(i64::MAX);
            if to != i64::MAX && to - from > 2 * max_messages as i64 {
                return Ok(Replay::Unavailable("more messages than a replay holds"));
            }
            // One read: a message of the range written before event numbers were kept
            // (`event_seq` NULL, which sorts first) ends it.
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {MESSAGE_COLUMNS}, m.event_seq FROM {MESSAGES} \
                 WHERE m.seq > ?1 AND m.seq <= ?2 \
                 AND (m.event_seq IS NULL OR (m.event_seq > ?3 AND m.event_seq <= ?4)) \
                 ORDER BY m.event_seq LIMIT ?5"
            ))?;
            let rows = stmt.query_map(
                params![from, to, since, until, max_messages as i64 + 1],
                |r| Ok((r.get::<_, Option<i64>>(13)?, row_to_message(r)?)),
            )?;
            let (mut out, mut bytes) = (Vec::new(), 0usize);
            for row in rows {
                let (Some(seq), m) = row? else {
                    return Ok(Replay::Unavailable(
                        "messages written before event numbers were kept",
                    ));
                };
                bytes += m.payload_xml.len();
                if out.len() == max_messages || bytes > max_bytes {
                    return Ok(Replay::Unavailable("more messages than a replay holds"));
                }
                out.push((seq.max(0) as u64, m));
            }
            Ok(Replay::Whole(out))
        })
    }
}
