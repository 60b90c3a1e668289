//! The SQL writes of one transaction: rows, the name cache, and the count deltas written once
//! at the end.

use super::*;

/// Threads the writer keeps the numbers of, at most; past that it starts again (a thread
/// not cached costs one lookup by its id).
pub(super) const THREADS_CACHED: usize = 65_536;

/// Message rows per multi-row insert: one statement's overhead (cursors opened, program run,
/// reset) for many rows.
pub(super) const MESSAGE_ROWS: usize = 16;

/// Parameters per row of the writer's message insert.
pub(super) const MESSAGE_PARAMS: usize = 15;

/// Thread rows per multi-row upsert, and the parameters of one.
pub(super) const THREAD_ROWS: usize = 16;
pub(super) const THREAD_PARAMS: usize = 7;

/// A message waiting to be inserted: its status and error (perhaps of a later change in the
/// same batch), its thread's number, its numbered attributes (its `seq` given).
pub(super) struct NewMessage<'o> {
    pub(super) m: &'o MessageRecord,
    pub(super) event_seq: u64,
    pub(super) status: MessageStatus,
    pub(super) error: Option<&'o str>,
    pub(super) thread: i64,
    pub(super) c: Counted,
}

/// A thread row waiting to be written (inserted, or updated by its number).
pub(super) struct ThreadRow<'o> {
    pub(super) n: i64,
    pub(super) id: &'o str,
    pub(super) status: &'static str,
    pub(super) count: i64,
    pub(super) created: i64,
    pub(super) last: i64,
    pub(super) error: Option<&'o str>,
}

/// What the writer knows of the file's numbering: agent and payload type names (`names`),
/// and recent threads (`threads.n`). Emptied when a transaction fails, since a number added by
/// it is gone with it; the threads also after pruning.
#[derive(Default)]
pub(super) struct Cache {
    /// The `seq` the next message gets (the writer numbers messages itself, so a multi-row
    /// insert knows each row's).
    pub(super) next: Option<i64>,
    /// The number the next new thread gets (`threads.n`), for the same reason.
    pub(super) next_thread: Option<i64>,
    pub(super) names: FastMap<String, i64>,
    pub(super) threads: SeededMap<String, i64>,
    /// Messages stored as `pending` or `held` (the statuses that change again), by id, with
    /// their thread and stored attributes: a status change finds its row here without a
    /// lookup.
    pub(super) pending: SeededMap<Arc<str>, (Arc<str>, Counted)>,
}

impl Cache {
    pub(super) fn clear(&mut self) {
        self.next = None;
        self.next_thread = None;
        self.names.clear();
        self.threads.clear();
        self.pending.clear();
    }

    /// Forgets what pruning may have deleted.
    pub(super) fn pruned(&mut self) {
        self.threads.clear();
        self.pending.clear();
    }

    pub(super) fn next_seq(&mut self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
        next_number(
            &mut self.next,
            tx,
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages",
        )
    }

    pub(super) fn next_thread(&mut self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
        next_number(
            &mut self.next_thread,
            tx,
            "SELECT COALESCE(MAX(n), 0) + 1 FROM threads",
        )
    }

    pub(super) fn remember_pending(&mut self, m: &MessageRecord, c: Counted) {
        if self.pending.len() >= THREADS_CACHED {
            self.pending.clear();
        }
        self.pending.insert(m.id.clone(), (m.thread_id.clone(), c));
    }

    pub(super) fn remember_thread(&mut self, id: &str, n: i64) {
        if self.threads.len() >= THREADS_CACHED {
            self.threads.clear();
        }
        self.threads.insert(id.to_string(), n);
    }
}

/// Whether a message stored with `status` will be written again (its row is worth
/// remembering).
fn changes_again(status: MessageStatus) -> bool {
    matches!(status, MessageStatus::Pending | MessageStatus::Held)
}

/// The next number from `next`, or from `first` (a query for the first free one) when the
/// writer does not know it yet.
pub(super) fn next_number(
    next: &mut Option<i64>,
    tx: &rusqlite::Transaction<'_>,
    first: &str,
) -> rusqlite::Result<i64> {
    let n = match *next {
        Some(n) => n,
        None => tx.query_row(first, [], |r| r.get(0))?,
    };
    *next = Some(n + 1);
    Ok(n)
}

/// The number of `name` (an agent or a payload type), added to `names` on first use.
pub(super) fn name_id(
    tx: &rusqlite::Transaction<'_>,
    cache: &mut Cache,
    name: &str,
) -> rusqlite::Result<i64> {
    if let Some(&id) = cache.names.get(name) {
        return Ok(id);
    }
    let id = tx
        .prepare_cached(
            "INSERT INTO names (name) VALUES (?1) ON CONFLICT (name) DO UPDATE SET name = name RETURNING id",
        )?
        .query_row(params![name], |r| r.get(0))?;
    cache.names.insert(name.to_string(), id);
    Ok(id)
}

/// A new message's attributes, numbered, at `seq`.
pub(super) fn counted(
    tx: &rusqlite::Transaction<'_>,
    cache: &mut Cache,
    seq: i64,
    from: &str,
    to: Option<&str>,
    payload_type: Option<&str>,
    status: &'static str,
) -> rusqlite::Result<Counted> {
    Ok(Counted {
        seq,
        from: name_id(tx, cache, from)?,
        to: match to {
            Some(to) => Some(name_id(tx, cache, to)?),
            None => None,
        },
        payload_type: match payload_type {
            Some(t) => name_id(tx, cache, t)?,
            None => 0,
        },
        status,
    })
}

/// Deletes the messages of thread `n`, adding the count changes to `deltas` (the caller
/// writes them once); returns how many.
pub(super) fn delete_messages(
    tx: &rusqlite::Transaction<'_>,
    n: i64,
    deltas: &mut Deltas,
) -> rusqlite::Result<u64> {
    let mut gone = 0u64;
    let mut newest: Option<i64> = None;
    let mut stmt = tx.prepare_cached(
        "DELETE FROM messages WHERE thread = ?1 RETURNING seq, sender, receiver, payload_type, status, event_seq",
    )?;
    let mut rows = stmt.query(params![n])?;
    while let Some(r) = rows.next()? {
        deltas.add(stored_counted(r)?, -1);
        newest = newest.max(r.get::<_, Option<i64>>(5)?);
        gone += 1;
    }
    drop(rows);
    if let Some(e) = newest {
        // A replay from before `e` would miss what was deleted (`query::replay`); the marks
        // it no longer needs go (but the last one before `e`, where a replay after it starts).
        tx.prepare_cached(
            "INSERT INTO meta (key, value) VALUES ('pruned_event_seq', ?1) \
             ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
        )?
        .execute(params![e])?;
        tx.prepare_cached(
            "DELETE FROM event_marks WHERE last_seq < \
             (SELECT MAX(last_seq) FROM event_marks WHERE last_seq <= ?1)",
        )?
        .execute(params![e])?;
    }
    Ok(gone)
}

/// Writes `rows` through `many` (a statement of `per` rows) when there are exactly `per` of
/// them, else one by one through `one`; `bind` binds a row's parameters from `at + 1` on.
/// Returns how many rows the statements changed.
pub(super) fn write_rows<'s, T>(
    rows: &[T],
    (one, many, per): (
        &mut rusqlite::CachedStatement<'s>,
        &mut rusqlite::CachedStatement<'s>,
        usize,
    ),
    params: usize,
    bind: impl Fn(&mut rusqlite::Statement<'_>, usize, &T) -> rusqlite::Result<()>,
) -> rusqlite::Result<usize> {
    let (stmt, per_statement) = if rows.len() == per {
        (many, per)
    } else {
        (one, 1)
    };
    let mut changed = 0;
    for chunk in rows.chunks(per_statement) {
        for (i, row) in chunk.iter().enumerate() {
            bind(stmt, i * params, row)?;
        }
        changed += stmt.raw_execute()?;
    }
    Ok(changed)
}

/// The writer's statements, prepared once per transaction (not looked up per operation).
pub(super) struct Writes<'t, 'c, 'o> {
    pub(super) tx: &'t rusqlite::Transaction<'t>,
    pub(super) cache: &'c mut Cache,
    /// One message row; `rows`: [`MESSAGE_ROWS`] of them.
    pub(super) insert: rusqlite::CachedStatement<'t>,
    pub(super) rows: rusqlite::CachedStatement<'t>,
    /// Messages waiting to be inserted [`MESSAGE_ROWS`] per statement.
    pub(super) pending: Vec<NewMessage<'o>>,
    pub(super) find: rusqlite::CachedStatement<'t>,
    pub(super) restate: rusqlite::CachedStatement<'t>,
    pub(super) thread_find: rusqlite::CachedStatement<'t>,
    /// One thread row upserted by its number; `thread_rows`: [`THREAD_ROWS`] of them.
    pub(super) thread_row: rusqlite::CachedStatement<'t>,
    pub(super) thread_rows: rusqlite::CachedStatement<'t>,
    /// Thread rows waiting to be written, [`THREAD_ROWS`] per statement (before any
    /// message is inserted, so a message never names a number its thread did not get).
    pub(super) threads: Vec<ThreadRow<'o>>,
    pub(super) thread_update: rusqlite::CachedStatement<'t>,
    /// Threads touched ([`Write::Touch`]): updated at the end of the transaction, when
    /// every thread row it writes exists.
    pub(super) touches: Vec<(&'o str, i64, Option<&'o str>, i64)>,
    pub(super) touch: rusqlite::CachedStatement<'t>,
    /// Threads created for a tenant, and the tenant: written at the end of the transaction
    /// (`thread_writes.rs`).
    pub(super) owned: Vec<(&'o str, &'o str)>,
    pub(super) seq: rusqlite::CachedStatement<'t>,
    /// The store `seq` of the last message this transaction wrote, for its event mark.
    pub(super) last_message: Option<i64>,
    pub(super) deltas: Deltas,
}

impl<'t, 'c, 'o> Writes<'t, 'c, 'o> {
    pub(super) fn prepare(
        tx: &'t rusqlite::Transaction<'t>,
        cache: &'c mut Cache,
    ) -> rusqlite::Result<Writes<'t, 'c, 'o>> {
        let insert = |rows: usize| {
            format!(
                "INSERT INTO messages (seq, id, thread, parent_id, slot_index, sender, receiver, payload_type, payload_xml, status, error, ts, origin_kind, origin_of, event_seq)
                 VALUES {} ON CONFLICT(thread, slot_index) DO NOTHING",
                vec![format!("({})", in_list(MESSAGE_PARAMS)); rows].join(", ")
            )
        };
        // A new thread is inserted with the number the writer gave it; a known one is updated
        // by its number (or written again, if pruning took its row). An id that has a row
        // under another number is left alone here (`insert_threads` finds it). No
        // `RETURNING`: it would cost a temporary table per statement.
        let upsert = |rows: usize| {
            format!(
                "INSERT INTO threads (n, id, status, message_count, created_at, last_activity, error)
                 VALUES {}
                 ON CONFLICT(n) DO UPDATE SET status = excluded.status, message_count = excluded.message_count,
                   last_activity = MAX(last_activity, excluded.last_activity),
                   error = CASE WHEN excluded.status = 'completed' THEN NULL ELSE COALESCE(excluded.error, error) END
                 ON CONFLICT(id) DO NOTHING",
                vec![format!("({})", in_list(THREAD_PARAMS)); rows].join(", ")
            )
        };
        Ok(Writes {
            tx,
            cache,
            insert: tx.prepare_cached(&insert(1))?,
            rows: tx.prepare_cached(&insert(MESSAGE_ROWS))?,
            pending: Vec::with_capacity(MESSAGE_ROWS),
            find: tx.prepare_cached(
                "SELECT seq, sender, receiver, payload_type, status FROM messages WHERE thread = ?1 AND id = ?2",
            )?,
            restate: tx
                .prepare_cached("UPDATE messages SET status = ?2, error = ?3 WHERE seq = ?1")?,
            thread_find: tx.prepare_cached("SELECT n FROM threads WHERE id = ?1")?,
            thread_row: tx.prepare_cached(&upsert(1))?,
            thread_rows: tx.prepare_cached(&upsert(THREAD_ROWS))?,
            threads: Vec::with_capacity(THREAD_ROWS),
            thread_update: tx.prepare_cached(
                "UPDATE threads SET status = ?2, message_count = ?3, last_activity = ?4,
                   error = CASE WHEN ?2 = 'completed' THEN NULL ELSE COALESCE(?5, error) END
                 WHERE n = ?1",
            )?,
            touches: Vec::new(),
            touch: tx.prepare_cached(
                "UPDATE threads SET message_count = MAX(message_count, ?2), last_activity = MAX(last_activity, ?3),
                   error = COALESCE(error, ?4)
                 WHERE n = ?1",
            )?,
            owned: Vec::new(),
            seq: tx.prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('last_seq', ?1) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
            )?,
            last_message: None,
            deltas: Deltas::default(),
        })
    }

    /// The number of thread `id`, if it has a row.
    pub(super) fn thread_number(&mut self, id: &str) -> rusqlite::Result<Option<i64>> {
        if let Some(&n) = self.cache.threads.get(id) {
            return Ok(Some(n));
        }
        let n = self
            .thread_find
            .query_row(params![id], |r| r.get(0))
            .optional()?;
        if let Some(n) = n {
            self.cache.remember_thread(id, n);
        }
        Ok(n)
    }

    /// A status change of a stored message, with its counts moved.
    pub(super) fn restate(
        &mut self,
        thread_id: &str,
        id: &str,
        status: MessageStatus,
        error: Option<&str>,
    ) -> rusqlite::Result<()> {
        self.insert_pending()?;
        let was = match self.cache.pending.remove(id) {
            Some((thread, was)) if &*thread == thread_id => was,
            _ => {
                let Some(thread) = self.thread_number(thread_id)? else {
                    return Ok(());
                };
                let row = self
                    .find
                    .query_row(params![thread, id], stored_counted)
                    .optional()?;
                let Some(was) = row else {
                    return Ok(());
                };
                was
            }
        };
        self.restate
            .execute(params![was.seq, status_str(status), error])?;
        if changes_again(status) {
            self.cache.pending.insert(
                Arc::from(id),
                (
                    Arc::from(thread_id),
                    Counted {
                        status: status_str(status),
                        ..was
                    },
                ),
            );
        }
        self.deltas.restate(was, status_str(status));
        Ok(())
    }

    /// A thread row to write: `n` given, `id` new (`created_at` given) or not.
    pub(super) fn thread_row(&mut self, row: ThreadRow<'o>) -> rusqlite::Result<()> {
        self.threads.push(row);
        if self.threads.len() == THREAD_ROWS {
            self.insert_threads()?;
        }
        Ok(())
    }

    /// A thread that had no row gets the next number.
    pub(super) fn new_thread(&mut self, id: &str) -> rusqlite::Result<i64> {
        let n = self.cache.next_thread(self.tx)?;
        self.cache.remember_thread(id, n);
        Ok(n)
    }

    /// Writes the waiting thread rows: [`THREAD_ROWS`] per statement, fewer one by one. A
    /// row taken for a new thread whose id has a row already (an id reused by a client, or a
    /// thread begun again after a restart) leaves that row's number as it is: its waiting
    /// messages are renumbered to it and the row is updated.
    pub(super) fn insert_threads(&mut self) -> rusqlite::Result<()> {
        if self.threads.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.threads);
        let statements = (&mut self.thread_row, &mut self.thread_rows, THREAD_ROWS);
        let written = write_rows(&rows, statements, THREAD_PARAMS, |stmt, at, t| {
            stmt.raw_bind_parameter(at + 1, t.n)?;
            stmt.raw_bind_parameter(at + 2, t.id)?;
            stmt.raw_bind_parameter(at + 3, t.status)?;
            stmt.raw_bind_parameter(at + 4, t.count)?;
            stmt.raw_bind_parameter(at + 5, t.created)?;
            stmt.raw_bind_parameter(at + 6, t.last)?;
            stmt.raw_bind_parameter(at + 7, t.error)
        })?;
        if written < rows.len() {
            for t in &rows {
                let stored: Option<i64> = self
                    .thread_find
                    .query_row(params![t.id], |r| r.get(0))
                    .optional()?;
                let Some(n) = stored.filter(|&n| n != t.n) else {
                    continue;
                };
                self.cache.remember_thread(t.id, n);
                for new in &mut self.pending {
                    if new.thread == t.n {
                        new.thread = n;
                    }
                }
                self.thread_update
                    .execute(params![n, t.status, t.count, t.last, t.error])?;
            }
        }
        self.threads = rows;
        self.threads.clear();
        Ok(())
    }

    /// Inserts the pending messages: [`MESSAGE_ROWS`] per statement, fewer one by one. A
    /// message already stored (written again after a retry) is not inserted again; only its
    /// status can differ.
    pub(super) fn insert_pending(&mut self) -> rusqlite::Result<()> {
        self.insert_threads()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let statements = (&mut self.insert, &mut self.rows, MESSAGE_ROWS);
        let inserted = write_rows(&pending, statements, MESSAGE_PARAMS, |stmt, at, new| {
            let (m, c) = (new.m, &new.c);
            stmt.raw_bind_parameter(at + 1, c.seq)?;
            stmt.raw_bind_parameter(at + 2, &*m.id)?;
            stmt.raw_bind_parameter(at + 3, new.thread)?;
            stmt.raw_bind_parameter(at + 4, m.parent_id.as_deref())?;
            stmt.raw_bind_parameter(at + 5, m.slot_index as i64)?;
            stmt.raw_bind_parameter(at + 6, c.from)?;
            stmt.raw_bind_parameter(at + 7, c.to)?;
            stmt.raw_bind_parameter(at + 8, c.payload_type)?;
            stmt.raw_bind_parameter(at + 9, &*m.payload_xml)?;
            stmt.raw_bind_parameter(at + 10, c.status)?;
            stmt.raw_bind_parameter(at + 11, new.error)?;
            stmt.raw_bind_parameter(at + 12, m.timestamp.0 as i64)?;
            // Only an origin its sender and parent do not imply.
            let origin =
                Some(&m.origin).filter(|o| **o != Origin::implied(m.parent_id.as_ref(), &m.from));
            stmt.raw_bind_parameter(at + 13, origin.map(|o| o.kind.name()))?;
            stmt.raw_bind_parameter(at + 14, origin.and_then(|o| o.of.as_deref()))?;
            stmt.raw_bind_parameter(at + 15, new.event_seq as i64)
        })?;
        for &NewMessage {
            m,
            status,
            error,
            c,
            ..
        } in &pending
        {
            if inserted < pending.len() {
                let stored: Option<String> = self
                    .tx
                    .prepare_cached("SELECT id FROM messages WHERE seq = ?1")?
                    .query_row(params![c.seq], |r| r.get(0))
                    .optional()?;
                if stored.as_deref() != Some(&*m.id) {
                    self.restate(&m.thread_id, &m.id, status, error)?;
                    continue;
                }
            }
            self.deltas.add(c, 1);
            self.deltas.stamp(c.seq, m.timestamp.0 as i64);
            if changes_again(status) {
                self.cache.remember_pending(m, c);
            }
        }
        self.pending = pending;
        self.pending.clear();
        Ok(())
    }

    /// Applies one write; count changes gather in `deltas`.
    pub(super) fn apply(&mut self, w: Write<'o>) -> rusqlite::Result<()> {
        match w {
            Write::Message {
                m,
                status,
                error,
                event_seq,
            } => {
                let thread = match self.thread_number(&m.thread_id)? {
                    Some(n) => n,
                    None => {
                        // A message whose thread was never recorded: the thread gets a row.
                        let n = self.new_thread(&m.thread_id)?;
                        let ts = m.timestamp.0 as i64;
                        self.thread_row(ThreadRow {
                            n,
                            id: &m.thread_id,
                            status: status_str(ThreadStatus::Active),
                            count: 0,
                            created: ts,
                            last: ts,
                            error: None,
                        })?;
                        n
                    }
                };
                let seq = self.cache.next_seq(self.tx)?;
                let c = counted(
                    self.tx,
                    self.cache,
                    seq,
                    m.from.as_ref(),
                    m.to.as_deref(),
                    m.payload_type.as_deref(),
                    status_str(status),
                )?;
                self.last_message = Some(seq);
                self.pending.push(NewMessage {
                    m,
                    event_seq,
                    status,
                    error,
                    thread,
                    c,
                });
                if self.pending.len() == MESSAGE_ROWS {
                    self.insert_pending()?;
                }
            }
            Write::Status {
                id,
                thread_id,
                status,
                error,
                ..
            } => self.restate(thread_id, id, status, error)?,
            Write::Thread {
                id,
                status,
                message_count,
                created_at,
                error,
                at,
                owner,
            } => {
                self.owned.extend(owner.map(|o| (id, o)));
                let at = at.0 as i64;
                // A thread created now (the common case for its first write) is new unless
                // its id has a row already, which `insert_threads` finds without a lookup
                // per thread; any other is looked up.
                let n = match self.cache.threads.get(id) {
                    Some(&n) => Some(n),
                    None if created_at.is_some() => None,
                    None => self.thread_number(id)?,
                };
                let n = match n {
                    Some(n) => n,
                    None => self.new_thread(id)?,
                };
                self.thread_row(ThreadRow {
                    n,
                    id,
                    status: status_str(status),
                    count: message_count as i64,
                    created: created_at.map(|c| c.0 as i64).unwrap_or(at),
                    last: at,
                    error,
                })?;
            }
            Write::Touch {
                id,
                message_count,
                error,
                at,
            } => self
                .touches
                .push((id, message_count as i64, error, at.0 as i64)),
            Write::Seq(s) => {
                self.seq.execute(params![s as i64])?;
                // Where a replay after event `s` may start (`query::replay`): every message
                // up to this one was published at or before `s`.
                if let Some(m) = self.last_message.take() {
                    self.tx
                        .prepare_cached(
                            "INSERT OR REPLACE INTO event_marks (last_seq, message_seq) VALUES (?1, ?2)",
                        )?
                        .execute(params![s as i64, m])?;
                }
            }
            Write::InputOpened(r, decided) => super::inputs::insert(self.tx, r, decided)?,
            Write::InputDecided(r) => super::inputs::decide(self.tx, r)?,
            Write::Key(r, prune_before) => super::idempotency::insert(self.tx, r, prune_before)?,
            Write::Usage(u, at) => super::usage::insert(self.tx, u, at)?,
            Write::Settings(id, settings) => self.settings(id, settings)?,
            Write::Labels(id, labels) => self.labels(id, labels)?,
            Write::Rewound(id, r) => self.rewound(id, r)?,
            Write::Work(rows, at) => super::usage::add_work(self.tx, rows, at)?,
        }
        Ok(())
    }

    /// Writes what is still buffered: pending message rows (and the thread rows before
    /// them), then the touched threads. A thread without a row is left alone.
    pub(super) fn finish(&mut self) -> rusqlite::Result<()> {
        self.insert_pending()?;
        for (id, count, error, at) in std::mem::take(&mut self.touches) {
            if let Some(n) = self.thread_number(id)? {
                self.touch.execute(params![n, count, at, error])?;
            }
        }
        self.owners()
    }
}
