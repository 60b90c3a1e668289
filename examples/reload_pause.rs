//! Measures the pause a reload causes in delivery: a three-hop chain (a → b → c, native,
//! validated at every hop) under closed-loop load, the gaps between consecutive arrivals at
//! `c` in steady state, then the same while the organism reloads every 100 ms with `b`
//! changed each time (so `b` is retired and replaced under load).
//!
//! Run: `cargo run --release --example reload_pause`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentserver::listener::{Delivery, FnHandler};
use agentserver::{InjectRequest, Organism};

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#;
const PHASE: Duration = Duration::from_secs(3);
const LOOPS: usize = 32;

fn yaml(round: usize) -> String {
    format!(
        "organism: {{ name: bench, store: memory }}
listeners:
  - {{ name: a, description: a, kind: native, handler: forward, schema: t.xsd, config: {{ to: b }} }}
  - {{ name: b, description: b round {round}, kind: native, handler: forward, schema: t.xsd, config: {{ to: c }} }}
  - {{ name: c, description: c, kind: native, handler: stamp, schema: t.xsd }}
"
    )
}

fn percentiles(mut gaps: Vec<Duration>) -> (usize, f64, f64, f64) {
    gaps.sort();
    let at = |q: f64| {
        gaps.get(((gaps.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    (gaps.len(), at(0.5), at(0.99), at(1.0))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("t.xsd"), XSD)?;
        let path = dir.path().join("o.yaml");
        std::fs::write(&path, yaml(0))?;
        // Arrival times at c, stamped by c's own handler.
        let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = arrivals.clone();
        let organism = Organism::builder()
            .handler(
                "stamp",
                FnHandler(move |_d: Delivery| {
                    if let Ok(mut a) = seen.lock() {
                        a.push(Instant::now());
                    }
                    async { Ok(Vec::new()) }
                }),
            )
            .load(&path)?;

        // Closed-loop load.
        let running = Arc::new(AtomicBool::new(true));
        let mut loops = Vec::new();
        for i in 0..LOOPS {
            let (o, running) = (organism.clone(), running.clone());
            loops.push(tokio::spawn(async move {
                let mut n = 0u64;
                while running.load(Ordering::Relaxed) {
                    let req = InjectRequest {
                        from: "api".into(),
                        to: "a".into(),
                        payload_xml: format!("<Note>{i}-{n}</Note>"),
                        thread_id: None,
                    };
                    if let Ok(r) = o.inject(req) {
                        o.history().wait_thread(&r.thread_id).await;
                    }
                    n += 1;
                }
            }));
        }

        let gaps_in = |from: Instant, to: Instant| -> Vec<Duration> {
            let a = arrivals.lock().map(|a| a.clone()).unwrap_or_default();
            let window: Vec<Instant> = a.into_iter().filter(|t| *t >= from && *t < to).collect();
            window.windows(2).map(|w| w[1] - w[0]).collect()
        };

        tokio::time::sleep(Duration::from_millis(500)).await; // warm up
        let steady_from = Instant::now();
        tokio::time::sleep(PHASE).await;
        let steady_to = Instant::now();

        let mut reload_times = Vec::new();
        let mut round = 1;
        while steady_to.elapsed() < PHASE {
            std::fs::write(&path, yaml(round))?;
            let o = organism.clone();
            let started = Instant::now();
            let report = tokio::task::spawn_blocking(move || o.reload(None)).await??;
            reload_times.push(started.elapsed());
            assert_eq!(report.changed, vec!["b".to_string()]);
            round += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reload_to = Instant::now();
        running.store(false, Ordering::Relaxed);
        for l in loops {
            let _ = l.await;
        }

        let steady = percentiles(gaps_in(steady_from, steady_to));
        let reloading = percentiles(gaps_in(steady_to, reload_to));
        let reloads = percentiles(reload_times);
        let secs = PHASE.as_secs_f64();
        println!("arrival gap at c         arrivals   rate/s   p50 ms   p99 ms   max ms");
        for (name, (n, p50, p99, max)) in [("steady", steady), ("reloading every 100 ms", reloading)] {
            println!(
                "{name:24} {n:>9} {:>8.0} {p50:>8.3} {p99:>8.3} {max:>8.3}",
                n as f64 / secs
            );
        }
        println!(
            "reload call: {} reloads, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            reloads.0, reloads.1, reloads.2, reloads.3
        );
        println!(
            "{}",
            serde_json::json!({
                "steady": {"arrivals": steady.0, "p50_ms": steady.1, "p99_ms": steady.2, "max_ms": steady.3},
                "reloading": {"arrivals": reloading.0, "p50_ms": reloading.1, "p99_ms": reloading.2, "max_ms": reloading.3},
                "reload_call": {"count": reloads.0, "p50_ms": reloads.1, "p99_ms": reloads.2, "max_ms": reloads.3},
            })
        );
        organism.stop().await;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
