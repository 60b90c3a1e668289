//! The API's documents held still: the served OpenAPI document, and the JSON shape of every
//! REST answer and WebSocket frame a typed thread produces, compared with the files in
//! `tests/fixtures/`. A change to either is a change of the API: make it on purpose and
//! write the new files with `AGENTSERVER_BLESS=1 cargo test --test api shapes`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compares `actual` with the fixture `name`, or writes it when blessing.
fn same_as_fixture(name: &str, actual: &Value) {
    let path = fixture(name);
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("AGENTSERVER_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write it with AGENTSERVER_BLESS=1)",
                path.display()
            )
        }))
        .unwrap();
    if &expected != actual {
        let got = path.with_extension("actual.json");
        std::fs::write(&got, &text).unwrap();
        panic!(
            "{} differs from what the server produces now (written to {}; diff them, and bless \
             with AGENTSERVER_BLESS=1 if the change is meant)",
            path.display(),
            got.display()
        );
    }
}

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Ping"><xs:complexType><xs:sequence>
    <xs:element name="n" type="xs:int"/>
    <xs:element name="ok" type="xs:boolean"/>
    <xs:element name="tag" type="xs:string" maxOccurs="unbounded"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

/// a → b over a typed `Ping`, with the SQLite store, so the history comes both from memory
/// (a thread the organism holds) and from the file (`/messages`).
async fn serve() -> (Organism, ApiServer, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), XSD).unwrap();
    let yaml = format!(
        "organism:\n  name: shapes\n  store: {}\nlisteners:\n  \
         - {{name: a, description: first, kind: native, handler: forward, schema: t.xsd, config: {{to: b}}}}\n  \
         - {{name: b, description: last, kind: native, handler: sink, schema: t.xsd}}\n",
        dir.path().join("shapes.db").display()
    );
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    let organism = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    (organism, server, base, dir)
}

/// Keys whose text changes from run to run.
const VOLATILE: [&str; 12] = [
    "current_thread",
    "of",
    "request_id",
    "conn",
    "id",
    "thread_id",
    "parent_id",
    "message_id",
    "timestamp",
    "created_at",
    "last_activity",
    "started_at",
];

/// The shape of a JSON value: objects keep their keys, arrays the shapes of their items
/// (each distinct one once), numbers and booleans their type, texts their value (so enum
/// values and payloads are held too) except under a [`VOLATILE`] key or when they name the
/// temporary directory.
fn shape(v: &Value, dir: &str) -> Value {
    shape_at(v, "", dir)
}

fn shape_at(v: &Value, key: &str, dir: &str) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), shape_at(x, k, dir)))
                .collect(),
        ),
        Value::Array(items) => {
            let mut seen: Vec<Value> = Vec::new();
            for s in items.iter().map(|x| shape_at(x, key, dir)) {
                if !seen.contains(&s) {
                    seen.push(s);
                }
            }
            seen.sort_by_key(|s| s.to_string());
            Value::Array(seen)
        }
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(n) if n.is_f64() => json!("float"),
        Value::Number(_) => json!("integer"),
        Value::String(_) if VOLATILE.contains(&key) => json!("string"),
        Value::String(t) => json!(t.replace(dir, "$DIR")),
    }
}

#[tokio::test]
async fn the_openapi_document_is_the_one_in_the_fixture() {
    let (_o, server, _base, _dir) = serve().await;
    let doc: Value = serde_json::from_str(server.openapi_json()).unwrap();
    same_as_fixture("openapi.json", &doc);
}

#[tokio::test]
async fn every_answer_and_frame_of_a_typed_thread_keeps_its_shape() {
    let (organism, _server, base, dir) = serve().await;
    let dir = dir.path().display().to_string();
    let ws_base = base.replacen("http://", "ws://", 1);
    let mut events = ws_connect(&format!("{ws_base}/ws")).await;
    let mut messages = ws_connect(&format!("{ws_base}/ws/messages")).await;
    let http = http();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let r = http.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            // `/agents/{name}/schema` answers the XSD itself.
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (status, body)
        }
    };

    let payload = "<Ping><n>7</n><ok>true</ok><tag>x</tag><tag>y</tag></Ping>";
    let r = http
        .post(format!("{base}/api/v1/inject"))
        .json(&json!({"to": "a", "payload_xml": payload}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let receipt: Value = r.json().await.unwrap();
    let thread = receipt["thread_id"].as_str().unwrap().to_string();
    settle(&organism, &thread).await;
    // Every frame until the thread's completion, by event name: every distinct shape.
    let mut frames: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let done = |v: &Value| v["event"] == "thread_updated" && v["status"] == "completed";
    let delivered = |v: &Value| v["status"] == "delivered" && v["to"] == "b";
    let read = [
        ("/ws", read_until(&mut events, done).await),
        (
            "/ws/messages",
            fold_statuses(read_until(&mut messages, delivered).await),
        ),
    ];
    for (stream, seen) in read {
        for v in seen {
            let entry = frames
                .entry(format!("{stream} {}", v["event"].as_str().unwrap()))
                .or_default();
            let s = shape(&v, &dir);
            if !entry.contains(&s) {
                entry.push(s);
            }
        }
    }
    for shapes in frames.values_mut() {
        shapes.sort_by_key(|s| s.to_string());
    }

    // An inject the gate refuses: its 422 is part of the contract too.
    let refused = http
        .post(format!("{base}/api/v1/inject"))
        .json(&json!({"to": "a", "payload_xml": "<Ping><n>x</n></Ping>"}))
        .send()
        .await
        .unwrap();
    let refused = (
        refused.status().as_u16(),
        refused.json::<Value>().await.unwrap(),
    );

    let mut answers = BTreeMap::new();
    answers.insert("POST /api/v1/inject".to_string(), shape(&receipt, &dir));
    answers.insert(
        "POST /api/v1/inject (422)".to_string(),
        json!([refused.0, shape(&refused.1, &dir)]),
    );
    for path in [
        "/api/v1/organism".to_string(),
        "/api/v1/organism/config".to_string(),
        "/api/v1/agents".to_string(),
        "/api/v1/agents/a".to_string(),
        "/api/v1/agents/a/config".to_string(),
        "/api/v1/agents/a/schema".to_string(),
        "/api/v1/agents/a/fields".to_string(),
        "/api/v1/threads".to_string(),
        format!("/api/v1/threads/{thread}"),
        format!("/api/v1/threads/{thread}/messages"),
        "/api/v1/messages".to_string(),
        "/healthz".to_string(),
    ] {
        let (status, body) = get(path.clone()).await;
        let key = path.replace(&thread, "{id}");
        answers.insert(key, json!([status, shape(&body, &dir)]));
    }
    same_as_fixture(
        "json_shapes.json",
        &json!({"frames": frames, "answers": answers}),
    );
}
