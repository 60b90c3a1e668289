//! Thread labels: given at inject, changed by `PATCH /threads/{id}`, shown on the thread and
//! in `thread_created`; found by `/threads?label=…` (AND across repeats, OR within a key),
//! `label!=`, `has_label`, `no_label` and `q`, each total equal to a count by hand, from
//! the store and from memory alike; bad labels refused where they were written.

use std::collections::BTreeMap;

use agentserver::api::ApiOptions;
use agentserver::Organism;
use serde_json::{json, Value};

use crate::common::*;

/// The labels of thread `i`: a customer always, a tier on even ones, a region on four of five.
fn labels_of(i: usize) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert("customer".to_string(), format!("c{}", i % 7));
    if i.is_multiple_of(2) {
        l.insert("tier".to_string(), format!("t{}", i % 3));
    }
    if !i.is_multiple_of(5) {
        l.insert("region".to_string(), format!("r{}", i % 5));
    }
    l
}

async fn served(store: &str) -> Served {
    let (o, dir) = organism_with(Organism::builder(), "", "breadth-first", CHAIN);
    if store == "memory" {
        return Served::over(o, dir, ApiOptions::default()).await;
    }
    drop(o);
    let path = dir.path().join("organism.yaml");
    let yaml = std::fs::read_to_string(&path)
        .unwrap()
        .replace("store: memory", &format!("store: {store}"));
    std::fs::write(&path, yaml).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    Served::over(o, dir, ApiOptions::default()).await
}

async fn total(s: &Served, query: &str) -> u64 {
    let (code, body) = s.get(&format!("/api/v1/threads?limit=1&{query}")).await;
    assert_eq!(code, 200, "{query}: {body}");
    body["total"].as_u64().unwrap()
}

async fn every_query_form_counts_what_a_count_by_hand_does(store: &str) {
    let s = served(store).await;
    let n = 1000;
    let mut threads: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for i in 0..n {
        let labels = labels_of(i);
        let r = s
            .organism
            .inject_labelled(
                agentserver::InjectRequest {
                    from: "api".into(),
                    to: "c".into(),
                    payload_xml: format!("<Note>{i}</Note>"),
                    thread_id: None,
                },
                None,
                Some(&labels),
            )
            .unwrap();
        threads.push((r.thread_id.to_string(), labels));
    }
    for (t, _) in &threads {
        settle(&s.organism, t).await;
    }
    let count = |f: &dyn Fn(&str, &BTreeMap<String, String>) -> bool| {
        threads.iter().filter(|(id, l)| f(id, l)).count() as u64
    };
    let is =
        |l: &BTreeMap<String, String>, k: &str, v: &str| l.get(k).map(String::as_str) == Some(v);
    let cases: Vec<(&str, u64)> = vec![
        ("label=customer:c1", count(&|_, l| is(l, "customer", "c1"))),
        (
            "label=customer:c1,c2",
            count(&|_, l| is(l, "customer", "c1") || is(l, "customer", "c2")),
        ),
        (
            "label=customer:c1&label=tier:t0",
            count(&|_, l| is(l, "customer", "c1") && is(l, "tier", "t0")),
        ),
        ("label!=tier:t1", count(&|_, l| !is(l, "tier", "t1"))),
        ("has_label=region", count(&|_, l| l.contains_key("region"))),
        ("no_label=region", count(&|_, l| !l.contains_key("region"))),
        (
            "has_label=tier&no_label=region&label!=customer:c0",
            count(&|_, l| {
                l.contains_key("tier") && !l.contains_key("region") && !is(l, "customer", "c0")
            }),
        ),
        (
            "q=c3",
            count(&|id, l| {
                id.contains("c3") || l.iter().any(|(k, v)| k.contains("c3") || v.contains("c3"))
            }),
        ),
        ("label=customer:nobody", 0),
    ];
    for (query, want) in cases {
        assert_eq!(total(&s, query).await, want, "{store}: {query}");
    }
    // A page holds only threads that match.
    let (_, page) = s.get("/api/v1/threads?label=customer:c4&limit=100").await;
    for t in page["items"].as_array().unwrap() {
        assert_eq!(t["labels"]["customer"], "c4", "{t}");
    }
}

#[tokio::test]
async fn label_queries_count_exactly_from_memory() {
    every_query_form_counts_what_a_count_by_hand_does("memory").await;
}

#[tokio::test]
async fn label_queries_count_exactly_from_the_store() {
    every_query_form_counts_what_a_count_by_hand_does("data.db").await;
}

#[tokio::test]
async fn labels_are_given_at_inject_changed_by_patch_and_bad_ones_refused() {
    let s = served("data.db").await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    let _ = next_json(&mut ws).await;
    let (code, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "c", "payload_xml": "<Note>x</Note>", "labels": {"customer": "acme-42"}}),
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let t = body["thread_id"].as_str().unwrap().to_string();
    let created = read_until(&mut ws, |f| f["event"] == "thread_created").await;
    assert_eq!(
        created.last().unwrap()["thread"]["labels"],
        json!({"customer": "acme-42"})
    );
    settle(&s.organism, &t).await;

    let patch = |body: Value| {
        let url = s.url(&format!("/api/v1/threads/{t}"));
        async move {
            let r = http().patch(url).json(&body).send().await.unwrap();
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap())
        }
    };
    let (code, body) = patch(json!({"labels": {"tier": "gold", "customer": null}})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["labels"], json!({"tier": "gold"}));
    // The inject's labels came as a change too; then the patch's.
    let changed = read_until(&mut ws, |f| {
        f["event"] == "thread_labels" && f["labels"] == json!({"tier": "gold"})
    })
    .await;
    assert_eq!(changed.last().unwrap()["thread_id"], json!(t));
    assert_eq!(total(&s, "label=tier:gold").await, 1);
    assert_eq!(total(&s, "has_label=customer").await, 0);

    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (labels, at) in [
        (json!({"Customer": "x"}), "labels.Customer"),
        (
            json!({"agentserver.forked_from": "x"}),
            "labels.agentserver.forked_from",
        ),
        (json!({"api_token": "x"}), "labels.api_token"),
        (json!({"note": "v".repeat(257)}), "labels.note"),
        (Value::Object(many), "labels"),
    ] {
        let (code, body) = patch(json!({ "labels": labels })).await;
        assert_eq!(
            (code, body["error"]["code"].as_str()),
            (422, Some("invalid_label")),
            "{body}"
        );
        assert_eq!(body["error"]["where"], at, "{body}");
        let (code, body) = s
            .post(
                "/api/v1/inject",
                json!({"to": "c", "payload_xml": "<Note>x</Note>", "labels": labels}),
            )
            .await;
        assert_eq!(
            (code, body["error"]["code"].as_str()),
            (422, Some("invalid_label")),
            "{body}"
        );
    }
    let (_, now) = s.get(&format!("/api/v1/threads/{t}")).await;
    assert_eq!(
        now["labels"],
        json!({"tier": "gold"}),
        "refusals changed nothing"
    );
    for bad in ["label=Tier:gold", "label=tier", "has_label=", "q=x&q=y"] {
        let (code, body) = s.get(&format!("/api/v1/threads?{bad}")).await;
        assert_eq!(
            (code, body["error"]["code"].as_str()),
            (400, Some("invalid_query")),
            "{bad}"
        );
    }
}
