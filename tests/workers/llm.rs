//! A `kind: llm` listener on a worker: its calls are accounted by the pump from the result
//! it takes, once however often the result comes; its tenant's budget is held by the pump
//! before a delivery goes, and a delivery that would pass it never reaches a worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_nats::jetstream::{self, consumer::pull};

use super::*;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Task"><xs:complexType><xs:sequence>
    <xs:element name="goal" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Answer"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

/// An OpenAI-compatible server that answers every call with text and 300 + 50 tokens, and
/// counts the calls.
async fn model_server() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                axum::Json(serde_json::json!({
                    "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "done"}}],
                    "usage": {"prompt_tokens": 300, "completion_tokens": 50}
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), calls)
}

fn task(goal: &str) -> String {
    format!("<Task><goal>{goal}</goal></Task>")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_llm_listener_on_a_worker_is_accounted_once_and_held_to_its_tenants_budget() {
    let nats = Nats::start();
    let (url, calls) = model_server().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let path = dir.path().join("o.yaml");
    let prefix = nats.prefix();
    std::fs::write(
        &path,
        format!(
            "organism:
  name: llm-on-workers
  store: data.db
  nats: {{url: {nats_url}, stream_prefix: {prefix}, ack_wait_ms: 1000, deliver_timeout_ms: 20000}}
tenants:
  acme: {{tokens_per_day: 1000}}
models:
  m: {{base_url: '{url}', model: test-model, timeout_ms: 5000, price: {{input_per_mtok: 1000000, output_per_mtok: 2000000}}}}
listeners:
  - {{name: planner, description: plans, kind: llm, model: m, system: s, schema: p.xsd, accepts: [Task], reply: {{type: Answer, text_field: text}}, tenant: acme, placement: workers, limits: {{max_tokens: 400}}}}
",
            nats_url = nats.url(),
        ),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();

    // A real worker calls the model; the pump accounts what it reported.
    let (w, w_lines) = worker_of(&path, "planner", "w1");
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;
    let mut events = o.events().subscribe();
    let first = inject(&o, "planner", &task("a"), None);
    assert_eq!(settle(&o, &first.thread_id).await, ThreadStatus::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let replies = messages(&o, &first.thread_id);
    assert!(
        replies
            .iter()
            .any(|m| m.from.as_ref() == "planner" && m.payload_xml.contains("done")),
        "{replies:?}"
    );
    stop_worker(w, w_lines);

    // The same result taken twice (NATS redelivered, or a worker answered twice): its
    // calls are accounted once.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let second = inject(&o, "planner", &task("b"), None);
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(format!("{prefix}_work"))
        .await
        .unwrap()
        .get_or_create_consumer(
            "work-planner",
            pull::Config {
                durable_name: Some("work-planner".into()),
                filter_subject: format!("{prefix}.work.planner"),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let msg = consumer
        .batch()
        .max_messages(1)
        .expires(std::time::Duration::from_secs(10))
        .messages()
        .await
        .unwrap()
        .next()
        .await
        .unwrap()
        .unwrap();
    let item: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(item["thread_id"], second.thread_id.to_string());
    let result = serde_json::to_vec(&serde_json::json!({
        "message_id": item["message_id"],
        "nonce": item["nonce"],
        "worker": "twice",
        "outputs": [],
        "usage": [{"model": "m", "input_tokens": 300, "output_tokens": 50}],
    }))
    .unwrap();
    for id in ["r1", "r2"] {
        js.send_publish(
            format!("{prefix}.results"),
            jetstream::message::PublishMessage::build()
                .payload(result.clone().into())
                .message_id(id),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    msg.ack().await.unwrap();
    assert_eq!(settle(&o, &second.thread_id).await, ThreadStatus::Completed);
    wait_until_async("the second result read, for no open delivery", || async {
        o.metrics().worker_results().1 >= 1
    })
    .await;

    // 700 of 1,000 used: a third delivery may take about 400 more, so it never goes.
    let third = inject(&o, "planner", &task("c"), None);
    assert_eq!(settle(&o, &third.thread_id).await, ThreadStatus::Error);
    let failed = messages(&o, &third.thread_id);
    let error = failed[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("budget: tenants.acme.tokens_per_day (1000 tokens) reached"),
        "{failed:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let mut usage = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let agentserver::events::EventKind::Usage(u) = &ev.kind {
            usage.push((
                u.message_id.to_string(),
                u.tenant.clone(),
                u.input_tokens,
                u.output_tokens,
                u.cost_micros,
            ));
        }
    }
    // 1 and 2 units a token, in millionths.
    let cost = (300 + 2 * 50) * 1_000_000;
    assert_eq!(
        usage,
        vec![
            (
                first.message_id.to_string(),
                Some("acme".to_string()),
                300,
                50,
                cost
            ),
            (
                second.message_id.to_string(),
                Some("acme".to_string()),
                300,
                50,
                cost
            ),
        ]
    );
    o.stop().await;
    drop(o);
    let mut store = None;
    wait_until_async("the store let go", || {
        store = agentserver::store::Store::open(&dir.path().join("data.db")).ok();
        std::future::ready(store.is_some())
    })
    .await;
    let store = store.unwrap();
    let rows = store
        .usage(&agentserver::store::usage::UsageQuery::default())
        .unwrap();
    assert_eq!(
        (rows.len(), rows[0].calls, rows[0].input_tokens),
        (1, 2, 600),
        "kept once each"
    );
}
