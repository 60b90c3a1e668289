//! The pump's throughput through a three-hop chain of native handlers (forward → forward →
//! sink), XSD-validated at every hop, with the SQLite store on and with `store: memory`, in
//! the same run.
//!
//! Run: `cargo bench --bench pump`

use agentserver::{InjectError, InjectRequest, Organism};
use criterion::{criterion_group, Criterion, Throughput};

mod common;

/// The allocator the `agentserver` binary uses, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Threads injected per iteration; each makes three validated hops.
const THREADS: usize = 200;

fn organism(rt: &tokio::runtime::Runtime, dir: &std::path::Path, store: &str) -> Organism {
    let _guard = rt.enter();
    common::chain(dir, store)
}

async fn run_batch(o: &Organism) {
    let mut receipts = Vec::with_capacity(THREADS);
    for i in 0..THREADS {
        let request = || InjectRequest {
            from: "api".into(),
            to: "a".into(),
            payload_xml: format!("<Note>message {i}</Note>"),
            thread_id: None,
        };
        // The store's backpressure (429 over HTTP) slows the injector, as it would a client:
        // the figure is the sustained rate, writer included.
        let receipt = loop {
            match o.inject(request()) {
                Ok(r) => break r,
                Err(InjectError::StoreBehind) => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await
                }
                Err(e) => panic!("inject refused: {e}"),
            }
        };
        receipts.push(receipt);
    }
    for r in receipts {
        o.history().wait_thread(&r.thread_id).await;
    }
}

/// One batch as a task on the runtime's two workers, where the API's own tasks run, not on
/// the bench's main thread (which would be a third busy thread on two cores).
async fn on_workers(o: &Organism) {
    let o = o.clone();
    tokio::spawn(async move { run_batch(&o).await })
        .await
        .expect("batch task");
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let memory = organism(&rt, dir.path(), "memory");
    let sqlite = organism(&rt, dir.path(), "log.db");
    let mut group = c.benchmark_group("pump_three_hops");
    group.throughput(Throughput::Elements((THREADS * 3) as u64));
    group.bench_function("store_memory", |b| {
        b.to_async(&rt).iter(|| on_workers(&memory))
    });
    group.bench_function("store_sqlite", |b| {
        b.to_async(&rt).iter(|| on_workers(&sqlite))
    });
    group.finish();
}

criterion_group!(benches, bench);

/// `criterion_main!`, after routing libxml2's allocations to mimalloc as the binary does.
fn main() {
    // SAFETY: first thing in the process; libxml2 has allocated nothing yet.
    unsafe { agentserver::schema::use_mimalloc_for_libxml2() };
    agentserver::disable_transparent_huge_pages();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
