//! What a `kind: llm` listener costs beyond a Lua hop: one thread at a time, inject → the
//! listener answers the sender → the thread is done, for an LLM listener whose model (an
//! OpenAI-compatible server on a local socket, in this process) answers at once, against a
//! Lua listener that answers the same. Alternating rounds (A B A B …, the first side
//! swapped each round), MESSAGES threads a side a round. Prints each side's p50/p99 in ms
//! and the p50 difference (the LLM call's own cost: the conversation, the HTTP round trip
//! to the server, reading its answer, the reply written as XML).
//!
//! Run: `cargo run --release --example llm_overhead -- [MESSAGES] [ROUNDS]` (default 1000,
//! 6).

use std::time::{Duration, Instant};

use agentserver::{InjectRequest, Organism};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Task"><xs:complexType><xs:sequence>
    <xs:element name="goal" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

const LUA: &str = r#"function handle(payload, meta)
  return { to = meta.from, type = "Answer", payload = { text = "ok" } }
end
"#;

/// A model server that answers every call at once.
async fn model() -> String {
    let answer = serde_json::json!({
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1}
    })
    .to_string();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let a = answer.clone();
            async move { ([("content-type", "application/json")], a) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

fn organism(dir: &std::path::Path, url: &str) -> Organism {
    std::fs::write(dir.join("t.xsd"), XSD).unwrap();
    std::fs::write(dir.join("answer.lua"), LUA).unwrap();
    let yaml = format!(
        "organism: {{name: overhead, store: memory}}
models:
  m: {{base_url: '{url}', model: fake}}
listeners:
  - {{name: think, description: answers, kind: llm, model: m, system: Answer ok., schema: t.xsd, accepts: [Task], reply: {{type: Answer, text_field: text}}}}
  - {{name: lua, description: answers, kind: lua, script: answer.lua, schema: t.xsd, accepts: [Task]}}
"
    );
    std::fs::write(dir.join("o.yaml"), yaml).unwrap();
    Organism::builder().load(&dir.join("o.yaml")).unwrap()
}

fn ms(mut v: Vec<Duration>, q: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(6);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let url = model().await;
        let o = organism(dir.path(), &url);
        let (mut llm, mut lua) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for side in [r % 2, 1 - r % 2] {
                let to = if side == 0 { "think" } else { "lua" };
                for i in 0..messages {
                    let t = Instant::now();
                    let sent = o
                        .inject(InjectRequest {
                            from: "api".into(),
                            to: to.into(),
                            payload_xml: format!("<Task><goal>task {i}</goal></Task>"),
                            thread_id: None,
                        })
                        .unwrap();
                    o.history().wait_thread(&sent.thread_id).await;
                    let took = t.elapsed();
                    // The first round warms both up.
                    if r > 0 {
                        if side == 0 {
                            llm.push(took);
                        } else {
                            lua.push(took);
                        }
                    }
                }
            }
        }
        let (llm50, lua50) = (ms(llm.clone(), 0.5), ms(lua.clone(), 0.5));
        println!(
            "{}",
            serde_json::json!({
                "threads_per_side": llm.len(),
                "llm_p50_ms": llm50, "llm_p99_ms": ms(llm, 0.99),
                "lua_p50_ms": lua50, "lua_p99_ms": ms(lua, 0.99),
                "llm_beyond_lua_p50_ms": llm50 - lua50,
            })
        );
        o.stop().await;
    });
}
