//! Retry, as an operator uses it: a Lua listener breaks, twenty messages fail, the script is
//! fixed and reloaded, one bulk retry redrives them all (the failed ones stay as they were);
//! a dry run changes nothing; a sixth retry of one chain is refused; what is not retried is
//! refused saying why; a tenant's bulk retry touches only its own.

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::config::Role;
use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::Organism;
use serde_json::{json, Value};

const BROKEN: &str = "function handle(p, meta)\n  error('broken')\nend\n";
const FIXED: &str = "function handle(p, meta)\n  return { to = 'sink', payload = p }\nend\n";

struct Rig {
    o: Organism,
    _server: ApiServer,
    base: String,
    dir: tempfile::TempDir,
    keys: std::collections::HashMap<&'static str, String>,
}

impl Rig {
    async fn post(&self, path: &str, key: &str, body: Value) -> (u16, Value) {
        let r = http()
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.keys[key])
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    std::fs::write(dir.path().join("relay.lua"), BROKEN).unwrap();
    std::fs::write(dir.path().join("other.lua"), BROKEN).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: { name: retry, store: retry.db }
auth: { methods: [keys] }
listeners:
  - { name: relay, description: relays, kind: lua, script: relay.lua, schema: t.xsd, accepts: [Note], peers: [sink] }
  - { name: sink, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note] }
  - { name: acme-relay, description: acme's, kind: lua, script: other.lua, schema: t.xsd, accepts: [Note], tenant: acme }
",
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = keys_for(
        &config,
        &[
            ("admin", Role::Admin, None),
            ("op", Role::Operator, None),
            ("acme-op", Role::Operator, Some("acme")),
        ],
    );
    let o = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    Rig {
        o,
        _server: server,
        base,
        dir,
        keys,
    }
}

/// Injects `n` notes to `to`, each in its own thread, and waits for each to end.
async fn failing(o: &Organism, to: &str, n: usize) -> Vec<String> {
    let mut threads = Vec::new();
    for i in 0..n {
        let r = inject(o, to, &format!("<Note>{to} {i}</Note>"), None);
        assert_eq!(settle(o, &r.thread_id).await, ThreadStatus::Error);
        threads.push(r.thread_id.to_string());
    }
    threads
}

#[tokio::test]
async fn after_the_fix_a_bulk_retry_redrives_every_failure_and_changes_nothing_else() {
    let r = rig().await;
    let threads = failing(&r.o, "relay", 20).await;
    let acme = failing(&r.o, "acme-relay", 3).await;
    let failed_before: Vec<_> = threads.iter().map(|t| messages(&r.o, t)).collect();

    // A dry run says what would run again, and changes nothing.
    let filter = json!({"filter": {"agent": "relay", "status": "failed"}, "limit": 50});
    let mut dry = filter.clone();
    dry["dry_run"] = json!(true);
    let (code, body) = r.post("/api/v1/messages/retry", "admin", dry).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["matched"], &body["applied"]),
        (&json!(20), &json!(20)),
        "{body}"
    );
    assert!(body["retried"][0]["message_id"].is_null());
    for (t, before) in threads.iter().zip(&failed_before) {
        assert_eq!(
            messages(&r.o, t).len(),
            before.len(),
            "a dry run sent nothing"
        );
    }

    // An organism-wide bulk retry is an admin's; a tenant's covers its own only.
    let (code, _) = r.post("/api/v1/messages/retry", "op", filter.clone()).await;
    assert_eq!(code, 403);
    let every_failure = json!({"filter": {"status": "failed"}, "dry_run": true});
    let (code, body) = r
        .post("/api/v1/messages/retry", "acme-op", every_failure)
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["matched"], 3,
        "acme's three, not the organism's twenty: {body}"
    );
    assert!(body["retried"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| acme.contains(&x["thread_id"].as_str().unwrap().to_string())));

    // Fixed and reloaded: one bulk retry, and every thread completes.
    std::fs::write(r.dir.path().join("relay.lua"), FIXED).unwrap();
    r.o.control().reload_listener("relay").unwrap();
    let (code, body) = r.post("/api/v1/messages/retry", "admin", filter).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["matched"], &body["applied"]),
        (&json!(20), &json!(20)),
        "{body}"
    );
    for (t, before) in threads.iter().zip(&failed_before) {
        assert_eq!(settle(&r.o, t).await, ThreadStatus::Completed);
        let now = messages(&r.o, t);
        // The failed message is as it was; the retry and its output follow it.
        assert_eq!(now[0].status, MessageStatus::Failed);
        assert_eq!(now[0].id, before[0].id);
        let retry = &now[1];
        assert_eq!(
            (retry.origin.kind.name(), retry.origin.of.as_deref()),
            ("retry", Some(&*before[0].id))
        );
        assert_eq!(
            (&*retry.from, retry.to.as_deref()),
            (&*before[0].from, Some("relay"))
        );
        assert_eq!(retry.parent_id, before[0].parent_id);
        assert!(now
            .iter()
            .any(|m| to_of(m) == "sink" && m.status == MessageStatus::Delivered));
    }

    // The audit log names the batch's filter and counts.
    let audit: Value = http()
        .get(format!("{}/api/v1/audit?limit=100", r.base))
        .bearer_auth(&r.keys["admin"])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["result"].as_str().is_some_and(|x| x
                .starts_with("200 matched 20, retried 20, skipped 0; status=failed agent=relay"))),
        "{audit}"
    );
}

#[tokio::test]
async fn one_message_is_retried_at_most_five_times_and_only_when_it_ended_badly() {
    let r = rig().await;
    let t = failing(&r.o, "relay", 1).await.remove(0);
    let mut last = messages(&r.o, &t)[0].id.to_string();
    for depth in 1..=5 {
        let (code, body) = r
            .post(&format!("/api/v1/messages/{last}/retry"), "op", json!({}))
            .await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["depth"], depth);
        settle(&r.o, &t).await;
        last = body["message_id"].as_str().unwrap().to_string();
    }
    let (code, body) = r
        .post(&format!("/api/v1/messages/{last}/retry"), "op", json!({}))
        .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("retry_limit")),
        "{body}"
    );

    // The first try, retried already, is not again: its chain is.
    let (code, body) = r
        .post(
            &format!("/api/v1/messages/{}/retry", messages(&r.o, &t)[0].id),
            "op",
            json!({}),
        )
        .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("already_retried")),
        "{body}"
    );
    // A message that did not end badly, one unknown, one another tenant's.
    let delivered = failing(&r.o, "relay", 0).await;
    assert!(delivered.is_empty());
    let ok = inject(&r.o, "sink", "<Note>fine</Note>", None);
    settle(&r.o, &ok.thread_id).await;
    let delivered = messages(&r.o, &ok.thread_id)[0].id.to_string();
    let (code, body) = r
        .post(
            &format!("/api/v1/messages/{delivered}/retry"),
            "op",
            json!({}),
        )
        .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("not_retryable")),
        "{body}"
    );
    let (code, _) = r
        .post("/api/v1/messages/no-such-message/retry", "op", json!({}))
        .await;
    assert_eq!(code, 404);
    let (code, _) = r
        .post(
            &format!("/api/v1/messages/{last}/retry"),
            "acme-op",
            json!({}),
        )
        .await;
    assert_eq!(code, 404, "outside acme's scope");
    // A dry run of a retryable message answers 200 and sends nothing.
    let first_failure = failing(&r.o, "acme-relay", 1).await.remove(0);
    let id = messages(&r.o, &first_failure)[0].id.to_string();
    let (code, body) = r
        .post(
            &format!("/api/v1/messages/{id}/retry"),
            "op",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(
        (code, &body["to"], &body["kind"]),
        (200, &json!("acme-relay"), &json!("lua")),
        "{body}"
    );
    assert_eq!(messages(&r.o, &first_failure).len(), 1);
    // Bounds of a bulk retry.
    for (body, at) in [
        (json!({"limit": 0}), "limit"),
        (json!({"limit": 5001}), "limit"),
        (json!({"limit": 100, "stagger_ms": 1001}), "stagger_ms"),
        (json!({"filter": {"since": "yesterday"}}), "filter.since"),
    ] {
        let (code, answer) = r
            .post("/api/v1/messages/retry", "admin", body.clone())
            .await;
        assert_eq!(
            (code, &answer["error"]["where"]),
            (400, &json!(at)),
            "{body}: {answer}"
        );
    }
    let (code, answer) = r
        .post(
            "/api/v1/messages/retry",
            "admin",
            json!({"filter": {"status": "delivered"}}),
        )
        .await;
    assert_eq!(code, 400, "a status never retried: {answer}");
}

#[tokio::test]
async fn a_websocket_client_retries_with_the_retry_command() {
    let r = rig().await;
    let t = failing(&r.o, "relay", 1).await.remove(0);
    let failed = messages(&r.o, &t)[0].id.to_string();
    let connect = |key: &str| {
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("{}/ws", r.base.replacen("http://", "ws://", 1)),
            )
            .unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        tokio_tungstenite::connect_async(req)
    };
    let (mut acme, _) = connect(&r.keys["acme-op"]).await.unwrap();
    send_json(
        &mut acme,
        json!({"cmd": "retry", "request_id": 1, "message_id": failed}),
    )
    .await;
    let answer = read_until(&mut acme, |f| f["request_id"] == 1).await;
    assert_eq!(
        answer.last().unwrap()["code"],
        "unknown_message",
        "another tenant's"
    );

    let (mut ws, _) = connect(&r.keys["op"]).await.unwrap();
    send_json(
        &mut ws,
        json!({"cmd": "retry", "request_id": 2, "message_id": failed, "dry_run": true}),
    )
    .await;
    let dry = read_until(&mut ws, |f| f["request_id"] == 2).await;
    let dry = dry.last().unwrap();
    assert_eq!(
        (&dry["event"], &dry["message_id"]),
        (&json!("ack"), &Value::Null),
        "{dry}"
    );
    send_json(
        &mut ws,
        json!({"cmd": "retry", "request_id": 3, "message_id": failed}),
    )
    .await;
    let done = read_until(&mut ws, |f| f["request_id"] == 3).await;
    let done = done.last().unwrap();
    assert_eq!(
        (&done["event"], &done["retried"]),
        (&json!("ack"), &json!(failed)),
        "{done}"
    );
    let new = done["message_id"].as_str().unwrap();
    settle(&r.o, &t).await;
    let now = messages(&r.o, &t);
    assert_eq!(&*now[1].id, new);
    assert_eq!(now[1].origin.of.as_deref(), Some(&*failed));
    send_json(
        &mut ws,
        json!({"cmd": "retry", "request_id": 4, "message_id": failed}),
    )
    .await;
    let again = read_until(&mut ws, |f| f["request_id"] == 4).await;
    assert_eq!(again.last().unwrap()["code"], "already_retried");
}

#[tokio::test]
async fn a_batch_retries_the_failures_of_the_threads_a_label_finds() {
    let r = rig().await;
    let mut threads = Vec::new();
    for i in 0..3 {
        let labels = [("run".to_string(), "nightly".to_string())].into();
        let sent =
            r.o.inject_labelled(
                agentserver::InjectRequest {
                    from: "api".into(),
                    to: "relay".into(),
                    payload_xml: format!("<Note>{i}</Note>"),
                    thread_id: None,
                },
                None,
                Some(&labels),
            )
            .unwrap();
        assert_eq!(settle(&r.o, &sent.thread_id).await, ThreadStatus::Error);
        threads.push(sent.thread_id.to_string());
    }
    let other = failing(&r.o, "relay", 1).await;
    std::fs::write(r.dir.path().join("relay.lua"), FIXED).unwrap();
    r.o.control().reload_listener("relay").unwrap();
    let batch = json!({"action": "retry_failed", "filter": {"label": ["run:nightly"]}, "expected_count": 3});
    let (code, body) = r.post("/api/v1/threads/batch", "admin", batch).await;
    assert_eq!((code, &body["applied"]), (200, &json!(3)), "{body}");
    for t in &threads {
        assert_eq!(settle(&r.o, t).await, ThreadStatus::Completed);
    }
    assert_eq!(
        messages(&r.o, &other[0]).len(),
        1,
        "a thread without the label is untouched"
    );
}

/// A failure a rewind superseded is no longer the thread's: `retry_failed` passes it by.
#[tokio::test]
async fn a_failure_a_rewind_superseded_is_not_retried() {
    let r = rig().await;
    let t = inject(&r.o, "sink", "<Note>first</Note>", None);
    settle(&r.o, &t.thread_id).await;
    inject(&r.o, "relay", "<Note>breaks</Note>", Some(&t.thread_id));
    assert_eq!(settle(&r.o, &t.thread_id).await, ThreadStatus::Error);
    let req = agentserver::pump::RewindRequest {
        to: &t.message_id,
        ..Default::default()
    };
    let (plan, _) = r.o.rewind(&t.thread_id, &req).unwrap();
    assert_eq!(plan.superseded.len(), 1);
    settle(&r.o, &t.thread_id).await;
    let why = r.o.retry_failures(&t.thread_id).unwrap_err();
    assert_eq!(why, "no failed message to retry");
}
