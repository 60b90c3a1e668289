//! Opening a store file: the lock, the migrations (`PRAGMA user_version`), recovery of what
//! the last process left in flight, and the writer started on its own connection.

use super::*;

/// The migrations that make the agents' tables (`store::agents`), in order: all an in-memory
/// agent table needs (`AgentTable::memory`, without the rest of the store's schema, whose
/// migrations take about 10 ms). A migration that changes those tables goes here too; a test
/// compares the two schemas.
pub(super) const AGENT_MIGRATIONS: &[&str] = &[AGENTS_V8, AGENTS_V9];

const AGENTS_V8: &str = r#"
CREATE TABLE api_agents (
    name TEXT PRIMARY KEY,
    tenant TEXT,
    definition TEXT NOT NULL,
    live_version INTEGER NOT NULL,
    author TEXT,
    created INTEGER NOT NULL
);
CREATE TABLE agent_versions (
    agent TEXT NOT NULL,
    version INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    author TEXT,
    created INTEGER NOT NULL,
    message TEXT,
    script TEXT NOT NULL,
    fields TEXT,
    xsd TEXT,
    config TEXT,
    PRIMARY KEY (agent, version)
);
CREATE TABLE agent_deployments (
    id INTEGER PRIMARY KEY,
    agent TEXT NOT NULL,
    action TEXT NOT NULL,
    version INTEGER,
    from_version INTEGER,
    author TEXT,
    ts INTEGER NOT NULL
);
CREATE INDEX agent_deployments_agent ON agent_deployments(agent, id);
"#;

const AGENTS_V9: &str = r#"
ALTER TABLE agent_versions ADD COLUMN cases TEXT;
"#;

/// Each entry moves the schema from version `i` to `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
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
    // v5: API keys (`store::keys`): the hash of each secret, never the secret.
    r#"
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    hash TEXT NOT NULL,
    role TEXT NOT NULL,
    tenant TEXT,
    created INTEGER NOT NULL,
    expires INTEGER,
    last_used INTEGER,
    revoked INTEGER
);
CREATE UNIQUE INDEX api_keys_live_name ON api_keys(name) WHERE revoked IS NULL;
"#,
    // v6: the audit log (`store::audit`): who did what to which, with what result.
    r#"
CREATE TABLE audit (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    who TEXT,
    role TEXT,
    tenant TEXT,
    action TEXT NOT NULL,
    target TEXT,
    result TEXT NOT NULL,
    remote TEXT
);
"#,
    // v7: a key's own inject rate, over `auth.inject_per_s`.
    r#"
ALTER TABLE api_keys ADD COLUMN inject_per_s INTEGER;
ALTER TABLE api_keys ADD COLUMN burst INTEGER;
"#,
    // v8: agents created through the API (`store::agents`), their script versions (kept
    // as uploaded, never changed) and their deployments.
    AGENTS_V8,
    // v9: test cases kept with a script version.
    AGENTS_V9,
    // v10: the inbox (`store::inputs`): messages held at approval gates and their decisions.
    r#"
CREATE TABLE inputs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    thread TEXT NOT NULL,
    message_id TEXT NOT NULL,
    listener TEXT NOT NULL,
    tenant TEXT,
    sender TEXT NOT NULL,
    parent_id TEXT,
    slot_index INTEGER NOT NULL,
    payload_type TEXT NOT NULL,
    payload_xml TEXT NOT NULL,
    prompt TEXT,
    requested_by TEXT,
    created INTEGER NOT NULL,
    expires INTEGER,
    decided_by TEXT,
    decided INTEGER,
    decision TEXT,
    reason TEXT,
    result TEXT
);
CREATE INDEX inputs_status ON inputs(status, tenant);
CREATE INDEX inputs_thread ON inputs(thread);
"#,
    // v11: idempotency keys of injects (`store::idempotency`).
    r#"
CREATE TABLE idempotency (
    tenant TEXT NOT NULL,
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    body_hash BLOB NOT NULL,
    thread_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    created INTEGER NOT NULL,
    PRIMARY KEY (tenant, principal, key)
);
CREATE INDEX idempotency_created ON idempotency(created);
"#,
    // v12: messages by id (`GET /messages/{id}`, a client's `message_id` used once).
    r#"
CREATE INDEX messages_id ON messages(id);
"#,
    // v13: a message's origin, where its sender and parent do not imply it
    // (`threads::Origin::implied`): NULL for most.
    r#"
ALTER TABLE messages ADD COLUMN origin_kind TEXT;
ALTER TABLE messages ADD COLUMN origin_of TEXT;
"#,
    // v14: the event that published each message, and per transaction the last message
    // written with the newest event `seq` then: a `/ws/messages` reconnect from past the ring
    // replays from here (`query::replay`).
    r#"
ALTER TABLE messages ADD COLUMN event_seq INTEGER;
CREATE TABLE event_marks (
    last_seq INTEGER PRIMARY KEY,
    message_seq INTEGER NOT NULL
);
"#,
    // v15: the usage account (`store::usage`): each call of an LLM listener, and each
    // day's sums.
    r#"
CREATE TABLE usage (
    ts INTEGER NOT NULL,
    tenant TEXT,
    listener TEXT NOT NULL,
    thread TEXT NOT NULL,
    message_id TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    estimated INTEGER NOT NULL,
    ms INTEGER NOT NULL
);
CREATE INDEX usage_ts ON usage(ts);
CREATE INDEX usage_thread ON usage(thread, listener);
CREATE TABLE usage_daily (
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    listener TEXT NOT NULL,
    model TEXT NOT NULL,
    calls INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    estimated_calls INTEGER NOT NULL,
    PRIMARY KEY (day, tenant, listener, model)
) WITHOUT ROWID;
"#,
    // v16: a thread's `settings` (JSON, NULL when none).
    "ALTER TABLE threads ADD COLUMN settings TEXT;",
    // v17: each listener's work by day (`store::usage`): messages handled, handler time,
    // a Lua listener's CPU time.
    r#"
CREATE TABLE usage_work (
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    listener TEXT NOT NULL,
    messages INTEGER NOT NULL,
    handler_us INTEGER NOT NULL,
    cpu_us INTEGER NOT NULL,
    PRIMARY KEY (day, tenant, listener)
) WITHOUT ROWID;
"#,
    // v18: a thread's labels: as shown (`threads.labels`, JSON) and as found
    // (`thread_labels`, one row per label, by key and value).
    r#"
ALTER TABLE threads ADD COLUMN labels TEXT;
CREATE TABLE thread_labels (
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    thread INTEGER NOT NULL,
    PRIMARY KEY (key, value, thread)
) WITHOUT ROWID;
CREATE INDEX thread_labels_thread ON thread_labels(thread);
"#,
    // v19: a thread's rewinds (JSON: `[{after, before}]`), the slots each superseded.
    "ALTER TABLE threads ADD COLUMN rewinds TEXT;",
    // v20: payloads' words, by message (`thread << 32 | slot`), written while
    // `organism.search.payload_text` is on (`search.rs`).
    "CREATE VIRTUAL TABLE message_text USING fts5(text, content='', contentless_delete=1);",
    // v21: each thread's id, error and labels by trigram, by the thread's number, written
    // while `organism.search.payload_text` is on (`search.rs`).
    "CREATE VIRTUAL TABLE thread_text USING fts5(text, tokenize='trigram', content='', \
     contentless_delete=1);",
    // v22: each thread's payload words once, under the message that brought them, written
    // while `organism.search.payload_text` is on (`words.rs`); rowids only.
    "CREATE VIRTUAL TABLE thread_words USING fts5(text, content='', contentless_delete=1, \
     detail=none);",
    // v23: `thread_words` keeps each thread's short phrases (as words joined by `_`, and
    // verbatim with their places where a run may hide words); a store with search on fills
    // it again at start (`search.rs`).
    "DROP TRIGGER IF EXISTS thread_words_add; DROP TRIGGER IF EXISTS thread_words_gone; \
     DROP TABLE thread_words; \
     CREATE VIRTUAL TABLE thread_words USING fts5(text, tokenize=\"unicode61 tokenchars '_'\", \
     content='', contentless_delete=1);",
    // v24: the audit log by tenant, each tenant's entries bounded on their own (`audit.rs`).
    "CREATE INDEX IF NOT EXISTS audit_tenant ON audit(tenant, id);",
    // v25: the tenant of each thread created for one (by the thread's number; the
    // organism's own threads have no row, so its writes cost nothing here); retention takes
    // from whoever holds the most (`prune.rs`).
    "CREATE TABLE IF NOT EXISTS thread_owners (n INTEGER PRIMARY KEY, owner TEXT NOT NULL); \
     CREATE INDEX IF NOT EXISTS thread_owners_owner ON thread_owners(owner);",
];

/// A connection of its own to the store file at `path` (created and migrated if need be),
/// for a table kept beside the log (`keys`, `audit`): no lock of the file is taken, so a
/// command works on it while a server runs.
pub(super) fn side_connection(path: &Path) -> Result<Connection, StoreError> {
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
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| err(path, format!("not a usable agentserver store: {e}")))?;
    migrate(&mut conn, path)?;
    Ok(conn)
}

/// Brings the file's schema to the newest version, under a write lock so that two processes
/// opening a new file (a server and `agentserver keys`) do not race.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let corrupt = |e: rusqlite::Error| {
        err(
            path,
            format!("not a usable agentserver store (corrupted or not SQLite?): {e}"),
        )
    };
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
    tx.commit().map_err(corrupt)
}

/// Takes `<file>.lock` (created if need be) for this store, or says who has it. A separate
/// file, not the database itself: closing any descriptor of the database would let go of
/// SQLite's own locks on it.
pub(super) fn lock_file(path: &Path) -> Result<std::fs::File, StoreError> {
    let lock_path = super::beside(path, ".lock");
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

pub(super) fn open_connection(path: &Path, flags: OpenFlags) -> Result<Connection, StoreError> {
    // No SQLite connection mutex: a `Connection` is used by one thread at a time (it is not
    // `Sync`), so the lock SQLite would take around every call is pure cost.
    let conn = Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| err(path, e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| err(path, e))?;
    Ok(conn)
}

/// What a process that ended left unfinished, in one transaction: active threads become
/// `error` and pending messages (and held ones without an open input) `failed`, both with the
/// reason `interrupted` (SPEC §13; §8: no message stays `pending` with nothing left to handle
/// it). Pending messages are read
/// only in the blocks whose counts hold some, and their counts move with them. Returns
/// (threads, messages).
pub(super) fn recover_interrupted(conn: &mut Connection) -> rusqlite::Result<(u64, u64)> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let threads = tx.execute(
        "UPDATE threads SET status = 'error', error = COALESCE(error, 'interrupted') \
         WHERE status = 'active' OR (status = 'waiting' \
           AND id NOT IN (SELECT thread FROM inputs WHERE status = 'open'))",
        [],
    )? as u64;
    // A thread with an open input waits for it: its held messages and questions are kept.
    tx.execute(
        "UPDATE threads SET status = 'waiting' WHERE status IN ('error', 'waiting') \
         AND id IN (SELECT thread FROM inputs WHERE status = 'open')",
        [],
    )?;
    // Pending messages, and held ones whose input was not committed (the process ended
    // between the two batches): nothing will let them through.
    let failed = status_str(MessageStatus::Failed);
    let held_without_input = "AND id NOT IN (SELECT message_id FROM inputs WHERE status = 'open')";
    let mut deltas = Deltas::default();
    let mut messages = 0;
    for (status, unless) in [
        (status_str(MessageStatus::Pending), ""),
        (status_str(MessageStatus::Held), held_without_input),
    ] {
        let blocks: Vec<i64> = tx
            .prepare(
                "SELECT block FROM blocks WHERE agent = 0 AND status = ?1 AND n > 0 GROUP BY block",
            )?
            .query_map(params![status], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut fail = tx.prepare(&format!(
            "UPDATE messages SET status = ?3, error = COALESCE(error, 'interrupted')
             WHERE seq >= ?1 AND seq < ?2 AND status = ?4 {unless}
             RETURNING seq, sender, receiver, payload_type"
        ))?;
        for block in blocks {
            let (first, end) = (block << BLOCK_BITS, (block + 1) << BLOCK_BITS);
            let mut rows = fail.query(params![first, end, failed, status])?;
            while let Some(r) = rows.next()? {
                let was = Counted {
                    seq: r.get(0)?,
                    from: r.get(1)?,
                    to: r.get(2)?,
                    payload_type: r.get(3)?,
                    status,
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

impl Store {
    /// Opens (creating the directory and file if needed) and migrates the store, marks
    /// threads left active as interrupted, and starts the writer.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, None)
    }

    /// [`Store::open`], with the writer limited to `max_pages` pages: how the tests fill the
    /// "disk" (SQLite reports the same `SQLITE_FULL` as for a full file system).
    pub(super) fn open_with(path: &Path, max_pages: Option<u32>) -> Result<Store, StoreError> {
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
        migrate(&mut conn, path)?;
        let words = super::words::Words::default();
        words.register(&mut conn, true).map_err(corrupt)?;
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
        let mut readers = Vec::with_capacity(super::readers::READERS);
        for _ in 0..super::readers::READERS {
            let mut reader = open_connection(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
            words.register(&mut reader, false).map_err(corrupt)?;
            super::find::register(&reader).map_err(corrupt)?;
            readers.push(reader);
        }
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
            readers: super::readers::Readers::new(readers),
            read_budget_ms: std::sync::atomic::AtomicU64::new(
                crate::config::Limits::default().max_query_ms,
            ),
            payload_search: Default::default(),
            words,
            health,
            recovered: Recovered {
                last_seq,
                total_messages,
                interrupted,
                interrupted_messages,
            },
            held: Mutex::default(),
            _lock: lock,
        })
    }
}
