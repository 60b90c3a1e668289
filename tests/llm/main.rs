//! `kind: llm` listeners against an OpenAI-compatible test server on a real socket (axum,
//! scripted per test): a tool call reaches its peer as a validated message; a refused call
//! goes back to the model with the validator's words; past `max_rounds`, a 500 or a hang,
//! the message fails saying why; plain text is the `reply`.

#[path = "../common/mod.rs"]
mod common;

mod agents;
mod budgets;
mod settings;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentserver::threads::MessageStatus;
use agentserver::Organism;
use common::*;
use serde_json::{json, Value};

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Task"><xs:complexType><xs:sequence>
    <xs:element name="goal" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Plan"><xs:complexType><xs:sequence>
    <xs:element name="step" type="xs:string" maxOccurs="unbounded"/>
    <xs:element name="priority" type="xs:int"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Answer"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

/// What the test server answers next.
enum Next {
    Json(Value),
    /// `text/event-stream`: each chunk a `data:` event, then `[DONE]`.
    Sse(Vec<Value>),
    Status(u16, &'static str),
    Hang,
}

/// The test server: answers in turn, keeps every request body.
#[derive(Clone, Default)]
struct Fake {
    next: Arc<Mutex<VecDeque<Next>>>,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Fake {
    async fn serve(&self) -> String {
        let me = self.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let me = me.clone();
                async move {
                    me.seen.lock().unwrap().push(body);
                    let next = me.next.lock().unwrap().pop_front();
                    match next {
                        Some(Next::Json(v)) => (axum::http::StatusCode::OK, v.to_string()),
                        Some(Next::Sse(chunks)) => {
                            let mut body: String =
                                chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
                            body.push_str("data: [DONE]\n\n");
                            (axum::http::StatusCode::OK, body)
                        }
                        Some(Next::Status(s, t)) => {
                            (axum::http::StatusCode::from_u16(s).unwrap(), t.to_string())
                        }
                        Some(Next::Hang) => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            (axum::http::StatusCode::OK, String::new())
                        }
                        None => (axum::http::StatusCode::GONE, "no answer left".into()),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/v1")
    }

    fn then(&self, n: Next) -> &Self {
        self.next.lock().unwrap().push_back(n);
        self
    }

    fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

/// A chat-completions answer calling `tool` with `args`.
fn call(tool: &str, args: Value) -> Next {
    Next::Json(json!({
        "id": "c1", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": tool, "arguments": args.to_string()}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
}

fn text(t: &str) -> Next {
    Next::Json(json!({
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": t}}]
    }))
}

/// `planner` (llm, outputs Plan to its peer `worker`, replies with Answer) and `worker`.
#[tokio::test]
async fn what_a_rewind_superseded_is_not_in_the_models_context() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(text("One done."))
        .then(text("Two done."))
        .then(text("Uno done."));
    let (o, _d) = organism(&url, "    context: {history: thread, max_messages: 10}");
    let first = inject(&o, "planner", "<Task><goal>one</goal></Task>", None);
    settle(&o, &first.thread_id).await;
    let t = first.thread_id.to_string();
    inject(&o, "planner", "<Task><goal>two</goal></Task>", Some(&t));
    settle(&o, &t).await;
    // Back to the first task, edited: the rest is superseded.
    let req = agentserver::pump::RewindRequest {
        to: &first.message_id,
        payload_xml: Some("<Task><goal>uno</goal></Task>"),
        ..Default::default()
    };
    let (plan, _) = o.rewind(&t, &req).unwrap();
    assert_eq!(plan.superseded.len(), 3);
    settle(&o, &t).await;
    let third = &fake.requests()[2]["messages"];
    assert_eq!(third.as_array().unwrap().len(), 2, "{third}");
    assert!(
        third[1]["content"].as_str().unwrap().contains("uno"),
        "{third}"
    );
}

fn organism(base_url: &str, extra: &str) -> (Organism, tempfile::TempDir) {
    organism_stored(base_url, extra, "memory")
}

fn organism_stored(base_url: &str, extra: &str, store: &str) -> (Organism, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let yaml = format!(
        "organism: {{name: llm, store: {store}}}
models:
  m: {{base_url: '{base_url}', model: test-model, timeout_ms: 2000}}
listeners:
  - name: planner
    description: plans a task
    kind: llm
    model: m
    system: You plan tasks.
    schema: p.xsd
    accepts: [Task]
    outputs: [Plan]
    peers: [worker]
    reply: {{type: Answer, text_field: text}}
{extra}
  - {{name: worker, description: does the steps, kind: native, handler: sink, schema: p.xsd, accepts: [Plan]}}
"
    );
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let o = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .unwrap();
    (o, dir)
}

/// `o` served on a port of its own.
async fn serve(o: &Organism) -> agentserver::api::ApiServer {
    agentserver::api::ApiServer::bind(
        o.clone(),
        "127.0.0.1:0",
        agentserver::api::ApiOptions::default(),
    )
    .await
    .unwrap()
}

/// Stops `server` and `o`, and opens the store file at `path` once they let it go.
async fn stopped(
    server: agentserver::api::ApiServer,
    o: Organism,
    path: &std::path::Path,
) -> agentserver::store::Store {
    server.shutdown().await;
    o.stop().await;
    drop(o);
    let mut opened = None;
    wait_until_async("the store is let go", || {
        opened = agentserver::store::Store::open(path).ok();
        std::future::ready(opened.is_some())
    })
    .await;
    opened.unwrap()
}

async fn ask(o: &Organism) -> Vec<agentserver::threads::MessageRecord> {
    let r = inject(o, "planner", "<Task><goal>ship it</goal></Task>", None);
    settle(o, &r.thread_id).await;
    messages(o, &r.thread_id)
}

#[tokio::test]
async fn a_tool_call_reaches_the_peer_as_a_validated_message() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(call(
        "send_worker__Plan",
        json!({"step": ["a", "b"], "priority": 2}),
    ));
    let (o, _d) = organism(&url, "");
    let ms = ask(&o).await;
    let plan = ms.iter().find(|m| to_of(m) == "worker").expect("a plan");
    assert_eq!(&*plan.from, "planner");
    assert_eq!(
        &**plan.payload_xml,
        "<Plan><step>a</step><step>b</step><priority>2</priority></Plan>"
    );
    assert_eq!(plan.status, MessageStatus::Delivered);
    // What the model was asked: the prompt, the task as JSON, the tool with its schema.
    let req = &fake.requests()[0];
    assert_eq!(req["model"], "test-model");
    assert_eq!(
        req["messages"][0],
        json!({"role": "system", "content": "You plan tasks."})
    );
    let user: Value =
        serde_json::from_str(req["messages"][1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        user,
        json!({"from": "api", "type": "Task", "payload": {"goal": "ship it"}})
    );
    let tool = &req["tools"][0]["function"];
    assert_eq!(tool["name"], "send_worker__Plan");
    assert_eq!(
        tool["parameters"]["properties"]["priority"],
        json!({"type": "integer"})
    );
}

#[tokio::test]
async fn a_refused_call_goes_back_to_the_model_which_corrects_it() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(call(
        "send_worker__Plan",
        json!({"step": ["a"], "priority": "high"}),
    ))
    .then(call(
        "send_worker__Plan",
        json!({"step": ["a"], "priority": 1}),
    ));
    let (o, _d) = organism(&url, "");
    let ms = ask(&o).await;
    let plans: Vec<_> = ms.iter().filter(|m| to_of(m) == "worker").collect();
    assert_eq!(plans.len(), 1, "only the corrected plan was sent");
    assert!(plans[0].payload_xml.contains("<priority>1</priority>"));
    let second = &fake.requests()[1]["messages"];
    let result = second
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the call's result");
    let said = result["content"].as_str().unwrap();
    assert!(
        said.contains("refused") && said.contains("priority"),
        "{said}"
    );
    assert_eq!(result["tool_call_id"], "call_1");
}

#[tokio::test]
async fn past_max_rounds_the_message_fails_with_the_last_refusal() {
    let fake = Fake::default();
    let url = fake.serve().await;
    for _ in 0..2 {
        fake.then(call("send_worker__Plan", json!({"priority": 1})));
    }
    let (o, _d) = organism(&url, "    limits: {max_rounds: 2}");
    let ms = ask(&o).await;
    let task = &ms[0];
    assert_eq!(task.status, MessageStatus::Failed);
    let error = task.error.as_deref().unwrap();
    assert!(
        error.contains("after 2 rounds") && error.contains("step"),
        "{error}"
    );
    assert!(ms.iter().all(|m| to_of(m) != "worker"));
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn a_tool_it_does_not_have_is_refused_and_nothing_is_sent() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(call(
        "send_outsider__Plan",
        json!({"step": ["x"], "priority": 1}),
    ))
    .then(text("sorry"));
    let (o, _d) = organism(&url, "    limits: {max_rounds: 2}");
    let ms = ask(&o).await;
    assert_eq!(ms[0].status, MessageStatus::Failed, "{:?}", ms[0].error);
    assert!(ms[0].error.as_deref().unwrap().contains("no tool named"));
    assert_eq!(ms.len(), 1, "nothing was sent: {ms:?}");
}

#[tokio::test]
async fn plain_text_is_the_reply_to_the_sender() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(text("It is done."));
    let (o, _d) = organism(&url, "");
    let ms = ask(&o).await;
    let reply = ms.iter().find(|m| to_of(m) == "api").expect("a reply");
    assert_eq!(&*reply.from, "planner");
    assert_eq!(
        &**reply.payload_xml,
        "<Answer><text>It is done.</text></Answer>"
    );
}

#[tokio::test]
async fn a_server_error_or_a_hang_fails_the_message_saying_which() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(Next::Status(500, "overloaded")).then(Next::Hang);
    let (o, _d) = organism(&url, "");
    let first = ask(&o).await;
    let e = first[0].error.as_deref().unwrap();
    assert!(e.contains("500") && e.contains("overloaded"), "{e}");
    let second = ask(&o).await;
    let e = second[0].error.as_deref().unwrap();
    assert!(e.contains("did not answer within 2000 ms"), "{e}");
}

#[test]
fn a_listener_naming_no_model_or_a_model_without_url_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let yaml = "organism: {name: llm, store: memory}
models:
  bad: {model: x}
  leaky: {base_url: 'http://127.0.0.1:1/v1', model: x, api_key: sk-live-0123456789abcdef}
listeners:
  - {name: p, description: d, kind: llm, model: nope, system: s, schema: p.xsd, accepts: [Task]}
  - {name: q, description: d, kind: native, handler: sink, schema: p.xsd, accepts: [Task], model: bad}
";
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let e = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("models.bad.base_url"), "{e}");
    assert!(e.contains("no model named `nope`"), "{e}");
    assert!(e.contains("does not apply to a native listener"), "{e}");
    assert!(
        e.contains("models.leaky.api_key") && e.contains("api_key_env"),
        "{e}"
    );
    assert!(!e.contains("sk-live"), "the secret is not repeated: {e}");
}

/// fakellm (PyPI, installed by `scripts/test`), a model server this project did not write,
/// run until dropped.
struct FakeLlm(std::process::Child);

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_third_party_fake_model_drives_a_refusal_and_its_correction_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fakellm.yaml"),
        "rules:
  - name: first
    when: {turn: 1}
    respond:
      tool_calls:
        - {name: send_worker__Plan, arguments: {step: [a], priority: high}}
  - name: corrected
    when: {turn: 2, tool_result_contains: refused}
    respond:
      tool_calls:
        - {name: send_worker__Plan, arguments: {step: [a, b], priority: 1}}
",
    )
    .unwrap();
    // A free port, handed to the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = FakeLlm(
        std::process::Command::new("python3")
            .args([
                "-c",
                "import sys; from fakellm.cli import main; sys.argv[0] = 'fakellm'; main()",
                "serve",
                "--port",
                &port.to_string(),
                "--config",
            ])
            .arg(dir.path().join("fakellm.yaml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs fakellm (scripts/test installs it with pip)"),
    );
    let base = format!("http://127.0.0.1:{port}");
    wait_until_async("fakellm serves", || async {
        http_get(format!("{base}/_fakellm/stats")).await.is_ok()
    })
    .await;
    let (o, _d) = organism(&format!("{base}/v1"), "");
    let ms = ask(&o).await;
    let plans: Vec<_> = ms.iter().filter(|m| to_of(m) == "worker").collect();
    assert_eq!(plans.len(), 1, "{ms:?}");
    assert_eq!(
        &**plans[0].payload_xml,
        "<Plan><step>a</step><step>b</step><priority>1</priority></Plan>"
    );
    assert_eq!(ms[0].status, MessageStatus::Delivered);
}

#[tokio::test]
async fn streamed_pieces_arrive_in_order_before_the_reply_and_are_never_stored() {
    let fake = Fake::default();
    let url = fake.serve().await;
    let piece = |kind: &str, t: &str| json!({"choices": [{"index": 0, "delta": {kind: t}}]});
    fake.then(Next::Sse(vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        piece("reasoning_content", "Short task."),
        piece("content", "It "),
        piece("content", "is "),
        piece("content", "done."),
        json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}),
    ]));
    let (o, _d) = organism_stored(&url, "    stream: true", "data.db");
    let server = serve(&o).await;
    let base = format!("ws://{}", server.local_addr());
    let mut ws = ws_connect(&format!("{base}/ws")).await;
    next_json(&mut ws).await;
    // A client that takes one delta a second: the rest are told as folded.
    let mut slow = ws_connect(&format!("{base}/ws?max_deltas_per_s=1")).await;
    next_json(&mut slow).await;
    let r = inject(&o, "planner", "<Task><goal>ship it</goal></Task>", None);
    let frames = read_until(&mut ws, |f| {
        f["event"] == "message" && f["message"]["to"] == "api"
    })
    .await;
    let deltas: Vec<&Value> = frames.iter().filter(|f| f["event"] == "delta").collect();
    let text: Vec<&Value> = deltas
        .iter()
        .copied()
        .filter(|f| f["kind"] == "text")
        .collect();
    let indexes: Vec<u64> = text.iter().map(|f| f["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [0, 1, 2]);
    let joined: String = text.iter().map(|f| f["delta"].as_str().unwrap()).collect();
    assert_eq!(joined, "It is done.");
    assert!(deltas.iter().all(|f| f["thread_id"] == r.thread_id.as_ref()
        && f["agent"] == "planner"
        && f["in_reply_to"] == r.message_id.as_ref()));
    let thinking: Vec<&&Value> = deltas.iter().filter(|f| f["kind"] == "thinking").collect();
    assert_eq!(thinking.len(), 1);
    // The final message is the record, and it says what the pieces said.
    let reply = frames.last().unwrap();
    assert_eq!(
        reply["message"]["payload_xml"],
        "<Answer><text>It is done.</text></Answer>"
    );
    assert_eq!(fake.requests()[0]["stream"], true);
    let slow_frames = read_until(&mut slow, |f| f["event"] == "folded").await;
    let sent = slow_frames.iter().filter(|f| f["event"] == "delta").count();
    let folded = slow_frames.last().unwrap();
    assert_eq!(folded["kind"], "delta", "{folded}");
    assert_eq!(
        sent as u64 + folded["count"].as_u64().unwrap(),
        4,
        "{slow_frames:?}"
    );
    assert_eq!(sent, 1);
    // The call and the tokens its last chunk reported, on /metrics.
    let metrics = http_get(format!("http://{}/metrics", server.local_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = |name: &str, label: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains("agent=\"planner\"") && l.contains(label))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(
        line("agentserver_llm_requests_total", "status=\"ok\"").as_deref(),
        Some("1")
    );
    assert_eq!(
        line("agentserver_llm_tokens_total", "kind=\"input\"").as_deref(),
        Some("9")
    );
    assert_eq!(
        line("agentserver_llm_tokens_total", "kind=\"output\"").as_deref(),
        Some("3")
    );
    // Nothing but messages in the thread, in memory and in the store.
    settle(&o, &r.thread_id).await;
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms.len(), 2, "{ms:?}");
    let store = stopped(server, o, &_d.path().join("data.db")).await;
    let stored = store
        .query_messages(
            &agentserver::threads::MessageFilter {
                thread: Some(r.thread_id.to_string()),
                ..Default::default()
            },
            agentserver::threads::Page::default(),
        )
        .unwrap();
    assert_eq!(stored.total, 2);
}

#[tokio::test]
async fn with_thread_history_the_model_reads_the_earlier_turns_of_the_thread() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(text("First done.")).then(text("Second done."));
    let (o, _d) = organism(&url, "    context: {history: thread, max_messages: 10}");
    let first = inject(&o, "planner", "<Task><goal>one</goal></Task>", None);
    settle(&o, &first.thread_id).await;
    let again = inject(
        &o,
        "planner",
        "<Task><goal>two</goal></Task>",
        Some(&first.thread_id),
    );
    settle(&o, &again.thread_id).await;
    let turns: Vec<(String, Value)> = fake.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                serde_json::from_str(m["content"].as_str().unwrap()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        turns,
        [
            (
                "user".to_string(),
                json!({"from": "api", "type": "Task", "payload": {"goal": "one"}})
            ),
            (
                "assistant".to_string(),
                json!({"to": "api", "type": "Answer", "payload": {"text": "First done."}})
            ),
            (
                "user".to_string(),
                json!({"from": "api", "type": "Task", "payload": {"goal": "two"}})
            ),
        ]
    );
    // The first call had nothing before it.
    assert_eq!(fake.requests()[0]["messages"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn a_tenants_model_has_no_tool_for_another_tenant_and_cannot_name_one() {
    let fake = Fake::default();
    let url = fake.serve().await;
    fake.then(call(
        "send_beta-worker__Plan",
        json!({"step": ["x"], "priority": 1}),
    ))
    .then(call(
        "send_beta-worker__Plan",
        json!({"step": ["x"], "priority": 1}),
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let yaml = format!(
        "organism: {{name: llm, store: memory}}
models:
  m: {{base_url: '{url}', model: test-model}}
listeners:
  - {{name: planner, description: plans, kind: llm, model: m, system: s, schema: p.xsd, accepts: [Task], outputs: [Plan], tenant: acme, limits: {{max_rounds: 2}}}}
  - {{name: acme-worker, description: works, kind: native, handler: sink, schema: p.xsd, accepts: [Plan], tenant: acme}}
  - {{name: beta-worker, description: works, kind: native, handler: sink, schema: p.xsd, accepts: [Plan], tenant: beta}}
  - {{name: ours, description: works, kind: native, handler: sink, schema: p.xsd, accepts: [Plan]}}
"
    );
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let o = Organism::builder()
        .load(&dir.path().join("o.yaml"))
        .unwrap();
    let ms = ask(&o).await;
    let requests = fake.requests();
    let tools: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["send_acme-worker__Plan"]);
    assert_eq!(ms[0].status, MessageStatus::Failed);
    assert!(ms[0]
        .error
        .as_deref()
        .unwrap()
        .contains("no tool named `send_beta-worker__Plan`"));
    assert_eq!(ms.len(), 1, "nothing reached another tenant: {ms:?}");
}

#[tokio::test]
async fn an_answer_too_large_or_not_one_fails_the_message_saying_which() {
    let fake = Fake::default();
    let url = fake.serve().await;
    let big = "x".repeat(agentserver::llm::MAX_ANSWER_BYTES);
    fake.then(Next::Json(
        json!({"choices": [{"message": {"content": big}}]}),
    ))
    .then(Next::Status(200, "not json"))
    .then(Next::Json(json!({"id": "no choices"})));
    let (o, _d) = organism(&url, "");
    for said in [
        format!(
            "answer is over {} bytes",
            agentserver::llm::MAX_ANSWER_BYTES
        ),
        "answer is not JSON".to_string(),
        "has no `choices[0].message`".to_string(),
    ] {
        let ms = ask(&o).await;
        assert_eq!(ms[0].status, MessageStatus::Failed);
        let e = ms[0].error.as_deref().unwrap();
        assert!(e.contains(&said), "{e}");
    }
}
