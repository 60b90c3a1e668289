//! The REST API against a real server on 127.0.0.1:0 with a real HTTP client.

use crate::chain;
use crate::common::*;
use agentserver::api::ApiOptions;
use agentserver::Organism;
use serde_json::{json, Value};

async fn wait_completed(s: &Served, thread: &str) {
    settle(&s.organism, thread).await;
}

/// An inject that continues `thread`, refused because the thread was killed.
async fn refused_as_killed(s: &Served, thread: &str) {
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note>again</Note>", "thread_id": thread}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("thread_killed")),
        "{e}"
    );
}

#[tokio::test]
async fn organism_agents_and_schema_endpoints_have_their_shapes() {
    let s = chain().await;
    let t = s.inject_note("a", "hi").await;
    wait_completed(&s, &t).await;

    let (st, o) = s.get("/api/v1/organism").await;
    assert_eq!(st, 200);
    for key in [
        "name",
        "status",
        "uptime_seconds",
        "agent_count",
        "active_threads",
        "total_messages",
        "config_rev",
    ] {
        assert!(o.get(key).is_some(), "organism lacks {key}: {o}");
    }
    assert_eq!(o["status"], "running");
    assert_eq!(o["agent_count"], 3);
    assert_eq!(o["total_messages"], 3);

    let (st, agents) = s.get("/api/v1/agents").await;
    assert_eq!(st, 200);
    assert_eq!(agents["total"], 3);
    let a = &agents["items"][0];
    for key in [
        "name",
        "description",
        "is_agent",
        "peers",
        "payload_class",
        "state",
        "current_thread",
        "queue_depth",
        "last_activity",
        "kind",
        "accepts",
    ] {
        assert!(a.get(key).is_some(), "agent lacks {key}: {a}");
    }
    assert_eq!(a["kind"], "native");
    assert_eq!(a["accepts"], json!(["Note"]));

    let (st, b) = s.get("/api/v1/agents/b").await;
    assert_eq!(st, 200);
    assert_eq!(b["handled"], 1);
    assert!(b["mean_handler_ms"].as_f64().is_some() && b["p99_handler_ms"].as_f64().is_some());

    let (st, e) = s.get("/api/v1/agents/nobody").await;
    assert_eq!(st, 404);
    assert_eq!(e["error"]["code"], "unknown_listener");

    let r = s
        .http
        .get(s.url("/api/v1/agents/a/schema"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/xml"));
    assert!(r.text().await.unwrap().contains("xs:schema"));
    let (st, _) = s.get("/api/v1/agents/a/schema?type=Nope").await;
    assert_eq!(st, 404);
    // As JSON Schema: the JSON inject takes for it (a text payload is a string).
    let r = s
        .http
        .get(s.url("/api/v1/agents/a/schema?type=Note&format=json-schema"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/schema+json");
    let doc: Value = r.json().await.unwrap();
    assert_eq!(
        (&doc["type"], &doc["title"]),
        (&json!("string"), &json!("Note"))
    );
    let (st, e) = s.get("/api/v1/agents/a/schema?format=yaml").await;
    assert_eq!(st, 400, "{e}");
    // The same payload type's fields, as a form shows them (a text payload has none; the
    // dashboard's inject form test walks nested, optional and repeated ones).
    let (st, f) = s.get("/api/v1/agents/a/fields?type=Note").await;
    assert_eq!((st, &f), (200, &json!({"type": "Note", "fields": []})));
    let (st, e) = s.get("/api/v1/agents/a/fields?type=Nope").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("unknown_payload_type"))
    );
    let (st, e) = s.get("/api/v1/agents/nobody/fields").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("unknown_listener"))
    );

    let (st, h) = s.get("/healthz").await;
    assert_eq!((st, h["status"].as_str()), (200, Some("ok")));
    let (st, _) = s.get("/readyz").await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn config_endpoints_never_show_secret_values() {
    // Secrets reach handlers through `_env` keys (literal ones are config errors, tested in
    // tests/config.rs); the views show the variable's name, never its value.
    std::env::set_var("API_REST_TEST_KEY", "sk-live-123");
    std::env::set_var("API_REST_TEST_PW", "hunter2");
    std::env::set_var("A_TOKEN", "tok-secret-9");
    let listeners = "  - {name: a, description: first, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b, api_key_env: API_REST_TEST_KEY, auth: {password_env: API_REST_TEST_PW}, token_env: A_TOKEN, note: 'x'}}
  - {name: b, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}";
    let s = serve_with(Organism::builder(), "", listeners, ApiOptions::default()).await;
    assert_eq!(
        s.organism.config().listeners[0].config["api_key"],
        "sk-live-123",
        "the handler gets the value"
    );
    for path in ["/api/v1/organism/config", "/api/v1/agents/a/config"] {
        let (st, v) = s.get(path).await;
        assert_eq!(st, 200);
        let text = v.to_string();
        assert!(
            !text.contains("sk-live-123")
                && !text.contains("hunter2")
                && !text.contains("tok-secret-9"),
            "{path}: {text}"
        );
        assert!(
            text.contains("A_TOKEN") && text.contains("API_REST_TEST_KEY"),
            "env var names are not secret: {text}"
        );
        assert!(v["yaml"].as_str().unwrap().contains("[redacted]"));
    }
    let (_, a) = s.get("/api/v1/agents/a/config").await;
    assert_eq!(a["config"]["name"], "a");
    assert_eq!(a["config"]["config"]["auth"], "[redacted]");
    assert_eq!(a["config"]["config"]["api_key_env"], "API_REST_TEST_KEY");
    let (st, _) = s.get("/api/v1/agents/zed/config").await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn message_and_thread_lists_filter_and_page_exactly() {
    let s = chain().await;
    let mut threads = Vec::new();
    for i in 0..4 {
        let t = s.inject_note("a", &format!("n{i}")).await;
        wait_completed(&s, &t).await;
        threads.push(t);
    }

    let (st, all) = s.get("/api/v1/messages").await;
    assert_eq!(st, 200);
    assert_eq!(all["total"], 12);
    assert_eq!(all["limit"], 50);
    assert_eq!(all["offset"], 0);
    let items = all["items"].as_array().unwrap();
    let m = &items[0];
    for key in [
        "id",
        "thread_id",
        "from",
        "to",
        "payload_type",
        "payload",
        "timestamp",
        "parent_id",
        "slot_index",
        "status",
        "error",
        "payload_xml",
    ] {
        assert!(m.get(key).is_some(), "message lacks {key}: {m}");
    }
    assert_eq!(m["payload"], "n0");

    let total = |v: &Value| {
        v["total"]
            .as_u64()
            .unwrap_or_else(|| panic!("no total: {v}"))
    };
    assert_eq!(
        total(&s.get("/api/v1/messages?agent=b").await.1),
        8,
        "b sends and receives"
    );
    assert_eq!(
        total(
            &s.get(&format!("/api/v1/messages?thread={}", threads[1]))
                .await
                .1
        ),
        3
    );
    assert_eq!(
        total(
            &s.get("/api/v1/messages?payload_type=Note&status=delivered")
                .await
                .1
        ),
        12
    );
    assert_eq!(total(&s.get("/api/v1/messages?status=rejected").await.1), 0);

    // Pagination edges.
    let (_, page) = s.get("/api/v1/messages?limit=5&offset=10").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["total"], 12);
    let (_, past) = s.get("/api/v1/messages?offset=100").await;
    assert_eq!(past["items"], json!([]));
    assert_eq!(past["total"], 12);
    let (_, zero) = s.get("/api/v1/messages?limit=0").await;
    assert_eq!(zero["items"], json!([]));
    assert_eq!(zero["total"], 12);
    let (_, big) = s.get("/api/v1/messages?limit=100000").await;
    assert_eq!(big["limit"], 1000, "clamped to the maximum");
    assert_eq!(big["items"].as_array().unwrap().len(), 12);

    // Bad parameters are 400s that say which.
    for bad in [
        "/api/v1/messages?limit=-1",
        "/api/v1/messages?status=lost",
        "/api/v1/threads?status=x",
        "/api/v1/messages?since=yesterday",
    ] {
        let (st, e) = s.get(bad).await;
        assert_eq!(st, 400, "{bad}: {e}");
        assert!(e["error"]["message"].as_str().is_some());
    }
    for (bad, param) in [
        ("/api/v1/messages?since=yesterday", "since"),
        ("/api/v1/messages?limit=-1", "limit"),
        ("/api/v1/messages?offset=x", "offset"),
        ("/api/v1/messages?status=lost", "status"),
        ("/api/v1/threads?status=x", "status"),
        ("/api/v1/threads?until=noon", "until"),
        ("/api/v1/messages?bogus=1", "bogus"),
    ] {
        let (_, e) = s.get(bad).await;
        assert_eq!(e["error"]["code"], "invalid_query", "{bad}: {e}");
        assert_eq!(e["error"]["where"], param, "{bad}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(param),
            "{bad}: {e}"
        );
    }

    // Threads: newest first, filters.
    let (_, ts) = s.get("/api/v1/threads").await;
    assert_eq!(ts["total"], 4);
    assert_eq!(ts["items"][0]["id"], threads[3].as_str());
    assert_eq!(
        total(&s.get("/api/v1/threads?status=completed&agent=c").await.1),
        4
    );
    assert_eq!(total(&s.get("/api/v1/threads?status=active").await.1), 0);
    // Time windows: deterministic bounds (messages of one test share milliseconds).
    let first = s
        .organism
        .threads()
        .info(&threads[0])
        .unwrap()
        .created_at
        .to_rfc3339();
    let past = "2000-01-01T00:00:00Z";
    let future = "2100-01-01T00:00:00%2B01:00";
    assert_eq!(
        total(&s.get(&format!("/api/v1/threads?until={future}")).await.1),
        4
    );
    assert_eq!(
        total(&s.get(&format!("/api/v1/threads?until={past}")).await.1),
        0
    );
    assert_eq!(
        total(&s.get(&format!("/api/v1/threads?since={first}")).await.1),
        4
    );
    assert_eq!(
        total(&s.get(&format!("/api/v1/threads?since={future}")).await.1),
        0
    );
    assert_eq!(
        total(&s.get(&format!("/api/v1/messages?since={first}")).await.1),
        12
    );
    assert_eq!(
        total(
            &s.get(&format!("/api/v1/messages?since={past}&until={future}"))
                .await
                .1
        ),
        12
    );
    assert_eq!(
        total(&s.get(&format!("/api/v1/messages?until={first}")).await.1),
        0
    );

    let (st, one) = s.get(&format!("/api/v1/threads/{}", threads[0])).await;
    assert_eq!(st, 200);
    assert_eq!(one["status"], "completed");
    assert_eq!(one["participants"], json!(["api", "a", "b", "c"]));
    assert_eq!(one["messages"].as_array().unwrap().len(), 3);
    let (_, tm) = s
        .get(&format!(
            "/api/v1/threads/{}/messages?limit=1&offset=2",
            threads[0]
        ))
        .await;
    assert_eq!(tm["total"], 3);
    assert_eq!(tm["items"][0]["slot_index"], 2);
    assert_eq!(s.get("/api/v1/threads/nope").await.0, 404);
    assert_eq!(s.get("/api/v1/threads/nope/messages").await.0, 404);
}

#[tokio::test]
async fn unknown_query_parameters_are_refused() {
    let s = chain().await;
    let (st, e) = s.get("/api/v1/messages?agnet=b").await;
    assert_eq!(st, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("agnet"));
}

#[tokio::test]
async fn inject_maps_json_in_schema_order_and_answers_202() {
    let s = serve_with(
        Organism::builder(),
        "",
        "  - {name: p, description: pings, kind: native, handler: sink, schema: t.xsd, accepts: [Ping]}",
        ApiOptions::default(),
    )
    .await;
    let (st, r) = s
        .post("/api/v1/inject", json!({"to": "p", "payload": {"n": 7}}))
        .await;
    assert_eq!(st, 202, "{r}");
    let thread = r["thread_id"].as_str().unwrap().to_string();
    assert!(r["message_id"].as_str().is_some());
    settle(&s.organism, &thread).await;
    let (_, m) = s.get(&format!("/api/v1/threads/{thread}/messages")).await;
    assert_eq!(m["items"][0]["payload_xml"], "<Ping><n>7</n></Ping>");
    assert_eq!(
        m["items"][0]["payload"],
        json!({"n": 7}),
        "leaves typed by the schema"
    );
    assert_eq!(m["items"][0]["from"], "api");

    // A caller-chosen thread id continues that thread.
    let (st, r) = s
        .post(
            "/api/v1/inject",
            json!({"to": "p", "payload_xml": "<Ping><n>8</n></Ping>", "thread_id": "my-thread_1"}),
        )
        .await;
    assert_eq!((st, r["thread_id"].as_str()), (202, Some("my-thread_1")));

    // A JSON key the schema does not declare names its path.
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "p", "payload": {"n": 1, "m": 2}}),
        )
        .await;
    assert_eq!(st, 422);
    assert_eq!(e["error"]["code"], "invalid_payload");
    assert_eq!(e["error"]["where"], "payload.m");

    // XML sent as `payload` (a string) is told where XML goes.
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "p", "payload": " <Ping><n>1</n></Ping>"}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("invalid_payload"))
    );
    let said = e["error"]["message"].as_str().unwrap();
    assert!(said.contains("an XML payload goes in `payload_xml`"), "{e}");
    // Not so for another string.
    let (st, e) = s
        .post("/api/v1/inject", json!({"to": "p", "payload": "seven"}))
        .await;
    assert_eq!(st, 422, "{e}");
    assert!(
        !e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("payload_xml"),
        "{e}"
    );
}

#[tokio::test]
async fn every_bad_inject_gets_its_status_and_a_clear_body() {
    let s = serve_with(
        Organism::builder(),
        "  max_message_bytes: 2048\n  max_pending_messages: 2",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    let note = |t: &str| json!({"to": "a", "payload_xml": format!("<Note>{t}</Note>")});

    // 422: invalid against the schema, with the validator's messages.
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note><b>x</b></Note>"}),
        )
        .await;
    assert_eq!(st, 422, "{e}");
    assert_eq!(e["error"]["code"], "invalid_payload");
    assert!(
        e["error"]["details"][0]
            .as_str()
            .unwrap()
            .contains("line 1"),
        "{e}"
    );
    // 422: malformed XML, not accepted type.
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note>x</Nope>"}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("malformed_xml"))
    );
    assert_eq!(e["error"]["where"], "payload line 1", "{e}");
    // Every malformed payload says where, with a line when there is one.
    for (xml, place) in [
        ("<Note>x</Note><x/>", "payload line 1"),
        (
            "<!DOCTYPE n [<!ENTITY a \"b\">]><Note>&a;</Note>",
            "payload",
        ),
        ("<Note>&nope;</Note>", "payload"),
        (&format!("{}x", "<a>".repeat(100)), "payload"),
    ] {
        let (st, e) = s
            .post("/api/v1/inject", json!({"to": "a", "payload_xml": xml}))
            .await;
        assert_eq!(st, 422, "{e}");
        assert_eq!(e["error"]["code"], "malformed_xml", "{e}");
        assert_eq!(e["error"]["where"], place, "{e}");
    }
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Ping><n>1</n></Ping>"}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("not_accepted"))
    );
    // 404: unknown listener.
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "zz", "payload_xml": "<Note/>"}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("unknown_listener"))
    );
    // 413: payload over max_message_bytes, and a body over the request limit.
    let (st, e) = s.post("/api/v1/inject", note(&"x".repeat(3000))).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (413, Some("too_large")),
        "{e}"
    );
    let (st, _) = s.post("/api/v1/inject", note(&"x".repeat(200_000))).await;
    assert_eq!(st, 413);
    // 400: malformed JSON (with where), missing field, both payload forms, bad thread id.
    let r = s
        .http
        .post(s.url("/api/v1/inject"))
        .header("content-type", "application/json")
        .body("{\"to\": \"a\",")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_json");
    assert!(
        e["error"]["where"].as_str().unwrap().starts_with("line 1"),
        "{e}"
    );
    let (st, e) = s
        .post("/api/v1/inject", json!({"payload_xml": "<Note/>"}))
        .await;
    assert_eq!(st, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing field `to`"),
        "{e}"
    );
    let (st, _) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload": "x", "payload_xml": "<Note/>"}),
        )
        .await;
    assert_eq!(st, 400);
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note/>", "thread_id": "bad id!"}),
        )
        .await;
    assert_eq!((st, e["error"]["where"].as_str()), (400, Some("thread_id")));
    // Ids that name routes beside `/threads/{id}` and `/messages/{id}` would hide their
    // thread or message: refused, saying why.
    for id in ["count", "batch", "retry"] {
        for field in ["thread_id", "message_id"] {
            let (st, e) = s
                .post(
                    "/api/v1/inject",
                    json!({"to": "a", "payload_xml": "<Note/>", field: id}),
                )
                .await;
            assert_eq!(
                (st, e["error"]["where"].as_str()),
                (400, Some(field)),
                "{field} {id}: {e}"
            );
            let message = e["error"]["message"].as_str().unwrap();
            assert!(message.contains("not batch, count or retry"), "{message}");
        }
    }
    // A near one is an id like any other, and its thread is found by it.
    let mut near = note("n");
    near["thread_id"] = json!("counts");
    let (st, _) = s.post("/api/v1/inject", near).await;
    assert_eq!(st, 202);
    let (st, t) = s.get("/api/v1/threads/counts").await;
    assert_eq!((st, t["id"].as_str()), (200, Some("counts")), "{t}");
    let r = s
        .http
        .post(s.url("/api/v1/inject"))
        .header("content-type", "text/plain")
        .body("{\"to\":\"a\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "unsupported_media_type");

    // 409: a killed thread.
    s.organism.control().pause_listener("a").unwrap();
    let (_, r) = s.post("/api/v1/inject", note("k")).await;
    let killed = r["thread_id"].as_str().unwrap().to_string();
    let (st, _) = s
        .post(&format!("/api/v1/threads/{killed}/kill"), json!({}))
        .await;
    assert_eq!(st, 200);
    refused_as_killed(&s, &killed).await;

    // 429: over max_pending_messages (2) while `a` is paused.
    assert_eq!(s.post("/api/v1/inject", note("1")).await.0, 202);
    assert_eq!(s.post("/api/v1/inject", note("2")).await.0, 202);
    let (st, e) = s.post("/api/v1/inject", note("3")).await;
    assert_eq!((st, e["error"]["code"].as_str()), (429, Some("overloaded")));
    // Refused before its payload is read (a client retrying costs no parse): a malformed
    // one is told the same, and told it is malformed once there is room.
    let broken = json!({"to": "a", "payload_xml": "<Note>"});
    let (st, e) = s.post("/api/v1/inject", broken.clone()).await;
    assert_eq!((st, e["error"]["code"].as_str()), (429, Some("overloaded")));
    let unmappable = json!({"to": "a", "payload": {"no": {"such": "field"}}});
    let (st, e) = s.post("/api/v1/inject", unmappable.clone()).await;
    assert_eq!((st, e["error"]["code"].as_str()), (429, Some("overloaded")));

    // Every refusal that reached the pump was recorded, and the organism still runs.
    assert!(
        s.organism
            .metrics()
            .failure_count(agentserver::pump::FailureKind::InjectRefused)
            >= 5
    );
    s.organism.control().resume_listener("a").unwrap();
    let t = s.inject_note("a", "still fine").await;
    settle(&s.organism, &t).await;
    let (st, e) = s.post("/api/v1/inject", broken).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("malformed_xml")),
        "{e}"
    );
    let (st, e) = s.post("/api/v1/inject", unmappable).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("invalid_payload")),
        "{e}"
    );

    // Unknown routes and methods answer JSON too.
    let (st, e) = s.get("/api/v1/nothing").await;
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("no_route")));
    let r = s
        .http
        .delete(s.url("/api/v1/organism"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);

    // Refusals are recorded even when they never reached the pump.
    let text = s.metrics().await;
    for needle in [
        "agentserver_http_refused_total{status=\"415\"} 1",
        "agentserver_http_refused_total{status=\"405\"} 1",
        "agentserver_http_refused_total{status=\"429\"} 3",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}

/// A client cannot fill the organism's memory with large payloads under the message
/// count: the bytes pending are bounded too (`limits.max_pending_bytes`), and given back as
/// messages are handled or killed.
#[tokio::test]
async fn pending_payloads_are_bounded_by_bytes_and_given_back() {
    let s = serve_with(
        Organism::builder(),
        "  max_pending_bytes: 10000",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    let big = |i: usize| json!({"to": "a", "payload_xml": format!("<Note>{i}{}</Note>", "x".repeat(3000))});
    let pending = |s: &Served| s.organism.metrics().pending_bytes();
    s.organism.control().pause_listener("a").unwrap();
    let mut threads = Vec::new();
    for i in 0..4 {
        let (st, r) = s.post("/api/v1/inject", big(i)).await;
        assert_eq!(st, 202, "{r}");
        threads.push(r["thread_id"].as_str().unwrap().to_string());
    }
    assert!(pending(&s) > 10_000, "{}", pending(&s));
    let (st, e) = s.post("/api/v1/inject", big(5)).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("overloaded")),
        "{e}"
    );
    let said = e["error"]["message"].as_str().unwrap();
    assert!(said.contains("limits.max_pending_bytes"), "{said}");
    assert!(
        s.metrics()
            .await
            .contains(&format!("agentserver_pending_bytes {}", pending(&s))),
        "the gauge shows it"
    );
    // Killed while queued, their bytes are given back.
    for t in &threads[..2] {
        let (st, _) = s
            .post(&format!("/api/v1/threads/{t}/kill"), json!({}))
            .await;
        assert_eq!(st, 200);
    }
    let (st, r) = s.post("/api/v1/inject", big(6)).await;
    assert_eq!(st, 202, "{r}");
    threads.push(r["thread_id"].as_str().unwrap().to_string());
    // Handled, theirs too: nothing is pending once every thread settles.
    s.organism.control().resume_listener("a").unwrap();
    for t in &threads[2..] {
        settle(&s.organism, t).await;
    }
    wait_until_async("no bytes pending", || async { pending(&s) == 0 }).await;
    let t = s.inject_note("a", "small").await;
    settle(&s.organism, &t).await;
}

#[tokio::test]
async fn pause_resume_and_kill_are_visible_in_rest() {
    let s = chain().await;
    let (st, a) = s.post("/api/v1/agents/b/pause", json!({})).await;
    assert_eq!((st, a["state"].as_str()), (200, Some("paused")));
    let t = s.inject_note("a", "wait").await;
    until(&s.organism, || {
        s.organism.agent("b").unwrap().queue_depth == 1
    })
    .await;
    let (_, b) = s.get("/api/v1/agents/b").await;
    assert_eq!(
        (b["state"].as_str(), b["queue_depth"].as_u64()),
        (Some("paused"), Some(1))
    );
    let (st, _) = s.post("/api/v1/agents/nobody/pause", json!({})).await;
    assert_eq!(st, 404);
    let (st, a) = s.post("/api/v1/agents/b/resume", json!({})).await;
    assert_eq!(st, 200);
    assert_ne!(a["state"], "paused");
    settle(&s.organism, &t).await;

    let (st, o) = s.post("/api/v1/organism/pause", json!({})).await;
    assert_eq!((st, o["status"].as_str()), (200, Some("paused")));
    let t2 = s.inject_note("a", "held").await;
    let (st, k) = s
        .post(&format!("/api/v1/threads/{t2}/kill"), json!({}))
        .await;
    assert_eq!((st, k["status"].as_str()), (200, Some("killed")));
    let (_, th) = s.get(&format!("/api/v1/threads/{t2}")).await;
    assert_eq!(th["status"], "killed");
    assert_eq!(th["messages"][0]["status"], "killed");
    let (st, _) = s.post("/api/v1/threads/nope/kill", json!({})).await;
    assert_eq!(st, 404);
    // A completed thread can be killed too: it is closed for good, and a second kill
    // answers the same.
    let (_, done) = s.get(&format!("/api/v1/threads/{t}")).await;
    assert_eq!(done["status"], "completed");
    for _ in 0..2 {
        let (st, k) = s
            .post(&format!("/api/v1/threads/{t}/kill"), json!({}))
            .await;
        assert_eq!((st, k["status"].as_str()), (200, Some("killed")), "{k}");
    }
    refused_as_killed(&s, &t).await;
    let (st, o) = s.post("/api/v1/organism/resume", json!({})).await;
    assert_eq!((st, o["status"].as_str()), (200, Some("running")));

    // An organism reload of an unchanged file changes nothing, the revision included; a
    // native listener has no script to reload.
    let (st, r) = s.post("/api/v1/organism/reload", json!({})).await;
    assert_eq!((st, r["rev"].as_u64()), (200, Some(1)), "{r}");
    assert_eq!(r["unchanged"], json!(["a", "b", "c"]));
    let (st, e) = s.post("/api/v1/organism/reload?if_rev=2", json!({})).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("rev_mismatch"))
    );
    let (st, e) = s.post("/api/v1/agents/a/reload", json!({})).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("not_reloadable"))
    );
}

#[tokio::test]
async fn metrics_report_messages_handler_time_queues_threads_and_clients() {
    let s = chain().await;
    let t = s.inject_note("a", "m").await;
    settle(&s.organism, &t).await;
    let _ws = ws_connect(&s.ws_url("/ws")).await;
    let text = s.metrics().await;
    for needle in [
        "agentserver_messages_total{agent=\"b\",status=\"delivered\"} 1",
        "agentserver_handler_seconds_count{agent=\"a\"} 1",
        "agentserver_handler_seconds_bucket{agent=\"a\",le=\"+Inf\"} 1",
        "agentserver_queue_depth{agent=\"c\"} 0",
        "agentserver_active_threads 0",
        "agentserver_ws_dropped_events_total{endpoint=\"/ws\"} 0",
        "# TYPE agentserver_handler_seconds histogram",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    // The WebSocket client is counted once its session starts.
    wait_until_async("one /ws client", || async {
        let text = s.metrics().await;
        text.contains("agentserver_ws_clients{endpoint=\"/ws\"} 1")
    })
    .await;
}

#[tokio::test]
async fn openapi_documents_every_endpoint_it_serves() {
    let s = chain().await;
    let (st, doc) = s.get("/api/v1/openapi.json").await;
    assert_eq!(st, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with('3'));
    let paths = doc["paths"].as_object().unwrap();
    let expected = [
        ("/api/v1/organism", "get"),
        ("/api/v1/organism/config", "get"),
        ("/api/v1/agents", "get"),
        ("/api/v1/agents/{name}", "get"),
        ("/api/v1/agents/{name}/config", "get"),
        ("/api/v1/agents/{name}/schema", "get"),
        ("/api/v1/agents/{name}/fields", "get"),
        ("/api/v1/threads", "get"),
        ("/api/v1/threads/{id}", "get"),
        ("/api/v1/threads/{id}/messages", "get"),
        ("/api/v1/messages", "get"),
        ("/api/v1/inject", "post"),
        ("/api/v1/threads/{id}/kill", "post"),
        ("/api/v1/agents/{name}/pause", "post"),
        ("/api/v1/agents/{name}/resume", "post"),
        ("/api/v1/organism/pause", "post"),
        ("/api/v1/organism/resume", "post"),
        ("/api/v1/organism/reload", "post"),
        ("/api/v1/agents/{name}/reload", "post"),
        ("/api/v1/organism/stop", "post"),
        (
            "/api/v1/external/{agent}/threads/{thread_id}/messages",
            "post",
        ),
        ("/api/v1/openapi.json", "get"),
        ("/metrics", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/ws", "get"),
        ("/ws/messages", "get"),
        ("/api/v1/keys", "post"),
        ("/api/v1/keys", "get"),
        ("/api/v1/keys/{name}", "delete"),
        ("/api/v1/audit", "get"),
        ("/api/v1/agents", "post"),
        ("/api/v1/agents/{name}", "delete"),
        ("/api/v1/agents/{name}/scripts", "post"),
        ("/api/v1/agents/{name}/scripts", "get"),
        ("/api/v1/agents/{name}/scripts/{version}", "get"),
        ("/api/v1/agents/{name}/deployments", "post"),
        ("/api/v1/agents/{name}/deployments", "get"),
        ("/api/v1/agents/{name}/scripts/{version}/test", "post"),
        ("/api/v1/me", "get"),
        ("/api/v1/models", "get"),
        ("/api/v1/usage", "get"),
        ("/api/v1/usage/budgets", "get"),
        ("/api/v1/threads/{id}/abort", "post"),
        ("/api/v1/inputs", "get"),
        ("/api/v1/inputs/{id}", "get"),
        ("/api/v1/inputs/{id}/approve", "post"),
        ("/api/v1/inputs/{id}/reject", "post"),
        ("/api/v1/inputs/{id}/answer", "post"),
        ("/api/v1/threads/{id}/events", "get"),
        ("/api/v1/stream-tokens", "post"),
        ("/api/v1/messages/{id}", "get"),
        ("/api/v1/messages/{id}/retry", "post"),
        ("/api/v1/messages/retry", "post"),
        ("/api/v1/threads/count", "get"),
        ("/api/v1/threads/batch", "post"),
        ("/api/v1/threads/{id}/fork", "post"),
        ("/api/v1/threads/{id}/rewind", "post"),
        ("/api/v1/threads/{id}/pause", "post"),
        ("/api/v1/threads/{id}/resume", "post"),
    ];
    for (path, method) in expected {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} undocumented"
        );
    }
    let distinct: std::collections::BTreeSet<&str> = expected.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        paths.len(),
        distinct.len(),
        "documented paths: {:?}",
        paths.keys().collect::<Vec<_>>()
    );
    assert!(doc["components"]["schemas"]["Message"]["properties"]["slot_index"].is_object());
}

#[tokio::test]
async fn readyz_fails_once_the_organism_stops() {
    let s = chain().await;
    s.organism.stop().await;
    let (st, e) = s.get("/readyz").await;
    assert_eq!(st, 503);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("stopped"),
        "{e}"
    );
    let (st, e) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note/>"}),
        )
        .await;
    assert_eq!((st, e["error"]["code"].as_str()), (503, Some("stopping")));
}

/// Every `"$ref"` in `v`, with where it was found.
fn refs(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    if let Some(r) = x.as_str() {
                        out.push((r.to_string(), at.to_string()));
                    }
                } else {
                    refs(x, &format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                refs(x, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn the_served_openapi_document_passes_a_standard_validator_with_no_dangling_ref() {
    let s = chain().await;
    let r = s
        .http
        .get(s.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();

    let mut found = Vec::new();
    refs(&doc, "#", &mut found);
    assert!(!found.is_empty());
    for (r, at) in &found {
        let pointer = r.strip_prefix('#').expect("local refs only");
        assert!(doc.pointer(pointer).is_some(), "{at}: `{r}` is dangling");
    }

    // openapi-spec-validator (Python, installed by scripts/test).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &text).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3 runs (scripts/test installs openapi-spec-validator)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("No module named"),
        "openapi-spec-validator is missing: run scripts/test, or pip install openapi-spec-validator"
    );
    assert!(out.status.success() && said.contains("OK"), "{said}");
}

#[tokio::test]
async fn inject_with_wait_answers_with_the_settled_thread() {
    let s = chain().await;
    let (st, r) = s
        .post(
            "/api/v1/inject?wait=10",
            json!({"to": "a", "payload_xml": "<Note>w</Note>"}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["thread_status"], "completed");
    let ms = r["messages"].as_array().unwrap();
    assert_eq!(ms.len(), 3, "{r}");
    assert_eq!(ms[0]["id"], r["message_id"]);
    assert_eq!(ms[2]["to"], "c");
    assert!(ms.iter().all(|m| m["thread_id"] == r["thread_id"]));

    // A thread that cannot finish in time: the answer says it is still active.
    s.organism.control().pause_listener("b").unwrap();
    let (st, r) = s
        .post(
            "/api/v1/inject?wait=0",
            json!({"to": "a", "payload_xml": "<Note>w</Note>"}),
        )
        .await;
    assert_eq!(
        (st, r["thread_status"].as_str()),
        (200, Some("active")),
        "{r}"
    );

    let (st, e) = s
        .post(
            "/api/v1/inject?wait=61",
            json!({"to": "a", "payload_xml": "<Note>w</Note>"}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["where"].as_str()),
        (400, Some("wait")),
        "{e}"
    );
}

/// A page of messages is bounded by bytes as well as by count: 40 messages of 900 kB asked
/// for in one page of 1000 come in pages that end early, each saying so by its `limit`, and
/// paging on by `offset + limit` reaches every one.
#[tokio::test]
async fn a_page_of_large_messages_ends_early_and_paging_on_reaches_them_all() {
    let s = serve_with(
        Organism::builder(),
        "",
        "  - {name: c, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}",
        ApiOptions::default(),
    )
    .await;
    let big = "x".repeat(900_000);
    let first = inject(&s.organism, "c", &format!("<Note>{big}</Note>"), None);
    for _ in 1..40 {
        inject(
            &s.organism,
            "c",
            &format!("<Note>{big}</Note>"),
            Some(&first.thread_id),
        );
    }
    settle(&s.organism, &first.thread_id).await;
    let mut offset = 0;
    let mut seen = 0;
    while offset < 40 {
        let r = http_get(s.url(&format!("/api/v1/messages?limit=1000&offset={offset}")))
            .await
            .unwrap();
        let bytes = r.bytes().await.unwrap();
        assert!(bytes.len() <= 20 << 20, "{} bytes", bytes.len());
        let page: Value = serde_json::from_slice(&bytes).unwrap();
        let n = page["items"].as_array().unwrap().len();
        assert_eq!(page["total"], 40);
        if offset + n < 40 {
            assert_eq!(page["limit"], n, "the limit says how many were served");
        }
        assert!((1..40).contains(&n), "{n}");
        seen += n;
        offset += n;
    }
    assert_eq!(seen, 40);
}

/// What the framework refuses before a handler (a path parameter that does not parse, a
/// plain GET of a WebSocket endpoint) is answered with the JSON error envelope too, and the
/// document declares the input refusals and the rate limit.
#[tokio::test]
async fn framework_refusals_answer_the_json_envelope_and_are_declared() {
    let s = chain().await;
    for (path, code) in [
        ("/api/v1/agents/a/scripts/-1", "bad_request"),
        ("/ws", "not_websocket"),
        ("/ws/messages", "not_websocket"),
    ] {
        let r = http_get(s.url(path)).await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("application/json"), "{path}: {ct}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{path}: {v}");
        assert_eq!(v["error"]["where"], path, "{v}");
    }
    let (_, doc) = s.get("/api/v1/openapi.json").await;
    let inject = &doc["paths"]["/api/v1/inject"]["post"]["responses"];
    for status in ["400", "415", "429"] {
        assert!(
            inject.get(status).is_some(),
            "inject declares {status}: {inject}"
        );
    }
    let messages = &doc["paths"]["/api/v1/messages"]["get"]["responses"];
    assert!(
        messages["400"]["description"]
            .as_str()
            .unwrap_or("")
            .contains("invalid_query"),
        "{messages}"
    );
    let test = &doc["paths"]["/api/v1/agents/{name}/scripts/{version}/test"]["post"]["responses"];
    assert!(test.get("409").is_some(), "{test}");
    assert_eq!(test["200"].get("links"), None);
    let link = &doc["paths"]["/api/v1/inject"]["post"]["responses"]["202"]["links"]["thread"];
    assert_eq!(link["operationId"], "get_thread", "{link}");
    let since = doc["paths"]["/api/v1/messages"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "since")
        .cloned()
        .unwrap();
    assert_eq!(since["schema"]["format"], "date-time", "{since}");
    // Any RFC 3339 time bounds a filter, one before 1970 included.
    let (st, page) = s
        .get("/api/v1/messages?since=1082-10-28T19:56:30Z&until=0592-11-03T18:27:04%2B18:12")
        .await;
    assert_eq!((st, &page["total"]), (200, &json!(0)), "{page}");
}
