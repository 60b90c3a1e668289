//! The event stream mirrored to NATS JetStream: a real `nats-server -js` on a loopback port,
//! the pump (with a store) in this process mirroring its events, a real `agentserver
//! gateway` process serving `/ws/messages` from the stream, and `agentserver restore`
//! rebuilding a store file from it.

mod common;
mod nats;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::store::Store;
use agentserver::threads::{MessageFilter, Page};
use agentserver::Organism;
use common::child::{self, Running};
use common::*;
use nats::Nats;
use serde_json::Value;

fn organism_file(dir: &Path, nats: &Nats) -> PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!(
        "organism:
  name: mirrored
  store: o.db
  nats: {{url: {}, stream_prefix: {}}}
listeners:
{CHAIN}
",
        nats.url(),
        nats.prefix()
    );
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `agentserver restore --from-nats` of `nats`'s stream into `store`.
fn restore(nats: &Nats, store: &Path) -> std::process::Output {
    child::run_to_exit([
        "restore".as_ref(),
        "--from-nats".as_ref(),
        "--nats".as_ref(),
        nats.url().as_ref(),
        "--stream-prefix".as_ref(),
        nats.prefix().as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
    ])
}

/// The agents' names in a `connected` snapshot.
fn agent_names(connected: &Value) -> Vec<&str> {
    connected["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect()
}

/// The organism's events mirrored to NATS (what `agentserver run` does) until `stop`.
struct Mirroring {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Mirroring {
    fn start(o: &Organism) -> Mirroring {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(agentserver::api::mirror_events(o.clone(), stop.clone()));
        Mirroring { stop, task }
    }

    /// Stops it once it has sent what the organism published.
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// An `agentserver gateway` of `nats`'s stream, with `extra` arguments: it and its
/// `ws://` base URL.
fn gateway_with(nats: &Nats, extra: &[&std::ffi::OsStr]) -> (Running, String) {
    let mut cmd = child::agentserver();
    cmd.args(["gateway", "--nats", &nats.url(), "--stream-prefix"])
        .arg(nats.prefix())
        .args(["--listen", "127.0.0.1:0"])
        .args(extra);
    let (process, url) = child::serve(cmd, Stdio::null());
    (process, url.replace("http://", "ws://"))
}

fn gateway(nats: &Nats) -> (Running, String) {
    gateway_with(nats, &[])
}

/// An organism mirroring to a NATS of its own, a gateway of its stream, and a
/// `/ws/messages` client of the gateway.
struct Mirrored {
    nats: Nats,
    dir: tempfile::TempDir,
    o: Organism,
    mirror: Mirroring,
    _gateway: Running,
    client: Ws,
}

impl Mirrored {
    async fn start() -> Mirrored {
        let nats = Nats::start();
        let dir = tempfile::tempdir().unwrap();
        let path = organism_file(dir.path(), &nats);
        let o = Organism::builder().load(&path).unwrap();
        let mirror = Mirroring::start(&o);
        let (gateway, gw) = gateway(&nats);
        let client = ws_connect(&format!("{gw}/ws/messages")).await;
        Mirrored {
            nats,
            dir,
            o,
            mirror,
            _gateway: gateway,
            client,
        }
    }
}

/// Frames until the one saying the note to `c` in `thread` was delivered: its status
/// change, or (on `/ws/messages`) its message frame written after it.
async fn frames_until_done(ws: &mut Ws, threads: &[String]) -> Vec<Value> {
    // Threads end in any order: read until every one's last message is delivered.
    let mut waiting: std::collections::HashSet<&str> = threads.iter().map(String::as_str).collect();
    let mut frames = Vec::new();
    loop {
        let f = next_json(ws).await;
        let done = (f["event"] == "message_status" || f["event"] == "message")
            && f["to"] == "c"
            && f["status"] == "delivered";
        if done {
            if let Some(t) = f["thread_id"].as_str() {
                waiting.remove(t);
            }
        }
        frames.push(f);
        if waiting.is_empty() {
            return frames;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_serves_the_pumps_message_stream_and_restore_rebuilds_its_store() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats);
    let o = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let mirror = Mirroring::start(&o);
    // Something in the stream before the gateway starts: it loads what it holds.
    let first = inject(&o, "a", "<Note>before the gateway</Note>", None);
    settle(&o, &first.thread_id).await;
    let (_gateway, gw) = gateway(&nats);

    let filter = "/ws/messages?agents=b";
    let mut at_pump = ws_connect(&format!("ws://{}{filter}", server.local_addr())).await;
    let mut at_gateway = ws_connect(&format!("{gw}{filter}")).await;
    // Both sessions are subscribed once their upgrades are answered: every event of the
    // traffic below reaches the gateway after that, through the pump's mirror and NATS.
    let mut threads = Vec::new();
    for i in 0..10 {
        let r = inject(&o, "a", &format!("<Note>n{i}</Note>"), None);
        threads.push(r.thread_id.to_string());
    }
    let pump_frames = frames_until_done(&mut at_pump, &threads).await;
    let gateway_frames = frames_until_done(&mut at_gateway, &threads).await;
    // One of them may start earlier (a gateway client that came before the gateway read
    // its first event gets everything it read): from the later start on, they are equal.
    // (The pump's first frame is its `connected` snapshot, which a gateway has no data for.)
    let not_connected = |frames: Vec<Value>| -> Vec<Value> {
        frames
            .into_iter()
            .filter(|f| f["event"] != "connected")
            .collect()
    };
    assert_eq!(pump_frames[0]["event"], "connected");
    // Each session holds frames a moment, so whether a status change went in its message's
    // frame or apart depends on timing: compared as a client keeps them.
    let pump_frames = fold_statuses(not_connected(pump_frames));
    let gateway_frames = fold_statuses(not_connected(gateway_frames));
    let first = |frames: &[Value]| frames[0]["seq"].as_u64().unwrap();
    let from = first(&pump_frames).max(first(&gateway_frames));
    let tail = |frames: &[Value]| -> Vec<Value> {
        frames
            .iter()
            .filter(|f| f["seq"].as_u64().unwrap() >= from)
            .cloned()
            .collect()
    };
    assert_eq!(tail(&pump_frames), tail(&gateway_frames));
    assert!(tail(&pump_frames).len() >= 20, "{}", pump_frames.len());

    // `/ws` too: the same event frames (after the pump's `connected` snapshot), and a
    // command is refused as read-only.
    let events = "/ws?agents=b&events=message,message_status,agent_state";
    let mut ws_pump = ws_connect(&format!("ws://{}{events}", server.local_addr())).await;
    let mut ws_gateway = ws_connect(&format!("{gw}{events}")).await;
    let more = inject(&o, "a", "<Note>for /ws</Note>", None)
        .thread_id
        .to_string();
    let a = not_connected(frames_until_done(&mut ws_pump, std::slice::from_ref(&more)).await);
    let b = not_connected(frames_until_done(&mut ws_gateway, std::slice::from_ref(&more)).await);
    assert_eq!(
        a.iter()
            .filter(|f| f["seq"].as_u64() >= b[0]["seq"].as_u64())
            .collect::<Vec<_>>(),
        b.iter()
            .filter(|f| f["seq"].as_u64() >= a[0]["seq"].as_u64())
            .collect::<Vec<_>>()
    );
    assert!(a.iter().any(|f| f["event"] == "agent_state"), "{a:?}");
    send_json(
        &mut ws_gateway,
        serde_json::json!({"cmd": "stop", "request_id": "r1"}),
    )
    .await;
    let refused = next_json(&mut ws_gateway).await;
    assert_eq!(
        (&refused["event"], &refused["code"], &refused["request_id"]),
        (&"error".into(), &"read_only".into(), &"r1".into())
    );
    // A gateway decides no input, aborts no thread: it reads.
    for (i, cmd) in [
        serde_json::json!({"cmd": "approve", "input_id": "x"}),
        serde_json::json!({"cmd": "abort", "thread_id": more}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut cmd = cmd;
        cmd["request_id"] = serde_json::json!(i);
        send_json(&mut ws_gateway, cmd).await;
        let refused = next_json(&mut ws_gateway).await;
        assert_eq!(
            (&refused["code"], &refused["request_id"]),
            (&"read_only".into(), &i.into())
        );
    }
    let last = more;

    // ...and resumes with `since` exactly as the pump does.
    let since = pump_frames[7]["seq"].as_u64().unwrap();
    let mut resumed = ws_connect(&format!("{gw}{filter}&since={since}")).await;
    let mut resumed_at_pump = ws_connect(&format!(
        "ws://{}{filter}&since={since}",
        server.local_addr()
    ))
    .await;
    let a = fold_statuses(frames_until_done(&mut resumed, std::slice::from_ref(&last)).await);
    let b =
        fold_statuses(frames_until_done(&mut resumed_at_pump, std::slice::from_ref(&last)).await);
    assert_eq!(a, b);
    let messages = |frames: &[Value]| -> Vec<Value> {
        frames
            .iter()
            .filter(|f| f["event"] == "message" && f["seq"].as_u64().unwrap() > since)
            .cloned()
            .collect()
    };
    // What the live session saw after `since`, then the thread sent for `/ws`.
    let live = messages(&pump_frames);
    assert!(!live.is_empty());
    assert_eq!(messages(&a)[..live.len()], live[..]);
    assert_eq!(a.last().unwrap()["thread_id"], *last);

    // A client without `since` starts with the pump's mirrored snapshot, as at the pump.
    let mut fresh = ws_connect(&format!("{gw}/ws")).await;
    let hello = next_json(&mut fresh).await;
    assert_eq!(hello["event"], "connected", "{hello}");
    assert_eq!(hello["organism"]["name"], "mirrored");
    assert_eq!(agent_names(&hello), ["a", "b", "c"]);
    assert!(hello["threads"].is_array(), "{hello}");

    // Folding as at the pump: agents' states arrive coalesced, in `agent_states` frames.
    let mut folded = ws_connect(&format!("{gw}/ws?coalesce_ms=50")).await;
    assert_eq!(next_json(&mut folded).await["event"], "connected");
    inject(&o, "a", "<Note>fold me</Note>", None);
    let seen = read_until(&mut folded, |f| f["event"] == "agent_states").await;
    assert!(seen.iter().all(|f| f["event"] != "agent_state"), "{seen:?}");
    drop(folded);

    // Resuming from before what the gateway holds: resync_required, as at the pump.
    let mut too_old = ws_connect(&format!("{gw}{filter}&since=999999999")).await;
    let f = next_json(&mut too_old).await;
    assert_eq!(f["event"], "resync_required", "{f}");
    let f = next_json(&mut too_old).await;
    assert_eq!(f["event"], "connected", "{f}");

    // Restore: the pump's store and one rebuilt from the stream hold the same log.
    drop((at_pump, at_gateway, resumed, resumed_at_pump, too_old));
    drop((ws_pump, ws_gateway, fresh));
    server.shutdown().await;
    o.stop().await;
    mirror.stop().await;
    drop(o);
    let restored = dir.path().join("restored.db");
    let out = restore(&nats, &restored);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = Page {
        limit: 1000,
        offset: 0,
    };
    let original = Store::open(&dir.path().join("o.db"))
        .unwrap()
        .query_messages(&MessageFilter::default(), page)
        .unwrap();
    let rebuilt = Store::open(&restored)
        .unwrap()
        .query_messages(&MessageFilter::default(), page)
        .unwrap();
    // Every message of the run: 13 threads of three.
    assert_eq!(original.total, 39);
    assert!(
        stdout.contains(&format!("({} messages)", original.total)),
        "{stdout}"
    );
    assert_eq!(rebuilt.total, original.total);
    let key = |m: &agentserver::threads::MessageRecord| {
        (m.id.to_string(), m.status, m.payload_xml.to_string())
    };
    assert_eq!(
        rebuilt.items.iter().map(key).collect::<Vec<_>>(),
        original.items.iter().map(key).collect::<Vec<_>>()
    );

    // A second restore to the same file is refused: it never overwrites.
    let again = restore(&nats, &restored);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
}

/// `agentserver keys create` on the organism's store file: the new key.
fn create_key(path: &Path, name: &str, tenant: Option<&str>) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "keys".as_ref(),
        "create".as_ref(),
        path.as_os_str(),
        "--name".as_ref(),
        name.as_ref(),
        "--role".as_ref(),
        "viewer".as_ref(),
    ];
    if let Some(t) = tenant {
        args.push("--tenant".as_ref());
        args.push(t.as_ref());
    }
    let out = child::run_to_exit(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_string()
}

/// The code of the close frame `ws` gets next (other frames skipped).
async fn close_code(ws: &mut Ws) -> u16 {
    use futures_util::StreamExt;
    tokio::time::timeout(WAIT, async {
        loop {
            match ws.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(c)))) => {
                    return u16::from(c.code)
                }
                Some(Ok(_)) => continue,
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("closed in time")
}

async fn ws_with_key(url: &str, key: Option<&str>) -> Result<Ws, u16> {
    ws_from(url, key, None).await
}

/// A WebSocket to `url` with `key` as its bearer token and `origin` as a page's `Origin`;
/// the HTTP status if the upgrade is refused.
async fn ws_from(url: &str, key: Option<&str>, origin: Option<&str>) -> Result<Ws, u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    if let Some(k) = key {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {k}").parse().unwrap());
    }
    if let Some(o) = origin {
        request.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("an answer in time")
    {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// With `--auth-from`, a gateway refuses a bad credential (401) or a bad first frame (4401),
/// takes one in the first frame from a browser, shows a tenant's key only its tenant's
/// messages and an organism-wide key all, holds a tenant to its `max_streams`, and closes a
/// session whose key is revoked (4401).
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_with_the_organisms_auth_checks_credentials_and_tenants() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism:
  name: guarded
  store: o.db
  allowed_origins: [\"http://dash.example:3000\"]
  nats: {{url: {}, stream_prefix: {}}}
auth: {{methods: [keys], failed_auth_per_minute: 3}}
tenants:
  acme: {{max_streams: 2}}
listeners:
{CHAIN}
  - {{name: t1, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}}
",
            nats.url(),
            nats.prefix()
        ),
    )
    .unwrap();
    let acme = create_key(&path, "acme-viewer", Some("acme"));
    let everyone = create_key(&path, "viewer", None);
    let o = Organism::builder().load(&path).unwrap();
    let mirror = Mirroring::start(&o);
    let warm = inject(&o, "a", "<Note>warm</Note>", None);
    settle(&o, &warm.thread_id).await;
    let (_gateway, url) = gateway_with(&nats, &["--auth-from".as_ref(), path.as_os_str()]);
    let url = format!("{url}/ws/messages");

    assert_eq!(
        ws_with_key(&url, Some("ask_nonsense")).await.err(),
        Some(401)
    );
    // Pages of the file's allowed origins may connect; others may not.
    let listed = ws_from(&url, Some(&everyone), Some("http://dash.example:3000")).await;
    assert!(listed.is_ok());
    let foreign = ws_from(&url, Some(&everyone), Some("http://evil.example")).await;
    assert_eq!(foreign.err(), Some(403));
    let mut tenant = ws_with_key(&url, Some(&acme)).await.unwrap();
    let mut all = ws_with_key(&url, Some(&everyone)).await.unwrap();
    // A browser cannot set the header: the credential comes as the first frame.
    let mut browser = ws_connect(&url).await;
    send_json(
        &mut browser,
        serde_json::json!({"cmd": "auth", "token": everyone}),
    )
    .await;
    let mut impostor = ws_connect(&url).await;
    send_json(
        &mut impostor,
        serde_json::json!({"cmd": "auth", "token": "ask_not_a_key"}),
    )
    .await;
    assert_eq!(close_code(&mut impostor).await, 4401);

    let chain = inject(&o, "a", "<Note>organism's</Note>", None);
    settle(&o, &chain.thread_id).await;
    let mine = inject(&o, "t1", "<Note>acme's</Note>", None);
    settle(&o, &mine.thread_id).await;
    let done = |thread: String| {
        move |f: &Value| f["event"] == "message" && f["thread_id"] == thread.as_str()
    };
    let seen_all = read_until(&mut all, done(mine.thread_id.to_string())).await;
    let seen_browser = read_until(&mut browser, done(mine.thread_id.to_string())).await;
    assert!(seen_browser
        .iter()
        .any(|f| f["thread_id"] == *chain.thread_id));
    assert!(seen_all.iter().any(|f| f["thread_id"] == *chain.thread_id));
    let seen_tenant = read_until(&mut tenant, done(mine.thread_id.to_string())).await;
    assert!(
        seen_tenant
            .iter()
            .all(|f| f["thread_id"] == *mine.thread_id),
        "{seen_tenant:?}"
    );

    // A tenant's snapshot holds only its tenant's agents.
    let mut tenant_ws = ws_with_key(&url.replace("/ws/messages", "/ws"), Some(&acme))
        .await
        .unwrap();
    let hello = next_json(&mut tenant_ws).await;
    assert_eq!(hello["event"], "connected", "{hello}");
    assert_eq!(agent_names(&hello), ["t1"]);
    // Its two sessions are its `tenants.acme.max_streams` here: a third is closed 4429.
    let mut third = ws_with_key(&url, Some(&acme)).await.unwrap();
    assert_eq!(close_code(&mut third).await, 4429);
    // Its events are the pump's rule for a tenant: its own agents' states, no one else's.
    let ours = inject(&o, "t1", "<Note>acme's again</Note>", None);
    settle(&o, &ours.thread_id).await;
    let on_ws = |thread: String| {
        move |f: &Value| f["event"] == "message" && f["message"]["thread_id"] == thread.as_str()
    };
    let seen = read_until(&mut tenant_ws, on_ws(ours.thread_id.to_string())).await;
    let states: Vec<&Value> = seen
        .iter()
        .filter(|f| f["event"] == "agent_state")
        .map(|f| &f["agent"])
        .collect();
    assert!(states.iter().all(|a| **a == "t1"), "{seen:?}");
    drop(tenant_ws);

    // `subscribe` narrows a gateway session as it does the pump's; other commands are refused.
    let mut narrowed = ws_with_key(&url.replace("/ws/messages", "/ws"), Some(&everyone))
        .await
        .unwrap();
    assert_eq!(next_json(&mut narrowed).await["event"], "connected");
    send_json(
        &mut narrowed,
        serde_json::json!({"cmd": "subscribe", "request_id": "s", "agents": ["t1"], "events": ["message"]}),
    )
    .await;
    let ack = read_until(&mut narrowed, |f| f["request_id"] == "s").await;
    let ack = ack.last().unwrap();
    assert_eq!(
        (&ack["event"], &ack["filter"]["agents"]),
        (&"ack".into(), &serde_json::json!(["t1"])),
        "{ack}"
    );
    let theirs = inject(&o, "a", "<Note>not t1's</Note>", None);
    settle(&o, &theirs.thread_id).await;
    let ours = inject(&o, "t1", "<Note>t1's</Note>", None);
    settle(&o, &ours.thread_id).await;
    let seen = read_until(&mut narrowed, on_ws(ours.thread_id.to_string())).await;
    assert!(
        seen.iter()
            .all(|f| f["event"] == "message" && f["message"]["thread_id"] == *ours.thread_id),
        "{seen:?}"
    );
    drop(narrowed);

    // Its scope follows the organism: an agent created through the API, then a listener a
    // reload adds, are seen by the session opened before either (once the pump's next
    // snapshot, within a second, says so).
    let t1_snapshot = |url: String, key: String| async move {
        let mut ws = ws_with_key(&url.replace("/ws/messages", "/ws"), Some(&key))
            .await
            .unwrap();
        let hello = next_json(&mut ws).await;
        agent_names(&hello)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    o.uploads().create_agent(
        agentserver::pump::agents::NewAgent {
            name: "t-api".into(),
            tenant: Some("acme".into()),
            definition: serde_json::json!({"description": "acme's, by API", "accepts": ["Note"]}),
            version: agentserver::pump::agents::NewVersion {
                script: "function handle(p, meta) return nil end\n".into(),
                xsd: Some(TEST_XSD.into()),
                ..Default::default()
            },
        },
        None,
    )
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "tenant: acme}",
        "tenant: acme}\n  - {name: t2, description: acme's too, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}",
    );
    std::fs::write(&path, text).unwrap();
    o.reload(None).unwrap();
    wait_until_async("the gateway's snapshot to show t-api and t2", || {
        let (url, key) = (url.clone(), acme.clone());
        async move {
            let names = t1_snapshot(url, key).await;
            names.contains(&"t-api".to_string()) && names.contains(&"t2".to_string())
        }
    })
    .await;
    for to in ["t-api", "t2"] {
        let r = inject(&o, to, "<Note>acme's new</Note>", None);
        settle(&o, &r.thread_id).await;
        let seen = read_until(&mut tenant, done(r.thread_id.to_string())).await;
        let acme = ["t1", "t2", "t-api"];
        assert!(
            seen.iter()
                .all(|f| acme.contains(&f["to"].as_str().unwrap_or(""))),
            "{to}: {seen:?}"
        );
    }

    let out = child::run_to_exit([
        "keys".as_ref(),
        "revoke".as_ref(),
        path.as_os_str(),
        "acme-viewer".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(close_code(&mut tenant).await, 4401);
    assert_eq!(ws_with_key(&url, Some(&acme)).await.err(), Some(401));
    // That was the address's third failure this minute: the next is answered as the pump
    // answers it, 429 `rate_limited` with `Retry-After`.
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Error};
    let mut request = url.as_str().into_client_request().unwrap();
    let bearer = "Bearer ask_nonsense".parse().unwrap();
    request.headers_mut().insert("authorization", bearer);
    let Err(Error::Http(r)) = tokio_tungstenite::connect_async(request).await else {
        panic!("a refusal")
    };
    let body: Value = serde_json::from_slice(r.body().as_deref().unwrap()).unwrap();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap());
    assert_rate_limited(r.status().as_u16(), retry, &body);
    mirror.stop().await;
}

/// A gateway started before the organism has mirrored anything (an empty stream) serves
/// what comes later.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_started_on_an_empty_stream_serves_what_comes() {
    let nats = Nats::start();
    let (_gateway, gw) = gateway(&nats);
    let mut client = ws_connect(&format!("{gw}/ws/messages")).await;
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats);
    let o = Organism::builder().load(&path).unwrap();
    let mirror = Mirroring::start(&o);
    let r = inject(&o, "a", "<Note>first of all</Note>", None);
    let frames = frames_until_done(&mut client, &[r.thread_id.to_string()]).await;
    assert_eq!(frames[0]["event"], "message");
    assert_eq!(frames[0]["payload_xml"], "<Note>first of all</Note>");
    // Protocol errors close with their status codes here too (commands are at most 64 KiB).
    for path in ["/ws", "/ws/messages"] {
        let codes = protocol_error_closes(&format!("{gw}{path}"), None, 80 * 1024).await;
        assert_eq!(codes, [Some(1009), Some(1007), Some(1002)], "{path}");
    }
    mirror.stop().await;
}

/// An event too large for NATS with its frames goes without them (a gateway skips it;
/// restore still has it), and the mirror carries on with the next.
#[tokio::test(flavor = "multi_thread")]
async fn an_event_over_nats_max_payload_does_not_stop_the_mirror() {
    let mut m = Mirrored::start().await;
    let large = inject(
        &m.o,
        "a",
        &format!("<Note>{}</Note>", "z".repeat(700_000)),
        None,
    );
    settle(&m.o, &large.thread_id).await;
    let small = inject(&m.o, "a", "<Note>after the large one</Note>", None);
    settle(&m.o, &small.thread_id).await;
    let frames = frames_until_done(&mut m.client, &[small.thread_id.to_string()]).await;
    // The large message events went without frames (their small status events go with
    // theirs, unless the message's frame had shown the status already).
    let large_thread = |f: &&Value| f["thread_id"] == *large.thread_id;
    assert!(
        frames
            .iter()
            .filter(large_thread)
            .all(|f| f["event"] != "message"),
        "{frames:?}"
    );
    m.o.stop().await;
    m.mirror.stop().await;
    drop(m.o);
    let restored = m.dir.path().join("restored.db");
    let out = restore(&m.nats, &restored);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = Page {
        limit: 100,
        offset: 0,
    };
    let rebuilt = Store::open(&restored)
        .unwrap()
        .query_messages(&MessageFilter::default(), page)
        .unwrap();
    assert!(
        rebuilt
            .items
            .iter()
            .any(|m| *m.thread_id == *large.thread_id),
        "restore has the large thread"
    );
}

/// A mistyped organism is refused by `restore` and `gateway`, naming the streams there;
/// `restore` of a server with no organism's stream says so; nothing is written or made.
#[tokio::test(flavor = "multi_thread")]
async fn restore_and_gateway_refuse_an_organism_with_no_stream() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("restored.db");
    let typo = |cmd: &str| {
        let mut args: Vec<String> = vec![cmd.into(), "--nats".into(), nats.url()];
        args.extend(["--stream-prefix".into(), format!("{}x", nats.prefix())]);
        if cmd == "restore" {
            args.extend([
                "--from-nats".into(),
                "--store".into(),
                store.display().to_string(),
            ]);
        } else {
            args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        child::run_to_exit(args)
    };
    let out = typo("restore");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("holds no organism's events stream yet"),
        "{said}"
    );
    assert!(!store.exists());

    let path = organism_file(dir.path(), &nats);
    let o = Organism::builder().load(&path).unwrap();
    let mirror = Mirroring::start(&o);
    let r = inject(&o, "a", "<Note>mirrored</Note>", None);
    settle(&o, &r.thread_id).await;
    let config = o.config().nats.clone().unwrap();
    wait_until_async("the organism's stream on NATS", || async {
        agentserver::nats::events_streams(&config)
            .await
            .is_ok_and(|(present, _)| present)
    })
    .await;
    mirror.stop().await;
    for cmd in ["restore", "gateway"] {
        let out = typo(cmd);
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert_ne!(out.status.code(), Some(0), "{cmd}: {said}");
        assert!(
            said.contains(&format!("has no stream {}x_events", nats.prefix()))
                && said.contains(&format!("{}_events", nats.prefix())),
            "{cmd}: {said}"
        );
    }
    assert!(!store.exists());
}

/// A gateway reads the inbox: its `connected` lists the open inputs (a summary, from the
/// mirrored snapshot), the `input_requested`/`input_resolved` events come through, and a
/// decision is refused `read_only`.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_shows_the_inbox_and_decides_nothing() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats);
    let yaml = std::fs::read_to_string(&path).unwrap();
    let gated = yaml.replacen(
        "handler: sink, schema: t.xsd, accepts: [Note]}",
        "handler: sink, schema: t.xsd, accepts: [Note], approval: {prompt: 'keep {x}?'}}",
        1,
    );
    assert_ne!(gated, yaml, "c is gated");
    std::fs::write(&path, gated).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let mirror = Mirroring::start(&o);
    let held = inject(&o, "a", "<Note>hold me</Note>", None);
    let (_gateway, gw) = gateway(&nats);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
    wait_until_async("a gateway snapshot with the open input", || {
        let (gw, seen) = (gw.clone(), seen.clone());
        async move {
            let mut ws = ws_connect(&format!("{gw}/ws")).await;
            let frame = next_json(&mut ws).await;
            let ok = frame["inputs_total"] == 1;
            *seen.lock().unwrap() = frame;
            ok
        }
    })
    .await;
    let connected = seen.lock().unwrap().clone();
    let input = &connected["inputs"][0];
    assert_eq!(input["listener"], "c");
    assert_eq!(input["thread_id"], &*held.thread_id);
    assert_eq!(input["status"], "open");
    assert!(input.get("payload_xml").is_none(), "a summary: {input}");

    let mut ws = ws_connect(&format!("{gw}/ws")).await;
    let _ = next_json(&mut ws).await;
    send_json(
        &mut ws,
        serde_json::json!({"cmd": "approve", "request_id": 1, "input_id": input["id"]}),
    )
    .await;
    let refused = read_until(&mut ws, |f| f["request_id"] == 1).await;
    assert_eq!(refused.last().unwrap()["code"], "read_only");
    let id = input["id"].as_str().unwrap().to_string();
    let who = agentserver::pump::Decider {
        name: None,
        role: agentserver::config::Role::Admin,
        tenant: None,
    };
    o.inputs()
        .decide(
            &id,
            &who,
            agentserver::pump::Verdict::Approve {
                reason: None,
                payload_xml: None,
            },
        )
        .unwrap();
    let resolved = read_until(&mut ws, |f| f["event"] == "input_resolved").await;
    assert_eq!(resolved.last().unwrap()["id"], id.as_str());
    mirror.stop().await;
}

/// A model's streamed pieces are not mirrored (without `mirror_deltas`): a gateway's client
/// sees every other event, is told of no gap, and resumes across the pieces' `seq`s.
#[tokio::test(flavor = "multi_thread")]
async fn deltas_are_not_mirrored_and_a_gateway_sees_no_gap_where_they_were() {
    through_a_gateway(false).await;
}

/// With `mirror_deltas: true` a gateway's clients see the pieces too.
#[tokio::test(flavor = "multi_thread")]
async fn with_mirror_deltas_a_gateway_shows_the_pieces() {
    through_a_gateway(true).await;
}

async fn through_a_gateway(mirror_deltas: bool) {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism:
  name: streams
  store: o.db
  nats: {{url: {}, stream_prefix: {}, mirror_deltas: {mirror_deltas}}}
models:
  s: {{provider: scripted, responses: [{{text: one two three four five six}}]}}
listeners:
  - {{name: think, description: answers, kind: llm, model: s, system: s, schema: t.xsd, accepts: [Note], stream: true, reply: {{type: Answer, text_field: text}}}}
{CHAIN}
",
            nats.url(),
            nats.prefix()
        ),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let mirror = Mirroring::start(&o);
    let (_gateway, gw) = gateway(&nats);
    // Connected before any event: its `connected` comes with the first snapshot.
    let mut client = ws_connect(&format!("{gw}/ws")).await;
    let mut events = o.events().subscribe();
    let before = o.events().last_seq();

    let r = inject(&o, "think", "<Note>think</Note>", None);
    settle(&o, &r.thread_id).await;
    let after = inject(&o, "a", "<Note>after the pieces</Note>", None);
    settle(&o, &after.thread_id).await;
    let mut deltas = 0;
    while let Ok(ev) = events.try_recv() {
        deltas += usize::from(matches!(ev.kind, agentserver::events::EventKind::Delta(_)));
    }
    assert!(deltas >= 6, "the pump published the pieces: {deltas}");

    let frames = frames_until_done(&mut client, &[after.thread_id.to_string()]).await;
    let pieces = frames.iter().filter(|f| f["event"] == "delta").count();
    assert_eq!(pieces, if mirror_deltas { deltas } else { 0 }, "{frames:?}");
    for f in &frames {
        assert!(
            !["dropped", "resync_required", "omitted"].contains(&f["event"].as_str().unwrap_or("")),
            "{f}"
        );
    }
    assert!(frames
        .iter()
        .any(|f| f["event"] == "message" && f["message"]["from"] == "think"));

    // A bad query parameter is a 400 naming it, as at the pump.
    match tokio_tungstenite::connect_async(format!("{gw}/ws?since=abc")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status().as_u16(), 400);
            let body = String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).to_string();
            assert!(
                body.contains("invalid_query") && body.contains(r#""where":"since""#),
                "{body}"
            );
        }
        other => panic!("{other:?}"),
    }

    // Resumed from before the pieces: what follows comes whole, with no gap told.
    let mut resumed = ws_connect(&format!("{gw}/ws?since={before}")).await;
    let frames = frames_until_done(&mut resumed, &[after.thread_id.to_string()]).await;
    for f in &frames {
        assert!(
            !["dropped", "resync_required"].contains(&f["event"].as_str().unwrap_or("")),
            "{f}"
        );
    }
    assert!(frames
        .iter()
        .any(|f| f["event"] == "message" && f["message"]["from"] == "think"));
    o.stop().await;
    mirror.stop().await;
}

/// A gateway knows the threads' labels from the mirrored events: a `/ws/messages` session
/// subscribed by label gets the messages of the threads it names and no others.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_session_subscribed_by_label_sees_only_those_threads() {
    let mut m = Mirrored::start().await;
    // The session answers commands once it serves the stream: after its first message.
    let warm = inject(&m.o, "a", "<Note>before</Note>", None)
        .thread_id
        .to_string();
    frames_until_done(&mut m.client, &[warm]).await;
    let sub = serde_json::json!({"cmd": "subscribe", "request_id": "s", "label": ["customer:a1"]});
    send_json(&mut m.client, sub).await;
    let ack = read_until(&mut m.client, |f| f["request_id"] == "s")
        .await
        .pop()
        .unwrap();
    assert_eq!(ack["event"], "ack", "{ack}");
    let labelled = |customer: Option<&str>, text: &str| {
        let labels: std::collections::BTreeMap<String, String> = customer
            .map(|c| [("customer".to_string(), c.to_string())].into())
            .unwrap_or_default();
        let req = agentserver::InjectRequest {
            from: "api".into(),
            to: "a".into(),
            payload_xml: format!("<Note>{text}</Note>"),
            thread_id: None,
        };
        m.o.inject_labelled(req, None, customer.map(|_| &labels))
            .unwrap()
            .thread_id
            .to_string()
    };
    let first = labelled(Some("a1"), "named");
    let other = labelled(Some("a2"), "another customer's");
    let none = labelled(None, "no labels");
    let last = labelled(Some("a1"), "named again");
    let frames = frames_until_done(&mut m.client, &[first.clone(), last.clone()]).await;
    let threads: std::collections::BTreeSet<&str> = frames
        .iter()
        .filter_map(|f| f["thread_id"].as_str())
        .collect();
    assert_eq!(
        threads,
        [first.as_str(), last.as_str()].into(),
        "not {other} nor {none}"
    );
    m.mirror.stop().await;
}
