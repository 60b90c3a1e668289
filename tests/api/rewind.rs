//! Rewind, as a user uses it: a completed five-message thread rewound to its second message
//! (the three after it superseded, the second entering again at slot 5, the default
//! listing 0, 1, 5, …, every row kept and marked with `include_superseded=true`, a
//! `thread_rewound` event, and the same after a restart); a thread with work under way
//! refused unless `if_active: abort`; a dry run changes nothing; what a tenant does not
//! wholly see is 404.

use agentserver::threads::ThreadStatus;
use agentserver::Organism;
use serde_json::{json, Value};

use crate::common::*;
use crate::post;

const FIVE: &str = "organism: { name: five, store: five.db }
listeners:
  - {name: l1, description: one, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: l2}}
  - {name: l2, description: two, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: l3}}
  - {name: l3, description: three, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: l4}}
  - {name: l4, description: four, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: l5}}
  - {name: l5, description: five, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}
";

async fn five(dir: &tempfile::TempDir) -> (Organism, agentserver::api::ApiServer, String) {
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, FIVE).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    crate::bound(o).await
}

async fn slots(base: &str, thread: &str, query: &str) -> Vec<(u64, bool)> {
    let url = format!("{base}/api/v1/threads/{thread}/messages?limit=100{query}");
    let v: Value = http().get(url).send().await.unwrap().json().await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let marked = m.get("superseded") == Some(&json!(true));
            (m["slot_index"].as_u64().unwrap(), marked)
        })
        .collect()
}

#[tokio::test]
async fn a_rewound_thread_supersedes_what_followed_and_runs_again_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let t = {
        let (o, server, base) = five(&dir).await;
        let t = inject(&o, "l1", "<Note>go</Note>", None)
            .thread_id
            .to_string();
        assert_eq!(settle(&o, &t).await, ThreadStatus::Completed);
        let ms = messages(&o, &t);
        assert_eq!(ms.len(), 5);
        let second = ms[1].id.to_string();

        // A dry run says what would be superseded and changes nothing.
        let rewind = format!("/api/v1/threads/{t}/rewind");
        let (code, body) = post(&base, &rewind, json!({"to": second, "dry_run": true})).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            (&body["superseded"], &body["to"]),
            (&json!(3), &json!("l2"))
        );
        assert!(body["message_id"].is_null());
        assert_eq!(messages(&o, &t).len(), 5);

        // A client that asks for `thread_rewound` events by name gets them.
        let url = format!(
            "{}/ws?events=thread_rewound",
            base.replacen("http", "ws", 1)
        );
        let mut ws = ws_connect(&url).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        let (code, body) = post(&base, &rewind, json!({"to": second})).await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["superseded"], 3);
        let frames = read_until(&mut ws, |f| f["event"] == "thread_rewound").await;
        let ev = frames.last().unwrap();
        assert_eq!(
            (&ev["thread_id"], &ev["to"], &ev["superseded"]),
            (&json!(t), &json!(second), &json!(3)),
            "{ev}"
        );
        assert_eq!(settle(&o, &t).await, ThreadStatus::Completed);

        let again = messages(&o, &t)
            .into_iter()
            .find(|m| m.slot_index == 5)
            .unwrap();
        assert_eq!(again.origin.kind.name(), "rewind");
        assert_eq!(again.origin.of.as_deref(), Some(second.as_str()));
        assert_eq!(again.parent_id, ms[1].parent_id);
        o.stop().await;
        server.shutdown().await;
        t
    };
    // After a restart, from the store: the same.
    let (_o, _server, base) = five(&dir).await;
    let shown: Vec<u64> = slots(&base, &t, "")
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(shown, [0, 1, 5, 6, 7, 8]);
    let all = slots(&base, &t, "&include_superseded=true").await;
    assert_eq!(all.len(), 9);
    let marked: Vec<u64> = all.iter().filter(|(_, m)| *m).map(|(s, _)| *s).collect();
    assert_eq!(marked, [2, 3, 4]);
    let detail: Value = http()
        .get(format!("{base}/api/v1/threads/{t}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["messages"].as_array().unwrap().len(), 6);
    let (code, body) = post(
        &base,
        &format!("/api/v1/threads/{t}/rewind"),
        json!({"to": "nope"}),
    )
    .await;
    assert_eq!(
        (code, &body["error"]["code"], &body["error"]["where"]),
        (404, &json!("unknown_message"), &json!("to"))
    );
}

#[tokio::test]
async fn a_thread_with_work_under_way_is_refused_unless_aborted_first() {
    let dir = tempfile::tempdir().unwrap();
    let (o, _server, base) = five(&dir).await;
    let t = inject(&o, "l5", "<Note>first</Note>", Some("busy"))
        .thread_id
        .to_string();
    assert_eq!(settle(&o, &t).await, ThreadStatus::Completed);
    let first = messages(&o, &t)[0].id.to_string();
    // Paused, with a message queued: work under way.
    o.control().pause_thread(&t).unwrap();
    inject(&o, "l1", "<Note>queued</Note>", Some("busy"));
    let rewind = format!("/api/v1/threads/{t}/rewind");
    let (code, body) = post(&base, &rewind, json!({"to": first})).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (409, &json!("thread_active")),
        "{body}"
    );
    let (code, body) = post(
        &base,
        &rewind,
        json!({"to": first, "if_active": "abort", "payload_xml": "<Note>again</Note>"}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    o.control().resume_thread(&t).unwrap();
    assert_eq!(settle(&o, &t).await, ThreadStatus::Completed);
    let shown = slots(&base, &t, "").await;
    // The first message, then it again: what was queued was superseded.
    assert_eq!(shown.len(), 2, "{shown:?}");
    let last = messages(&o, &t).pop().unwrap();
    assert_eq!(&*last.payload_xml, "<Note>again</Note>");
    let (code, body) = post(
        &base,
        &rewind,
        json!({"to": first, "if_active": "sometimes"}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
}
