//! A thread's `settings` (`PATCH /threads/{id}`, the `/ws` `settings` command): the model
//! and temperature a listener's `overridable` lets a thread choose reach the model's server,
//! after a restart too; what it does not allow is not applied; bad values are refused where
//! they were written; a tenant is held to its models and its own threads, and sees only its
//! own threads' changes.

use agentserver::config::Role;

use super::*;

/// `planner` may have its model and temperature changed; `fixed` may not. Both answer with
/// plain text.
fn yaml(url: &str, store: &str, head: &str, tenant: &str) -> String {
    format!(
        "organism: {{name: llm, store: {store}}}
{head}models:
  m: {{base_url: '{url}', model: test-model, timeout_ms: 2000}}
  big: {{base_url: '{url}', model: big-model, timeout_ms: 2000}}
listeners:
  - {{name: planner, description: plans, kind: llm, model: m, system: s, schema: p.xsd, accepts: [Task], reply: {{type: Answer, text_field: text}}, limits: {{temperature: 0.2}}, overridable: [model, temperature]{tenant}}}
  - {{name: fixed, description: plans, kind: llm, model: m, system: s, schema: p.xsd, accepts: [Task], reply: {{type: Answer, text_field: text}}, limits: {{temperature: 0.2}}}}
"
    )
}

fn answers(fake: &Fake, n: usize) {
    for _ in 0..n {
        fake.then(text("ok"));
    }
}

/// The model and temperature of the server's `i`-th request.
fn asked(fake: &Fake, i: usize) -> (String, Value) {
    let r = &fake.requests()[i];
    (
        r["model"].as_str().unwrap().to_string(),
        r["temperature"].clone(),
    )
}

async fn patch(base: &str, thread: &str, body: Value, key: Option<&str>) -> (u16, Value) {
    let mut req = http()
        .patch(format!("{base}/api/v1/threads/{thread}"))
        .json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn again(o: &Organism, to: &str, thread: &str) {
    inject(o, to, "<Task><goal>more</goal></Task>", Some(thread));
    settle(o, thread).await;
}

#[tokio::test]
async fn a_threads_settings_reach_the_model_and_outlive_a_restart() {
    let fake = Fake::default();
    let url = fake.serve().await;
    answers(&fake, 5);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, yaml(&url, "data.db", "", "")).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let t = inject(&o, "planner", "<Task><goal>a</goal></Task>", None).thread_id;
    settle(&o, &t).await;
    assert_eq!(asked(&fake, 0), ("test-model".into(), json!(0.2)));

    let server = serve(&o).await;
    let base = format!("http://{}", server.local_addr());
    let (code, body) = patch(
        &base,
        &t,
        json!({"settings": {"model": "big", "temperature": 0.9}}),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["settings"],
        json!({"model": "big", "temperature": 0.9})
    );
    again(&o, "planner", &t).await;
    assert_eq!(asked(&fake, 1), ("big-model".into(), json!(0.9)));

    // `null` clears a key; the rest stays.
    let (code, body) = patch(&base, &t, json!({"settings": {"model": null}}), None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["settings"], json!({"temperature": 0.9}));
    again(&o, "planner", &t).await;
    assert_eq!(asked(&fake, 2), ("test-model".into(), json!(0.9)));

    // A listener whose `overridable` does not name them keeps its own, in the same thread.
    again(&o, "fixed", &t).await;
    assert_eq!(asked(&fake, 3), ("test-model".into(), json!(0.2)));

    // Bad values are refused where they were written, and change nothing.
    for (body, code, at) in [
        (
            json!({"settings": {"model": "nope"}}),
            422,
            "settings.model",
        ),
        (
            json!({"settings": {"temperature": 3}}),
            422,
            "settings.temperature",
        ),
        (json!({"settings": {"model": 7}}), 400, ""),
        (json!({"settings": {"colour": "red"}}), 400, ""),
        (json!({"title": "x"}), 400, ""),
    ] {
        let (got, answer) = patch(&base, &t, body.clone(), None).await;
        assert_eq!(got, code, "{body} → {answer}");
        if !at.is_empty() {
            assert_eq!(answer["error"]["where"], at, "{answer}");
        }
    }
    let (code, _) = patch(&base, "no-such-thread", json!({"settings": {}}), None).await;
    assert_eq!(code, 404);
    let r = http()
        .patch(format!("{base}/api/v1/threads/{t}"))
        .body(r#"{"settings": {"model": "big"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415, "JSON only");
    let (_, now) = serve_get(&base, &t).await;
    assert_eq!(now["settings"], json!({"temperature": 0.9}));

    // After a restart, the thread's next call still uses them.
    let store = stopped(server, o, &dir.path().join("data.db")).await;
    drop(store);
    let o = Organism::builder().load(&path).unwrap();
    again(&o, "planner", &t).await;
    assert_eq!(asked(&fake, 4), ("test-model".into(), json!(0.9)));
    o.stop().await;
}

async fn serve_get(base: &str, thread: &str) -> (u16, Value) {
    let r = http()
        .get(format!("{base}/api/v1/threads/{thread}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

const KEYS: [(&str, Role, Option<&str>); 4] = [
    ("acme-op", Role::Operator, Some("acme")),
    ("acme-viewer", Role::Viewer, Some("acme")),
    ("globex-op", Role::Operator, Some("globex")),
    ("op", Role::Operator, None),
];

#[tokio::test]
async fn a_tenant_changes_only_its_threads_to_its_models_and_sees_only_its_changes() {
    let fake = Fake::default();
    let url = fake.serve().await;
    answers(&fake, 4);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.xsd"), XSD).unwrap();
    let path = dir.path().join("o.yaml");
    let head = "auth: {methods: [keys]}\ntenants:\n  acme: {models: [m]}\n";
    // `planner` is acme's; `fixed` the organism's.
    std::fs::write(&path, yaml(&url, "keys.db", head, ", tenant: acme")).unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = keys_for(&config, &KEYS);
    let o = Organism::builder().build(config).unwrap();
    let server = serve(&o).await;
    let base = format!("http://{}", server.local_addr());
    let acme = inject(&o, "planner", "<Task><goal>a</goal></Task>", None).thread_id;
    let ours = inject(&o, "fixed", "<Task><goal>b</goal></Task>", None).thread_id;
    settle(&o, &acme).await;
    settle(&o, &ours).await;

    // A globex session watches: acme's change must not reach it.
    let ws_as = |key: &str| {
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("{}/ws", base.replacen("http://", "ws://", 1)),
            )
            .unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        req
    };
    let (mut globex, _) = tokio_tungstenite::connect_async(ws_as(&keys["globex-op"]))
        .await
        .unwrap();
    let _ = next_json(&mut globex).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_as(&keys["acme-op"]))
        .await
        .unwrap();
    let _ = next_json(&mut ws).await;

    let body = json!({"settings": {"model": "big"}});
    let (code, answer) = patch(&base, &acme, body.clone(), Some(&keys["acme-op"])).await;
    assert_eq!(code, 422, "big is not among acme's models: {answer}");
    assert_eq!(answer["error"]["where"], "settings.model");
    for (thread, key, code) in [
        (&ours, "acme-op", 404),
        (&acme, "globex-op", 404),
        (&acme, "acme-viewer", 403),
    ] {
        let (got, answer) = patch(&base, thread, json!({"settings": {}}), Some(&keys[key])).await;
        assert_eq!(got, code, "{key} on {thread}: {answer}");
    }

    send_json(
        &mut ws,
        json!({"cmd": "settings", "request_id": "s-1", "thread_id": acme,
               "settings": {"temperature": 0.7}}),
    )
    .await;
    let seen = read_until(&mut ws, |f| f["event"] == "ack" || f["event"] == "error").await;
    let ack = seen.last().unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");
    assert_eq!(ack["settings"], json!({"temperature": 0.7}), "{ack}");
    let changed = read_until(&mut ws, |f| f["event"] == "thread_settings").await;
    let changed = changed.last().unwrap();
    assert_eq!(changed["thread_id"], json!(acme));
    assert_eq!(changed["origin"]["request_id"], "s-1", "{changed}");
    send_json(
        &mut ws,
        json!({"cmd": "settings", "thread_id": ours, "settings": {"temperature": 0.7}}),
    )
    .await;
    let refused = read_until(&mut ws, |f| f["event"] == "error").await;
    assert_eq!(refused.last().unwrap()["code"], "unknown_thread");

    again(&o, "planner", &acme).await;
    assert_eq!(asked(&fake, 2), ("test-model".into(), json!(0.7)));

    // The organism's operator changes its own thread; globex then sees that frame and
    // never acme's.
    let (code, answer) = patch(
        &base,
        &ours,
        json!({"settings": {"temperature": 0.1}}),
        Some(&keys["op"]),
    )
    .await;
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = patch(
        &base,
        &acme,
        json!({"settings": {"model": "m"}}),
        Some(&keys["acme-op"]),
    )
    .await;
    assert_eq!(code, 200, "{answer}");
    // globex sees none of these threads: a frame that names one of them is a leak.
    let (mut admin_ws, _) = tokio_tungstenite::connect_async(ws_as(&keys["op"]))
        .await
        .unwrap();
    let _ = next_json(&mut admin_ws).await;
    let (code, _) = patch(
        &base,
        &ours,
        json!({"settings": {"temperature": 0.3}}),
        Some(&keys["op"]),
    )
    .await;
    assert_eq!(code, 200);
    read_until(&mut admin_ws, |f| f["event"] == "thread_settings").await;
    send_json(&mut globex, json!({"cmd": "pause", "agent": "planner"})).await;
    let frames = read_until(&mut globex, |f| f["event"] == "error").await;
    for f in &frames {
        assert_ne!(f["event"], "thread_settings", "{f}");
        assert!(!f.to_string().contains(&*acme), "{f}");
    }
    o.stop().await;
}
