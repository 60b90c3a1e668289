//! Reads: pages of messages with exact totals from one snapshot, by index for a thread and
//! by the blocks' kept counts for any other filter; a thread, its slice; what the listing of
//! threads (`listing.rs`) shares: filters as SQL, a page with its total, budgeted reads.

use super::*;

/// A filter as SQL: `AND`-ed clauses with their parameters.
#[derive(Default)]
pub(super) struct Where {
    pub(super) clauses: Vec<String>,
    pub(super) args: Vec<rusqlite::types::Value>,
}

impl Where {
    /// `AND` one more clause, with the values of its parameters.
    pub(super) fn and(
        &mut self,
        clause: impl Into<String>,
        args: impl IntoIterator<Item = rusqlite::types::Value>,
    ) {
        self.clauses.push(clause.into());
        self.args.extend(args);
    }
}

/// The columns [`row_to_message`] reads, from [`MESSAGES`].
pub(super) const MESSAGE_COLUMNS: &str = "m.id, t.id, m.parent_id, m.slot_index, s.name, r.name, p.name, m.payload_xml, m.status, m.error, m.ts, m.origin_kind, m.origin_of";

/// Messages (`m`) with the names their numbers stand for. Every message has its thread's row
/// (the writer adds one for a message whose thread was never recorded; pruning deletes both
/// together).
pub(super) const MESSAGES: &str =
    "messages m JOIN threads t ON t.n = m.thread JOIN names s ON s.id = m.sender \
     LEFT JOIN names r ON r.id = m.receiver LEFT JOIN names p ON p.id = m.payload_type";

pub(super) fn in_list(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// A message filter resolved against the file: the condition a row must meet, and the
/// numbers the counts know its agent and payload types by.
pub(super) struct Rows {
    /// On `messages m`.
    pub(super) matching: Where,
    /// The agent's number; 0 when the filter names none (0 counts every message).
    pub(super) agent: i64,
    /// The numbers of the payload types the filter matches (exact name or local name).
    pub(super) types: Option<Vec<i64>>,
}

impl Rows {
    /// `None` when nothing can match: an agent, type or thread the file has never seen.
    pub(super) fn of(
        tx: &rusqlite::Transaction<'_>,
        filter: &MessageFilter,
    ) -> rusqlite::Result<Option<Rows>> {
        use rusqlite::types::Value as V;
        let mut matching = Where::default();
        // The number the file gives a thread id or a name, if it has one.
        let number = |sql: &str, key: &str| -> rusqlite::Result<Option<i64>> {
            tx.prepare_cached(sql)?
                .query_row(params![key], |r| r.get(0))
                .optional()
        };
        if let Some(t) = &filter.thread {
            let Some(n) = number("SELECT n FROM threads WHERE id = ?1", t)? else {
                return Ok(None);
            };
            matching.and("m.thread = ?", [V::Integer(n)]);
        }
        let mut agent = 0;
        if let Some(a) = &filter.agent {
            let Some(id) = number("SELECT id FROM names WHERE name = ?1", a)? else {
                return Ok(None);
            };
            agent = id;
            matching.and(
                "(m.sender = ? OR m.receiver = ?)",
                [V::Integer(id), V::Integer(id)],
            );
        }
        if let Some(set) = &filter.within {
            let mut ids = Vec::with_capacity(set.len());
            for a in set {
                if let Some(id) = number("SELECT id FROM names WHERE name = ?1", a)? {
                    ids.push(V::Integer(id));
                }
            }
            if ids.is_empty() {
                return Ok(None);
            }
            let list = in_list(ids.len());
            matching.and(
                format!("(m.sender IN ({list}) OR m.receiver IN ({list}))"),
                ids.iter().chain(ids.iter()).cloned(),
            );
        }
        let mut types = None;
        if let Some(p) = &filter.payload_type {
            // Names are few (agents and payload types): match the filter against them all.
            let matched = tx
                .prepare_cached("SELECT id, name FROM names")?
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
                .filter(|row| {
                    row.as_ref()
                        .map_or(true, |(_, name)| crate::xml::type_named(name, p))
                })
                .collect::<rusqlite::Result<Vec<_>>>()?;
            if matched.is_empty() {
                return Ok(None);
            }
            let ids: Vec<i64> = matched.into_iter().map(|(id, _)| id).collect();
            matching.and(
                format!("m.payload_type IN ({})", in_list(ids.len())),
                ids.iter().map(|id| V::Integer(*id)),
            );
            types = Some(ids);
        }
        if let Some(s) = filter.status {
            matching.and("m.status = ?", [V::Text(status_str(s).to_string())]);
        }
        if let Some(t) = filter.since {
            matching.and("m.ts >= ?", [V::Integer(t.0 as i64)]);
        }
        if let Some(t) = filter.until {
            matching.and("m.ts < ?", [V::Integer(t.0 as i64)]);
        }
        Ok(Some(Rows {
            matching,
            agent,
            types,
        }))
    }
}

/// The shape of a paged read: the table (or join), the columns and the order.
pub(super) struct Select<'a> {
    pub(super) from: &'a str,
    pub(super) columns: &'a str,
    pub(super) order: &'a str,
}

/// One page of the rows of `select` matching `w`, and their exact count, from the same
/// transaction.
pub(super) fn count_and_page<T>(
    tx: &rusqlite::Transaction<'_>,
    select: Select<'_>,
    w: &Where,
    page: Page,
    known_total: Option<u64>,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<(u64, Vec<T>)> {
    let Select {
        from,
        columns,
        order,
    } = select;
    let where_sql = if w.clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", w.clauses.join(" AND "))
    };
    let total = match known_total {
        Some(n) => n,
        None => tx.query_row(
            &format!("SELECT COUNT(*) FROM {from} {where_sql}"),
            params_from_iter(w.args.iter()),
            |r| get_u64(r, 0),
        )?,
    };
    let mut args = w.args.clone();
    args.push(rusqlite::types::Value::Integer(
        page.limit.min(i64::MAX as usize) as i64,
    ));
    args.push(rusqlite::types::Value::Integer(
        page.offset.min(i64::MAX as usize) as i64,
    ));
    let mut stmt = tx.prepare(&format!(
        "SELECT {columns} FROM {from} {where_sql} ORDER BY {order} LIMIT ? OFFSET ?"
    ))?;
    let items = stmt
        .query_map(params_from_iter(args.iter()), map)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((total, items))
}

/// The agents thread `n`'s messages name, in order of first appearance.
pub(super) fn participants(
    tx: &rusqlite::Transaction<'_>,
    n: i64,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = tx.prepare_cached(
        "SELECT s.name, r.name FROM messages m JOIN names s ON s.id = m.sender \
         LEFT JOIN names r ON r.id = m.receiver WHERE m.thread = ? ORDER BY m.slot_index",
    )?;
    let mut out: Vec<String> = Vec::new();
    let rows = stmt.query_map(params![n], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    for row in rows {
        let (from, to) = row?;
        for who in std::iter::once(from).chain(to) {
            if !out.contains(&who) {
                out.push(who);
            }
        }
    }
    Ok(out)
}

pub(super) fn get_u64(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    r.get::<_, i64>(i).map(|v| v.max(0) as u64)
}

pub(super) fn row_to_message(r: &rusqlite::Row<'_>) -> rusqlite::Result<MessageRecord> {
    let status: String = r.get(8)?;
    let parent_id = r.get::<_, Option<String>>(2)?.map(Arc::from);
    let from: Arc<str> = Arc::from(r.get::<_, String>(4)?);
    let kind = r.get::<_, Option<String>>(11)?;
    let origin = match kind.as_deref().and_then(OriginKind::parse) {
        Some(kind) => Origin {
            kind,
            of: r.get::<_, Option<String>>(12)?.map(Arc::from),
        },
        None => Origin::implied(parent_id.as_ref(), &from),
    };
    Ok(MessageRecord::new(
        MessageCore {
            origin,
            id: Arc::from(r.get::<_, String>(0)?),
            thread_id: Arc::from(r.get::<_, String>(1)?),
            parent_id,
            slot_index: get_u64(r, 3)?,
            from,
            to: r.get::<_, Option<String>>(5)?.map(Arc::from),
            payload_type: r.get(6)?,
            payload_xml: crate::xml::SharedXml::new(r.get::<_, String>(7)?),
            timestamp: Timestamp(get_u64(r, 10)?),
        },
        parse_status(&status).unwrap_or(MessageStatus::Failed),
        r.get(9)?,
    ))
}

impl Store {
    /// How long one read may run from now on (`limits.max_query_ms`); a read past it is
    /// stopped by SQLite's progress handler and fails with [`StoreError::timed_out`].
    pub fn set_read_budget(&self, budget: std::time::Duration) {
        let ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
        self.read_budget_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// When a read starting now must end (`limits.max_query_ms`), and that budget in
    /// milliseconds.
    pub(super) fn read_deadline(&self) -> (std::time::Instant, u64) {
        let budget_ms = self
            .read_budget_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(budget_ms);
        (deadline, budget_ms)
    }

    /// Runs `f` in one read transaction, within the read budget.
    pub(super) fn read<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        /// SQLite virtual-machine steps between looks at the clock.
        const STEPS: std::ffi::c_int = 10_000;
        let (deadline, budget_ms) = self.read_deadline();
        let mut lease = self.readers.take();
        let Some(conn) = lease.conn() else {
            return Err(err(&self.path, "no connection to read through"));
        };
        let timed =
            conn.progress_handler(STEPS, Some(move || std::time::Instant::now() >= deadline));
        let run = || -> rusqlite::Result<T> {
            let tx = conn.transaction()?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        let out = run();
        if timed.is_ok() {
            let _ = conn.progress_handler(STEPS, None::<fn() -> bool>);
        }
        out.map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::OperationInterrupted) => StoreError {
                path: self.path.display().to_string(),
                message: format!(
                    "the read took longer than limits.max_query_ms ({budget_ms} ms) and was stopped; narrow it (a thread, agents, since/until) or raise the limit"
                ),
                timed_out: true,
            },
            _ => err(&self.path, e),
        })
    }

    /// One page of the log (oldest first, in write order), with the exact total, from one
    /// snapshot. A thread's messages come through its index; any other filter walks the
    /// matching blocks' counts in write order (see [`Store::query_blocks`]).
    pub fn query_messages(
        &self,
        filter: &MessageFilter,
        page: Page,
    ) -> Result<Paged<MessageRecord>, StoreError> {
        self.read(|tx| {
            let (total, items) = match Rows::of(tx, filter)? {
                None => (0, Vec::new()),
                // A thread's messages through its index; a set of agents (a tenant's view)
                // row by row, since the blocks' counts are per agent.
                Some(rows) if filter.thread.is_some() || filter.within.is_some() => count_and_page(
                    tx,
                    Select {
                        from: MESSAGES,
                        columns: MESSAGE_COLUMNS,
                        order: "m.seq",
                    },
                    &rows.matching,
                    page,
                    None,
                    row_to_message,
                )?,
                Some(rows) => Store::query_blocks(tx, filter, &rows, page)?,
            };
            Ok(Paged {
                items,
                total,
                limit: page.limit,
                offset: page.offset,
            })
        })
    }

    /// A page of messages matching a filter without a thread, and their total, by blocks:
    /// the blocks holding matching messages, in write order, with how many each holds (from
    /// the counts, or counted row by row in a block a time window cuts). The page skips whole
    /// blocks by their counts and reads rows only in the blocks it returns from. Without a
    /// time window the total is the kept sum, and the walk ends with the page.
    pub(super) fn query_blocks(
        tx: &rusqlite::Transaction<'_>,
        filter: &MessageFilter,
        rows: &Rows,
        page: Page,
    ) -> rusqlite::Result<(u64, Vec<MessageRecord>)> {
        use rusqlite::types::Value as V;
        let Some(Blocks {
            sql,
            args: block_args,
            known_total,
        }) = Blocks::of(tx, filter, rows)?
        else {
            return Ok((0, Vec::new()));
        };
        let mut blocks = tx.prepare(&sql)?;
        let in_block = format!(
            "m.seq BETWEEN ? AND ?{}",
            rows.matching
                .clauses
                .iter()
                .map(|c| format!(" AND {c}"))
                .collect::<String>()
        );
        let mut count = tx.prepare(&format!("SELECT COUNT(*) FROM messages m WHERE {in_block}"))?;
        let mut read = tx.prepare(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM {MESSAGES} WHERE {in_block} ORDER BY m.seq LIMIT ? OFFSET ?"
        ))?;
        let block_range = |b: i64| {
            let mut a = vec![
                V::Integer(b << BLOCK_BITS),
                V::Integer(((b + 1) << BLOCK_BITS) - 1),
            ];
            a.extend(rows.matching.args.iter().cloned());
            a
        };
        let mut total = 0u64;
        let mut skip = page.offset as u64;
        let mut items: Vec<MessageRecord> = Vec::new();
        let mut walk = blocks.query(params_from_iter(block_args.iter()))?;
        while let Some(r) = walk.next()? {
            let block: i64 = r.get(0)?;
            let mut n = get_u64(r, 1)?;
            if !r.get::<_, bool>(2)? {
                n = count.query_row(params_from_iter(block_range(block).iter()), |r| {
                    get_u64(r, 0)
                })?;
            }
            total += n;
            if items.len() < page.limit && n > 0 {
                if skip >= n {
                    skip -= n;
                } else {
                    let mut a = block_range(block);
                    a.push(V::Integer(
                        (page.limit - items.len()).min(i64::MAX as usize) as i64,
                    ));
                    a.push(V::Integer(skip as i64));
                    skip = 0;
                    let got = read
                        .query_map(params_from_iter(a.iter()), row_to_message)?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    items.extend(got);
                }
            }
            if items.len() >= page.limit && known_total.is_some() {
                break;
            }
        }
        Ok((known_total.unwrap_or(total), items))
    }

    /// Thread `id`'s messages from slot `from` on, in slot order: at most `limit`, and no
    /// more than fit in `max_bytes` of payloads (at least one); and whether more follow.
    /// Through the thread's slot index (no count, no offset); the sizes are read first, so
    /// no more is loaded than is returned.
    pub fn thread_slice(
        &self,
        id: &str,
        from: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Vec<MessageRecord>, bool), StoreError> {
        self.read(|tx| {
            let from = i64::try_from(from).unwrap_or(i64::MAX);
            let mut sizes = tx.prepare_cached(
                "SELECT m.slot_index, octet_length(m.payload_xml) FROM messages m \
                 JOIN threads t ON t.n = m.thread WHERE t.id = ?1 AND m.slot_index >= ?2 \
                 ORDER BY m.slot_index LIMIT ?3",
            )?;
            let one_more = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
            let mut rows = sizes.query(params![id, from, one_more])?;
            let (mut last, mut bytes, mut taken, mut more) = (None, 0usize, 0usize, false);
            while let Some(r) = rows.next()? {
                let size = usize::try_from(r.get::<_, i64>(1)?).unwrap_or(0);
                if taken == limit || (last.is_some() && bytes + size > max_bytes) {
                    more = true;
                    break;
                }
                bytes += size;
                taken += 1;
                last = Some(r.get::<_, i64>(0)?);
            }
            let Some(last) = last else {
                return Ok((Vec::new(), false));
            };
            let mut st = tx.prepare_cached(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM {MESSAGES} WHERE t.id = ?1 AND m.slot_index >= ?2 \
                 AND m.slot_index <= ?3 ORDER BY m.slot_index"
            ))?;
            let rows = st.query_map(params![id, from, last], row_to_message)?;
            Ok((rows.collect::<rusqlite::Result<Vec<_>>>()?, more))
        })
    }

    /// The message `id`, if the store has it (through the `messages_id` index).
    pub fn message(&self, id: &str) -> Result<Option<MessageRecord>, StoreError> {
        self.read(|tx| {
            tx.prepare_cached(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM {MESSAGES} WHERE m.id = ?1 LIMIT 1"
            ))?
            .query_row(params![id], row_to_message)
            .optional()
        })
    }

    /// Whether a message has the id `id`.
    pub fn message_exists(&self, id: &str) -> Result<bool, StoreError> {
        self.read(|tx| {
            tx.prepare_cached("SELECT 1 FROM messages WHERE id = ?1 LIMIT 1")?
                .query_row(params![id], |_| Ok(()))
                .optional()
                .map(|r| r.is_some())
        })
    }

    /// One thread, if stored.
    pub fn thread(&self, id: &str) -> Result<Option<ThreadInfo>, StoreError> {
        self.read(|tx| {
            let sql = format!("SELECT {THREAD_COLUMNS} FROM threads WHERE id = ?");
            let Some((mut thread, n)) = tx.query_row(&sql, params![id], thread_of).optional()?
            else {
                return Ok(None);
            };
            thread.participants = participants(tx, n)?;
            Ok(Some(thread))
        })
    }
}

/// The order of `/threads`: newest first.
pub(super) const THREAD_ORDER: &str = "created_at DESC, id DESC";

/// The columns of a thread's row that [`thread_of`] reads.
pub(super) const THREAD_COLUMNS: &str =
    "id, status, message_count, created_at, last_activity, error, n, settings, labels, \
     (SELECT owner FROM thread_owners o WHERE o.n = threads.n)";

/// A thread as its row ([`THREAD_COLUMNS`]) holds it, and its number (its participants are
/// read with it: [`participants`]).
pub(super) fn thread_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<(ThreadInfo, i64)> {
    let thread = ThreadInfo {
        id: r.get(0)?,
        status: parse_status(&r.get::<_, String>(1)?).unwrap_or(ThreadStatus::Error),
        participants: Vec::new(),
        message_count: get_u64(r, 2)?,
        created_at: Timestamp(get_u64(r, 3)?),
        last_activity: Timestamp(get_u64(r, 4)?),
        error: r.get(5)?,
        settings: super::thread_fields::settings_of(r.get(7)?),
        labels: super::thread_fields::labels_of(r.get(8)?),
        paused: false,
        owner: r.get::<_, Option<String>>(9)?.map(Arc::from),
    };
    Ok((thread, r.get(6)?))
}

/// The query of the blocks holding a filter's messages (without a thread), in write order,
/// each with its kept count and whether the time window holds it whole.
struct Blocks {
    sql: String,
    args: Vec<rusqlite::types::Value>,
    /// The kept sum, without a time window.
    known_total: Option<u64>,
}

impl Blocks {
    /// `None` when the time window holds no block.
    fn of(
        tx: &rusqlite::Transaction<'_>,
        filter: &MessageFilter,
        rows: &Rows,
    ) -> rusqlite::Result<Option<Blocks>> {
        use rusqlite::types::Value as V;
        let mut clauses = vec!["b.agent = ?".to_string()];
        let mut args = vec![V::Integer(rows.agent)];
        let mut sum_clauses = vec!["agent = ?".to_string()];
        if let Some(types) = &rows.types {
            clauses.push(format!("b.type IN ({})", in_list(types.len())));
            sum_clauses.push(format!("type IN ({})", in_list(types.len())));
            args.extend(types.iter().map(|t| V::Integer(*t)));
        }
        if let Some(s) = filter.status {
            clauses.push("b.status = ?".into());
            sum_clauses.push("status = ?".into());
            args.push(V::Text(status_str(s).to_string()));
        }
        let windowed = filter.since.is_some() || filter.until.is_some();
        let known_total = if windowed {
            None
        } else {
            Some(tx.query_row(
                &format!(
                    "SELECT COALESCE(SUM(n), 0) FROM message_counts WHERE {}",
                    sum_clauses.join(" AND ")
                ),
                params_from_iter(args.iter()),
                |r| get_u64(r, 0),
            )?)
        };
        // A block lies wholly inside the window when its time range does; otherwise its
        // matching rows are counted one by one.
        let mut whole = Vec::new();
        let mut whole_args = Vec::new();
        for (bound, first, edge, inside) in [
            (filter.since, "MIN", "t.max_ts >= ?", "t.min_ts >= ?"),
            (filter.until, "MAX", "t.min_ts < ?", "t.max_ts < ?"),
        ] {
            let Some(ts) = bound else { continue };
            let ts = ts.0 as i64;
            let block: Option<i64> = tx.query_row(
                &format!("SELECT {first}(block) FROM block_times t WHERE {}", edge),
                params![ts],
                |r| r.get(0),
            )?;
            let Some(block) = block else {
                return Ok(None);
            };
            clauses.push(format!(
                "b.block {} ?",
                if first == "MIN" { ">=" } else { "<=" }
            ));
            args.push(V::Integer(block));
            whole.push(inside);
            whole_args.push(V::Integer(ts));
        }
        let (join, whole) = if windowed {
            (
                "JOIN block_times t ON t.block = b.block",
                whole.join(" AND "),
            )
        } else {
            ("", "1".to_string())
        };
        let mut block_args = whole_args;
        block_args.extend(args);
        Ok(Some(Blocks {
            sql: format!(
                "SELECT b.block, SUM(b.n), {whole} FROM blocks b {join} WHERE {} \
                 GROUP BY b.block HAVING SUM(b.n) > 0 ORDER BY b.block",
                clauses.join(" AND ")
            ),
            args: block_args,
            known_total,
        }))
    }
}
