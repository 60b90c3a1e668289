//! Measures what deploying a script version of an agent created through the API costs: the
//! time from upload to live for a 10 kB script, and the pause deploys cause in delivery. A
//! Lua agent (`echo`, created as the API does) answers each `Ask` to a native `collector`
//! that stamps each arrival, under closed-loop load; for 3 s nothing changes (steady), for
//! the next 3 s versions 1 and 2 are deployed in turn every 100 ms.
//!
//! Run: `cargo run --release --example deploy_pause`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentserver::listener::{Delivery, FnHandler};
use agentserver::pump::agents::{NewAgent, NewVersion};
use agentserver::{InjectRequest, Organism};

const PHASE: Duration = Duration::from_secs(3);
const LOOPS: usize = 32;
const UPLOADS: usize = 10;

const YAML: &str = "organism: { name: bench, store: memory }
listeners:
  - { name: collector, description: stamps arrivals, kind: native, handler: stamp, fields: { Reply: { text: string } } }
";

/// A script of about 10 kB (a comment pads it) answering with `tag`.
fn script(tag: &str) -> String {
    format!(
        "-- {}\nfunction handle(p, meta)\n  return {{ to = \"collector\", payload = {{ text = \"{tag} \" .. p.text }} }}\nend\n",
        "x".repeat(10_000)
    )
}

fn percentiles(mut v: Vec<Duration>) -> (usize, f64, f64, f64) {
    v.sort();
    let at = |q: f64| {
        v.get(((v.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(0.0)
    };
    (v.len(), at(0.5), at(0.99), at(1.0))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("o.yaml");
        std::fs::write(&path, YAML)?;
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
        organism.uploads().create_agent(
            NewAgent {
                name: "echo".into(),
                tenant: None,
                definition: serde_json::json!({
                    "description": "answers", "accepts": ["Ask"], "peers": ["collector"], "concurrency": 2
                }),
                version: NewVersion {
                    script: script("v1"),
                    fields: Some(serde_json::json!({"Ask": {"text": "string"}})),
                    ..Default::default()
                },
            },
            None,
        )?;

        // Upload to live, idle: upload a new version (compiled, `init` run, schema compiled
        // beside the organism), then deploy it.
        let mut to_live = Vec::new();
        for i in 0..UPLOADS {
            let started = Instant::now();
            let o = organism.clone();
            let tag = format!("u{i}");
            tokio::task::spawn_blocking(move || {
                let v = o.uploads().upload_version(
                    "echo",
                    NewVersion {
                        script: script(&tag),
                        ..Default::default()
                    },
                    None,
                )?;
                o.uploads().deploy_version("echo", v.version, None, None)
            })
            .await??;
            to_live.push(started.elapsed());
        }
        let versions = organism.uploads().agent_versions("echo")?;
        let (newest, older) = (versions[0].version, versions[1].version);

        let running = Arc::new(AtomicBool::new(true));
        let mut loops = Vec::new();
        for i in 0..LOOPS {
            let (o, running) = (organism.clone(), running.clone());
            loops.push(tokio::spawn(async move {
                let mut n = 0u64;
                while running.load(Ordering::Relaxed) {
                    let req = InjectRequest {
                        from: "api".into(),
                        to: "echo".into(),
                        payload_xml: format!("<Ask><text>{i}-{n}</text></Ask>"),
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
        let mut deploys = Vec::new();
        let mut next = older;
        while steady_to.elapsed() < PHASE {
            let o = organism.clone();
            let started = Instant::now();
            let change =
                tokio::task::spawn_blocking(move || o.uploads().deploy_version("echo", next, None, None))
                    .await??;
            deploys.push(started.elapsed());
            assert_eq!(change.report.changed, vec!["echo".to_string()]);
            next = if next == older { newest } else { older };
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let deploy_to = Instant::now();
        running.store(false, Ordering::Relaxed);
        for l in loops {
            let _ = l.await;
        }

        let steady = percentiles(gaps_in(steady_from, steady_to));
        let deploying = percentiles(gaps_in(steady_to, deploy_to));
        let deploy_calls = percentiles(deploys);
        let uploads = percentiles(to_live);
        let secs = PHASE.as_secs_f64();
        println!("arrival gap at collector   arrivals   rate/s   p50 ms   p99 ms   max ms");
        for (name, (n, p50, p99, max)) in [("steady", steady), ("deploying every 100 ms", deploying)] {
            println!(
                "{name:26} {n:>8} {:>8.0} {p50:>8.3} {p99:>8.3} {max:>8.3}",
                n as f64 / secs
            );
        }
        println!(
            "deploy call under load: {} deploys, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            deploy_calls.0, deploy_calls.1, deploy_calls.2, deploy_calls.3
        );
        println!(
            "upload to live, 10 kB script, idle: {} rounds, p50 {:.2} ms, max {:.2} ms",
            uploads.0, uploads.1, uploads.3
        );
        println!(
            "{}",
            serde_json::json!({
                "steady": {"arrivals": steady.0, "p50_ms": steady.1, "p99_ms": steady.2, "max_ms": steady.3},
                "deploying": {"arrivals": deploying.0, "p50_ms": deploying.1, "p99_ms": deploying.2, "max_ms": deploying.3},
                "deploy_call": {"count": deploy_calls.0, "p50_ms": deploy_calls.1, "p99_ms": deploy_calls.2, "max_ms": deploy_calls.3},
                "upload_to_live": {"count": uploads.0, "p50_ms": uploads.1, "max_ms": uploads.3},
            })
        );
        organism.stop().await;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
