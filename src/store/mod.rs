//! The durable log (SPEC §13): messages and threads in one SQLite file, WAL mode.
//!
//! One writer thread owns the write connection. It is fed through a bounded channel and commits
//! in batches: up to [`BATCH_MAX`] operations, or whatever arrived within [`BATCH_WINDOW`] of the
//! first. Nothing in the pump waits on disk in the common case. When the writer falls behind,
//! [`Store::backlogged`] turns true and inject is refused (429) before the channel is full;
//! pump-internal writes then wait for room rather than being dropped. Reads use their own
//! connection and a read transaction, so a page and its `total` come from one snapshot.
//!
//! Schema versions are numbered with `PRAGMA user_version`; `MIGRATIONS` brings any older
//! file up to date, and a newer file is refused by name.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, params_from_iter, Connection, OpenFlags, OptionalExtension};

use crate::events::EventKind;
use crate::threads::{
    MessageFilter, MessageRecord, MessageStatus, Page, Paged, ThreadFilter, ThreadInfo,
    ThreadStatus,
};
use crate::time::Timestamp;

/// Operations per transaction, at most.
pub const BATCH_MAX: usize = 2048;
/// How long the writer gathers a batch after its first operation.
pub const BATCH_WINDOW: Duration = Duration::from_millis(20);
/// How often operations that failed to commit are tried again.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Messages deleted per pruning transaction, at least (whole threads; see [`Store::prune`]):
/// a chunk is also at least twice the messages written since the previous chunk.
pub const PRUNE_CHUNK: u64 = 4096;
/// Operations the writer's channel holds.
pub const QUEUE: usize = 65_536;

/// Each entry moves the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE messages (
  id TEXT PRIMARY KEY,
  thread_id TEXT NOT NULL,
  parent_id TEXT,
  slot_index INTEGER NOT NULL,
  sender TEXT NOT NULL,
  receiver TEXT,
  payload_type TEXT,
  payload_xml TEXT NOT NULL,
  status TEXT NOT NULL,
  error TEXT,
  ts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE UNIQUE INDEX messages_thread_slot ON messages(thread_id, slot_index);
CREATE INDEX messages_ts ON messages(ts, thread_id, slot_index);
CREATE INDEX messages_sender ON messages(sender, ts);
CREATE INDEX messages_receiver ON messages(receiver, ts);
CREATE INDEX messages_type ON messages(payload_type, ts);
CREATE INDEX messages_status ON messages(status, ts);
CREATE TABLE threads (
  id TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  message_count INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  last_activity INTEGER NOT NULL,
  error TEXT
) WITHOUT ROWID;
CREATE INDEX threads_created ON threads(created_at);
CREATE INDEX threads_activity ON threads(last_activity);
"#,
    r#"
-- v2: messages keyed by their place in the log (rowid = write order, so oldest-first pages
-- need no sort), narrower indexes, an agent side table (one row per sender and receiver) and
-- kept counts per (agent, payload type, status), so a broad filter's exact total is a lookup
-- instead of a scan. Agent '' counts every message once. The writer and pruning keep both
-- side tables in step with `messages`, in the same transaction.
CREATE TABLE messages_v2 (
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL,
  thread_id TEXT NOT NULL,
  parent_id TEXT,
  slot_index INTEGER NOT NULL,
  sender TEXT NOT NULL,
  receiver TEXT,
  payload_type TEXT,
  payload_xml TEXT NOT NULL,
  status TEXT NOT NULL,
  error TEXT,
  ts INTEGER NOT NULL
);
INSERT INTO messages_v2 (id, thread_id, parent_id, slot_index, sender, receiver, payload_type, payload_xml, status, error, ts)
  SELECT id, thread_id, parent_id, slot_index, sender, receiver, payload_type, payload_xml, status, error, ts
  FROM messages ORDER BY ts, thread_id, slot_index;
DROP TABLE messages;
ALTER TABLE messages_v2 RENAME TO messages;
CREATE UNIQUE INDEX messages_thread_slot ON messages(thread_id, slot_index);
CREATE INDEX messages_ts ON messages(ts);
CREATE INDEX messages_type ON messages(payload_type);
CREATE INDEX messages_status ON messages(status);
CREATE TABLE message_agents (
  agent TEXT NOT NULL,
  seq INTEGER NOT NULL,
  PRIMARY KEY (agent, seq)
) WITHOUT ROWID;
CREATE TABLE message_counts (
  agent TEXT NOT NULL,
  payload_type TEXT NOT NULL,
  status TEXT NOT NULL,
  n INTEGER NOT NULL,
  PRIMARY KEY (agent, payload_type, status)
) WITHOUT ROWID;
INSERT INTO message_counts SELECT '', COALESCE(payload_type, ''), status, COUNT(*) FROM messages GROUP BY 2, 3;
INSERT INTO message_agents SELECT sender, seq FROM messages;
INSERT OR IGNORE INTO message_agents SELECT receiver, seq FROM messages WHERE receiver IS NOT NULL;
INSERT INTO message_counts SELECT a.agent, COALESCE(m.payload_type, ''), m.status, COUNT(*)
  FROM message_agents a JOIN messages m ON m.seq = a.seq GROUP BY 1, 2, 3;
"#,
    r#"
-- v3: the agent side table keyed by a number per agent name (`names`), not the name: its
-- index compares an integer instead of a repeated string on every insert. `names` only grows
-- (agent names are the organism's listeners and injector identities: few).
CREATE TABLE names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
INSERT INTO names (name) SELECT DISTINCT agent FROM message_agents;
CREATE TABLE message_agents_v3 (
  agent INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  PRIMARY KEY (agent, seq)
) WITHOUT ROWID;
INSERT INTO message_agents_v3 SELECT n.id, a.seq FROM message_agents a JOIN names n ON n.name = a.agent;
DROP TABLE message_agents;
ALTER TABLE message_agents_v3 RENAME TO message_agents;
-- The status index leaves out `delivered`, the status nearly every message ends in: those
-- inserts skip it, and a `delivered` filter reads the log in order (most rows match).
DROP INDEX messages_status;
CREATE INDEX messages_status ON messages(status) WHERE status != 'delivered';
"#,
];

/// Why the store cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("store {path}: {message}")]
pub struct StoreError {
    pub path: String,
    pub message: String,
}

/// What the store found on opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovered {
    /// The last event `seq` committed. The hub continues from [`Recovered::next_seq_floor`].
    pub last_seq: u64,
    pub total_messages: u64,
    /// Threads that were active when the process ended, now `error` / `interrupted`.
    pub interrupted: u64,
}

enum Op {
    Message(MessageRecord),
    Status {
        id: String,
        thread_id: String,
        status: MessageStatus,
        error: Option<String>,
    },
    Thread {
        id: String,
        status: ThreadStatus,
        message_count: u64,
        created_at: Option<Timestamp>,
        error: Option<String>,
    },
    Seq(u64),
    Flush(mpsc::Sender<()>),
    /// One chunk of pruning, run by the writer between batches (see [`Store::prune`]).
    Prune {
        excess: u64,
        cutoff: Option<i64>,
        done: mpsc::Sender<rusqlite::Result<Pruned>>,
    },
}

/// Health the API reports (`/readyz`) and inject consults.
#[derive(Default)]
struct Health {
    queued: AtomicUsize,
    failed: AtomicBool,
    last_error: Mutex<Option<String>>,
    committed_batches: AtomicU64,
    pruned: AtomicU64,
    /// The highest event `seq` recorded; written with every batch.
    latest_seq: AtomicU64,
}

pub struct Store {
    path: PathBuf,
    tx: SyncSender<Op>,
    reader: Mutex<Connection>,
    health: Arc<Health>,
    recovered: Recovered,
}

fn err(path: &Path, message: impl std::fmt::Display) -> StoreError {
    StoreError {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Statuses as stored: the same words the API shows.
trait Word: Copy {
    fn word(self) -> &'static str;
}

impl Word for MessageStatus {
    fn word(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::Delivered => "delivered",
            MessageStatus::Terminal => "terminal",
            MessageStatus::Rejected => "rejected",
            MessageStatus::Undeliverable => "undeliverable",
            MessageStatus::Failed => "failed",
            MessageStatus::Killed => "killed",
        }
    }
}

impl Word for ThreadStatus {
    fn word(self) -> &'static str {
        match self {
            ThreadStatus::Active => "active",
            ThreadStatus::Completed => "completed",
            ThreadStatus::Error => "error",
            ThreadStatus::Killed => "killed",
        }
    }
}

fn status_str<T: Word>(s: T) -> &'static str {
    s.word()
}

#[cfg(test)]
fn status_json<T: serde::Serialize>(s: T) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn parse_status<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}

fn open_connection(path: &Path, flags: OpenFlags) -> Result<Connection, StoreError> {
    // No SQLite connection mutex: a `Connection` is used by one thread at a time (it is not
    // `Sync`), so the lock SQLite would take around every call is pure cost.
    let conn = Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| err(path, e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| err(path, e))?;
    Ok(conn)
}

impl Recovered {
    /// Where the event hub's `seq` resumes after a restart: past anything that may have been
    /// published but not committed before the process ended (one batch window of events), so
    /// a `seq` a client saw is never reused.
    pub fn next_seq_floor(&self) -> u64 {
        if self.last_seq == 0 && self.total_messages == 0 {
            0
        } else {
            self.last_seq + QUEUE as u64
        }
    }
}

impl Store {
    /// Opens (creating the directory and file if needed) and migrates the store, marks
    /// threads left active as interrupted, and starts the writer.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, None)
    }

    /// [`Store::open`], with the writer limited to `max_pages` pages: how the tests fill the
    /// "disk" (SQLite reports the same `SQLITE_FULL` as for a full file system).
    fn open_with(path: &Path, max_pages: Option<u32>) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                err(
                    path,
                    format!("cannot create directory {}: {e}", dir.display()),
                )
            })?;
        }
        let mut conn = open_connection(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        )?;
        let corrupt = |e: rusqlite::Error| {
            err(
                path,
                format!("not a usable agentserver store (corrupted or not SQLite?): {e}"),
            )
        };
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(corrupt)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(corrupt)?;
        // Checkpoints every 8192 pages (32 MiB of log) instead of every 1000, so a page
        // rewritten by many batches is copied to the file (and synced) once, not once per few
        // batches; the log file is cut back to 64 MiB after a checkpoint. (A larger page cache
        // than SQLite's default 2 MiB measured no different.)
        for (pragma, value) in [
            ("wal_autocheckpoint", 8192),
            ("journal_size_limit", 64 << 20),
        ] {
            conn.pragma_update(None, pragma, value).map_err(corrupt)?;
        }
        // Migrate under a write lock, so two processes opening a new file do not race.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(corrupt)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(corrupt)?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(err(
                path,
                format!("schema version {version} is newer than this agentserver understands ({known}); use a newer release or another file"),
            ));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql).map_err(corrupt)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(corrupt)?;
        }
        tx.commit().map_err(corrupt)?;
        if let Some(pages) = max_pages {
            conn.pragma_update(None, "max_page_count", pages)
                .map_err(corrupt)?;
        }
        let interrupted = conn
            .execute(
                "UPDATE threads SET status = 'error', error = COALESCE(error, 'interrupted') WHERE status = 'active'",
                [],
            )
            .map_err(corrupt)? as u64;
        let last_seq: u64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'last_seq'", [], |r| {
                get_u64(r, 0)
            })
            .optional()
            .map_err(corrupt)?
            .unwrap_or(0);
        let total_messages = stored_total(&conn).map_err(corrupt)?;
        let reader = open_connection(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
        let health = Arc::new(Health::default());
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer_health = health.clone();
        let writer_path = path.to_path_buf();
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer(conn, rx, writer_health, writer_path))
            .map_err(|e| err(path, format!("cannot start the writer: {e}")))?;
        Ok(Store {
            path: path.to_path_buf(),
            tx,
            reader: Mutex::new(reader),
            health,
            recovered: Recovered {
                last_seq,
                total_messages,
                interrupted,
            },
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn recovered(&self) -> Recovered {
        self.recovered
    }

    /// True when the writer is behind enough that new work should be refused.
    pub fn backlogged(&self) -> bool {
        self.health.queued.load(Ordering::Relaxed) > QUEUE / 2
    }

    /// The last write error, if writing has failed (the store is then not ready).
    pub fn failure(&self) -> Option<String> {
        if !self.health.failed.load(Ordering::Relaxed) {
            return None;
        }
        crate::sync::lock(&self.health.last_error).clone()
    }

    /// Operations waiting for the writer.
    pub fn queued(&self) -> usize {
        self.health.queued.load(Ordering::Relaxed)
    }

    /// Transactions committed since start.
    pub fn committed_batches(&self) -> u64 {
        self.health.committed_batches.load(Ordering::Relaxed)
    }

    fn send(&self, op: Op) {
        self.health.queued.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(op) {
            Ok(()) => {}
            Err(TrySendError::Full(op)) => {
                // Never drop: wait for the writer.
                if self.tx.send(op).is_err() {
                    self.health.queued.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(TrySendError::Disconnected(_)) => {
                self.health.queued.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Records what an event changed. Called in `seq` order by the event hub.
    pub fn record(&self, seq: u64, kind: &EventKind) {
        match kind {
            EventKind::Message { message } => self.send(Op::Message(message.clone())),
            EventKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
            } => self.send(Op::Status {
                id: id.clone(),
                thread_id: thread_id.clone(),
                status: *status,
                error: error.clone(),
            }),
            EventKind::ThreadCreated { thread } => self.send(Op::Thread {
                id: thread.id.clone(),
                status: thread.status,
                message_count: thread.message_count,
                created_at: Some(thread.created_at),
                error: thread.error.clone(),
            }),
            EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
            } => self.send(Op::Thread {
                id: thread_id.clone(),
                status: *status,
                message_count: *message_count,
                created_at: None,
                error: error.clone(),
            }),
            _ => {}
        }
        self.health.latest_seq.fetch_max(seq, Ordering::Relaxed);
    }

    /// Writes the last `seq` and waits until everything sent so far is committed.
    pub fn flush(&self, last_seq: u64) {
        self.send(Op::Seq(last_seq));
        let (done, wait) = mpsc::channel();
        self.send(Op::Flush(done));
        let _ = wait.recv_timeout(Duration::from_secs(30));
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = crate::sync::lock(&self.reader);
        let tx = conn.transaction().map_err(|e| err(&self.path, e))?;
        let out = f(&tx).map_err(|e| err(&self.path, e))?;
        tx.commit().map_err(|e| err(&self.path, e))?;
        Ok(out)
    }

    /// One page of the log (oldest first, in write order), with the exact total, from one
    /// snapshot. Filters on agent, payload type and status alone take their total from the
    /// kept counts; a thread or time window counts the matching rows through an index.
    pub fn query_messages(
        &self,
        filter: &MessageFilter,
        page: Page,
    ) -> Result<Paged<MessageRecord>, StoreError> {
        use rusqlite::types::Value as V;
        self.read(|tx| {
            // Payload types are few: resolve the filter (exact name or local name) against
            // the kept counts, so the page query is an index lookup per matching type.
            let types = match &filter.payload_type {
                None => None,
                Some(p) => {
                    let mut stmt = tx.prepare_cached(
                        "SELECT DISTINCT payload_type FROM message_counts WHERE agent = '' AND payload_type != ''",
                    )?;
                    let all = stmt
                        .query_map([], |r| r.get::<_, String>(0))?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    Some(
                        all.into_iter()
                            .filter(|t| crate::threads::payload_type_matches(t, p))
                            .collect::<Vec<_>>(),
                    )
                }
            };
            let in_list = |n: usize| vec!["?"; n].join(", ");
            let mut clauses: Vec<String> = Vec::new();
            let mut args: Vec<V> = Vec::new();
            let from = match &filter.agent {
                Some(a) => {
                    clauses.push("a.agent = (SELECT id FROM names WHERE name = ?)".into());
                    args.push(V::Text(a.clone()));
                    "message_agents a CROSS JOIN messages m ON m.seq = a.seq"
                }
                None => "messages m",
            };
            if let Some(t) = &filter.thread {
                clauses.push("m.thread_id = ?".into());
                args.push(V::Text(t.clone()));
            }
            if let Some(types) = &types {
                clauses.push(format!("m.payload_type IN ({})", in_list(types.len())));
                args.extend(types.iter().cloned().map(V::Text));
            }
            if let Some(s) = filter.status {
                clauses.push("m.status = ?".into());
                args.push(V::Text(status_str(s).to_string()));
                if s != MessageStatus::Delivered {
                    // The status index's own condition, so the planner may use it.
                    clauses.push("m.status != 'delivered'".into());
                }
            }
            // A time window also bounds the write order: the first row at or after `since`
            // and the last before `until` (found through the time index) bound the scan, so
            // the page is read in order from there instead of sorted. `+` keeps the planner
            // from choosing the time index for the page itself.
            let seq_col = if filter.agent.is_some() { "a.seq" } else { "m.seq" };
            for (bound, sql, cmp) in [
                (filter.since, "SELECT MIN(seq) FROM messages INDEXED BY messages_ts WHERE ts >= ?", ">="),
                (filter.until, "SELECT MAX(seq) FROM messages INDEXED BY messages_ts WHERE ts < ?", "<="),
            ] {
                let Some(t) = bound else { continue };
                let edge: Option<i64> =
                    tx.query_row(sql, params![t.0 as i64], |r| r.get(0))?;
                clauses.push(format!("{seq_col} {cmp} ?"));
                // No row in the window: a bound nothing meets.
                args.push(V::Integer(edge.unwrap_or(if cmp == ">=" { i64::MAX } else { -1 })));
                clauses.push(format!("+m.ts {} ?", if cmp == ">=" { ">=" } else { "<" }));
                args.push(V::Integer(t.0 as i64));
            }
            let w = Where { clauses, args };
            let kept = filter.thread.is_none() && filter.since.is_none() && filter.until.is_none();
            let total = if kept {
                let mut clauses = vec!["agent = ?".to_string()];
                let mut args = vec![V::Text(filter.agent.clone().unwrap_or_default())];
                if let Some(types) = &types {
                    clauses.push(format!("payload_type IN ({})", in_list(types.len())));
                    args.extend(types.iter().cloned().map(V::Text));
                }
                if let Some(s) = filter.status {
                    clauses.push("status = ?".into());
                    args.push(V::Text(status_str(s).to_string()));
                }
                Some(tx.query_row(
                    &format!(
                        "SELECT COALESCE(SUM(n), 0) FROM message_counts WHERE {}",
                        clauses.join(" AND ")
                    ),
                    params_from_iter(args.iter()),
                    |r| get_u64(r, 0),
                )?)
            } else {
                None
            };
            let (total, items) = count_and_page(
                tx,
                from,
                "m.id, m.thread_id, m.parent_id, m.slot_index, m.sender, m.receiver, m.payload_type, m.payload_xml, m.status, m.error, m.ts",
                seq_col,
                &w,
                total,
                page,
                row_to_message,
            )?;
            Ok(Paged {
                items,
                total,
                limit: page.limit,
                offset: page.offset,
            })
        })
    }

    /// One page of threads, newest first, with the exact total.
    pub fn query_threads(
        &self,
        filter: &ThreadFilter,
        page: Page,
    ) -> Result<Paged<ThreadInfo>, StoreError> {
        use rusqlite::types::Value as V;
        let mut clauses: Vec<String> = Vec::new();
        let mut args: Vec<V> = Vec::new();
        if let Some(s) = filter.status {
            clauses.push("status = ?".into());
            args.push(V::Text(status_str(s).to_string()));
        }
        if let Some(a) = &filter.agent {
            clauses.push("EXISTS (SELECT 1 FROM messages m WHERE m.thread_id = threads.id AND (m.sender = ? OR m.receiver = ?))".into());
            args.push(V::Text(a.clone()));
            args.push(V::Text(a.clone()));
        }
        if let Some(s) = filter.since {
            clauses.push("last_activity >= ?".into());
            args.push(V::Integer(s.0 as i64));
        }
        if let Some(u) = filter.until {
            clauses.push("created_at < ?".into());
            args.push(V::Integer(u.0 as i64));
        }
        let w = Where { clauses, args };
        self.read(|tx| {
            let (total, rows) = count_and_page(
                tx,
                "threads",
                "id, status, message_count, created_at, last_activity, error",
                "created_at DESC, id DESC",
                &w,
                None,
                page,
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        get_u64(r, 2)?,
                        get_u64(r, 3)?,
                        get_u64(r, 4)?,
                        r.get::<_, Option<String>>(5)?,
                    ))
                },
            )?;
            let mut items = Vec::with_capacity(rows.len());
            for (id, status, count, created, last, error) in rows {
                let participants = participants(tx, &id)?;
                items.push(ThreadInfo {
                    participants,
                    id,
                    status: parse_status(&status).unwrap_or(ThreadStatus::Error),
                    message_count: count,
                    created_at: Timestamp(created),
                    last_activity: Timestamp(last),
                    error,
                });
            }
            Ok(Paged {
                items,
                total,
                limit: page.limit,
                offset: page.offset,
            })
        })
    }

    /// One thread, if stored.
    pub fn thread(&self, id: &str) -> Result<Option<ThreadInfo>, StoreError> {
        self.read(|tx| {
            let row = tx
                .query_row(
                    "SELECT status, message_count, created_at, last_activity, error FROM threads WHERE id = ?",
                    params![id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            get_u64(r, 1)?,
                            get_u64(r, 2)?,
                            get_u64(r, 3)?,
                            r.get::<_, Option<String>>(4)?,
                        ))
                    },
                )
                .optional()?;
            let Some((status, count, created, last, error)) = row else {
                return Ok(None);
            };
            Ok(Some(ThreadInfo {
                id: id.to_string(),
                status: parse_status(&status).unwrap_or(ThreadStatus::Error),
                participants: participants(tx, id)?,
                message_count: count,
                created_at: Timestamp(created),
                last_activity: Timestamp(last),
                error,
            }))
        })
    }

    /// Deletes whole threads, oldest activity first, until at most `max_messages` remain, and
    /// every thread whose last activity is older than `max_age`. Returns messages deleted.
    ///
    /// One pass: how much is too much is fixed when the pass starts, so a pass ends even
    /// while messages keep arriving (they are the next pass's business). The writer does the
    /// deleting, one transaction at a time between its batches, each of at least
    /// [`PRUNE_CHUNK`] messages and at least twice what was written since the last one: the
    /// next chunk is asked for only when the last is done, so it queues behind the writes
    /// that arrived meanwhile, a large prune holds the pump's writes back by one chunk at
    /// most (and never competes with them for SQLite's lock), and pruning outpaces arrivals,
    /// the writer's backlog (inject's 429) paying for it.
    pub fn prune(
        &self,
        max_messages: Option<u64>,
        max_age: Option<Duration>,
    ) -> Result<u64, StoreError> {
        let cutoff =
            max_age.map(|age| Timestamp::now().0.saturating_sub(age.as_millis() as u64) as i64);
        let mut excess = match max_messages {
            Some(max) => self.read(|tx| stored_total(tx))?.saturating_sub(max),
            None => 0,
        };
        let mut deleted = 0u64;
        loop {
            let (done, wait) = mpsc::channel();
            self.send(Op::Prune {
                excess,
                cutoff,
                done,
            });
            let chunk = wait
                .recv()
                .map_err(|_| err(&self.path, "the store writer has stopped"))?
                .map_err(|e| err(&self.path, e))?;
            deleted += chunk.by_age + chunk.by_count;
            excess = excess.saturating_sub(chunk.by_count);
            let progress = chunk.by_age + chunk.by_count > 0;
            if !(chunk.more_by_age || (excess > 0 && progress)) {
                return Ok(deleted);
            }
        }
    }

    /// Messages pruned since the store was opened.
    pub fn pruned(&self) -> u64 {
        self.health.pruned.load(Ordering::Relaxed)
    }
}

/// Messages in the log, from the kept counts (agent `''` counts each message once).
fn stored_total(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT COALESCE(SUM(n), 0) FROM message_counts WHERE agent = ''",
        [],
        |r| get_u64(r, 0),
    )
}

/// What one pruning transaction deleted.
struct Pruned {
    /// Messages of threads past the age limit.
    by_age: u64,
    /// Messages of the oldest threads, for the count limit.
    by_count: u64,
    /// More threads past the age limit remain.
    more_by_age: bool,
}

/// One pruning transaction on the writer's connection: deletes finished threads past
/// `cutoff` (oldest first), then the oldest finished threads while `excess` messages remain to
/// go, about `chunk` messages in all (whole threads, at least one).
fn prune_chunk(
    conn: &mut Connection,
    excess: u64,
    cutoff: Option<i64>,
    chunk: u64,
) -> rusqlite::Result<Pruned> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut deltas = CountDeltas::default();
    let mut out = Pruned {
        by_age: 0,
        by_count: 0,
        more_by_age: false,
    };
    let mut delete = |tx: &rusqlite::Transaction<'_>, id: &str| -> rusqlite::Result<u64> {
        let n = delete_messages(tx, "thread_id = ?1", params![id], &mut deltas)?;
        tx.prepare_cached("DELETE FROM threads WHERE id = ?1")?
            .execute(params![id])?;
        Ok(n)
    };
    let oldest = |tx: &rusqlite::Transaction<'_>, cutoff: i64| -> rusqlite::Result<Vec<String>> {
        tx.prepare_cached(
            "SELECT id FROM threads WHERE last_activity < ?1 AND status != 'active' \
             ORDER BY last_activity, id LIMIT ?2",
        )?
        .query_map(params![cutoff, chunk.min(i64::MAX as u64) as i64], |r| {
            r.get(0)
        })?
        .collect()
    };
    if let Some(cutoff) = cutoff {
        let ids = oldest(&tx, cutoff)?;
        // A full page may have more behind it, even when all of it was deleted.
        out.more_by_age = ids.len() as u64 >= chunk;
        for id in &ids {
            if out.by_age >= chunk {
                out.more_by_age = true;
                break;
            }
            out.by_age += delete(&tx, id)?;
        }
    }
    let room = chunk.saturating_sub(out.by_age).min(excess);
    if room > 0 && !out.more_by_age {
        for id in oldest(&tx, i64::MAX)? {
            if out.by_count >= room {
                break;
            }
            out.by_count += delete(&tx, &id)?;
        }
    }
    deltas.write(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// A filter as SQL: `AND`-ed clauses with their parameters.
struct Where {
    clauses: Vec<String>,
    args: Vec<rusqlite::types::Value>,
}

/// One page of the rows of `from` matching `w`, in `order`, and their exact count (unless
/// `known_total` already gives it), from the same transaction.
#[allow(clippy::too_many_arguments)]
fn count_and_page<T>(
    tx: &rusqlite::Transaction<'_>,
    from: &str,
    columns: &str,
    order: &str,
    w: &Where,
    known_total: Option<u64>,
    page: Page,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<(u64, Vec<T>)> {
    let where_sql = if w.clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", w.clauses.join(" AND "))
    };
    let total = match known_total {
        Some(t) => t,
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

fn participants(tx: &rusqlite::Transaction<'_>, thread: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = tx.prepare_cached(
        "SELECT sender, receiver FROM messages WHERE thread_id = ? ORDER BY slot_index",
    )?;
    let mut out: Vec<String> = Vec::new();
    let rows = stmt.query_map(params![thread], |r| {
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

fn get_u64(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    r.get::<_, i64>(i).map(|v| v.max(0) as u64)
}

fn row_to_message(r: &rusqlite::Row<'_>) -> rusqlite::Result<MessageRecord> {
    let status: String = r.get(8)?;
    Ok(MessageRecord {
        id: Arc::from(r.get::<_, String>(0)?),
        thread_id: Arc::from(r.get::<_, String>(1)?),
        parent_id: r.get::<_, Option<String>>(2)?.map(Arc::from),
        slot_index: get_u64(r, 3)?,
        from: Arc::from(r.get::<_, String>(4)?),
        to: r.get::<_, Option<String>>(5)?.map(Arc::from),
        payload_type: r.get(6)?,
        payload_xml: Arc::from(r.get::<_, String>(7)?),
        status: parse_status(&status).unwrap_or(MessageStatus::Failed),
        error: r.get(9)?,
        timestamp: Timestamp(get_u64(r, 10)?),
        schema: None,
    })
}

fn writer(mut conn: Connection, rx: mpsc::Receiver<Op>, health: Arc<Health>, path: PathBuf) {
    let mut batch: Vec<Op> = Vec::with_capacity(BATCH_MAX);
    // Operations that failed to commit (disk full, I/O error): kept, first in the next batch,
    // and retried every RETRY_INTERVAL even when nothing new arrives, so nothing is lost
    // once the cause is gone.
    let mut held: Vec<Op> = Vec::new();
    // Messages written since the last pruning chunk (sizes the next one).
    let mut arrived_since_prune = 0u64;
    let mut names = Names::new();
    loop {
        let first = if held.is_empty() {
            rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(RETRY_INTERVAL)
        };
        let held_before = held.len();
        batch.append(&mut held);
        let mut received = 0;
        // The store is gone (the process is ending): one last try for what is held.
        let last = matches!(first, Err(mpsc::RecvTimeoutError::Disconnected));
        if last && batch.is_empty() {
            return;
        }
        if let Ok(op) = first {
            batch.push(op);
            received += 1;
        }
        // Gather without being woken per write: sleep through the window (unless a full
        // batch is already waiting), then take what arrived.
        if received > 0 && health.queued.load(Ordering::Relaxed) < BATCH_MAX {
            std::thread::sleep(BATCH_WINDOW);
        }
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(op) => {
                    batch.push(op);
                    received += 1;
                }
                Err(_) => break,
            }
        }
        // Pruning runs in its own transactions after the batch (so a failed batch does not
        // undo it, and it can free the space a full disk needs).
        let prunes: Vec<Op> = batch
            .extract_if(.., |op| matches!(op, Op::Prune { .. }))
            .collect();
        arrived_since_prune += batch
            .iter()
            .filter(|op| matches!(op, Op::Message(_)))
            .count() as u64;
        coalesce(&mut batch);
        batch.push(Op::Seq(health.latest_seq.load(Ordering::Relaxed)));
        let result = commit(&mut conn, &mut names, &batch);
        match result {
            Ok(()) => {
                health.committed_batches.fetch_add(1, Ordering::Relaxed);
                if health.failed.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %path.display(), "store writes succeed again");
                }
            }
            Err((e, failed)) => {
                tracing::error!(store = %path.display(), error = %e, held = failed.len(), "store write failed; will retry");
                health.failed.store(true, Ordering::Relaxed);
                if let Ok(mut last) = health.last_error.lock() {
                    *last = Some(e.to_string());
                }
                let mut i = 0;
                batch.retain_mut(|op| {
                    let keep = failed.binary_search(&i).is_ok()
                        && !matches!(op, Op::Seq(_) | Op::Flush(_));
                    i += 1;
                    if keep {
                        held.push(std::mem::replace(op, Op::Seq(0)));
                    }
                    !keep
                });
            }
        }
        health.queued.fetch_sub(
            (received + held_before).saturating_sub(held.len()),
            Ordering::Relaxed,
        );
        for op in prunes {
            if let Op::Prune {
                excess,
                cutoff,
                done,
            } = op
            {
                // At least twice what arrived since the last chunk, so pruning outpaces
                // arrivals (the writer's backlog, and so inject's 429, pays for it).
                let chunk = PRUNE_CHUNK.max(2 * arrived_since_prune);
                arrived_since_prune = 0;
                let result = prune_chunk(&mut conn, excess, cutoff, chunk);
                if let Ok(p) = &result {
                    health
                        .pruned
                        .fetch_add(p.by_age + p.by_count, Ordering::Relaxed);
                }
                let _ = done.send(result);
            }
        }
        for op in batch.drain(..) {
            if let Op::Flush(done) = op {
                let _ = done.send(());
            }
        }
        if last {
            if !held.is_empty() {
                tracing::error!(store = %path.display(), lost = held.len(), "store closed with writes that could not be committed");
            }
            return;
        }
    }
}

/// Positions in a batch by message or thread id, hashed with plain FNV-1a at a fraction of
/// SipHash's cost. Message ids are the organism's own; a thread id can be a client's choice,
/// but a map holds one batch (at most [`BATCH_MAX`] entries), so even ids made to collide
/// cost a batch some tens of milliseconds at worst.
type IdMap<K> = std::collections::HashMap<K, usize, std::hash::BuildHasherDefault<Fnv>>;

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Shrinks a batch without changing what it writes: a status change of a message inserted in
/// the same batch becomes part of the insert, and a thread written several times keeps only
/// its last state (with its first `created_at`).
fn coalesce(batch: &mut Vec<Op>) {
    let mut inserted: IdMap<Arc<str>> =
        IdMap::with_capacity_and_hasher(batch.len(), Default::default());
    let mut last_thread: IdMap<String> =
        IdMap::with_capacity_and_hasher(batch.len() / 2, Default::default());
    let mut keep = vec![true; batch.len()];
    for i in 0..batch.len() {
        match &batch[i] {
            Op::Message(m) => {
                inserted.insert(m.id.clone(), i);
            }
            Op::Status {
                id, status, error, ..
            } => {
                if let Some(&at) = inserted.get(id.as_str()) {
                    let (status, error) = (*status, error.clone());
                    if let Op::Message(m) = &mut batch[at] {
                        m.status = status;
                        m.error = error;
                    }
                    keep[i] = false;
                }
            }
            Op::Thread { id, created_at, .. } => {
                let created = *created_at;
                if let Some(prev) = last_thread.insert(id.clone(), i) {
                    let first_created = match &batch[prev] {
                        Op::Thread { created_at, .. } => *created_at,
                        _ => None,
                    };
                    keep[prev] = false;
                    if let Op::Thread { created_at, .. } = &mut batch[i] {
                        *created_at = first_created.or(created);
                    }
                }
            }
            Op::Seq(_) | Op::Flush(_) | Op::Prune { .. } => {}
        }
    }
    let mut i = 0;
    batch.retain(|_| {
        let k = keep[i];
        i += 1;
        k
    });
}

/// Changes to the kept counts gathered over a transaction and written once at its end.
/// The distinct (agent, payload type, status) keys are few, so a short list searched in
/// place beats hashing, and a key already present costs no allocation.
#[derive(Default)]
struct CountDeltas(Vec<(String, String, &'static str, i64)>);

impl CountDeltas {
    /// One message with these attributes appears (`+1`) or goes (`-1`): it counts once in
    /// the total (agent `''`) and once for each distinct agent it names.
    fn add(
        &mut self,
        from: &str,
        to: Option<&str>,
        payload_type: Option<&str>,
        status: &'static str,
        d: i64,
    ) {
        let to = to.filter(|t| *t != from);
        let payload_type = payload_type.unwrap_or_default();
        for agent in ["", from].into_iter().chain(to) {
            match self
                .0
                .iter_mut()
                .find(|(a, t, s, _)| *s == status && a == agent && t == payload_type)
            {
                Some(entry) => entry.3 += d,
                None => self
                    .0
                    .push((agent.to_string(), payload_type.to_string(), status, d)),
            }
        }
    }

    fn write(self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO message_counts (agent, payload_type, status, n) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        for (agent, payload_type, status, d) in self.0 {
            if d != 0 {
                stmt.execute(params![agent, payload_type, status, d])?;
            }
        }
        Ok(())
    }
}

/// The static word for a status read back from the file.
fn stored_word(s: &str) -> &'static str {
    parse_status::<MessageStatus>(s)
        .map(status_str)
        .unwrap_or("failed")
}

/// Deletes the messages matching `condition` with their agent rows, adding the count changes
/// to `deltas` (the caller writes them once); returns how many.
fn delete_messages(
    tx: &rusqlite::Transaction<'_>,
    condition: &str,
    args: impl rusqlite::Params,
    deltas: &mut CountDeltas,
) -> rusqlite::Result<u64> {
    let mut gone = 0u64;
    let mut stmt = tx.prepare_cached(&format!(
        "DELETE FROM messages WHERE {condition} RETURNING seq, sender, receiver, payload_type, status"
    ))?;
    let mut agents =
        tx.prepare_cached("DELETE FROM message_agents WHERE agent = (SELECT id FROM names WHERE name = ?1) AND seq = ?2")?;
    let mut rows = stmt.query(args)?;
    while let Some(r) = rows.next()? {
        let (seq, from, to, payload_type, status): (
            i64,
            String,
            Option<String>,
            Option<String>,
            String,
        ) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
        agents.execute(params![from, seq])?;
        if let Some(to) = &to {
            agents.execute(params![to, seq])?;
        }
        deltas.add(
            &from,
            to.as_deref(),
            payload_type.as_deref(),
            stored_word(&status),
            -1,
        );
        gone += 1;
    }
    Ok(gone)
}

/// `message_agents` rows per multi-row insert: one statement's overhead for many rows.
const AGENT_ROWS: usize = 64;

/// Agent names' numbers (`names`), as the writer has read or added them. Emptied when a
/// transaction fails, since a number added by it is gone with it.
type Names = std::collections::HashMap<String, i64>;

/// The writer's statements, prepared once per transaction (not looked up per operation).
struct Writes<'t, 'n> {
    insert: rusqlite::CachedStatement<'t>,
    agent: rusqlite::CachedStatement<'t>,
    agents: rusqlite::CachedStatement<'t>,
    /// (agent number, seq) rows for `message_agents`, inserted [`AGENT_ROWS`] per statement.
    agent_rows: Vec<(i64, i64)>,
    name: rusqlite::CachedStatement<'t>,
    names: &'n mut Names,
    find: rusqlite::CachedStatement<'t>,
    restate: rusqlite::CachedStatement<'t>,
    thread: rusqlite::CachedStatement<'t>,
    seq: rusqlite::CachedStatement<'t>,
    deltas: CountDeltas,
}

impl<'t, 'n> Writes<'t, 'n> {
    fn prepare(
        tx: &'t rusqlite::Transaction<'_>,
        names: &'n mut Names,
    ) -> rusqlite::Result<Writes<'t, 'n>> {
        Ok(Writes {
            names,
            name: tx.prepare_cached(
                "INSERT INTO names (name) VALUES (?1) ON CONFLICT (name) DO UPDATE SET name = name RETURNING id",
            )?,
            insert: tx.prepare_cached(
                "INSERT INTO messages (id, thread_id, parent_id, slot_index, sender, receiver, payload_type, payload_xml, status, error, ts)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT(thread_id, slot_index) DO NOTHING",
            )?,
            agent: tx.prepare_cached("INSERT INTO message_agents (agent, seq) VALUES (?1, ?2)")?,
            agents: tx.prepare_cached(&format!(
                "INSERT INTO message_agents (agent, seq) VALUES {}",
                vec!["(?, ?)"; AGENT_ROWS].join(", ")
            ))?,
            agent_rows: Vec::new(),
            find: tx.prepare_cached(
                "SELECT seq, sender, receiver, payload_type, status FROM messages WHERE thread_id = ?1 AND id = ?2",
            )?,
            restate: tx
                .prepare_cached("UPDATE messages SET status = ?2, error = ?3 WHERE seq = ?1")?,
            thread: tx.prepare_cached(
                "INSERT INTO threads (id, status, message_count, created_at, last_activity, error)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET status = excluded.status, message_count = excluded.message_count,
                   last_activity = excluded.last_activity, error = COALESCE(excluded.error, threads.error)",
            )?,
            seq: tx.prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('last_seq', ?1) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
            )?,
            deltas: CountDeltas::default(),
        })
    }

    /// Writes the gathered `message_agents` rows (before the transaction commits).
    fn finish(&mut self) -> rusqlite::Result<()> {
        let rows = std::mem::take(&mut self.agent_rows);
        let mut chunks = rows.chunks_exact(AGENT_ROWS);
        for chunk in &mut chunks {
            self.agents
                .execute(params_from_iter(chunk.iter().flat_map(|(a, s)| [*a, *s])))?;
        }
        for (agent, seq) in chunks.remainder() {
            self.agent.execute(params![agent, seq])?;
        }
        Ok(())
    }

    /// The number of an agent name, added to `names` on first use.
    fn name_id(&mut self, name: &str) -> rusqlite::Result<i64> {
        if let Some(&id) = self.names.get(name) {
            return Ok(id);
        }
        let id = self.name.query_row(params![name], |r| r.get(0))?;
        self.names.insert(name.to_string(), id);
        Ok(id)
    }

    /// A status change of a stored message, with its counts moved.
    fn restate(
        &mut self,
        thread_id: &str,
        id: &str,
        status: MessageStatus,
        error: Option<&str>,
    ) -> rusqlite::Result<()> {
        let row = self
            .find
            .query_row(params![thread_id, id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, String>(4)?,
                ))
            })
            .optional()?;
        let Some((seq, from, to, payload_type, old)) = row else {
            return Ok(());
        };
        self.restate
            .execute(params![seq, status_str(status), error])?;
        if old != status_str(status) {
            let (to, payload_type) = (to.as_deref(), payload_type.as_deref());
            self.deltas
                .add(&from, to, payload_type, stored_word(&old), -1);
            self.deltas
                .add(&from, to, payload_type, status_str(status), 1);
        }
        Ok(())
    }

    /// Applies one operation; count changes gather in `deltas`.
    fn apply(&mut self, tx: &rusqlite::Transaction<'_>, op: &Op) -> rusqlite::Result<()> {
        match op {
            Op::Message(m) => {
                let added = self.insert.execute(params![
                    &*m.id,
                    &*m.thread_id,
                    m.parent_id.as_deref(),
                    m.slot_index as i64,
                    &*m.from,
                    m.to.as_deref(),
                    m.payload_type.as_deref(),
                    &*m.payload_xml,
                    status_str(m.status),
                    m.error.as_deref(),
                    m.timestamp.0 as i64,
                ])?;
                if added == 0 {
                    // Already stored (written again after a retry): only its status can differ.
                    return self.restate(&m.thread_id, &m.id, m.status, m.error.as_deref());
                }
                let seq = tx.last_insert_rowid();
                let from = self.name_id(&m.from)?;
                self.agent_rows.push((from, seq));
                if let Some(to) = m.to.as_deref().filter(|t| *t != &*m.from) {
                    let to = self.name_id(to)?;
                    self.agent_rows.push((to, seq));
                }
                self.deltas.add(
                    &m.from,
                    m.to.as_deref(),
                    m.payload_type.as_deref(),
                    status_str(m.status),
                    1,
                );
            }
            Op::Status {
                id,
                thread_id,
                status,
                error,
            } => self.restate(thread_id, id, *status, error.as_deref())?,
            Op::Thread {
                id,
                status,
                message_count,
                created_at,
                error,
            } => {
                let now = Timestamp::now().0;
                self.thread.execute(params![
                    id,
                    status_str(*status),
                    *message_count as i64,
                    created_at.map(|c| c.0).unwrap_or(now) as i64,
                    now as i64,
                    error
                ])?;
            }
            Op::Seq(s) => {
                self.seq.execute(params![*s as i64])?;
            }
            Op::Flush(_) | Op::Prune { .. } => {}
        }
        Ok(())
    }
}

/// Commits a batch in one transaction. If that fails, commits the operations one by one so a
/// single bad row costs only itself; returns the first error met and the (ascending) indexes
/// of the operations that failed.
fn commit(
    conn: &mut Connection,
    names: &mut Names,
    batch: &[Op],
) -> Result<(), (rusqlite::Error, Vec<usize>)> {
    let mut run = |conn: &mut Connection, ops: &[Op]| -> rusqlite::Result<()> {
        // The write lock up front: a deferred transaction that read first could not upgrade
        // after pruning committed in between (SQLITE_BUSY at once, no busy wait).
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut writes = Writes::prepare(&tx, names)?;
        let applied = ops
            .iter()
            .try_for_each(|op| writes.apply(&tx, op))
            .and_then(|()| writes.finish());
        let deltas = std::mem::take(&mut writes.deltas);
        drop(writes);
        let done = applied
            .and_then(|()| deltas.write(&tx))
            .and_then(|()| tx.commit());
        if done.is_err() {
            names.clear();
        }
        done
    };
    if run(conn, batch).is_ok() {
        return Ok(());
    }
    let mut first = None;
    let mut failed = Vec::new();
    for (i, op) in batch.iter().enumerate() {
        if let Err(e) = run(conn, std::slice::from_ref(op)) {
            first.get_or_insert(e);
            failed.push(i);
        }
    }
    match first {
        None => Ok(()),
        Some(e) => Err((e, failed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(thread: &str, slot: u64, from: &str, to: &str, ts: u64) -> MessageRecord {
        MessageRecord {
            id: Arc::from(format!("{thread}-{slot}")),
            thread_id: Arc::from(thread),
            parent_id: None,
            slot_index: slot,
            from: Arc::from(from),
            to: Some(Arc::from(to)),
            payload_type: Some("{urn:x}Note".into()),
            payload_xml: Arc::from("<Note xmlns=\"urn:x\">hi</Note>"),
            status: MessageStatus::Pending,
            error: None,
            timestamp: Timestamp(ts),
            schema: None,
        }
    }

    /// The first page of the messages naming `agent`.
    fn by_agent(store: &Store, agent: &str) -> Paged<MessageRecord> {
        store
            .query_messages(
                &MessageFilter {
                    agent: Some(agent.into()),
                    ..Default::default()
                },
                Page::default(),
            )
            .unwrap()
    }

    /// A completed thread `t` created at `created`, with `messages` messages from `api` to
    /// `g`, each stamped `created`.
    fn finished_thread(store: &Store, t: &str, created: u64, messages: u64) {
        thread(store, t, ThreadStatus::Completed, created);
        for slot in 0..messages {
            store.record(
                1,
                &EventKind::Message {
                    message: msg(t, slot, "api", "g", created),
                },
            );
        }
    }

    fn thread(store: &Store, id: &str, status: ThreadStatus, created: u64) {
        store.record(
            1,
            &EventKind::ThreadCreated {
                thread: ThreadInfo {
                    id: id.into(),
                    status,
                    participants: vec![],
                    message_count: 0,
                    created_at: Timestamp(created),
                    last_activity: Timestamp(created),
                    error: None,
                },
            },
        );
    }

    #[test]
    fn stored_status_words_are_the_api_words() {
        for s in [
            MessageStatus::Pending,
            MessageStatus::Delivered,
            MessageStatus::Terminal,
            MessageStatus::Rejected,
            MessageStatus::Undeliverable,
            MessageStatus::Failed,
            MessageStatus::Killed,
        ] {
            assert_eq!(status_str(s), status_json(s));
            assert_eq!(parse_status::<MessageStatus>(status_str(s)), Some(s));
        }
        for s in [
            ThreadStatus::Active,
            ThreadStatus::Completed,
            ThreadStatus::Error,
            ThreadStatus::Killed,
        ] {
            assert_eq!(status_str(s), status_json(s));
        }
    }

    #[test]
    fn coalescing_keeps_what_a_batch_writes() {
        let mut batch = vec![
            Op::Message(msg("t", 0, "api", "a", 1)),
            Op::Thread {
                id: "t".into(),
                status: ThreadStatus::Active,
                message_count: 1,
                created_at: Some(Timestamp(5)),
                error: None,
            },
            Op::Status {
                id: "t-0".into(),
                thread_id: "t".into(),
                status: MessageStatus::Delivered,
                error: None,
            },
            Op::Status {
                id: "elsewhere".into(),
                thread_id: "e".into(),
                status: MessageStatus::Failed,
                error: Some("x".into()),
            },
            Op::Thread {
                id: "t".into(),
                status: ThreadStatus::Completed,
                message_count: 1,
                created_at: None,
                error: None,
            },
        ];
        coalesce(&mut batch);
        assert_eq!(batch.len(), 3);
        assert!(matches!(&batch[0], Op::Message(m) if m.status == MessageStatus::Delivered));
        assert!(matches!(&batch[1], Op::Status { id, .. } if id == "elsewhere"));
        assert!(matches!(
            &batch[2],
            Op::Thread {
                status: ThreadStatus::Completed,
                created_at: Some(Timestamp(5)),
                ..
            }
        ));
    }

    #[test]
    fn writes_are_batched_and_read_back_with_filters_and_exact_totals() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sub/dir/s.db")).unwrap();
        thread(&store, "a", ThreadStatus::Active, 1);
        thread(&store, "b", ThreadStatus::Active, 2);
        for (i, (t, from, to)) in [("a", "api", "g"), ("a", "g", "s"), ("b", "api", "s")]
            .iter()
            .enumerate()
        {
            store.record(
                10 + i as u64,
                &EventKind::Message {
                    message: msg(t, i as u64 % 2, from, to, 100 + i as u64),
                },
            );
        }
        store.record(
            20,
            &EventKind::MessageStatus {
                id: "a-0".into(),
                thread_id: "a".into(),
                status: MessageStatus::Delivered,
                error: None,
            },
        );
        store.flush(20);
        let all = store
            .query_messages(&MessageFilter::default(), Page::default())
            .unwrap();
        assert_eq!(all.total, 3);
        assert_eq!(all.items[0].status, MessageStatus::Delivered);
        let s = MessageFilter {
            agent: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(store.query_messages(&s, Page::default()).unwrap().total, 2);
        let typed = MessageFilter {
            payload_type: Some("Note".into()),
            ..Default::default()
        };
        assert_eq!(
            store
                .query_messages(&typed, Page::new(Some(1), Some(1)))
                .unwrap()
                .items
                .len(),
            1
        );
        let window = MessageFilter {
            since: Some(Timestamp(101)),
            until: Some(Timestamp(102)),
            ..Default::default()
        };
        assert_eq!(
            store
                .query_messages(&window, Page::default())
                .unwrap()
                .total,
            1
        );
        let by_agent = ThreadFilter {
            agent: Some("g".into()),
            ..Default::default()
        };
        let threads = store.query_threads(&by_agent, Page::default()).unwrap();
        assert_eq!(threads.total, 1);
        assert_eq!(threads.items[0].participants, vec!["api", "g", "s"]);
        assert!(store.committed_batches() >= 1);
    }

    #[test]
    fn reopening_keeps_history_marks_active_threads_interrupted_and_continues_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = Store::open(&path).unwrap();
            thread(&store, "live", ThreadStatus::Active, 1);
            thread(&store, "done", ThreadStatus::Completed, 2);
            store.record(
                5,
                &EventKind::Message {
                    message: msg("live", 0, "api", "g", 3),
                },
            );
            store.flush(777);
        }
        let store = Store::open(&path).unwrap();
        let r = store.recovered();
        assert_eq!((r.last_seq, r.total_messages, r.interrupted), (777, 1, 1));
        let live = store.thread("live").unwrap().unwrap();
        assert_eq!(
            (live.status, live.error.as_deref()),
            (ThreadStatus::Error, Some("interrupted"))
        );
        assert_eq!(
            store.thread("done").unwrap().unwrap().status,
            ThreadStatus::Completed
        );
    }

    /// Totals from the kept counts equal totals counted row by row (a `since` filter forces
    /// the scan), through inserts, status changes and pruning.
    fn assert_kept_counts_match_scans(store: &Store) {
        let scan = |f: MessageFilter| MessageFilter {
            since: Some(Timestamp(0)),
            ..f
        };
        let filters = [
            MessageFilter::default(),
            MessageFilter {
                agent: Some("g".into()),
                ..Default::default()
            },
            MessageFilter {
                agent: Some("api".into()),
                status: Some(MessageStatus::Delivered),
                ..Default::default()
            },
            MessageFilter {
                payload_type: Some("Note".into()),
                status: Some(MessageStatus::Pending),
                ..Default::default()
            },
            MessageFilter {
                payload_type: Some("{urn:x}Note".into()),
                ..Default::default()
            },
            MessageFilter {
                payload_type: Some("Other".into()),
                ..Default::default()
            },
        ];
        for f in filters {
            let kept = store.query_messages(&f, Page::default()).unwrap();
            let counted = store
                .query_messages(&scan(f.clone()), Page::default())
                .unwrap();
            assert_eq!(kept.total, counted.total, "{f:?}");
            assert_eq!(kept.items.len() as u64, kept.total.min(50), "{f:?}");
        }
    }

    #[test]
    fn kept_counts_stay_exact_through_status_changes_and_pruning() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        for (i, t) in ["x", "y", "z"].iter().enumerate() {
            thread(&store, t, ThreadStatus::Completed, i as u64);
            store.record(
                1,
                &EventKind::Message {
                    message: msg(t, 0, "api", "g", 1),
                },
            );
            // A message to itself counts once for its agent.
            store.record(
                1,
                &EventKind::Message {
                    message: msg(t, 1, "g", "g", 2),
                },
            );
        }
        store.flush(1);
        assert_eq!(
            store
                .query_messages(
                    &MessageFilter {
                        agent: Some("g".into()),
                        ..Default::default()
                    },
                    Page::default()
                )
                .unwrap()
                .total,
            6
        );
        assert_kept_counts_match_scans(&store);
        // Status changes in a later batch than the insert.
        for (t, status) in [
            ("x", MessageStatus::Delivered),
            ("y", MessageStatus::Failed),
        ] {
            for slot in 0..2 {
                store.record(
                    2,
                    &EventKind::MessageStatus {
                        id: format!("{t}-{slot}"),
                        thread_id: t.into(),
                        status,
                        error: None,
                    },
                );
            }
        }
        store.flush(2);
        assert_kept_counts_match_scans(&store);
        assert_eq!(store.prune(Some(4), None).unwrap(), 2);
        assert_kept_counts_match_scans(&store);
    }

    #[test]
    fn a_version_1_file_is_migrated_with_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            for (i, (from, to)) in [("api", "g"), ("g", "s"), ("s", "g")].iter().enumerate() {
                conn.execute(
                    "INSERT INTO messages VALUES (?1, 't', NULL, ?2, ?3, ?4, '{urn:x}Note', '<Note/>', 'delivered', NULL, ?5)",
                    params![format!("m{i}"), i as i64, from, to, 10 - i as i64],
                )
                .unwrap();
            }
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.recovered().total_messages, 3);
        let g = by_agent(&store, "g");
        assert_eq!(g.total, 3);
        let ids: Vec<&str> = g.items.iter().map(|m| &*m.id).collect();
        assert_eq!(ids, vec!["m2", "m1", "m0"], "v1 rows keep their time order");
        assert_kept_counts_match_scans(&store);
        // New writes name agents by the numbers the migration gave them (and new ones).
        store.record(
            1,
            &EventKind::Message {
                message: msg("t2", 0, "g", "z", 20),
            },
        );
        store.flush(1);
        let count = |agent: &str| by_agent(&store, agent);
        assert_eq!((count("g").total, count("g").items.len()), (4, 4));
        assert_eq!(count("z").total, 1);
        assert_eq!(count("z").items[0].thread_id.as_ref(), "t2");
        assert_eq!(count("nobody").total, 0);
        assert!(count("nobody").items.is_empty());
        assert_kept_counts_match_scans(&store);
    }

    fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_full_disk_fails_loudly_keeps_the_writes_and_commits_them_once_space_is_freed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(&dir.path().join("s.db"), Some(120)).unwrap();
        let big = |t: &str, slot: u64| MessageRecord {
            payload_xml: Arc::from(format!("<Note xmlns=\"urn:x\">{}</Note>", "x".repeat(4000))),
            // The new thread's receiver is an agent first named by writes that fail.
            ..msg(t, slot, "api", if t == "new" { "h" } else { "g" }, slot)
        };
        thread(&store, "old", ThreadStatus::Completed, 1);
        for slot in 0..60 {
            store.record(
                1,
                &EventKind::Message {
                    message: big("old", slot),
                },
            );
        }
        store.flush(1);
        assert_eq!(store.failure(), None);
        thread(&store, "new", ThreadStatus::Completed, 2);
        for slot in 0..60 {
            store.record(
                2,
                &EventKind::Message {
                    message: big("new", slot),
                },
            );
        }
        until("the write failure is reported", || {
            store.failure().is_some()
        });
        let failure = store.failure().unwrap();
        assert!(failure.contains("full"), "{failure}");
        assert!(
            store.queued() > 0,
            "the failed writes are held, not dropped"
        );
        // Retention frees pages inside the file; the held writes then commit.
        store.prune(Some(60), None).unwrap();
        until("the held writes commit", || store.failure().is_none());
        store.flush(2);
        let new = store
            .query_messages(
                &MessageFilter {
                    thread: Some("new".into()),
                    ..Default::default()
                },
                Page::default(),
            )
            .unwrap();
        assert_eq!(new.total, 60, "no write was lost");
        assert_eq!(store.queued(), 0);
        let h = by_agent(&store, "h");
        assert_eq!(
            (h.total, h.items.len()),
            (60, 50),
            "the agent first named by failed writes is found"
        );
    }

    #[test]
    fn bad_files_give_clear_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
        let e = Store::open(&junk).err().unwrap();
        assert!(
            e.to_string().contains("junk.db") && e.message.contains("not a usable"),
            "{e}"
        );

        let newer = dir.path().join("newer.db");
        Connection::open(&newer)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let e = Store::open(&newer).err().unwrap();
        assert!(e.message.contains("schema version 99 is newer"), "{e}");

        let blocked = dir.path().join("file-not-dir");
        std::fs::write(&blocked, "x").unwrap();
        let e = Store::open(&blocked.join("s.db")).err().unwrap();
        assert!(e.message.contains("cannot create directory"), "{e}");
    }

    #[test]
    fn pruning_passes_end_while_writes_keep_coming_and_never_fail_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
        let done = Arc::new(AtomicBool::new(false));
        let (pass_tx, passes) = mpsc::channel();
        let pruner = {
            let (store, done) = (store.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let n = store.prune(Some(500), None).unwrap();
                    let _ = pass_tx.send(n);
                }
            })
        };
        // Write without pause until three passes have ended (each pass's target is fixed
        // when it starts, so it ends even though arrivals never stop).
        let (mut i, mut ended) = (0u64, 0);
        while ended < 3 {
            finished_thread(&store, &format!("t{i:06}"), i, 3);
            if i % 100 == 0 {
                store.flush(1);
                assert_eq!(store.failure(), None, "a write failed beside pruning");
            }
            if i > 300_000 {
                panic!("no pruning pass ended within 300,000 threads of writes");
            }
            ended += passes.try_iter().count();
            i += 1;
        }
        store.flush(1);
        done.store(true, Ordering::Relaxed);
        pruner.join().unwrap();
        assert_eq!(store.failure(), None, "a write failed beside pruning");
        // One last pass with nothing arriving brings the log down to the limit.
        store.prune(Some(500), None).unwrap();
        let kept = store
            .query_messages(&MessageFilter::default(), Page::default())
            .unwrap()
            .total;
        assert!(kept <= 500, "{kept} messages kept, limit 500");
        assert!(store.pruned() > 0);
        assert_kept_counts_match_scans(&store);
    }

    #[test]
    fn an_age_prune_of_more_than_one_chunk_of_one_message_threads_deletes_them_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let threads = PRUNE_CHUNK + 50;
        for i in 0..threads {
            finished_thread(&store, &format!("t{i:05}"), i, 1);
        }
        store.flush(1);
        // A pass that deletes nothing: the next chunk is then PRUNE_CHUNK exactly (nothing
        // has arrived since).
        assert_eq!(store.prune(None, None).unwrap(), 0);
        store
            .reader
            .lock()
            .unwrap()
            .execute("UPDATE threads SET last_activity = 1", [])
            .unwrap();
        // Every thread is ancient by the clock: the first chunk is exactly full, and the
        // pass must go on to the rest.
        assert_eq!(
            store.prune(None, Some(Duration::from_secs(1))).unwrap(),
            threads
        );
        assert_eq!(store.pruned(), threads);
        assert_kept_counts_match_scans(&store);
    }

    #[test]
    fn a_prune_larger_than_one_chunk_deletes_exactly_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let threads = PRUNE_CHUNK * 2 + 10;
        for i in 0..threads {
            finished_thread(&store, &format!("t{i:04}"), i, 2);
        }
        store.flush(1);
        // Keep the newest 20 threads' messages: everything older goes, in three chunks.
        let deleted = store.prune(Some(40), None).unwrap();
        assert_eq!(deleted, (threads - 20) * 2);
        let left = store
            .query_threads(&ThreadFilter::default(), Page::default())
            .unwrap();
        assert_eq!(left.total, 20);
        assert_kept_counts_match_scans(&store);
        // The writer was never locked out: a write after the prune commits at once.
        thread(&store, "after", ThreadStatus::Completed, 1);
        store.flush(1);
        assert!(store.failure().is_none());
        assert!(store.thread("after").unwrap().is_some());
    }

    #[test]
    fn retention_prunes_whole_threads_oldest_first_and_never_active_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        for (i, t) in ["old", "mid", "new"].iter().enumerate() {
            thread(&store, t, ThreadStatus::Completed, i as u64);
            for slot in 0..2 {
                store.record(
                    1,
                    &EventKind::Message {
                        message: msg(t, slot, "api", "g", 10 * i as u64 + slot),
                    },
                );
            }
        }
        thread(&store, "running", ThreadStatus::Active, 0);
        store.record(
            1,
            &EventKind::Message {
                message: msg("running", 0, "api", "g", 1),
            },
        );
        store.flush(1);
        // Make activity order explicit: old < mid < new; running is oldest but active.
        {
            let conn = store.reader.lock().unwrap();
            for (i, t) in ["running", "old", "mid", "new"].iter().enumerate() {
                conn.execute(
                    "UPDATE threads SET last_activity = ? WHERE id = ?",
                    params![i as i64, t],
                )
                .unwrap();
            }
        }
        assert_eq!(store.prune(Some(4), None).unwrap(), 4);
        let left: Vec<String> = store
            .query_threads(&ThreadFilter::default(), Page::default())
            .unwrap()
            .items
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(left, vec!["new", "running"]);
        assert_eq!(
            store.prune(None, Some(Duration::from_secs(1))).unwrap(),
            2,
            "new is old by the clock; running stays"
        );
    }
}
