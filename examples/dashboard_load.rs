//! The dashboard under load, in headless Chromium: how long its frames take while a
//! 200-listener organism carries 1,000 messages a second, against the same page idle,
//! in alternating rounds (idle, load, idle, load, …).
//!
//! Run: `cargo run --release --example dashboard_load [ROUNDS]` (default 3 of each; each round
//! 5 s). Needs Chromium (`scripts/test` installs it). Prints one JSON line per round and
//! a summary: each mode's frame gaps (p50, p99, max, ms), long tasks, and the ratio of the
//! loaded p99 to the idle one.

#[path = "../tests/browser/mod.rs"]
#[allow(dead_code)]
mod browser;

use std::time::Duration;

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;
use browser::{swarm, Chromium};
use serde_json::{json, Value};

const SCHEMA: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Ping"><xs:complexType><xs:sequence>
    <xs:element name="n" type="xs:int"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(3);
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t.xsd"), SCHEMA)?;
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism: {{ name: swarm, store: memory }}\nlisteners:\n{}",
            swarm::listeners()
        ),
    )?;
    let organism = Organism::builder().load(&path)?;
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
    let mut c = Chromium::launch().await;
    c.goto(&format!("http://{}/", server.local_addr())).await;
    c.wait(
        "$('connection-state').textContent === 'live' && document.querySelectorAll('#agent-list [data-agent]').length === 200",
        "the organism shown",
    )
    .await;
    let round = Duration::from_secs(5);
    let mut p99 = [Vec::new(), Vec::new()];
    for r in 0..rounds * 2 {
        let loaded = r % 2 == 1;
        c.eval(swarm::RECORD_FRAMES).await;
        let sent = if loaded {
            swarm::drive(&organism, 1000, round).await
        } else {
            tokio::time::sleep(round).await;
            0
        };
        let report = c.eval(swarm::FRAME_REPORT).await;
        p99[usize::from(loaded)].push(report["p99_ms"].as_f64().unwrap_or(0.0));
        let mut line =
            json!({"round": r, "mode": if loaded { "load" } else { "idle" }, "messages": sent});
        for k in [
            "frames",
            "p50_ms",
            "p99_ms",
            "max_ms",
            "long_tasks",
            "longest_task_ms",
            "rows",
            "heap_mb",
            "folded",
        ] {
            line[k] = report[k].clone();
        }
        println!("{line}");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (idle, load) = (median(&mut p99[0]), median(&mut p99[1]));
    let summary: Value = json!({"workload": "dashboard_load", "listeners": 200, "messages_per_s": 1000,
        "rounds_each": rounds, "idle_p99_ms": idle, "load_p99_ms": load, "load_over_idle_p99": load / idle.max(1e-9)});
    println!("{summary}");
    drop(c);
    organism.stop().await;
    server.shutdown().await;
    Ok(())
}
