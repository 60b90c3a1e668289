//! The store's writer alone, on the events a three-hop chain publishes: per thread
//! `thread_created`, three messages each followed by its final status, and `thread_updated`,
//! 240 threads in flight at a time. A window of 240 threads is 1,920 events, out of step
//! with the writer's batches (of up to 8,192 events here, where the producer is always
//! ahead), so some statuses land in a later batch than their message and change a stored
//! row, as under load: 2,104 of 60,000 (with batches of 2,048: one in nine; `loadgen chain`
//! showed one in eight to one in four then). Prints messages committed per second of wall
//! time. Wall time on a shared VM varies by the day; for a repeatable figure, count the
//! writer thread's instructions with callgrind:
//!
//! ```text
//! cargo build --release --example store_replay
//! valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=cg.%p \
//!     target/release/examples/store_replay 20000
//! grep summary cg.*-02    # thread 2 is the writer
//! ```
//!
//! Run: `cargo run --release --example store_replay -- [THREADS]` (default 20,000 threads,
//! 60,000 messages).

use std::sync::Arc;

use agentserver::events::{Event, EventKind};
use agentserver::store::Store;
use agentserver::threads::{MessageRecord, MessageStatus, ThreadInfo, ThreadStatus};
use agentserver::time::Timestamp;

/// The allocator the `agentserver` binary uses, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: u64 = match std::env::args().nth(1) {
        None => 20_000,
        Some(a) => a
            .parse()
            .map_err(|_| format!("THREADS must be a whole number, not `{a}`"))?,
    };
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("replay.db"))?;
    let ids: Vec<String> = (0..threads)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let mut seq = 0;
    // As the hub does, the store is handed the published event, which the hub's ring of the
    // last 16,384 events holds too: a writer that keeps up (under load it is one batch
    // window, a few thousand events, behind) leaves the freeing to the ring. Here the
    // producer runs ahead by the writer's whole queue, so the events are kept to the end
    // instead, for the same effect.
    let mut kept = Vec::with_capacity(threads as usize * 8);
    let start = std::time::Instant::now();
    for window in ids.chunks(240) {
        for phase in 0..8u64 {
            for t in window {
                seq += 1;
                let event = Arc::new(Event::new(seq, chain_event(t, phase)));
                store.record_event(&event);
                kept.push(event);
            }
        }
    }
    store.flush(seq);
    let secs = start.elapsed().as_secs_f64();
    drop(kept);
    let messages = threads * 3;
    println!(
        "{messages} messages of {threads} threads committed in {secs:.2} s: {:.0} messages/s",
        messages as f64 / secs
    );
    Ok(())
}

/// Event `phase` (0..8) of a three-hop chain thread `t`, as the pump publishes them.
fn chain_event(t: &str, phase: u64) -> EventKind {
    let hop = (phase.max(1) - 1) / 2;
    let names = ["api", "a", "b", "c"];
    match phase {
        0 => EventKind::ThreadCreated {
            thread: ThreadInfo {
                id: t.to_string(),
                status: ThreadStatus::Active,
                participants: Vec::new(),
                message_count: 0,
                created_at: Timestamp::now(),
                last_activity: Timestamp::now(),
                error: None,
                settings: None,
                labels: None,
                paused: false,
                owner: None,
            },
        },
        7 => EventKind::ThreadUpdated {
            thread_id: t.into(),
            status: ThreadStatus::Completed,
            message_count: 3,
            error: None,
            paused: false,
            labels: None,
        },
        p if p % 2 == 1 => EventKind::Message {
            message: MessageRecord::new(
                agentserver::threads::MessageCore {
                    id: Arc::from(format!("{t}-{hop}")),
                    thread_id: Arc::from(t),
                    parent_id: None,
                    slot_index: hop,
                    from: Arc::from(names[hop as usize]),
                    to: Some(Arc::from(names[hop as usize + 1])),
                    payload_type: Some("{urn:bench}Note".into()),
                    payload_xml: Arc::new("<Note>load message number 12345</Note>".to_string()),
                    origin: agentserver::threads::Origin::inject(),
                    timestamp: Timestamp::now(),
                },
                MessageStatus::Pending,
                None,
            ),
        },
        _ => EventKind::MessageStatus {
            id: format!("{t}-{hop}").into(),
            thread_id: t.into(),
            status: MessageStatus::Delivered,
            error: None,
            about: None,
        },
    }
}
