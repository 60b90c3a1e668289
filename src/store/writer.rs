//! The writer thread: takes ops from the bounded channel, batches them, coalesces, commits,
//! retries a failing batch row by row, and reports its health.

use super::*;

pub(super) fn writer(
    mut conn: Connection,
    rx: mpsc::Receiver<Op>,
    health: Arc<Health>,
    path: PathBuf,
) {
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
        // In `seq` order: a publisher numbers its event, then hands it to the store, and two
        // publishers can hand theirs over in the other order. Sorted, a batch writes its
        // messages in the stream's order (as `restore` does from the mirror), and a status
        // never comes before its message. Stable, and what is not an event goes last (a
        // flush is answered after the commit wherever it stands).
        batch.sort_by_key(|op| match op {
            Op::Event(e) => e.seq,
            _ => u64::MAX,
        });
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
                    let keep = matches!(op, Op::Event(_) | Op::Work(_))
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
        run_prunes(
            &mut conn,
            &mut cache,
            prunes,
            &mut arrived_since_prune,
            &health,
        );
        for op in batch.drain(..) {
            if let Op::Flush(done) = op {
                done();
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

/// Runs the batch's pruning requests, each in its own transactions after the batch, a chunk
/// at least twice what arrived since the last one, and answers each.
fn run_prunes(
    conn: &mut Connection,
    cache: &mut Cache,
    prunes: Vec<Op>,
    arrived_since_prune: &mut u64,
    health: &Health,
) {
    for op in prunes {
        if let Op::Prune {
            shares,
            cutoff,
            done,
        } = op
        {
            // At least twice what arrived since the last chunk, so pruning outpaces
            // arrivals (the writer's backlog, and so inject's 429, pays for it).
            let chunk = PRUNE_CHUNK.max(2 * *arrived_since_prune);
            *arrived_since_prune = 0;
            let result = prune_chunk(conn, &shares, cutoff, chunk);
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
}

/// Commits a batch's writes in one transaction. If that fails, commits them one by one so a
/// single bad row costs only itself; returns the first error met and the (ascending) indexes
/// of the writes that failed.
pub(super) fn commit(
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
