//! The inbox of an organism, in its store file (`inputs`, schema v10): each message held at
//! an approval gate, with the held message itself (so an input restored after a restart
//! needs nothing else), and its decision. Written by the log's writer, from the
//! `input_requested` and `input_resolved` events, in the transactions of the messages around
//! them: an input is committed with or after its held message, and a decision before
//! anything it caused (an event published after another is written in the same batch or a
//! later one). Read here, on a connection of its own. Decided rows are bounded by
//! [`MAX_DECIDED_INPUTS`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use super::open::side_connection;
use super::{err, ms, page_of, StoreError};
use crate::sync::lock;
use crate::threads::{InputFilter, InputKind, InputRow, InputStatus, Page, Paged};
use crate::time::Timestamp;

/// Decided inputs kept at most; past it the oldest decided go first.
pub const MAX_DECIDED_INPUTS: i64 = 1_000_000;

fn parse<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    super::parse_status(s)
}

const COLUMNS: &str = "id, kind, status, thread, message_id, listener, tenant, sender, parent_id, \
     slot_index, payload_type, payload_xml, prompt, requested_by, created, expires, decided_by, \
     decided, decision, reason, result";

fn stamp(v: Option<i64>) -> Option<Timestamp> {
    v.map(|t| Timestamp(t.max(0) as u64))
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InputRow> {
    let text = |i: usize| -> rusqlite::Result<String> { r.get(i) };
    Ok(InputRow {
        id: text(0)?.into(),
        kind: parse(&text(1)?).unwrap_or(InputKind::Approval),
        status: parse(&text(2)?).unwrap_or(InputStatus::Cancelled),
        thread_id: text(3)?.into(),
        message_id: text(4)?.into(),
        listener: text(5)?.into(),
        tenant: r.get(6)?,
        from: text(7)?.into(),
        parent_id: r.get::<_, Option<String>>(8)?.map(Into::into),
        slot_index: r.get::<_, i64>(9)?.max(0) as u64,
        payload_type: text(10)?.into(),
        payload_xml: Arc::new(text(11)?),
        prompt: r.get(12)?,
        requested_by: r.get::<_, Option<String>>(13)?.map(Into::into),
        created: Timestamp(r.get::<_, i64>(14)?.max(0) as u64),
        expires: stamp(r.get(15)?),
        decided_by: r.get(16)?,
        decided: stamp(r.get(17)?),
        decision: r.get(18)?,
        reason: r.get(19)?,
        result: r.get(20)?,
    })
}

/// The `inputs` table, read on its own connection.
pub struct InputsTable {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl InputsTable {
    pub fn open(path: &Path) -> Result<InputsTable, StoreError> {
        let conn = side_connection(path)?;
        Ok(InputsTable {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    fn fail(&self, e: rusqlite::Error) -> StoreError {
        err(&self.path, e)
    }

    /// One input.
    pub fn get(&self, id: &str) -> Result<Option<InputRow>, StoreError> {
        lock(&self.conn)
            .query_row(
                &format!("SELECT {COLUMNS} FROM inputs WHERE id = ?1"),
                [id],
                read_row,
            )
            .optional()
            .map_err(|e| self.fail(e))
    }

    /// Every open input, oldest first: what a start restores.
    pub fn open_inputs(&self) -> Result<Vec<InputRow>, StoreError> {
        let conn = lock(&self.conn);
        let mut st = conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM inputs WHERE status = 'open' ORDER BY rowid"
            ))
            .map_err(|e| self.fail(e))?;
        let rows = st
            .query_map([], read_row)
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.fail(e))?;
        Ok(rows)
    }

    /// One page of inputs, newest first, with the total.
    pub fn page(&self, f: &InputFilter, page: Page) -> Result<Paged<InputRow>, StoreError> {
        use rusqlite::types::Value as V;
        let mut clauses = vec!["1".to_string()];
        let mut args: Vec<V> = Vec::new();
        let mut eq = |column: &str, v: Option<String>| {
            if let Some(v) = v {
                clauses.push(format!("{column} = ?"));
                args.push(V::Text(v));
            }
        };
        eq("status", f.status.map(|s| s.as_str().to_string()));
        eq("listener", f.listener.clone());
        eq("thread", f.thread.clone());
        eq("kind", f.kind.map(|k| k.as_str().to_string()));
        eq("tenant", f.tenant.clone());
        let filter = clauses.join(" AND ");
        page_of(
            &lock(&self.conn),
            ("inputs", COLUMNS, "rowid DESC"),
            &filter,
            &args,
            page,
            read_row,
        )
        .map_err(|e| self.fail(e))
    }
}

/// [`COLUMNS`], written.
const INSERT: &str =
    "INSERT OR IGNORE INTO inputs (id, kind, status, thread, message_id, listener, \
     tenant, sender, parent_id, slot_index, payload_type, payload_xml, prompt, requested_by, \
     created, expires, decided_by, decided, decision, reason, result) VALUES (?1, ?2, ?3, ?4, ?5, \
     ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)";

/// Records a new input (the writer, in its batch's transaction): open, or `decided` when its
/// decision came in the same batch.
pub(super) fn insert(
    conn: &Connection,
    r: &InputRow,
    decided: Option<&InputRow>,
) -> rusqlite::Result<()> {
    // Its decision's columns from the decision (as `decide` writes them), the rest as opened.
    let d = decided.unwrap_or(r);
    conn.prepare_cached(INSERT)?.execute(params![
        r.id,
        r.kind.as_str(),
        d.status.as_str(),
        r.thread_id,
        r.message_id,
        r.listener,
        r.tenant,
        r.from,
        r.parent_id,
        r.slot_index as i64,
        r.payload_type,
        r.payload_xml,
        r.prompt,
        r.requested_by,
        ms(r.created),
        r.expires.map(ms),
        d.decided_by,
        d.decided.map(ms),
        d.decision,
        d.reason,
        d.result,
    ])?;
    // Every 1024 rows, the decided ones past the bound go (the oldest first).
    let rowid = conn.last_insert_rowid();
    if rowid % 1024 == 0 {
        conn.prepare_cached("DELETE FROM inputs WHERE status != 'open' AND rowid <= ?1")?
            .execute(params![rowid - MAX_DECIDED_INPUTS])?;
    }
    Ok(())
}

/// Records the decision of an open input (`r` as decided; the writer, in its batch's
/// transaction). An input decided already keeps its first decision.
pub(super) fn decide(conn: &Connection, r: &InputRow) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE inputs SET status = ?2, decided_by = ?3, decided = ?4, decision = ?5, \
         reason = ?6, result = ?7 WHERE id = ?1 AND status = 'open'",
    )?
    .execute(params![
        r.id,
        r.status.as_str(),
        r.decided_by,
        r.decided.map(ms),
        r.decision,
        r.reason,
        r.result,
    ])?;
    Ok(())
}
