//! Measures `/threads`'s label queries over a large store: fills a fresh SQLite file with N
//! labelled threads (default 100,000) through the real writer, then times each query form
//! (a page of 50 and its exact total) against the same page unfiltered, in alternating
//! rounds, and prints p50/p99 of each and the ratio of p99s.
//!
//! Run: `cargo run --release --example label_query -- 100000`

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentserver::events::EventKind;
use agentserver::store::Store;
use agentserver::threads::{LabelTest, Labels, Page, ThreadFilter, ThreadInfo, ThreadStatus};
use agentserver::time::Timestamp;

const ROUNDS: usize = 200;

fn labels_of(i: usize) -> Labels {
    let mut l = Labels::new();
    l.insert("customer".into(), format!("c{}", i % 1000));
    l.insert("tier".into(), format!("t{}", i % 3));
    if !i.is_multiple_of(5) {
        l.insert("region".into(), format!("r{}", i % 5));
    }
    l
}

fn p(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("labels.db"))?;
    let fill = Instant::now();
    let mut seq = 0;
    for i in 0..n {
        let id = format!("thread-{i:08}");
        let t = Timestamp(1_700_000_000_000 + i as u64);
        seq += 1;
        let thread = ThreadInfo {
            id: id.clone(),
            status: ThreadStatus::Completed,
            participants: vec!["api".into()],
            message_count: 0,
            created_at: t,
            last_activity: t,
            error: None,
            settings: None,
            labels: None,
            paused: false,
            owner: None,
        };
        store.record(seq, &EventKind::ThreadCreated { thread });
        seq += 1;
        let labels = Some(Arc::new(labels_of(i)));
        let thread_id = Arc::from(id.as_str());
        store.record(seq, &EventKind::ThreadLabels { thread_id, labels });
    }
    store.flush(seq);
    println!(
        "filled {n} labelled threads in {:.1} s",
        fill.elapsed().as_secs_f64()
    );
    let is =
        |k: &str, vs: &[&str]| LabelTest::Is(k.into(), vs.iter().map(|v| v.to_string()).collect());
    let cases: Vec<(&str, Vec<LabelTest>)> = vec![
        (
            "label=customer:c7 (1 in 1,000)",
            vec![is("customer", &["c7"])],
        ),
        (
            "label=customer:c7,c8 (OR)",
            vec![is("customer", &["c7", "c8"])],
        ),
        (
            "label=customer:c7&label=tier:t1 (AND)",
            vec![is("customer", &["c7"]), is("tier", &["t1"])],
        ),
        ("label=tier:t1 (1 in 3)", vec![is("tier", &["t1"])]),
        (
            "label!=tier:t1",
            vec![LabelTest::IsNot("tier".into(), "t1".into())],
        ),
        ("has_label=region", vec![LabelTest::Has("region".into())]),
        ("no_label=region", vec![LabelTest::Lacks("region".into())]),
    ];
    let page = Page {
        limit: 50,
        offset: 0,
    };
    println!("| query | p50 ms | p99 ms | unfiltered p99 ms (same rounds) | ratio of p99s |");
    println!("|---|---|---|---|---|");
    for (name, tests) in cases {
        let filter = ThreadFilter {
            labels: tests,
            ..Default::default()
        };
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            // Alternating: the filtered query, then the same page unfiltered.
            let t = Instant::now();
            let got = store.query_threads(&filter, page)?;
            with.push(t.elapsed());
            std::hint::black_box(got.total);
            let t = Instant::now();
            let all = store.query_threads(&ThreadFilter::default(), page)?;
            without.push(t.elapsed());
            std::hint::black_box(all.total);
        }
        with.sort();
        without.sort();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p(&with, 0.5),
            p(&with, 0.99),
            p(&without, 0.99),
            p(&with, 0.99) / p(&without, 0.99)
        );
    }
    Ok(())
}
