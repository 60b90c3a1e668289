//! What one SQLite row per message costs at the least, to set the store writer's cost
//! (`examples/store_replay.rs`) against. The same 60,000 messages of 20,000 three-hop
//! threads as the replay, written straight with rusqlite the way the writer writes: WAL,
//! `synchronous = NORMAL`, prepared statements of 16 rows, one transaction per 3,000
//! messages (a batch under load). No events, no coalescing, no counts, no statuses: each
//! message is inserted once, already `delivered`. Layers, by argument:
//!
//! - `rows`: the message rows alone (the same twelve columns as the store's `messages`);
//! - `index`: and their (thread, slot) index, which `/threads/{id}/messages` reads;
//! - `threads`: and one thread row per thread, with the store's three thread indexes.
//!
//! Prints messages per second. For a repeatable figure, count instructions (one thread):
//!
//! ```text
//! cargo build --release --example store_floor
//! valgrind --tool=callgrind --callgrind-out-file=cg.floor target/release/examples/store_floor threads
//! grep summary cg.floor
//! ```
//!
//! Run: `cargo run --release --example store_floor -- rows|index|threads [THREADS]`
//! (default 20,000 threads).

use rusqlite::{Connection, Statement, Transaction};

const ROWS: usize = 16;
const BATCH: usize = 3_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let layer = args.next().unwrap_or_else(|| "threads".into());
    let (index, thread_rows) = match layer.as_str() {
        "rows" => (false, false),
        "index" => (true, false),
        "threads" => (true, true),
        other => return Err(format!("unknown layer `{other}`: rows, index or threads").into()),
    };
    let threads: usize = match args.next() {
        None => 20_000,
        Some(a) => a
            .parse()
            .map_err(|_| format!("THREADS must be a whole number, not `{a}`"))?,
    };
    let dir = tempfile::tempdir()?;
    let mut conn = Connection::open(dir.path().join("floor.db"))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(
        "CREATE TABLE messages (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, thread INTEGER NOT NULL,
           parent_id TEXT, slot_index INTEGER NOT NULL, sender INTEGER NOT NULL, receiver INTEGER,
           payload_type INTEGER NOT NULL, payload_xml TEXT NOT NULL, status TEXT NOT NULL,
           error TEXT, ts INTEGER NOT NULL);
         CREATE TABLE threads (n INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
           message_count INTEGER NOT NULL, created_at INTEGER NOT NULL,
           last_activity INTEGER NOT NULL, error TEXT);
         CREATE INDEX threads_created ON threads(created_at);
         CREATE INDEX threads_activity ON threads(last_activity);",
    )?;
    if index {
        conn.execute_batch("CREATE UNIQUE INDEX messages_thread ON messages(thread, slot_index)")?;
    }
    let ids: Vec<String> = (0..threads)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let message_ids: Vec<[String; 3]> = ids
        .iter()
        .map(|t| [0, 1, 2].map(|hop| format!("{t}-{hop}")))
        .collect();
    let start = std::time::Instant::now();
    write_all(&mut conn, &ids, &message_ids, thread_rows)?;
    let secs = start.elapsed().as_secs_f64();
    let messages = threads * 3;
    println!(
        "{layer}: {messages} messages of {threads} threads written in {secs:.2} s: {:.0} messages/s",
        messages as f64 / secs
    );
    Ok(())
}

/// A statement of `n` rows of `params` placeholders each.
fn insert<'t>(
    tx: &'t Transaction<'_>,
    table: &str,
    n: usize,
    params: usize,
) -> rusqlite::Result<Statement<'t>> {
    let one = format!("({})", vec!["?"; params].join(", "));
    tx.prepare(&format!(
        "INSERT INTO {table} VALUES {}",
        vec![one; n].join(", ")
    ))
}

/// Every message (and thread row) written, in transactions of `BATCH` messages. Named
/// apart so callgrind can count it alone (`--toggle-collect=*write_all*`).
#[inline(never)]
fn write_all(
    conn: &mut Connection,
    ids: &[String],
    message_ids: &[[String; 3]],
    thread_rows: bool,
) -> rusqlite::Result<()> {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let per_batch = BATCH / 3;
    for (b, batch) in ids.chunks(per_batch).enumerate() {
        let tx = conn.transaction()?;
        {
            let (mut threads_16, mut threads_1) = (
                insert(&tx, "threads", ROWS, 7)?,
                insert(&tx, "threads", 1, 7)?,
            );
            let (mut messages_16, mut messages_1) = (
                insert(&tx, "messages", ROWS, 12)?,
                insert(&tx, "messages", 1, 12)?,
            );
            // Threads 16 to a statement, the rest one by one; their messages likewise.
            let base = b * per_batch;
            if thread_rows {
                for (c, chunk) in batch.chunks(ROWS).enumerate() {
                    let stmt = if chunk.len() == ROWS {
                        &mut threads_16
                    } else {
                        &mut threads_1
                    };
                    for (i, t) in chunk.iter().enumerate() {
                        let n = (base + c * ROWS + i) as i64 + 1;
                        if chunk.len() < ROWS {
                            bind_thread(stmt, 0, n, t, ts)?;
                            stmt.raw_execute()?;
                        } else {
                            bind_thread(stmt, i * 7, n, t, ts)?;
                        }
                    }
                    if chunk.len() == ROWS {
                        stmt.raw_execute()?;
                    }
                }
            }
            let messages: Vec<(i64, usize)> = batch
                .iter()
                .enumerate()
                .flat_map(|(i, _)| {
                    let n = (base + i) as i64 + 1;
                    (0..3).map(move |hop| (n, hop))
                })
                .collect();
            for (c, chunk) in messages.chunks(ROWS).enumerate() {
                let stmt = if chunk.len() == ROWS {
                    &mut messages_16
                } else {
                    &mut messages_1
                };
                for (i, &(n, hop)) in chunk.iter().enumerate() {
                    let seq = ((base * 3) + c * ROWS + i) as i64 + 1;
                    let id = &message_ids[n as usize - 1][hop];
                    let at = if chunk.len() == ROWS { i * 12 } else { 0 };
                    bind_message(stmt, at, seq, id, n, hop as i64, ts)?;
                    if chunk.len() < ROWS {
                        stmt.raw_execute()?;
                    }
                }
                if chunk.len() == ROWS {
                    stmt.raw_execute()?;
                }
            }
        }
        tx.commit()?;
    }
    Ok(())
}

fn bind_thread(
    stmt: &mut Statement<'_>,
    at: usize,
    n: i64,
    id: &str,
    ts: i64,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(at + 1, n)?;
    stmt.raw_bind_parameter(at + 2, id)?;
    stmt.raw_bind_parameter(at + 3, "completed")?;
    stmt.raw_bind_parameter(at + 4, 3)?;
    stmt.raw_bind_parameter(at + 5, ts)?;
    stmt.raw_bind_parameter(at + 6, ts)?;
    stmt.raw_bind_parameter(at + 7, None::<&str>)
}

fn bind_message(
    stmt: &mut Statement<'_>,
    at: usize,
    seq: i64,
    id: &str,
    thread: i64,
    hop: i64,
    ts: i64,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(at + 1, seq)?;
    stmt.raw_bind_parameter(at + 2, id)?;
    stmt.raw_bind_parameter(at + 3, thread)?;
    stmt.raw_bind_parameter(at + 4, None::<&str>)?;
    stmt.raw_bind_parameter(at + 5, hop)?;
    stmt.raw_bind_parameter(at + 6, hop + 1)?;
    stmt.raw_bind_parameter(at + 7, hop + 2)?;
    stmt.raw_bind_parameter(at + 8, 5)?;
    stmt.raw_bind_parameter(at + 9, "<Note>load message number 12345</Note>")?;
    stmt.raw_bind_parameter(at + 10, "delivered")?;
    stmt.raw_bind_parameter(at + 11, None::<&str>)?;
    stmt.raw_bind_parameter(at + 12, ts)
}
