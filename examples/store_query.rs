//! Measures `/messages`-style reads over a large store: fills a fresh SQLite file with N
//! messages (default 1,000,000) through the real writer, then times filtered page queries
//! (page + exact total, 200 per filter) and prints p50/p99/max.
//!
//! Run: `cargo run --release --example store_query -- 1000000`

use std::sync::Arc;
use std::time::Instant;

use agentserver::events::EventKind;
use agentserver::store::Store;
use agentserver::threads::{MessageFilter, MessageRecord, MessageStatus, Page};
use agentserver::time::Timestamp;

/// Timed queries per filter (pages at offsets 0, 50, … 200 in turn).
const ROUNDS: usize = 200;

const AGENTS: [&str; 8] = [
    "api", "greeter", "shouter", "router", "planner", "coder", "critic", "sink",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("big.db"))?;
    let fill = Instant::now();
    let per_thread = 10;
    for i in 0..n {
        let thread = format!("thread-{:08}", i / per_thread);
        let slot = (i % per_thread) as u64;
        let from = AGENTS[i % AGENTS.len()];
        let to = AGENTS[(i + 1) % AGENTS.len()];
        let core = agentserver::threads::MessageCore {
            id: Arc::from(format!("m-{i:09}")),
            thread_id: Arc::from(thread.as_str()),
            parent_id: None,
            slot_index: slot,
            from: Arc::from(from),
            to: Some(Arc::from(to)),
            payload_type: Some(Arc::from(if i % 3 == 0 { "Shouted" } else { "Greeting" })),
            payload_xml: Arc::new(format!("<Greeting><name>n{i}</name></Greeting>")),
            origin: agentserver::threads::Origin::inject(),
            timestamp: Timestamp(1_700_000_000_000 + i as u64),
        };
        // One in a thousand failed: a rare status, as dashboards filter for.
        let status = if i % 1000 == 7 {
            MessageStatus::Failed
        } else {
            MessageStatus::Delivered
        };
        let record = MessageRecord::new(core, status, None);
        store.record(i as u64 + 1, &EventKind::Message { message: record });
    }
    store.flush(n as u64);
    println!(
        "filled {n} messages in {:.1} s",
        fill.elapsed().as_secs_f64()
    );

    let cases: Vec<(&str, MessageFilter)> = vec![
        (
            "agent",
            MessageFilter {
                agent: Some("coder".into()),
                ..Default::default()
            },
        ),
        (
            "thread",
            MessageFilter {
                thread: Some(format!("thread-{:08}", n / per_thread / 2)),
                ..Default::default()
            },
        ),
        (
            "payload_type+status",
            MessageFilter {
                payload_type: Some("Shouted".into()),
                status: Some(MessageStatus::Delivered),
                ..Default::default()
            },
        ),
        (
            "since (last hour of the fill)",
            MessageFilter {
                since: Some(Timestamp(1_700_000_000_000 + n as u64 - 1000)),
                ..Default::default()
            },
        ),
        (
            "status (rare: failed)",
            MessageFilter {
                status: Some(MessageStatus::Failed),
                ..Default::default()
            },
        ),
        (
            "agent+payload_type",
            MessageFilter {
                agent: Some("critic".into()),
                payload_type: Some("Greeting".into()),
                ..Default::default()
            },
        ),
        (
            "agent+since (last 10,000)",
            MessageFilter {
                agent: Some("coder".into()),
                since: Some(Timestamp(1_700_000_000_000 + n as u64 - 10_000)),
                ..Default::default()
            },
        ),
        (
            "status delivered+since (last 10,000)",
            MessageFilter {
                status: Some(MessageStatus::Delivered),
                since: Some(Timestamp(1_700_000_000_000 + n as u64 - 10_000)),
                ..Default::default()
            },
        ),
        (
            "since (all of it)",
            MessageFilter {
                since: Some(Timestamp(1_700_000_000_000)),
                ..Default::default()
            },
        ),
        (
            "agent+until (all of it)",
            MessageFilter {
                agent: Some("coder".into()),
                until: Some(Timestamp(1_700_000_000_000 + n as u64)),
                ..Default::default()
            },
        ),
        (
            "until (the first 1,000)",
            MessageFilter {
                until: Some(Timestamp(1_700_000_000_000 + 1000)),
                ..Default::default()
            },
        ),
    ];
    // The first read of a fresh connection loads the schema and cold pages: reported apart.
    let first = Instant::now();
    store.query_messages(&MessageFilter::default(), Page::default())?;
    println!(
        "first query on the connection: {:.2} ms",
        first.elapsed().as_secs_f64() * 1e3
    );
    for (name, filter) in cases {
        let mut times = Vec::new();
        let mut total = 0;
        for round in 0..ROUNDS {
            let started = Instant::now();
            let page =
                store.query_messages(&filter, Page::new(Some(50), Some((round % 5) * 50)))?;
            times.push(started.elapsed());
            total = page.total;
        }
        times.sort();
        let pct = |q: f64| times[((times.len() as f64 * q).ceil() as usize).saturating_sub(1)];
        println!(
            "{name:38} total {total:>8}  p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms",
            pct(0.5).as_secs_f64() * 1e3,
            pct(0.99).as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3
        );
    }
    Ok(())
}
