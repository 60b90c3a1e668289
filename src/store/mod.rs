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

use crate::events::{Event, EventKind};
// Maps keyed by ids clients can choose (thread ids; the batch's positions, the writer's
// thread and pending-message caches) hash with a seed drawn per map.
use crate::hash::SeededMap;
use crate::threads::{
    MessageFilter, MessageRecord, MessageStatus, Page, Paged, ThreadFilter, ThreadInfo,
    ThreadStatus,
};
use crate::time::Timestamp;

/// Operations per transaction, at most. Under load a batch is what arrived within
/// [`BATCH_WINDOW`] (some 5,000 events at 100k hops/s): a larger batch commits fewer times
/// and cuts fewer threads in two (a status change landing a batch after its message updates a
/// stored row), about 10 % of the writer's CPU per message against 2,048.
pub const BATCH_MAX: usize = 8192;
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
    r#"
-- v4: what a message costs to write, halved. Threads get a number (`n`); a message row
-- names its thread, sender, receiver and payload type by number (agent and type names in
-- `names`), so its one remaining index, (thread, slot), compares integers. The
-- per-message entries of the agent table and of the time, type and status indexes give way
-- to counts per block of 256 messages in write order (`blocks`: one row per agent, block,
-- type and status, agent 0 counting every message once, type 0 for none; names and types
-- numbered in `names`) and each block's time range (`block_times`). A filtered page walks
-- the matching blocks in order, skips whole blocks by their counts and reads rows only in
-- the blocks it returns; a total is a sum of counts (rows are counted only in the blocks a
-- time window cuts). `message_counts` keeps the sums over all blocks.
CREATE TABLE threads_v4 (
  n INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  status TEXT NOT NULL,
  message_count INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  last_activity INTEGER NOT NULL,
  error TEXT
);
INSERT INTO threads_v4 (id, status, message_count, created_at, last_activity, error)
  SELECT id, status, message_count, created_at, last_activity, error FROM threads
  ORDER BY created_at, id;
-- Messages whose thread has no row (none are expected) get one, so none is orphaned.
INSERT INTO threads_v4 (id, status, message_count, created_at, last_activity)
  SELECT thread_id, 'completed', COUNT(*), MIN(ts), MAX(ts) FROM messages
  WHERE thread_id NOT IN (SELECT id FROM threads) GROUP BY thread_id ORDER BY MIN(ts);
DROP TABLE threads;
ALTER TABLE threads_v4 RENAME TO threads;
CREATE INDEX threads_created ON threads(created_at);
CREATE INDEX threads_activity ON threads(last_activity);
INSERT OR IGNORE INTO names (name)
  SELECT sender FROM messages
  UNION SELECT receiver FROM messages WHERE receiver IS NOT NULL
  UNION SELECT payload_type FROM messages WHERE payload_type IS NOT NULL;
-- A message row names its thread, sender, receiver and payload type by number (type 0: none).
CREATE TABLE messages_v4 (
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL,
  thread INTEGER NOT NULL,
  parent_id TEXT,
  slot_index INTEGER NOT NULL,
  sender INTEGER NOT NULL,
  receiver INTEGER,
  payload_type INTEGER NOT NULL,
  payload_xml TEXT NOT NULL,
  status TEXT NOT NULL,
  error TEXT,
  ts INTEGER NOT NULL
);
INSERT INTO messages_v4
  SELECT m.seq, m.id, t.n, m.parent_id, m.slot_index, s.id, r.id, COALESCE(p.id, 0),
    m.payload_xml, m.status, m.error, m.ts
  FROM messages m JOIN threads t ON t.id = m.thread_id JOIN names s ON s.name = m.sender
    LEFT JOIN names r ON r.name = m.receiver LEFT JOIN names p ON p.name = m.payload_type
  ORDER BY m.seq;
DROP TABLE messages;
ALTER TABLE messages_v4 RENAME TO messages;
CREATE UNIQUE INDEX messages_thread ON messages(thread, slot_index);
DROP TABLE message_agents;
CREATE TABLE blocks (
  agent INTEGER NOT NULL,
  block INTEGER NOT NULL,
  type INTEGER NOT NULL,
  status TEXT NOT NULL,
  n INTEGER NOT NULL,
  PRIMARY KEY (agent, block, type, status)
) WITHOUT ROWID;
INSERT INTO blocks
  WITH sides AS (
    SELECT 0 AS agent, seq >> 8 AS block, payload_type AS type, status FROM messages
    UNION ALL SELECT sender, seq >> 8, payload_type, status FROM messages
    UNION ALL SELECT receiver, seq >> 8, payload_type, status FROM messages
      WHERE receiver IS NOT NULL AND receiver != sender
  )
  SELECT agent, block, type, status, COUNT(*) FROM sides GROUP BY agent, block, type, status;
DROP TABLE message_counts;
CREATE TABLE message_counts (
  agent INTEGER NOT NULL,
  type INTEGER NOT NULL,
  status TEXT NOT NULL,
  n INTEGER NOT NULL,
  PRIMARY KEY (agent, type, status)
) WITHOUT ROWID;
INSERT INTO message_counts SELECT agent, type, status, SUM(n) FROM blocks GROUP BY agent, type, status;
CREATE TABLE block_times (block INTEGER PRIMARY KEY, min_ts INTEGER NOT NULL, max_ts INTEGER NOT NULL);
INSERT INTO block_times SELECT seq >> 8, MIN(ts), MAX(ts) FROM messages GROUP BY 1;
"#,
];

/// Messages per block of the log (`blocks`, `block_times`) are `1 << BLOCK_BITS`: a block is
/// the unit a filtered page skips by its counts, or reads row by row.
const BLOCK_BITS: u32 = 8;

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
    /// Messages that were `pending` when the process ended (queued, or in a handler), now
    /// `failed` / `interrupted`: nothing will handle them.
    pub interrupted_messages: u64,
}

enum Op {
    /// An event the log keeps (a message, a status change, a thread created or updated): the
    /// hub's own, shared with its observers, not copied.
    Event(Arc<Event>),
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
    /// The writer thread, joined on drop (after the channel is closed), so everything sent
    /// is committed, and the file is free for the next writer, once a `Store` is gone.
    writer: Option<std::thread::JoinHandle<()>>,
    reader: Mutex<Connection>,
    health: Arc<Health>,
    recovered: Recovered,
    /// `<file>.lock`, locked (`flock`) while this store is open, so a second process (or a
    /// second store in this one) cannot write the same file: each writer numbers rows and
    /// threads itself. Declared last: let go only after both connections are closed. The
    /// kernel lets go of it when the process ends, however it ends.
    _lock: std::fs::File,
}

impl Drop for Store {
    /// Closes the writer's channel and waits for the writer to commit what it was sent (it
    /// tries writes that are failing once more, then logs what it could not commit). A store
    /// dropped and opened again at once on the same file finds everything the first took.
    fn drop(&mut self) {
        // Replacing the sender drops the only one: the writer sees the channel closed once
        // it has taken everything queued.
        drop(std::mem::replace(&mut self.tx, mpsc::sync_channel(0).0));
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!(store = %self.path.display(), "the store writer panicked");
            }
        }
    }
}

/// Takes `<file>.lock` (created if need be) for this store, or says who has it. A separate
/// file, not the database itself: closing any descriptor of the database would let go of
/// SQLite's own locks on it.
fn lock_file(path: &Path) -> Result<std::fs::File, StoreError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| err(path, format!("cannot open {}: {e}", lock_path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(err(
            path,
            format!(
                "in use by another agentserver (it holds {}); stop that one, or give this one another store (--store PATH)",
                lock_path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(err(
            path,
            format!("cannot lock {}: {e}", lock_path.display()),
        )),
    }
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

/// What a process that ended left unfinished, in one transaction: active threads become
/// `error` and pending messages `failed`, both with the reason `interrupted` (SPEC §13; §8:
/// no message stays `pending` with nothing left to handle it). Pending messages are read
/// only in the blocks whose counts hold some, and their counts move with them. Returns
/// (threads, messages).
fn recover_interrupted(conn: &mut Connection) -> rusqlite::Result<(u64, u64)> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let threads = tx.execute(
        "UPDATE threads SET status = 'error', error = COALESCE(error, 'interrupted') WHERE status = 'active'",
        [],
    )? as u64;
    let pending = status_str(MessageStatus::Pending);
    let failed = status_str(MessageStatus::Failed);
    let blocks: Vec<i64> = tx
        .prepare(
            "SELECT block FROM blocks WHERE agent = 0 AND status = ?1 AND n > 0 GROUP BY block",
        )?
        .query_map(params![pending], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut deltas = Deltas::default();
    let mut messages = 0;
    {
        let mut fail = tx.prepare(
            "UPDATE messages SET status = ?3, error = COALESCE(error, 'interrupted')
             WHERE seq >= ?1 AND seq < ?2 AND status = ?4
             RETURNING seq, sender, receiver, payload_type",
        )?;
        for block in blocks {
            let (first, end) = (block << BLOCK_BITS, (block + 1) << BLOCK_BITS);
            let mut rows = fail.query(params![first, end, failed, pending])?;
            while let Some(r) = rows.next()? {
                let was = Counted {
                    seq: r.get(0)?,
                    from: r.get(1)?,
                    to: r.get(2)?,
                    payload_type: r.get(3)?,
                    status: pending,
                };
                deltas.restate(was, failed);
                messages += 1;
            }
        }
    }
    deltas.write(&tx)?;
    tx.commit()?;
    Ok((threads, messages))
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
        if path.as_os_str().is_empty() {
            return Err(err(
                path,
                "no file given; the store is a file (such as data/organism.db), or memory",
            ));
        }
        let names_a_directory = path.as_os_str().to_string_lossy().ends_with('/');
        if names_a_directory || path.is_dir() {
            return Err(err(
                path,
                "is a directory; the store is a file (such as data/organism.db)",
            ));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                err(
                    path,
                    format!("cannot create directory {}: {e}", dir.display()),
                )
            })?;
        }
        let lock = lock_file(path)?;
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
        let (interrupted, interrupted_messages) =
            recover_interrupted(&mut conn).map_err(corrupt)?;
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
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer(conn, rx, writer_health, writer_path))
            .map_err(|e| err(path, format!("cannot start the writer: {e}")))?;
        Ok(Store {
            path: path.to_path_buf(),
            tx,
            writer: Some(writer),
            reader: Mutex::new(reader),
            health,
            recovered: Recovered {
                last_seq,
                total_messages,
                interrupted,
                interrupted_messages,
            },
            _lock: lock,
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

    /// Records what an event changed. Called by the event hub (its sink) with the event it
    /// publishes: the writer holds a reference, not a copy. An event comes after every event
    /// that caused it; two published at once on two cores may come in either order (the
    /// writer numbers rows itself, and the highest `seq` is kept whatever the order).
    pub fn record_event(&self, event: &Arc<Event>) {
        if matches!(
            event.kind,
            EventKind::Message { .. }
                | EventKind::MessageStatus { .. }
                | EventKind::ThreadCreated { .. }
                | EventKind::ThreadUpdated { .. }
        ) {
            self.send(Op::Event(event.clone()));
        }
        self.health
            .latest_seq
            .fetch_max(event.seq, Ordering::Relaxed);
    }

    /// [`Store::record_event`] for an event given by value (a copy is shared).
    pub fn record(&self, seq: u64, kind: &EventKind) {
        self.record_event(&Arc::new(Event::new(seq, kind.clone())));
    }

    /// Waits (up to `timeout`) until everything sent so far is committed, so a read that
    /// follows sees every change published before it: a thread is listed the moment its
    /// inject is answered. Returns at once when nothing is waiting for the writer.
    pub fn catch_up(&self, timeout: Duration) {
        if self.health.queued.load(Ordering::Relaxed) == 0 {
            return;
        }
        let (done, wait) = mpsc::channel();
        self.send(Op::Flush(done));
        let _ = wait.recv_timeout(timeout);
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
                Some(rows) if filter.thread.is_some() => count_and_page(
                    tx,
                    MESSAGES,
                    MESSAGE_COLUMNS,
                    "m.seq",
                    &rows.matching,
                    None,
                    page,
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
    fn query_blocks(
        tx: &rusqlite::Transaction<'_>,
        filter: &MessageFilter,
        rows: &Rows,
        page: Page,
    ) -> rusqlite::Result<(u64, Vec<MessageRecord>)> {
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
                return Ok((0, Vec::new()));
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
        let mut blocks = tx.prepare(&format!(
            "SELECT b.block, SUM(b.n), {whole} FROM blocks b {join} WHERE {} \
             GROUP BY b.block HAVING SUM(b.n) > 0 ORDER BY b.block",
            clauses.join(" AND ")
        ))?;
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
        if let Some(s) = filter.since {
            w.and("last_activity >= ?", [V::Integer(s.0 as i64)]);
        }
        if let Some(u) = filter.until {
            w.and("created_at < ?", [V::Integer(u.0 as i64)]);
        }
        self.read(|tx| {
            let (total, rows) = count_and_page(
                tx,
                "threads",
                "id, status, message_count, created_at, last_activity, error, n",
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
                        r.get::<_, i64>(6)?,
                    ))
                },
            )?;
            let mut items = Vec::with_capacity(rows.len());
            for (id, status, count, created, last, error, n) in rows {
                let participants = participants(tx, n)?;
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
                    "SELECT status, message_count, created_at, last_activity, error, n FROM threads WHERE id = ?",
                    params![id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            get_u64(r, 1)?,
                            get_u64(r, 2)?,
                            get_u64(r, 3)?,
                            r.get::<_, Option<String>>(4)?,
                            r.get::<_, i64>(5)?,
                        ))
                    },
                )
                .optional()?;
            let Some((status, count, created, last, error, n)) = row else {
                return Ok(None);
            };
            Ok(Some(ThreadInfo {
                id: id.to_string(),
                status: parse_status(&status).unwrap_or(ThreadStatus::Error),
                participants: participants(tx, n)?,
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
        if excess == 0 && cutoff.is_none() {
            return Ok(0);
        }
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
        "SELECT COALESCE(SUM(n), 0) FROM message_counts WHERE agent = 0",
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
    let mut deltas = Deltas::default();
    let mut out = Pruned {
        by_age: 0,
        by_count: 0,
        more_by_age: false,
    };
    let mut delete = |tx: &rusqlite::Transaction<'_>, n: i64| -> rusqlite::Result<u64> {
        let gone = delete_messages(tx, n, &mut deltas)?;
        tx.prepare_cached("DELETE FROM threads WHERE n = ?1")?
            .execute(params![n])?;
        Ok(gone)
    };
    let oldest = |tx: &rusqlite::Transaction<'_>, cutoff: i64| -> rusqlite::Result<Vec<i64>> {
        tx.prepare_cached(
            "SELECT n FROM threads WHERE last_activity < ?1 AND status != 'active' \
             ORDER BY last_activity, n LIMIT ?2",
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
        for n in ids {
            if out.by_age >= chunk {
                out.more_by_age = true;
                break;
            }
            out.by_age += delete(&tx, n)?;
        }
    }
    let room = chunk.saturating_sub(out.by_age).min(excess);
    if room > 0 && !out.more_by_age {
        for n in oldest(&tx, i64::MAX)? {
            if out.by_count >= room {
                break;
            }
            out.by_count += delete(&tx, n)?;
        }
    }
    deltas.write(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// A filter as SQL: `AND`-ed clauses with their parameters.
#[derive(Default)]
struct Where {
    clauses: Vec<String>,
    args: Vec<rusqlite::types::Value>,
}

impl Where {
    /// `AND` one more clause, with the values of its parameters.
    fn and(
        &mut self,
        clause: impl Into<String>,
        args: impl IntoIterator<Item = rusqlite::types::Value>,
    ) {
        self.clauses.push(clause.into());
        self.args.extend(args);
    }
}

/// The columns [`row_to_message`] reads, from [`MESSAGES`].
const MESSAGE_COLUMNS: &str = "m.id, t.id, m.parent_id, m.slot_index, s.name, r.name, p.name, m.payload_xml, m.status, m.error, m.ts";

/// Messages (`m`) with the names their numbers stand for. Every message has its thread's row
/// (the writer adds one for a message whose thread was never recorded; pruning deletes both
/// together).
const MESSAGES: &str =
    "messages m JOIN threads t ON t.n = m.thread JOIN names s ON s.id = m.sender \
     LEFT JOIN names r ON r.id = m.receiver LEFT JOIN names p ON p.id = m.payload_type";

fn in_list(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// A message filter resolved against the file: the condition a row must meet, and the
/// numbers the counts know its agent and payload types by.
struct Rows {
    /// On `messages m`.
    matching: Where,
    /// The agent's number; 0 when the filter names none (0 counts every message).
    agent: i64,
    /// The numbers of the payload types the filter matches (exact name or local name).
    types: Option<Vec<i64>>,
}

impl Rows {
    /// `None` when nothing can match: an agent, type or thread the file has never seen.
    fn of(
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
        let mut types = None;
        if let Some(p) = &filter.payload_type {
            // Names are few (agents and payload types): match the filter against them all.
            let matched = tx
                .prepare_cached("SELECT id, name FROM names")?
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
                .filter(|row| {
                    row.as_ref().map_or(true, |(_, name)| {
                        crate::threads::payload_type_matches(name, p)
                    })
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

/// The agents thread `n`'s messages name, in order of first appearance.
fn participants(tx: &rusqlite::Transaction<'_>, n: i64) -> rusqlite::Result<Vec<String>> {
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
        payload_xml: crate::xml::SharedXml::new(r.get::<_, String>(7)?),
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
    let mut cache = Cache::default();
    let mut coalescer = Coalescer::default();
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
            .filter(|op| matches!(op, Op::Event(e) if matches!(e.kind, EventKind::Message { .. })))
            .count() as u64;
        batch.push(Op::Seq(health.latest_seq.load(Ordering::Relaxed)));
        let writes = coalescer.coalesce(&batch);
        let result = commit(&mut conn, &mut cache, &writes);
        coalescer.recycle(writes);
        let into = &coalescer.into;
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
                // Every event that went into a write that failed is held.
                let mut i = 0;
                batch.retain_mut(|op| {
                    let keep = matches!(op, Op::Event(_))
                        && into[i].is_some_and(|w| failed.binary_search(&w).is_ok());
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
                // Thread numbers and messages may be gone with their rows.
                cache.pruned();
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

/// Maps keyed by small integer tuples or by the organism's own names (agents and payload
/// types, in the writer's name cache), hashed a word at a time (the multiply-rotate scheme
/// of Firefox's hash) at a fraction of SipHash's cost.
type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<WordHash>>;

#[derive(Default)]
struct WordHash(u64);

impl WordHash {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for WordHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.mix(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the writer writes for one operation, or for several coalesced: borrowed from the
/// batch's events.
#[derive(Clone, Copy)]
enum Write<'a> {
    Message {
        m: &'a MessageRecord,
        /// The message's status and error, or those of a later change in the same batch.
        status: MessageStatus,
        error: Option<&'a str>,
    },
    Status {
        id: &'a str,
        thread_id: &'a str,
        status: MessageStatus,
        error: Option<&'a str>,
        /// When the change was published.
        at: Timestamp,
    },
    Thread {
        id: &'a str,
        status: ThreadStatus,
        message_count: u64,
        /// Given when the thread is created.
        created_at: Option<Timestamp>,
        error: Option<&'a str>,
        /// Its last activity: the latest time of the events folded into this write.
        at: Timestamp,
    },
    /// A thread with messages (or status changes) in a batch that has no thread write of
    /// its own: its row's count rises to at least `message_count`, its last activity to at
    /// least `at` (the time of the latest of them), and it takes `error` if it has none (a
    /// thread's error is the first its messages met, as in memory). Thread events come with
    /// thread status changes only, so without this a running thread would show the count and
    /// time of its creation, and a killed one no error.
    Touch {
        id: &'a str,
        message_count: u64,
        error: Option<&'a str>,
        at: Timestamp,
    },
    Seq(u64),
}

impl<'a> Write<'a> {
    /// Folds a touch into this write of a thread (or touch of it): the larger count, the
    /// later time, the first error. False if this is no thread's write.
    fn touch(&mut self, count: u64, e: Option<&'a str>, t: Timestamp) -> bool {
        match self {
            Write::Thread {
                message_count,
                error,
                at,
                ..
            }
            | Write::Touch {
                message_count,
                error,
                at,
                ..
            } => {
                *message_count = (*message_count).max(count);
                *error = error.or(e);
                *at = (*at).max(t);
                true
            }
            _ => false,
        }
    }

    fn of(op: &'a Op) -> Option<Write<'a>> {
        let event = match op {
            Op::Event(event) => event,
            Op::Seq(s) => return Some(Write::Seq(*s)),
            Op::Flush(_) | Op::Prune { .. } => return None,
        };
        Some(match &event.kind {
            EventKind::Message { message: m } => Write::Message {
                m,
                status: m.status,
                error: m.error.as_deref(),
            },
            EventKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
                ..
            } => Write::Status {
                id,
                thread_id,
                status: *status,
                error: error.as_deref(),
                at: event.timestamp,
            },
            EventKind::ThreadCreated { thread: t } => Write::Thread {
                id: &t.id,
                status: t.status,
                message_count: t.message_count,
                created_at: Some(t.created_at),
                error: t.error.as_deref(),
                at: t.last_activity,
            },
            EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
            } => Write::Thread {
                id: thread_id,
                status: *status,
                message_count: *message_count,
                created_at: None,
                error: error.as_deref(),
                at: event.timestamp,
            },
            _ => return None,
        })
    }
}

/// A batch's writes, fewer than its operations but writing the same: a status change of a
/// message inserted in the same batch becomes part of the insert, and a thread written
/// several times is written once, in the place of its first write, with its last state (and
/// its first `created_at`), so the thread row exists before the batch's messages name it.
/// Keeps its buffers from batch to batch: a batch's worth of new memory each time (about
/// 1 MB at 8,192 operations) came fresh from the OS, and the writer spent a tenth of its time
/// in the page faults that zeroed it.
#[derive(Default)]
struct Coalescer {
    /// Empty between batches; its allocation is what is kept.
    writes: Vec<Write<'static>>,
    /// For each operation of the last batch, the write it went into (none for a flush).
    into: Vec<Option<usize>>,
    /// Positions in `writes` of the batch's message inserts, by message id, and of its
    /// thread writes, by thread id (ids clients can choose: hashed with a per-map seed).
    messages: hashbrown::HashTable<usize>,
    threads: hashbrown::HashTable<usize>,
    seed: crate::hash::SeededState,
}

impl Coalescer {
    /// The batch's writes; `self.into` says which write each operation went into. Give the
    /// writes back with [`Coalescer::recycle`].
    fn coalesce<'a>(&mut self, batch: &'a [Op]) -> Vec<Write<'a>> {
        let mut writes: Vec<Write<'a>> = std::mem::take(&mut self.writes);
        let Coalescer {
            into,
            messages,
            threads,
            seed,
            ..
        } = self;
        into.clear();
        messages.clear();
        threads.clear();
        let hash = |id: &str| std::hash::BuildHasher::hash_one(&*seed, id);
        fn message_id<'a>(w: &Write<'a>) -> &'a str {
            match w {
                Write::Message { m, .. } => &m.id,
                _ => "",
            }
        }
        fn thread_id<'a>(w: &Write<'a>) -> &'a str {
            match w {
                Write::Thread { id, .. } | Write::Touch { id, .. } => id,
                _ => "",
            }
        }
        for op in batch {
            let Some(w) = Write::of(op) else {
                into.push(None);
                continue;
            };
            // A message or status change touches its thread: folded into the batch's write
            // of that thread, or a touch of its own (placed before this operation's write,
            // whose position the maps below record).
            let touched = match w {
                Write::Message { m, error, .. } => {
                    Some((&*m.thread_id, m.slot_index + 1, error, m.timestamp))
                }
                Write::Status {
                    thread_id,
                    error,
                    at,
                    ..
                } => Some((thread_id, 0, error, at)),
                _ => None,
            };
            if let Some((thread, count, e, t)) = touched {
                let found = threads
                    .find(hash(thread), |&i| thread_id(&writes[i]) == thread)
                    .copied();
                if !found.is_some_and(|i| writes[i].touch(count, e, t)) {
                    threads.insert_unique(hash(thread), writes.len(), |&i| {
                        hash(thread_id(&writes[i]))
                    });
                    writes.push(Write::Touch {
                        id: thread,
                        message_count: count,
                        error: e,
                        at: t,
                    });
                }
            }
            let earlier = match w {
                Write::Message { m, .. } => {
                    // A message written twice (again after a retry): a later status change
                    // belongs to its last write.
                    let entry = messages.entry(
                        hash(&m.id),
                        |&i| message_id(&writes[i]) == &*m.id,
                        |&i| hash(message_id(&writes[i])),
                    );
                    match entry {
                        hashbrown::hash_table::Entry::Occupied(mut e) => {
                            *e.get_mut() = writes.len()
                        }
                        hashbrown::hash_table::Entry::Vacant(e) => {
                            e.insert(writes.len());
                        }
                    }
                    None
                }
                Write::Status { id, .. } => messages
                    .find(hash(id), |&i| message_id(&writes[i]) == id)
                    .copied(),
                Write::Thread { id, .. } => {
                    let first = threads
                        .find(hash(id), |&i| thread_id(&writes[i]) == id)
                        .copied();
                    if first.is_none() {
                        threads.insert_unique(hash(id), writes.len(), |&i| {
                            hash(thread_id(&writes[i]))
                        });
                    }
                    first
                }
                // Made above, never read from an operation.
                Write::Seq(_) | Write::Touch { .. } => None,
            };
            match (earlier.map(|at| &mut writes[at]), w) {
                (
                    Some(Write::Message { status, error, .. }),
                    Write::Status {
                        status: s,
                        error: e,
                        ..
                    },
                ) => {
                    (*status, *error) = (s, e);
                }
                (
                    Some(Write::Thread {
                        status,
                        message_count,
                        created_at,
                        error,
                        at,
                        ..
                    }),
                    Write::Thread {
                        status: s,
                        message_count: c,
                        created_at: created,
                        error: e,
                        at: t,
                        ..
                    },
                ) => {
                    *status = s;
                    *message_count = (*message_count).max(c);
                    *created_at = created_at.or(created);
                    *at = (*at).max(t);
                    // The row keeps an error once given (the thread statements in `Writes`).
                    if e.is_some() {
                        *error = e;
                    }
                }
                // A thread event after a touch of the same thread: the touch becomes the
                // thread's write, with the larger count.
                (Some(slot), thread @ Write::Thread { .. })
                    if matches!(slot, Write::Touch { .. }) =>
                {
                    if let Write::Touch {
                        message_count,
                        error,
                        at,
                        ..
                    } = std::mem::replace(slot, thread)
                    {
                        slot.touch(message_count, error, at);
                    }
                }
                _ => {
                    into.push(Some(writes.len()));
                    writes.push(w);
                    continue;
                }
            }
            into.push(earlier);
        }
        writes
    }

    /// Takes back a batch's writes, keeping their allocation for the next batch. (An emptied
    /// vector's iterator collected into a vector of the same layout reuses its allocation;
    /// were it not to, the next batch would only allocate anew.)
    fn recycle(&mut self, mut writes: Vec<Write<'_>>) {
        writes.clear();
        self.writes = writes.into_iter().map(|_| Write::Seq(0)).collect();
    }
}

/// Changes to the counts (`blocks`, and their sums in `message_counts`) and to the blocks'
/// time ranges, gathered over a transaction and written once at its end.
#[derive(Default)]
struct Deltas {
    /// (agent, block, type, status) → change; agent 0 counts every message once.
    counts: FastMap<(i64, i64, i64, &'static str), i64>,
    /// Block → (earliest, latest) timestamp written into it.
    times: FastMap<i64, (i64, i64)>,
}

/// A stored message as the counts see it: its place and its numbered attributes.
#[derive(Clone, Copy)]
struct Counted {
    seq: i64,
    from: i64,
    to: Option<i64>,
    /// 0 for none.
    payload_type: i64,
    status: &'static str,
}

impl Deltas {
    /// Message `m` appears (`+1`) or goes (`-1`): it counts once in the total (agent 0) and
    /// once for each distinct agent it names, in its block.
    fn add(&mut self, m: Counted, d: i64) {
        let block = m.seq >> BLOCK_BITS;
        let to = m.to.filter(|t| *t != m.from);
        for agent in [0, m.from].into_iter().chain(to) {
            *self
                .counts
                .entry((agent, block, m.payload_type, m.status))
                .or_default() += d;
        }
    }

    /// Stored message `was` changes status to `status`: it moves from one count to another.
    fn restate(&mut self, was: Counted, status: &'static str) {
        if was.status != status {
            self.add(was, -1);
            self.add(Counted { status, ..was }, 1);
        }
    }

    /// Message `seq`, stamped `ts`, is written.
    fn stamp(&mut self, seq: i64, ts: i64) {
        let range = self
            .times
            .entry(seq >> BLOCK_BITS)
            .or_insert((i64::MAX, i64::MIN));
        range.0 = range.0.min(ts);
        range.1 = range.1.max(ts);
    }

    fn write(self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        // (No `RETURNING`: SQLite builds a temporary table for each statement that has one.)
        let mut add = tx.prepare_cached(
            "INSERT INTO blocks (agent, block, type, status, n) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        let mut take = tx.prepare_cached(
            "UPDATE blocks SET n = n + ?5 WHERE agent = ?1 AND block = ?2 AND type = ?3 AND status = ?4",
        )?;
        let mut empty = tx.prepare_cached(
            "DELETE FROM blocks WHERE agent = ?1 AND block = ?2 AND type = ?3 AND status = ?4 AND n <= 0",
        )?;
        let mut sums: FastMap<(i64, i64, &'static str), i64> = FastMap::default();
        let mut emptied = Vec::new();
        for ((agent, b, payload_type, status), d) in self.counts {
            if d == 0 {
                continue;
            }
            *sums.entry((agent, payload_type, status)).or_default() += d;
            if d > 0 {
                add.execute(params![agent, b, payload_type, status, d])?;
            } else {
                // A message counted here is going: its row exists.
                take.execute(params![agent, b, payload_type, status, d])?;
                if empty.execute(params![agent, b, payload_type, status])? > 0 && agent == 0 {
                    emptied.push(b);
                }
            }
        }
        let mut sum = tx.prepare_cached(
            "INSERT INTO message_counts (agent, type, status, n) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        for ((agent, payload_type, status), d) in sums {
            if d != 0 {
                sum.execute(params![agent, payload_type, status, d])?;
            }
        }
        let mut time = tx.prepare_cached(
            "INSERT INTO block_times (block, min_ts, max_ts) VALUES (?1, ?2, ?3)
             ON CONFLICT DO UPDATE SET min_ts = MIN(min_ts, excluded.min_ts), max_ts = MAX(max_ts, excluded.max_ts)",
        )?;
        for (b, (min, max)) in self.times {
            time.execute(params![b, min, max])?;
        }
        // A block all of whose messages are gone (pruned) loses its time range too.
        let mut gone = tx.prepare_cached(
            "DELETE FROM block_times WHERE block = ?1 AND NOT EXISTS (SELECT 1 FROM blocks WHERE agent = 0 AND block = ?1)",
        )?;
        for b in emptied {
            gone.execute(params![b])?;
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

/// Threads the writer keeps the numbers of, at most; past that it starts again (a thread
/// not cached costs one lookup by its id).
const THREADS_CACHED: usize = 65_536;

/// Message rows per multi-row insert: one statement's overhead (cursors opened, program run,
/// reset) for many rows.
const MESSAGE_ROWS: usize = 16;

/// Parameters per row of the writer's message insert.
const MESSAGE_PARAMS: usize = 12;

/// Thread rows per multi-row upsert, and the parameters of one.
const THREAD_ROWS: usize = 16;
const THREAD_PARAMS: usize = 7;

/// A message waiting to be inserted: its status and error (perhaps of a later change in the
/// same batch), its thread's number, its numbered attributes (its `seq` given).
struct NewMessage<'o> {
    m: &'o MessageRecord,
    status: MessageStatus,
    error: Option<&'o str>,
    thread: i64,
    c: Counted,
}

/// A thread row waiting to be written (inserted, or updated by its number).
struct ThreadRow<'o> {
    n: i64,
    id: &'o str,
    status: &'static str,
    count: i64,
    created: i64,
    last: i64,
    error: Option<&'o str>,
}

/// What the writer knows of the file's numbering: agent and payload type names (`names`),
/// and recent threads (`threads.n`). Emptied when a transaction fails, since a number added by
/// it is gone with it; the threads also after pruning.
#[derive(Default)]
struct Cache {
    /// The `seq` the next message gets (the writer numbers messages itself, so a multi-row
    /// insert knows each row's).
    next: Option<i64>,
    /// The number the next new thread gets (`threads.n`), for the same reason.
    next_thread: Option<i64>,
    names: FastMap<String, i64>,
    threads: SeededMap<String, i64>,
    /// Messages stored as `pending` (the one status that changes again), by id, with their
    /// thread and stored attributes: a status change finds its row here without a lookup.
    pending: SeededMap<Arc<str>, (Arc<str>, Counted)>,
}

impl Cache {
    fn clear(&mut self) {
        self.next = None;
        self.next_thread = None;
        self.names.clear();
        self.threads.clear();
        self.pending.clear();
    }

    /// Forgets what pruning may have deleted.
    fn pruned(&mut self) {
        self.threads.clear();
        self.pending.clear();
    }

    fn next_seq(&mut self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
        next_number(
            &mut self.next,
            tx,
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages",
        )
    }

    fn next_thread(&mut self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
        next_number(
            &mut self.next_thread,
            tx,
            "SELECT COALESCE(MAX(n), 0) + 1 FROM threads",
        )
    }

    fn remember_pending(&mut self, m: &MessageRecord, c: Counted) {
        if self.pending.len() >= THREADS_CACHED {
            self.pending.clear();
        }
        self.pending.insert(m.id.clone(), (m.thread_id.clone(), c));
    }

    fn remember_thread(&mut self, id: &str, n: i64) {
        if self.threads.len() >= THREADS_CACHED {
            self.threads.clear();
        }
        self.threads.insert(id.to_string(), n);
    }
}

/// The next number from `next`, or from `first` (a query for the first free one) when the
/// writer does not know it yet.
fn next_number(
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
fn name_id(tx: &rusqlite::Transaction<'_>, cache: &mut Cache, name: &str) -> rusqlite::Result<i64> {
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

/// A stored message as the counts see it, from a row of `seq, sender, receiver,
/// payload_type, status`.
fn stored_counted(r: &rusqlite::Row<'_>) -> rusqlite::Result<Counted> {
    Ok(Counted {
        seq: r.get(0)?,
        from: r.get(1)?,
        to: r.get(2)?,
        payload_type: r.get(3)?,
        status: stored_word(&r.get::<_, String>(4)?),
    })
}

/// A new message's attributes, numbered, at `seq`.
fn counted(
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
fn delete_messages(
    tx: &rusqlite::Transaction<'_>,
    n: i64,
    deltas: &mut Deltas,
) -> rusqlite::Result<u64> {
    let mut gone = 0u64;
    let mut stmt = tx.prepare_cached(
        "DELETE FROM messages WHERE thread = ?1 RETURNING seq, sender, receiver, payload_type, status",
    )?;
    let mut rows = stmt.query(params![n])?;
    while let Some(r) = rows.next()? {
        deltas.add(stored_counted(r)?, -1);
        gone += 1;
    }
    Ok(gone)
}

/// Writes `rows` through `many` (a statement of `per` rows) when there are exactly `per` of
/// them, else one by one through `one`; `bind` binds a row's parameters from `at + 1` on.
/// Returns how many rows the statements changed.
fn write_rows<'s, T>(
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
struct Writes<'t, 'c, 'o> {
    tx: &'t rusqlite::Transaction<'t>,
    cache: &'c mut Cache,
    /// One message row; `rows`: [`MESSAGE_ROWS`] of them.
    insert: rusqlite::CachedStatement<'t>,
    rows: rusqlite::CachedStatement<'t>,
    /// Messages waiting to be inserted [`MESSAGE_ROWS`] per statement.
    pending: Vec<NewMessage<'o>>,
    find: rusqlite::CachedStatement<'t>,
    restate: rusqlite::CachedStatement<'t>,
    thread_find: rusqlite::CachedStatement<'t>,
    /// One thread row upserted by its number; `thread_rows`: [`THREAD_ROWS`] of them.
    thread_row: rusqlite::CachedStatement<'t>,
    thread_rows: rusqlite::CachedStatement<'t>,
    /// Thread rows waiting to be written, [`THREAD_ROWS`] per statement (before any
    /// message is inserted, so a message never names a number its thread did not get).
    threads: Vec<ThreadRow<'o>>,
    thread_update: rusqlite::CachedStatement<'t>,
    /// Threads touched ([`Write::Touch`]): updated at the end of the transaction, when
    /// every thread row it writes exists.
    touches: Vec<(&'o str, i64, Option<&'o str>, i64)>,
    touch: rusqlite::CachedStatement<'t>,
    seq: rusqlite::CachedStatement<'t>,
    deltas: Deltas,
}

impl<'t, 'c, 'o> Writes<'t, 'c, 'o> {
    fn prepare(
        tx: &'t rusqlite::Transaction<'t>,
        cache: &'c mut Cache,
    ) -> rusqlite::Result<Writes<'t, 'c, 'o>> {
        let insert = |rows: usize| {
            format!(
                "INSERT INTO messages (seq, id, thread, parent_id, slot_index, sender, receiver, payload_type, payload_xml, status, error, ts)
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
                   last_activity = MAX(last_activity, excluded.last_activity), error = COALESCE(excluded.error, error)
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
                "UPDATE threads SET status = ?2, message_count = ?3, last_activity = ?4, error = COALESCE(?5, error)
                 WHERE n = ?1",
            )?,
            touches: Vec::new(),
            touch: tx.prepare_cached(
                "UPDATE threads SET message_count = MAX(message_count, ?2), last_activity = MAX(last_activity, ?3),
                   error = COALESCE(error, ?4)
                 WHERE n = ?1",
            )?,
            seq: tx.prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('last_seq', ?1) ON CONFLICT(key) DO UPDATE SET value = MAX(value, excluded.value)",
            )?,
            deltas: Deltas::default(),
        })
    }

    /// The number of thread `id`, if it has a row.
    fn thread_number(&mut self, id: &str) -> rusqlite::Result<Option<i64>> {
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
    fn restate(
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
        if status == MessageStatus::Pending {
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
    fn thread_row(&mut self, row: ThreadRow<'o>) -> rusqlite::Result<()> {
        self.threads.push(row);
        if self.threads.len() == THREAD_ROWS {
            self.insert_threads()?;
        }
        Ok(())
    }

    /// A thread that had no row gets the next number.
    fn new_thread(&mut self, id: &str) -> rusqlite::Result<i64> {
        let n = self.cache.next_thread(self.tx)?;
        self.cache.remember_thread(id, n);
        Ok(n)
    }

    /// Writes the waiting thread rows: [`THREAD_ROWS`] per statement, fewer one by one. A
    /// row taken for a new thread whose id has a row already (an id reused by a client, or a
    /// thread begun again after a restart) leaves that row's number as it is: its waiting
    /// messages are renumbered to it and the row is updated.
    fn insert_threads(&mut self) -> rusqlite::Result<()> {
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
    fn insert_pending(&mut self) -> rusqlite::Result<()> {
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
            stmt.raw_bind_parameter(at + 12, m.timestamp.0 as i64)
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
            if status == MessageStatus::Pending {
                self.cache.remember_pending(m, c);
            }
        }
        self.pending = pending;
        self.pending.clear();
        Ok(())
    }

    /// Applies one write; count changes gather in `deltas`.
    fn apply(&mut self, w: Write<'o>) -> rusqlite::Result<()> {
        match w {
            Write::Message { m, status, error } => {
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
                self.pending.push(NewMessage {
                    m,
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
            } => {
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
            }
        }
        Ok(())
    }

    /// Writes what is still buffered: pending message rows (and the thread rows before
    /// them), then the touched threads. A thread without a row is left alone.
    fn finish(&mut self) -> rusqlite::Result<()> {
        self.insert_pending()?;
        for (id, count, error, at) in std::mem::take(&mut self.touches) {
            if let Some(n) = self.thread_number(id)? {
                self.touch.execute(params![n, count, at, error])?;
            }
        }
        Ok(())
    }
}

/// Commits a batch's writes in one transaction. If that fails, commits them one by one so a
/// single bad row costs only itself; returns the first error met and the (ascending) indexes
/// of the writes that failed.
fn commit(
    conn: &mut Connection,
    cache: &mut Cache,
    batch: &[Write<'_>],
) -> Result<(), (rusqlite::Error, Vec<usize>)> {
    let mut run = |conn: &mut Connection, ops: &[Write<'_>]| -> rusqlite::Result<()> {
        // The write lock up front: a deferred transaction that read first could not upgrade
        // after pruning committed in between (SQLITE_BUSY at once, no busy wait).
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let done = (|| {
            let mut writes = Writes::prepare(&tx, cache)?;
            ops.iter().try_for_each(|w| writes.apply(*w))?;
            writes.finish()?;
            let deltas = std::mem::take(&mut writes.deltas);
            drop(writes);
            deltas.write(&tx)
        })()
        .and_then(|()| tx.commit());
        if done.is_err() {
            cache.clear();
        }
        done
    };
    if run(conn, batch).is_ok() {
        return Ok(());
    }
    let mut first = None;
    let mut failed = Vec::new();
    for (i, w) in batch.iter().enumerate() {
        if let Err(e) = run(conn, std::slice::from_ref(w)) {
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
            payload_xml: crate::xml::SharedXml::new("<Note xmlns=\"urn:x\">hi</Note>".into()),
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
    fn a_thread_row_follows_its_messages_between_its_status_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let stored = |id: &str| store.thread(id).unwrap().unwrap();
        thread(&store, "a", ThreadStatus::Active, 1);
        store.flush(1);
        let created = stored("a");
        assert_eq!(created.message_count, 0);
        // Messages in a later batch than the thread's last status change, one batch each.
        for slot in 0..2 {
            store.record(
                2 + slot,
                &EventKind::Message {
                    message: msg("a", slot, "api", "g", 10 + slot),
                },
            );
            store.flush(2 + slot);
            assert_eq!(stored("a").message_count, slot + 1);
        }
        // Its last activity is its latest message's time, as in memory, not the writer's.
        let after_messages = stored("a");
        assert_eq!(created.last_activity, Timestamp(1));
        assert_eq!(after_messages.last_activity, Timestamp(11));
        assert_eq!(after_messages.status, ThreadStatus::Active);
        // A status change alone moves the thread's last activity, never its count back.
        store.record(
            4,
            &EventKind::MessageStatus {
                id: "a-1".into(),
                thread_id: "a".into(),
                status: MessageStatus::Delivered,
                error: None,
                about: None,
            },
        );
        store.flush(4);
        let after_status = stored("a");
        assert_eq!(after_status.message_count, 2);
        assert!(after_status.last_activity >= after_messages.last_activity);
        assert_eq!(after_status.error, None);
        // The first error its messages meet becomes the thread's, as in memory (a kill
        // fails the queued messages after the thread's own status change).
        for (seq, (slot, error)) in [(0, "first"), (1, "second")].into_iter().enumerate() {
            store.record(
                10 + seq as u64,
                &EventKind::MessageStatus {
                    id: format!("a-{slot}"),
                    thread_id: "a".into(),
                    status: MessageStatus::Failed,
                    error: Some(error.into()),
                    about: None,
                },
            );
            store.flush(10 + seq as u64);
            assert_eq!(stored("a").error.as_deref(), Some("first"));
        }
        // A message of a thread with no row gets one, counted.
        store.record(
            5,
            &EventKind::Message {
                message: msg("unrecorded", 0, "api", "g", 20),
            },
        );
        store.flush(5);
        assert_eq!(stored("unrecorded").message_count, 1);
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
        let batch = vec![
            event_op(EventKind::Message {
                message: msg("t", 0, "api", "a", 1),
            }),
            event_op(EventKind::ThreadCreated {
                thread: ThreadInfo {
                    id: "t".into(),
                    status: ThreadStatus::Active,
                    participants: vec![],
                    message_count: 1,
                    created_at: Timestamp(5),
                    last_activity: Timestamp(5),
                    error: None,
                },
            }),
            event_op(EventKind::MessageStatus {
                id: "t-0".into(),
                thread_id: "t".into(),
                status: MessageStatus::Delivered,
                error: None,
                about: None,
            }),
            event_op(EventKind::MessageStatus {
                id: "elsewhere".into(),
                thread_id: "e".into(),
                status: MessageStatus::Failed,
                error: Some("x".into()),
                about: None,
            }),
            event_op(EventKind::ThreadUpdated {
                thread_id: "t".into(),
                status: ThreadStatus::Completed,
                message_count: 1,
                error: None,
            }),
            Op::Seq(9),
        ];
        let mut coalescer = Coalescer::default();
        // Twice: the second time with the buffers the first left behind.
        for _ in 0..2 {
            let writes = coalescer.coalesce(&batch);
            assert_coalesced(&writes);
            // The write each operation went into: a failed write holds every event it took.
            assert_eq!(
                coalescer.into,
                [Some(1), Some(0), Some(1), Some(3), Some(0), Some(4)]
            );
            coalescer.recycle(writes);
        }
        assert!(coalescer.writes.capacity() >= 4, "the allocation is kept");
    }

    #[test]
    fn a_status_change_coalesces_into_the_last_write_of_a_message_written_twice() {
        let mut batch = Vec::new();
        // Many messages, so the table's probing has something to get wrong.
        for slot in 0..64 {
            batch.push(event_op(EventKind::Message {
                message: msg("t", slot, "api", "a", 1),
            }));
        }
        batch.push(event_op(EventKind::Message {
            message: MessageRecord {
                status: MessageStatus::Delivered,
                ..msg("t", 7, "api", "a", 1)
            },
        }));
        batch.push(event_op(EventKind::MessageStatus {
            id: "t-7".into(),
            thread_id: "t".into(),
            status: MessageStatus::Failed,
            error: None,
            about: None,
        }));
        let mut coalescer = Coalescer::default();
        let writes = coalescer.coalesce(&batch);
        // The thread's touch first, then the 65 message writes.
        assert_eq!(writes.len(), 66);
        assert!(matches!(
            writes[0],
            Write::Touch {
                id: "t",
                message_count: 64,
                error: None,
                ..
            }
        ));
        assert_eq!(message_status(&writes[8]), Some(MessageStatus::Pending));
        assert_eq!(message_status(&writes[65]), Some(MessageStatus::Failed));
        assert_eq!(coalescer.into[65], Some(65));
    }

    /// An operation carrying `kind`, as the hub would publish it.
    fn event_op(kind: EventKind) -> Op {
        Op::Event(Arc::new(Event::new(1, kind)))
    }

    /// The status a message insert writes (`None` for any other write).
    fn message_status(w: &Write<'_>) -> Option<MessageStatus> {
        match w {
            Write::Message { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn assert_coalesced(writes: &[Write<'_>]) {
        assert_eq!(writes.len(), 5);
        // The thread is written once, where it was first touched (by its message), in its
        // last state and with the count its messages imply.
        assert!(matches!(
            writes[0],
            Write::Thread {
                status: ThreadStatus::Completed,
                created_at: Some(Timestamp(5)),
                message_count: 1,
                ..
            }
        ));
        assert_eq!(message_status(&writes[1]), Some(MessageStatus::Delivered));
        // A status change of a thread the batch writes nothing else of touches it.
        assert!(matches!(
            writes[2],
            Write::Touch {
                id: "e",
                message_count: 0,
                error: Some("x"),
                ..
            }
        ));
        assert!(matches!(
            writes[3],
            Write::Status {
                id: "elsewhere",
                ..
            }
        ));
        assert!(matches!(writes[4], Write::Seq(9)));
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
                about: None,
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
            store.record(
                6,
                &EventKind::Message {
                    message: MessageRecord {
                        status: MessageStatus::Delivered,
                        ..msg("done", 0, "api", "h", 4)
                    },
                },
            );
            store.flush(777);
        }
        let store = Store::open(&path).unwrap();
        let r = store.recovered();
        assert_eq!(
            (
                r.last_seq,
                r.total_messages,
                r.interrupted,
                r.interrupted_messages
            ),
            (777, 2, 1, 1)
        );
        let live = store.thread("live").unwrap().unwrap();
        assert_eq!(
            (live.status, live.error.as_deref()),
            (ThreadStatus::Error, Some("interrupted"))
        );
        assert_eq!(
            store.thread("done").unwrap().unwrap().status,
            ThreadStatus::Completed
        );
        // The message left pending failed with the same reason; the delivered one is as it
        // was; the counts moved with it.
        let rows = all_rows(&store);
        let status_of = |id: &str| {
            let m = rows.iter().find(|m| &*m.id == id).unwrap();
            (m.status, m.error.clone())
        };
        assert_eq!(
            status_of("live-0"),
            (MessageStatus::Failed, Some("interrupted".into()))
        );
        assert_eq!(status_of("done-0"), (MessageStatus::Delivered, None));
        let with = |status| MessageFilter {
            status: Some(status),
            ..Default::default()
        };
        let total = |f: &MessageFilter| store.query_messages(f, Page::default()).unwrap().total;
        assert_eq!(total(&with(MessageStatus::Pending)), 0);
        assert_eq!(total(&with(MessageStatus::Failed)), 1);
        assert_kept_counts_match_scans(&store);
        // Nothing is left to recover a second time.
        drop(store);
        let again = Store::open(&path).unwrap();
        assert_eq!(
            (
                again.recovered().interrupted,
                again.recovered().interrupted_messages
            ),
            (0, 0)
        );
    }

    /// Every row, in write order, read directly.
    fn all_rows(store: &Store) -> Vec<MessageRecord> {
        let conn = crate::sync::lock(&store.reader);
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {MESSAGE_COLUMNS} FROM {MESSAGES} ORDER BY m.seq"
            ))
            .unwrap();
        let rows = stmt
            .query_map([], row_to_message)
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        rows
    }

    /// The kept counts (`blocks`, `message_counts`, `block_times`) are exactly what the rows
    /// say, and every filter's pages and totals are the ones a row-by-row filter gives.
    fn assert_counts_match_rows(store: &Store, filters: &[MessageFilter], pages: &[Page]) {
        {
            let conn = crate::sync::lock(&store.reader);
            let differ = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
            // The counts per block, recounted here from the rows.
            let mut want: std::collections::BTreeMap<(i64, i64, i64, String), i64> =
                Default::default();
            let mut stmt = conn
                .prepare("SELECT seq, sender, receiver, payload_type, status FROM messages")
                .unwrap();
            let mut rows = stmt.query([]).unwrap();
            while let Some(r) = rows.next().unwrap() {
                let seq: i64 = r.get(0).unwrap();
                let from: i64 = r.get(1).unwrap();
                let to: Option<i64> = r.get(2).unwrap();
                let status: String = r.get(4).unwrap();
                let mut agents = vec![0, from];
                agents.extend(to.filter(|t| *t != from));
                for agent in agents {
                    *want
                        .entry((agent, seq >> 8, r.get(3).unwrap(), status.clone()))
                        .or_default() += 1;
                }
            }
            let have: std::collections::BTreeMap<(i64, i64, i64, String), i64> = conn
                .prepare("SELECT agent, block, type, status, n FROM blocks")
                .unwrap()
                .query_map([], |r| {
                    Ok(((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?), r.get(4)?))
                })
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(have, want, "blocks");
            for sql in [
                "SELECT COUNT(*) FROM (SELECT agent, type, status, SUM(n) FROM blocks GROUP BY 1, 2, 3 \
                 EXCEPT SELECT * FROM message_counts WHERE n != 0)",
                "SELECT COUNT(*) FROM (SELECT * FROM message_counts WHERE n != 0 \
                 EXCEPT SELECT agent, type, status, SUM(n) FROM blocks GROUP BY 1, 2, 3)",
                // Every block's time range holds its messages' times.
                "SELECT COUNT(*) FROM messages m LEFT JOIN block_times t ON t.block = m.seq >> 8 \
                 WHERE t.block IS NULL OR m.ts < t.min_ts OR m.ts > t.max_ts",
                // No time range outlives its block's messages.
                "SELECT COUNT(*) FROM block_times t WHERE NOT EXISTS \
                 (SELECT 1 FROM messages m WHERE m.seq >> 8 = t.block)",
            ] {
                assert_eq!(differ(sql), 0, "{sql}");
            }
        }
        let rows = all_rows(store);
        for f in filters {
            let matching: Vec<&MessageRecord> = rows.iter().filter(|m| f.matches(m)).collect();
            for &page in pages {
                let want = page.cut(matching.clone());
                let got = store.query_messages(f, page).unwrap();
                assert_eq!(got.total, want.total, "{f:?} {page:?}");
                let ids = |v: Vec<&str>| v.join(" ");
                assert_eq!(
                    ids(got.items.iter().map(|m| &*m.id).collect()),
                    ids(want.items.iter().map(|m| &*m.id).collect()),
                    "{f:?} {page:?}"
                );
            }
        }
    }

    /// Filters the small tests check (agents `api` and `g`, type `{urn:x}Note`).
    fn small_filters() -> Vec<MessageFilter> {
        let mut filters = vec![
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
            MessageFilter {
                agent: Some("nobody".into()),
                ..Default::default()
            },
        ];
        // The same through a time window that holds everything.
        let windowed: Vec<MessageFilter> = filters
            .iter()
            .map(|f| MessageFilter {
                since: Some(Timestamp(0)),
                ..f.clone()
            })
            .collect();
        filters.extend(windowed);
        filters
    }

    fn assert_kept_counts_match_scans(store: &Store) {
        assert_counts_match_rows(
            store,
            &small_filters(),
            &[Page::default(), Page::new(Some(1), Some(1))],
        );
    }

    #[test]
    fn filtered_pages_and_totals_across_many_blocks_match_a_row_by_row_filter() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let agents = ["api", "a", "b", "c", "d"];
        let types = [
            Some("{urn:x}Note"),
            Some("{urn:y}Note"),
            Some("Plain"),
            None,
        ];
        let mut i = 0u64;
        for t in 0..120u64 {
            let id = format!("t{t:03}");
            thread(&store, &id, ThreadStatus::Completed, t);
            for slot in 0..12u64 {
                let from = agents[((t + slot) % 5) as usize];
                let to = match i % 11 {
                    0 => None,
                    1 => Some(from),
                    _ => Some(agents[((t + slot + 1) % 5) as usize]),
                };
                let m = MessageRecord {
                    to: to.map(Arc::from),
                    payload_type: types[(i % 4) as usize].map(str::to_string),
                    status: if i % 37 == 5 {
                        MessageStatus::Failed
                    } else {
                        MessageStatus::Pending
                    },
                    // Times not quite in write order, as under concurrent writers.
                    ..msg(&id, slot, from, "x", 1000 + i - (i % 7) * 3)
                };
                store.record(i, &EventKind::Message { message: m });
                i += 1;
            }
            // Batches end at many places within blocks.
            if t % 17 == 3 {
                store.flush(i);
            }
        }
        store.flush(i);
        let window = |since: Option<u64>, until: Option<u64>, f: MessageFilter| MessageFilter {
            since: since.map(Timestamp),
            until: until.map(Timestamp),
            ..f
        };
        let agent = |a: &str| MessageFilter {
            agent: Some(a.into()),
            ..Default::default()
        };
        let filters = vec![
            MessageFilter::default(),
            agent("a"),
            agent("api"),
            MessageFilter {
                payload_type: Some("Note".into()),
                ..Default::default()
            },
            MessageFilter {
                payload_type: Some("{urn:y}Note".into()),
                agent: Some("c".into()),
                ..Default::default()
            },
            MessageFilter {
                status: Some(MessageStatus::Failed),
                ..Default::default()
            },
            MessageFilter {
                status: Some(MessageStatus::Delivered),
                ..Default::default()
            },
            window(Some(1300), None, MessageFilter::default()),
            window(None, Some(1700), MessageFilter::default()),
            window(Some(1290), Some(2001), agent("b")),
            window(
                Some(1100),
                Some(2300),
                MessageFilter {
                    payload_type: Some("Plain".into()),
                    status: Some(MessageStatus::Pending),
                    ..Default::default()
                },
            ),
            window(Some(5000), None, MessageFilter::default()),
            window(None, Some(0), MessageFilter::default()),
            window(
                Some(1500),
                None,
                MessageFilter {
                    thread: Some("t050".into()),
                    ..Default::default()
                },
            ),
        ];
        let pages = [
            Page::new(Some(50), Some(0)),
            Page::new(Some(7), Some(255)),
            Page::new(Some(50), Some(250)),
            Page::new(Some(100), Some(700)),
            Page::new(Some(50), Some(10_000)),
        ];
        assert_counts_match_rows(&store, &filters, &pages);
        // Status changes a batch later, in blocks written long before.
        for t in (0..120u64).step_by(3) {
            for slot in 0..12u64 {
                store.record(
                    i,
                    &EventKind::MessageStatus {
                        id: format!("t{t:03}-{slot}"),
                        thread_id: format!("t{t:03}"),
                        status: MessageStatus::Delivered,
                        error: None,
                        about: None,
                    },
                );
            }
        }
        store.flush(i);
        assert_counts_match_rows(&store, &filters, &pages);
        // Pruning the oldest threads empties whole blocks and cuts others.
        assert_eq!(store.prune(Some(700), None).unwrap(), 1440 - 696);
        assert_counts_match_rows(&store, &filters, &pages);
        assert_eq!(store.prune(Some(0), None).unwrap(), 696);
        assert_counts_match_rows(&store, &filters, &pages);
    }

    #[test]
    fn a_message_written_twice_is_stored_once_with_its_last_status() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        thread(&store, "t", ThreadStatus::Completed, 1);
        let write = |slot: u64, status: MessageStatus| {
            store.record(
                1,
                &EventKind::Message {
                    message: MessageRecord {
                        status,
                        ..msg("t", slot, "api", "g", slot)
                    },
                },
            )
        };
        // Twice in one batch (the second in the same multi-row insert as the first or not),
        for slot in 0..40 {
            write(slot, MessageStatus::Pending);
        }
        for slot in (0..40).step_by(3) {
            write(slot, MessageStatus::Delivered);
        }
        store.flush(1);
        // and again in a later batch.
        for slot in (0..40).step_by(5) {
            write(slot, MessageStatus::Failed);
        }
        store.flush(2);
        let rows = all_rows(&store);
        assert_eq!(rows.len(), 40);
        for m in &rows {
            let want = match m.slot_index {
                s if s % 5 == 0 => MessageStatus::Failed,
                s if s % 3 == 0 => MessageStatus::Delivered,
                _ => MessageStatus::Pending,
            };
            assert_eq!(m.status, want, "slot {}", m.slot_index);
        }
        assert_kept_counts_match_scans(&store);
        // New messages after the duplicates still get their own places.
        write(40, MessageStatus::Pending);
        store.flush(3);
        assert_eq!(all_rows(&store).len(), 41);
        assert_kept_counts_match_scans(&store);
    }

    #[test]
    fn a_status_change_finds_its_message_whether_or_not_the_writer_remembers_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let status = |store: &Store, slot: u64, status: MessageStatus| {
            store.record(
                2,
                &EventKind::MessageStatus {
                    id: format!("t-{slot}"),
                    thread_id: "t".into(),
                    status,
                    error: None,
                    about: None,
                },
            )
        };
        {
            let store = Store::open(&path).unwrap();
            thread(&store, "t", ThreadStatus::Completed, 1);
            for slot in 0..4 {
                store.record(
                    1,
                    &EventKind::Message {
                        message: msg("t", slot, "api", "g", slot),
                    },
                );
            }
            store.flush(1);
            // Remembered as pending by the writer that stored it (twice for slot 1: it is
            // still pending after the first change).
            status(&store, 0, MessageStatus::Delivered);
            status(&store, 1, MessageStatus::Pending);
            store.flush(2);
            status(&store, 1, MessageStatus::Failed);
            store.flush(3);
            assert_kept_counts_match_scans(&store);
        }
        // A new writer knows none of them: it looks them up. (Opening fails slot 3, left
        // pending by the store before.)
        let store = Store::open(&path).unwrap();
        status(&store, 2, MessageStatus::Rejected);
        status(&store, 0, MessageStatus::Killed);
        store.flush(4);
        let got: Vec<MessageStatus> = all_rows(&store).iter().map(|m| m.status).collect();
        assert_eq!(
            got,
            [
                MessageStatus::Killed,
                MessageStatus::Failed,
                MessageStatus::Rejected,
                MessageStatus::Failed
            ]
        );
        assert_kept_counts_match_scans(&store);
    }

    #[test]
    fn a_store_dropped_without_a_flush_commits_everything_before_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = Store::open(&path).unwrap();
            thread(&store, "t", ThreadStatus::Active, 1);
            for slot in 0..100 {
                store.record(
                    2 + slot,
                    &EventKind::Message {
                        message: msg("t", slot, "api", "g", slot),
                    },
                );
            }
            // No flush: the drop waits for the writer.
        }
        // Opened again at once: no second writer races the first for the file.
        let store = Store::open(&path).unwrap();
        let r = store.recovered();
        assert_eq!((r.last_seq, r.total_messages, r.interrupted), (101, 100, 1));
        assert_eq!(all_rows(&store).len(), 100);
    }

    #[test]
    fn a_thread_begun_again_under_a_stored_id_keeps_its_row_and_gets_its_messages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let message = |store: &Store, t: &str, slot: u64| {
            store.record(
                1,
                &EventKind::Message {
                    message: msg(t, slot, "api", "g", 10 + slot),
                },
            )
        };
        {
            let store = Store::open(&path).unwrap();
            finished_thread(&store, "t", 1, 1);
            store.flush(1);
        }
        // A new writer, which takes "t" for a new thread when it is created again, in the
        // same batch as a thread that is new, each with a message.
        let store = Store::open(&path).unwrap();
        thread(&store, "t", ThreadStatus::Active, 50);
        thread(&store, "u", ThreadStatus::Active, 50);
        message(&store, "t", 1);
        message(&store, "u", 0);
        store.record(
            1,
            &EventKind::ThreadUpdated {
                thread_id: "t".into(),
                status: ThreadStatus::Completed,
                message_count: 2,
                error: None,
            },
        );
        store.flush(2);
        let t = store.thread("t").unwrap().unwrap();
        assert_eq!(
            (t.status, t.message_count, t.created_at),
            (ThreadStatus::Completed, 2, Timestamp(1))
        );
        let of = |id: &str| {
            let filter = MessageFilter {
                thread: Some(id.into()),
                ..Default::default()
            };
            let page = store.query_messages(&filter, Page::default()).unwrap();
            let slots: Vec<u64> = page.items.iter().map(|m| m.slot_index).collect();
            (page.total, slots)
        };
        assert_eq!(of("t"), (2, vec![0, 1]));
        assert_eq!(of("u"), (1, vec![0]));
        let threads = store
            .query_threads(&ThreadFilter::default(), Page::default())
            .unwrap();
        assert_eq!(threads.total, 2);
        assert_kept_counts_match_scans(&store);
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
                        about: None,
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
            payload_xml: crate::xml::SharedXml::new(format!(
                "<Note xmlns=\"urn:x\">{}</Note>",
                "x".repeat(4000)
            )),
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
        // Status changes and the thread's last state, coalesced into the writes that fail.
        for slot in (0..60).step_by(2) {
            store.record(
                2,
                &EventKind::MessageStatus {
                    id: format!("new-{slot}"),
                    thread_id: "new".into(),
                    status: MessageStatus::Delivered,
                    error: None,
                    about: None,
                },
            );
        }
        store.record(
            2,
            &EventKind::ThreadUpdated {
                thread_id: "new".into(),
                status: ThreadStatus::Error,
                message_count: 60,
                error: Some("budget".into()),
            },
        );
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
        let delivered = all_rows(&store)
            .iter()
            .filter(|m| &*m.thread_id == "new" && m.status == MessageStatus::Delivered)
            .count();
        assert_eq!(delivered, 30, "no status change was lost");
        let t = store.thread("new").unwrap().unwrap();
        assert_eq!(
            (t.status, t.message_count, t.error.as_deref()),
            (ThreadStatus::Error, 60, Some("budget"))
        );
        assert_kept_counts_match_scans(&store);
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

        // A directory, named with or without a trailing slash: refused before anything is
        // created beside it.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        for given in [sub.clone(), PathBuf::from(format!("{}/", sub.display()))] {
            let e = Store::open(&given).err().unwrap();
            assert!(e.message.contains("is a directory"), "{e}");
        }
        let e = Store::open(&dir.path().join("new/")).err().unwrap();
        assert!(e.message.contains("is a directory"), "{e}");
        let e = Store::open(Path::new("")).err().unwrap();
        assert!(e.message.contains("no file given"), "{e}");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "file-not-dir",
                "junk.db",
                "junk.db.lock",
                "newer.db",
                "newer.db.lock",
                "sub"
            ]
        );
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 0);
    }

    #[test]
    fn a_file_in_use_by_another_store_is_refused_until_that_one_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let first = Store::open(&path).unwrap();
        thread(&first, "t1", ThreadStatus::Completed, 5);
        let e = Store::open(&path).err().unwrap();
        assert!(
            e.to_string().contains("s.db")
                && e.message.contains("in use by another agentserver")
                && e.message.contains("s.db.lock"),
            "{e}"
        );
        // The refused open changed nothing: the first store still writes.
        first.flush(1);
        drop(first);
        let again = Store::open(&path).unwrap();
        assert_eq!(again.recovered().last_seq, 1);
        assert!(again.thread("t1").unwrap().is_some());
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
        // Write without pause until three passes that pruned have ended (each pass's target
        // is fixed when it starts, so it ends even though arrivals never stop; a pass with
        // nothing over the limit ends at once).
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
            ended += passes.try_iter().filter(|n| *n > 0).count();
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
