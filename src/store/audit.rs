//! The audit log of an organism, in its store file (`audit`, schema v6): every control
//! action, key change and (rate-limited) failed authentication, with who, role, tenant,
//! action, target, result, time and remote address. Kept on its own connection like the keys
//! (`store::keys`). The organism's own entries (no tenant) are bounded to [`MAX_AUDIT_ROWS`]
//! and each tenant's to [`MAX_TENANT_AUDIT_ROWS`], the oldest going first: so no tenant's
//! actions push the organism's or another tenant's entries out.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection};

use super::open::side_connection;
use super::{err, ms, page_of, StoreError};
use crate::sync::lock;
use crate::threads::{Page, Paged};
use crate::time::Timestamp;

/// Rows of the organism's own principals (and of unknown ones) kept at most; past it the
/// oldest of them are deleted.
pub const MAX_AUDIT_ROWS: i64 = 1_000_000;
/// Rows of one tenant's principals kept at most; past it its oldest are deleted.
pub const MAX_TENANT_AUDIT_ROWS: i64 = 100_000;
/// Inserts of one tenant (or of the organism's) between two deletions of its oldest.
const PRUNE_EVERY: u32 = 256;
/// Tenants whose inserts since their last deletion are counted, at most (past it the
/// counts start again: a deletion comes later, never wrongly).
const COUNTED_TENANTS: usize = 10_000;

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
    /// Inserts by tenant (`None`: the organism's) since its oldest were last deleted.
    since_pruned: Mutex<std::collections::HashMap<Option<String>, u32>>,
    /// [`MAX_AUDIT_ROWS`], [`MAX_TENANT_AUDIT_ROWS`] and [`PRUNE_EVERY`] (smaller in tests).
    bounds: (i64, i64, u32),
}

impl AuditTable {
    pub fn open(path: &Path) -> Result<AuditTable, StoreError> {
        Ok(AuditTable {
            path: path.to_path_buf(),
            conn: Mutex::new(side_connection(path)?),
            since_pruned: Mutex::default(),
            bounds: (MAX_AUDIT_ROWS, MAX_TENANT_AUDIT_ROWS, PRUNE_EVERY),
        })
    }

    #[cfg(test)]
    pub(super) fn with_bounds(mut self, organism: i64, tenant: i64, every: u32) -> Self {
        self.bounds = (organism, tenant, every);
        self
    }

    /// Whether `tenant`'s oldest entries are due to be bounded again, after one more insert.
    fn prune_due(&self, tenant: &Option<String>) -> bool {
        let mut counts = lock(&self.since_pruned);
        if counts.len() >= COUNTED_TENANTS && !counts.contains_key(tenant) {
            counts.clear();
        }
        let n = counts.entry(tenant.clone()).or_default();
        *n += 1;
        if *n < self.bounds.2 {
            return false;
        }
        *n = 0;
        true
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
        if self.prune_due(&r.tenant) {
            // Its entries past its bound, oldest first: the id below which it keeps none.
            let keep = match r.tenant {
                Some(_) => self.bounds.1,
                None => self.bounds.0,
            };
            conn.prepare_cached(
                "DELETE FROM audit WHERE tenant IS ?1 AND id <= (SELECT id FROM audit \
                 WHERE tenant IS ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            )
            .and_then(|mut st| st.execute(params![r.tenant, keep]))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tenant: Option<&str>, n: usize) -> AuditRow {
        AuditRow {
            ts: Timestamp(n as u64),
            who: Some(format!("key:{}", tenant.unwrap_or("root"))),
            role: Some("operator".into()),
            tenant: tenant.map(str::to_string),
            action: format!("POST /api/v1/threads/t{n}/pause"),
            target: None,
            result: "200".into(),
            remote: None,
        }
    }

    fn count(t: &AuditTable, tenant: Option<&str>) -> usize {
        let all = t.page(&AuditFilter::default(), Page::ALL).unwrap();
        all.items
            .iter()
            .filter(|r| r.tenant.as_deref() == tenant)
            .count()
    }

    /// A tenant's actions, however many, push out only its own oldest entries: the
    /// organism's and the other tenants' stay.
    #[test]
    fn each_tenants_entries_are_bounded_on_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let t = AuditTable::open(&dir.path().join("s.db"))
            .unwrap()
            .with_bounds(20, 10, 4);
        for n in 0..3 {
            t.add(&row(None, n)).unwrap();
            t.add(&row(Some("beta"), n)).unwrap();
        }
        for n in 0..500 {
            t.add(&row(Some("acme"), n)).unwrap();
        }
        assert_eq!((count(&t, None), count(&t, Some("beta"))), (3, 3));
        // acme keeps its newest: its bound, and what came since its last deletion.
        let acme = count(&t, Some("acme"));
        assert!((10..=14).contains(&acme), "{acme}");
        let newest = t
            .page(&AuditFilter::default(), Page::new(Some(1), None))
            .unwrap()
            .items;
        assert_eq!(newest[0].action, "POST /api/v1/threads/t499/pause");
        // The organism's own are bounded too, apart from the tenants'.
        for n in 0..100 {
            t.add(&row(None, n)).unwrap();
        }
        let own = count(&t, None);
        assert!((20..=24).contains(&own), "{own}");
        assert_eq!(count(&t, Some("beta")), 3);
    }
}
