//! What a thread row holds beyond its counters: its `settings`, `labels` and `rewinds` read
//! back from their JSON columns, and `/threads`'s label tests as clauses over
//! `thread_labels`.

use super::{in_list, Where};
use crate::threads::ThreadFilter;

/// `/threads`'s label tests as clauses over `thread_labels` (by key and value).
pub(super) fn label_clauses(w: &mut Where, filter: &ThreadFilter) {
    for test in &filter.labels {
        let (clause, args) = as_set(test);
        w.and(clause, args);
    }
}

/// A thread's `labels` column read back (JSON; what cannot be read is none).
pub(super) fn labels_of(text: Option<String>) -> Option<std::sync::Arc<crate::threads::Labels>> {
    text.and_then(|t| serde_json::from_str::<crate::threads::Labels>(&t).ok())
        .filter(|l| !l.is_empty())
        .map(std::sync::Arc::new)
}

/// A thread's `settings` column read back (JSON; what cannot be read is none).
pub(super) fn settings_of(
    text: Option<String>,
) -> Option<std::sync::Arc<crate::threads::ThreadSettings>> {
    text.and_then(|t| serde_json::from_str::<crate::threads::ThreadSettings>(&t).ok())
        .and_then(crate::threads::ThreadSettings::kept)
}

impl super::Store {
    /// A thread's rewinds as the store has them (none for a thread it does not have).
    pub fn rewinds(&self, thread: &str) -> Result<Vec<crate::threads::Rewind>, super::StoreError> {
        use rusqlite::OptionalExtension;
        let text: Option<Option<String>> = self.read(|tx| {
            tx.prepare_cached("SELECT rewinds FROM threads WHERE id = ?1")?
                .query_row([thread], |r| r.get(0))
                .optional()
        })?;
        Ok(text
            .flatten()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }
}

/// Whether `filter` tests nothing but labels and `q` (no status, agent, scope or time).
pub(super) fn labels_and_q_only(filter: &ThreadFilter) -> bool {
    filter.status.is_none()
        && filter.agent.is_none()
        && filter.within.is_none()
        && filter.since.is_none()
        && filter.until.is_none()
}

/// A filter of label tests alone: what `thread_labels` answers by itself ([`label_plan`]).
pub(super) fn labels_only(filter: &ThreadFilter) -> Option<&[crate::threads::LabelTest]> {
    let alone = labels_and_q_only(filter) && filter.q.is_none();
    (alone && !filter.labels.is_empty()).then_some(filter.labels.as_slice())
}

/// Rows scanned in `created_at` order, at most, for a page found row by row.
pub(super) const SCAN_ROWS: u64 = 20_000;

/// The number a `COUNT` query answers (a negative one read as none).
pub(super) fn query_count(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    args: impl rusqlite::Params,
) -> rusqlite::Result<u64> {
    tx.query_row(sql, args, |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
}

/// About how many rows are read in `created_at` order before `page` is found, `matched`
/// of `all` threads matching (none when none match): what a plan weighs a scan by.
pub(super) fn rows_before_page(page: crate::threads::Page, all: u64, matched: u64) -> Option<u64> {
    (matched > 0).then(|| ((page.offset + page.limit) as u64).saturating_mul(all) / matched)
}

/// A label test as a condition on `thread_labels` rows named `t` (what it asks of a label
/// of the thread: `Is` and `IsNot` by key and values, `Has` and `Lacks` by key), and
/// whether the thread must have such a label (or must not).
fn condition(
    test: &crate::threads::LabelTest,
    t: &str,
) -> (String, Vec<rusqlite::types::Value>, bool) {
    use crate::threads::LabelTest as L;
    use rusqlite::types::Value as V;
    let key = |k: &String| V::Text(k.clone());
    match test {
        L::Is(k, vs) => (
            format!("{t}.key = ? AND {t}.value IN ({})", in_list(vs.len())),
            std::iter::once(key(k))
                .chain(vs.iter().map(|v| V::Text(v.clone())))
                .collect(),
            true,
        ),
        L::IsNot(k, v) => (
            format!("{t}.key = ? AND {t}.value = ?"),
            vec![key(k), V::Text(v.clone())],
            false,
        ),
        L::Has(k) => (format!("{t}.key = ?"), vec![key(k)], true),
        L::Lacks(k) => (format!("{t}.key = ?"), vec![key(k)], false),
    }
}

/// A label test as a clause on `threads`: the threads it names found by key and value (the
/// table's key), a set SQLite reads once, then each thread by its number.
fn as_set(test: &crate::threads::LabelTest) -> (String, Vec<rusqlite::types::Value>) {
    let (c, args, positive) = condition(test, "x");
    let not = if positive { "" } else { "NOT " };
    (
        format!("n {not}IN (SELECT thread FROM thread_labels x WHERE {c})"),
        args,
    )
}

/// A label test checked for the one thread `of` names (a column: `threads.n`, `x.thread`).
fn per_row(test: &crate::threads::LabelTest, of: &str) -> (String, Vec<rusqlite::types::Value>) {
    let (c, args, positive) = condition(test, "y");
    let not = if positive { "" } else { "NOT " };
    (
        format!("{not}EXISTS (SELECT 1 FROM thread_labels y WHERE y.thread = {of} AND {c})"),
        args,
    )
}

/// Label tests alone, answered from `thread_labels` (every row of which has its thread):
/// the exact count, by the index (the smallest set a positive test names, each other test
/// checked per row of it; with no positive test, all threads less those any negative test
/// names); then `w`'s clauses for the page: per row (`EXISTS`), so a scan in `created_at`
/// order stops at the page, when the matches are many enough that it comes soon; else the
/// smallest positive set read once and the other tests per row of it, sorted (negative
/// tests only: each as a set).
pub(super) fn label_plan(
    tx: &rusqlite::Transaction<'_>,
    tests: &[crate::threads::LabelTest],
    page: crate::threads::Page,
    w: &mut Where,
) -> rusqlite::Result<u64> {
    let count = |sql: &str, args: &[rusqlite::types::Value]| {
        query_count(tx, sql, rusqlite::params_from_iter(args.iter()))
    };
    let all = count("SELECT COUNT(*) FROM threads", &[])?;
    let conditions: Vec<_> = tests.iter().map(|t| condition(t, "x")).collect();
    let labelled = |c: &str| format!("SELECT thread FROM thread_labels x WHERE {c}");
    // The smallest set a positive test names drives the count.
    let mut driver: Option<(usize, u64)> = None;
    for (i, (c, args, positive)) in conditions.iter().enumerate() {
        if *positive {
            let n = count(
                &format!("SELECT COUNT(*) FROM thread_labels x WHERE {c}"),
                args,
            )?;
            if driver.is_none_or(|(_, m)| n < m) {
                driver = Some((i, n));
            }
        }
    }
    let others = |d: Option<usize>| tests.iter().enumerate().filter(move |(i, _)| Some(*i) != d);
    let matched = match driver {
        Some((_, 0)) => 0,
        Some((_, n)) if conditions.len() == 1 => n,
        Some((d, _)) => {
            let (c, args, _) = &conditions[d];
            let mut sql = format!("SELECT COUNT(*) FROM thread_labels x WHERE {c}");
            let mut all_args = args.clone();
            for (_, test) in others(Some(d)) {
                let (clause, args) = per_row(test, "x.thread");
                sql.push_str(&format!(" AND {clause}"));
                all_args.extend(args);
            }
            count(&sql, &all_args)?
        }
        None => {
            // Negative tests only: all threads less those any of them names.
            let sets: Vec<String> = conditions.iter().map(|(c, _, _)| labelled(c)).collect();
            let args: Vec<_> = conditions.iter().flat_map(|(_, a, _)| a.clone()).collect();
            let named = count(
                &format!("SELECT COUNT(*) FROM ({})", sets.join(" UNION ")),
                &args,
            )?;
            all.saturating_sub(named)
        }
    };
    let per_row_page = rows_before_page(page, all, matched).is_some_and(|r| r <= SCAN_ROWS);
    // Few matches: the driver's set read once, the other tests per row of it.
    let set = driver.map(|(d, _)| d).filter(|_| !per_row_page);
    if let Some(d) = set {
        let (clause, args) = as_set(&tests[d]);
        w.and(clause, args);
    } else if !per_row_page {
        for test in tests {
            let (clause, args) = as_set(test);
            w.and(clause, args);
        }
        return Ok(matched);
    }
    for (_, test) in others(set) {
        let (clause, args) = per_row(test, "threads.n");
        w.and(clause, args);
    }
    Ok(matched)
}
