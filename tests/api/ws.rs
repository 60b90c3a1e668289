//! `/ws` and `/ws/messages` against a real server with real tokio-tungstenite clients.

use std::time::Duration;

use crate::common::*;
use crate::{chain, chain_with_small_queues};
use agentserver::api::ApiOptions;
use agentserver::Organism;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// The next `message` frame of `/ws/messages`, past status changes (tested on their own in
/// `ws_messages_shows_each_status_change_of_a_message`).
async fn next_message(ws: &mut Ws) -> Value {
    loop {
        let f = next_json(ws).await;
        if f["event"] != "message_status" {
            return f;
        }
    }
}

fn thread_done(thread: &str) -> impl Fn(&Value) -> bool + '_ {
    move |v| v["event"] == "thread_updated" && v["thread_id"] == thread && v["status"] != "active"
}

#[tokio::test]
async fn ws_sends_a_snapshot_then_every_event_in_seq_order() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    let hello = next_json(&mut ws).await;
    assert_eq!(hello["event"], "connected");
    assert_eq!(hello["organism"]["name"], "test");
    assert_eq!(hello["agents"].as_array().unwrap().len(), 3);
    assert!(hello["threads"].is_array());
    let start = hello["seq"].as_u64().unwrap();

    let t = s.inject_note("a", "hello").await;
    let frames = read_until(&mut ws, thread_done(&t)).await;
    let mut last = start;
    for f in &frames {
        let seq = f["seq"].as_u64().unwrap();
        assert!(seq > last, "seq must increase: {last} then {seq}");
        last = seq;
        assert!(f["timestamp"].as_str().unwrap().ends_with('Z'));
    }
    let names: Vec<&str> = frames
        .iter()
        .map(|f| f["event"].as_str().unwrap())
        .collect();
    for needed in [
        "thread_created",
        "message",
        "agent_state",
        "message_status",
        "thread_updated",
    ] {
        assert!(names.contains(&needed), "no {needed} in {names:?}");
    }
    let messages: Vec<&Value> = frames.iter().filter(|f| f["event"] == "message").collect();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0]["message"]["from"], "api");
    assert_eq!(messages[2]["message"]["to"], "c");
}

#[tokio::test]
async fn subscribe_filters_by_agent_glob_thread_and_event_type() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await;
    send_json(&mut ws, json!({"cmd": "subscribe", "request_id": 7, "agents": ["b*"], "events": ["message", "agent_state"]})).await;
    let ack = next_json(&mut ws).await;
    assert_eq!(
        (ack["event"].as_str(), ack["request_id"].as_i64()),
        (Some("ack"), Some(7))
    );
    assert_eq!(ack["filter"]["agents"], json!(["b*"]));

    let t = s.inject_note("a", "x").await;
    settle(&s.organism, &t).await;
    // A marker: pausing `c` publishes an agent_state for `c` only, which the filter hides;
    // pausing `b` afterwards is the last frame we expect.
    s.organism.control().pause_listener("c").unwrap();
    s.organism.control().pause_listener("b").unwrap();
    let frames = read_until(&mut ws, |v| {
        v["event"] == "agent_state" && v["state"] == "paused"
    })
    .await;
    for f in &frames {
        match f["event"].as_str().unwrap() {
            "message" => {
                let m = &f["message"];
                assert!(m["from"] == "b" || m["to"] == "b", "{f}");
            }
            "agent_state" => assert_eq!(f["agent"], "b", "{f}"),
            other => panic!("filtered out: {other}"),
        }
    }
    assert_eq!(frames.iter().filter(|f| f["event"] == "message").count(), 2);

    // Threads filter, given as a query parameter on connect.
    let t1 = s.inject_note("a", "one").await;
    let mut only =
        ws_connect(&s.ws_url(&format!("/ws?threads={t1}&events=thread_updated,message"))).await;
    next_json(&mut only).await;
    s.organism.control().resume_listener("b").unwrap();
    s.organism.control().resume_listener("c").unwrap();
    let t2 = s.inject_note("a", "two").await;
    settle(&s.organism, &t2).await;
    settle(&s.organism, &t1).await;
    let frames = read_until(&mut only, thread_done(&t1)).await;
    for f in &frames {
        let thread = f
            .get("thread_id")
            .or(f["message"].get("thread_id"))
            .unwrap();
        assert_eq!(thread, &json!(t1), "{f}");
    }

    // Bad filters are refused, on connect and by command.
    let r = s
        .http
        .get(s.url("/ws?events=nonsense"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "x", "events": ["mesage"]}),
    )
    .await;
    let e = read_until(&mut ws, |v| v["request_id"] == "x")
        .await
        .pop()
        .unwrap();
    assert_eq!(e["event"], "error");
    assert!(e["error"].as_str().unwrap().contains("mesage"));
}

#[tokio::test]
async fn commands_are_answered_with_their_request_id() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await;
    let answer = |id: &'static str| move |v: &Value| v["request_id"] == id;

    send_json(
        &mut ws,
        json!({"cmd": "inject", "request_id": "i1", "to": "a", "payload": "via ws"}),
    )
    .await;
    let ack = read_until(&mut ws, answer("i1")).await.pop().unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");
    let thread = ack["thread_id"].as_str().unwrap().to_string();
    assert!(ack["message_id"].as_str().is_some());
    settle(&s.organism, &thread).await;
    assert_eq!(
        s.organism.history().thread_messages(&thread).unwrap()[0]
            .from
            .as_ref(),
        "ws"
    );

    send_json(
        &mut ws,
        json!({"cmd": "inject", "request_id": "i2", "to": "a", "payload_xml": "<Note><x/></Note>"}),
    )
    .await;
    let err = read_until(&mut ws, answer("i2")).await.pop().unwrap();
    assert_eq!(
        (err["event"].as_str(), err["status"].as_u64()),
        (Some("error"), Some(422))
    );
    assert_eq!(err["code"], "invalid_payload");
    assert!(!err["details"].as_array().unwrap().is_empty());

    send_json(
        &mut ws,
        json!({"cmd": "pause", "request_id": "p", "agent": "b"}),
    )
    .await;
    let frames = read_until(&mut ws, answer("p")).await;
    assert_eq!(frames.last().unwrap()["event"], "ack");
    read_until(&mut ws, |v| {
        v["event"] == "agent_state" && v["agent"] == "b" && v["state"] == "paused"
    })
    .await;
    send_json(
        &mut ws,
        json!({"cmd": "resume", "request_id": "r", "agent": "b"}),
    )
    .await;
    read_until(&mut ws, answer("r")).await;
    send_json(
        &mut ws,
        json!({"cmd": "pause", "request_id": "pz", "agent": "zz"}),
    )
    .await;
    let e = read_until(&mut ws, answer("pz")).await.pop().unwrap();
    assert_eq!(
        (e["event"].as_str(), e["code"].as_str()),
        (Some("error"), Some("unknown_listener"))
    );

    send_json(&mut ws, json!({"cmd": "pause", "request_id": "po"})).await;
    read_until(&mut ws, |v| {
        v["event"] == "organism_state" && v["status"] == "paused"
    })
    .await;
    let t = s.inject_note("a", "held").await;
    send_json(
        &mut ws,
        json!({"cmd": "kill", "request_id": "k", "thread_id": t}),
    )
    .await;
    let frames = read_until(&mut ws, answer("k")).await;
    assert_eq!(frames.last().unwrap()["event"], "ack");
    read_until(&mut ws, |v| {
        v["event"] == "thread_updated" && v["thread_id"] == t && v["status"] == "killed"
    })
    .await;
    send_json(&mut ws, json!({"cmd": "resume", "request_id": "ro"})).await;
    read_until(&mut ws, answer("ro")).await;

    // An organism reload: the ack carries the diff; a stale `if_rev` is refused.
    send_json(&mut ws, json!({"cmd": "reload", "request_id": 1})).await;
    let a = read_until(&mut ws, |v| v["request_id"] == 1)
        .await
        .pop()
        .unwrap();
    assert_eq!(a["event"], "ack", "{a}");
    assert_eq!(a["rev"], 1, "nothing changed: the revision stays");
    assert_eq!(a["unchanged"], json!(["a", "b", "c"]));
    send_json(
        &mut ws,
        json!({"cmd": "reload", "request_id": 2, "if_rev": 2}),
    )
    .await;
    let e = read_until(&mut ws, |v| v["request_id"] == 2)
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (e["event"].as_str(), e["code"].as_str()),
        (Some("error"), Some("rev_mismatch"))
    );

    send_json(&mut ws, json!({"cmd": "dance", "request_id": "d"})).await;
    let e = read_until(&mut ws, answer("d")).await.pop().unwrap();
    assert_eq!(e["code"], "bad_request");
    use tokio_tungstenite::tungstenite::Message as Frame;
    let e = unanswerable(&mut ws, Frame::Text("not json".into())).await;
    assert!(e["error"].as_str().unwrap().contains("JSON object"));
    assert!(e["error"].as_str().unwrap().contains("not JSON"), "{e}");
    assert_eq!(e["where"], "line 1, column 2", "{e}");
    // A request_id JSON cannot hold says so, where it stands, not that `cmd` is missing.
    let huge = format!(r#"{{"cmd": "ping", "request_id": 1{}}}"#, "0".repeat(400));
    let e = unanswerable(&mut ws, Frame::Text(huge.into())).await;
    assert!(
        e["error"].as_str().unwrap().contains("number out of range"),
        "{e}"
    );
    assert!(
        e["where"].as_str().unwrap().starts_with("line 1, column "),
        "{e}"
    );
    // A binary frame is answered, not ignored; the session goes on.
    let binary = Frame::Binary(br#"{"cmd": "ping"}"#.to_vec().into());
    let e = unanswerable(&mut ws, binary).await;
    assert_eq!(e["code"], "bad_request", "{e}");
    assert!(e["error"].as_str().unwrap().contains("binary frame"), "{e}");
    send_json(&mut ws, json!({"cmd": "dance", "request_id": "after"})).await;
    read_until(&mut ws, answer("after")).await;
}

#[tokio::test]
async fn ws_messages_streams_message_objects_with_filters() {
    let s = chain().await;
    let mut all = ws_connect(&s.ws_url("/ws/messages")).await;
    let hello = next_json(&mut all).await;
    assert_eq!(hello["event"], "connected");
    let mut to_c = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut to_c).await;
    send_json(&mut to_c, json!({"cmd": "subscribe", "request_id": 1, "filter": {"agents": ["c"], "payload_types": ["Note"]}})).await;
    assert_eq!(next_json(&mut to_c).await["event"], "ack");

    let t = s.inject_note("a", "m").await;
    let frames: Vec<Value> = read_until(&mut all, |v| v["to"] == "c" && v["event"] == "message")
        .await
        .into_iter()
        .filter(|f| f["event"] != "message_status")
        .collect();
    assert_eq!(frames.len(), 3);
    let mut last = hello["seq"].as_u64().unwrap();
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["event"], "message");
        assert_eq!(f["thread_id"], t.as_str());
        assert_eq!(f["slot_index"], i as u64);
        assert!(f["seq"].as_u64().unwrap() > last);
        last = f["seq"].as_u64().unwrap();
        for key in [
            "id",
            "from",
            "to",
            "payload_type",
            "payload",
            "timestamp",
            "status",
        ] {
            assert!(f.get(key).is_some(), "{key} missing in {f}");
        }
    }
    let only = next_message(&mut to_c).await;
    assert_eq!(
        (only["from"].as_str(), only["to"].as_str()),
        (Some("b"), Some("c"))
    );

    // Threads filter; other commands are refused here.
    let t2 = s.inject_note("a", "other").await;
    let mut one = ws_connect(&s.ws_url(&format!("/ws/messages?threads={t2}&agents=a"))).await;
    next_json(&mut one).await;
    send_json(
        &mut one,
        json!({"cmd": "kill", "request_id": "k", "thread_id": t2}),
    )
    .await;
    let e = read_until(&mut one, |v| v["request_id"] == "k")
        .await
        .pop()
        .unwrap();
    assert_eq!(e["event"], "error");
}

#[tokio::test]
async fn reconnecting_with_since_loses_nothing() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut ws).await;
    let t = s.inject_note("a", "before").await;
    let seen = read_until(&mut ws, |v| v["to"] == "c").await;
    let last_seq = seen.last().unwrap()["seq"].as_u64().unwrap();
    settle(&s.organism, &t).await;
    drop(ws);

    // Missed while disconnected.
    let mut missed = Vec::new();
    for i in 0..5 {
        let t = s.inject_note("a", &format!("missed {i}")).await;
        settle(&s.organism, &t).await;
        missed.extend(
            s.organism
                .history()
                .thread_messages(&t)
                .unwrap()
                .into_iter()
                .map(|m| m.id.to_string()),
        );
    }
    let mut again = ws_connect(&s.ws_url(&format!("/ws/messages?since={last_seq}"))).await;
    let mut got = Vec::new();
    let mut prev = last_seq;
    while got.len() < missed.len() {
        let f = next_json(&mut again).await;
        assert!(
            f["event"] == "message" || f["event"] == "message_status",
            "replay is messages and their status changes only, no snapshot: {f}"
        );
        let seq = f["seq"].as_u64().unwrap();
        assert!(seq > prev);
        prev = seq;
        if f["event"] == "message" {
            got.push(f["id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(got, missed);
    // And then it is live.
    let t = s.inject_note("a", "live").await;
    let f = next_message(&mut again).await;
    assert_eq!(f["thread_id"], t.as_str());

    // The same on /ws, with a filter applied to the replay.
    let mut events =
        ws_connect(&s.ws_url(&format!("/ws?since={last_seq}&events=thread_created"))).await;
    let mut created = 0;
    while created < 6 {
        let f = next_json(&mut events).await;
        assert_eq!(f["event"], "thread_created");
        created += 1;
    }
}

#[tokio::test]
async fn a_since_no_longer_retained_gets_resync_required_and_a_fresh_snapshot() {
    let s = serve_with(
        Organism::builder().event_capacity(16),
        "",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    for i in 0..10 {
        let t = s.inject_note("a", &format!("{i}")).await;
        settle(&s.organism, &t).await;
    }
    for path in ["/ws?since=1", "/ws/messages?since=1", "/ws?since=999999"] {
        let mut ws = ws_connect(&s.ws_url(path)).await;
        let first = next_json(&mut ws).await;
        assert_eq!(first["event"], "resync_required", "{path}: {first}");
        assert!(first["oldest_seq"].as_u64().unwrap() > 2);
        let second = next_json(&mut ws).await;
        assert_eq!(second["event"], "connected", "{path}");
        assert_eq!(second["seq"], first["seq"]);
    }
}

#[tokio::test]
async fn a_client_that_never_reads_gets_dropped_while_a_fast_one_gets_everything() {
    // Bounds small enough that the silent client overflows them long before the run ends
    // (its socket buffers fill first), with room enough that the reading client, sharing
    // this machine with the other tests, does not.
    let s = chain_with_small_queues(64, 256 * 1024).await;
    // The slow client: connected, never read until the end.
    let mut slow = ws_connect(&s.ws_url("/ws/messages")).await;
    let mut fast = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut fast).await;

    let big = "y".repeat(4000);
    const THREADS: usize = 600;
    let reader = tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut last = 0;
        while ids.len() < THREADS * 3 {
            let f = next_message(&mut fast).await;
            assert_eq!(f["event"], "message", "the fast client loses nothing: {f}");
            let seq = f["seq"].as_u64().unwrap();
            assert!(seq > last, "in order");
            last = seq;
            ids.push(f["id"].as_str().unwrap().to_string());
        }
        ids
    });
    let mut threads = Vec::new();
    for _ in 0..THREADS {
        threads.push(s.inject_note("a", &big).await);
    }
    // The pump finishes every thread while the slow client reads nothing.
    for t in &threads {
        assert_eq!(
            settle(&s.organism, t).await,
            agentserver::threads::ThreadStatus::Completed
        );
    }
    let ids = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    assert_eq!(ids.len(), THREADS * 3);

    // Now the slow client reads: it is told what it missed.
    let mut dropped = None;
    let mut received = 0;
    while dropped.is_none() {
        let f = next_json(&mut slow).await;
        match f["event"].as_str().unwrap() {
            "dropped" => dropped = Some(f),
            "message" | "connected" => received += 1,
            "message_status" => {}
            other => panic!("unexpected {other}"),
        }
    }
    let d = dropped.unwrap();
    assert!(d["count"].as_u64().unwrap() > 0);
    assert!(d["from_seq"].as_u64().unwrap() <= d["to_seq"].as_u64().unwrap());
    assert!(
        received < THREADS * 3,
        "the slow client did not get everything"
    );
    let text = s.metrics().await;
    assert!(
        !text.contains("agentserver_ws_dropped_events_total{endpoint=\"/ws/messages\"} 0"),
        "{text}"
    );
}

#[tokio::test]
async fn a_client_that_stops_answering_pings_is_closed() {
    let options = ApiOptions {
        heartbeat: Duration::from_millis(100),
        ..ApiOptions::default()
    };
    let s = serve_with(Organism::builder(), "", CHAIN, options).await;
    // A live client answers pings (tokio-tungstenite does while it is read) and stays.
    let mut live = ws_connect(&s.ws_url("/ws")).await;
    // A dead one: connected, never polled again, so it never answers a ping.
    let _dead = ws_connect(&s.ws_url("/ws")).await;
    let keep_reading = tokio::spawn(async move {
        let mut frames = 0;
        while let Some(Ok(_)) = live.next().await {
            frames += 1;
        }
        frames
    });
    // Two clients connected; after two silent heartbeats only the live one remains.
    let served = &s;
    let clients = |n: usize| async move {
        served
            .metrics()
            .await
            .contains(&format!("agentserver_ws_clients{{endpoint=\"/ws\"}} {n}"))
    };
    wait_until_async("two /ws clients", || clients(2)).await;
    wait_until_async("the silent client to be dropped", || clients(1)).await;
    assert!(
        !keep_reading.is_finished(),
        "the live client is still connected"
    );
    // Closing the server closes the live client too.
    let Served { server, .. } = s;
    server.shutdown().await;
    let frames = tokio::time::timeout(WAIT, keep_reading)
        .await
        .unwrap()
        .unwrap();
    assert!(frames >= 1);
}

#[tokio::test]
async fn stop_by_command_drains_and_signals_the_server_owner() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await;
    send_json(&mut ws, json!({"cmd": "stop", "request_id": "s"})).await;
    let frames = read_until(&mut ws, |v| {
        v["event"] == "organism_state" && v["status"] == "stopped"
    })
    .await;
    assert!(frames
        .iter()
        .any(|f| f["event"] == "ack" && f["request_id"] == "s"));
    tokio::time::timeout(WAIT, s.server.stop_requested())
        .await
        .expect("stop requested");
    let (st, _) = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note/>"}),
        )
        .await;
    assert_eq!(st, 503);
}

#[tokio::test]
async fn every_frame_seq_on_a_connection_is_monotonic_acks_included() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    let first = next_json(&mut ws).await;
    let mut last = first["seq"].as_u64().unwrap();
    for i in 0..20 {
        let id = format!("r{i}");
        send_json(
            &mut ws,
            json!({"cmd": "inject", "request_id": id, "to": "a", "payload": "x"}),
        )
        .await;
        // Read past the ack to the thread's completion; every frame's seq keeps order.
        let mut thread = None;
        loop {
            let f = next_json(&mut ws).await;
            let seq = f["seq"].as_u64().unwrap();
            assert!(seq >= last, "seq went back from {last} to {seq}: {f}");
            last = seq;
            if f["request_id"] == id.as_str() {
                thread = f["thread_id"].as_str().map(str::to_string);
            }
            let done = thread.as_deref().is_some_and(|t| thread_done(t)(&f));
            if done {
                break;
            }
        }
    }
}

#[tokio::test]
async fn a_client_that_sends_commands_and_never_reads_is_closed() {
    let options = ApiOptions {
        client_queue_bytes: 64 * 1024,
        ..ApiOptions::default()
    };
    let s = serve_with(Organism::builder(), "", CHAIN, options).await;
    let ws = ws_connect(&s.ws_url("/ws")).await;
    let (mut sink, stream) = futures_util::StreamExt::split(ws);
    // Commands whose answers are errors, far more than the socket buffers and the queue hold.
    let writer = tokio::spawn(async move {
        use futures_util::SinkExt;
        let bad = json!({"cmd": "nope", "request_id": "x".repeat(200)}).to_string();
        for _ in 0..100_000 {
            if sink
                .send(tokio_tungstenite::tungstenite::Message::Text(
                    bad.clone().into(),
                ))
                .await
                .is_err()
            {
                return true;
            }
        }
        false
    });
    // The server ends the session without the client reading a frame.
    wait_until_async("no /ws client left", || async {
        s.metrics()
            .await
            .contains("agentserver_ws_clients{endpoint=\"/ws\"} 0")
    })
    .await;
    drop(stream);
    let _ = writer.await;
    let (st, _) = s.get("/healthz").await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn subscription_filters_are_bounded_in_entries_and_bytes() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await;
    let many: Vec<String> = (0..1000).map(|i| format!("*a*a*a*a*a*a*a*b{i}")).collect();
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "m", "agents": many}),
    )
    .await;
    let e = read_until(&mut ws, |v| v["request_id"] == "m")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (e["event"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(400)),
        "{e}"
    );
    assert_eq!(e["where"], "filter");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("limits.max_filter_entries"),
        "{e}"
    );

    let long = "x".repeat(300);
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "l", "threads": [long]}),
    )
    .await;
    let e = read_until(&mut ws, |v| v["request_id"] == "l")
        .await
        .pop()
        .unwrap();
    assert_eq!(e["where"], "threads", "{e}");
    assert!(e["error"]
        .as_str()
        .unwrap()
        .contains("limits.max_filter_entry_bytes"));

    // A filter within the limits works, pathological globs included.
    send_json(&mut ws, json!({"cmd": "subscribe", "request_id": "ok", "agents": ["*a*a*a*a*a*a*a*b", "?"], "events": ["message"]})).await;
    let ack = read_until(&mut ws, |v| v["request_id"] == "ok")
        .await
        .pop()
        .unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "b", "agents": ["b"], "events": ["message"]}),
    )
    .await;
    read_until(&mut ws, |v| v["request_id"] == "b").await;
    let t = s.inject_note("a", "hi").await;
    let m = read_until(&mut ws, |v| v["event"] == "message")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (
            m["message"]["thread_id"].as_str(),
            m["message"]["to"].as_str()
        ),
        (Some(t.as_str()), Some("b")),
        "{m}"
    );

    // On the URL too.
    let url = format!("{}?agents={}", s.ws_url("/ws"), vec!["a*"; 300].join(","));
    match tokio_tungstenite::connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("a filter over the limit connected: {other:?}"),
    }
}

#[tokio::test]
async fn ws_messages_shows_each_status_change_of_a_message() {
    let s = chain().await;
    let mut ws = ws_connect(&format!("{}?agents=c", s.ws_url("/ws/messages"))).await;
    next_json(&mut ws).await;
    let t = s.inject_note("a", "hi").await;
    // b -> c, nothing about a. Its frame shows the status it has when the frame is written:
    // pending, then its change to delivered in a `message_status` frame of the same id; or
    // delivered already, and then no frame repeats it.
    let m = next_json(&mut ws).await;
    assert_eq!(m["event"], "message", "{m}");
    assert_eq!(
        (m["from"].as_str(), m["to"].as_str()),
        (Some("b"), Some("c"))
    );
    if m["status"] == "pending" {
        let st = next_json(&mut ws).await;
        assert_eq!(st["event"], "message_status", "{st}");
        assert_eq!(st["id"], m["id"]);
        assert_eq!(st["thread_id"], t.as_str());
        assert_eq!(st["status"], "delivered");
        assert_eq!(
            (
                st["from"].as_str(),
                st["to"].as_str(),
                st["payload_type"].as_str()
            ),
            (Some("b"), Some("c"), Some("Note"))
        );
        assert_eq!(st["slot_index"], m["slot_index"]);
        assert!(st["seq"].as_u64().unwrap() > m["seq"].as_u64().unwrap());
    } else {
        assert_eq!(m["status"], "delivered", "{m}");
    }

    // A reader that comes later is shown, in the frames no reader took before (a's and
    // b's messages), the statuses they reached: no `message_status` frame repeats them.
    let mut late = ws_connect(&format!("{}?since=0", s.ws_url("/ws/messages"))).await;
    let frames = read_until(&mut late, |f| f["event"] == "message" && f["to"] == "c").await;
    let others: Vec<&Value> = frames
        .iter()
        .filter(|f| f["thread_id"] == t.as_str() && f["to"] != "c")
        .collect();
    assert_eq!(others.len(), 2, "{frames:?}");
    for f in others {
        assert_eq!(
            (&f["event"], &f["status"]),
            (&json!("message"), &json!("delivered")),
            "{f}"
        );
    }
}

#[tokio::test]
async fn a_client_may_take_agent_states_coalesced_and_messages_folded_past_a_rate() {
    let s = chain().await;
    // Out of range: the upgrade is refused, naming the option.
    match tokio_tungstenite::connect_async(s.ws_url("/ws?coalesce_ms=1")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 400);
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).to_string();
            assert!(
                body.contains("coalesce_ms is 1; it must be 10 to 60000"),
                "{body}"
            );
        }
        other => panic!("an interval out of range connected: {other:?}"),
    }

    let mut plain = ws_connect(&s.ws_url("/ws")).await;
    let mut folded = ws_connect(&s.ws_url("/ws?coalesce_ms=50&max_messages_per_s=3")).await;
    next_json(&mut plain).await;
    let hello = next_json(&mut folded).await;
    let mut last = hello["seq"].as_u64().unwrap();
    let started = std::time::Instant::now();
    let mut threads = Vec::new();
    for i in 0..10 {
        threads.push(s.inject_note("a", &format!("n{i}")).await);
    }
    // The reference: every message event, as a client that folds nothing sees them.
    let last_thread = threads.last().unwrap().clone();
    let all = read_until(&mut plain, thread_done(&last_thread)).await;
    let is_message = |f: &Value| f["event"] == "message" || f["event"] == "message_status";
    let expected = all.iter().filter(|f| is_message(f)).count() as u64;
    assert!(expected >= 30, "{expected}");

    // The folded client: what it was sent and what it was told it was not, until they add
    // up to every message event.
    let (mut sent, mut told, mut states, mut coalesced) = (0u64, 0u64, 0, 0);
    let deadline = std::time::Instant::now() + WAIT;
    while sent + told < expected {
        assert!(
            std::time::Instant::now() < deadline,
            "sent {sent} + told {told} of {expected}"
        );
        let f = next_json(&mut folded).await;
        let seq = f["seq"].as_u64().unwrap();
        assert!(seq >= last, "seq went back from {last} to {seq}: {f}");
        last = seq;
        assert_ne!(
            f["event"], "agent_state",
            "coalesced states come as agent_states: {f}"
        );
        if is_message(&f) {
            sent += 1;
        }
        if f["event"] == "folded" {
            assert_eq!(f["kind"], "message");
            assert!(f["from_seq"].as_u64() <= f["to_seq"].as_u64());
            told += f["count"].as_u64().unwrap();
        }
        if f["event"] == "agent_states" {
            states += 1;
            coalesced += f["replaced"].as_u64().unwrap();
            for a in f["states"].as_array().unwrap() {
                assert!(
                    a["agent"].is_string() && a["state"].is_string() && a["seq"].is_u64(),
                    "{f}"
                );
            }
        }
    }
    assert_eq!(sent + told, expected);
    assert!(
        told > 0,
        "ten threads in well under a few seconds pass 3 a second"
    );
    let seconds = started.elapsed().as_secs() + 1;
    assert!(sent <= 3 * seconds, "{sent} message frames in {seconds} s");
    assert!(
        states > 0 && coalesced > 0,
        "{states} agent_states frames, {coalesced} replaced"
    );

    // A subscription may turn it off: every message event again.
    send_json(
        &mut folded,
        json!({"cmd": "subscribe", "request_id": "all"}),
    )
    .await;
    read_until(&mut folded, |v| v["request_id"] == "all").await;
    let t = s.inject_note("a", "after").await;
    let frames = read_until(&mut folded, thread_done(&t)).await;
    assert_eq!(frames.iter().filter(|f| f["event"] == "message").count(), 3);
    send_json(
        &mut folded,
        json!({"cmd": "subscribe", "request_id": "bad", "max_messages_per_s": 0}),
    )
    .await;
    let e = read_until(&mut folded, |v| v["request_id"] == "bad")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (e["event"].as_str(), e["where"].as_str()),
        (Some("error"), Some("max_messages_per_s")),
        "{e}"
    );
}

/// Protocol errors close the session with their status code (RFC 6455 §7.4.1), on `/ws`
/// and `/ws/messages`: 1009 for a message over the limit, 1007 for text that is not UTF-8,
/// 1002 for a continuation frame that continues nothing.
#[tokio::test]
async fn protocol_errors_close_with_their_status_code() {
    let s = serve_with(
        Organism::builder(),
        "  max_message_bytes: 1024",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    for path in ["/ws", "/ws/messages"] {
        // The frame limit is twice max_message_bytes plus 64 KiB.
        let codes = protocol_error_closes(&s.ws_url(path), None, 80 * 1024).await;
        assert_eq!(codes, [Some(1009), Some(1007), Some(1002)], "{path}");
    }
    assert_eq!(http_get(s.url("/healthz")).await.unwrap().status(), 200);
}

/// A command nobody knows, or one that is not a JSON object: an error frame naming what is
/// known, and the session goes on.
#[tokio::test]
async fn an_unknown_command_is_answered_and_the_session_stays_open() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await;
    send_json(&mut ws, json!({"cmd": "dance", "request_id": 1})).await;
    let frames = read_until(&mut ws, |v| v["request_id"] == 1).await;
    let e = frames.last().unwrap();
    assert_eq!(
        (e["event"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(400)),
        "{e}"
    );
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .starts_with("unknown command `dance` (known: subscribe"),
        "{e}"
    );
    assert_eq!(e["where"], "cmd");
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": 2, "agents": ["a"]}),
    )
    .await;
    let frames = read_until(&mut ws, |v| v["request_id"] == 2).await;
    assert_eq!(frames.last().unwrap()["event"], "ack");
}

/// A `/ws/messages` session holds frames a moment (so a status change can go in its
/// message's frame), but never lets an answer overtake them: `seq` only goes up, and every
/// message arrives with its final status once status frames are folded in.
#[tokio::test]
async fn ws_messages_answers_go_after_the_frames_held() {
    let s = chain().await;
    let mut ws = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut ws).await;
    let mut threads = Vec::new();
    for i in 0..5 {
        threads.push(s.inject_note("a", &format!("h{i}")).await);
    }
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": 7, "filter": {}}),
    )
    .await;
    let last = threads.last().unwrap().clone();
    let mut frames = read_until(&mut ws, |f| {
        f["thread_id"] == last.as_str() && f["to"] == "c" && f["status"] == "delivered"
    })
    .await;
    if frames.iter().all(|f| f["event"] != "ack") {
        frames.extend(read_until(&mut ws, |f| f["event"] == "ack").await);
    }
    let mut prev = 0;
    for f in &frames {
        let seq = f["seq"].as_u64().unwrap();
        assert!(
            seq >= prev,
            "seq went back from {prev} to {seq}: {frames:?}"
        );
        prev = seq;
    }
    let kept = fold_statuses(frames);
    for t in &threads {
        let mine: Vec<&Value> = kept
            .iter()
            .filter(|f| f["event"] == "message" && f["thread_id"] == t.as_str())
            .collect();
        assert_eq!(mine.len(), 3, "{kept:?}");
        assert!(mine.iter().all(|f| f["status"] == "delivered"), "{mine:?}");
    }
}

/// `subscribe` with `history: true`: the thread's messages so far as `thread_snapshot`,
/// then the `ack`, then its live events, no message twice.
#[tokio::test]
async fn a_subscription_with_history_sends_the_thread_so_far_then_live() {
    let s = chain().await;
    let t = s.inject_note("a", "first").await;
    settle(&s.organism, &t).await;
    let before: Vec<String> = messages(&s.organism, &t)
        .iter()
        .map(|m| m.id.to_string())
        .collect();
    assert_eq!(before.len(), 3);
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    next_json(&mut ws).await; // connected
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "h", "threads": [t], "history": true}),
    )
    .await;
    let frames = read_until(&mut ws, |f| f["request_id"] == "h").await;
    let snapshots: Vec<&Value> = frames
        .iter()
        .filter(|f| f["event"] == "thread_snapshot")
        .collect();
    let held: Vec<&str> = snapshots
        .iter()
        .flat_map(|f| f["messages"].as_array().unwrap())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(held, before, "{frames:?}");
    let ack = frames.last().unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");
    let as_of = ack["history"][&t].as_u64().expect("the snapshot's seq");
    assert_eq!(snapshots[0]["thread"]["id"], t);

    // Live: the thread's new messages, each once, after the snapshot's seq.
    let r = s
        .post(
            "/api/v1/inject",
            json!({"to": "a", "payload_xml": "<Note>second</Note>", "thread_id": t}),
        )
        .await;
    assert_eq!(r.0, 202);
    let mut live = Vec::new();
    while live.len() < 3 {
        let f = next_json(&mut ws).await;
        if f["event"] == "message" {
            assert!(f["seq"].as_u64().unwrap() > as_of, "{f}");
            let id = f["message"]["id"].as_str().unwrap().to_string();
            assert!(!before.contains(&id) && !live.contains(&id), "{f}");
            live.push(id);
        }
    }

    // What it refuses: no threads, too many, another endpoint, not a boolean.
    let many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    for (spec, at) in [
        (json!({"history": true}), "threads"),
        (json!({"history": true, "threads": many}), "threads"),
        (json!({"history": "yes", "threads": [t]}), "history"),
        (
            json!({"history": true, "threads": ["no-such-thread"]}),
            "threads",
        ),
    ] {
        let mut cmd = spec.clone();
        cmd["cmd"] = json!("subscribe");
        cmd["request_id"] = json!("bad");
        send_json(&mut ws, cmd).await;
        let e = read_until(&mut ws, |f| f["request_id"] == "bad")
            .await
            .pop()
            .unwrap();
        assert_eq!(
            (e["event"].as_str(), e["where"].as_str()),
            (Some("error"), Some(at)),
            "{spec}: {e}"
        );
    }
    let mut messages_ws = ws_connect(&s.ws_url("/ws/messages")).await;
    next_json(&mut messages_ws).await;
    send_json(
        &mut messages_ws,
        json!({"cmd": "subscribe", "request_id": "m", "threads": [t], "history": true}),
    )
    .await;
    let e = read_until(&mut messages_ws, |f| f["request_id"] == "m")
        .await
        .pop()
        .unwrap();
    assert_eq!(e["where"], "history", "{e}");
}

/// Sends `frame`, a command the session cannot read, and returns its `error` answer (one
/// without a `request_id`).
async fn unanswerable(ws: &mut Ws, frame: tokio_tungstenite::tungstenite::Message) -> Value {
    use futures_util::SinkExt;
    ws.send(frame).await.unwrap();
    read_until(ws, |v| v["event"] == "error" && v["request_id"].is_null())
        .await
        .pop()
        .unwrap()
}
