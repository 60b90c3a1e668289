//! Allocations per hop: the three-hop chain (forward → forward → sink, XSD at every hop)
//! with the SQLite store on and with `store: memory`, counted by a global allocator that
//! wraps the binary's (mimalloc) and by counting hooks for libxml2's allocations. Printed,
//! never asserted: a figure for BENCHMARKS.md, and a way to see what a change costs.
//!
//! Run: `cargo bench --bench allocs` (`-- N` for N measured threads, default 20,000).
//! `ALLOCS_SITES=1` also samples one allocation in 97 of the measured run with its
//! backtrace and prints the code that made the most (the first frames in `agentserver`).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

use agentserver::{InjectError, InjectRequest, Organism};

mod common;

/// Counts every allocation (and reallocation) and its bytes, then hands it to mimalloc.
struct Counting;

static RUST_ALLOCS: AtomicU64 = AtomicU64::new(0);
static RUST_BYTES: AtomicU64 = AtomicU64::new(0);

/// Set while the measured run is sampled for sites.
static SAMPLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SITES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

thread_local! {
    /// Set while this thread records a site (whose own allocations are not sampled).
    static RECORDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Allocations seen while sampling, the recording's own left out.
static SAMPLED: AtomicU64 = AtomicU64::new(0);

/// One allocation in 97, while sampling: its backtrace's first frames in this crate.
fn sample() {
    if !SAMPLING.load(Ordering::Relaxed) || RECORDING.with(|r| r.get()) {
        return;
    }
    if !SAMPLED.fetch_add(1, Ordering::Relaxed).is_multiple_of(97) {
        return;
    }
    RECORDING.with(|r| r.set(true));
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    // The first lines of this crate's source the allocation was made from.
    let site: Vec<&str> = trace
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("at "))
        .filter(|l| l.contains("/src/") && !l.contains("/rustc/") && !l.contains("/.cargo/"))
        .map(|l| l.rsplit_once("/src/").map_or(l, |(_, f)| f))
        .take(3)
        .collect();
    if let Ok(mut sites) = SITES.lock() {
        sites.push(site.join("  <  "));
    }
    RECORDING.with(|r| r.set(false));
}

// SAFETY: every call is passed to mimalloc's `GlobalAlloc` with the same arguments.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        RUST_ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample();
        RUST_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        RUST_ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample();
        RUST_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        RUST_ALLOCS.fetch_add(1, Ordering::Relaxed);
        sample();
        RUST_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Injects `threads` threads, 256 in flight, and waits for every one.
async fn run(o: &Organism, threads: usize) {
    let mut waiting = std::collections::VecDeque::new();
    for i in 0..threads {
        let receipt = loop {
            let request = InjectRequest {
                from: "api".into(),
                to: "a".into(),
                payload_xml: format!("<Note>message {i}</Note>"),
                thread_id: None,
            };
            match o.inject(request) {
                Ok(r) => break r,
                Err(InjectError::StoreBehind) => {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await
                }
                Err(e) => panic!("inject refused: {e}"),
            }
        };
        waiting.push_back(receipt.thread_id);
        if waiting.len() >= 256 {
            if let Some(t) = waiting.pop_front() {
                o.history().wait_thread(&t).await;
            }
        }
    }
    for t in waiting {
        o.history().wait_thread(&t).await;
    }
}

fn main() {
    // SAFETY: first thing in the process; libxml2 has allocated nothing yet. libxml2's
    // allocations go to mimalloc, as the binary routes them, counted.
    let set = unsafe { agentserver::schema::count_libxml2_allocations() };
    assert!(set, "libxml2's allocator is set before it allocates");
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this once, briefly.
    let benching = std::env::args().any(|a| a == "--bench");
    let threads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if benching { 20_000 } else { 100 });
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("dir");
    println!("store     allocations/hop  bytes/hop  libxml2 allocations/hop  ({threads} threads, 3 hops each)");
    for store in ["memory", "s.db"] {
        let _guard = rt.enter();
        let o = common::chain(dir.path(), store);
        rt.block_on(run(&o, threads / 10 + 1));
        let before = (
            RUST_ALLOCS.load(Ordering::Relaxed),
            RUST_BYTES.load(Ordering::Relaxed),
            agentserver::schema::libxml2_allocations(),
        );
        let sampling = std::env::var_os("ALLOCS_SITES").is_some();
        SAMPLING.store(sampling, Ordering::Relaxed);
        rt.block_on(run(&o, threads));
        SAMPLING.store(false, Ordering::Relaxed);
        let hops = (threads * 3) as f64;
        let per_hop = |now: u64, then: u64| (now - then) as f64 / hops;
        println!(
            "{:<9} {:>15.1}  {:>9.0}  {:>23.1}",
            if store == "memory" {
                "memory"
            } else {
                "sqlite"
            },
            per_hop(RUST_ALLOCS.load(Ordering::Relaxed), before.0),
            per_hop(RUST_BYTES.load(Ordering::Relaxed), before.1),
            per_hop(agentserver::schema::libxml2_allocations(), before.2),
        );
        rt.block_on(o.stop());
        if sampling {
            print_sites(hops);
        }
    }
}

/// The sampled sites, most first, as allocations per hop.
fn print_sites(hops: f64) {
    let sites = std::mem::take(&mut *SITES.lock().expect("sites"));
    let mut counts = std::collections::HashMap::new();
    for s in sites {
        *counts.entry(s).or_insert(0u64) += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    for (site, n) in counts.into_iter().take(25) {
        println!("  {:>5.2}/hop  {site}", n as f64 * 97.0 / hops);
    }
    let sampled = SAMPLED.swap(0, Ordering::Relaxed) as f64 / hops;
    println!("  ({sampled:.1} allocations/hop while sampling, the sampling's own left out)");
}
