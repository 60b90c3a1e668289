//! Fork, as a user uses it: the demo forked at its second hop with an edited payload (the
//! copies point at their originals, the original thread is byte for byte as it was, the
//! edit is what the rest of the fork sees); a rejected message forked with its payload
//! corrected completes; a thread from before a restart forks; a dry run changes nothing;
//! bad requests are refused where they were wrong; a tenant's operator cannot fork what it
//! does not wholly see (REST and `/ws`).

use agentserver::api::ApiOptions;
use agentserver::config::Role;
use agentserver::listener::{Delivery, FnHandler, Output};
use agentserver::threads::ThreadStatus;
use agentserver::Organism;
use serde_json::{json, Value};

use crate::common::*;
use crate::post;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/organisms/hello-world.yaml");

/// The demo organism with a store file in `dir`, served.
async fn demo(dir: &tempfile::TempDir) -> (Organism, agentserver::api::ApiServer, String) {
    let builder = Organism::builder();
    let mut config = builder.load_config(std::path::Path::new(DEMO)).unwrap();
    config.store = Some(dir.path().join("demo.db"));
    let o = builder.build(config).unwrap();
    crate::bound(o).await
}

async fn get_text(base: &str, path: &str) -> String {
    http()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn listed(base: &str, thread: &str) -> Vec<Value> {
    let text = get_text(base, &format!("/api/v1/threads/{thread}/messages")).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

async fn greet(o: &Organism, name: &str) -> String {
    let xml = format!("<Greeting><name>{name}</name></Greeting>");
    let r = inject(o, "greeter", &xml, None);
    assert_eq!(settle(o, &r.thread_id).await, ThreadStatus::Completed);
    r.thread_id.to_string()
}

#[tokio::test]
async fn a_fork_at_the_demos_second_hop_runs_the_edit_and_leaves_the_original_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (o, _server, base) = demo(&dir).await;
    let t = greet(&o, "Dan").await;
    let before = get_text(&base, &format!("/api/v1/threads/{t}/messages")).await;
    let items = listed(&base, &t).await;
    let hop2 = items.iter().find(|m| m["to"] == "shouter").unwrap();
    let edited = hop2["payload_xml"].as_str().unwrap().replace("Dan", "Eve");
    assert_ne!(edited, hop2["payload_xml"].as_str().unwrap());

    // A dry run says what would run, and makes no thread.
    let ask = json!({"at": hop2["id"], "payload_xml": edited, "labels": {"try": "eve"}});
    let mut dry = ask.clone();
    dry["dry_run"] = json!(true);
    let threads_before = o
        .history()
        .query_threads(&Default::default(), agentserver::threads::Page::ALL)
        .unwrap()
        .total;
    let (code, body) = post(&base, &format!("/api/v1/threads/{t}/fork"), dry).await;
    assert_eq!(code, 200, "{body}");
    assert!(body["thread_id"].is_null(), "{body}");
    assert_eq!(
        (&body["copied"], &body["to"], &body["side_effects"]),
        (&json!(1), &json!("shouter"), &json!(false))
    );
    let threads_after = o
        .history()
        .query_threads(&Default::default(), agentserver::threads::Page::ALL)
        .unwrap()
        .total;
    assert_eq!(threads_before, threads_after, "a dry run makes no thread");

    let (code, body) = post(&base, &format!("/api/v1/threads/{t}/fork"), ask).await;
    assert_eq!(code, 201, "{body}");
    let fork = body["thread_id"].as_str().unwrap().to_string();
    assert_eq!(body["copied"], 1);
    assert_eq!(settle(&o, &fork).await, ThreadStatus::Completed);

    let forked = listed(&base, &fork).await;
    // The copy of the inject points at its original and keeps its status and payload.
    let (first, original) = (&forked[0], &items[0]);
    assert_eq!(
        first["origin"],
        json!({"kind": "fork", "of": original["id"]})
    );
    assert_eq!(
        (&first["status"], &first["payload_xml"]),
        (&original["status"], &original["payload_xml"])
    );
    assert_ne!(first["id"], original["id"]);
    // The message forked at, edited, its parent the copy; what follows saw the edit.
    let again = &forked[1];
    assert_eq!(again["origin"], json!({"kind": "fork", "of": hop2["id"]}));
    assert_eq!(again["parent_id"], first["id"]);
    assert!(again["payload_xml"].as_str().unwrap().contains("Eve"));
    let last = forked.last().unwrap();
    assert_eq!(last["to"], "response-handler");
    assert!(
        last["payload_xml"].as_str().unwrap().contains("EVE"),
        "{last}"
    );
    assert_eq!(forked.len(), items.len());

    // The fork says where it came from, with the labels asked for; the original is untouched.
    let (_, info) = (
        200,
        serde_json::from_str::<Value>(&get_text(&base, &format!("/api/v1/threads/{fork}")).await)
            .unwrap(),
    );
    assert_eq!(
        info["forked_from"],
        json!({"thread": t, "message": hop2["id"]})
    );
    assert_eq!(info["labels"]["try"], "eve");
    assert_eq!(info["labels"]["agentserver.forked_from"], json!(t));
    let found = get_text(
        &base,
        &format!("/api/v1/threads?label=agentserver.forked_from:{t}"),
    )
    .await;
    assert!(found.contains(&fork), "{found}");
    assert_eq!(
        get_text(&base, &format!("/api/v1/threads/{t}/messages")).await,
        before
    );
}

#[tokio::test]
async fn a_thread_from_before_a_restart_forks_and_the_copy_is_prefix_or_path() {
    let dir = tempfile::tempdir().unwrap();
    let t = {
        let (o, server, _) = demo(&dir).await;
        let t = greet(&o, "Ann").await;
        o.stop().await;
        server.shutdown().await;
        t
    };
    let (o, _server, base) = demo(&dir).await;
    let items = listed(&base, &t).await;
    let last = items.last().unwrap();
    for (copy, copied) in [("path", 2), ("prefix", 2)] {
        let (code, body) = post(
            &base,
            &format!("/api/v1/threads/{t}/fork"),
            json!({"at": last["id"], "copy": copy}),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["copied"], copied, "{copy}: {body}");
        let fork = body["thread_id"].as_str().unwrap();
        assert_eq!(settle(&o, fork).await, ThreadStatus::Completed);
        let forked = listed(&base, fork).await;
        assert_eq!(forked.last().unwrap()["payload_xml"], last["payload_xml"]);
    }
    // A fork's id of the client's, used once.
    let at = json!({"at": last["id"], "thread_id": "my-fork"});
    let (code, body) = post(&base, &format!("/api/v1/threads/{t}/fork"), at.clone()).await;
    assert_eq!(
        (code, body["thread_id"].as_str()),
        (201, Some("my-fork")),
        "{body}"
    );
    let (code, body) = post(&base, &format!("/api/v1/threads/{t}/fork"), at).await;
    assert_eq!(
        (code, &body["error"]["code"], &body["error"]["where"]),
        (409, &json!("thread_exists"), &json!("thread_id")),
        "{body}"
    );
    let (code, body) = post(
        &base,
        &format!("/api/v1/threads/{t}/fork"),
        json!({"at": last["id"], "thread_id": t}),
    )
    .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("thread_exists")),
        "{body}"
    );
}

#[tokio::test]
async fn bad_forks_are_refused_where_they_are_wrong_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (o, _server, base) = demo(&dir).await;
    let t = greet(&o, "Bo").await;
    let other = greet(&o, "Cy").await;
    let items = listed(&base, &t).await;
    let hop2 = &items[1];
    let fork = format!("/api/v1/threads/{t}/fork");
    let cases = [
        (json!({"at": "nope"}), 404, "unknown_message", "at"),
        (
            json!({"at": listed(&base, &other).await[1]["id"]}),
            404,
            "unknown_message",
            "at",
        ),
        (
            json!({"at": hop2["id"], "to": "ghost"}),
            404,
            "unknown_listener",
            "to",
        ),
        (
            json!({"at": hop2["id"], "payload_xml": "<GreetingResponse><oops/></GreetingResponse>"}),
            422,
            "invalid_payload",
            "payload",
        ),
        (
            json!({"at": hop2["id"], "payload_xml": "<Greeting"}),
            422,
            "malformed_xml",
            "payload line 1",
        ),
        (
            json!({"at": hop2["id"], "thread_id": "no spaces"}),
            400,
            "invalid_thread_id",
            "thread_id",
        ),
        (
            json!({"at": hop2["id"], "thread_id": "count"}),
            400,
            "invalid_thread_id",
            "thread_id",
        ),
        (
            json!({"at": hop2["id"], "labels": {"password": "x"}}),
            422,
            "invalid_label",
            "labels.password",
        ),
        (
            json!({"at": hop2["id"], "payload": {"message": "hi"}, "payload_xml": "<x/>"}),
            400,
            "bad_request",
            "payload",
        ),
        // The greeter may not send to response-handler: its peers say shouter.
        (
            json!({"at": hop2["id"], "to": "response-handler", "payload_xml": "<Shouted><message>X</message></Shouted>"}),
            409,
            "no_route",
            "",
        ),
    ];
    for (body, status, code, at) in cases {
        let (got, answer) = post(&base, &fork, body.clone()).await;
        let answer = &answer["error"];
        assert_eq!(
            (got, answer["code"].as_str().unwrap_or("")),
            (status, code),
            "{body}: {answer}"
        );
        if !at.is_empty() {
            assert_eq!(answer["where"], at, "{body}: {answer}");
        }
    }
    let (code, body) = post(
        &base,
        "/api/v1/threads/nope/fork",
        json!({"at": hop2["id"]}),
    )
    .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (404, &json!("unknown_thread"))
    );
    let (code, _) = post(&base, &fork, json!({"at": hop2["id"], "surprise": 1})).await;
    assert_eq!(code, 400);
    let total = o
        .history()
        .query_threads(&Default::default(), agentserver::threads::Page::ALL)
        .unwrap()
        .total;
    assert_eq!(total, 2, "nothing was forked");
    // A JSON payload is written as the receiver's XML.
    let (code, body) = post(
        &base,
        &fork,
        json!({"at": hop2["id"], "payload": {"message": "Hi, JSON"}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let f = body["thread_id"].as_str().unwrap();
    assert_eq!(settle(&o, f).await, ThreadStatus::Completed);
    assert!(listed(&base, f).await.last().unwrap()["payload_xml"]
        .as_str()
        .unwrap()
        .contains("HI, JSON"));
}

#[tokio::test]
async fn a_rejected_message_forked_with_its_payload_corrected_completes() {
    let builder = Organism::builder().handler(
        "emit",
        emitting(vec![Output::to("b", "<Pong><n>not-a-number</n></Pong>")]),
    );
    let (o, d) = organism(
        builder,
        "  - { name: a, description: emits a bad Pong, kind: native, handler: emit, schema: t.xsd, accepts: [Ping, huh] }
  - { name: b, description: takes Pong, kind: native, handler: sink, schema: t.xsd, accepts: [Pong] }",
    );
    let s = Served::over(o.clone(), d, ApiOptions::default()).await;
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let items = listed(&s.base, &r.thread_id).await;
    let rejected = items.iter().find(|m| m["status"] == "rejected").unwrap();
    let (code, body) = s
        .post(
            &format!("/api/v1/threads/{}/fork", r.thread_id),
            json!({"at": rejected["id"], "payload_xml": "<Pong><n>5</n></Pong>"}),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let fork = body["thread_id"].as_str().unwrap();
    assert_eq!(settle(&o, fork).await, ThreadStatus::Completed);
    let (_, info) = s.get(&format!("/api/v1/threads/{fork}")).await;
    assert!(info["error"].is_null(), "{info}");
    let forked = listed(&s.base, fork).await;
    assert_eq!(forked.last().unwrap()["status"], "delivered");
}

fn emitting(outputs: Vec<Output>) -> impl agentserver::listener::Handler {
    FnHandler(move |_d: Delivery| {
        let o = outputs.clone();
        async move { Ok(o) }
    })
}

/// An organism's listener hands a note to a tenant's: the tenant sees the thread, not the
/// message that began it.
const MIXED: &str = "organism: { name: mixed, store: mixed.db }
auth: { methods: [keys] }
listeners:
  - { name: front, description: the organism's, kind: native, handler: forward, schema: t.xsd, accepts: [Note], peers: [acme-sink], config: { to: acme-sink } }
  - { name: acme-sink, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme }
  - { name: acme-relay, description: acme's, kind: native, handler: forward, schema: t.xsd, accepts: [Note], tenant: acme, config: { to: acme-sink } }
  - { name: beta-sink, description: beta's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: beta }
";

#[tokio::test]
async fn a_tenant_cannot_fork_what_it_does_not_wholly_see_by_any_door() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, MIXED).unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = keys_for(
        &config,
        &[
            ("acme", Role::Operator, Some("acme")),
            ("beta", Role::Operator, Some("beta")),
        ],
    );
    let o = Organism::builder().build(config).unwrap();
    let s = Served::over(o.clone(), dir, ApiOptions::default()).await;
    let fork_as = |key: &'static str, thread: String, body: Value| {
        let (url, token) = (
            s.url(&format!("/api/v1/threads/{thread}/fork")),
            keys[key].clone(),
        );
        async move {
            let r = http()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let mixed = inject(&o, "front", "<Note>m</Note>", None)
        .thread_id
        .to_string();
    assert_eq!(settle(&o, &mixed).await, ThreadStatus::Completed);
    let own = inject(&o, "acme-relay", "<Note>o</Note>", None)
        .thread_id
        .to_string();
    assert_eq!(settle(&o, &own).await, ThreadStatus::Completed);
    let m = messages(&o, &mixed);
    let o_ms = messages(&o, &own);
    let to_sink = m.iter().find(|x| to_of(x) == "acme-sink").unwrap();

    // The tenant sees the mixed thread, but its path holds the organism's message: 404, as
    // for a message that does not exist; a dry run too.
    for dry in [false, true] {
        let (code, body) = fork_as(
            "acme",
            mixed.clone(),
            json!({"at": &*to_sink.id, "dry_run": dry}),
        )
        .await;
        assert_eq!(
            (code, &body["error"]["code"]),
            (404, &json!("unknown_message")),
            "{body}"
        );
    }
    // Another tenant does not see the thread at all.
    let (code, body) = fork_as("beta", own.clone(), json!({"at": &*o_ms[1].id})).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (404, &json!("unknown_thread")),
        "{body}"
    );
    // Its own thread forks, but not to another tenant's listener nor the organism's.
    for to in ["beta-sink", "front"] {
        let (code, body) =
            fork_as("acme", own.clone(), json!({"at": &*o_ms[1].id, "to": to})).await;
        assert_eq!(
            (code, &body["error"]["code"]),
            (404, &json!("unknown_listener")),
            "{to}: {body}"
        );
    }
    let (code, body) = fork_as("acme", own.clone(), json!({"at": &*o_ms[1].id})).await;
    assert_eq!(code, 201, "{body}");

    // The same over `/ws`.
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    send_json(&mut ws, json!({"cmd": "auth", "token": keys["acme"]})).await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");
    send_json(
        &mut ws,
        json!({"cmd": "fork", "request_id": "f1", "thread_id": mixed, "at": &*to_sink.id}),
    )
    .await;
    let err = read_until(&mut ws, |f| f["request_id"] == "f1")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (&err["event"], &err["code"]),
        (&json!("error"), &json!("unknown_message")),
        "{err}"
    );
    send_json(&mut ws, json!({"cmd": "fork", "request_id": "f2", "thread_id": own, "at": &*o_ms[1].id, "new_thread_id": "acme-fork"})).await;
    let ack = read_until(&mut ws, |f| f["request_id"] == "f2")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (&ack["event"], &ack["thread_id"]),
        (&json!("ack"), &json!("acme-fork")),
        "{ack}"
    );
    assert_eq!(settle(&o, "acme-fork").await, ThreadStatus::Completed);

    // A rewind is held to the same: the mixed thread's first message is the organism's,
    // and rewinding to it would supersede the rest; REST and `/ws` alike.
    let rewind = s.url(&format!("/api/v1/threads/{mixed}/rewind"));
    for (key, code) in [("acme", 404), ("beta", 404)] {
        let r = http()
            .post(&rewind)
            .bearer_auth(&keys[key])
            .json(&json!({"to": &*m[0].id, "dry_run": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), code, "{key}");
    }
    let ask = json!({"cmd": "rewind", "request_id": "r1", "thread_id": mixed, "to": &*m[0].id});
    send_json(&mut ws, ask).await;
    let err = read_until(&mut ws, |f| f["request_id"] == "r1")
        .await
        .pop()
        .unwrap();
    assert_eq!(err["code"], "unknown_message", "{err}");
    assert_eq!(messages(&o, &mixed).len(), m.len(), "nothing was rewound");
    let total = o
        .history()
        .query_threads(&Default::default(), agentserver::threads::Page::ALL)
        .unwrap()
        .total;
    assert_eq!(
        total, 4,
        "two forks of its own, none of what it may not see"
    );
}
