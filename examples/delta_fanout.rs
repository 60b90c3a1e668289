//! `delta` fan-out: CLIENTS `/ws` clients (filtered to `delta` events) while the hub gets
//! RATE deltas a second for SECONDS seconds (each a piece of an LLM's streamed answer, as
//! `kind: llm` publishes them). Prints what the least-served client received (plus what it
//! was told it missed), the delivery latency p50/p99 over all clients, and the process's
//! CPU time per delta delivered.
//!
//! Run: `cargo run --release --example delta_fanout -- [CLIENTS] [RATE] [SECONDS]` (default
//! 50, 2000, 10).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::events::{Delta, DeltaKind, EventKind};
use agentserver::Organism;
use futures_util::StreamExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let rate: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("t.xsd"),
            r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Note" type="xs:string"/></xs:schema>"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("o.yaml"),
            "organism: {name: fanout, store: memory}\nlisteners:\n  - {name: s, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n",
        )
        .unwrap();
        let o = Organism::builder().load(&dir.path().join("o.yaml")).unwrap();
        let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
            .await
            .unwrap();
        let url = format!("ws://{}/ws?events=delta", server.local_addr());
        let start = Instant::now();
        let total = rate * seconds;
        let mut readers = Vec::new();
        for _ in 0..clients {
            let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            ws.next().await; // connected
            readers.push(tokio::spawn(async move {
                let (mut got, mut missed, mut lat) = (0u64, 0u64, Vec::new());
                while got + missed < total {
                    let Ok(Some(Ok(frame))) =
                        tokio::time::timeout(Duration::from_secs(10), ws.next()).await
                    else {
                        break;
                    };
                    let Ok(text) = frame.into_text() else { continue };
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    match v["event"].as_str() {
                        Some("delta") => {
                            got += 1;
                            let sent: u64 = v["delta"].as_str().unwrap().parse().unwrap();
                            let now = start.elapsed().as_micros() as u64;
                            lat.push(now.saturating_sub(sent));
                        }
                        Some("dropped") | Some("folded") => {
                            missed += v["count"].as_u64().unwrap_or(0)
                        }
                        _ => {}
                    }
                }
                (got, missed, lat)
            }));
        }
        let cpu0 = cpu_seconds();
        let hub = o.events();
        let (thread, agent, reply): (Arc<str>, Arc<str>, Arc<str>) =
            (Arc::from("t"), Arc::from("llm"), Arc::from("m"));
        let every = Duration::from_nanos(1_000_000_000 / rate);
        let begin = Instant::now();
        for i in 0..total {
            let due = begin + every * i as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
            hub.publish(EventKind::Delta(Delta {
                thread_id: thread.clone(),
                agent: agent.clone(),
                in_reply_to: reply.clone(),
                kind: DeltaKind::Text,
                index: i,
                delta: start.elapsed().as_micros().to_string(),
            }));
        }
        let mut least = u64::MAX;
        let mut missed_at_least = 0;
        let mut all = Vec::new();
        for r in readers {
            let (got, missed, lat) = r.await.unwrap();
            if got < least {
                least = got;
                missed_at_least = missed;
            }
            all.extend(lat);
        }
        let cpu = cpu_seconds() - cpu0;
        all.sort_unstable();
        let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] as f64 / 1e3;
        println!(
            "{}",
            serde_json::json!({
                "clients": clients, "rate_per_s": rate, "deltas": total,
                "published_in_s": begin.elapsed().as_secs_f64(),
                "least_served_received": least, "least_served_told_missed": missed_at_least,
                "latency_p50_ms": q(0.5), "latency_p99_ms": q(0.99),
                "cpu_us_per_delivered_delta": cpu * 1e6 / all.len().max(1) as f64,
            })
        );
        o.stop().await;
    });
}
