//! Actions name their cause: the events a client's command makes carry `origin {request_id,
//! conn}` on every connection that sees them; every message shows `origin {kind, of}`.

use crate::common::*;
use serde_json::{json, Value};

/// The `connected` frame of a new `/ws` client, and the client.
async fn connect(s: &Served, path: &str) -> (Ws, Value) {
    let mut ws = ws_connect(&s.ws_url(path)).await;
    let connected = next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected", "{connected}");
    (ws, connected)
}

/// Frames read until the `thread_updated` that ends `thread`, or `until` matches.
async fn until_done(ws: &mut Ws, thread: &str) -> Vec<Value> {
    read_until(ws, |f| {
        f["event"] == "thread_updated" && f["thread_id"] == thread && f["status"] == "completed"
    })
    .await
}

#[tokio::test]
async fn a_ws_inject_names_its_request_on_every_connection() {
    let s = super::chain().await;
    let (mut mine, connected) = connect(&s, "/ws").await;
    let conn = connected["conn"].as_str().expect("conn").to_string();
    let (mut other, other_connected) = connect(&s, "/ws").await;
    assert_ne!(other_connected["conn"], connected["conn"]);
    let (mut messages, _) = connect(&s, "/ws/messages").await;

    send_json(
        &mut mine,
        json!({"cmd": "inject", "request_id": "R-1", "to": "a", "payload_xml": "<Note>hi</Note>"}),
    )
    .await;
    let ack = read_until(&mut mine, |f| f["event"] == "ack").await;
    let ack = ack.last().unwrap();
    assert_eq!(
        (&ack["request_id"], &ack["conn"]),
        (&json!("R-1"), &json!(conn))
    );
    let thread = ack["thread_id"].as_str().expect("thread_id").to_string();
    let first = ack["message_id"].as_str().expect("message_id").to_string();

    let cause = json!({"request_id": "R-1", "conn": conn});
    for ws in [&mut mine, &mut other] {
        let frames = until_done(ws, &thread).await;
        let of = |name: &str| {
            frames
                .iter()
                .filter(|f| f["event"] == name)
                .cloned()
                .collect::<Vec<_>>()
        };
        let created = of("thread_created");
        assert_eq!(created.len(), 1, "{frames:?}");
        assert_eq!(created[0]["origin"], cause, "{}", created[0]);
        let msgs = of("message");
        assert_eq!(msgs.len(), 3, "a → b → c: {frames:?}");
        // The injected message: caused by the request, an inject.
        assert_eq!(msgs[0]["origin"], cause, "{}", msgs[0]);
        assert_eq!(msgs[0]["message"]["id"], first.as_str());
        assert_eq!(
            msgs[0]["message"]["origin"],
            json!({"kind": "inject", "of": null})
        );
        // The replies: made by handlers, not by the request; each names what it answers.
        for pair in msgs.windows(2) {
            assert!(pair[1].get("origin").is_none(), "{}", pair[1]);
            assert_eq!(
                pair[1]["message"]["origin"],
                json!({"kind": "reply", "of": pair[0]["message"]["id"]})
            );
        }
    }

    // `/ws/messages`: the message's fields are its frame's, the cause beside `kind`/`of`.
    let frames = read_until(&mut messages, |f| f["event"] == "message" && f["to"] == "c").await;
    let injected = frames
        .iter()
        .find(|f| f["event"] == "message" && f["id"] == first.as_str())
        .expect("the injected message");
    assert_eq!(
        injected["origin"],
        json!({"kind": "inject", "of": null, "request_id": "R-1", "conn": conn})
    );
    let reply = frames.last().unwrap();
    assert_eq!(reply["origin"]["kind"], "reply");
    assert!(reply["origin"].get("request_id").is_none(), "{reply}");
}

#[tokio::test]
async fn a_rest_request_id_is_echoed_and_named_by_its_events() {
    let s = super::chain().await;
    let (mut ws, _) = connect(&s, "/ws").await;
    let inject = |id: Option<&str>| {
        let mut r = s
            .http
            .post(s.url("/api/v1/inject"))
            .json(&json!({"to": "a", "payload_xml": "<Note>x</Note>"}));
        if let Some(id) = id {
            r = r.header("X-Request-Id", id);
        }
        r.send()
    };

    let r = inject(Some("client-7f3a")).await.unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(r.headers()["x-request-id"], "client-7f3a");
    let body: Value = r.json().await.unwrap();
    let thread = body["thread_id"].as_str().unwrap().to_string();
    let frames = until_done(&mut ws, &thread).await;
    let created = frames
        .iter()
        .find(|f| f["event"] == "thread_created")
        .unwrap();
    assert_eq!(
        created["origin"],
        json!({"request_id": "client-7f3a", "conn": null})
    );

    // Without one, the server makes one, echoes it and names it.
    let r = inject(None).await.unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(!made.is_empty());
    let body: Value = r.json().await.unwrap();
    let thread = body["thread_id"].as_str().unwrap().to_string();
    let frames = until_done(&mut ws, &thread).await;
    let message = frames.iter().find(|f| f["event"] == "message").unwrap();
    assert_eq!(message["origin"]["request_id"], made.as_str());

    // Every answer carries one, a refusal too.
    let (status, _) = s.get("/api/v1/threads/nope").await;
    assert_eq!(status, 404);
    let r = s
        .http
        .get(s.url("/api/v1/threads/nope"))
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn a_malformed_request_id_is_refused_where_it_was_sent() {
    let s = super::chain().await;
    for bad in ["has space", &"x".repeat(129), "tab\there"] {
        let r = s
            .http
            .post(s.url("/api/v1/inject"))
            .header("X-Request-Id", bad)
            .json(&json!({"to": "a", "payload_xml": "<Note>x</Note>"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["where"], "header X-Request-Id", "{body}");
    }
    let (mut ws, _) = connect(&s, "/ws").await;
    for bad in [json!({"a": 1}), json!("two words"), json!("y".repeat(129))] {
        send_json(
            &mut ws,
            json!({"cmd": "pause", "agent": "b", "request_id": bad}),
        )
        .await;
        let reply = read_until(&mut ws, |f| f["event"] == "error").await;
        let reply = reply.last().unwrap();
        assert_eq!(reply["where"], "request_id", "{reply}");
    }
    // Nothing was done: no thread, and `b` was never paused.
    let (_, b) = s.get("/api/v1/agents/b").await;
    assert_ne!(b["state"], "paused", "{b}");
    let (_, threads) = s.get("/api/v1/threads").await;
    assert_eq!(threads["total"], 0, "{threads}");
}

#[tokio::test]
async fn controls_name_their_request() {
    let s = super::chain().await;
    let (mut ws, connected) = connect(&s, "/ws").await;
    let conn = connected["conn"].clone();
    // A numeric request id stays a number.
    send_json(
        &mut ws,
        json!({"cmd": "pause", "agent": "b", "request_id": 7}),
    )
    .await;
    let frames = read_until(&mut ws, |f| {
        f["event"] == "agent_state" && f["agent"] == "b" && f["state"] == "paused"
    })
    .await;
    let paused = frames.last().unwrap();
    assert_eq!(paused["origin"], json!({"request_id": 7, "conn": conn}));

    // A REST kill of a thread held at the paused `b`: its end names the request.
    let thread = s.inject_note("a", "stuck").await;
    read_until(&mut ws, |f| {
        f["event"] == "message" && f["message"]["to"] == "b"
    })
    .await;
    let r = s
        .http
        .post(s.url(&format!("/api/v1/threads/{thread}/kill")))
        .header("X-Request-Id", "kill-1")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let frames = read_until(&mut ws, |f| {
        f["event"] == "thread_updated"
            && f["thread_id"] == thread.as_str()
            && f["status"] == "killed"
    })
    .await;
    assert_eq!(
        frames.last().unwrap()["origin"],
        json!({"request_id": "kill-1", "conn": null})
    );

    // A reload through REST: its `reload` event names it.
    let r = s
        .http
        .post(s.url("/api/v1/organism/reload"))
        .header("X-Request-Id", "reload-1")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let frames = read_until(&mut ws, |f| f["event"] == "reload").await;
    assert_eq!(frames.last().unwrap()["origin"]["request_id"], "reload-1");
}
