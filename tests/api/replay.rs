//! `/ws/messages?since=` from before the event ring: the messages missed come back from the
//! store, each once and in order, then live ones; a gap the store cannot give whole is
//! `resync_required` as before.

use std::collections::HashSet;

use crate::common::*;
use agentserver::api::ApiOptions;
use agentserver::Organism;
use serde_json::Value;

/// The chain a → b → c with a store file and a ring of 1,024 events, served.
struct Server {
    s: Served,
}

impl std::ops::Deref for Server {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.s
    }
}

async fn served(limits: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!(
        "organism: {{name: replay, store: data.db}}\nlimits: {{{limits}}}\nlisteners:\n{CHAIN}\n"
    );
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let organism = Organism::builder()
        .event_capacity(1024)
        .load(&dir.path().join("o.yaml"))
        .unwrap();
    Server {
        s: Served::over(organism, dir, ApiOptions::default()).await,
    }
}

/// Injects `n` threads one after another and waits until every one is completed.
async fn threads(s: &Served, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(s.inject_note("a", &format!("gap {i}")).await);
    }
    for t in &ids {
        settle(&s.organism, t).await;
    }
    ids
}

/// `message` frames read until `want` distinct ids have come (failing on a duplicate, a
/// `dropped` or a `resync_required`).
async fn messages(ws: &mut Ws, want: usize) -> Vec<Value> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while seen.len() < want {
        let f = next_json(ws).await;
        match f["event"].as_str() {
            Some("message") => {
                assert!(seen.insert(f["id"].to_string()), "twice: {f}");
                out.push(f);
            }
            Some("message_status") => {}
            _ => panic!("unexpected frame: {f}"),
        }
    }
    out
}

#[tokio::test]
async fn a_reconnect_from_past_the_ring_gets_every_message_missed_once_then_live_ones() {
    let s = served("").await;
    let mut ws = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut ws).await; // connected
    threads(&s, 1).await;
    let first = messages(&mut ws, 3).await;
    let since = first
        .iter()
        .map(|f| f["seq"].as_u64().unwrap())
        .max()
        .unwrap();
    drop(ws);

    let missed = threads(&s, 300).await;
    let head = s.organism.events().last_seq();
    assert!(
        head - since > 4 * 1024,
        "the ring has moved past the client"
    );

    let mut ws = ws_connect(&s.ws_url(&format!("/ws/messages?since={since}"))).await;
    let back = messages(&mut ws, 900).await;
    let seqs: Vec<u64> = back.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order");
    assert!(seqs[0] > since);
    let threads: HashSet<&str> = back
        .iter()
        .map(|f| f["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(threads, missed.iter().map(String::as_str).collect());
    // Each as it is now: handled.
    assert!(
        back.iter().all(|f| f["status"] == "delivered"),
        "{:?}",
        back[0]
    );

    // Then live, with nothing more from before.
    let live = s.inject_note("a", "after").await;
    let next = messages(&mut ws, 3).await;
    assert!(
        next.iter().all(|f| f["thread_id"] == live.as_str()),
        "{next:?}"
    );
}

#[tokio::test]
async fn a_filtered_reconnect_gets_only_what_its_filter_matches() {
    let s = served("").await;
    let since = s.organism.events().last_seq();
    threads(&s, 300).await;
    let mut ws = ws_connect(&s.ws_url(&format!("/ws/messages?since={since}&agents=c"))).await;
    let back = messages(&mut ws, 300).await;
    assert!(back.iter().all(|f| f["to"] == "c"), "{:?}", back[0]);
}

#[tokio::test]
async fn a_gap_larger_than_a_replay_holds_is_resync_required() {
    let s = served("max_replay_messages: 100").await;
    let since = s.organism.events().last_seq();
    threads(&s, 300).await;
    let mut ws = ws_connect(&s.ws_url(&format!("/ws/messages?since={since}"))).await;
    let first = next_json(&mut ws).await;
    assert_eq!(first["event"], "resync_required", "{first}");
    assert_eq!(next_json(&mut ws).await["event"], "connected");
}
