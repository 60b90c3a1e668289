//! The usage account (schema v15, v17): every call of a `kind: llm` listener to its model
//! (`usage`, from the `usage` event, written by the log's writer), and each day's sums by
//! tenant, listener and model (`usage_daily`), kept in the same transaction; and each
//! listener's work by day (`usage_work`: messages handled, handler time, a Lua listener's
//! CPU time), added by the pump every few seconds. None is pruned with messages: a budget
//! summed from the days is not reopened by retention.

use rusqlite::params;

use super::{Op, Store, StoreError};
use crate::events::Usage;
use crate::time::Timestamp;

/// Writes one call, and adds it to its day.
pub(super) fn insert(
    tx: &rusqlite::Transaction<'_>,
    u: &Usage,
    at: Timestamp,
) -> rusqlite::Result<()> {
    let ts = at.0 as i64;
    tx.prepare_cached(
        "INSERT INTO usage (ts, tenant, listener, thread, message_id, model, input_tokens, \
         output_tokens, cached_tokens, cost_micros, estimated, ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        ts,
        u.tenant,
        &*u.listener,
        &*u.thread_id,
        &*u.message_id,
        u.model,
        u.input_tokens as i64,
        u.output_tokens as i64,
        u.cached_tokens as i64,
        u.cost_micros as i64,
        u.estimated,
        u.ms as i64,
    ])?;
    tx.prepare_cached(
        "INSERT INTO usage_daily (day, tenant, listener, model, calls, input_tokens, \
         output_tokens, cached_tokens, cost_micros, estimated_calls) \
         VALUES (date(?1 / 1000, 'unixepoch'), ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT(day, tenant, listener, model) DO UPDATE SET calls = calls + 1, \
         input_tokens = input_tokens + excluded.input_tokens, \
         output_tokens = output_tokens + excluded.output_tokens, \
         cached_tokens = cached_tokens + excluded.cached_tokens, \
         cost_micros = cost_micros + excluded.cost_micros, \
         estimated_calls = estimated_calls + excluded.estimated_calls",
    )?
    .execute(params![
        ts,
        u.tenant.as_deref().unwrap_or(""),
        &*u.listener,
        u.model,
        u.input_tokens as i64,
        u.output_tokens as i64,
        u.cached_tokens as i64,
        u.cost_micros as i64,
        i64::from(u.estimated),
    ])?;
    Ok(())
}

/// A listener's work since the last account: messages it handled, the time its handler
/// took, and a Lua listener's CPU time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRow {
    pub tenant: Option<String>,
    pub listener: String,
    pub messages: u64,
    pub handler_us: u64,
    pub cpu_us: u64,
}

/// Adds listeners' work to the day of `at`.
pub(super) fn add_work(
    tx: &rusqlite::Transaction<'_>,
    rows: &[WorkRow],
    at: Timestamp,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO usage_work (day, tenant, listener, messages, handler_us, cpu_us) \
         VALUES (date(?1 / 1000, 'unixepoch'), ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT(day, tenant, listener) DO UPDATE SET messages = messages + excluded.messages, \
         handler_us = handler_us + excluded.handler_us, cpu_us = cpu_us + excluded.cpu_us",
    )?;
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    for r in rows {
        stmt.execute(params![
            at.0 as i64,
            r.tenant.as_deref().unwrap_or(""),
            r.listener,
            n(r.messages),
            n(r.handler_us),
            n(r.cpu_us),
        ])?;
    }
    Ok(())
}

impl Store {
    /// Adds listeners' work to today's account (written by the writer, in order).
    pub fn record_work(&self, rows: Vec<WorkRow>) {
        if !rows.is_empty() {
            self.send(Op::Work(Box::new((rows, Timestamp::now()))));
        }
    }
}

/// Which days and how to group them (`GET /usage`).
#[derive(Debug, Clone, Default)]
pub struct UsageQuery {
    /// `YYYY-MM-DD`, inclusive; none: from the first.
    pub from: Option<String>,
    /// `YYYY-MM-DD`, inclusive; none: to the last.
    pub to: Option<String>,
    /// Only this tenant's (`Some("")`: the organism's own); none: all.
    pub tenant: Option<String>,
    pub by_day: bool,
    pub by_tenant: bool,
    pub by_listener: bool,
    pub by_model: bool,
}

/// One group's sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub day: Option<String>,
    pub tenant: Option<String>,
    pub listener: Option<String>,
    pub model: Option<String>,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub cost_micros: u64,
    /// Calls whose tokens were estimated (the server reported none).
    pub estimated_calls: u64,
    /// Messages the listeners handled.
    pub messages: u64,
    /// Time their handlers took, in microseconds.
    pub handler_us: u64,
    /// CPU time of Lua listeners' calls, in microseconds.
    pub cpu_us: u64,
}

/// The tokens `listener`'s calls took in `thread` (a thread's budget).
impl Store {
    pub fn thread_usage(&self, listener: &str, thread: &str) -> Result<u64, StoreError> {
        self.read(|tx| {
            tx.prepare_cached(
                "SELECT COALESCE(SUM(input_tokens + output_tokens), 0) FROM usage \
                 WHERE thread = ?1 AND listener = ?2",
            )?
            .query_row(params![thread, listener], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
        })
    }
}

/// Groups a query returns at most.
pub const MAX_USAGE_ROWS: usize = 10_000;

impl Store {
    /// The days' sums, grouped as `q` asks, at most [`MAX_USAGE_ROWS`] groups (the first in
    /// order of their keys).
    pub fn usage(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, StoreError> {
        let mut keys = Vec::new();
        for (on, col) in [
            (q.by_day, "day"),
            (q.by_tenant, "tenant"),
            (q.by_listener, "listener"),
            (q.by_model, "model"),
        ] {
            if on {
                keys.push(col);
            }
        }
        let select = |col: &str| {
            if keys.contains(&col) {
                col.to_string()
            } else {
                "NULL".to_string()
            }
        };
        let group = if keys.is_empty() {
            String::new()
        } else {
            format!("GROUP BY {0} ORDER BY {0}", keys.join(", "))
        };
        // Calls by model, and work (no model) by listener, summed together.
        let sql = format!(
            "SELECT {}, {}, {}, {}, SUM(calls), SUM(input_tokens), SUM(output_tokens), \
             SUM(cached_tokens), SUM(cost_micros), SUM(estimated_calls), SUM(messages), \
             SUM(handler_us), SUM(cpu_us) FROM ( \
             SELECT day, tenant, listener, model, calls, input_tokens, output_tokens, \
             cached_tokens, cost_micros, estimated_calls, 0 AS messages, 0 AS handler_us, \
             0 AS cpu_us FROM usage_daily UNION ALL \
             SELECT day, tenant, listener, NULL, 0, 0, 0, 0, 0, 0, messages, handler_us, cpu_us \
             FROM usage_work) \
             WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day <= ?2) \
             AND (?3 IS NULL OR tenant = ?3) {group} LIMIT {MAX_USAGE_ROWS}",
            select("day"),
            select("tenant"),
            select("listener"),
            select("model"),
        );
        self.read(|tx| {
            let mut stmt = tx.prepare(&sql)?;
            let rows = stmt.query_map(params![q.from, q.to, q.tenant], |r| {
                let n = |i: usize| {
                    r.get::<_, Option<i64>>(i)
                        .map(|v| v.unwrap_or(0).max(0) as u64)
                };
                Ok(UsageRow {
                    day: r.get(0)?,
                    tenant: r.get::<_, Option<String>>(1)?.filter(|t| !t.is_empty()),
                    listener: r.get(2)?,
                    model: r.get(3)?,
                    calls: n(4)?,
                    input_tokens: n(5)?,
                    output_tokens: n(6)?,
                    cached_tokens: n(7)?,
                    cost_micros: n(8)?,
                    estimated_calls: n(9)?,
                    messages: n(10)?,
                    handler_us: n(11)?,
                    cpu_us: n(12)?,
                })
            })?;
            let rows: Vec<UsageRow> = rows.collect::<rusqlite::Result<_>>()?;
            // Nothing at all sums to a row of NULLs: none.
            Ok(rows
                .into_iter()
                .filter(|r| r.calls > 0 || r.messages > 0)
                .collect())
        })
    }
}
