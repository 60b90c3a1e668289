//! Idempotency keys of injects (`idempotency`, schema v11): for each (tenant, principal,
//! key), the hash of the first body and the first answer (its thread and message). Written
//! by the log's writer after the inject's own events (in their batch or a later one), read
//! back once at start; rows older than the window go as new ones come.

use rusqlite::{params, Connection};

use super::{ms, Op, Store, StoreError};
use crate::time::Timestamp;

/// One key's record: whose, the body it came with, and the answer it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// `""` for a principal of no tenant.
    pub tenant: String,
    pub principal: String,
    pub key: String,
    pub body_hash: [u8; 32],
    pub thread_id: String,
    pub message_id: String,
    pub created: Timestamp,
}

/// Writes `r` (the writer, in its batch's transaction); every 256 rows, those created before
/// `prune_before` go.
pub(super) fn insert(
    conn: &Connection,
    r: &KeyRow,
    prune_before: Timestamp,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO idempotency (tenant, principal, key, body_hash, thread_id, \
         message_id, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        r.tenant,
        r.principal,
        r.key,
        &r.body_hash[..],
        r.thread_id,
        r.message_id,
        ms(r.created),
    ])?;
    if conn.last_insert_rowid() % 256 == 0 {
        conn.prepare_cached("DELETE FROM idempotency WHERE created < ?1")?
            .execute(params![ms(prune_before)])?;
    }
    Ok(())
}

impl Store {
    /// Keeps an idempotency key's record (through the writer, after what was sent before).
    /// Rows created before `prune_before` are let go of as new ones come.
    pub fn keep_key(&self, row: KeyRow, prune_before: Timestamp) {
        self.send(Op::Key(Box::new((row, prune_before))));
    }

    /// The keys created at `since` or later, oldest first, at most `limit`: what a start
    /// knows again.
    pub fn keys_since(&self, since: Timestamp, limit: usize) -> Result<Vec<KeyRow>, StoreError> {
        let mut lease = self.readers.take();
        let Some(conn) = lease.conn() else {
            return Err(super::err(&self.path, "no connection to read through"));
        };
        let mut st = conn
            .prepare(
                "SELECT tenant, principal, key, body_hash, thread_id, message_id, created \
                 FROM idempotency WHERE created >= ?1 ORDER BY created LIMIT ?2",
            )
            .map_err(|e| super::err(&self.path, e))?;
        let rows = st
            .query_map(
                params![ms(since), i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| {
                    let hash: Vec<u8> = r.get(3)?;
                    let mut body_hash = [0u8; 32];
                    if hash.len() == 32 {
                        body_hash.copy_from_slice(&hash);
                    }
                    Ok(KeyRow {
                        tenant: r.get(0)?,
                        principal: r.get(1)?,
                        key: r.get(2)?,
                        body_hash,
                        thread_id: r.get(4)?,
                        message_id: r.get(5)?,
                        created: Timestamp(r.get::<_, i64>(6)?.max(0) as u64),
                    })
                },
            )
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| super::err(&self.path, e))?;
        Ok(rows)
    }
}
