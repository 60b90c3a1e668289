//! The tenants of threads written before the store kept them (schema v25, `thread_owners`):
//! a thread belongs to the tenant of the listener its first message went to, as when it is
//! created (`pump::inject`). Looked for once, at the first start with a tenant's listener
//! and messages in the store (`meta.owners_adopted`), so that retention's shares and a
//! revived thread's quotas count those threads as their tenant's.

use rusqlite::params;

use super::open::open_connection;
use super::{err, Store, StoreError};

/// Listeners looked for in one statement, at most (two parameters each).
const LISTENERS_AT_ONCE: usize = 400;

impl Store {
    /// Gives each thread without an owner whose first message went to one of `listeners`
    /// (`(listener, tenant)`) that tenant, once in a store's life. Returns how many.
    pub fn adopt_owners<'a>(
        &self,
        listeners: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<u64, StoreError> {
        const DONE: &str = "SELECT EXISTS (SELECT 1 FROM meta WHERE key = 'owners_adopted')";
        const NONE_YET: &str = "SELECT NOT EXISTS (SELECT 1 FROM messages)";
        let listeners: Vec<_> = listeners.into_iter().collect();
        // No tenant, nothing written yet, or done before: one read, on a connection the
        // store holds anyway (what a start costs is not paid again).
        let nothing = |tx: &rusqlite::Transaction<'_>| -> rusqlite::Result<bool> {
            let one = |sql| tx.query_row(sql, [], |r| r.get::<_, bool>(0));
            Ok(one(DONE)? || one(NONE_YET)?)
        };
        if listeners.is_empty() || self.read(nothing)? {
            return Ok(0);
        }
        let fail = |e: rusqlite::Error| err(&self.path, e);
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE;
        let mut conn = open_connection(&self.path, flags)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(fail)?;
        if tx
            .query_row(DONE, [], |r| r.get::<_, bool>(0))
            .map_err(fail)?
        {
            return Ok(0);
        }
        let mut adopted = 0;
        for some in listeners.chunks(LISTENERS_AT_ONCE) {
            // One pass over the threads' first messages for all of them.
            let values = vec!["(?, ?)"; some.len()].join(", ");
            let sql = format!(
                "WITH l(name, owner) AS (VALUES {values})
                 INSERT OR IGNORE INTO thread_owners (n, owner)
                 SELECT m.thread, l.owner FROM messages m
                   JOIN names r ON r.id = m.receiver JOIN l ON l.name = r.name
                 WHERE m.slot_index = 0"
            );
            let flat = some.iter().flat_map(|(l, t)| [*l, *t]);
            adopted += tx
                .execute(&sql, rusqlite::params_from_iter(flat))
                .map_err(fail)?;
        }
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('owners_adopted', ?1)",
            params![adopted as i64],
        )
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(adopted as u64)
    }
}
