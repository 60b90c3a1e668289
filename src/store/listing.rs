//! `/threads`: a page of threads, newest first, with the exact total, from one snapshot.
//! Label tests alone are counted from `thread_labels` (`thread_fields.rs`), `q` alone from
//! the text indexes (`find.rs`); other filters are clauses on `threads`.

use super::query::{
    count_and_page, in_list, participants, thread_of, Select, Where, THREAD_COLUMNS, THREAD_ORDER,
};
use super::*;

impl Store {
    /// One page of threads, newest first, with the exact total.
    pub fn query_threads(
        &self,
        filter: &ThreadFilter,
        page: Page,
    ) -> Result<Paged<ThreadInfo>, StoreError> {
        use rusqlite::types::Value as V;
        let mut w = Where::default();
        if let Some(s) = filter.status {
            w.and("status = ?", [V::Text(status_str(s).to_string())]);
        }
        if let Some(a) = &filter.agent {
            w.and("EXISTS (SELECT 1 FROM messages m, (SELECT id FROM names WHERE name = ?) a WHERE m.thread = threads.n AND (m.sender = a.id OR m.receiver = a.id))", [V::Text(a.clone())]);
        }
        if let Some(set) = &filter.within {
            w.and(
                format!(
                    "EXISTS (SELECT 1 FROM messages m JOIN names a ON (m.sender = a.id OR m.receiver = a.id) WHERE m.thread = threads.n AND a.name IN ({}))",
                    in_list(set.len())
                ),
                set.iter().map(|a| V::Text(a.clone())),
            );
        }
        if let Some(s) = filter.since {
            w.and("last_activity >= ?", [V::Integer(s.0 as i64)]);
        }
        if let Some(u) = filter.until {
            w.and("created_at < ?", [V::Integer(u.0 as i64)]);
        }
        // Label tests alone are counted from `thread_labels` (`thread_fields::label_plan`).
        // And `q` alone, from the text indexes (`find::q_plan`).
        let only = super::thread_fields::labels_only(filter);
        let payloads = self.searches_payloads();
        let q = super::find::q_alone(filter, payloads);
        // Or a longer phrase with other filters: its threads found in the read.
        let mut apart = None;
        if only.is_none() && q.is_none() {
            super::thread_fields::label_clauses(&mut w, filter);
            match filter.q.as_deref() {
                Some(q) if super::find::long_apart(q, payloads) => apart = Some(q),
                Some(q) => super::find::q_clause(&mut w, q, payloads),
                None => {}
            }
        }
        // The same budget as the read's, for the work done outside SQLite's steps.
        let (deadline, _) = self.read_deadline();
        self.read(|tx| {
            if let Some(q) = apart {
                super::find::long_clause(tx, q, &mut w, deadline)?;
            }
            let known = match (only, q) {
                (Some(tests), _) => {
                    Some(super::thread_fields::label_plan(tx, tests, page, &mut w)?)
                }
                (_, Some(q)) => Some(super::find::q_plan(tx, q, page, &mut w, deadline)?),
                _ => None,
            };
            let (total, rows) = count_and_page(
                tx,
                Select {
                    from: "threads",
                    columns: THREAD_COLUMNS,
                    order: THREAD_ORDER,
                },
                &w,
                page,
                known,
                thread_of,
            )?;
            let mut items = Vec::with_capacity(rows.len());
            for (mut thread, n) in rows {
                thread.participants = participants(tx, n)?;
                items.push(thread);
            }
            Ok(Paged {
                items,
                total,
                limit: page.limit,
                offset: page.offset,
            })
        })
    }
}
