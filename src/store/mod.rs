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
//!
//! Rooms: `open.rs` (lock, migrate, recover, start the writer), `writer.rs` (the writer
//! thread and its commits), `coalesce.rs` (a batch's writes, merged), `writes.rs` (the SQL of
//! one transaction, the name cache, the count deltas), `query.rs` (pages and totals),
//! `prune.rs` (pruning by count and age), `maintenance.rs` (its own tasks: retention, the
//! health watch). This file: the `Store` handle, its channel and health.
//!
//! ## Inside
//!
//! The durable log in SQLite. The event hub feeds it every event (a sink called by the
//! publisher before `publish` returns, handed the published `Arc<Event>` itself; an event
//! reaches it after every event that caused it, and two published at once on two cores in
//! either order, which the writer does not rely on: it numbers rows itself and keeps the
//! highest `seq`. The store keeps a reference, never a copy, and the hub's ring usually frees
//! the event) through a bounded channel to one writer thread that commits in batches. The
//! writer coalesces a batch into borrowed `Write`s (`Coalescer`, whose buffers are kept from
//! batch to batch: fresh ones faulted in huge pages every batch; a status change of a message
//! in the same batch folds into its insert; a thread's writes fold into its first, in its last
//! state; a message or status change raises its thread's count and last activity (event times,
//! never the writer's clock) and gives it its error if it has none, folded into that thread's
//! write or, if the batch has none, a `Touch` run at the end of the transaction) and records
//! which write each event went into, so a failed write holds every event it took (a failed
//! batch is retried write by write; writes that still fail are held and retried every second,
//! so a full disk loses nothing; a touch takes no event, and if it alone fails, the thread's
//! next write mends it: counts and times only rise). Schema v4: `messages` keyed by rowid `seq`
//! = write order (pages need no sort) with one index, (thread number, slot); `threads` numbered
//! (`n`, with `id` unique); a message row names its thread, sender, receiver and payload type
//! by number (reads join the names back). The filters need no per-message index entries:
//! `blocks` (agent, block, type, status → n; a block is 256 messages of write order, `seq >>
//! 8`; agent 0 counts every message once, type 0 is none; agent and type names numbered in
//! `names`) and `block_times` (block → min/max ts) describe the log block by block, and
//! `message_counts` keeps the sums over all blocks. A thread filter reads the thread's rows
//! through its index; any other filter walks the matching blocks in order
//! (`Store::query_blocks`): whole blocks are skipped by their counts, rows are read only in the
//! blocks the page returns from, and a total is a sum of counts (the kept sum without a time
//! window; with one, rows are counted only in the blocks the window cuts). Invariant: the
//! writer (`Writes` + `Deltas`) and pruning (`delete_messages`) change `blocks`,
//! `message_counts` and `block_times` in the same transaction as `messages`, so counts and rows
//! always agree (the tests recount them from the rows). The writer prepares its statements once
//! per transaction, uses no `RETURNING` on its hot path (SQLite builds a temporary table for
//! each), numbers messages itself (`Cache::next_seq`) and inserts them 16 rows per statement (a
//! row that conflicts, a message written again after a retry, is seen missing at its seq and
//! only restated), numbers threads itself too (`Cache::next_thread`) and writes thread rows 16
//! per upsert (insert a new one, update a known one by its number; an id that turns out to have
//! a row already keeps its number, and the messages waiting to name it are renumbered before
//! any is inserted), and caches name and thread numbers and the messages it stored as `pending`
//! (so a status change a batch later needs no lookup) (`Cache`: emptied when a transaction
//! fails, since its new numbers are gone with it; threads and pending messages also after
//! pruning; at most `THREADS_CACHED` entries each, hashed with a per-map seed since clients can
//! choose ids). Reads use a second connection inside a read transaction (page and total from
//! one snapshot). `open` migrates (`user_version`), marks active threads `error` and pending
//! messages `failed` (both `interrupted`; pending ones are read only in blocks whose counts
//! hold some, and the counts move with them) and reports where `seq` resumes. `prune` is
//! retention, one pass per call with its target fixed at the start (so a pass ends under any
//! load): it asks the writer for one chunk at a time (one transaction of whole threads, at
//! least `PRUNE_CHUNK` messages and twice what was written since the last chunk, so deleting
//! outpaces writing), so the writer is the only connection that writes (no lock contention) and
//! a large prune queues behind the pump's writes chunk by chunk. The store counts what it
//! pruned. The store's retention task (`maintenance.rs`) calls it every `RETENTION_INTERVAL`
//! (1 s) with the settings the current topology holds, and at once when a reload changes them
//! (`Maintenance::set_retention`); a pass with nothing over the limits sends the writer nothing. Every
//! write transaction is `IMMEDIATE`. With a store, `Organism::query_*` read from it once it has
//! committed what was published before the call (`Store::catch_up`, at most `READ_CATCH_UP`),
//! so a list shows a thread the moment its inject is answered; without, from the in-memory
//! registry. One thread (`thread_info`, `thread_page`) is read live from the registry while it
//! holds the thread (slots before its `slot_base`, for a thread continued after a restart, from
//! the store), so it is found before the writer commits it.

pub mod agents;
pub mod audit;
mod coalesce;
mod counts;
mod find;
pub mod idempotency;
pub mod inputs;
pub mod keys;
mod listing;
mod maintenance;
mod open;
mod owners;
mod prune;
mod query;
mod readers;
mod replay;
mod search;
#[cfg(test)]
mod tests;
mod thread_fields;
mod thread_writes;
pub mod usage;
pub mod watched;
mod words;
mod writer;
mod writes;

pub use maintenance::{Maintenance, RETENTION_INTERVAL};
pub use readers::READERS;
pub use replay::Replay;

use coalesce::*;
use counts::*;
use prune::*;
use query::*;
use writer::*;
use writes::*;

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
    MessageCore, MessageFilter, MessageRecord, MessageStatus, Origin, OriginKind, Page, Paged,
    ThreadFilter, ThreadInfo, ThreadStatus,
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

/// Messages per block of the log (`blocks`, `block_times`) are `1 << BLOCK_BITS`: a block is
/// the unit a filtered page skips by its counts, or reads row by row.
const BLOCK_BITS: u32 = 8;

/// Why the store cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("store {path}: {message}")]
pub struct StoreError {
    pub path: String,
    pub message: String,
    /// A read stopped for running past its budget ([`Store::set_read_budget`]); the store
    /// itself is fine.
    pub timed_out: bool,
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
    /// An idempotency key's record, and the time before which older ones go.
    Key(Box<(idempotency::KeyRow, Timestamp)>),
    /// Listeners' work since the last account, and when it was taken.
    Work(Box<(Vec<usage::WorkRow>, Timestamp)>),
    /// Called once everything sent before it is committed (or failed and held).
    Flush(Box<dyn FnOnce() + Send>),
    /// One chunk of pruning, run by the writer between batches (see [`Store::prune`]).
    Prune {
        /// Messages to go by count, and whose threads they come from.
        shares: Vec<(prune::Holder, u64)>,
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
    /// Connections for reads, one read each at a time (`readers.rs`).
    readers: readers::Readers,
    /// How long one read may run (`limits.max_query_ms`), in milliseconds.
    read_budget_ms: std::sync::atomic::AtomicU64,
    /// `q=` looks in payloads' text (`search.rs`).
    payload_search: std::sync::atomic::AtomicBool,
    /// The words each recent thread has had (`words.rs`), for the writer's triggers.
    words: words::Words,
    health: Arc<Health>,
    recovered: Recovered,
    /// What each holder had stored as last read, for retention's shares (`prune.rs`).
    held: Mutex<Option<prune::Held>>,
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

/// A file beside the store file `path`: its name with `suffix` appended (`x.db.lock`).
pub fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A time as the side tables keep it: milliseconds since the epoch.
fn ms(t: crate::time::Timestamp) -> i64 {
    i64::try_from(t.0).unwrap_or(i64::MAX)
}

/// One page of a side table's rows, newest first, with its total: `SELECT {columns} FROM
/// {table} WHERE {filter} ORDER BY {order}` at `page`, and the count of the same filter,
/// with the same `args`. What the audit log and the inbox page with.
fn page_of<T>(
    conn: &rusqlite::Connection,
    (table, columns, order): (&str, &str, &str),
    filter: &str,
    args: &[rusqlite::types::Value],
    page: crate::threads::Page,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<crate::threads::Paged<T>> {
    use rusqlite::types::Value as V;
    let total: i64 = conn.query_row(
        &format!("SELECT COUNT(*) FROM {table} WHERE {filter}"),
        rusqlite::params_from_iter(args.iter()),
        |r| r.get(0),
    )?;
    let mut all = args.to_vec();
    all.push(V::Integer(i64::try_from(page.limit).unwrap_or(i64::MAX)));
    all.push(V::Integer(i64::try_from(page.offset).unwrap_or(i64::MAX)));
    let items = conn
        .prepare(&format!(
            "SELECT {columns} FROM {table} WHERE {filter} ORDER BY {order} LIMIT ? OFFSET ?"
        ))?
        .query_map(rusqlite::params_from_iter(all.iter()), read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(crate::threads::Paged {
        items,
        total: total.max(0) as u64,
        limit: page.limit,
        offset: page.offset,
    })
}

fn err(path: &Path, message: impl std::fmt::Display) -> StoreError {
    StoreError {
        path: path.display().to_string(),
        message: message.to_string(),
        timed_out: false,
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
            MessageStatus::Held => "held",
            MessageStatus::Declined => "declined",
            MessageStatus::Superseded => "superseded",
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
            ThreadStatus::Waiting => "waiting",
            ThreadStatus::Aborted => "aborted",
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
                | EventKind::InputRequested { .. }
                | EventKind::InputResolved { .. }
                | EventKind::Usage(_)
                | EventKind::ThreadSettings { .. }
                | EventKind::ThreadLabels { .. }
                | EventKind::ThreadRewound { .. }
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
        self.wait_for_writer(timeout);
    }

    /// Sends a flush and waits (up to `timeout`) until the writer answers it: everything
    /// sent before is committed.
    fn wait_for_writer(&self, timeout: Duration) {
        let (done, wait) = mpsc::channel();
        self.send(Op::Flush(Box::new(move || {
            let _ = done.send(());
        })));
        let _ = wait.recv_timeout(timeout);
    }

    /// [`Store::catch_up`] for async code: waits (up to `timeout`) without blocking the
    /// caller's thread. A decision of an input is answered once it is on disk.
    pub async fn committed(&self, timeout: Duration) {
        if self.health.queued.load(Ordering::Relaxed) == 0 {
            return;
        }
        let (done, wait) = tokio::sync::oneshot::channel();
        self.send(Op::Flush(Box::new(move || {
            let _ = done.send(());
        })));
        let _ = tokio::time::timeout(timeout, wait).await;
    }

    /// Writes the last `seq` and waits until everything sent so far is committed.
    pub fn flush(&self, last_seq: u64) {
        self.send(Op::Seq(last_seq));
        self.wait_for_writer(Duration::from_secs(30));
    }
}
