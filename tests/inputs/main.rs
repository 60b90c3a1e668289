//! Approval gates and the inbox, as a client of the real API sees them: a message held at a
//! gate waits (its thread `waiting`, its handler not run) until a person approves, rejects or
//! edits it; decisions are exact under concurrency; timers apply `on_timeout` on a clock the
//! test moves; a kill withdraws; held messages survive the process ending.

#[path = "../common/mod.rs"]
mod common;

mod access;
mod race;
mod restart;

use std::time::Duration;

use agentserver::api::ApiOptions;
use agentserver::time::Clock;
use agentserver::Organism;
use common::{serve_with, wait_until_async, Served};
use serde_json::{json, Value};

const XSD_NOTE: &str = "schema: t.xsd, accepts: [Note]";

/// `a` forwards every Note to `pay`, whose gate (`gate`, YAML flow) holds it; `pay`
/// forwards to `c`, a sink.
fn listeners(gate: &str) -> String {
    format!(
        "  - {{name: a, description: planner, kind: native, handler: forward, {XSD_NOTE}, config: {{to: pay}}}}
  - {{name: pay, description: payments, kind: native, handler: forward, {XSD_NOTE}, config: {{to: c}}, approval: {gate}}}
  - {{name: c, description: ledger, kind: native, handler: sink, {XSD_NOTE}}}"
    )
}

async fn gated(gate: &str) -> Served {
    gated_on(agentserver::Organism::builder(), gate).await
}

async fn gated_on(builder: agentserver::OrganismBuilder, gate: &str) -> Served {
    serve_with(builder, "", &listeners(gate), ApiOptions::default()).await
}

/// The thread's messages, as `(to, status)` in slot order.
async fn statuses(s: &Served, thread: &str) -> Vec<(String, String)> {
    let (code, body) = s.get(&format!("/api/v1/threads/{thread}")).await;
    assert_eq!(code, 200, "{body}");
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["to"].as_str().unwrap_or("").to_string(),
                m["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

async fn thread_status(s: &Served, thread: &str) -> String {
    let (_, body) = s.get(&format!("/api/v1/threads/{thread}")).await;
    body["status"].as_str().unwrap_or("").to_string()
}

/// Injects a Note to `a` and waits until its input is open; the thread and the input.
async fn held(s: &Served, text: &str) -> (String, Value) {
    let thread = s.inject_note("a", text).await;
    let input = wait_for_input(s, &thread).await;
    (thread, input)
}

async fn wait_for_input(s: &Served, thread: &str) -> Value {
    let mut found = Value::Null;
    for _ in 0..500 {
        let (code, body) = s
            .get(&format!("/api/v1/inputs?status=open&thread={thread}"))
            .await;
        assert_eq!(code, 200, "{body}");
        if let Some(first) = body["items"].as_array().and_then(|a| a.first()) {
            found = first.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!found.is_null(), "an input opened for thread {thread}");
    found
}

async fn wait_thread(s: &Served, thread: &str, want: &str) {
    let o: &Organism = &s.organism;
    let t = thread.to_string();
    wait_until_async(&format!("thread {thread} {want}"), || {
        let st = o.threads().status(&t);
        let want = want.to_string();
        async move { st.is_some_and(|st| format!("{st:?}").to_lowercase() == want) }
    })
    .await;
}

#[tokio::test]
async fn a_held_message_waits_for_approval_and_then_runs() {
    let s = gated("{prompt: 'Pay {@n} -> {missing}'}").await;
    let (thread, input) = held(&s, "refund 42").await;
    wait_thread(&s, &thread, "waiting").await;
    assert_eq!(input["status"], "open");
    assert_eq!(input["listener"], "pay");
    assert_eq!(input["from"], "a");
    assert_eq!(input["payload_type"], "Note");
    assert_eq!(input["payload_xml"], "<Note>refund 42</Note>");
    assert_eq!(input["allow"], json!(["approve", "reject", "edit"]));
    assert_eq!(
        input["answers"],
        json!([{"to": "pay", "payload_type": "Note", "fields": "/api/v1/agents/pay/fields?type=Note"}]),
        "an edit is a Note for pay"
    );
    assert!(input["expires_at"].is_string(), "{input}");
    // A prompt naming fields the payload lacks is shown as written.
    assert_eq!(input["prompt"], "Pay {@n} -> {missing}");
    // The handler has not run: nothing reached `c`, the held message says `held`.
    assert_eq!(
        statuses(&s, &thread).await,
        vec![
            ("a".into(), "delivered".into()),
            ("pay".into(), "held".into())
        ]
    );
    assert_eq!(thread_status(&s, &thread).await, "waiting");

    let id = input["id"].as_str().expect("id");
    assert!(
        s.metrics()
            .await
            .contains("agentserver_inputs_open{listener=\"pay\",kind=\"approval\"} 1"),
        "the open input is a gauge"
    );
    let (code, one) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(code, 200);
    assert_eq!(one["id"], id);

    let (code, decided) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"reason": "checked the invoice"}),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decision"], "approve");
    assert_eq!(decided["reason"], "checked the invoice");
    assert_eq!(decided["allow"], json!([]));
    wait_thread(&s, &thread, "completed").await;
    assert_eq!(
        statuses(&s, &thread).await,
        vec![
            ("a".into(), "delivered".into()),
            ("pay".into(), "delivered".into()),
            ("c".into(), "delivered".into())
        ]
    );
    let (_, open) = s.get("/api/v1/inputs?status=open").await;
    assert_eq!(open["total"], 0);
    let (_, all) = s.get("/api/v1/inputs?status=approved").await;
    assert_eq!(all["total"], 1);
    let metrics = s.metrics().await;
    assert!(
        metrics
            .contains("agentserver_input_decisions_total{listener=\"pay\",decision=\"approve\"} 1")
            && metrics.contains("agentserver_input_wait_seconds_count{listener=\"pay\"} 1")
            && !metrics.contains("agentserver_inputs_open{"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_rejection_declines_without_failing_and_a_second_decision_gets_the_first() {
    let s = gated("{}").await;
    let (thread, input) = held(&s, "too much").await;
    let id = input["id"].as_str().expect("id");
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/reject"),
            json!({"reason": "over the limit"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "declined");
    wait_thread(&s, &thread, "completed").await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    assert_eq!(
        t["error"],
        Value::Null,
        "a decline is not the thread's error"
    );
    let pay = &t["messages"][1];
    assert_eq!(pay["status"], "declined");
    assert_eq!(pay["error"], "declined by api: over the limit");
    assert!(
        !s.metrics().await.contains("reason=\"killed\"} 1"),
        "no failure counted"
    );

    for (path, body) in [
        ("approve", json!({})),
        ("reject", json!({"reason": "again"})),
    ] {
        let (code, again) = s.post(&format!("/api/v1/inputs/{id}/{path}"), body).await;
        assert_eq!(code, 409, "{again}");
        assert_eq!(again["error"]["code"], "already_decided");
        let first: Value = serde_json::from_str(
            again["error"]["details"][0]
                .as_str()
                .expect("the first decision"),
        )
        .expect("JSON");
        assert_eq!(first["status"], "declined");
        assert_eq!(first["reason"], "over the limit");
    }
    let (code, body) = s
        .post("/api/v1/inputs/no-such-input/approve", json!({}))
        .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_input");
}

#[tokio::test]
async fn an_edit_is_validated_and_supersedes_the_held_message() {
    let s = gated("{}").await;
    let (thread, input) = held(&s, "pay 100").await;
    let id = input["id"].as_str().expect("id");
    // Invalid: not a type `pay` accepts. Nothing changes.
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"payload_xml": "<Ping><n>x</n></Ping>"}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"payload_xml": "<Note>pay 100", "reason": "typo"}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"]["code"], "malformed_xml");
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"payload": "x", "payload_xml": "<Note>x</Note>"}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    let (_, still) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(still["status"], "open");

    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"payload": "pay 90", "reason": "capped"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["decision"], "edit");
    let edited = body["result_message_id"]
        .as_str()
        .expect("the edited message");
    wait_thread(&s, &thread, "completed").await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    let ms = t["messages"].as_array().expect("messages");
    assert_eq!(ms[1]["status"], "superseded");
    let new = ms
        .iter()
        .find(|m| m["id"] == edited)
        .expect("edited message");
    assert_eq!(new["payload_xml"], "<Note>pay 90</Note>");
    assert_eq!(new["from"], "a");
    assert_eq!(new["parent_id"], ms[1]["parent_id"]);
    assert_eq!(new["origin"], json!({"kind": "edit", "of": ms[1]["id"]}));
    assert_eq!(ms[1]["origin"], json!({"kind": "reply", "of": ms[0]["id"]}));
    assert_eq!(new["status"], "delivered");
    let last = ms.last().expect("a last message");
    assert_eq!(
        (&last["to"], &last["payload_xml"]),
        (&json!("c"), &json!("<Note>pay 90</Note>"))
    );
}

#[tokio::test]
async fn of_two_people_deciding_at_once_exactly_one_wins() {
    let s = gated("{}").await;
    for round in 0..5 {
        let (_, input) = held(&s, &format!("race {round}")).await;
        let id = input["id"].as_str().expect("id").to_string();
        let (ap, rp) = (
            format!("/api/v1/inputs/{id}/approve"),
            format!("/api/v1/inputs/{id}/reject"),
        );
        let approve = s.post(&ap, json!({}));
        let reject = s.post(&rp, json!({}));
        let ((a, abody), (r, rbody)) = tokio::join!(approve, reject);
        let mut codes = [a, r];
        codes.sort();
        assert_eq!(codes, [200, 409], "{abody} {rbody}");
        let (winner, loser) = if a == 200 {
            (abody, rbody)
        } else {
            (rbody, abody)
        };
        let first: Value = serde_json::from_str(
            loser["error"]["details"][0]
                .as_str()
                .expect("first decision"),
        )
        .expect("JSON");
        assert_eq!(first["status"], winner["status"]);
    }
}

#[tokio::test]
async fn three_held_messages_of_one_thread_are_decided_in_any_order() {
    let s = gated("{}").await;
    let thread = s.inject_note("a", "one").await;
    for text in ["two", "three"] {
        let (code, body) = s
            .post(
                "/api/v1/inject",
                json!({"to": "a", "thread_id": thread, "payload_xml": format!("<Note>{text}</Note>")}),
            )
            .await;
        assert_eq!(code, 202, "{body}");
    }
    let organism = s.organism.clone();
    wait_until_async("three inputs open", || {
        let n = organism.inputs().open_count();
        async move { n == 3 }
    })
    .await;
    let (_, open) = s.get(&format!("/api/v1/inputs?thread={thread}")).await;
    let ids: Vec<String> = open["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_string())
        .collect();
    // Newest first: decide the middle one, then the newest, then the oldest.
    for (id, verb) in [
        (&ids[1], "reject"),
        (&ids[0], "approve"),
        (&ids[2], "approve"),
    ] {
        let (code, body) = s
            .post(&format!("/api/v1/inputs/{id}/{verb}"), json!({}))
            .await;
        assert_eq!(code, 200, "{body}");
        if verb != "approve" || id != &ids[2] {
            assert_ne!(thread_status(&s, &thread).await, "completed");
        }
    }
    wait_thread(&s, &thread, "completed").await;
    let st = statuses(&s, &thread).await;
    let count = |to: &str, status: &str| st.iter().filter(|(t, s)| t == to && s == status).count();
    assert_eq!(count("pay", "delivered"), 2, "{st:?}");
    assert_eq!(count("pay", "declined"), 1, "{st:?}");
    assert_eq!(count("c", "delivered"), 2, "{st:?}");
}

#[tokio::test]
async fn a_timeout_applies_the_gates_on_timeout_on_the_organisms_clock() {
    for (on_timeout, message, reaches_c) in [
        ("reject", "declined", false),
        ("approve", "delivered", true),
    ] {
        let clock = Clock::manual();
        let s = gated_on(
            agentserver::Organism::builder().clock(clock.clone()),
            &format!("{{timeout: 1h, on_timeout: {on_timeout}}}"),
        )
        .await;
        let (thread, input) = held(&s, "late").await;
        let id = input["id"].as_str().expect("id").to_string();
        clock.advance(Duration::from_secs(59 * 60));
        assert_eq!(s.organism.inputs().expire_due(), 0, "not yet");
        clock.advance(Duration::from_secs(2 * 60));
        let organism = s.organism.clone();
        wait_until_async("the input expires", || {
            let done = organism
                .inputs()
                .get(&id)
                .unwrap()
                .is_some_and(|i| i.status != agentserver::threads::InputStatus::Open);
            async move { done }
        })
        .await;
        let (_, i) = s.get(&format!("/api/v1/inputs/{id}")).await;
        assert_eq!(i["status"], "expired");
        assert_eq!(i["decided_by"], "timeout");
        assert_eq!(i["decision"], on_timeout);
        wait_thread(&s, &thread, "completed").await;
        let st = statuses(&s, &thread).await;
        assert_eq!(st[1], ("pay".to_string(), message.to_string()), "{st:?}");
        assert_eq!(st.iter().any(|(t, _)| t == "c"), reaches_c, "{st:?}");
    }
    // `keep`: no timer at all.
    let clock = Clock::manual();
    let s = gated_on(
        agentserver::Organism::builder().clock(clock.clone()),
        "{on_timeout: keep}",
    )
    .await;
    let (_, input) = held(&s, "forever").await;
    assert_eq!(input["expires_at"], Value::Null);
    clock.advance(Duration::from_secs(400 * 24 * 3600));
    assert_eq!(s.organism.inputs().expire_due(), 0);
}

#[tokio::test]
async fn a_kill_withdraws_the_threads_inputs() {
    let s = gated("{}").await;
    let (thread, input) = held(&s, "doomed").await;
    let (code, body) = s
        .post(&format!("/api/v1/threads/{thread}/kill"), json!({}))
        .await;
    assert_eq!(code, 200, "{body}");
    let id = input["id"].as_str().expect("id");
    let (_, i) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(i["status"], "cancelled");
    assert_eq!(i["decision"], "thread killed");
    let st = statuses(&s, &thread).await;
    assert_eq!(st[1], ("pay".into(), "killed".into()));
    let (code, _) = s
        .post(&format!("/api/v1/inputs/{id}/approve"), json!({}))
        .await;
    assert_eq!(code, 409);
}

#[tokio::test]
async fn gates_hold_only_what_they_name_and_refuse_past_their_limit() {
    // `from: [api]`: only what an injector sends to `pay` directly is held, not `a`'s.
    let s = serve_with(
        agentserver::Organism::builder(),
        "  max_held_messages: 2",
        &listeners("{from: [api], allow: [approve]}"),
        ApiOptions::default(),
    )
    .await;
    let via_a = s.inject_note("a", "routed").await;
    wait_thread(&s, &via_a, "completed").await;
    let direct = s.inject_note("pay", "direct").await;
    let input = wait_for_input(&s, &direct).await;
    assert_eq!(input["allow"], json!(["approve"]));
    let id = input["id"].as_str().expect("id");
    let (code, body) = s
        .post(&format!("/api/v1/inputs/{id}/reject"), json!({}))
        .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error"]["code"], "decision_not_allowed");
    s.inject_note("pay", "second").await;
    let (code, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "pay", "payload_xml": "<Note>third</Note>"}),
        )
        .await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_held");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limits.max_held_messages")),
        "{body}"
    );
}

#[tokio::test]
async fn the_event_stream_tells_of_inputs_opened_and_resolved() {
    let s = gated("{}").await;
    let mut ws = common::ws_connect(&s.ws_url("/ws")).await;
    let _connected = common::next_json(&mut ws).await;
    let (_, input) = held(&s, "watched").await;
    let last = |mut v: Vec<Value>| v.pop().expect("a frame");
    let requested = last(common::read_until(&mut ws, |f| f["event"] == "input_requested").await);
    assert_eq!(requested["input"]["id"], input["id"]);
    assert_eq!(requested["input"]["status"], "open");
    let waiting = last(
        common::read_until(&mut ws, |f| {
            f["event"] == "thread_updated" && f["status"] == "waiting"
        })
        .await,
    );
    assert_eq!(waiting["thread_id"], input["thread_id"]);
    let id = input["id"].as_str().expect("id");
    s.post(&format!("/api/v1/inputs/{id}/approve"), json!({}))
        .await;
    let resolved = last(common::read_until(&mut ws, |f| f["event"] == "input_resolved").await);
    assert_eq!(resolved["id"], input["id"]);
    assert_eq!(resolved["status"], "approved");
    assert_eq!(resolved["decided_by"], "api");
}

#[tokio::test]
async fn an_abort_stops_running_queued_and_held_work_and_the_thread_goes_on() {
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("spin.lua");
    std::fs::write(
        &script,
        "function handle(p, m) if p == 'spin' then while true do end end end",
    )
    .unwrap();
    let s = serve_with(
        agentserver::Organism::builder(),
        "",
        &format!(
            "  - {{name: spin, description: a loop, kind: lua, script: {}, limits: {{cpu_ms: 600000, memory_mb: 16}}, {XSD_NOTE}}}
  - {{name: pay, description: payments, kind: native, handler: sink, {XSD_NOTE}, approval: {{}}}}
  - {{name: c, description: ledger, kind: native, handler: sink, {XSD_NOTE}}}",
            script.display()
        ),
        ApiOptions::default(),
    )
    .await;
    let thread = s.inject_note("spin", "spin").await;
    let o = s.organism.clone();
    wait_until_async("the loop runs", || {
        let busy = o
            .agent("spin")
            .is_ok_and(|a| a.state == agentserver::events::AgentState::Processing);
        async move { busy }
    })
    .await;
    for (to, text) in [("spin", "queued"), ("pay", "held")] {
        let (code, body) = s
            .post(
                "/api/v1/inject",
                json!({"to": to, "thread_id": thread, "payload_xml": format!("<Note>{text}</Note>")}),
            )
            .await;
        assert_eq!(code, 202, "{body}");
    }
    let input = wait_for_input(&s, &thread).await;

    let (code, t) = s
        .post(
            &format!("/api/v1/threads/{thread}/abort"),
            json!({"reason": "wrong customer"}),
        )
        .await;
    assert_eq!(code, 200, "{t}");
    assert_eq!(t["status"], "aborted");
    wait_until_async("the loop is stopped", || {
        let idle = o
            .agent("spin")
            .is_ok_and(|a| a.state != agentserver::events::AgentState::Processing);
        async move { idle }
    })
    .await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    let ms = t["messages"].as_array().expect("messages");
    assert_eq!(ms[0]["status"], "killed", "{t}");
    assert_eq!(ms[0]["error"], "thread aborted while handling");
    for m in &ms[1..] {
        assert_eq!(m["status"], "killed", "{t}");
        assert_eq!(m["error"], "aborted by api: wrong customer");
    }
    let (_, i) = s
        .get(&format!("/api/v1/inputs/{}", input["id"].as_str().unwrap()))
        .await;
    assert_eq!(i["status"], "cancelled");

    // Not final: the next inject revives it and completes.
    let (code, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "c", "thread_id": thread, "payload_xml": "<Note>again</Note>"}),
        )
        .await;
    assert_eq!(code, 202, "{body}");
    wait_thread(&s, &thread, "completed").await;
    let (code, again) = s
        .post(&format!("/api/v1/threads/{thread}/kill"), json!({}))
        .await;
    assert_eq!(code, 200, "{again}");
    let (code, body) = s
        .post(&format!("/api/v1/threads/{thread}/abort"), json!({}))
        .await;
    assert_eq!(code, 409, "a killed thread stays killed: {body}");
    let (code, _) = s.post("/api/v1/threads/nope/abort", json!({})).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn a_reload_that_removes_a_gated_listener_makes_its_held_messages_undeliverable() {
    let s = gated("{}").await;
    let (thread, input) = held(&s, "orphan").await;
    let path = s
        .organism
        .config()
        .source
        .clone()
        .expect("the organism's file");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let without: String = yaml
        .lines()
        .filter(|l| !l.contains("name: pay"))
        .map(|l| l.replace("config: {to: pay}", "config: {to: c}") + "\n")
        .collect();
    std::fs::write(&path, without).unwrap();
    let (code, body) = s.post("/api/v1/organism/reload", json!({})).await;
    assert_eq!(code, 200, "{body}");
    let id = input["id"].as_str().unwrap();
    let (_, i) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(i["status"], "cancelled", "{i}");
    wait_thread(&s, &thread, "error").await;
    let st = statuses(&s, &thread).await;
    assert_eq!(st[1], ("pay".into(), "undeliverable".into()), "{st:?}");
}

#[tokio::test]
async fn ws_lists_open_inputs_on_connect_and_decides_them_by_command() {
    let s = gated("{}").await;
    let (_, first) = held(&s, "one").await;
    let (second_thread, second) = held(&s, "two").await;
    let mut ws = common::ws_connect(&s.ws_url("/ws")).await;
    let connected = common::next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected");
    assert_eq!(connected["inputs_total"], 2, "{connected}");
    let listed: Vec<&Value> = connected["inputs"].as_array().unwrap().iter().collect();
    assert_eq!(listed[0]["id"], second["id"], "newest first");
    assert_eq!(listed[1]["id"], first["id"]);
    let waiting = connected["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "waiting")
        .count();
    assert_eq!(waiting, 2, "{connected}");

    let ack = |v: Vec<Value>| v.into_iter().last().expect("a frame");
    common::send_json(
        &mut ws,
        json!({"cmd": "approve", "request_id": 1, "input_id": first["id"], "reason": "ok"}),
    )
    .await;
    let a = ack(common::read_until(&mut ws, |f| f["request_id"] == 1).await);
    assert_eq!(a["event"], "ack", "{a}");
    assert_eq!(a["status"], "approved");
    common::send_json(
        &mut ws,
        json!({"cmd": "approve", "request_id": 2, "input_id": first["id"]}),
    )
    .await;
    let again = ack(common::read_until(&mut ws, |f| f["request_id"] == 2).await);
    assert_eq!(again["event"], "error", "{again}");
    assert_eq!(again["code"], "already_decided", "{again}");
    common::send_json(
        &mut ws,
        json!({"cmd": "reject", "request_id": 3, "input_id": second["id"], "payload_xml": "<Note/>"}),
    )
    .await;
    let bad = ack(common::read_until(&mut ws, |f| f["request_id"] == 3).await);
    assert_eq!(bad["event"], "error", "{bad}");
    common::send_json(
        &mut ws,
        json!({"cmd": "abort", "request_id": 4, "thread_id": second_thread, "reason": "stop"}),
    )
    .await;
    let a = ack(common::read_until(&mut ws, |f| f["request_id"] == 4).await);
    assert_eq!(a["event"], "ack", "{a}");
    let (_, i) = s
        .get(&format!(
            "/api/v1/inputs/{}",
            second["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(i["status"], "cancelled");
    assert_eq!(i["decision"], "aborted by ws: stop");
    assert_eq!(thread_status(&s, &second_thread).await, "aborted");
}

/// `reviewer` is a person: it takes a Ping and may answer with a Pong to `writer` and a
/// Note to `c`.
fn with_reviewer(extra: &str) -> String {
    format!(
        "  - {{name: reviewer, description: a person, kind: human, schema: t.xsd, accepts: [Ping], peers: [writer, c]{extra}}}
  - {{name: writer, description: writes, kind: native, handler: sink, schema: t.xsd, accepts: [Pong]}}
  - {{name: c, description: ledger, kind: native, handler: sink, {XSD_NOTE}}}"
    )
}

async fn asked(s: &Served) -> (String, Value) {
    let (code, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "reviewer", "payload_xml": "<Ping><n>7</n></Ping>"}),
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let thread = body["thread_id"].as_str().unwrap().to_string();
    let input = wait_for_input(s, &thread).await;
    (thread, input)
}

#[tokio::test]
async fn a_person_answers_a_question_with_payloads_routed_as_the_listeners_outputs() {
    let s = serve_with(
        agentserver::Organism::builder(),
        "",
        &with_reviewer(""),
        ApiOptions::default(),
    )
    .await;
    let (thread, input) = asked(&s).await;
    assert_eq!(input["kind"], "question");
    assert_eq!(input["allow"], json!(["answer"]));
    let answers: Vec<(String, String)> = input["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["to"].as_str().unwrap().into(),
                a["payload_type"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        answers,
        vec![
            ("writer".to_string(), "Pong".to_string()),
            ("c".to_string(), "Note".to_string())
        ]
    );
    assert_eq!(
        input["answers"][0]["fields"],
        "/api/v1/agents/writer/fields?type=Pong"
    );
    wait_thread(&s, &thread, "waiting").await;
    let question = input["message_id"].as_str().unwrap().to_string();
    let id = input["id"].as_str().unwrap();
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    assert_eq!(t["messages"][0]["status"], "delivered", "{t}");

    // Not an approval.
    let (code, body) = s
        .post(&format!("/api/v1/inputs/{id}/approve"), json!({}))
        .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error"]["code"], "decision_not_allowed");
    // Bounded: at most 100 payloads in one answer.
    let many: Vec<Value> = (0..101)
        .map(|_| json!({"payload_xml": "<Note>x</Note>", "to": "c"}))
        .collect();
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/answer"),
            json!({ "payloads": many }),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["error"]["code"], "too_many_payloads");
    // All or nothing: the second payload is of a type no peer takes.
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/answer"),
            json!({"payloads": [
                {"payload": {"n": 8}, "to": "writer"},
                {"payload_xml": "<Ping><n>1</n></Ping>"},
            ]}),
        )
        .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"]["details"][0]
            .as_str()
            .unwrap()
            .contains("payload 2"),
        "{body}"
    );
    let (_, still) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(still["status"], "open");
    assert_eq!(statuses(&s, &thread).await.len(), 1, "nothing was routed");

    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/answer"),
            json!({"payloads": [
                {"payload": {"n": 8}, "to": "writer"},
                {"payload_xml": "<Note>seen</Note>", "to": "c"},
            ], "reason": "looks fine"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "answered");
    wait_thread(&s, &thread, "completed").await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    let ms = t["messages"].as_array().unwrap();
    assert_eq!(ms.len(), 3, "{t}");
    for (m, to, xml) in [
        (&ms[1], "writer", "<Pong><n>8</n></Pong>"),
        (&ms[2], "c", "<Note>seen</Note>"),
    ] {
        assert_eq!(m["from"], "reviewer");
        assert_eq!(m["to"], to);
        assert_eq!(m["payload_xml"], xml);
        assert_eq!(m["parent_id"], question.as_str());
        assert_eq!(m["status"], "delivered");
    }
    let (code, _) = s
        .post(
            &format!("/api/v1/inputs/{id}/answer"),
            json!({"payload_xml": "<Note>again</Note>", "to": "c"}),
        )
        .await;
    assert_eq!(code, 409);
}

#[tokio::test]
async fn an_unanswered_question_fails_after_its_reply_timeout() {
    let clock = Clock::manual();
    let s = serve_with(
        agentserver::Organism::builder().clock(clock.clone()),
        "",
        &with_reviewer(", reply_timeout: 2h"),
        ApiOptions::default(),
    )
    .await;
    let (thread, input) = asked(&s).await;
    clock.advance(Duration::from_secs(3 * 3600));
    wait_thread(&s, &thread, "error").await;
    let (_, i) = s
        .get(&format!("/api/v1/inputs/{}", input["id"].as_str().unwrap()))
        .await;
    assert_eq!(i["status"], "expired");
    assert_eq!(i["decision"], "no answer");
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    assert_eq!(t["messages"][0]["status"], "failed", "{t}");
    assert!(
        t["messages"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("reply timeout"),
        "{t}"
    );
}

#[tokio::test]
async fn a_lua_handler_sees_who_approved_its_message() {
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("pay.lua");
    std::fs::write(
        &script,
        "function handle(p, m)
           local a = m.approval
           local said = a and (a.by .. ' at ' .. a.at .. ': ' .. (a.reason or '-')) or 'no approval'
           return { to = 'c', xml = '<Note>' .. said .. '</Note>' }
         end",
    )
    .unwrap();
    let s = serve_with(
        agentserver::Organism::builder(),
        "",
        &format!(
            "  - {{name: pay, description: pays, kind: lua, script: {}, {XSD_NOTE}, peers: [c], approval: {{from: [api]}}}}
  - {{name: c, description: ledger, kind: native, handler: sink, {XSD_NOTE}}}",
            script.display()
        ),
        ApiOptions::default(),
    )
    .await;
    let thread = s.inject_note("pay", "refund").await;
    let input = wait_for_input(&s, &thread).await;
    let id = input["id"].as_str().unwrap();
    let (code, decided) = s
        .post(
            &format!("/api/v1/inputs/{id}/approve"),
            json!({"reason": "ok by me"}),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    wait_thread(&s, &thread, "completed").await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    let said = t["messages"][1]["payload_xml"]
        .as_str()
        .unwrap()
        .to_string();
    let at = decided["decided_at"].as_str().unwrap();
    assert_eq!(said, format!("<Note>api at {at}: ok by me</Note>"), "{t}");
}

#[tokio::test]
async fn if_busy_steers_an_inject_into_a_thread_with_work_under_way() {
    let valve = common::Valve::closed();
    let s = serve_with(
        agentserver::Organism::builder().handler("valve", valve.clone()),
        "",
        &format!("  - {{name: slow, description: waits for the test, kind: native, handler: valve, {XSD_NOTE}}}"),
        ApiOptions::default(),
    )
    .await;
    let o = s.organism.clone();
    let send = |thread: Option<String>, text: &'static str, mode: Option<&'static str>| {
        let s = &s;
        async move {
            let mut body = json!({"to": "slow", "payload_xml": format!("<Note>{text}</Note>")});
            if let Some(t) = thread {
                body["thread_id"] = json!(t);
            }
            if let Some(m) = mode {
                body["if_busy"] = json!(m);
            }
            s.post("/api/v1/inject", body).await
        }
    };
    // A thread busy with `a` (running) and `b` (queued).
    let busy = || async {
        let (_, r) = send(None, "a", None).await;
        let t = r["thread_id"].as_str().unwrap().to_string();
        send(Some(t.clone()), "b", None).await;
        let o = o.clone();
        wait_until_async("a runs, b waits", || {
            let depth = o.agent("slow").map(|a| a.queue_depth).unwrap_or(0);
            async move { depth == 1 }
        })
        .await;
        t
    };
    let texts = |t: &str| {
        let t = t.to_string();
        let s = &s;
        async move {
            let (_, body) = s.get(&format!("/api/v1/threads/{t}")).await;
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    format!(
                        "{}:{}",
                        m["payload_xml"]
                            .as_str()
                            .unwrap()
                            .trim_start_matches("<Note>")
                            .trim_end_matches("</Note>"),
                        m["status"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        }
    };

    let t = busy().await;
    let (code, body) = send(Some(t.clone()), "c", Some("reject")).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "thread_busy");

    let (code, body) = send(Some(t.clone()), "c", Some("interrupt")).await;
    assert_eq!(code, 202, "{body}");
    valve.open(2);
    wait_thread(&s, &t, "completed").await;
    assert_eq!(
        texts(&t).await,
        ["a:delivered", "b:superseded", "c:delivered"]
    );

    let t = busy().await;
    let (code, body) = send(Some(t.clone()), "c", Some("rollback")).await;
    assert_eq!(code, 202, "{body}");
    valve.open(1);
    wait_thread(&s, &t, "completed").await;
    assert_eq!(texts(&t).await, ["a:killed", "b:killed", "c:delivered"]);

    // An idle thread is not busy: every mode just delivers.
    let (code, body) = send(Some(t.clone()), "d", Some("reject")).await;
    assert_eq!(code, 202, "{body}");
    valve.open(1);
    wait_thread(&s, &t, "completed").await;
}

#[tokio::test]
async fn a_gate_notifies_of_each_input_signed_and_tries_again_after_a_failure() {
    use std::sync::{Arc, Mutex};
    type Seen = Arc<Mutex<Vec<(Option<String>, String)>>>;
    let seen: Seen = Arc::default();
    let hook = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
                let seen = seen.clone();
                async move {
                    let sig = headers
                        .get("x-agentserver-signature")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let mut seen = seen.lock().unwrap();
                    seen.push((sig, body));
                    // The first attempt fails: the gate must try again.
                    if seen.len() == 1 {
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        axum::http::StatusCode::NO_CONTENT
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, hook).await });
    std::env::set_var("INPUTS_TEST_HMAC", "the gate's secret");
    let s = gated(&format!(
        "{{notify: {{url: 'http://{addr}/hook', secret_env: INPUTS_TEST_HMAC}}}}"
    ))
    .await;
    let (_, input) = held(&s, "tell someone").await;
    let seen2 = seen.clone();
    wait_until_async("two attempts", || {
        let n = seen2.lock().unwrap().len();
        async move { n >= 2 }
    })
    .await;
    let attempts = seen.lock().unwrap().clone();
    for (sig, body) in &attempts {
        assert_eq!(
            sig.as_deref(),
            Some(
                agentserver::pump::notify_signature("the gate's secret", body.as_bytes()).as_str()
            )
        );
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["input"]["id"], input["id"]);
        assert_eq!(v["input"]["payload_xml"], "<Note>tell someone</Note>");
        assert_eq!(
            v["links"]["approve"],
            format!("/api/v1/inputs/{}/approve", input["id"].as_str().unwrap())
        );
    }
    assert!(
        s.metrics()
            .await
            .contains("agentserver_input_notify_failures_total 1"),
        "the failed attempt is counted"
    );
}

#[tokio::test]
async fn an_escalation_passes_a_held_message_to_a_supervisors_approvers() {
    let clock = Clock::manual();
    let s = serve_with(
        agentserver::Organism::builder().clock(clock.clone()),
        "",
        &format!(
            "  - {{name: pay, description: payments, kind: native, handler: forward, {XSD_NOTE}, config: {{to: c}}, approval: {{timeout: 1h, on_timeout: escalate, escalate_to: supervisor}}}}
  - {{name: supervisor, description: a person, kind: human, {XSD_NOTE}, reply_timeout: 2h, approvers: {{role: admin}}}}
  - {{name: c, description: ledger, kind: native, handler: sink, {XSD_NOTE}}}"
        ),
        ApiOptions::default(),
    )
    .await;
    let thread = s.inject_note("pay", "big one").await;
    let first = wait_for_input(&s, &thread).await;
    clock.advance(Duration::from_secs(3601));
    let o = s.organism.clone();
    let first_id = first["id"].as_str().unwrap().to_string();
    wait_until_async("the escalation", || {
        let done = o
            .inputs()
            .get(&first_id)
            .unwrap()
            .is_some_and(|i| i.status == agentserver::threads::InputStatus::Escalated);
        async move { done }
    })
    .await;
    let second = wait_for_input(&s, &thread).await;
    assert_ne!(second["id"], first["id"]);
    assert_eq!(
        second["message_id"], first["message_id"],
        "the same held message"
    );
    assert_eq!(thread_status(&s, &thread).await, "waiting");
    let (_, old) = s.get(&format!("/api/v1/inputs/{first_id}")).await;
    assert_eq!(old["decision"], "escalate to supervisor");
    // The supervisor's approvers now decide: an operator may not.
    let id = second["id"].as_str().unwrap();
    let verdict = || agentserver::pump::Verdict::Approve {
        reason: None,
        payload_xml: None,
    };
    let operator = agentserver::pump::Decider {
        name: Some("key:op".into()),
        role: agentserver::config::Role::Operator,
        tenant: None,
    };
    let e = o.inputs().decide(id, &operator, verdict()).unwrap_err();
    assert!(
        matches!(e, agentserver::pump::DecideError::NotAnApprover(_)),
        "{e}"
    );
    let (code, body) = s
        .post(&format!("/api/v1/inputs/{id}/approve"), json!({}))
        .await;
    assert_eq!(code, 200, "{body}");
    wait_thread(&s, &thread, "completed").await;
    // Unanswered there too, it is declined.
    let t2 = s.inject_note("pay", "forgotten").await;
    let held_first = wait_for_input(&s, &t2).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    clock.advance(Duration::from_secs(3601));
    wait_until_async("the second escalation", || {
        let done = o
            .inputs()
            .get(&held_first)
            .unwrap()
            .is_some_and(|i| i.status == agentserver::threads::InputStatus::Escalated);
        async move { done }
    })
    .await;
    clock.advance(Duration::from_secs(2 * 3600 + 1));
    wait_thread(&s, &t2, "completed").await;
    assert_eq!(
        statuses(&s, &t2).await,
        vec![("pay".to_string(), "declined".to_string())]
    );
}

/// A client that decides the moment it hears of an input always finds it open (an input is
/// open before it is told), for held messages and questions alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_can_be_decided_the_moment_it_is_told() {
    let s = serve_with(
        agentserver::Organism::builder(),
        "",
        &format!(
            "{}\n  - {{name: person, description: answers, kind: human, {XSD_NOTE}, peers: [c]}}",
            listeners("{}")
        ),
        ApiOptions::default(),
    )
    .await;
    let o = s.organism.clone();
    let mut events = o.events().subscribe();
    let decider = o.clone();
    let decisions = tokio::spawn(async move {
        let who = agentserver::pump::Decider {
            name: None,
            role: agentserver::config::Role::Admin,
            tenant: None,
        };
        let mut failed = Vec::new();
        let mut n = 0;
        while n < 200 {
            let ev = events.recv().await.unwrap();
            if let agentserver::events::EventKind::InputRequested { input } = &ev.kind {
                n += 1;
                let r = match input.kind {
                    agentserver::threads::InputKind::Approval => decider.inputs().decide(
                        &input.id,
                        &who,
                        agentserver::pump::Verdict::Approve {
                            reason: None,
                            payload_xml: None,
                        },
                    ),
                    agentserver::threads::InputKind::Question => decider.inputs().answer(
                        &input.id,
                        &who,
                        vec![agentserver::pump::Answer {
                            payload_xml: "<Note>answer</Note>".into(),
                            to: Some("c".into()),
                        }],
                        None,
                    ),
                };
                if let Err(e) = r {
                    failed.push(e.to_string());
                }
            }
        }
        failed
    });
    let mut threads = Vec::new();
    for i in 0..100 {
        for to in ["a", "person"] {
            let r = common::inject(&o, to, &format!("<Note>{i}</Note>"), None);
            threads.push(r.thread_id);
        }
    }
    let failed = tokio::time::timeout(common::WAIT, decisions)
        .await
        .unwrap()
        .unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    for t in threads {
        assert_eq!(
            common::settle(&o, &t).await,
            agentserver::threads::ThreadStatus::Completed
        );
    }
}

/// A sender that takes `<huh>` hears that a person declined its message (and only then);
/// the thread completes once it has handled it.
#[tokio::test]
async fn a_decline_sends_a_huh_to_a_sender_that_takes_one() {
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("a.lua");
    std::fs::write(
        &script,
        "function handle(p, m)
           if m.payload_type == 'huh' then return nil end
           return { to = 'pay', xml = '<Note>' .. p .. '</Note>' }
         end",
    )
    .unwrap();
    let s = serve_with(
        agentserver::Organism::builder(),
        "",
        &format!(
            "  - {{name: a, description: planner, kind: lua, script: {}, schema: t.xsd, accepts: [Note, huh], peers: [pay]}}
  - {{name: pay, description: payments, kind: native, handler: sink, schema: t.xsd, accepts: [Note], approval: {{}}}}",
            script.display()
        ),
        ApiOptions::default(),
    )
    .await;
    let (thread, input) = held(&s, "refund").await;
    let id = input["id"].as_str().unwrap();
    let (code, body) = s
        .post(
            &format!("/api/v1/inputs/{id}/reject"),
            json!({"reason": "no"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    wait_thread(&s, &thread, "completed").await;
    let (_, t) = s.get(&format!("/api/v1/threads/{thread}")).await;
    let ms = t["messages"].as_array().unwrap();
    let huh = ms.iter().find(|m| m["from"] == "system").expect("a huh");
    assert_eq!(huh["to"], "a");
    assert_eq!(huh["status"], "delivered");
    assert_eq!(huh["parent_id"], input["message_id"]);
    assert!(
        huh["payload_xml"]
            .as_str()
            .unwrap()
            .contains("declined by a person"),
        "{huh}"
    );
    assert!(
        !huh["payload_xml"].as_str().unwrap().contains("no"),
        "the reason stays in the inbox"
    );
}

/// Decided inputs kept in memory (an organism without a store) are bounded by bytes, not
/// only by count: large payloads push the oldest out.
#[tokio::test]
async fn decided_inputs_in_memory_are_bounded_by_bytes() {
    let s = gated("{}").await;
    let big = "x".repeat(900 * 1024);
    let (mut first, mut last) = (None, None);
    for _ in 0..20 {
        let (code, body) = s
            .post(
                "/api/v1/inject",
                json!({"to": "pay", "payload_xml": format!("<Note>{big}</Note>")}),
            )
            .await;
        assert_eq!(code, 202, "{body}");
        let thread = body["thread_id"].as_str().unwrap().to_string();
        let input = wait_for_input(&s, &thread).await;
        let id = input["id"].as_str().unwrap().to_string();
        let (code, _) = s
            .post(&format!("/api/v1/inputs/{id}/reject"), json!({}))
            .await;
        assert_eq!(code, 200);
        first.get_or_insert(id.clone());
        last = Some(id);
    }
    let (code, _) = s.get(&format!("/api/v1/inputs/{}", first.unwrap())).await;
    assert_eq!(
        code, 404,
        "the oldest decided input was let go (16 MiB kept)"
    );
    let (_, page) = s.get("/api/v1/inputs?status=declined&limit=0").await;
    let kept = page["total"].as_u64().unwrap();
    assert!((10..20).contains(&kept), "{kept} kept");
    // Those kept are found by id, each with its final decision.
    let (_, page) = s.get("/api/v1/inputs?status=declined&limit=50").await;
    let ids: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len() as u64, kept);
    assert_eq!(ids.first(), last.as_ref(), "newest first");
    for id in ids {
        let (code, input) = s.get(&format!("/api/v1/inputs/{id}")).await;
        assert_eq!(code, 200, "{input}");
        assert_eq!(input["status"], "declined", "{input}");
        assert_eq!(input["decision"], "reject", "{input}");
    }
}

/// Hostile bodies at the inbox's routes: each is refused with what was wrong and where, or
/// bounded, and the input stays as it was.
#[tokio::test]
async fn the_inboxs_routes_refuse_or_bound_what_a_client_sends() {
    let s = gated("{}").await;
    let (_, input) = held(&s, "target").await;
    let id = input["id"].as_str().unwrap();
    let approve = format!("/api/v1/inputs/{id}/approve");
    for (body, code, what) in [
        (
            json!({"payload_xml": "<!DOCTYPE x [<!ENTITY a 'b'>]><Note>&a;</Note>"}),
            422,
            "malformed_xml",
        ),
        (
            json!({"payload_xml": format!("<Note>{}</Note>", "x".repeat(2 * 1024 * 1024))}),
            413,
            "too_large",
        ),
        (json!({"verdict": "yes"}), 400, "invalid_json"),
        (
            json!({"payload": {"nested": [1, 2]}}),
            422,
            "invalid_payload",
        ),
    ] {
        let (got, answer) = s.post(&approve, body).await;
        assert_eq!(got, code, "{answer}");
        assert_eq!(answer["error"]["code"], what, "{answer}");
    }
    // Not JSON at all.
    let r = s
        .http
        .post(s.url(&approve))
        .header("content-type", "text/plain")
        .body("approve it")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let (_, still) = s.get(&format!("/api/v1/inputs/{id}")).await;
    assert_eq!(still["status"], "open", "nothing changed");
    // A reason is kept, cut to limits.max_error_bytes.
    let (code, decided) = s
        .post(
            &format!("/api/v1/inputs/{id}/reject"),
            json!({"reason": "r".repeat(100_000)}),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    let reason = decided["reason"].as_str().unwrap();
    assert!(
        reason.len() <= 4096 && reason.ends_with("bytes cut]"),
        "{}",
        reason.len()
    );
    // Ids that are not ids.
    for bad in ["%00", "..%2F..%2Fetc", &"a".repeat(5000)] {
        let (code, _) = s.get(&format!("/api/v1/inputs/{bad}")).await;
        assert_eq!(code, 404, "{bad}");
    }
}

/// An open input whose thread's row cannot be read back at a start is held again with what
/// its own row holds, and the failure is said in an `error` event naming the thread.
#[tokio::test(flavor = "multi_thread")]
async fn an_input_whose_thread_cannot_be_read_back_is_held_again_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let builder = || {
        Organism::builder().overrides(agentserver::pump::Overrides {
            listen: None,
            store: Some(Some(store.clone())),
        })
    };
    let s = gated_on(builder(), "{}").await;
    let thread = common::inject(&s.organism, "pay", "<Note>n1</Note>", None).thread_id;
    let thread = thread.to_string();
    wait_until_async("the input is open", || async {
        s.get("/api/v1/inputs?status=open").await.1["total"] == 1
    })
    .await;
    let Served {
        server, organism, ..
    } = s;
    server.shutdown().await;
    organism.stop().await;
    drop(organism);
    // The thread's row, written wrong behind the server's back.
    let conn = rusqlite::Connection::open(&store).unwrap();
    let changed = conn
        .execute(
            "UPDATE threads SET message_count = 'many' WHERE id = ?1",
            [&thread],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);

    let s = gated_on(builder(), "{}").await;
    // What the start published: from the hub's first event (a start numbers on past the
    // store's last `seq`, leaving a gap).
    let first = s.organism.events().subscribe_since(Some(0)).resync_from;
    let said = s.organism.events().subscribe_since(first.map(|f| f - 1));
    let error = said.replay.iter().find_map(|e| match &e.kind {
        agentserver::events::EventKind::Error {
            thread_id, error, ..
        } if thread_id.as_deref() == Some(thread.as_str()) => Some(error.clone()),
        _ => None,
    });
    let error = error.expect("an error event names the thread");
    assert!(error.contains("could not be read back"), "{error}");
    let (code, open) = s.get("/api/v1/inputs?status=open").await;
    assert_eq!(code, 200, "{open}");
    assert_eq!(open["total"], 1, "the input is held again: {open}");
    assert_eq!(open["items"][0]["thread_id"], thread.as_str(), "{open}");
}

/// An input the store cannot be asked about is 503 `store_failed`, never "no such input".
#[tokio::test]
async fn an_input_the_store_cannot_be_asked_about_is_not_called_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let overrides = agentserver::pump::Overrides {
        listen: None,
        store: Some(Some(store.clone())),
    };
    let s = gated_on(Organism::builder().overrides(overrides), "{}").await;
    let conn = rusqlite::Connection::open(&store).unwrap();
    conn.execute_batch("ALTER TABLE inputs RENAME TO gone")
        .unwrap();
    let (code, body) = s.get("/api/v1/inputs/no-such-input").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_failed", "{body}");
    let (code, body) = s
        .post("/api/v1/inputs/no-such-input/approve", json!({}))
        .await;
    assert_eq!(code, 503, "{body}");
    conn.execute_batch("ALTER TABLE gone RENAME TO inputs")
        .unwrap();
    let (code, body) = s.get("/api/v1/inputs/no-such-input").await;
    assert_eq!(code, 404, "{body}");
}
