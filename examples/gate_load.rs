//! What an approval gate costs when a client approves at once: the chain a → b → c (store
//! on), `b` ungated (A) or gated (B), in alternating rounds A B A B …; a client task reads
//! every event in both, and in B approves each input the moment its `input_requested` comes.
//! Each side's organism is made once and warmed by one unmeasured round (as a running
//! server's is), then each round runs THREADS threads, 64 in flight, and reports threads/s
//! and CPU per thread;
//! then one more figure, measured in the same process: the CPU of one store write (a row
//! committed alone on a file set up as the store's), what the target allows a gate to add.
//!
//! Run: `cargo run --release --example gate_load -- [THREADS] [ROUNDS]` (default 5000, 3);
//! `GATE_ONLY=1` runs gated rounds only, `UNGATED_ONLY=1` ungated ones, for profiles;
//! `GATE_NO_STORE=1` runs both sides without a store;
//! `GATE_EVENTS=1` prints each round's events per thread by type; `GATE_ALLOCS=1` also counts allocations per thread in each round (counting costs an atomic
//! add per allocation, so the CPU figures of such a run are not the plain ones).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentserver::events::EventKind;
use agentserver::pump::{Decider, Verdict};
use agentserver::{InjectRequest, Organism};

/// mimalloc, as the binary uses, counting allocations while [`COUNTING`] is set.
struct Counted;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts one allocation, while counting.
fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to mimalloc's `GlobalAlloc` with the same arguments.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counted = Counted;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

const IN_FLIGHT: usize = 64;

fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / 100.0
}

fn organism(dir: &std::path::Path, gated: bool) -> Organism {
    std::fs::write(dir.join("t.xsd"), XSD).unwrap();
    let gate = if gated { ", approval: {}" } else { "" };
    // `GATE_NO_STORE=1`: no store, to part the gate's cost into the store's and the rest.
    // (An organism without `store:` keeps one beside its file: `memory` is none.)
    let store = if std::env::var_os("GATE_NO_STORE").is_some() {
        ", store: memory"
    } else {
        ", store: data.db"
    };
    let yaml = format!(
        "organism: {{ name: gates{store} }}
limits: {{ max_held_messages: 100000 }}
listeners:
  - {{ name: a, description: a, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: {{ to: b }} }}
  - {{ name: b, description: b, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: {{ to: c }}{gate} }}
  - {{ name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2 }}
"
    );
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    Organism::builder().load(&path).unwrap()
}

/// One round on `o`: `threads` threads through the chain; (threads/s, CPU µs per thread).
async fn round(o: &Organism, threads: usize) -> (f64, f64) {
    let o = o.clone();
    // The client reads every event in both rounds (so the comparison is the gate's, not a
    // reader's); in a gated round it approves each input the moment it is told.
    let approver = {
        let o2 = o.clone();
        let mut events = o.events().subscribe();
        tokio::spawn(async move {
            let who = Decider {
                name: Some("key:approver".into()),
                role: agentserver::config::Role::Operator,
                tenant: None,
            };
            loop {
                let ev = match events.recv().await {
                    Ok(ev) => ev,
                    Err(agentserver::events::RecvError::Lagged(n)) => {
                        eprintln!("the client fell {n} events behind: some inputs stay open");
                        continue;
                    }
                    Err(_) => return,
                };
                if let EventKind::InputRequested { input } = &ev.kind {
                    let verdict = Verdict::Approve {
                        reason: None,
                        payload_xml: None,
                    };
                    let _ = o2.inputs().decide(&input.id, &who, verdict);
                }
            }
        })
    };
    // Completed threads free their place: counted from the event stream, no polling.
    let sem = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let mut events = o.events().subscribe();
    let freed = sem.clone();
    let counting = std::env::var_os("GATE_EVENTS").is_some();
    let collector = tokio::spawn(async move {
        let mut done = 0;
        let mut kinds = std::collections::BTreeMap::<&'static str, usize>::new();
        loop {
            let ev = match events.recv().await {
                Ok(ev) => ev,
                Err(agentserver::events::RecvError::Lagged(n)) => {
                    eprintln!("the collector fell {n} events behind: the round will not end");
                    continue;
                }
                Err(_) => return,
            };
            if counting {
                *kinds.entry(ev.kind.name()).or_default() += 1;
            }
            if let EventKind::ThreadUpdated {
                status: agentserver::threads::ThreadStatus::Completed,
                ..
            } = &ev.kind
            {
                done += 1;
                freed.add_permits(1);
                if done == threads {
                    if counting {
                        let per: Vec<String> = kinds
                            .iter()
                            .map(|(k, n)| format!("{k} {:.2}", *n as f64 / threads as f64))
                            .collect();
                        println!("events/thread: {}", per.join(", "));
                    }
                    let _ = done_tx.send(());
                    return;
                }
            }
        }
    });
    let started = Instant::now();
    let cpu = process_cpu_secs();
    for i in 0..threads {
        sem.acquire().await.unwrap().forget();
        // A client told the store is behind (429) tries again a moment later.
        loop {
            match o.inject(InjectRequest {
                from: "api".into(),
                to: "a".into(),
                payload_xml: format!("<Note><text>n{i}</text></Note>"),
                thread_id: None,
            }) {
                Err(agentserver::InjectError::StoreBehind) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                other => {
                    other.unwrap();
                    break;
                }
            }
        }
    }
    if tokio::time::timeout(Duration::from_secs(60), done_rx)
        .await
        .is_err()
    {
        let info = o.info();
        eprintln!(
            "stuck: {} inputs open, {} active threads, {} pending messages, {} messages",
            o.inputs().open_count(),
            info.active_threads,
            info.pending_messages,
            info.total_messages
        );
    }
    collector.abort();
    let secs = started.elapsed().as_secs_f64();
    let cpu_us = (process_cpu_secs() - cpu) * 1e6 / threads as f64;
    approver.abort();
    (threads as f64 / secs, cpu_us)
}

/// CPU µs of one store write: a row like an input's (ids, a payload, a dozen columns)
/// committed alone on an SQLite file set up as the store's (WAL, `synchronous = NORMAL`).
fn store_write_cost(n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("w.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.execute_batch(
        "CREATE TABLE w (id TEXT PRIMARY KEY, kind TEXT, status TEXT, thread TEXT, message TEXT, \
         listener TEXT, sender TEXT, slot INTEGER, type TEXT, xml TEXT, created INTEGER, by TEXT)",
    )
    .unwrap();
    let cpu = process_cpu_secs();
    for i in 0..n {
        conn.prepare_cached(
            "INSERT INTO w VALUES (?1, 'approval', 'open', ?2, ?3, 'b', 'a', 1, 'Note', \
             '<Note><text>n</text></Note>', ?4, 'api')",
        )
        .unwrap()
        .execute(rusqlite::params![
            format!("i{i}"),
            format!("t{i}"),
            format!("m{i}"),
            i as i64
        ])
        .unwrap();
    }
    (process_cpu_secs() - cpu) * 1e6 / n as f64
}

fn main() {
    unsafe { agentserver::schema::use_mimalloc_for_libxml2() };
    // As the binary does: with huge pages, memory given back and taken again is faulted in
    // 2 MiB at a time, each zeroed by the kernel, and counted as the gate's CPU.
    agentserver::disable_transparent_huge_pages();
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `GATE_ONLY=1`: gated rounds only (for a profile of the gate's path).
    let sides: &[bool] = if std::env::var_os("GATE_ONLY").is_some() {
        &[true]
    } else if std::env::var_os("UNGATED_ONLY").is_some() {
        &[false]
    } else {
        &[false, true]
    };
    // Each side's organism is made once and warmed by a round of its own, so the measured
    // rounds see it as a running server does: its memory already grown, not the kernel
    // zeroing new pages (a fresh organism per round put a quarter of the gate's cost there).
    let dirs: Vec<_> = sides.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let organisms: Vec<(bool, Organism)> = sides
        .iter()
        .zip(&dirs)
        .map(|(&gated, dir)| {
            let _rt = rt.enter();
            (gated, organism(dir.path(), gated))
        })
        .collect();
    for (_, o) in &organisms {
        rt.block_on(round(o, threads));
    }
    let mut out = Vec::new();
    for r in 0..rounds {
        for (gated, o) in &organisms {
            let gated = *gated;
            let counting = std::env::var_os("GATE_ALLOCS").is_some();
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            COUNTING.store(counting, Ordering::Relaxed);
            let (rate, cpu) = rt.block_on(round(o, threads));
            COUNTING.store(false, Ordering::Relaxed);
            let allocs = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / threads as f64;
            let allocs = if counting {
                format!(" {allocs:>6.1} allocations/thread")
            } else {
                String::new()
            };
            println!(
                "round {} {:8} {rate:>9.0} threads/s {cpu:>7.1} µs CPU/thread{allocs}",
                r + 1,
                if gated { "gated" } else { "ungated" }
            );
            out.push((gated, rate, cpu));
        }
    }
    for (_, o) in organisms {
        rt.block_on(o.stop());
    }
    let write = store_write_cost(threads);
    println!("one store write (a row committed alone): {write:.1} µs CPU");
    let ratios: Vec<String> = out
        .chunks(2)
        .filter(|p| p.len() == 2)
        .map(|p| format!("{:.2}", (p[1].2 - p[0].2) / write))
        .collect();
    println!(
        "{}",
        serde_json::json!({
            "threads": threads,
            "rounds": out.iter().map(|(g, rate, cpu)| serde_json::json!({"gated": g, "threads_per_s": rate.round(), "cpu_us_per_thread": (cpu * 10.0).round() / 10.0})).collect::<Vec<_>>(),
            "store_write_cpu_us": (write * 10.0).round() / 10.0,
            "gate_cost_in_store_writes_per_round": ratios,
        })
    );
}
