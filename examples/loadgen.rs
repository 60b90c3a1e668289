//! Load generator: starts an organism in-process, drives one workload, and prints throughput
//! and latency percentiles (p50, p90, p99, max) as text and as one JSON line. Every run also
//! measures the single-thread validation ceiling (libxml2 parse + validate of the same
//! payloads, no pump), so each figure is also a ratio to what validation alone costs.
//!
//! Run: `cargo run --release --example loadgen -- [chain|lua|fanout|ws50|all] [THREADS]`
//!
//! - `chain`: a → b → c, native handlers, XSD validation at every hop, SQLite store on.
//! - `chain-memory`: the same with `store: memory` (the store's cost is the difference).
//! - `lua`: the same chain with Lua handlers.
//! - `fanout`: one payload broadcast to 8 listeners (copies counted as deliveries).
//! - `ws50`: `chain` while 50 `/ws/messages` clients read every message.
//! - `rest`: REST inject closed-loop latency (POST `/api/v1/inject` → 202 → thread
//!   completed) through the HTTP stack, one request at a time, while the `chain` organism
//!   carries half of its measured peak from in-process injectors.
//! - `startup`: `organisms/hello-world.yaml` (Lua sandboxes, XSDs, the DSL) from nothing to
//!   serving its API, 10 times; `--store memory` as in a trial, so no file is written.

use std::time::{Duration, Instant};

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::{InjectRequest, Organism};
use serde_json::json;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/><xs:element name="n" type="xs:int"/>
  </xs:sequence></xs:complexType></xs:element>
  <xs:element name="Copy"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;
const FORWARD_LUA: &str = "function handle(p, m) return { to = m.own_name == 'a' and 'b' or 'c', type = 'Note', payload = p } end";
/// Threads in flight at once (closed loop).
const WINDOW: usize = 256;

fn payload(i: usize) -> String {
    format!("<Note><text>load message number {i}</text><n>{i}</n></Note>")
}

fn organism_yaml(workload: &str) -> String {
    let store = if workload == "chain-memory" {
        "memory"
    } else {
        "data.db"
    };
    let head = format!("organism: {{ name: loadgen, store: {store} }}\nlisteners:\n");
    let body = match workload {
        "lua" => "  - { name: a, description: a, kind: lua, script: fwd.lua, schema: t.xsd, accepts: [Note], concurrency: 2 }
  - { name: b, description: b, kind: lua, script: fwd.lua, schema: t.xsd, accepts: [Note], concurrency: 2 }
  - { name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2 }
"
        .to_string(),
        "fanout" => {
            let mut s = String::from("  - { name: a, description: a, kind: native, handler: template, schema: t.xsd, accepts: [Note], concurrency: 2, config: { output: '<Copy><text>{text}</text></Copy>' } }\n");
            for i in 0..8 {
                s.push_str(&format!("  - {{ name: s{i}, description: s, kind: native, handler: sink, schema: t.xsd, accepts: [Copy], concurrency: 2 }}\n"));
            }
            s
        }
        _ => "  - { name: a, description: a, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: { to: b } }
  - { name: b, description: b, kind: native, handler: forward, schema: t.xsd, accepts: [Note], concurrency: 2, config: { to: c } }
  - { name: c, description: c, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 2 }
"
        .to_string(),
    };
    format!("{head}{body}")
}

struct Latencies(Vec<Duration>);

impl Latencies {
    fn ms(&mut self, q: f64) -> f64 {
        self.0.sort_unstable();
        let i = ((self.0.len() as f64 * q).ceil() as usize).saturating_sub(1);
        self.0.get(i).map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0)
    }
}

/// Single-thread ceiling: strict parse + XSD validation of the same payloads, no pump. The
/// best of five passes, so a scheduler hiccup does not lower the ceiling.
fn ceiling(n: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let schema = agentserver::schema::Schema::compile("loadgen", XSD)?;
    let limits = agentserver::xml::XmlLimits::default();
    let mut best: f64 = 0.0;
    for _ in 0..5 {
        let started = Instant::now();
        for i in 0..n {
            let p = agentserver::xml::normalize_payload(&payload(i), &limits)?;
            schema.validate(p)?;
        }
        best = best.max(n as f64 / started.elapsed().as_secs_f64());
    }
    Ok(best)
}

async fn drive(
    organism: &Organism,
    threads: usize,
    hops_per_thread: usize,
) -> Result<(f64, Latencies), Box<dyn std::error::Error>> {
    let mut latencies = Vec::with_capacity(threads);
    let started = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    for i in 0..threads {
        while in_flight.len() >= WINDOW {
            if let Some(r) = in_flight.join_next().await {
                latencies.push(r?);
            }
        }
        let o = organism.clone();
        let sent = Instant::now();
        let receipt = loop {
            match o.inject(InjectRequest {
                from: "api".into(),
                to: "a".into(),
                payload_xml: payload(i),
                thread_id: None,
            }) {
                Ok(r) => break r,
                Err(agentserver::InjectError::Overloaded { .. })
                | Err(agentserver::InjectError::StoreBehind) => tokio::task::yield_now().await,
                Err(e) => return Err(e.into()),
            }
        };
        in_flight.spawn(async move {
            o.wait_thread(&receipt.thread_id).await;
            sent.elapsed()
        });
    }
    while let Some(r) = in_flight.join_next().await {
        latencies.push(r?);
    }
    let hops = (threads * hops_per_thread) as f64 / started.elapsed().as_secs_f64();
    Ok((hops, Latencies(latencies)))
}

async fn run(
    workload: &str,
    threads: usize,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    // The ceiling first, on a quiet machine (no organism, no store writer yet).
    let ceiling = ceiling(threads)?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t.xsd"), XSD)?;
    std::fs::write(dir.path().join("fwd.lua"), FORWARD_LUA)?;
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, organism_yaml(workload))?;
    let organism = Organism::builder().load(&path)?;
    // Deliveries per thread: the hops the figure counts.
    let hops = if workload == "fanout" { 1 + 8 } else { 3 };

    let mut readers = Vec::new();
    let mut server = None;
    if workload == "ws50" {
        let s = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
        let url = format!("ws://{}/ws/messages", s.local_addr());
        for _ in 0..50 {
            let (mut ws, _) = tokio_tungstenite::connect_async(&url).await?;
            readers.push(tokio::spawn(async move {
                use futures_util::StreamExt;
                let mut frames = 0u64;
                while let Some(Ok(_)) = ws.next().await {
                    frames += 1;
                }
                frames
            }));
        }
        server = Some(s);
    }

    // Warm up, then measure.
    drive(&organism, threads / 10 + 1, hops).await?;
    let (rate, mut lat) = drive(&organism, threads, hops).await?;
    organism.stop().await;
    if let Some(s) = server {
        s.shutdown().await;
    }
    for r in readers {
        let _ = r.await;
    }
    Ok(json!({
        "workload": workload,
        "threads": threads,
        "hops_per_thread": hops,
        "hops_per_s": rate.round(),
        "latency_ms": {"p50": lat.ms(0.5), "p90": lat.ms(0.9), "p99": lat.ms(0.99), "max": lat.ms(1.0)},
        "ceiling_validations_per_s": ceiling.round(),
        "ratio_to_ceiling": (rate / ceiling * 1000.0).round() / 1000.0,
    }))
}

/// Workload (d): REST latency at half of peak load.
async fn rest(threads: usize) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t.xsd"), XSD)?;
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, organism_yaml("chain"))?;
    let organism = Organism::builder().load(&path)?;
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
    let url = format!("http://{}/api/v1/inject", server.local_addr());

    // Peak, closed loop; then half of it as background load, paced every millisecond (coarser
    // bursts would queue the measured request behind a burst).
    let (peak_hops, _) = drive(&organism, threads / 2 + 1, 3).await?;
    let per_tick = ((peak_hops / 3.0 / 2.0) / 1000.0).max(1.0) as usize;
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let background = {
        let (o, running) = (organism.clone(), running.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut n = 0usize;
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    let _ = o.inject(InjectRequest {
                        from: "api".into(),
                        to: "a".into(),
                        payload_xml: payload(n),
                        thread_id: None,
                    });
                    n += 1;
                }
            }
            n
        })
    };

    let http = reqwest::Client::new();
    let samples = (threads / 10).max(100);
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        let r = http
            .post(&url)
            .json(&json!({"to": "a", "payload_xml": payload(i)}))
            .send()
            .await?;
        if r.status().as_u16() != 202 {
            return Err(format!("inject answered {}", r.status()).into());
        }
        let receipt: serde_json::Value = r.json().await?;
        let thread = receipt["thread_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        organism.wait_thread(&thread).await;
        latencies.push(started.elapsed());
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let injected = background.await?;
    organism.stop().await;
    server.shutdown().await;
    let mut lat = Latencies(latencies);
    Ok(json!({
        "workload": "rest",
        "peak_hops_per_s": peak_hops.round(),
        "background_threads_per_s": per_tick * 1000,
        "background_injected": injected,
        "samples": samples,
        "latency_ms": {"p50": lat.ms(0.5), "p90": lat.ms(0.9), "p99": lat.ms(0.99), "max": lat.ms(1.0)},
    }))
}

/// Start-up to ready: load, check, compile, start every listener, bind and serve the API.
async fn startup() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("organisms/hello-world.yaml");
    let mut times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let mut config =
            agentserver::config::load_file(&path, &["sink", "echo", "forward", "template"])?;
        config.store = None;
        let organism = Organism::builder().build(config)?;
        let server =
            ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default()).await?;
        times.push(started.elapsed());
        organism.stop().await;
        server.shutdown().await;
    }
    let mut t = Latencies(times);
    println!(
        "startup to ready (hello-world.yaml, 10 runs): p50 {:.1} ms, max {:.1} ms",
        t.ms(0.5),
        t.ms(1.0)
    );
    println!(
        "{}",
        json!({"workload": "startup", "p50_ms": t.ms(0.5), "max_ms": t.ms(1.0)})
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("all");
    if which == "startup" || which == "rest" {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        if which == "startup" {
            return rt.block_on(startup());
        }
        let threads: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(20_000);
        let r = rt.block_on(rest(threads))?;
        let l = &r["latency_ms"];
        println!(
            "rest: {} samples at {} background threads/s (half of peak {} hops/s): p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            r["samples"], r["background_threads_per_s"], r["peak_hops_per_s"],
            l["p50"].as_f64().unwrap_or(0.0), l["p90"].as_f64().unwrap_or(0.0),
            l["p99"].as_f64().unwrap_or(0.0), l["max"].as_f64().unwrap_or(0.0)
        );
        println!("{r}");
        return Ok(());
    }
    let threads: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let workloads: Vec<&str> = match which {
        "all" => vec!["chain", "chain-memory", "lua", "fanout", "ws50"],
        w @ ("chain" | "chain-memory" | "lua" | "fanout" | "ws50") => vec![w],
        other => {
            return Err(format!(
                "unknown workload `{other}` (chain, chain-memory, lua, fanout, ws50, all)"
            )
            .into())
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!("workload         hops/s   p50 ms   p90 ms   p99 ms   max ms   ceiling/s   ratio");
    for w in workloads {
        let r = rt.block_on(run(w, threads))?;
        let l = &r["latency_ms"];
        println!(
            "{w:14} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>11} {:>7}",
            r["hops_per_s"],
            l["p50"].as_f64().unwrap_or(0.0),
            l["p90"].as_f64().unwrap_or(0.0),
            l["p99"].as_f64().unwrap_or(0.0),
            l["max"].as_f64().unwrap_or(0.0),
            r["ceiling_validations_per_s"],
            r["ratio_to_ceiling"]
        );
        println!("{r}");
    }
    Ok(())
}
