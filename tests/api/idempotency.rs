//! Idempotent injects (`Idempotency-Key`): concurrent duplicates make one thread, a replay
//! says so, another body is a conflict, and the key outlives a restart but not its window.

use std::time::Duration;

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::time::Clock;
use agentserver::Organism;
use serde_json::{json, Value};

/// The chain a → b → c with its store in `dir`, on `clock`, served.
async fn served(
    dir: &std::path::Path,
    clock: Clock,
    window_ms: u64,
) -> (Organism, ApiServer, String) {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!(
        "organism: {{name: keys, store: data.db}}\nlimits: {{idempotency_window_ms: {window_ms}}}\nlisteners:\n{CHAIN}\n"
    );
    std::fs::write(dir.join("o.yaml"), yaml).unwrap();
    let o = Organism::builder()
        .clock(clock)
        .load(&dir.join("o.yaml"))
        .unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    (o, server, base)
}

/// An inject with `key`: (status, replayed header, body).
async fn keyed(base: &str, key: &str, body: &Value) -> (u16, Option<String>, Value) {
    let r = http()
        .post(format!("{base}/api/v1/inject"))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotency-replayed")
        .map(|v| v.to_str().unwrap().to_string());
    (status, replayed, r.json().await.unwrap())
}

#[tokio::test]
async fn one_key_makes_one_thread_survives_a_restart_and_ends_with_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let (o, server, base) = served(dir.path(), clock.clone(), 3_600_000).await;
    let body = json!({"to": "a", "payload_xml": "<Note>pay once</Note>"});

    // 100 at once with one key and one body: one thread, 99 replays that say so.
    let answers =
        futures_util::future::join_all((0..100).map(|_| keyed(&base, "order-42", &body))).await;
    let threads: std::collections::BTreeSet<&str> = answers
        .iter()
        .map(|(st, _, b)| {
            assert_eq!(*st, 202, "{b}");
            b["thread_id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(threads.len(), 1, "{threads:?}");
    let replays = answers
        .iter()
        .filter(|(_, r, _)| r.as_deref() == Some("true"))
        .count();
    assert_eq!(replays, 99);
    let thread = threads.into_iter().next().unwrap().to_string();
    assert_eq!(
        settle(&o, &thread).await,
        agentserver::threads::ThreadStatus::Completed
    );
    assert_eq!(o.info().total_messages, 3, "one inject's messages, no more");

    // Another body under the same key: a conflict, nothing made.
    let other = json!({"to": "a", "payload_xml": "<Note>pay twice</Note>"});
    let (st, _, e) = keyed(&base, "order-42", &other).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("idempotency_conflict")),
        "{e}"
    );
    // The same body written otherwise (spacing, key order) is the same body.
    let same =
        serde_json::from_str::<Value>(r#"{ "payload_xml" : "<Note>pay once</Note>", "to":"a" }"#)
            .unwrap();
    let (st, replayed, b) = keyed(&base, "order-42", &same).await;
    assert_eq!(
        (st, replayed.as_deref(), b["thread_id"].as_str()),
        (202, Some("true"), Some(thread.as_str()))
    );

    // Keys that are not keys.
    for bad in [String::new(), "x".repeat(256), "tab\there".into()] {
        let r = http()
            .post(format!("{base}/api/v1/inject"))
            .header("Idempotency-Key", bad.as_str())
            .json(&body)
            .send()
            .await;
        // reqwest refuses a header value with a tab; the rest reach the server.
        let Ok(r) = r else { continue };
        assert_eq!(r.status().as_u16(), 400, "key {bad:?}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["where"], "Idempotency-Key", "{e}");
    }

    // An inject that failed keeps no key: fixed, the same key injects.
    let (st, _, _) = keyed(
        &base,
        "fix-me",
        &json!({"to": "nobody", "payload_xml": "<Note/>"}),
    )
    .await;
    assert_eq!(st, 404);
    let (st, replayed, _) = keyed(&base, "fix-me", &body).await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")));

    // /ws: the same key from the same principal is the same inject.
    let mut ws = ws_connect(&format!("{}/ws", base.replacen("http://", "ws://", 1))).await;
    next_json(&mut ws).await; // connected
    send_json(
        &mut ws,
        json!({"cmd": "inject", "request_id": "r1", "idempotency_key": "order-42",
               "to": "a", "payload_xml": "<Note>pay once</Note>"}),
    )
    .await;
    let ack = read_until(&mut ws, |f| f["request_id"] == "r1")
        .await
        .pop()
        .unwrap();
    assert_eq!(
        (
            ack["event"].as_str(),
            ack["thread_id"].as_str(),
            ack["replayed"].as_bool()
        ),
        (Some("ack"), Some(thread.as_str()), Some(true)),
        "{ack}"
    );
    drop(ws);

    // A restart keeps the key.
    server.shutdown().await;
    o.stop().await;
    drop(o);
    let (o, server, base) = served(dir.path(), clock.clone(), 3_600_000).await;
    let (st, replayed, b) = keyed(&base, "order-42", &body).await;
    assert_eq!(
        (st, replayed.as_deref(), b["thread_id"].as_str()),
        (202, Some("true"), Some(thread.as_str())),
        "{b}"
    );

    // Past the window the key is new again.
    clock.advance(Duration::from_secs(3_601));
    let (st, replayed, b) = keyed(&base, "order-42", &body).await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")), "{b}");
    assert_ne!(b["thread_id"].as_str(), Some(thread.as_str()));
    server.shutdown().await;
    o.stop().await;
}

/// Keys the store cannot give back at a start are said in an `error` event (and the log),
/// and the server starts without them: a request retried with such a key runs again.
#[tokio::test]
async fn keys_the_store_cannot_give_back_at_a_start_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let (o, server, base) = served(dir.path(), clock.clone(), 3_600_000).await;
    let body = json!({"to": "a", "payload_xml": "<Note>pay once</Note>"});
    let (st, _, first) = keyed(&base, "order-7", &body).await;
    assert_eq!(st, 202, "{first}");
    server.shutdown().await;
    o.stop().await;
    drop(o);
    // The key's row, written wrong behind the server's back.
    let conn = rusqlite::Connection::open(dir.path().join("data.db")).unwrap();
    let changed = conn
        .execute("UPDATE idempotency SET created = 'soon'", [])
        .unwrap();
    assert_eq!(changed, 1);
    drop(conn);

    let (o, server, base) = served(dir.path(), clock.clone(), 3_600_000).await;
    // What the start published: from the hub's first event (a start numbers on past the
    // store's last `seq`, leaving a gap).
    let first_seq = o.events().subscribe_since(Some(0)).resync_from;
    let said = o.events().subscribe_since(first_seq.map(|f| f - 1));
    let error = said.replay.iter().find_map(|e| match &e.kind {
        agentserver::events::EventKind::Error { error, .. } => Some(error.clone()),
        _ => None,
    });
    let error = error.expect("an error event says the keys were not read back");
    assert!(error.contains("idempotency keys"), "{error}");
    let (st, replayed, again) = keyed(&base, "order-7", &body).await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")), "{again}");
    assert_ne!(again["thread_id"], first["thread_id"]);
    server.shutdown().await;
    o.stop().await;
}

#[tokio::test]
async fn keys_per_tenant_are_bounded_and_the_bound_is_named() {
    let s = serve_with(
        Organism::builder(),
        "  max_idempotency_keys: 2",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    let body = json!({"to": "a", "payload_xml": "<Note>n</Note>"});
    for k in ["k1", "k2"] {
        assert_eq!(keyed(&s.base, k, &body).await.0, 202);
    }
    let (st, _, e) = keyed(&s.base, "k3", &body).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("too_many_idempotency_keys")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.max_idempotency_keys"),
        "{e}"
    );
    // A known key still replays, and an inject without a key still goes.
    assert_eq!(keyed(&s.base, "k1", &body).await.1.as_deref(), Some("true"));
    assert_eq!(s.post("/api/v1/inject", body).await.0, 202);
}

/// Tenants `acme` and `beta`, each with a listener, and a store for the keys.
const TENANTS: &str = "  - {name: a1, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}
  - {name: b1, description: beta's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: beta}
  - {name: o, description: ours, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}";

#[tokio::test]
async fn a_key_is_its_principals_own_and_another_tenant_learns_nothing_from_it() {
    use agentserver::access::{KeySource, Role};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!("organism: {{name: keys, store: data.db}}\nauth: {{methods: [keys]}}\nlisteners:\n{TENANTS}\n"),
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let key = |name: &str, tenant: Option<&str>| {
        let (key, row) = agentserver::access::new_key(name, Role::Operator, tenant, None).unwrap();
        KeySource::of(&config).unwrap().add(&row).unwrap();
        key
    };
    let (acme1, acme2, beta, org) = (
        key("acme-1", Some("acme")),
        key("acme-2", Some("acme")),
        key("beta", Some("beta")),
        key("ops", None),
    );
    let o = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let send = |cred: String, to: &'static str| {
        let base = base.clone();
        async move {
            let r = http()
                .post(format!("{base}/api/v1/inject"))
                .bearer_auth(cred)
                .header("Idempotency-Key", "same-key")
                .json(&json!({"to": to, "payload_xml": "<Note>n</Note>"}))
                .send()
                .await
                .unwrap();
            let replayed = r
                .headers()
                .get("idempotency-replayed")
                .map(|v| v.to_str().unwrap().to_string());
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            (
                status,
                replayed,
                body["thread_id"].as_str().map(str::to_string),
                body,
            )
        }
    };
    let (st, replayed, first, b) = send(acme1.clone(), "a1").await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")), "{b}");
    // The same key from another credential of the same tenant, from another tenant (to its
    // own listener, and to acme's, which it cannot see), and from the organism's own: each
    // its own key, nothing replayed, nothing of acme's thread told.
    let (st, replayed, second, _) = send(acme2, "a1").await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")));
    assert_ne!(second, first);
    let (st, replayed, third, _) = send(beta.clone(), "b1").await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")));
    assert_ne!(third, first);
    let (st, _, _, e) = send(beta.clone(), "a1").await;
    assert_eq!(st, 409, "beta's own key, used with another body: {e}");
    assert!(!e.to_string().contains(first.as_deref().unwrap()), "{e}");
    let (st, replayed, fourth, _) = send(org, "o").await;
    assert_eq!((st, replayed.as_deref()), (202, Some("false")));
    assert_ne!(fourth, first);
    // A message is read by id in its tenant's scope only.
    let message = b["message_id"].as_str().unwrap().to_string();
    let read = |cred: String| {
        let url = format!("{base}/api/v1/messages/{message}");
        async move {
            http()
                .get(url)
                .bearer_auth(cred)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(read(acme1.clone()).await, 200);
    assert_eq!(read(beta.clone()).await, 404);
    // And acme's own credential replays its own.
    let (st, replayed, again, _) = send(acme1, "a1").await;
    assert_eq!((st, replayed.as_deref(), again), (202, Some("true"), first));
    server.shutdown().await;
    o.stop().await;
}

#[tokio::test]
async fn a_client_message_id_names_its_message_once_and_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (o, server, base) = served(dir.path(), Clock::manual(), 3_600_000).await;
    let post = |body: Value| {
        let base = base.clone();
        async move {
            let r = http()
                .post(format!("{base}/api/v1/inject"))
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (st, r) =
        post(json!({"to": "a", "payload_xml": "<Note>mine</Note>", "message_id": "order-42-msg"}))
            .await;
    assert_eq!(
        (st, r["message_id"].as_str()),
        (202, Some("order-42-msg")),
        "{r}"
    );
    let thread = r["thread_id"].as_str().unwrap().to_string();
    settle(&o, &thread).await;
    // Read back by id; its children carry it as their parent.
    let m: Value = http()
        .get(format!("{base}/api/v1/messages/order-42-msg"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (m["id"].as_str(), m["thread_id"].as_str(), m["to"].as_str()),
        (Some("order-42-msg"), Some(thread.as_str()), Some("a")),
        "{m}"
    );
    let child = messages(&o, &thread)
        .into_iter()
        .find(|c| c.parent_id.as_deref() == Some("order-42-msg"));
    assert!(child.is_some(), "a's output names it as its parent");
    // Used again (same thread or another): 409 naming it; nothing made.
    let before = o.info().total_messages;
    for extra in [json!({}), json!({"thread_id": thread})] {
        let mut body =
            json!({"to": "a", "payload_xml": "<Note>again</Note>", "message_id": "order-42-msg"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (st, e) = post(body).await;
        assert_eq!(
            (st, e["error"]["code"].as_str()),
            (409, Some("message_id_taken")),
            "{e}"
        );
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("order-42-msg"),
            "{e}"
        );
    }
    assert_eq!(o.info().total_messages, before);
    // Not an id: 400 naming the field; a refused inject leaves its id free.
    for bad in ["", "has space", &"x".repeat(129)] {
        let (st, e) = post(json!({"to": "a", "payload_xml": "<Note/>", "message_id": bad})).await;
        assert_eq!(
            (st, e["error"]["where"].as_str()),
            (400, Some("message_id")),
            "{bad:?}: {e}"
        );
    }
    let (st, _) =
        post(json!({"to": "nobody", "payload_xml": "<Note/>", "message_id": "free-1"})).await;
    assert_eq!(st, 404);
    let (st, _) =
        post(json!({"to": "a", "payload_xml": "<Note>now</Note>", "message_id": "free-1"})).await;
    assert_eq!(st, 202);
    let r = http()
        .get(format!("{base}/api/v1/messages/no-such"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // After a restart the id is still taken (the store knows it).
    server.shutdown().await;
    o.stop().await;
    drop(o);
    let (o, server, base) = served(dir.path(), Clock::manual(), 3_600_000).await;
    let r = http()
        .post(format!("{base}/api/v1/inject"))
        .json(
            &json!({"to": "a", "payload_xml": "<Note>after</Note>", "message_id": "order-42-msg"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let m: Value = http()
        .get(format!("{base}/api/v1/messages/order-42-msg"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["id"], "order-42-msg");
    server.shutdown().await;
    o.stop().await;
}
