//! The audit log of an organism, in its store file (`audit`, schema v6): every control
//! action, key change and (rate-limited) failed authentication, with who, role, tenant,
//! action, target, result, time and remote address. Kept on its own connection like the keys
//! (`store::keys`), bounded to [`MAX_AUDIT_ROWS`] (the oldest go first).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection};

use super::open::side_connection;
use super::{err, ms, page_of, StoreError};
use crate::sync::lock;
use crate::threads::{Page, Paged};
use crate::time::Timestamp;

/// Rows kept at most; past it the oldest are deleted.
pub const MAX_AUDIT_ROWS: i64 = 1_000_000;

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub ts: Timestamp,
    /// The principal's name (`key:NAME`, a token's `sub`); `None` when none was known.
    pub who: Option<String>,
    pub role: Option<String>,
    pub tenant: Option<String>,
    /// What was asked: `POST /api/v1/organism/pause`, `ws pause`, `authenticate`, …
    pub action: String,
    /// What it was asked of: the request's path, an agent, a thread, a key.
    pub target: Option<String>,
    /// The answer: a status code, `ack`, or why a credential was refused.
    pub result: String,
    pub remote: Option<String>,
}

/// Which entries to read (all given must match).
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub who: Option<String>,
    /// An action's exact text, or its first word (`POST`, `ws`, `authenticate`).
    pub action: Option<String>,
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
}

impl AuditFilter {
    pub fn matches(&self, r: &AuditRow) -> bool {
        self.who
            .as_deref()
            .is_none_or(|w| r.who.as_deref() == Some(w))
            && self
                .action
                .as_deref()
                .is_none_or(|a| r.action == a || r.action.split(' ').next() == Some(a))
            && self.since.is_none_or(|s| r.ts >= s)
            && self.until.is_none_or(|u| r.ts < u)
    }
}

pub struct AuditTable {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl AuditTable {
    pub fn open(path: &Path) -> Result<AuditTable, StoreError> {
        Ok(AuditTable {
            path: path.to_path_buf(),
            conn: Mutex::new(side_connection(path)?),
        })
    }

    fn fail(&self, e: rusqlite::Error) -> StoreError {
        err(&self.path, e)
    }

    pub fn add(&self, r: &AuditRow) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.prepare_cached(
            "INSERT INTO audit (ts, who, role, tenant, action, target, result, remote) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .and_then(|mut st| {
            st.execute(params![
                ms(r.ts),
                r.who,
                r.role,
                r.tenant,
                r.action,
                r.target,
                r.result,
                r.remote
            ])
        })
        .map_err(|e| self.fail(e))?;
        let id = conn.last_insert_rowid();
        if id % 1024 == 0 {
            conn.execute(
                "DELETE FROM audit WHERE id <= ?1",
                params![id - MAX_AUDIT_ROWS],
            )
            .map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// One page of entries, newest first, with the total.
    pub fn page(&self, f: &AuditFilter, page: Page) -> Result<Paged<AuditRow>, StoreError> {
        use rusqlite::types::Value as V;
        let mut clauses = vec!["1".to_string()];
        let mut args: Vec<V> = Vec::new();
        if let Some(w) = &f.who {
            clauses.push("who = ?".into());
            args.push(V::Text(w.clone()));
        }
        if let Some(a) = &f.action {
            clauses.push("(action = ? OR action LIKE ? ESCAPE '\\')".into());
            args.push(V::Text(a.clone()));
            let escaped = a
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            args.push(V::Text(format!("{escaped} %")));
        }
        if let Some(t) = f.since {
            clauses.push("ts >= ?".into());
            args.push(V::Integer(ms(t)));
        }
        if let Some(t) = f.until {
            clauses.push("ts < ?".into());
            args.push(V::Integer(ms(t)));
        }
        let filter = clauses.join(" AND ");
        let columns = "ts, who, role, tenant, action, target, result, remote";
        page_of(
            &lock(&self.conn),
            ("audit", columns, "id DESC"),
            &filter,
            &args,
            page,
            |r| {
                Ok(AuditRow {
                    ts: Timestamp(r.get::<_, i64>(0)?.max(0) as u64),
                    who: r.get(1)?,
                    role: r.get(2)?,
                    tenant: r.get(3)?,
                    action: r.get(4)?,
                    target: r.get(5)?,
                    result: r.get(6)?,
                    remote: r.get(7)?,
                })
            },
        )
        .map_err(|e| self.fail(e))
    }
}
