//! The inbox's boundary, tried as the attacker: the other tenant (every route, and the event
//! stream), the tenant's viewer, the credential that started the thread (four eyes), an
//! operator a gate does not name, and a tenant's admin reaching for the organism's inputs.

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::config::Role;
use agentserver::Organism;
use serde_json::{json, Value};

use super::common::{http, next_json, TEST_XSD};

struct Inbox {
    _organism: Organism,
    _server: ApiServer,
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Inbox {
    async fn send(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self
            .http
            .request(m, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        self.send("GET", path, key, None).await
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, key, Some(body)).await
    }

    /// Injects a Note to `to` as `key`; the open input it makes.
    async fn held(&self, to: &str, key: &str) -> Value {
        let (code, body) = self
            .post(
                "/api/v1/inject",
                key,
                json!({"to": to, "payload_xml": "<Note>pay</Note>"}),
            )
            .await;
        assert_eq!(code, 202, "{body}");
        let thread = body["thread_id"].as_str().unwrap().to_string();
        let (code, page) = self
            .get(&format!("/api/v1/inputs?thread={thread}"), key)
            .await;
        assert_eq!(code, 200, "{page}");
        page["items"][0].clone()
    }
}

const KEYS: [(&str, Role, Option<&str>); 8] = [
    ("acme-op", Role::Operator, Some("acme")),
    ("acme-op2", Role::Operator, Some("acme")),
    ("acme-viewer", Role::Viewer, Some("acme")),
    ("acme-admin", Role::Admin, Some("acme")),
    ("globex-op", Role::Operator, Some("globex")),
    ("op", Role::Operator, None),
    ("boss", Role::Operator, None),
    ("admin", Role::Admin, None),
];

async fn inbox() -> (Inbox, std::collections::HashMap<&'static str, String>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let note = "schema: t.xsd, accepts: [Note]";
    let yaml = format!(
        "organism:\n  name: inbox\n  store: inbox.db\nauth: {{methods: [keys]}}\nlisteners:
  - {{name: acme-pay, description: d, kind: native, handler: sink, {note}, tenant: acme, approval: {{approvers: {{distinct_from_sender: true}}}}}}
  - {{name: globex-pay, description: d, kind: native, handler: sink, {note}, tenant: globex, approval: {{}}}}
  - {{name: o-pay, description: d, kind: native, handler: sink, {note}, approval: {{approvers: {{keys: [boss]}}}}}}
"
    );
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = super::common::keys_for(&config, &KEYS);
    let organism = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let inbox = Inbox {
        _organism: organism,
        _server: server,
        base,
        http: http(),
        _dir: dir,
    };
    (inbox, keys)
}

#[tokio::test]
async fn the_other_tenant_cannot_see_or_decide_an_input_by_any_route() {
    let (s, k) = inbox().await;
    let input = s.held("acme-pay", &k["acme-op"]).await;
    let id = input["id"].as_str().unwrap();
    let thread = input["thread_id"].as_str().unwrap();
    let globex = &k["globex-op"];
    for query in [
        "".to_string(),
        "?status=open".to_string(),
        format!("?thread={thread}"),
        "?listener=acme-pay".to_string(),
    ] {
        let (code, page) = s.get(&format!("/api/v1/inputs{query}"), globex).await;
        assert_eq!(code, 200, "{page}");
        assert_eq!(page["total"], 0, "{query}: {page}");
    }
    let (code, _) = s.get(&format!("/api/v1/inputs/{id}"), globex).await;
    assert_eq!(code, 404);
    for verb in ["approve", "reject"] {
        for body in [json!({}), json!({"payload_xml": "<Note>mine</Note>"})] {
            if verb == "reject" && body != json!({}) {
                continue;
            }
            let (code, answer) = s
                .post(&format!("/api/v1/inputs/{id}/{verb}"), globex, body)
                .await;
            assert_eq!(code, 404, "{verb}: {answer}");
            assert!(!answer.to_string().contains("acme"), "{answer}");
        }
    }
    let (code, _) = s
        .post(
            &format!("/api/v1/threads/{thread}/abort"),
            globex,
            json!({}),
        )
        .await;
    assert_eq!(code, 404, "nor abort its thread");
    // Still open for its own tenant.
    let (_, i) = s
        .get(&format!("/api/v1/inputs/{id}"), &k["acme-viewer"])
        .await;
    assert_eq!(i["status"], "open");

    // A tenant's admin does not reach the organism's own inputs either.
    let own = s.held("o-pay", &k["op"]).await;
    let own_id = own["id"].as_str().unwrap();
    let (code, _) = s
        .post(
            &format!("/api/v1/inputs/{own_id}/approve"),
            &k["acme-admin"],
            json!({}),
        )
        .await;
    assert_eq!(code, 404);
    let (_, page) = s.get("/api/v1/inputs", &k["acme-admin"]).await;
    assert_eq!(page["total"], 1, "only acme's: {page}");
}

#[tokio::test]
async fn viewers_read_four_eyes_hold_and_a_gate_names_its_approvers() {
    let (s, k) = inbox().await;
    let input = s.held("acme-pay", &k["acme-op"]).await;
    let id = input["id"].as_str().unwrap();
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            &k["acme-viewer"],
            json!({}),
        )
        .await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            &k["acme-op"],
            json!({}),
        )
        .await;
    assert_eq!(code, 403, "the one who asked cannot approve: {body}");
    assert_eq!(body["error"]["code"], "not_an_approver");
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            &k["acme-op2"],
            json!({}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decided_by"], "key:acme-op2");

    let own = s.held("o-pay", &k["op"]).await;
    let own_id = own["id"].as_str().unwrap();
    for who in ["op", "admin"] {
        let (code, body) = s
            .post(
                &format!("/api/v1/inputs/{own_id}/reject"),
                &k[who],
                json!({}),
            )
            .await;
        assert_eq!(code, 403, "{who} is not named by the gate: {body}");
        assert_eq!(body["error"]["code"], "not_an_approver");
    }
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{own_id}/reject"),
            &k["boss"],
            json!({"reason": "no"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn the_event_stream_shows_a_tenant_only_its_own_inputs() {
    let (s, k) = inbox().await;
    let url = format!("{}/ws", s.base.replacen("http://", "ws://", 1));
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        url.as_str(),
    )
    .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", k["globex-op"]).parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let _connected = next_json(&mut ws).await;
    s.held("acme-pay", &k["acme-op"]).await;
    let mine = s.held("globex-pay", &k["globex-op"]).await;
    loop {
        let f = next_json(&mut ws).await;
        if f["event"] == "input_requested" {
            assert_eq!(
                f["input"]["id"], mine["id"],
                "acme's input never shows: {f}"
            );
            break;
        }
        assert!(!f.to_string().contains("acme"), "{f}");
    }
}

/// Rejects the first open input of `thread`, as an organism-wide operator.
fn reject_first_input(o: &Organism, thread: &str) {
    let filter = agentserver::threads::InputFilter {
        thread: Some(thread.to_string()),
        ..Default::default()
    };
    let page = agentserver::threads::Page {
        limit: 10,
        offset: 0,
    };
    let open = o.inputs().list(&filter, page).unwrap().items;
    let who = agentserver::pump::Decider {
        name: None,
        role: Role::Operator,
        tenant: None,
    };
    let verdict = agentserver::pump::Verdict::Reject { reason: None };
    o.inputs().decide(&open[0].id, &who, verdict).unwrap();
}

#[tokio::test]
async fn a_tenants_inbox_quotas_are_its_own_and_named_when_reached() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let note = "schema: t.xsd, accepts: [Note]";
    let yaml = format!(
        "organism:\n  name: quotas\n  store: memory\ntenants:\n  acme: {{max_open_inputs: 3, max_waiting_threads: 2}}\nlisteners:
  - {{name: acme-pay, description: d, kind: native, handler: sink, {note}, tenant: acme, approval: {{}}}}
  - {{name: globex-pay, description: d, kind: native, handler: sink, {note}, tenant: globex, approval: {{}}}}
"
    );
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let send = |to: &str, thread: Option<&str>| {
        o.inject(agentserver::InjectRequest {
            from: "api".into(),
            to: to.into(),
            payload_xml: "<Note>x</Note>".into(),
            thread_id: thread.map(str::to_string),
        })
    };
    let first = send("acme-pay", None).unwrap();
    send("acme-pay", None).unwrap();
    // A third waiting thread is one too many...
    let e = send("acme-pay", None).unwrap_err().to_string();
    assert!(e.contains("tenants.acme.max_waiting_threads"), "{e}");
    // ...but a thread that already waits may hold one more, up to the inputs' quota.
    send("acme-pay", Some(&first.thread_id)).unwrap();
    let e = send("acme-pay", Some(&first.thread_id))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tenants.acme.max_open_inputs"), "{e}");
    // Another tenant is not held back by acme's backlog.
    for _ in 0..3 {
        send("globex-pay", None).unwrap();
    }
    assert_eq!(o.inputs().open_count(), 6);
    // A decision frees its place: acme may hold one more again.
    reject_first_input(&o, &first.thread_id);
    send("acme-pay", Some(&first.thread_id)).unwrap();
    let e = send("acme-pay", None).unwrap_err().to_string();
    assert!(e.contains("tenants.acme."), "still at its quotas: {e}");
}

/// A tenant's held payloads are bounded by bytes on their own (`max_held_bytes`), so one
/// tenant holding large payloads cannot take the organism's `limits.max_held_bytes` from
/// the others.
#[tokio::test]
async fn a_tenants_held_payloads_are_bounded_by_bytes_and_named_when_reached() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let note = "schema: t.xsd, accepts: [Note]";
    let yaml = format!(
        "organism:\n  name: quotas\n  store: memory\ntenants:\n  acme: {{max_held_bytes: 250}}\nlisteners:
  - {{name: acme-pay, description: d, kind: native, handler: sink, {note}, tenant: acme, approval: {{}}}}
  - {{name: globex-pay, description: d, kind: native, handler: sink, {note}, tenant: globex, approval: {{}}}}
"
    );
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    // Payloads of 100 bytes.
    let payload = format!("<Note>{}</Note>", "x".repeat(100 - 13));
    assert_eq!(payload.len(), 100);
    let send = |to: &str| {
        o.inject(agentserver::InjectRequest {
            from: "api".into(),
            to: to.into(),
            payload_xml: payload.clone(),
            thread_id: None,
        })
    };
    let first = send("acme-pay").unwrap();
    send("acme-pay").unwrap();
    let e = send("acme-pay").unwrap_err().to_string();
    assert!(
        e.contains("200 bytes of payloads of tenant `acme`")
            && e.contains("tenants.acme.max_held_bytes"),
        "{e}"
    );
    // Another tenant is not held back (its default is 16 MiB).
    for _ in 0..5 {
        send("globex-pay").unwrap();
    }
    // A decision frees its bytes.
    reject_first_input(&o, &first.thread_id);
    send("acme-pay").unwrap();
}
