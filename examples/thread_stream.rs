//! What a thread's snapshot costs a client: a thread of MESSAGES messages (store on, read
//! back after a restart, so from the store), then ROUNDS reads of its event stream's
//! snapshot (`GET /api/v1/threads/{id}/events` until the last `thread_snapshot` part)
//! alternating with the same messages in REST pages of 1,000 (`GET /threads/{id}/messages`,
//! the most a page holds), the baseline. Prints each side's p50/p99/max in ms and the paired median ratio.
//!
//! Run: `cargo run --release --example thread_stream -- [MESSAGES] [ROUNDS]` (default
//! 10000, 40).

use std::time::{Duration, Instant};

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::{InjectRequest, Organism};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Note" type="xs:string"/>
</xs:schema>"#;

fn organism(dir: &std::path::Path) -> Organism {
    std::fs::write(dir.join("t.xsd"), XSD).unwrap();
    let yaml = "organism: {name: snap, store: data.db}
limits: {max_messages_per_thread: 1000000}
listeners:
  - {name: s, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}
";
    std::fs::write(dir.join("o.yaml"), yaml).unwrap();
    Organism::builder().load(&dir.join("o.yaml")).unwrap()
}

/// Reads the stream until the snapshot's last part; the messages it held.
async fn snapshot(http: &reqwest::Client, url: &str) -> usize {
    let mut r = http.get(url).send().await.unwrap();
    let (mut buf, mut n) = (String::new(), 0);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            n += v["messages"].as_array().map_or(0, Vec::len);
            if v["more"] == false {
                return n;
            }
        }
        let chunk = r.chunk().await.unwrap().expect("the stream goes on");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

fn ms(mut v: Vec<Duration>, q: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(40);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        {
            let o = organism(dir.path());
            for i in 0..messages {
                loop {
                    let sent = o.inject(InjectRequest {
                        from: "api".into(),
                        to: "s".into(),
                        payload_xml: format!("<Note>note {i} of the long thread</Note>"),
                        thread_id: Some("long".into()),
                    });
                    match sent {
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
            while o.info().pending_messages > 0 || o.info().active_threads > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            o.stop().await;
        }
        let o = organism(dir.path());
        let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
            .await
            .unwrap();
        let base = format!("http://{}", server.local_addr());
        let http = agentserver::outbound::http_client().unwrap().build().unwrap();
        let stream = format!("{base}/api/v1/threads/long/events");
        let page = format!("{base}/api/v1/threads/long/messages?limit=1000");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for side in [r % 2, 1 - r % 2] {
                let t = Instant::now();
                if side == 0 {
                    assert_eq!(snapshot(&http, &stream).await, messages);
                    a.push(t.elapsed());
                } else {
                    let mut n = 0;
                    while n < messages {
                        let v: serde_json::Value = http
                            .get(format!("{page}&offset={n}"))
                            .send()
                            .await
                            .unwrap()
                            .json()
                            .await
                            .unwrap();
                        let got = v["items"].as_array().map_or(0, Vec::len);
                        assert!(got > 0, "{v}");
                        n += got;
                    }
                    b.push(t.elapsed());
                }
            }
        }
        let mut ratios: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{}",
            serde_json::json!({
                "messages": messages,
                "rounds": rounds,
                "snapshot_ms": {"p50": ms(a.clone(), 0.5), "p99": ms(a.clone(), 0.99), "max": ms(a, 1.0)},
                "rest_page_ms": {"p50": ms(b.clone(), 0.5), "p99": ms(b.clone(), 0.99), "max": ms(b, 1.0)},
                "snapshot_over_page_paired_median": ratios[ratios.len() / 2],
            })
        );
        server.shutdown().await;
        o.stop().await;
    });
}
