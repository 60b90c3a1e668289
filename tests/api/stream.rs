//! A thread's event stream (Server-Sent Events) read by a real HTTP client: the whole
//! history first, then live events with no gap and no duplicate; resuming inside the ring
//! and past it; stream tokens; and another tenant's thread.

use std::collections::HashSet;

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;
use serde_json::{json, Value};

/// One server-sent event.
#[derive(Debug)]
struct Frame {
    id: Option<u64>,
    event: String,
    data: Value,
}

/// A server-sent event stream, read frame by frame.
struct EventStream {
    body: reqwest::Response,
    buf: String,
}

impl EventStream {
    async fn open(url: &str, last_event_id: Option<u64>) -> EventStream {
        let mut r = http().get(url);
        if let Some(id) = last_event_id {
            r = r.header("Last-Event-ID", id.to_string());
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{url}");
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        EventStream {
            body: r,
            buf: String::new(),
        }
    }

    /// The next event (comments skipped), within [`WAIT`].
    async fn next(&mut self) -> Frame {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..end + 2).collect();
                    let (mut id, mut event, mut data) = (None, String::new(), String::new());
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("id:") {
                            id = v.trim().parse().ok();
                        } else if let Some(v) = line.strip_prefix("event:") {
                            event = v.trim().to_string();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data += v.strip_prefix(' ').unwrap_or(v);
                        }
                    }
                    if !event.is_empty() {
                        let data = serde_json::from_str(&data).unwrap();
                        return Frame { id, event, data };
                    }
                    continue;
                }
                let chunk = self
                    .body
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream goes on");
                self.buf += std::str::from_utf8(&chunk).unwrap();
            }
        })
        .await
        .expect("an event in time")
    }

    /// The snapshot's parts: (its messages' ids in order, `as_of_seq`, the first part).
    async fn snapshot(&mut self) -> (Vec<String>, u64, Value) {
        let mut ids = Vec::new();
        let mut first = None;
        loop {
            let f = self.next().await;
            assert_eq!(f.event, "thread_snapshot", "{f:?}");
            ids.extend(
                f.data["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["id"].as_str().unwrap().to_string()),
            );
            let as_of = f.data["as_of_seq"].as_u64().unwrap();
            first.get_or_insert(f.data.clone());
            if f.data["more"] == false {
                assert_eq!(f.id, Some(as_of), "the last part carries the snapshot's id");
                return (ids, as_of, first.unwrap());
            }
            assert_eq!(f.id, None, "a part before the last carries no id");
        }
    }
}

/// A sink `s` and a store in `dir`.
async fn served(dir: &std::path::Path) -> (Organism, ApiServer, String) {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = "organism: {name: sse, store: data.db}\nlisteners:\n  - {name: s, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n";
    std::fs::write(dir.join("o.yaml"), yaml).unwrap();
    let o = Organism::builder().load(&dir.join("o.yaml")).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    (o, server, base)
}

async fn note(base: &str, thread: &str, text: &str) -> String {
    let r = http()
        .post(format!("{base}/api/v1/inject"))
        .json(
            &json!({"to": "s", "payload_xml": format!("<Note>{text}</Note>"), "thread_id": thread}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    r.json::<Value>().await.unwrap()["message_id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_thread_stream_gives_the_whole_history_then_every_live_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let (o, server, base) = served(dir.path()).await;
    // 1,000 messages, each of about 2 kB: the snapshot comes in several parts.
    let pad = "x".repeat(2000);
    let mut ids = Vec::new();
    for i in 0..1000 {
        ids.push(note(&base, "long", &format!("{i} {pad}")).await);
    }
    let o2 = o.clone();
    wait_until_async("every note is handled", move || {
        let o = o2.clone();
        async move { o.info().active_threads == 0 && o.info().pending_messages == 0 }
    })
    .await;
    // From memory, where the organism still holds the thread.
    let url = format!("{base}/api/v1/threads/long/events");
    let (held, _, _) = EventStream::open(&url, None).await.snapshot().await;
    assert_eq!(held, ids, "every message, from memory");
    server.shutdown().await;
    o.stop().await;
    drop(o);

    // After a restart, the history comes from the store.
    let (o, server, base) = served(dir.path()).await;
    let url = format!("{base}/api/v1/threads/long/events");
    let mut s = EventStream::open(&url, None).await;
    let (seen, as_of, first) = s.snapshot().await;
    let first_off = seen.iter().zip(&ids).position(|(a, b)| a != b);
    assert!(
        seen == ids,
        "every message, in order: {} of {}, first different at {first_off:?}",
        seen.len(),
        ids.len()
    );
    assert_eq!(first["thread"]["id"], "long", "{first}");
    assert!(first["inputs"].as_array().is_some_and(Vec::is_empty));

    // Live: each new message once, with the seq of its event, after the snapshot's.
    let mut live_ids = Vec::new();
    for i in 0..5 {
        live_ids.push(note(&base, "long", &format!("live {i}")).await);
    }
    let (mut got, mut last) = (Vec::new(), as_of);
    let mut seqs = HashSet::new();
    while got.len() < live_ids.len() {
        let f = s.next().await;
        let seq = f.id.expect("a live event has an id");
        assert!(seq > as_of && seqs.insert(seq), "{f:?}");
        assert_eq!(f.data["seq"].as_u64(), Some(seq));
        if f.event == "message" {
            got.push(
                f.data["message"]["id"]
                    .as_str()
                    .or(f.data["id"].as_str())
                    .unwrap()
                    .to_string(),
            );
            last = seq;
        }
    }
    assert_eq!(got, live_ids);

    // Resuming inside the ring: exactly what came after.
    let mut again = EventStream::open(&url, Some(as_of)).await;
    let mut resumed = Vec::new();
    while resumed.len() < live_ids.len() {
        let f = again.next().await;
        assert_ne!(
            f.event, "thread_snapshot",
            "inside the ring there is no snapshot"
        );
        if f.event == "message" {
            resumed.push(
                f.data["message"]["id"]
                    .as_str()
                    .or(f.data["id"].as_str())
                    .unwrap()
                    .to_string(),
            );
            assert!(f.id.unwrap() <= last);
        }
    }
    assert_eq!(resumed, live_ids);

    // From before the ring (this run's ring starts past the last run's seq): a fresh
    // snapshot with everything.
    let mut old = EventStream::open(&format!("{url}?since=1"), None).await;
    let (all, _, _) = old.snapshot().await;
    let expected: Vec<String> = ids.iter().chain(&live_ids).cloned().collect();
    assert_eq!(
        all, expected,
        "the store's part, then the part held in memory"
    );

    // An unknown thread is 404.
    let r = http()
        .get(format!("{base}/api/v1/threads/nope/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // A bad query parameter is a 400 naming it, as on every route.
    let r = http().get(format!("{url}?since=abc")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_query", "{e}");
    assert_eq!(e["error"]["where"], "since", "{e}");
    // So is a `Last-Event-ID` that is no event's id, with `?since=` or without.
    for url in [url.clone(), format!("{url}?since=1")] {
        let r = http()
            .get(&url)
            .header("Last-Event-ID", "true")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{url}");
        let e: serde_json::Value = r.json().await.unwrap();
        assert_eq!(e["error"]["where"], "Last-Event-ID", "{e}");
    }
    drop((s, again, old));
    server.shutdown().await;
    o.stop().await;
}

#[tokio::test]
async fn stream_tokens_open_one_stream_once_and_nothing_else() {
    use agentserver::access::{KeySource, Role};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        "organism: {name: sse, store: data.db}\nauth: {methods: [keys]}\nlisteners:
  - {name: a1, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}
  - {name: b1, description: beta's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: beta}\n",
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let key = |name: &str, tenant: &str| {
        let (key, row) =
            agentserver::access::new_key(name, Role::Viewer, Some(tenant), None).unwrap();
        KeySource::of(&config).unwrap().add(&row).unwrap();
        key
    };
    let (acme, beta) = (key("acme", "acme"), key("beta", "beta"));
    // Ten more of acme's credentials, to reach its tenant's bound on tokens.
    let more: Vec<String> = (0..10).map(|i| key(&format!("acme{i}"), "acme")).collect();
    let admin = {
        let (key, row) = agentserver::access::new_key("root", Role::Admin, None, None).unwrap();
        KeySource::of(&config).unwrap().add(&row).unwrap();
        key
    };
    let o = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    o.inject(agentserver::InjectRequest {
        from: "api".into(),
        to: "a1".into(),
        payload_xml: "<Note>acme's</Note>".into(),
        thread_id: Some("acme-t".into()),
    })
    .unwrap();
    settle(&o, "acme-t").await;
    let token_for = |cred: String, thread: &'static str| {
        let base = base.clone();
        async move {
            let r = http()
                .post(format!("{base}/api/v1/stream-tokens"))
                .bearer_auth(cred)
                .json(&json!({"thread_id": thread}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    // Another tenant cannot have a token for acme's thread, nor read its stream.
    let (st, e) = token_for(beta.clone(), "acme-t").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("unknown_thread")),
        "{e}"
    );
    let r = http()
        .get(format!("{base}/api/v1/threads/acme-t/events"))
        .bearer_auth(&beta)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Without a credential or a token: 401.
    let r = http()
        .get(format!("{base}/api/v1/threads/acme-t/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    let (st, t) = token_for(acme.clone(), "acme-t").await;
    assert_eq!(st, 201, "{t}");
    let url = format!("{base}{}", t["url"].as_str().unwrap());
    let mut s = EventStream::open(&url, None).await;
    let (ids, _, _) = s.snapshot().await;
    assert_eq!(ids.len(), 1);
    // Used once: a second use is refused, as is the token on another route or thread.
    let r = http().get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let (_, t2) = token_for(acme.clone(), "acme-t").await;
    let st2 = t2["token"].as_str().unwrap();
    for other in [
        format!("{base}/api/v1/threads/acme-t?st={st2}"),
        format!("{base}/api/v1/threads/acme-t/messages?st={st2}"),
    ] {
        let r = http().get(&other).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{other}");
    }
    o.inject(agentserver::InjectRequest {
        from: "api".into(),
        to: "b1".into(),
        payload_xml: "<Note>beta's</Note>".into(),
        thread_id: Some("beta-t".into()),
    })
    .unwrap();
    let r = http()
        .get(format!("{base}/api/v1/threads/beta-t/events?st={st2}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "a token is for its thread only");
    // One credential holds at most 100 unused tokens.
    let mut refused = None;
    for _ in 0..101 {
        let (st, e) = token_for(acme.clone(), "acme-t").await;
        if st != 201 {
            refused = Some((st, e));
            break;
        }
    }
    let (st, e) = refused.expect("the 101st unused token is refused");
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("too_many_stream_tokens")),
        "{e}"
    );
    // One tenant's credentials together hold at most 1,000: acme's 100 and nine more
    // credentials' 100 each; a tenth is refused, naming the tenant's bound, while beta
    // still gets its own.
    for cred in &more[..9] {
        for _ in 0..100 {
            let (st, e) = token_for(cred.clone(), "acme-t").await;
            assert_eq!(st, 201, "{e}");
        }
    }
    let (st, e) = token_for(more[9].clone(), "acme-t").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("too_many_stream_tokens")),
        "{e}"
    );
    let said = e["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("1000 of tenant `acme`'s (1000 at most)"),
        "{said}"
    );
    let (st, e) = token_for(beta.clone(), "beta-t").await;
    assert_eq!(st, 201, "{e}");
    drop(s);

    // A stream on a key ends when the key is revoked.
    let mut open = http()
        .get(format!("{base}/api/v1/threads/acme-t/events"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);
    let revoked = http()
        .delete(format!("{base}/api/v1/keys/acme"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(revoked.status().is_success(), "{}", revoked.status());
    let ended = tokio::time::timeout(WAIT, async {
        while let Ok(Some(_)) = open.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream ends with its key");
    server.shutdown().await;
    o.stop().await;
}

/// A snapshot the store cannot read ends the stream saying why: a client never takes a
/// failed read for a thread without history.
#[tokio::test]
async fn a_snapshot_the_store_cannot_read_ends_the_stream_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let (o, server, base) = served(dir.path()).await;
    note(&base, "kept", "one").await;
    let o2 = o.clone();
    wait_until_async("the note is handled", move || {
        let o = o2.clone();
        async move { o.info().active_threads == 0 && o.info().pending_messages == 0 }
    })
    .await;
    server.shutdown().await;
    o.stop().await;
    drop(o);
    // After a restart the thread's history is the store's; the table of its inputs is then
    // taken away under the running server.
    let (o, server, base) = served(dir.path()).await;
    let conn = rusqlite::Connection::open(dir.path().join("data.db")).unwrap();
    conn.execute_batch("ALTER TABLE inputs RENAME TO gone")
        .unwrap();
    let url = format!("{base}/api/v1/threads/kept/events");
    let mut s = EventStream::open(&url, None).await;
    let f = s.next().await;
    assert_eq!(f.event, "stream_error", "{f:?}");
    assert_eq!(f.data["error"]["code"], "store_failed", "{f:?}");
    // Nothing follows: the stream has ended.
    let rest = tokio::time::timeout(WAIT, s.body.chunk()).await.unwrap();
    assert!(matches!(rest, Ok(None)), "{rest:?}");
    conn.execute_batch("ALTER TABLE gone RENAME TO inputs")
        .unwrap();
    server.shutdown().await;
    o.stop().await;
}
