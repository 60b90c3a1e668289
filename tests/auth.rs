//! Access control against a real server on 127.0.0.1:0: API keys, roles on every route of
//! the served OpenAPI document and on every WebSocket command, the WebSocket's header and
//! first-frame credentials, revocation, the keys API and CLI, and the refusals.

mod common;

use std::path::{Path, PathBuf};

use agentserver::access::{KeySource, Role};
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::threads::ThreadStatus;
use agentserver::Organism;
use common::child::run_to_exit;
use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const LISTENERS: &str = "listeners:
  - {name: a, description: first, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b}}
  - {name: b, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}
";

/// An organism with `auth: {methods: [keys]}` and its store in `dir`.
fn write_organism(dir: &Path, auth: &str, store: &str) -> PathBuf {
    write_organism_with(dir, auth, store, LISTENERS)
}

fn write_organism_with(dir: &Path, auth: &str, store: &str, listeners: &str) -> PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let yaml = format!("organism:\n  name: guarded\n  store: {store}\nauth: {auth}\n{listeners}");
    let path = dir.join("organism.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

struct Guarded {
    organism: Organism,
    server: ApiServer,
    base: String,
    http: reqwest::Client,
    /// Role → its key.
    keys: Vec<(Role, String)>,
    path: PathBuf,
    dir: tempfile::TempDir,
}

/// Adds a key the way `agentserver keys create` does; the key to present.
fn add_key(config: &agentserver::config::OrganismConfig, name: &str, role: Role) -> String {
    add_tenant_key(config, name, role, None)
}

fn add_tenant_key(
    config: &agentserver::config::OrganismConfig,
    name: &str,
    role: Role,
    tenant: Option<&str>,
) -> String {
    let (key, row) = agentserver::access::new_key(name, role, tenant, None).unwrap();
    KeySource::of(config).unwrap().add(&row).unwrap();
    key
}

async fn guarded() -> Guarded {
    guarded_with(LISTENERS).await
}

async fn guarded_with(listeners: &str) -> Guarded {
    guarded_built(listeners, Organism::builder()).await
}

async fn guarded_built(listeners: &str, builder: agentserver::OrganismBuilder) -> Guarded {
    let dir = tempfile::tempdir().unwrap();
    // The matrix alone sends dozens of wrong credentials from one address.
    let path = write_organism_with(
        dir.path(),
        "{methods: [keys], failed_auth_per_minute: 100000}",
        "keys.db",
        listeners,
    );
    let config = Organism::builder().load_config(&path).unwrap();
    let keys = [Role::Viewer, Role::Operator, Role::Admin]
        .into_iter()
        .map(|r| (r, add_key(&config, r.as_str(), r)))
        .collect();
    let organism = builder.build(config).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    Guarded {
        organism,
        server,
        base,
        http: http(),
        keys,
        path,
        dir,
    }
}

impl Guarded {
    /// A Note injected to `a1` in `thread` with `key`, accepted.
    async fn note_to_a1(&self, key: &str, thread: &str) {
        let body = json!({"to": "a1", "payload_xml": "<Note>x</Note>", "thread_id": thread});
        let (s, _, r) = self
            .send(
                reqwest::Method::POST,
                "/api/v1/inject",
                Some(key),
                Some(body),
            )
            .await;
        assert_eq!(s, 202, "{r}");
    }

    fn key(&self, role: Role) -> &str {
        &self.keys.iter().find(|(r, _)| *r == role).unwrap().1
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        // An event stream does not end: its answer is its status and headers.
        let streaming = headers
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if streaming {
            return (status, headers, Value::Null);
        }
        let text = r.text().await.unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let (s, _, v) = self.send(reqwest::Method::GET, path, key, None).await;
        (s, v)
    }

    async fn inject(&self, key: &str) -> (u16, Value) {
        let (s, _, v) = self
            .send(
                reqwest::Method::POST,
                "/api/v1/inject",
                Some(key),
                Some(json!({"to": "a", "payload_xml": "<Note>hi</Note>"})),
            )
            .await;
        (s, v)
    }

    fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.replacen("http://", "ws://", 1))
    }
}

/// A route's template as the table holds it (a `&'static str`).
fn path_static(path: &str) -> &'static str {
    agentserver::api::auth::TABLE
        .iter()
        .find_map(|r| match &r.via {
            agentserver::api::auth::Via::Route(_, p) if *p == path => Some(*p),
            _ => None,
        })
        .unwrap_or("(absent)")
}

/// What each route needs, written here independently of the server's table: the matrix
/// below fails if the served document has a route this table lacks.
fn expected_need(method: &str, path: &str) -> Option<Role> {
    let open = [
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/api/v1/openapi.json"),
        (
            "post",
            "/api/v1/external/{agent}/threads/{thread_id}/messages",
        ),
    ];
    if open.contains(&(method, path)) {
        return None;
    }
    let operator = [
        "/api/v1/inject",
        "/api/v1/threads/{id}/kill",
        "/api/v1/threads/{id}/abort",
        "/api/v1/threads/{id}/fork",
        "/api/v1/threads/{id}/rewind",
        "/api/v1/threads/{id}/pause",
        "/api/v1/threads/{id}/resume",
        "/api/v1/messages/{id}/retry",
        "/api/v1/messages/retry",
        "/api/v1/threads/batch",
        "/api/v1/inputs/{id}/approve",
        "/api/v1/inputs/{id}/reject",
        "/api/v1/inputs/{id}/answer",
        "/api/v1/agents/{name}/pause",
        "/api/v1/agents/{name}/resume",
        "/api/v1/agents/{name}/reload",
        "/api/v1/agents",
        "/api/v1/agents/{name}/scripts",
        "/api/v1/agents/{name}/deployments",
        "/api/v1/agents/{name}/scripts/{version}/test",
    ];
    Some(match (method, path) {
        ("get", "/api/v1/keys" | "/api/v1/audit") => Role::Admin,
        ("get", _) => Role::Viewer,
        ("post", "/api/v1/stream-tokens") => Role::Viewer,
        ("post", p) if operator.contains(&p) => Role::Operator,
        ("delete", "/api/v1/agents/{name}") => Role::Operator,
        ("patch", "/api/v1/threads/{id}") => Role::Operator,
        ("post" | "delete", _) => Role::Admin,
        other => panic!("no expectation for {other:?}: add it to this table"),
    })
}

#[tokio::test]
async fn every_documented_route_answers_each_role_as_the_table_says() {
    let g = guarded().await;
    let (_, doc) = g.get("/api/v1/openapi.json", None).await;
    let thread = {
        let (s, r) = g.inject(g.key(Role::Operator)).await;
        assert_eq!(s, 202, "{r}");
        r["thread_id"].as_str().unwrap().to_string()
    };
    let mut routes: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            routes.push((method.clone(), path.clone()));
        }
    }
    // The stop last: it ends the organism (later answers are 503, never 401 or 403).
    routes.sort_by_key(|(m, p)| (p == "/api/v1/organism/stop", m.clone(), p.clone()));
    assert!(routes.len() >= 29, "{routes:?}");
    let config = Organism::builder().load_config(&g.path).unwrap();
    let tenant_admin = add_tenant_key(&config, "acme-admin", Role::Admin, Some("acme"));
    let tenant_operator = add_tenant_key(&config, "acme-operator", Role::Operator, Some("acme"));
    let tenant_viewer = add_tenant_key(&config, "acme-viewer", Role::Viewer, Some("acme"));
    let creds: [(&str, Option<&str>, Option<Role>); 8] = [
        (
            "tenant viewer",
            Some(tenant_viewer.as_str()),
            Some(Role::Viewer),
        ),
        (
            "tenant operator",
            Some(tenant_operator.as_str()),
            Some(Role::Operator),
        ),
        ("none", None, None),
        (
            "wrong",
            Some(
                "ask_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
            ),
            None,
        ),
        ("viewer", Some(g.key(Role::Viewer)), Some(Role::Viewer)),
        (
            "operator",
            Some(g.key(Role::Operator)),
            Some(Role::Operator),
        ),
        ("admin", Some(g.key(Role::Admin)), Some(Role::Admin)),
        // An admin of a tenant: never the organism-wide routes.
        (
            "tenant admin",
            Some(tenant_admin.as_str()),
            Some(Role::Admin),
        ),
    ];
    for (method, path) in &routes {
        // Every documented route has its row in the server's one table.
        let m = axum::http::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        assert!(
            agentserver::api::auth::TABLE
                .iter()
                .any(|r| r.via == agentserver::api::auth::Via::Route(m.clone(), path_static(path))),
            "{method} {path} is not in the table"
        );
        let need = expected_need(method, path);
        let url = path
            .replace("{name}", "a")
            .replace("{agent}", "a")
            .replace("{id}", &thread)
            .replace("{thread_id}", &thread);
        let url = if url == "/api/v1/keys/a" {
            "/api/v1/keys/no-such-key".to_string()
        } else {
            url
        };
        let stream = path.starts_with("/ws");
        for (label, key, role) in &creds {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let body =
                (m == reqwest::Method::POST || m == reqwest::Method::PATCH).then(|| json!({}));
            let (status, headers, answer) = g.send(m, &url, *key, body).await;
            let wide = [
                ("get", "/api/v1/organism/config"),
                ("get", "/metrics"),
                ("get", "/api/v1/keys"),
                ("get", "/api/v1/audit"),
                ("post", "/api/v1/keys"),
                ("delete", "/api/v1/keys/{name}"),
                ("post", "/api/v1/organism/pause"),
                ("post", "/api/v1/organism/resume"),
                ("post", "/api/v1/organism/reload"),
                ("post", "/api/v1/organism/stop"),
            ]
            .contains(&(method.as_str(), path.as_str()));
            // A batch over every tenant's messages is an admin's; a tenant's, its operator's.
            let batch = method == "post"
                && ["/api/v1/messages/retry", "/api/v1/threads/batch"].contains(&path.as_str());
            let need = if batch && !label.starts_with("tenant") {
                Some(Role::Admin)
            } else {
                need
            };
            let expected = match (need, role) {
                (None, _) => "allowed",
                (Some(_), Some(_)) if label.starts_with("tenant") && wide => "403",
                // A stream takes its credential in the first frame when the upgrade has none.
                (Some(_), None) if stream && key.is_none() => "allowed",
                (Some(_), None) => "401",
                (Some(n), Some(r)) if r >= &n => "allowed",
                (Some(_), Some(_)) => "403",
            };
            let got = match status {
                401 => "401",
                403 => "403",
                _ => "allowed",
            };
            assert_eq!(
                got, expected,
                "{method} {path} as {label}: {status} {answer}"
            );
            if status == 401 {
                let challenge = headers
                    .get("www-authenticate")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                assert!(
                    challenge.starts_with("Bearer"),
                    "{method} {path}: {challenge}"
                );
                assert_eq!(answer["error"]["code"], "unauthorized");
            }
        }
    }
}

#[tokio::test]
async fn a_refused_credential_gets_one_answer_whatever_was_wrong_with_it() {
    let g = guarded().await;
    // A key that expired, and one revoked, in the same table.
    let config = Organism::builder().load_config(&g.path).unwrap();
    let source = KeySource::of(&config).unwrap();
    let (expired, mut row) = agentserver::access::new_key("old", Role::Admin, None, None).unwrap();
    row.expires = Some(agentserver::time::Timestamp(1));
    source.add(&row).unwrap();
    let revoked = add_key(&config, "gone", Role::Admin);
    source
        .revoke("gone", agentserver::time::Timestamp::now())
        .unwrap()
        .unwrap();
    let admin = g.key(Role::Admin).to_string();
    let wrong_secret = format!(
        "{}{}",
        &admin[..admin.len() - 1],
        if admin.ends_with('0') { '1' } else { '0' }
    );
    let long = format!("ask_{}", "a".repeat(10_000));
    let bad = [
        expired.as_str(),
        revoked.as_str(),
        wrong_secret.as_str(),
        "ask_0000_0000",
        "xsk_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
        long.as_str(),
        "",
    ];
    let mut answers = Vec::new();
    for key in bad {
        let (s, _, v) = g
            .send(reqwest::Method::GET, "/api/v1/agents", Some(key), None)
            .await;
        assert_eq!(s, 401, "{key:.40}: {v}");
        answers.push(v);
    }
    // Malformed headers too.
    for (name, value) in [
        ("authorization", "Basic YTpi"),
        ("authorization", "Bearer"),
        ("authorization", "ask_nospace"),
        ("x-api-key", "nonsense"),
    ] {
        let r = g
            .http
            .get(format!("{}/api/v1/agents", g.base))
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{name}: {value}");
        answers.push(r.json::<Value>().await.unwrap());
    }
    for a in &answers {
        assert_eq!(a, &answers[0], "every refusal looks the same");
    }
    assert_eq!(answers[0]["error"]["message"], "the credential was refused");
    // X-API-Key works as Authorization does.
    let r = g
        .http
        .get(format!("{}/api/v1/agents", g.base))
        .header("x-api-key", g.key(Role::Viewer))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn an_inject_carries_the_keys_name_as_its_sender() {
    let g = guarded().await;
    let (s, r) = g.inject(g.key(Role::Operator)).await;
    assert_eq!(s, 202, "{r}");
    let thread = r["thread_id"].as_str().unwrap();
    settle(&g.organism, thread).await;
    let (_, t) = g
        .get(
            &format!("/api/v1/threads/{thread}"),
            Some(g.key(Role::Viewer)),
        )
        .await;
    assert_eq!(t["messages"][0]["from"], "key:operator", "{t}");
    assert!(
        t["participants"]
            .as_array()
            .unwrap()
            .contains(&json!("key:operator")),
        "{t}"
    );
}

#[tokio::test]
async fn keys_are_made_listed_and_revoked_through_the_api_and_survive_a_restart() {
    let g = guarded().await;
    let admin = g.key(Role::Admin).to_string();
    let (s, _, made) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            Some(&admin),
            Some(json!({"name": "ci", "role": "operator", "expires": "30d"})),
        )
        .await;
    assert_eq!(s, 201, "{made}");
    let key = made["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("ask_"));
    assert_eq!(made["role"], "operator");
    assert!(made["expires"].is_string());
    // The same name again: 409.
    let (s, _, again) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            Some(&admin),
            Some(json!({"name": "ci", "role": "viewer"})),
        )
        .await;
    assert_eq!(
        (s, again["error"]["code"].as_str()),
        (409, Some("key_exists"))
    );
    // Bad fields: 400 naming them.
    for (body, at) in [
        (json!({"name": "a b", "role": "viewer"}), "name"),
        (
            json!({"name": "x", "role": "viewer", "expires": "soon"}),
            "expires",
        ),
        (
            json!({"name": "x", "role": "viewer", "tenant": "a/b"}),
            "tenant",
        ),
    ] {
        let (s, _, e) = g
            .send(
                reqwest::Method::POST,
                "/api/v1/keys",
                Some(&admin),
                Some(body),
            )
            .await;
        assert_eq!((s, e["error"]["where"].as_str()), (400, Some(at)), "{e}");
    }
    let (s, _, e) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            Some(&admin),
            Some(json!({"name": "x", "role": "root"})),
        )
        .await;
    assert_eq!(s, 400, "{e}");

    assert_eq!(g.inject(&key).await.0, 202);
    let (s, list) = g.get("/api/v1/keys", Some(&admin)).await;
    assert_eq!(s, 200);
    let text = list.to_string();
    assert!(!text.contains(&key[17..]), "no secret is listed");
    assert!(!text.contains("hash"), "{text}");
    assert_eq!(list.as_array().unwrap().len(), 4);

    // Keys survive a restart of the organism and its server.
    g.server.shutdown().await;
    g.organism.stop().await;
    drop(g.organism);
    let config = Organism::builder().load_config(&g.path).unwrap();
    let organism = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let g = Guarded {
        base: format!("http://{}", server.local_addr()),
        organism,
        server,
        ..g
    };
    assert_eq!(g.inject(&key).await.0, 202);
    let (s, _, gone) = g
        .send(
            reqwest::Method::DELETE,
            "/api/v1/keys/ci",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, 200, "{gone}");
    assert!(gone["revoked"].is_string());
    // Refused at once.
    assert_eq!(g.inject(&key).await.0, 401);
    let (s, _, e) = g
        .send(
            reqwest::Method::DELETE,
            "/api/v1/keys/ci",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("unknown_key")));
    let last_used = wait_until_async("the last use recorded", || async {
        let (_, list) = g.get("/api/v1/keys", Some(&admin)).await;
        list.as_array()
            .unwrap()
            .iter()
            .any(|k| k["name"] == "ci" && k["last_used"].is_string())
    });
    last_used.await;
    let _ = &g.dir;
}

async fn ws_with_header(url: &str, key: &str) -> Ws {
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws
}

/// The next frame, whatever it is (a close included), with a timeout.
async fn next_frame(ws: &mut Ws) -> Option<WsMessage> {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
        {
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => continue,
            Some(Ok(m)) => return Some(m),
            _ => return None,
        }
    }
}

fn close_code(m: Option<WsMessage>) -> Option<u16> {
    match m {
        Some(WsMessage::Close(Some(f))) => Some(f.code.into()),
        _ => None,
    }
}

#[tokio::test]
async fn websockets_take_the_credential_in_the_header_or_the_first_frame() {
    let g = guarded().await;
    // Header.
    let mut ws = ws_with_header(&g.ws_url("/ws"), g.key(Role::Viewer)).await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");
    // First frame, and nothing is sent before it.
    let mut ws = ws_connect(&g.ws_url("/ws/messages")).await;
    send_json(
        &mut ws,
        json!({"cmd": "auth", "token": g.key(Role::Viewer)}),
    )
    .await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");
    // A wrong credential in the first frame: closed 4401, nothing else sent.
    let mut ws = ws_connect(&g.ws_url("/ws")).await;
    send_json(&mut ws, json!({"cmd": "auth", "token": "ask_nope"})).await;
    assert_eq!(close_code(next_frame(&mut ws).await), Some(4401));
    // Another command first: the same.
    let mut ws = ws_connect(&g.ws_url("/ws")).await;
    send_json(&mut ws, json!({"cmd": "subscribe"})).await;
    assert_eq!(close_code(next_frame(&mut ws).await), Some(4401));
    // A wrong credential in the upgrade request: 401 before any upgrade.
    let mut request = g.ws_url("/ws").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer ask_nope".parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_session_that_sends_no_credential_is_closed_after_five_seconds() {
    let g = guarded().await;
    let mut ws = ws_connect(&g.ws_url("/ws")).await;
    assert_eq!(close_code(next_frame(&mut ws).await), Some(4401));
}

/// Sends a command and reads until its answer.
async fn ask(ws: &mut Ws, cmd: Value) -> Value {
    let id = cmd["request_id"].clone();
    send_json(ws, cmd).await;
    let frames = read_until(ws, |v| v["request_id"] == id).await;
    frames.last().unwrap().clone()
}

#[tokio::test]
async fn each_websocket_command_needs_its_role_and_a_refusal_leaves_the_session_open() {
    let g = guarded().await;
    let mut viewer = ws_with_header(&g.ws_url("/ws"), g.key(Role::Viewer)).await;
    next_json(&mut viewer).await;
    let mut operator = ws_with_header(&g.ws_url("/ws"), g.key(Role::Operator)).await;
    next_json(&mut operator).await;
    let inject =
        json!({"cmd": "inject", "request_id": 1, "to": "a", "payload_xml": "<Note>x</Note>"});
    let a = ask(&mut viewer, inject.clone()).await;
    assert_eq!(
        (
            a["event"].as_str(),
            a["status"].as_u64(),
            a["code"].as_str()
        ),
        (Some("error"), Some(403), Some("forbidden")),
        "{a}"
    );
    // Still open: a viewer may subscribe.
    let a = ask(
        &mut viewer,
        json!({"cmd": "subscribe", "request_id": 2, "agents": ["a"]}),
    )
    .await;
    assert_eq!(a["event"], "ack", "{a}");
    let a = ask(&mut operator, inject).await;
    assert_eq!(a["event"], "ack", "{a}");
    for (cmd, ok) in [
        (json!({"cmd": "pause", "request_id": 3, "agent": "b"}), true),
        (
            json!({"cmd": "resume", "request_id": 4, "agent": "b"}),
            true,
        ),
        (json!({"cmd": "pause", "request_id": 5}), false),
        (json!({"cmd": "reload", "request_id": 6}), false),
        (json!({"cmd": "stop", "request_id": 7}), false),
    ] {
        let a = ask(&mut operator, cmd.clone()).await;
        assert_eq!(a["event"] == "ack", ok, "{cmd}: {a}");
        if !ok {
            assert_eq!(a["status"], 403, "{a}");
        }
    }
}

/// Every `/ws` command, as every role with and without a tenant, with the fields a client
/// might add to look like something else (`agent`, `thread_id`): written here apart from the
/// server's table. An organism-wide command (whatever fields it carries) is refused 403 to
/// every tenant's credential and the organism keeps running; the rest need their role.
#[tokio::test]
async fn every_websocket_command_answers_each_role_and_tenant_as_the_table_says() {
    let g = guarded_with(TENANTS).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let thread = {
        let r = inject(&g.organism, "a1", "<Note>x</Note>", None);
        settle(&g.organism, &r.thread_id).await;
        r.thread_id
    };
    let mut creds: Vec<(String, Role, Option<&str>, String)> = Vec::new();
    for role in [Role::Viewer, Role::Operator, Role::Admin] {
        for tenant in [None, Some("acme")] {
            let label = format!("{role} of {}", tenant.unwrap_or("no tenant"));
            let key = add_tenant_key(&config, &label.replace(' ', "-"), role, tenant);
            creds.push((label, role, tenant, key));
        }
    }
    // (command, least role, organism-wide); the organism's own admin's `stop` comes last.
    let extras = [
        json!({}),
        json!({"agent": "a1"}),
        json!({"thread_id": thread}),
        json!({"agent": "a1", "thread_id": thread}),
    ];
    let commands: Vec<(Value, Role, bool)> = vec![
        (
            json!({"cmd": "subscribe", "agents": ["a1"]}),
            Role::Viewer,
            false,
        ),
        (
            json!({"cmd": "inject", "to": "a1", "payload_xml": "<Note>x</Note>"}),
            Role::Operator,
            false,
        ),
        (
            json!({"cmd": "kill", "thread_id": thread}),
            Role::Operator,
            false,
        ),
        (
            json!({"cmd": "pause", "agent": "a1"}),
            Role::Operator,
            false,
        ),
        (
            json!({"cmd": "resume", "agent": "a1"}),
            Role::Operator,
            false,
        ),
        (
            json!({"cmd": "reload", "agent": "a1"}),
            Role::Operator,
            false,
        ),
        (json!({"cmd": "pause"}), Role::Admin, true),
        (json!({"cmd": "resume"}), Role::Admin, true),
        (json!({"cmd": "reload"}), Role::Admin, true),
        (json!({"cmd": "stop"}), Role::Admin, true),
    ];
    let mut id = 0;
    for (label, role, tenant, key) in &creds {
        let mut ws = ws_with_header(&g.ws_url("/ws"), key).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        for (command, need, wide) in &commands {
            for extra in &extras {
                let mut cmd = command.clone();
                for (k, v) in extra.as_object().unwrap() {
                    // What the command is stays what it was: extra fields only add.
                    let shape_field = command.get(k).is_some()
                        || (*wide && k == "agent" && command["cmd"] != "stop");
                    if !shape_field {
                        cmd[k] = v.clone();
                    }
                }
                let organism_stop = command["cmd"] == "stop" && tenant.is_none();
                if organism_stop && *role == Role::Admin {
                    continue; // below, last
                }
                id += 1;
                cmd["request_id"] = json!(id);
                let a = ask(&mut ws, cmd.clone()).await;
                let expected_403 = role < need || (tenant.is_some() && *wide);
                assert_eq!(a["status"] == 403, expected_403, "{cmd} as {label}: {a}");
                if !expected_403 && a["event"] == "error" {
                    // Allowed by the table: refused, if at all, for what it named (a tenant
                    // naming `a1` of its own may do it; the stream field mixes are 400s).
                    assert_ne!(a["status"], 401, "{cmd} as {label}: {a}");
                }
                assert!(
                    g.organism.status() != agentserver::events::OrganismStatus::Stopped,
                    "{cmd} as {label} stopped the organism: {a}"
                );
            }
        }
        // Whatever it sent, the organism still answers.
        let r = inject(&g.organism, "o", "<Note>still here</Note>", None);
        assert_eq!(
            settle(&g.organism, &r.thread_id).await,
            ThreadStatus::Completed
        );
    }
    // The organism's own admin may stop it.
    let (label, _, _, key) = &creds[4];
    let mut ws = ws_with_header(&g.ws_url("/ws"), key).await;
    next_json(&mut ws).await;
    let a = ask(
        &mut ws,
        json!({"cmd": "stop", "request_id": "last", "agent": "a1"}),
    )
    .await;
    assert_eq!(a["event"], "ack", "{label}: {a}");
    tokio::time::timeout(WAIT, g.server.stop_requested())
        .await
        .expect("the organism's own admin stops it");
}

#[tokio::test]
async fn revoking_a_key_closes_its_open_sessions_at_once() {
    let g = guarded().await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let temp = add_key(&config, "temp", Role::Viewer);
    let mut ws = ws_with_header(&g.ws_url("/ws/messages"), &temp).await;
    next_json(&mut ws).await;
    let mut other = ws_with_header(&g.ws_url("/ws/messages"), g.key(Role::Viewer)).await;
    next_json(&mut other).await;
    let (s, _, _) = g
        .send(
            reqwest::Method::DELETE,
            "/api/v1/keys/temp",
            Some(g.key(Role::Admin)),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(close_code(next_frame(&mut ws).await), Some(4401));
    // Revoked by the CLI's way (another connection to the file): closed within a second or so.
    let temp2 = add_key(&config, "temp2", Role::Viewer);
    let mut ws = ws_with_header(&g.ws_url("/ws"), &temp2).await;
    next_json(&mut ws).await;
    KeySource::of(&config)
        .unwrap()
        .revoke("temp2", agentserver::time::Timestamp::now())
        .unwrap();
    let code = loop {
        match next_frame(&mut ws).await {
            Some(WsMessage::Text(_)) => continue,
            m => break close_code(m),
        }
    };
    assert_eq!(code, Some(4401));
    // The others' sessions stay.
    g.inject(g.key(Role::Operator)).await;
    assert_eq!(next_json(&mut other).await["event"], "message");
}

#[tokio::test]
async fn without_authentication_a_server_beyond_loopback_is_refused_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!("organism:\n  name: open\n  store: memory\n{LISTENERS}"),
    )
    .unwrap();
    let organism = Organism::builder().load(&path).unwrap();
    let e = ApiServer::bind(organism.clone(), "0.0.0.0:0", ApiOptions::default())
        .await
        .err()
        .expect("refused");
    let e = e.to_string();
    assert!(
        e.contains("no authentication") && e.contains("--insecure-no-auth") && e.contains("auth:"),
        "{e}"
    );
    let insecure = ApiOptions {
        insecure_no_auth: true,
        ..ApiOptions::default()
    };
    let open = ApiServer::bind(organism, "0.0.0.0:0", insecure)
        .await
        .unwrap();
    // Without authentication nothing is audited, and the log says why it is empty.
    let r = http_get(format!(
        "http://127.0.0.1:{}/api/v1/audit",
        open.local_addr().port()
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "audit_off"
    );
    // The binary says the same and exits 1.
    let out = run_to_exit([
        "run".as_ref(),
        path.as_os_str(),
        "--listen".as_ref(),
        "0.0.0.0:0".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--insecure-no-auth"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_keys_cli_works_on_the_file_of_a_running_server() {
    let g = guarded().await;
    let path = g.path.as_os_str();
    let out = run_to_exit([
        "keys".as_ref(),
        "create".as_ref(),
        path,
        "--name".as_ref(),
        "cli".as_ref(),
        "--role".as_ref(),
        "operator".as_ref(),
        "--expires".as_ref(),
        "1d".as_ref(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = stdout.lines().last().unwrap().trim().to_string();
    assert!(key.starts_with("ask_"), "{stdout}");
    assert_eq!(g.inject(&key).await.0, 202);
    let out = run_to_exit(["keys".as_ref(), "list".as_ref(), path]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains("cli id=") && list.contains("role=operator"),
        "{list}"
    );
    assert!(!list.contains(&key[17..]), "no secret is listed");
    let out = run_to_exit(["keys".as_ref(), "revoke".as_ref(), path, "cli".as_ref()]);
    assert!(out.status.success());
    assert_eq!(g.inject(&key).await.0, 401);
    // Bad input: a role that does not exist, a revoked name.
    let out = run_to_exit([
        "keys".as_ref(),
        "create".as_ref(),
        path,
        "--name".as_ref(),
        "x".as_ref(),
        "--role".as_ref(),
        "root".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("viewer, operator or admin"));
    let out = run_to_exit(["keys".as_ref(), "revoke".as_ref(), path, "cli".as_ref()]);
    assert_eq!(out.status.code(), Some(1));
}

#[tokio::test]
async fn with_a_memory_store_keys_come_from_the_keys_file_and_the_api_says_why_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(
        dir.path(),
        "{methods: [keys], keys_file: keys.yaml}",
        "memory",
    );
    let out = run_to_exit([
        "keys".as_ref(),
        "create".as_ref(),
        path.as_os_str(),
        "--name".as_ref(),
        "boss".as_ref(),
        "--role".as_ref(),
        "admin".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let key = stdout.lines().last().unwrap().trim().to_string();
    let file = std::fs::read_to_string(dir.path().join("keys.yaml")).unwrap();
    assert!(
        file.contains("hash:") && !file.contains(&key[17..]),
        "{file}"
    );
    let organism = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let http = http();
    let url = |p: &str| format!("http://{}{p}", server.local_addr());
    let r = http
        .get(url("/api/v1/agents"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(url("/api/v1/keys"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "keys_in_file");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("agentserver keys"));
    // Revoked in the file: refused at once.
    let out = run_to_exit([
        "keys".as_ref(),
        "revoke".as_ref(),
        path.as_os_str(),
        "boss".as_ref(),
    ]);
    assert!(out.status.success());
    let r = http
        .get(url("/api/v1/agents"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn auth_settings_that_cannot_work_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("{methods: [jwt]}", "auth.jwt"),
        (
            "{methods: [keys], jwt: {secret_env: X}}",
            "is not in auth.methods",
        ),
        (
            "{methods: [jwt], jwt: {secret_env: AGENTSERVER_TEST_NO_SUCH_VAR}}",
            "is not set",
        ),
        ("{methods: [jwt], jwt: {}}", "exactly one"),
        ("{methods: [passwords]}", "auth"),
        ("{methods: [keys], colour: blue}", "auth"),
        ("{methods: [keys]}", "auth.keys_file"),
    ];
    for (auth, says) in cases {
        let path = write_organism(dir.path(), auth, "memory");
        let e = Organism::builder()
            .load_config(&path)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{auth}: {e}");
    }
    // An external listener's callbacks must carry its token once auth is on.
    let path = dir.path().join("ext.yaml");
    std::fs::write(
        &path,
        "organism: {name: e, store: memory}\nauth: {methods: [keys], keys_file: k.yaml}\nlisteners:\n  - {name: x, description: d, kind: external, input_url: 'http://127.0.0.1:9/in', fields: {Q: {t: string}}}\n",
    )
    .unwrap();
    let e = Organism::builder()
        .load_config(&path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("token_env"), "{e}");
}

/// Two tenants, each with a chain of two, and one listener of the organism's own.
const TENANTS: &str = "listeners:
  - {name: a1, description: acme in, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: a2}, tenant: acme}
  - {name: a2, description: acme out, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}
  - {name: b1, description: beta in, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b2}, tenant: beta}
  - {name: b2, description: beta out, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: beta}
  - {name: o, description: ours, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}
";

/// A tenant's `/ws/messages` reconnect from past the event ring, answered from the store,
/// holds its own tenant's messages only.
#[tokio::test]
async fn a_tenants_replay_from_the_store_holds_only_its_own_messages() {
    let g = guarded_built(TENANTS, Organism::builder().event_capacity(1024)).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Operator, Some("acme"));
    let beta = add_tenant_key(&config, "beta-op", Role::Operator, Some("beta"));
    let inject = |key: &str, to: &str| {
        let (g, key, body) = (
            &g,
            key.to_string(),
            json!({"to": to, "payload_xml": "<Note>x</Note>"}),
        );
        async move {
            let (s, _, r) = g
                .send(
                    reqwest::Method::POST,
                    "/api/v1/inject",
                    Some(&key),
                    Some(body),
                )
                .await;
            assert_eq!(s, 202, "{r}");
            r["thread_id"].as_str().unwrap().to_string()
        }
    };
    let mut theirs = Vec::new();
    let mut ours = Vec::new();
    for i in 0..200 {
        theirs.push(inject(&beta, "b1").await);
        if i % 20 == 0 {
            ours.push(inject(&acme, "a1").await);
        }
    }
    ours.push(inject(&acme, "a1").await);
    for t in theirs.iter().chain(&ours) {
        settle(&g.organism, t).await;
    }
    assert!(g.organism.events().last_seq() > 2 * 1024, "past the ring");
    let mut ws = ws_with_header(&g.ws_url("/ws/messages?since=1"), &acme).await;
    let last = ours.last().unwrap().clone();
    let frames = read_until(&mut ws, |v| {
        v["thread_id"] == last.as_str() && v["to"] == "a2"
    })
    .await;
    assert_eq!(
        frames[0]["event"], "message",
        "from the store: {}",
        frames[0]
    );
    let threads: std::collections::BTreeSet<&str> = frames
        .iter()
        .filter_map(|f| f["thread_id"].as_str())
        .collect();
    assert_eq!(threads, ours.iter().map(String::as_str).collect());
    for f in &frames {
        let text = f.to_string();
        assert!(
            !text.contains("\"b1\"") && !text.contains("\"b2\""),
            "a frame of beta's reached acme: {text}"
        );
    }
}

/// The ids a tenant's credential chooses for new threads begin with its tenant's name
/// (`acme-`): a tenant cannot take an id another tenant would choose, nor learn that one is
/// taken. Every id it names and does not see is refused in the same words, whether a thread
/// has it or not, on each path that names a thread: REST and `/ws` inject, REST and `/ws`
/// fork (whose new id must begin so before it is looked up); and so do its chosen message
/// ids.
#[tokio::test]
async fn a_tenant_takes_no_thread_id_another_would_choose_and_learns_of_none() {
    let g = guarded_with(TENANTS).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Operator, Some("acme"));
    let beta = add_tenant_key(&config, "beta-op", Role::Operator, Some("beta"));
    let admin = g.key(Role::Admin).to_string();
    let post = |key: &str, path: &str, body: Value| {
        let (g, key, path) = (&g, key.to_string(), path.to_string());
        async move {
            let (s, _, r) = g
                .send(reqwest::Method::POST, &path, Some(&key), Some(body))
                .await;
            (s, r)
        }
    };
    let inject = |key: &str, to: &str, thread: &str| {
        let body = json!({"to": to, "payload_xml": "<Note>x</Note>", "thread_id": thread});
        post(key, "/api/v1/inject", body)
    };
    // What a refusal says, its id put aside: it must not depend on the thread existing.
    let words = |r: &Value, id: &str| r.to_string().replace(id, "ID");

    // Beta opens an id of its own, and is refused any other it chooses.
    let (s, r) = inject(&beta, "b1", "beta-order-1").await;
    assert_eq!(s, 202, "{r}");
    settle(&g.organism, "beta-order-1").await;
    for id in ["order-1", "acme-order-1"] {
        let (s, r) = inject(&beta, "b1", id).await;
        assert_eq!(s, 404, "{r}");
        assert!(r.to_string().contains("begins with `beta-`"), "{r}");
    }
    // The operator's credential names any id: one with beta's listeners.
    let (s, r) = inject(&admin, "b1", "order-2").await;
    assert_eq!(s, 202, "{r}");
    settle(&g.organism, "order-2").await;
    // And one whose id the server made.
    let (s, _, r) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/inject",
            Some(&beta),
            Some(json!({"to": "b1", "payload_xml": "<Note>x</Note>"})),
        )
        .await;
    assert_eq!(s, 202, "{r}");
    let uuid_beta = r["thread_id"].as_str().unwrap().to_string();
    settle(&g.organism, &uuid_beta).await;

    // Acme: beta's threads (chosen, the operator's, made by the server) and ids nobody has
    // are refused alike; it learns nothing of which exist.
    let (_, never) = inject(&acme, "a1", "beta-never").await;
    for id in [
        "beta-order-1",
        "order-2",
        uuid_beta.as_str(),
        "beta-never",
        "never",
    ] {
        let (s, r) = inject(&acme, "a1", id).await;
        assert_eq!(s, 404, "{id}: {r}");
        assert_eq!(words(&r, id), words(&never, "beta-never"), "{id}");
        assert!(r.to_string().contains("begins with `acme-`"), "{r}");
    }
    // Its own prefix opens, then continues, a thread of its own.
    for _ in 0..2 {
        let (s, r) = inject(&acme, "a1", "acme-order-1").await;
        assert_eq!(
            (s, r["thread_id"].as_str()),
            (202, Some("acme-order-1")),
            "{r}"
        );
        settle(&g.organism, "acme-order-1").await;
    }
    // Beta's threads hold beta's messages only.
    for t in ["beta-order-1", "order-2"] {
        let (_, _, r) = g
            .send(
                reqwest::Method::GET,
                &format!("/api/v1/threads/{t}/messages"),
                Some(&admin),
                None,
            )
            .await;
        let to: Vec<&str> = r["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["to"].as_str())
            .collect();
        assert!(to.iter().all(|t| ["b1", "b2"].contains(t)), "{r}");
    }

    // A chosen message id: the same rule, told before whether it is taken.
    let with_id = |key: &str, to: &str, id: &str| {
        let body = json!({"to": to, "payload_xml": "<Note>x</Note>", "message_id": id});
        post(key, "/api/v1/inject", body)
    };
    let (s, r) = with_id(&beta, "b1", "beta-m1").await;
    assert_eq!((s, r["message_id"].as_str()), (202, Some("beta-m1")), "{r}");
    let (_, refused) = with_id(&acme, "a1", "beta-m2").await;
    for id in ["beta-m1", "beta-m2", "m1"] {
        let (s, r) = with_id(&acme, "a1", id).await;
        assert_eq!(
            (s, &r["error"]["code"]),
            (400, &json!("invalid_message_id")),
            "{r}"
        );
        assert_eq!(words(&r, id), words(&refused, "beta-m2"), "{id}");
    }
    let (s, r) = with_id(&acme, "a1", "acme-m1").await;
    assert_eq!((s, r["message_id"].as_str()), (202, Some("acme-m1")), "{r}");

    // A fork's new id: the same rule, told before whether it is taken.
    let (_, _, listed) = g
        .send(
            reqwest::Method::GET,
            "/api/v1/threads/acme-order-1/messages",
            Some(&acme),
            None,
        )
        .await;
    let at = listed["items"][0]["id"].as_str().unwrap().to_string();
    let fork = |new: &str| {
        let body = json!({"at": at, "thread_id": new});
        post(&acme, "/api/v1/threads/acme-order-1/fork", body)
    };
    let (_, refused) = fork("beta-never").await;
    for id in ["beta-order-1", "order-2", "beta-never"] {
        let (s, r) = fork(id).await;
        assert_eq!(s, 400, "{id}: {r}");
        assert_eq!(r["error"]["code"], "invalid_thread_id", "{r}");
        assert_eq!(words(&r, id), words(&refused, "beta-never"), "{id}");
    }
    let (s, r) = fork("acme-order-1").await;
    assert_eq!(
        (s, &r["error"]["code"]),
        (409, &json!("thread_exists")),
        "{r}"
    );
    let (s, r) = fork("acme-fork").await;
    assert_eq!(
        (s, r["thread_id"].as_str()),
        (201, Some("acme-fork")),
        "{r}"
    );

    // `/ws`: the same answers.
    let mut ws = ws_with_header(&g.ws_url("/ws"), &acme).await;
    next_json(&mut ws).await;
    for (i, id) in ["beta-order-1", "never"].into_iter().enumerate() {
        let a = ask(
            &mut ws,
            json!({"cmd": "inject", "request_id": i, "to": "a1", "payload_xml": "<Note>x</Note>", "thread_id": id}),
        )
        .await;
        assert_eq!(
            (a["event"].as_str(), a["status"].as_u64()),
            (Some("error"), Some(404)),
            "{a}"
        );
        assert!(
            a["error"].as_str().unwrap().contains("begins with `acme-`"),
            "{a}"
        );
        let f = ask(
            &mut ws,
            json!({"cmd": "fork", "request_id": 10 + i, "thread_id": "acme-order-1", "at": at, "new_thread_id": id}),
        )
        .await;
        assert_eq!(
            (f["event"].as_str(), f["status"].as_u64()),
            (Some("error"), Some(400)),
            "{f}"
        );
    }
    let a = ask(
        &mut ws,
        json!({"cmd": "inject", "request_id": 20, "to": "a1", "payload_xml": "<Note>x</Note>", "thread_id": "acme-ws"}),
    )
    .await;
    assert_eq!(
        (a["event"].as_str(), a["thread_id"].as_str()),
        (Some("ack"), Some("acme-ws")),
        "{a}"
    );
}

/// A tenant's credentials hold at most `tenants.<t>.max_streams` event streams open at
/// once, whichever of its keys opens them and however (a WebSocket session by header or
/// first frame, a thread's events): one more is refused (close 4429, or 429
/// `too_many_streams`), another tenant is not held back, and a stream closed gives its
/// place back.
#[tokio::test]
async fn a_tenant_holds_at_most_its_max_streams_open() {
    let long = "t".repeat(64);
    let g = guarded_with(&format!(
        "tenants:\n  acme: {{max_streams: 2}}\n  {long}: {{max_streams: 1}}\n{TENANTS}"
    ))
    .await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Operator, Some("acme"));
    let acme2 = add_tenant_key(&config, "acme-2", Role::Viewer, Some("acme"));
    let beta = add_tenant_key(&config, "beta-op", Role::Operator, Some("beta"));
    let refused = |m: Option<WsMessage>| match m {
        Some(WsMessage::Close(Some(f))) => (u16::from(f.code), f.reason.to_string()),
        other => panic!("not a close: {other:?}"),
    };
    let mut first = ws_with_header(&g.ws_url("/ws"), &acme).await;
    assert_eq!(next_json(&mut first).await["event"], "connected");
    let mut second = ws_with_header(&g.ws_url("/ws/messages"), &acme2).await;
    assert_eq!(next_json(&mut second).await["event"], "connected");
    // A third, by header or by first frame: refused, saying why.
    let mut third = ws_with_header(&g.ws_url("/ws"), &acme).await;
    let (code, reason) = refused(next_frame(&mut third).await);
    assert_eq!(code, 4429, "{reason}");
    assert!(reason.contains("tenants.acme.max_streams"), "{reason}");
    let mut fourth = ws_connect(&g.ws_url("/ws/messages")).await;
    send_json(&mut fourth, json!({"cmd": "auth", "token": acme2})).await;
    assert_eq!(refused(next_frame(&mut fourth).await).0, 4429);
    // A thread's events count too.
    g.note_to_a1(&acme, "acme-s").await;
    let (s, h, r) = g
        .send(
            reqwest::Method::GET,
            "/api/v1/threads/acme-s/events",
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(
        (s, &r["error"]["code"]),
        (429, &json!("too_many_streams")),
        "{r}"
    );
    assert!(h.get("retry-after").is_some(), "{h:?}");
    // Beta is not held back.
    let mut betas = Vec::new();
    for _ in 0..3 {
        let mut ws = ws_with_header(&g.ws_url("/ws"), &beta).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        betas.push(ws);
    }
    // The reason fits a close frame (123 bytes) whatever the tenant's name.
    let longest = add_tenant_key(&config, "long", Role::Viewer, Some(&long));
    let mut only = ws_with_header(&g.ws_url("/ws"), &longest).await;
    assert_eq!(next_json(&mut only).await["event"], "connected");
    let mut over = ws_with_header(&g.ws_url("/ws"), &longest).await;
    let (code, reason) = refused(next_frame(&mut over).await);
    assert_eq!(code, 4429, "{reason}");
    assert!(
        reason.len() <= 123 && reason.contains("max_streams"),
        "{reason}"
    );
    // A stream closed gives its place back (once the server has seen it end).
    first.close(None).await.unwrap();
    let url = g.ws_url("/ws");
    wait_until_async("the closed stream's place given back", || async {
        let mut again = ws_with_header(&url, &acme).await;
        match next_frame(&mut again).await {
            Some(WsMessage::Text(t)) if t.contains("\"connected\"") => true,
            other => {
                assert_eq!(refused(other).0, 4429);
                false
            }
        }
    })
    .await;
}

/// A tenant's reads take turns (one at a time, so its slow ones hold one of the store's
/// connections only): many at once, beside an event stream it keeps open, are each
/// answered, and so are another tenant's meanwhile.
#[tokio::test]
async fn a_tenants_reads_at_once_are_each_answered_in_turn() {
    let g = guarded_with(TENANTS).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Operator, Some("acme"));
    let beta = add_tenant_key(&config, "beta-op", Role::Operator, Some("beta"));
    g.note_to_a1(&acme, "acme-t").await;
    // An event stream stays open: it holds no turn.
    let (s, _, _) = g
        .send(
            reqwest::Method::GET,
            "/api/v1/threads/acme-t/events",
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let batch = json!({"filter": {"status": "completed"}, "action": "label", "labels": {"k": "v"}, "dry_run": true});
    let mut asks = Vec::new();
    for i in 0..24 {
        let (key, path) = match i % 3 {
            0 => (&acme, "/api/v1/threads"),
            1 => (&acme, "/api/v1/messages?thread=acme-t"),
            _ => (&beta, "/api/v1/threads"),
        };
        asks.push(g.send(reqwest::Method::GET, path, Some(key), None));
    }
    asks.push(g.send(
        reqwest::Method::POST,
        "/api/v1/threads/batch",
        Some(&acme),
        Some(batch),
    ));
    for (s, _, r) in futures_util::future::join_all(asks).await {
        assert!(s == 200 || s == 202, "{s}: {r}");
    }
}

fn names(list: &Value, key: &str) -> Vec<String> {
    let mut v: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[key].as_str().unwrap_or_default().to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_tenants_credential_sees_and_touches_only_its_tenants_listeners() {
    let g = guarded_with(TENANTS).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Operator, Some("acme"));
    let beta = add_tenant_key(&config, "beta-op", Role::Operator, Some("beta"));
    let org = g.key(Role::Viewer).to_string();

    // Streams opened before anything happens, with a replay to check later.
    let mut acme_events = ws_with_header(&g.ws_url("/ws"), &acme).await;
    let snapshot = next_json(&mut acme_events).await;
    let agents: Vec<&str> = snapshot["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(agents, ["a1", "a2"], "{snapshot}");
    let mut acme_messages = ws_with_header(&g.ws_url("/ws/messages"), &acme).await;
    next_json(&mut acme_messages).await;

    let inject = |key: String, to: &str, thread: Option<&str>| {
        let body = match thread {
            Some(t) => json!({"to": to, "payload_xml": "<Note>x</Note>", "thread_id": t}),
            None => json!({"to": to, "payload_xml": "<Note>x</Note>"}),
        };
        let g = &g;
        async move {
            g.send(
                reqwest::Method::POST,
                "/api/v1/inject",
                Some(&key),
                Some(body),
            )
            .await
        }
    };
    // Beta works first, then acme: acme's streams must show none of beta's.
    let (s, _, r) = inject(beta.clone(), "b1", None).await;
    assert_eq!(s, 202, "{r}");
    let beta_thread = r["thread_id"].as_str().unwrap().to_string();
    settle(&g.organism, &beta_thread).await;
    let (s, _, r) = inject(acme.clone(), "a1", None).await;
    assert_eq!(s, 202, "{r}");
    let acme_thread = r["thread_id"].as_str().unwrap().to_string();
    settle(&g.organism, &acme_thread).await;

    // A listener of another tenant, or the organism's, is as absent as one that does not
    // exist: the same answer.
    let (_, _, missing) = inject(acme.clone(), "nope", None).await;
    for to in ["b1", "o"] {
        let (s, _, r) = inject(acme.clone(), to, None).await;
        assert_eq!(
            (s, &r["error"]["code"]),
            (404, &missing["error"]["code"]),
            "{r}"
        );
        assert_eq!(
            r["error"]["message"],
            missing["error"]["message"]
                .as_str()
                .unwrap()
                .replace("nope", to)
        );
    }
    // A mistyped name is told the listener meant only among those the credential sees:
    // acme's `b1x` suggests nothing (beta's `b1` is as absent as `nope`), the organism's
    // operator's does.
    let (_, _, r) = inject(acme.clone(), "a1x", None).await;
    assert_eq!(
        r["error"]["message"],
        "no listener named `a1x` (did you mean `a1`?)"
    );
    let (_, _, r) = inject(acme.clone(), "b1x", None).await;
    assert_eq!(r["error"]["message"], "no listener named `b1x`", "{r}");
    // A name no listener could have is compared with none (the cost is its length).
    let long = "a1".repeat(100);
    let (_, _, r) = inject(acme.clone(), &long, None).await;
    assert_eq!(r["error"]["message"], format!("no listener named `{long}`"));
    let op = g.key(Role::Operator).to_string();
    let (_, _, r) = inject(op, "b1x", None).await;
    assert_eq!(
        r["error"]["message"],
        "no listener named `b1x` (did you mean `b1`?)"
    );
    // Nor can it continue another tenant's thread.
    let (s, _, r) = inject(acme.clone(), "a1", Some(&beta_thread)).await;
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (404, Some("unknown_thread")),
        "{r}"
    );

    // Lists: items and totals.
    let (_, list) = g.get("/api/v1/agents", Some(&acme)).await;
    assert_eq!(
        (names(&list, "name"), &list["total"]),
        (vec!["a1".to_string(), "a2".into()], &json!(2))
    );
    let (_, list) = g.get("/api/v1/agents", Some(&org)).await;
    assert_eq!(list["total"], 5);
    let (_, list) = g.get("/api/v1/threads", Some(&acme)).await;
    assert_eq!(
        (names(&list, "id"), &list["total"]),
        (vec![acme_thread.clone()], &json!(1)),
        "{list}"
    );
    let (_, list) = g.get("/api/v1/threads", Some(&org)).await;
    assert_eq!(list["total"], 2);
    let (_, list) = g.get("/api/v1/messages", Some(&acme)).await;
    assert_eq!(list["total"], 2, "{list}");
    for m in list["items"].as_array().unwrap() {
        assert_eq!(m["thread_id"], acme_thread.as_str(), "{m}");
    }
    let (_, list) = g.get("/api/v1/messages?agent=b1", Some(&acme)).await;
    assert_eq!(
        (
            list["total"].as_u64(),
            list["items"].as_array().unwrap().len()
        ),
        (Some(0), 0)
    );
    let (_, list) = g
        .get("/api/v1/messages?limit=1&offset=1", Some(&acme))
        .await;
    assert_eq!(
        (
            list["total"].as_u64(),
            list["items"].as_array().unwrap().len()
        ),
        (Some(2), 1)
    );
    assert_eq!(list["items"][0]["to"], "a2");
    let (_, list) = g.get("/api/v1/messages", Some(&org)).await;
    assert_eq!(list["total"], 4);

    // One thing of another tenant: the same 404 as a thing that does not exist.
    let absent = [
        (
            format!("/api/v1/threads/{beta_thread}"),
            "/api/v1/threads/no-such-thread".to_string(),
        ),
        (
            format!("/api/v1/threads/{beta_thread}/messages"),
            "/api/v1/threads/no-such-thread/messages".into(),
        ),
        ("/api/v1/agents/b1".into(), "/api/v1/agents/nope".into()),
        (
            "/api/v1/agents/b1/config".into(),
            "/api/v1/agents/nope/config".into(),
        ),
        (
            "/api/v1/agents/b1/schema".into(),
            "/api/v1/agents/nope/schema".into(),
        ),
    ];
    for (theirs, nothing) in absent {
        let (s1, e1) = g.get(&theirs, Some(&acme)).await;
        let (s2, e2) = g.get(&nothing, Some(&acme)).await;
        assert_eq!(s1, 404, "{theirs}: {e1}");
        assert_eq!(
            (s1, &e1["error"]["code"]),
            (s2, &e2["error"]["code"]),
            "{theirs}"
        );
    }
    for path in [
        "/api/v1/agents/b1/pause",
        "/api/v1/agents/b1/resume",
        "/api/v1/agents/b1/reload",
    ] {
        let (s, _, e) = g.send(reqwest::Method::POST, path, Some(&acme), None).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (404, Some("unknown_listener")),
            "{path}"
        );
    }
    let (s, _, _) = g
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/threads/{beta_thread}/kill"),
            Some(&acme),
            None,
        )
        .await;
    assert_eq!(s, 404);
    assert_eq!(
        g.organism.threads().info(&beta_thread).unwrap().status,
        agentserver::threads::ThreadStatus::Completed
    );
    // Its own: all there.
    let (s, t) = g
        .get(&format!("/api/v1/threads/{acme_thread}"), Some(&acme))
        .await;
    assert_eq!(
        (s, t["messages"].as_array().unwrap().len()),
        (200, 2),
        "{t}"
    );
    let (s, _) = g.get("/api/v1/agents/a1/schema", Some(&acme)).await;
    assert_eq!(s, 200);

    // Streams: only acme's, live and replayed.
    let frames = read_until(&mut acme_events, |v| {
        v["event"] == "thread_updated"
            && v["thread_id"] == acme_thread.as_str()
            && v["status"] == "completed"
    })
    .await;
    let mut replay = ws_with_header(&g.ws_url("/ws/messages?since=0"), &acme).await;
    let replayed = read_until(&mut replay, |v| {
        v["to"] == "a2" && v["status"] == "delivered"
    })
    .await;
    let live = read_until(&mut acme_messages, |v| {
        v["to"] == "a2" && v["status"] == "delivered"
    })
    .await;
    for f in frames.iter().chain(&replayed).chain(&live) {
        let text = f.to_string();
        assert!(
            !text.contains(&beta_thread) && !text.contains("\"b1\"") && !text.contains("\"b2\""),
            "a frame of beta's reached acme: {text}"
        );
    }
    assert!(live
        .iter()
        .any(|f| f["event"] == "message" && f["to"] == "a1"));
    // Commands on another tenant's things: as if absent.
    let a = ask(
        &mut acme_events,
        json!({"cmd": "pause", "request_id": 1, "agent": "b1"}),
    )
    .await;
    assert_eq!(
        (a["status"].as_u64(), a["code"].as_str()),
        (Some(404), Some("unknown_listener")),
        "{a}"
    );
    let a = ask(
        &mut acme_events,
        json!({"cmd": "kill", "request_id": 2, "thread_id": beta_thread}),
    )
    .await;
    assert_eq!(
        (a["status"].as_u64(), a["code"].as_str()),
        (Some(404), Some("unknown_thread")),
        "{a}"
    );
    let a = ask(
        &mut acme_events,
        json!({"cmd": "inject", "request_id": 3, "to": "b1", "payload_xml": "<Note>x</Note>"}),
    )
    .await;
    assert_eq!(a["status"], 404, "{a}");
    let a = ask(
        &mut acme_events,
        json!({"cmd": "pause", "request_id": 4, "agent": "a2"}),
    )
    .await;
    assert_eq!(a["event"], "ack", "{a}");
    // The organism's own view is whole.
    let (_, list) = g.get("/api/v1/agents", Some(&org)).await;
    assert_eq!(names(&list, "name"), ["a1", "a2", "b1", "b2", "o"]);
}

mod jwt {
    use super::*;
    use base64::Engine;
    use ed25519_dalek::Signer;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn hs256(secret: &str, claims: Value) -> String {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    /// A token signed by hand: `header` as given, signed with `sign` over `h.c`.
    fn signed(header: Value, claims: Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let head = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = sign(head.as_bytes());
        format!("{head}.{}", b64(&sig))
    }

    async fn serve(auth: &str) -> (Organism, ApiServer, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = write_organism_with(dir.path(), auth, "memory", TENANTS);
        let organism = Organism::builder().load(&path).unwrap();
        let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
            .await
            .unwrap();
        let base = format!("http://{}", server.local_addr());
        (organism, server, base, dir)
    }

    async fn status(base: &str, path: &str, token: &str) -> u16 {
        http()
            .get(format!("{base}{path}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn hs256_tokens_are_checked_for_signature_time_audience_and_algorithm() {
        // SAFETY: set once, before any thread of this test reads it; the name is this test's.
        unsafe { std::env::set_var("AGENTSERVER_TEST_JWT_SECRET", "s3cret-of-the-organism") };
        let (organism, _server, base, _dir) = serve(
            "{methods: [jwt], jwt: {secret_env: AGENTSERVER_TEST_JWT_SECRET, audience: dash, issuer: idp}}",
        )
        .await;
        let secret = "s3cret-of-the-organism";
        let good = |extra: Value| {
            let mut c = json!({"sub": "ada", "role": "operator", "exp": now() + 600, "aud": "dash", "iss": "idp"});
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            c
        };
        let token = hs256(secret, good(json!({})));
        assert_eq!(status(&base, "/api/v1/agents", &token).await, 200);
        // An inject carries the token's sub.
        let r = http()
            .post(format!("{base}/api/v1/inject"))
            .bearer_auth(&token)
            .json(&json!({"to": "o", "payload_xml": "<Note>j</Note>"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let thread = r.json::<Value>().await.unwrap()["thread_id"]
            .as_str()
            .unwrap()
            .to_string();
        settle(&organism, &thread).await;
        assert_eq!(&*messages(&organism, &thread)[0].from, "ada");
        // A viewer's token may read, not inject.
        let viewer = hs256(secret, good(json!({"role": "viewer"})));
        let r = http()
            .post(format!("{base}/api/v1/inject"))
            .bearer_auth(&viewer)
            .json(&json!({"to": "o", "payload_xml": "<Note>j</Note>"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        // A tenant's token sees its tenant only.
        let acme = hs256(secret, good(json!({"tenant": "acme"})));
        assert_eq!(status(&base, "/api/v1/agents/b1", &acme).await, 404);
        assert_eq!(status(&base, "/api/v1/agents/a1", &acme).await, 200);
        assert_eq!(status(&base, "/api/v1/organism/config", &acme).await, 403);

        let refused = [
            ("expired", hs256(secret, good(json!({"exp": now() - 3600})))),
            ("not yet", hs256(secret, good(json!({"nbf": now() + 3600})))),
            ("no exp", {
                let mut c = good(json!({}));
                c.as_object_mut().unwrap().remove("exp");
                hs256(secret, c)
            }),
            (
                "another audience",
                hs256(secret, good(json!({"aud": "elsewhere"}))),
            ),
            (
                "another issuer",
                hs256(secret, good(json!({"iss": "mallory"}))),
            ),
            ("no aud", {
                let mut c = good(json!({}));
                c.as_object_mut().unwrap().remove("aud");
                hs256(secret, c)
            }),
            ("no iss", {
                let mut c = good(json!({}));
                c.as_object_mut().unwrap().remove("iss");
                hs256(secret, c)
            }),
            ("neither aud nor iss", {
                let mut c = good(json!({}));
                c.as_object_mut().unwrap().remove("aud");
                c.as_object_mut().unwrap().remove("iss");
                hs256(secret, c)
            }),
            ("another secret", hs256("not-the-secret", good(json!({})))),
            ("no role", hs256(secret, good(json!({"role": "root"})))),
            ("no sub", hs256(secret, good(json!({"sub": ""})))),
            (
                "alg none",
                signed(
                    json!({"alg": "none", "typ": "JWT"}),
                    good(json!({})),
                    |_| Vec::new(),
                ),
            ),
            ("garbage", "a.b.c".to_string()),
        ];
        for (what, token) in refused {
            assert_eq!(status(&base, "/api/v1/agents", &token).await, 401, "{what}");
        }
    }

    #[tokio::test]
    async fn eddsa_tokens_verify_against_the_jwks_and_an_hmac_forgery_with_the_public_key_fails() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let public = key.verifying_key().to_bytes();
        let dir = tempfile::tempdir().unwrap();
        let jwks = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": b64(&public), "kid": "k1", "alg": "EdDSA"}]});
        std::fs::write(dir.path().join("jwks.json"), jwks.to_string()).unwrap();
        let path = write_organism_with(
            dir.path(),
            "{methods: [jwt], jwt: {jwks_file: jwks.json}}",
            "memory",
            TENANTS,
        );
        let organism = Organism::builder().load(&path).unwrap();
        let server = ApiServer::bind(organism, "127.0.0.1:0", ApiOptions::default())
            .await
            .unwrap();
        let base = format!("http://{}", server.local_addr());
        let claims = json!({"sub": "svc", "role": "viewer", "exp": now() + 600});
        let eddsa =
            |header: Value| signed(header, claims.clone(), |m| key.sign(m).to_bytes().to_vec());
        assert_eq!(
            status(
                &base,
                "/api/v1/agents",
                &eddsa(json!({"alg": "EdDSA", "kid": "k1"}))
            )
            .await,
            200
        );
        assert_eq!(
            status(&base, "/api/v1/agents", &eddsa(json!({"alg": "EdDSA"}))).await,
            200
        );
        assert_eq!(
            status(
                &base,
                "/api/v1/agents",
                &eddsa(json!({"alg": "EdDSA", "kid": "other"}))
            )
            .await,
            401
        );
        // Another key's signature.
        let other = ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]);
        let forged = signed(json!({"alg": "EdDSA"}), claims.clone(), |m| {
            other.sign(m).to_bytes().to_vec()
        });
        assert_eq!(status(&base, "/api/v1/agents", &forged).await, 401);
        // Algorithm confusion: HS256 with the public key as the secret.
        let confused = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&public),
        )
        .unwrap();
        assert_eq!(status(&base, "/api/v1/agents", &confused).await, 401);
        // A file that is not a JWKS is a clear start-up error.
        std::fs::write(dir.path().join("jwks.json"), "{\"keys\": 3}").unwrap();
        let organism = Organism::builder().load(&path).unwrap();
        let e = ApiServer::bind(organism, "127.0.0.1:0", ApiOptions::default())
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("jwks.json") && e.contains("not a JWKS"), "{e}");
    }
}

#[tokio::test]
async fn failed_authentications_and_injects_are_rate_limited_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(
        dir.path(),
        "{methods: [keys], failed_auth_per_minute: 3, inject_per_s: 1, burst: 2}",
        "keys.db",
    );
    let config = Organism::builder().load_config(&path).unwrap();
    let op = add_key(&config, "op", Role::Operator);
    let other = add_key(&config, "other", Role::Operator);
    let organism = Organism::builder().build(config).unwrap();
    let server = ApiServer::bind(organism, "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let http = http();
    let url = |p: &str| format!("http://{}{p}", server.local_addr());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = http
            .get(url("/api/v1/agents"))
            .bearer_auth("ask_nope")
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            let retry = r.headers().get("retry-after").cloned();
            let retry = retry.as_ref().map(|v| v.to_str().unwrap());
            let e: Value = r.json().await.unwrap();
            assert_rate_limited(429, retry, &e);
        }
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429]);
    // A good credential from the same address still works.
    let r = http
        .get(url("/api/v1/agents"))
        .bearer_auth(&op)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let inject = |key: String| {
        let http = http.clone();
        let url = url("/api/v1/inject");
        async move {
            http.post(url)
                .bearer_auth(key)
                .json(&json!({"to": "a", "payload_xml": "<Note>r</Note>"}))
                .send()
                .await
                .unwrap()
        }
    };
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(inject(op.clone()).await.status().as_u16());
    }
    assert_eq!(statuses, [202, 202, 429]);
    let r = inject(op.clone()).await;
    assert!(r.headers().contains_key("retry-after"));
    // Another credential has its own allowance.
    assert_eq!(inject(other).await.status(), 202);

    // A key with a rate of its own: a burst of 4 over the file's 2.
    let config = Organism::builder().load_config(&path).unwrap();
    let (fast, row) = agentserver::access::new_key_with_rate(
        "fast",
        Role::Operator,
        None,
        None,
        (Some(1), Some(4)),
    )
    .unwrap();
    KeySource::of(&config).unwrap().add(&row).unwrap();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(inject(fast.clone()).await.status().as_u16());
    }
    assert_eq!(statuses, [202, 202, 202, 202, 429]);
    let e = agentserver::access::new_key_with_rate("x", Role::Viewer, None, None, (None, Some(3)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            agentserver::access::NewKeyError::Field {
                field: "inject_per_s",
                ..
            }
        ),
        "{e}"
    );

    for (auth, says) in [
        ("{methods: [keys], inject_per_s: 0}", "auth.inject_per_s"),
        ("{methods: [keys], burst: 5}", "needs auth.inject_per_s"),
    ] {
        let path = write_organism(dir.path(), auth, "k2.db");
        let e = Organism::builder()
            .load_config(&path)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{auth}: {e}");
    }
}

// Multi-threaded: the CLI runs to its end on this test's thread while the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_presents_its_token_from_the_flag_or_the_environment() {
    let g = guarded().await;
    let key = g.key(Role::Operator).to_string();
    let run = |token: Option<(&str, &str)>| {
        let mut cmd = common::child::agentserver();
        cmd.args(["inject", "--url", &g.base, "--to", "a", "<Note>cli</Note>"]);
        cmd.env_remove("AGENTSERVER_TOKEN");
        match token {
            Some(("flag", t)) => {
                cmd.args(["--token", t]);
            }
            Some((_, t)) => {
                cmd.env("AGENTSERVER_TOKEN", t);
            }
            None => {}
        }
        cmd.output().unwrap()
    };
    let out = run(Some(("flag", &key)));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("thread_id"));
    let out = run(Some(("env", &key)));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `tail` says at once that a credential is needed and how to pass it, and that a wrong
    // one was refused (not that the server cannot be reached).
    let tail = |token: Option<&str>| {
        let mut cmd = common::child::agentserver();
        cmd.args(["tail", "--url", &g.base]);
        cmd.env_remove("AGENTSERVER_TOKEN");
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        cmd.output().unwrap()
    };
    let out = tail(None);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("needs a credential")
            && said.contains("--token")
            && said.contains("AGENTSERVER_TOKEN"),
        "{said}"
    );
    let out = tail(Some(
        "ask_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
    ));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("401") && said.contains("refused") && !said.contains("cannot reach"),
        "{said}"
    );
}

#[tokio::test]
async fn control_actions_key_changes_and_refused_credentials_are_audited() {
    let g = guarded().await;
    let admin = g.key(Role::Admin).to_string();
    let op = g.key(Role::Operator).to_string();
    let mut watch = ws_with_header(&g.ws_url("/ws?events=audit"), &admin).await;
    next_json(&mut watch).await;

    let (s, _, _) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/agents/b/pause",
            Some(&op),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, _, _) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/organism/pause",
            Some(g.key(Role::Viewer)),
            None,
        )
        .await;
    assert_eq!(s, 403);
    let (s, _, _) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/keys",
            Some(&admin),
            Some(json!({"name": "tmp", "role": "viewer"})),
        )
        .await;
    assert_eq!(s, 201);
    let (s, _, _) = g
        .send(
            reqwest::Method::DELETE,
            "/api/v1/keys/tmp",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, _, _) = g
        .send(
            reqwest::Method::GET,
            "/api/v1/agents",
            Some(
                "ask_000000000000_0000000000000000000000000000000000000000000000000000000000000000",
            ),
            None,
        )
        .await;
    assert_eq!(s, 401);
    let mut ws = ws_with_header(&g.ws_url("/ws"), &op).await;
    next_json(&mut ws).await;
    let a = ask(
        &mut ws,
        json!({"cmd": "resume", "request_id": 1, "agent": "b"}),
    )
    .await;
    assert_eq!(a["event"], "ack");
    // Not audited: reads and injects.
    assert_eq!(g.inject(&op).await.0, 202);

    let (s, log) = g.get("/api/v1/audit", Some(&admin)).await;
    assert_eq!(s, 200, "{log}");
    let entries = log["items"].as_array().unwrap();
    let actions: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        [
            ("ws resume", "ack"),
            ("authenticate", "401: no key with id 000000000000"),
            ("DELETE /api/v1/keys/{name}", "200"),
            ("POST /api/v1/keys", "201"),
            ("POST /api/v1/organism/pause", "403"),
            ("POST /api/v1/agents/{name}/pause", "200"),
        ],
        "{log}"
    );
    assert_eq!(log["total"], 6);
    assert_eq!(
        entries[0]["remote"], "127.0.0.1",
        "a /ws command's address too"
    );
    let pause = &entries[5];
    assert_eq!(
        (
            pause["who"].as_str(),
            pause["role"].as_str(),
            pause["target"].as_str(),
            pause["remote"].as_str()
        ),
        (
            Some("key:operator"),
            Some("operator"),
            Some("/api/v1/agents/b/pause"),
            Some("127.0.0.1")
        )
    );
    assert!(pause["timestamp"].is_string());
    let (_, mine) = g.get("/api/v1/audit?who=key:admin", Some(&admin)).await;
    assert_eq!(mine["total"], 2, "{mine}");
    let (_, auth) = g
        .get("/api/v1/audit?action=authenticate&limit=1", Some(&admin))
        .await;
    assert_eq!(
        (
            auth["total"].as_u64(),
            auth["items"].as_array().unwrap().len()
        ),
        (Some(1), 1)
    );
    let (s, e) = g.get("/api/v1/audit?since=yesterday", Some(&admin)).await;
    assert_eq!((s, e["error"]["where"].as_str()), (400, Some("since")));
    // Each entry is an `audit` event too.
    let frames = read_until(&mut watch, |v| v["action"] == "ws resume").await;
    assert!(frames.iter().all(|f| f["event"] == "audit"), "{frames:?}");
    assert_eq!(frames.len(), 6);
}

/// RS256 against a JWKS, with a fixed test key (`tests/fixtures/rsa-test-key.der.b64`, made by
/// `openssl genrsa -traditional 2048` for this test only; its public half is
/// `rsa-test-jwks.json`).
#[tokio::test]
async fn rs256_tokens_verify_against_the_jwks() {
    use base64::Engine;
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let der = base64::engine::general_purpose::STANDARD
        .decode(
            std::fs::read_to_string(fixtures.join("rsa-test-key.der.b64"))
                .unwrap()
                .trim(),
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures.join("rsa-test-jwks.json"),
        dir.path().join("jwks.json"),
    )
    .unwrap();
    let path = write_organism_with(
        dir.path(),
        "{methods: [jwt], jwt: {jwks_file: jwks.json}}",
        "memory",
        TENANTS,
    );
    let organism = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(organism, "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({"sub": "rsa-svc", "role": "viewer", "exp": exp});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("r1".into());
    let token = jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_der(&der),
    )
    .unwrap();
    let get = |t: String| {
        let url = format!("http://{}/api/v1/agents", server.local_addr());
        async move {
            http()
                .get(url)
                .bearer_auth(t)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(get(token.clone()).await, 200);
    // The same claims as HS256 keyed with the public JWKS text: refused.
    let jwks = std::fs::read(fixtures.join("rsa-test-jwks.json")).unwrap();
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&jwks),
    )
    .unwrap();
    assert_eq!(get(confused).await, 401);
    // A tampered payload: refused.
    let mut parts: Vec<&str> = token.split('.').collect();
    let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"sub": "rsa-svc", "role": "admin", "exp": exp}).to_string());
    parts[1] = &forged;
    assert_eq!(get(parts.join(".")).await, 401);
}

/// `GET /models`: never a key; a tenant sees the models its own listeners use.
#[tokio::test]
async fn models_show_no_key_and_a_tenant_only_its_own() {
    // SAFETY: a variable of this test's own, set before anything reads the environment.
    unsafe { std::env::set_var("AUTH_TEST_MODEL_KEY", "sk-test-0123456789abcdef") };
    let listeners = "tenants:
  acme: {tokens_per_day: 100000}
  beta: {tokens_per_month: 200000}
models:
  acme-model: {base_url: 'http://user:pw@127.0.0.1:9/v1?k=v', model: m1, api_key_env: AUTH_TEST_MODEL_KEY}
  beta-model: {provider: scripted, responses: [{text: hi}]}
listeners:
  - {name: a1, description: acme, kind: llm, model: acme-model, system: s, schema: t.xsd, accepts: [Note], tenant: acme}
  - {name: b1, description: beta, kind: llm, model: beta-model, system: s, schema: t.xsd, accepts: [Note], tenant: beta, stream: true}
";
    let g = guarded_with(listeners).await;
    let config = Organism::builder().load_config(&g.path).unwrap();
    let acme = add_tenant_key(&config, "acme-op", Role::Viewer, Some("acme"));
    // Streams open before beta's model answers: acme's must show none of it.
    let mut acme_ws = ws_with_header(&g.ws_url("/ws"), &acme).await;
    next_json(&mut acme_ws).await;
    let mut org_ws = ws_with_header(&g.ws_url("/ws"), g.key(Role::Viewer)).await;
    next_json(&mut org_ws).await;
    let (s, all) = g.get("/api/v1/models", Some(g.key(Role::Viewer))).await;
    assert_eq!(s, 200, "{all}");
    let text = all.to_string();
    assert!(
        !text.contains("sk-test") && !text.contains("pw") && !text.contains("k=v"),
        "{text}"
    );
    let names: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme-model", "beta-model"]);
    assert_eq!(all["items"][0]["api_key_env"], "AUTH_TEST_MODEL_KEY");
    let (s, mine) = g.get("/api/v1/models", Some(&acme)).await;
    assert_eq!(s, 200);
    assert_eq!(mine["items"].as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine["items"][0]["name"], "acme-model");
    assert_eq!(mine["items"][0]["listeners"], json!(["a1"]));

    // `GET /usage`: beta's call is beta's, and acme's credential does not see it.
    let (s, _, r) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/inject",
            Some(g.key(Role::Operator)),
            Some(json!({"to": "b1", "payload_xml": "<Note>x</Note>"})),
        )
        .await;
    assert_eq!(s, 202, "{r}");
    settle(&g.organism, r["thread_id"].as_str().unwrap()).await;
    // The organism-wide stream saw beta's streamed answer and its usage ...
    read_until(&mut org_ws, |f| f["event"] == "delta" && f["agent"] == "b1").await;
    read_until(&mut org_ws, |f| {
        f["event"] == "usage" && f["listener"] == "b1"
    })
    .await;
    // ... acme's saw nothing of it, up to acme's own inject's end.
    let (s, _, mine) = g
        .send(
            reqwest::Method::POST,
            "/api/v1/inject",
            Some(g.key(Role::Operator)),
            Some(json!({"to": "a1", "payload_xml": "<Note>y</Note>"})),
        )
        .await;
    assert_eq!(s, 202, "{mine}");
    let acme_thread = mine["thread_id"].as_str().unwrap().to_string();
    let frames = read_until(&mut acme_ws, |f| {
        f["event"] == "thread_updated"
            && f["thread_id"] == acme_thread.as_str()
            && f["status"] != "active"
    })
    .await;
    for f in &frames {
        // Its name as a JSON string (a random id may hold the letters b1).
        assert!(
            !f.to_string().contains("\"b1\""),
            "beta's reached acme: {f}"
        );
    }
    let (_, all) = g
        .get(
            "/api/v1/usage?group_by=tenant,listener",
            Some(g.key(Role::Viewer)),
        )
        .await;
    assert_eq!(all["items"][0]["tenant"], "beta", "{all}");
    assert_eq!(all["items"][0]["calls"], 1);
    for q in ["", "?tenant=beta", "?group_by=tenant"] {
        let (s, mine) = g.get(&format!("/api/v1/usage{q}"), Some(&acme)).await;
        assert_eq!((s, &mine["items"]), (200, &json!([])), "{q}");
    }
    // Budgets: each tenant's windows; acme's credential sees acme's.
    let tenants = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                format!(
                    "{}.{}",
                    w["tenant"].as_str().unwrap(),
                    w["key"].as_str().unwrap()
                )
            })
            .collect()
    };
    let (_, all) = g
        .get("/api/v1/usage/budgets", Some(g.key(Role::Viewer)))
        .await;
    assert_eq!(
        tenants(&all),
        ["acme.tokens_per_day", "beta.tokens_per_month"]
    );
    let (_, mine) = g.get("/api/v1/usage/budgets", Some(&acme)).await;
    assert_eq!(tenants(&mine), ["acme.tokens_per_day"]);
}
