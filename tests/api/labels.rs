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
        (
            "label!=tier:t1&no_label=region",
            count(&|_, l| !is(l, "tier", "t1") && !l.contains_key("region")),
        ),
        (
            "has_label=region&status=completed",
            count(&|_, l| l.contains_key("region")),
        ),
    ];
    for (query, want) in cases {
        assert_eq!(total(&s, query).await, want, "{store}: {query}");
    }
    // A page holds only threads that match.
    let (_, page) = s.get("/api/v1/threads?label=customer:c4&limit=100").await;
    for t in page["items"].as_array().unwrap() {
        assert_eq!(t["labels"]["customer"], "c4", "{t}");
    }
    // Label tests alone are read another way than with another filter (every thread here
    // is completed): the same pages, in the same order, whether the matches are many (found
    // row by row) or few for the page asked (found as a set).
    let ids = |page: &Value| -> Vec<String> {
        let items = page["items"].as_array().unwrap();
        items
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect()
    };
    for query in [
        "has_label=region&limit=50&offset=10",
        "label!=tier:t1&limit=50",
        "label=customer:c1&label=tier:t0&limit=1000",
        "no_label=region&label!=customer:c2&limit=1000",
    ] {
        let (_, alone) = s.get(&format!("/api/v1/threads?{query}")).await;
        let (_, with) = s
            .get(&format!("/api/v1/threads?{query}&status=completed"))
            .await;
        assert_eq!(ids(&alone), ids(&with), "{store}: {query}");
        assert_eq!(alone["total"], with["total"], "{store}: {query}");
        assert!(!ids(&alone).is_empty(), "{query}");
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

/// An organism with keys: `admin`, `op` (organism-wide), `acme-op` (tenant acme), and a sink
/// of each tenant's and of the organism's.
async fn with_keys() -> (Served, std::collections::HashMap<&'static str, String>) {
    use agentserver::config::Role;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: { name: batch, store: batch.db }
auth: { methods: [keys] }
listeners:
  - { name: sink, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note] }
  - { name: acme-sink, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme }
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
    (Served::over(o, dir, ApiOptions::default()).await, keys)
}

async fn call(
    s: &Served,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s.http.request(method, s.url(path)).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_batch_acts_on_exactly_what_its_filter_counts_and_a_tenant_on_its_own() {
    let (s, k) = with_keys().await;
    let mut ours = Vec::new();
    let mut acme = Vec::new();
    for i in 0..6 {
        // Threads wait on an approval-less sink: they complete; kill and label act either way.
        let labels: BTreeMap<String, String> =
            [("customer".to_string(), format!("c{}", i % 2))].into();
        let to = if i < 4 { "sink" } else { "acme-sink" };
        let r = s
            .organism
            .inject_labelled(
                agentserver::InjectRequest {
                    from: "api".into(),
                    to: to.into(),
                    payload_xml: format!("<Note>{i}</Note>"),
                    thread_id: None,
                },
                None,
                Some(&labels),
            )
            .unwrap();
        settle(&s.organism, &r.thread_id).await;
        if i < 4 {
            ours.push(r.thread_id.to_string())
        } else {
            acme.push(r.thread_id.to_string())
        }
    }
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let (code, count) = call(
        &s,
        get.clone(),
        "/api/v1/threads/count?label=customer:c0",
        &k["admin"],
        None,
    )
    .await;
    assert_eq!((code, &count["total"]), (200, &json!(3)), "{count}");
    let (_, count) = call(
        &s,
        get.clone(),
        "/api/v1/threads/count?label=customer:c0",
        &k["acme-op"],
        None,
    )
    .await;
    assert_eq!(count["total"], 1, "acme sees its own: {count}");

    // A wrong expected count does nothing; the right one acts on exactly those.
    let kill = |expected: u64| json!({"action": "kill", "filter": {"label": ["customer:c0"]}, "expected_count": expected});
    let (code, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["admin"],
        Some(kill(2)),
    )
    .await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (409, Some("count_mismatch")),
        "{body}"
    );
    for t in ours.iter().chain(&acme) {
        assert_ne!(
            s.organism.threads().status(t),
            Some(agentserver::threads::ThreadStatus::Killed)
        );
    }
    let (code, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["op"],
        Some(kill(3)),
    )
    .await;
    assert_eq!(code, 403, "organism-wide batches are an admin's: {body}");
    let (code, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["admin"],
        Some(kill(3)),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["matched"], &body["applied"]),
        (&json!(3), &json!(3)),
        "{body}"
    );
    let killed = |t: &String| {
        s.organism.threads().status(t) == Some(agentserver::threads::ThreadStatus::Killed)
    };
    assert_eq!(ours.iter().filter(|t| killed(t)).count(), 2);
    assert_eq!(acme.iter().filter(|t| killed(t)).count(), 1);

    // A tenant's batch over every thread labels only its own.
    let label = json!({"action": "label", "filter": {}, "labels": {"reviewed": "yes"}});
    let (code, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["acme-op"],
        Some(label),
    )
    .await;
    // Its killed thread is skipped, saying so.
    assert_eq!(
        (code, &body["matched"], &body["applied"]),
        (200, &json!(2), &json!(1)),
        "{body}"
    );
    assert!(
        body["skipped"][0]["why"]
            .as_str()
            .unwrap()
            .contains("killed"),
        "{body}"
    );
    let (_, mine) = call(
        &s,
        get.clone(),
        "/api/v1/threads/count?label=reviewed:yes",
        &k["admin"],
        None,
    )
    .await;
    assert_eq!(mine["total"], 1);
    for t in &ours {
        assert!(s
            .organism
            .threads()
            .labels(t)
            .is_none_or(|l| !l.contains_key("reviewed")));
    }
    let (code, _) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["admin"],
        Some(json!({"action": "kill"})),
    )
    .await;
    assert_eq!(
        code, 400,
        "a filter is required (`{{}}`: every thread in scope)"
    );
    // Ids outside its scope are not matched.
    let by_ids = json!({"action": "label", "filter": {}, "ids": ours, "labels": {"x": "y"}, "dry_run": true});
    let (_, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["acme-op"],
        Some(by_ids),
    )
    .await;
    assert_eq!(body["matched"], 0, "{body}");
    // An id given twice is one thread.
    let twice = vec![ours[0].clone(), ours[1].clone(), ours[0].clone()];
    let by_ids = json!({"action": "label", "filter": {}, "ids": twice, "labels": {"x": "y"}, "dry_run": true});
    let (_, body) = call(
        &s,
        post.clone(),
        "/api/v1/threads/batch",
        &k["admin"],
        Some(by_ids),
    )
    .await;
    assert_eq!(
        (&body["matched"], &body["applied"]),
        (&json!(2), &json!(2)),
        "{body}"
    );

    // Bad batches are refused where they are wrong.
    for (bad, at) in [
        (
            json!({"action": "kill", "filter": {"label": ["Customer:x"]}}),
            "filter.label",
        ),
        (json!({"action": "kill", "filter": {}, "limit": 0}), "limit"),
        (
            json!({"action": "kill", "filter": {}, "ids": vec!["t"; 10_001]}),
            "ids",
        ),
    ] {
        let (code, body) = call(
            &s,
            post.clone(),
            "/api/v1/threads/batch",
            &k["admin"],
            Some(bad.clone()),
        )
        .await;
        assert_eq!(
            (code, &body["error"]["where"]),
            (400, &json!(at)),
            "{bad}: {body}"
        );
    }

    // One audit entry per batch, naming what it did.
    let (_, audit) = call(&s, get, "/api/v1/audit?limit=100", &k["admin"], None).await;
    let notes: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "POST /api/v1/threads/batch")
        .filter_map(|a| a["result"].as_str())
        .collect();
    assert!(
        notes.contains(&"200 kill matched 3, applied 3, skipped 0"),
        "{notes:?}"
    );
}

/// A `/ws` subscription by labels: only the events of threads whose labels pass, as they
/// are when each event is sent (a label added later lets the thread's next events through).
#[tokio::test]
async fn a_ws_subscription_by_label_sends_only_the_threads_it_names() {
    let s = served("memory").await;
    let o = &s.organism;
    let labelled = |c: &str| {
        let mut l = BTreeMap::new();
        l.insert("customer".to_string(), c.to_string());
        l
    };
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");
    // A malformed test is refused where it is.
    send_json(
        &mut ws,
        json!({"cmd": "subscribe", "request_id": "bad", "label": ["nocolon"]}),
    )
    .await;
    let err = read_until(&mut ws, |f| f["request_id"] == "bad")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (&err["event"], &err["where"]),
        (&json!("error"), &json!("label")),
        "{err}"
    );
    let sub = json!({"cmd": "subscribe", "request_id": "s", "label": ["customer:a1,a2"], "events": ["message", "thread_updated"]});
    send_json(&mut ws, sub).await;
    let ack = read_until(&mut ws, |f| f["request_id"] == "s")
        .await
        .pop()
        .unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");

    let inject_as = |c: &str, text: &str, thread: Option<&str>| {
        let req = agentserver::InjectRequest {
            from: "api".into(),
            to: "c".into(),
            payload_xml: format!("<Note>{text}</Note>"),
            thread_id: thread.map(str::to_string),
        };
        o.inject_labelled(req, None, Some(&labelled(c)))
            .unwrap()
            .thread_id
            .to_string()
    };
    let b = inject_as("b", "not-for-you", None);
    let a = inject_as("a2", "for-you", None);
    let frames = read_until(&mut ws, |f| f["event"] == "message").await;
    let first = frames.last().unwrap();
    assert_eq!(first["message"]["thread_id"], json!(a), "{first}");
    // The other thread relabelled: its next message passes.
    let (code, _) = s
        .http
        .patch(s.url(&format!("/api/v1/threads/{b}")))
        .json(&json!({"labels": {"customer": "a1"}}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(code, 200);
    inject(o, "c", "<Note>now-yes</Note>", Some(&b));
    let frames = read_until(&mut ws, |f| f["event"] == "message").await;
    let next = frames.last().unwrap();
    assert_eq!(next["message"]["thread_id"], json!(b), "{next}");
    assert!(next["message"]["payload_xml"]
        .as_str()
        .unwrap()
        .contains("now-yes"));
    // `thread_updated` carries the thread's labels.
    let frames = read_until(&mut ws, |f| {
        f["event"] == "thread_updated" && f["thread_id"] == json!(b)
    })
    .await;
    let update = frames.last().unwrap();
    assert_eq!(update["labels"], json!({"customer": "a1"}), "{update}");
}

/// `q=` finds threads by their payloads' words with `organism.search.payload_text` (an
/// FTS5 index in the store), not without; any text is a phrase, never a query syntax error.
#[tokio::test]
async fn q_finds_payload_words_only_with_payload_search_on() {
    for on in [true, false] {
        let (o, dir) = organism_with(Organism::builder(), "", "breadth-first", CHAIN);
        drop(o);
        let path = dir.path().join("organism.yaml");
        let search = if on {
            "\n  search: {payload_text: true}"
        } else {
            ""
        };
        let yaml = std::fs::read_to_string(&path)
            .unwrap()
            .replace("store: memory", &format!("store: s.db{search}"));
        std::fs::write(&path, yaml).unwrap();
        let o = Organism::builder().load(&path).unwrap();
        let s = Served::over(o, dir, ApiOptions::default()).await;
        let t = s.inject_note("a", "the quick brown fox").await;
        assert_eq!(
            settle(&s.organism, &t).await,
            agentserver::threads::ThreadStatus::Completed
        );
        s.inject_note("c", "a lazy dog").await;
        let want = u64::from(on);
        assert_eq!(total(&s, "q=brown%20fox").await, want, "on: {on}");
        assert_eq!(total(&s, "q=fox%20brown").await, 0, "a phrase, in order");
        assert_eq!(total(&s, "q=zebra").await, 0);
        // Ids, labels and errors are found either way (through the trigrams when on).
        let fragment = &t[t.len() - 9..t.len() - 3];
        assert_eq!(total(&s, &format!("q={fragment}")).await, 1, "on: {on}");
        let labels = [("customer".to_string(), "Zebra_q".to_string())].into();
        let req = agentserver::InjectRequest {
            from: "api".into(),
            to: "c".into(),
            payload_xml: "<Note>x</Note>".into(),
            thread_id: None,
        };
        let l = s
            .organism
            .inject_labelled(req, None, Some(&labels))
            .unwrap();
        settle(&s.organism, &l.thread_id).await;
        assert_eq!(total(&s, "q=ebra_q").await, 1, "on: {on}");
        assert_eq!(
            total(&s, "q=_q").await,
            1,
            "a short q reads every thread: on {on}"
        );
        for odd in [
            "%22a%22%20OR%20b*",
            "NEAR(",
            "%3A%3A",
            "-x",
            "%C3%A9t%C3%A9",
        ] {
            let (code, body) = s.get(&format!("/api/v1/threads?q={odd}")).await;
            assert_eq!(code, 200, "{odd}: {body}");
        }
    }
    // Turned on over a store that has threads: they are indexed at once.
    let (o, dir) = organism_with(Organism::builder(), "", "breadth-first", CHAIN);
    drop(o);
    let path = dir.path().join("organism.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, yaml.replace("store: memory", "store: s.db")).unwrap();
    let t = {
        let o = Organism::builder().load(&path).unwrap();
        let t = inject(&o, "c", "<Note>before</Note>", None)
            .thread_id
            .to_string();
        settle(&o, &t).await;
        o.stop().await;
        t
    };
    let yaml = std::fs::read_to_string(&path).unwrap();
    let yaml = yaml.replace("store: s.db", "store: s.db\n  search: {payload_text: true}");
    std::fs::write(&path, yaml).unwrap();
    let fragment = &t[t.len() - 9..t.len() - 3];
    {
        let o = Organism::builder().load(&path).unwrap();
        let u = inject(&o, "c", "<Note>during</Note>", None).thread_id;
        settle(&o, &u).await;
        let s = Served::over(
            o.clone(),
            tempfile::tempdir().unwrap(),
            ApiOptions::default(),
        )
        .await;
        assert_eq!(total(&s, &format!("q={fragment}")).await, 1);
        assert_eq!(total(&s, "q=during").await, 1);
        o.stop().await;
        s.server.shutdown().await;
    }
    // Turned off, the indexes are emptied; on again, threads are indexed at once and
    // payloads from then on.
    for (search, during) in [("", 0), ("\n  search: {payload_text: true}", 0)] {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let yaml = yaml.replace("\n  search: {payload_text: true}", "");
        std::fs::write(
            &path,
            yaml.replace("store: s.db", &format!("store: s.db{search}")),
        )
        .unwrap();
        let o = Organism::builder().load(&path).unwrap();
        let s = Served::over(
            o.clone(),
            tempfile::tempdir().unwrap(),
            ApiOptions::default(),
        )
        .await;
        assert_eq!(total(&s, &format!("q={fragment}")).await, 1, "{search}");
        assert_eq!(total(&s, "q=during").await, during, "{search}");
        o.stop().await;
        s.server.shutdown().await;
    }
    drop(dir);
    // Without a store there is no index to keep: refused, saying where.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, format!("organism: {{name: m, store: memory, search: {{payload_text: true}}}}\nlisteners:\n{CHAIN}\n")).unwrap();
    let e = Organism::builder().load(&path).err().expect("refused");
    assert!(
        e.to_string().contains("organism.search.payload_text"),
        "{e}"
    );
}
