//! Measures `organism.search.payload_text`: what the index costs the store's writer (a
//! fill of the same messages with the index off and on, in alternating rounds), and `q=`
//! over a large store with it on (p50/p99 of a page of 50 and its exact total, against the
//! same page unfiltered in the same rounds).
//!
//! Run: `cargo run --release --example payload_search -- 1000000`

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentserver::events::EventKind;
use agentserver::store::Store;
use agentserver::threads::{
    MessageRecord, MessageStatus, Origin, Page, ThreadFilter, ThreadInfo, ThreadStatus,
};
use agentserver::time::Timestamp;

/// Messages a thread holds.
const PER_THREAD: usize = 10;

fn p(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Records `n` messages (threads of [`PER_THREAD`]) from `first` on; the last `seq`.
fn fill(store: &Store, first: usize, n: usize, mut seq: u64) -> u64 {
    let mut thread = String::new();
    for i in first..first + n {
        let hop = i % PER_THREAD;
        let t = i / PER_THREAD;
        if hop == 0 {
            thread = format!("thread-{t:08}");
            seq += 1;
            let now = Timestamp(1_700_000_000_000 + i as u64);
            let info = ThreadInfo {
                id: thread.clone(),
                status: ThreadStatus::Completed,
                participants: vec!["api".into()],
                message_count: PER_THREAD as u64,
                created_at: now,
                last_activity: now,
                error: None,
                settings: None,
                labels: None,
                paused: false,
                owner: None,
            };
            store.record(seq, &EventKind::ThreadCreated { thread: info });
        }
        // The message's step, the thread's own word, a word of one thread in 100, and words
        // every payload has.
        let xml = format!(
            "<Note>step s{hop} order w{t} batch b{} shipped to the customer as agreed</Note>",
            t % 100
        );
        seq += 1;
        let message = MessageRecord::new(
            agentserver::threads::MessageCore {
                id: Arc::from(format!("m-{i}")),
                thread_id: Arc::from(thread.as_str()),
                parent_id: None,
                slot_index: hop as u64,
                from: Arc::from("a"),
                to: Some(Arc::from("b")),
                payload_type: Some("Note".into()),
                payload_xml: Arc::new(xml),
                origin: Origin::inject(),
                timestamp: Timestamp(1_700_000_000_000 + i as u64),
            },
            MessageStatus::Delivered,
            None,
        );
        store.record(seq, &EventKind::Message { message });
    }
    store.flush(seq);
    seq
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;

    // The writer's cost: the same fill with the index off, then on, in alternating rounds.
    let batch = 100_000;
    let off = Store::open(&dir.path().join("off.db"))?;
    let on = Store::open(&dir.path().join("on.db"))?;
    off.search_payloads(false)?;
    on.search_payloads(true)?;
    let (mut seq_off, mut seq_on) = (0, 0);
    println!("| round | off µs/message | on µs/message | on / off |");
    println!("|---|---|---|---|");
    for round in 0..4 {
        let t = Instant::now();
        seq_off = fill(&off, round * batch, batch, seq_off);
        let a = t.elapsed().as_secs_f64() * 1e6 / batch as f64;
        let t = Instant::now();
        seq_on = fill(&on, round * batch, batch, seq_on);
        let b = t.elapsed().as_secs_f64() * 1e6 / batch as f64;
        println!("| {round} | {a:.2} | {b:.2} | {:.2} |", b / a);
    }
    drop(off);

    // `q=` at `n` messages, the index on.
    let t = Instant::now();
    if n > 4 * batch {
        fill(&on, 4 * batch, n - 4 * batch, seq_on);
    }
    println!(
        "\nfilled to {n} messages in {:.1} s more",
        t.elapsed().as_secs_f64()
    );
    let page = Page {
        limit: 50,
        offset: 0,
    };
    let threads = n / PER_THREAD;
    println!("\n| q | threads found | p50 ms | p99 ms | unfiltered p99 ms | ratio of p99s |");
    println!("|---|---|---|---|---|---|");
    for q in [
        format!("w{}", threads / 2),
        "b42".to_string(),
        "b42 shipped".to_string(),
        "customer".to_string(),
        "the customer".to_string(),
        "shipped to the customer".to_string(),
        "shipped to the customer as".to_string(),
        "b42 shipped to the customer".to_string(),
        "shipped to the customer as agreed".to_string(),
        format!(
            "w{} batch b0 shipped to the customer as agreed",
            threads / 2
        ),
    ] {
        let filter = ThreadFilter {
            q: Some(q.clone()),
            ..Default::default()
        };
        let (mut with, mut without, mut found) = (Vec::new(), Vec::new(), 0);
        for _ in 0..50 {
            let t = Instant::now();
            found = on.query_threads(&filter, page)?.total;
            with.push(t.elapsed());
            let t = Instant::now();
            std::hint::black_box(on.query_threads(&ThreadFilter::default(), page)?.total);
            without.push(t.elapsed());
        }
        with.sort();
        without.sort();
        println!(
            "| `{q}` | {found} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p(&with, 0.5),
            p(&with, 0.99),
            p(&without, 0.99),
            p(&with, 0.99) / p(&without, 0.99)
        );
    }
    Ok(())
}
