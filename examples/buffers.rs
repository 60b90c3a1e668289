//! Reconstructs each agent's inbox and outbox from `/ws/messages`, as the API seed's
//! "reconstructing agent buffers" section describes: every message goes to its sender's
//! outbox and its receiver's inbox.
//!
//! Run the demo organism, then this, then inject something:
//!
//! ```text
//! cargo run --release -- run organisms/hello-world.yaml
//! cargo run --example buffers -- http://127.0.0.1:8765 6
//! cargo run --release -- inject --to greeter '<Greeting><name>Dan</name></Greeting>'
//! ```
//!
//! The optional second argument stops after that many messages and prints every buffer.
//! The example reconnects with `?since=` if the connection drops, so it loses nothing the
//! server still retains.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

#[derive(Default)]
struct Buffers {
    inbox: Vec<Value>,
    outbox: Vec<Value>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8765".into());
    let limit: Option<usize> = args.next().and_then(|n| n.parse().ok());
    let ws_base = url.trim_end_matches('/').replacen("http://", "ws://", 1);

    let mut buffers: BTreeMap<String, Buffers> = BTreeMap::new();
    let mut seen = 0usize;
    let mut last_seq: Option<u64> = None;
    'connect: loop {
        let endpoint = match last_seq {
            Some(seq) => format!("{ws_base}/ws/messages?since={seq}"),
            None => format!("{ws_base}/ws/messages"),
        };
        let (mut ws, _) = tokio_tungstenite::connect_async(endpoint.as_str()).await?;
        eprintln!("connected to {endpoint}");
        while let Some(frame) = ws.next().await {
            let Ok(Message::Text(text)) = frame else {
                if frame.is_err() {
                    continue 'connect;
                }
                continue;
            };
            let msg: Value = serde_json::from_str(text.as_str())?;
            if let Some(seq) = msg["seq"].as_u64() {
                last_seq = Some(seq);
            }
            match msg["event"].as_str() {
                Some("message") => {}
                Some("dropped") => {
                    eprintln!(
                        "note: {} messages were dropped for this slow client",
                        msg["count"]
                    );
                    continue;
                }
                Some("resync_required") => {
                    eprintln!("note: the server no longer has everything since our last seq");
                    continue;
                }
                _ => continue,
            }
            let from = msg["from"].as_str().unwrap_or("?").to_string();
            let to = msg["to"].as_str().unwrap_or("(none)").to_string();
            println!("{from} -> {to}: {}", msg["payload"]);
            buffers.entry(from).or_default().outbox.push(msg.clone());
            buffers.entry(to).or_default().inbox.push(msg);
            seen += 1;
            if limit.is_some_and(|n| seen >= n) {
                break 'connect;
            }
        }
        if limit.is_none() {
            // The server went away; a real client would back off before reconnecting.
            continue 'connect;
        }
        break;
    }

    for (agent, b) in &buffers {
        println!("\n== {agent}: {} in, {} out", b.inbox.len(), b.outbox.len());
        for m in &b.inbox {
            println!("  <- {} {}", m["from"], m["payload"]);
        }
        for m in &b.outbox {
            println!("  -> {} {}", m["to"], m["payload"]);
        }
    }
    Ok(())
}
