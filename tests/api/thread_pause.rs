//! A thread paused: its queued messages wait while other threads of the same listeners go
//! on; it shows `paused` (REST, listing, `thread_updated`); resumed, what waited is
//! delivered in order. A batch pauses and resumes what a filter finds; a tenant's operator
//! cannot pause another tenant's thread.

use agentserver::threads::{MessageStatus, ThreadStatus};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn a_paused_threads_messages_wait_others_flow_and_resume_in_order() {
    let s = crate::chain().await;
    let o = &s.organism;
    let t = inject(o, "c", "<Note>open</Note>", Some("held")).thread_id;
    assert_eq!(settle(o, &t).await, ThreadStatus::Completed);
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");

    let (code, body) = s.post("/api/v1/threads/held/pause", json!({})).await;
    assert_eq!((code, &body["paused"]), (200, &json!(true)), "{body}");
    let frames = read_until(&mut ws, |f| f["event"] == "thread_updated").await;
    let update = frames.last().unwrap();
    assert_eq!(
        (&update["thread_id"], &update["paused"]),
        (&json!("held"), &json!(true)),
        "{update}"
    );
    // Pausing again changes nothing.
    let (code, _) = s.post("/api/v1/threads/held/pause", json!({})).await;
    assert_eq!(code, 200);

    for i in 1..=3 {
        inject(o, "a", &format!("<Note>{i}</Note>"), Some("held"));
    }
    // Another thread through the same listeners goes on.
    let other = inject(o, "a", "<Note>other</Note>", None).thread_id;
    assert_eq!(settle(o, &other).await, ThreadStatus::Completed);
    let waiting = messages(o, "held");
    let to_a = waiting
        .iter()
        .filter(|m| to_of(m) == "a")
        .collect::<Vec<_>>();
    assert_eq!(to_a.len(), 3);
    assert!(
        to_a.iter().all(|m| m.status == MessageStatus::Pending),
        "{to_a:?}"
    );
    let (_, info) = s.get("/api/v1/threads/held").await;
    assert_eq!(
        (&info["paused"], &info["status"]),
        (&json!(true), &json!("active")),
        "{info}"
    );
    let (_, list) = s.get("/api/v1/threads?limit=10").await;
    let listed = list["items"].as_array().unwrap();
    let held = listed.iter().find(|t| t["id"] == "held").unwrap();
    assert_eq!(held["paused"], true);
    assert!(listed
        .iter()
        .filter(|t| t["id"] != "held")
        .all(|t| t["paused"] == false));

    let (code, body) = s.post("/api/v1/threads/held/resume", json!({})).await;
    assert_eq!((code, &body["paused"]), (200, &json!(false)), "{body}");
    assert_eq!(settle(o, "held").await, ThreadStatus::Completed);
    let at_c: Vec<String> = messages(o, "held")
        .iter()
        .filter(|m| to_of(m) == "c" && &*m.from == "b")
        .map(|m| m.payload_xml.to_string())
        .collect();
    assert_eq!(at_c, ["<Note>1</Note>", "<Note>2</Note>", "<Note>3</Note>"]);

    let (code, body) = s.post("/api/v1/threads/nope/pause", json!({})).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (404, &json!("unknown_thread"))
    );
}

#[tokio::test]
async fn a_batch_pauses_and_resumes_what_its_filter_finds() {
    let s = crate::chain().await;
    let o = &s.organism;
    for name in ["p1", "p2"] {
        let t = inject(o, "c", "<Note>x</Note>", Some(name)).thread_id;
        assert_eq!(settle(o, &t).await, ThreadStatus::Completed);
    }
    let batch = |action: &str| json!({"action": action, "filter": {}, "expected_count": 2});
    let (code, body) = s.post("/api/v1/threads/batch", batch("pause")).await;
    assert_eq!((code, &body["applied"]), (200, &json!(2)), "{body}");
    assert!(o.threads().is_paused("p1") && o.threads().is_paused("p2"));
    inject(o, "a", "<Note>wait</Note>", Some("p1"));
    let (code, body) = s.post("/api/v1/threads/batch", batch("resume")).await;
    assert_eq!((code, &body["applied"]), (200, &json!(2)), "{body}");
    assert_eq!(settle(o, "p1").await, ThreadStatus::Completed);
    assert!(!o.threads().is_paused("p1"));
}
