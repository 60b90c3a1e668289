//! Where the audit log goes: the store file's `audit` table, or, with `store: memory`, the
//! last [`MEMORY_ENTRIES`] entries of the organism's and [`MEMORY_TENANT_ENTRIES`] of each
//! tenant's in memory. Each entry is also published as an `audit`
//! event (organism-wide `/ws` sessions only).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::config::OrganismConfig;
use crate::events::{EventHub, EventKind};
use crate::store::audit::{AuditFilter, AuditRow, AuditTable};
use crate::store::StoreError;
use crate::threads::{Page, Paged};

/// Entries of the organism's own principals kept without a store file.
pub const MEMORY_ENTRIES: usize = 10_000;
/// Entries of one tenant's principals kept without a store file (so that no tenant's
/// actions push the others' out, as with the store's bounds).
pub const MEMORY_TENANT_ENTRIES: usize = 1_000;

/// Bytes of one text field of an entry, at most.
const FIELD_BYTES: usize = 512;

pub enum AuditLog {
    Table(AuditTable),
    Memory(Mutex<VecDeque<AuditRow>>),
}

impl AuditLog {
    pub fn of(config: &OrganismConfig) -> Result<AuditLog, String> {
        match &config.store {
            Some(path) => AuditTable::open(path)
                .map(AuditLog::Table)
                .map_err(|e| e.to_string()),
            None => Ok(AuditLog::Memory(Mutex::default())),
        }
    }

    /// Keeps `row` (its texts cut to a bound) and publishes it. A failure to write is
    /// logged: the action it records has happened either way.
    pub fn record(&self, mut row: AuditRow, events: &EventHub) {
        let cut = |s: &mut Option<String>| {
            if let Some(t) = s.take() {
                *s = Some(crate::clip::clip(t, FIELD_BYTES));
            }
        };
        cut(&mut row.who);
        cut(&mut row.target);
        row.result = crate::clip::clip(std::mem::take(&mut row.result), FIELD_BYTES);
        row.action = crate::clip::clip(std::mem::take(&mut row.action), FIELD_BYTES);
        events.publish(EventKind::Audit {
            who: row.who.clone(),
            action: row.action.clone(),
            target: row.target.clone(),
            result: row.result.clone(),
        });
        match self {
            AuditLog::Table(t) => {
                if let Err(e) = t.add(&row) {
                    tracing::error!("cannot write the audit log: {e}");
                }
            }
            AuditLog::Memory(m) => {
                let mut m = crate::sync::lock(m);
                let keep = match row.tenant {
                    Some(_) => MEMORY_TENANT_ENTRIES,
                    None => MEMORY_ENTRIES,
                };
                let same = |r: &AuditRow| r.tenant == row.tenant;
                if m.iter().filter(|r| same(r)).count() >= keep {
                    if let Some(oldest) = m.iter().position(same) {
                        m.remove(oldest);
                    }
                }
                m.push_back(row);
            }
        }
    }

    /// One page, newest first.
    pub fn page(&self, f: &AuditFilter, page: Page) -> Result<Paged<AuditRow>, StoreError> {
        match self {
            AuditLog::Table(t) => t.page(f, page),
            AuditLog::Memory(m) => {
                let all: Vec<AuditRow> = crate::sync::lock(m)
                    .iter()
                    .rev()
                    .filter(|r| f.matches(r))
                    .cloned()
                    .collect();
                Ok(page.cut(all))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In memory as in the store: a tenant's actions push out only its own oldest entries.
    #[test]
    fn in_memory_each_tenants_entries_are_bounded_on_their_own() {
        let log = AuditLog::Memory(Mutex::default());
        let events = EventHub::new(16);
        let row = |tenant: Option<&str>, n: usize| AuditRow {
            ts: crate::time::Timestamp(n as u64),
            who: None,
            role: None,
            tenant: tenant.map(str::to_string),
            action: format!("ws pause {n}"),
            target: None,
            result: "ack".into(),
            remote: None,
        };
        for n in 0..5 {
            log.record(row(None, n), &events);
            log.record(row(Some("beta"), n), &events);
        }
        for n in 0..MEMORY_TENANT_ENTRIES + 500 {
            log.record(row(Some("acme"), n), &events);
        }
        let all = log.page(&AuditFilter::default(), Page::ALL).unwrap().items;
        let of = |t: Option<&str>| all.iter().filter(|r| r.tenant.as_deref() == t).count();
        assert_eq!(
            (of(None), of(Some("beta")), of(Some("acme"))),
            (5, 5, MEMORY_TENANT_ENTRIES)
        );
        let newest = MEMORY_TENANT_ENTRIES + 499;
        assert_eq!(all[0].action, format!("ws pause {newest}"));
    }
}
