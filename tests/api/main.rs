//! The API over real sockets: REST, WebSocket streams, connection limits, what a web page may
//! not do, the documents held still, and hostile input.
//! One test binary: these share their set-up, and one link serves them all.

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod causes;
mod conn;
mod fork;
mod hostile_input;
mod idempotency;
mod labels;
mod origins;
mod replay;
mod rest;
mod rewind;
mod shapes;
mod stream;
mod thread_pause;
mod ws;

use agentserver::api::ApiOptions;
use agentserver::Organism;
use common::{serve_with, Served, CHAIN};

/// The chain a → b → c served with the API's defaults.
async fn chain() -> Served {
    serve_with(Organism::builder(), "", CHAIN, ApiOptions::default()).await
}

/// The chain served with each stream client's queue at `frames` frames and `bytes` bytes and
/// room for 100,000 pending messages, so that a reader that does not read overflows it.
async fn chain_with_small_queues(frames: usize, bytes: usize) -> Served {
    let options = ApiOptions {
        client_queue: frames,
        client_queue_bytes: bytes,
        ..ApiOptions::default()
    };
    serve_with(
        Organism::builder(),
        "  max_pending_messages: 100000",
        CHAIN,
        options,
    )
    .await
}

/// `o` served on 127.0.0.1:0: the organism, the server and its base URL.
async fn bound(o: Organism) -> (Organism, agentserver::api::ApiServer, String) {
    let server = agentserver::api::ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .expect("server binds");
    let base = format!("http://{}", server.local_addr());
    (o, server, base)
}

/// POSTs `body` as JSON to `base` + `path`: the status and the JSON answer (`null` if none).
async fn post(base: &str, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = common::http()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("POST");
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(serde_json::Value::Null))
}
