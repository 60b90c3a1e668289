//! A tiny external agent for `organisms/external-echo.yaml`: an HTTP server that takes the
//! pump's deliveries on `POST /input` (answering 202 at once) and replies to each a moment
//! later by calling the delivery's `callback_url` with an `<Answer>` payload.
//!
//! Run: `ECHO_TOKEN=demo cargo run --example external_echo [-- 127.0.0.1:8769]`

use axum::http::StatusCode;
use axum::routing::post;
use axum::Json;
use serde_json::Value;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Answers one delivery through its callback.
async fn answer(http: reqwest::Client, token: Option<String>, delivery: Value) {
    let Some(callback) = delivery["callback_url"].as_str() else {
        eprintln!("delivery without callback_url: {delivery}");
        return;
    };
    // The typed JSON view of `<Question><text>…</text></Question>` is `{"text": "…"}`.
    let question = delivery["payload"]["text"].as_str().unwrap_or("");
    let body = format!(
        "<Answer><text>you asked: {}</text><by>external_echo</by></Answer>",
        escape(question)
    );
    let mut request = http
        .post(callback)
        .header("content-type", "application/xml")
        .body(body);
    if let Some(t) = &token {
        request = request.bearer_auth(t);
    }
    match request.send().await {
        Ok(r) => println!(
            "replied in thread {}: {} {}",
            delivery["thread_id"],
            r.status(),
            r.text().await.unwrap_or_default()
        ),
        Err(e) => eprintln!("callback failed: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8769".to_string());
    let token = std::env::var("ECHO_TOKEN").ok().filter(|t| !t.is_empty());
    let http = agentserver::outbound::http_client()
        .unwrap()
        .build()
        .unwrap();
    let app = axum::Router::new().route(
        "/input",
        post(move |Json(delivery): Json<Value>| {
            let (http, token) = (http.clone(), token.clone());
            async move {
                println!(
                    "delivery {} from {}: {}",
                    delivery["message_id"], delivery["from"], delivery["payload_xml"]
                );
                // Accept now, answer later: the pump shows this agent as `waiting`.
                tokio::spawn(answer(http, token, delivery));
                StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "external_echo listening on http://{}/input",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}
