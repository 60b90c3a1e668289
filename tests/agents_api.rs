//! Agents created through the API (`/api/v1/agents`, scripts, deployments) against a real
//! server on 127.0.0.1:0 with a real SQLite store: create, upload, deploy and roll back while
//! traffic flows; every refusal leaves the organism running; restarts keep everything.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentserver::access::Role;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::threads::ThreadStatus;
use agentserver::{InjectRequest, Organism};
use common::*;
use serde_json::{json, Value};

const REPLY_XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Reply"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/>
    <xs:element name="version" type="xs:int"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

/// The file's listeners: a shared collector of replies, and a native chain.
const FILE_LISTENERS: &str = "  - {name: collector, description: keeps replies, kind: native, handler: sink, schema: reply.xsd, shared: true}
  - {name: a, description: first, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b}}
  - {name: b, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}";

fn write_files(dir: &Path, auth: &str, extra: &str) -> PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    std::fs::write(dir.join("reply.xsd"), REPLY_XSD).unwrap();
    let path = dir.join("o.yaml");
    std::fs::write(
        &path,
        format!("organism:\n  name: uploads\n  store: o.db\n{auth}listeners:\n{FILE_LISTENERS}\n{extra}"),
    )
    .unwrap();
    path
}

/// A script that answers each `Ask` with its text and its version number.
fn script(version: u32) -> String {
    format!(
        "function handle(p, meta)\n  return {{ to = \"collector\", payload = {{ text = p.text, version = {version} }} }}\nend\n"
    )
}

fn echo_body(name: &str) -> Value {
    json!({
        "name": name,
        "description": "answers with its version",
        "fields": {"Ask": {"text": "string"}},
        "accepts": ["Ask"],
        "peers": ["collector"],
        "script": script(1),
        "message": "first",
    })
}

struct Server {
    organism: Organism,
    server: ApiServer,
    http: reqwest::Client,
    base: String,
    keys: Vec<(&'static str, String)>,
}

impl Server {
    async fn start(path: &Path) -> Server {
        let organism = Organism::builder().load(path).unwrap();
        let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
            .await
            .unwrap();
        let base = format!("http://{}", server.local_addr());
        Server {
            organism,
            server,
            http: http(),
            base,
            keys: Vec::new(),
        }
    }

    async fn stop(self) {
        self.organism.stop().await;
        self.server.shutdown().await;
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>, as_: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let mut r = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url),
        };
        if let Some((_, k)) = self.keys.iter().find(|(n, _)| *n == as_) {
            r = r.bearer_auth(k);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", path, Some(body), "").await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None, "").await
    }

    /// Injects an `Ask` to `agent`, waits for its thread, and returns the version that
    /// answered.
    async fn ask(&self, agent: &str, text: &str) -> i64 {
        let r = self
            .organism
            .inject(InjectRequest {
                from: "api".into(),
                to: agent.into(),
                payload_xml: format!("<Ask><text>{text}</text></Ask>"),
                thread_id: None,
            })
            .unwrap();
        assert_eq!(
            settle(&self.organism, &r.thread_id).await,
            ThreadStatus::Completed
        );
        answered_by(&self.organism, &r.thread_id)
    }
}

/// The version in the one `Reply` of a thread.
fn answered_by(o: &Organism, thread: &str) -> i64 {
    let log = messages(o, thread);
    let replies: Vec<_> = log
        .iter()
        .filter(|m| m.payload_type.as_deref() == Some("Reply"))
        .collect();
    assert_eq!(replies.len(), 1, "one reply: {log:?}");
    let xml = &*replies[0].payload_xml;
    let v = xml
        .split("<version>")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .unwrap();
    v.parse().unwrap()
}

/// Traffic still flows through the file's own listeners.
async fn still_running(s: &Server) {
    let r = inject(&s.organism, "a", "<Note>alive</Note>", None);
    assert_eq!(
        settle(&s.organism, &r.thread_id).await,
        ThreadStatus::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_deploy_and_roll_back_under_load_lose_and_duplicate_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;

    let (st, created) = s.post("/api/v1/agents", echo_body("echo")).await;
    assert_eq!(st, 201, "{created}");
    assert_eq!(created["version"], 1);
    assert_eq!(created["reload"]["added"], json!(["echo"]));
    assert_eq!(s.ask("echo", "hello").await, 1);

    // Load through every change below: injects as fast as one task makes them, at most 16
    // threads in flight (a backlog would only make the checks below wait behind it).
    let threads = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let (o, threads, running) = (s.organism.clone(), threads.clone(), running.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                let r = o.inject(InjectRequest {
                    from: "api".into(),
                    to: "echo".into(),
                    payload_xml: format!("<Ask><text>load {n}</text></Ask>"),
                    thread_id: None,
                });
                let id = r.expect("accepted").thread_id;
                threads.lock().unwrap().push(id);
                n += 1;
                if n >= 16 {
                    let oldest = threads.lock().unwrap()[n - 16].clone();
                    o.history().wait_thread(&oldest).await;
                }
            }
        })
    };

    let (st, v2) = s
        .post(
            "/api/v1/agents/echo/scripts",
            json!({"script": script(2), "message": "second"}),
        )
        .await;
    assert_eq!(st, 201, "{v2}");
    assert_eq!(
        (v2["version"].as_u64(), v2["live"].as_bool()),
        (Some(2), Some(false))
    );
    assert_eq!(s.ask("echo", "still one").await, 1, "uploaded is not live");

    for (to, expect_from) in [(2, 1), (1, 2), (2, 1)] {
        let (st, d) = s
            .post("/api/v1/agents/echo/deployments", json!({"version": to}))
            .await;
        assert_eq!(st, 201, "{d}");
        assert_eq!(
            (d["version"].as_u64(), d["from_version"].as_u64()),
            (Some(to), Some(expect_from))
        );
        assert_eq!(d["reload"]["changed"], json!(["echo"]));
        assert_eq!(s.ask("echo", "after").await, to as i64, "live at once");
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    load.await.unwrap();

    let all = threads.lock().unwrap().clone();
    assert!(all.len() > 10, "the load ran: {}", all.len());
    for t in &all {
        assert_eq!(settle(&s.organism, t).await, ThreadStatus::Completed, "{t}");
        let v = answered_by(&s.organism, t);
        assert!(v == 1 || v == 2, "{t} answered by {v}");
    }

    let (_, list) = s.get("/api/v1/agents/echo/scripts").await;
    assert_eq!(list["total"], 2);
    assert_eq!(list["items"][0]["version"], 2);
    assert_eq!(list["items"][0]["live"], true);
    assert_eq!(list["items"][1]["message"], "first");
    let (_, source) = s.get("/api/v1/agents/echo/scripts/1").await;
    assert_eq!(source["script"], script(1));
    assert_eq!(source["sha256"].as_str().unwrap().len(), 64);
    let (_, history) = s.get("/api/v1/agents/echo/deployments").await;
    let actions: Vec<&str> = history["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["deploy", "rollback", "deploy", "create"]);

    // The effective organism shows where each listener comes from.
    let (_, config) = s.get("/api/v1/organism/config").await;
    let listeners = config["config"]["listeners"].as_array().unwrap();
    let origin = |n: &str| {
        listeners
            .iter()
            .find(|l| l["name"] == n)
            .map(|l| l["origin"].clone())
            .unwrap()
    };
    assert_eq!(origin("collector"), json!("file"));
    assert_eq!(origin("echo"), json!({"api": {"version": 2}}));
    let (st, one) = s.get("/api/v1/agents/echo/config").await;
    assert_eq!(st, 200);
    assert!(
        one["config"].get("script").is_none(),
        "no server path: {one}"
    );

    // Deleting it is a removal by reload.
    let (st, gone) = s.call("DELETE", "/api/v1/agents/echo", None, "").await;
    assert_eq!(st, 200, "{gone}");
    assert_eq!(gone["reload"]["removed"], json!(["echo"]));
    assert_eq!(s.get("/api/v1/agents/echo").await.0, 404);
    assert_eq!(s.get("/api/v1/agents/echo/scripts").await.0, 404);
    still_running(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn bad_uploads_get_clear_answers_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    let rev = s.get("/api/v1/organism").await.1["config_rev"].clone();

    let with_script = |text: &str| {
        let mut b = echo_body("bad");
        b["script"] = json!(text);
        b
    };
    let big = format!("-- {}\n{}", "x".repeat(300 * 1024), script(1));
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            with_script("function handle(p, meta)\n  return {to = }\nend\n"),
            422,
            "script v1:2",
        ),
        (
            with_script("function init(c) error('boom at init') end\nfunction handle(p, m) end\n"),
            422,
            "boom at init",
        ),
        (
            {
                let mut b = with_script(
                    "function init(c) while true do end end\nfunction handle(p, m) end\n",
                );
                b["limits"] = json!({"cpu_ms": 50, "memory_mb": 16});
                b
            },
            422,
            "init",
        ),
        (with_script(&big), 422, "at most"),
        (with_script("\u{1b}LuaQ\u{0}bytecode"), 422, "bytecode"),
        (echo_body("a"), 409, "exists"),
        (
            {
                let mut b = echo_body("bad");
                b["kind"] = json!("native");
                b
            },
            400,
            "lua",
        ),
        (
            {
                let mut b = echo_body("bad");
                b["surprise"] = json!(1);
                b
            },
            400,
            "surprise",
        ),
        (
            {
                let mut b = echo_body("bad");
                b["peers"] = json!(["nobody"]);
                b
            },
            422,
            "nobody",
        ),
    ];
    for (body, status, says) in cases {
        let (st, e) = s.post("/api/v1/agents", body).await;
        assert_eq!(st, status, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
        assert!(
            s.get("/api/v1/agents/bad").await.0 == 404,
            "nothing was created"
        );
        still_running(&s).await;
    }

    // Versions: a bad upload, a version that does not exist, a stale revision, a file
    // listener.
    let (st, e) = s
        .post(
            "/api/v1/agents/echo/scripts",
            json!({"script": "function handle(\n"}),
        )
        .await;
    assert_eq!(st, 422, "{e}");
    assert!(e.to_string().contains("script v2"), "{e}");
    let (st, e) = s
        .post("/api/v1/agents/echo/deployments", json!({"version": 7}))
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (404, Some("unknown_version"))
    );
    let (st, e) = s
        .post(
            "/api/v1/agents/echo/deployments",
            json!({"version": 1, "if_rev": 999}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("rev_mismatch"))
    );
    let (st, e) = s
        .post("/api/v1/agents/a/scripts", json!({"script": script(1)}))
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("file_listener"))
    );
    let (st, e) = s.call("DELETE", "/api/v1/agents/b", None, "").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("file_listener"))
    );
    let (st, _) = s
        .post(
            "/api/v1/agents/nobody/scripts",
            json!({"script": script(1)}),
        )
        .await;
    assert_eq!(st, 404);

    assert_eq!(
        s.get("/api/v1/organism").await.1["config_rev"],
        rev,
        "no change ran"
    );
    let (_, list) = s.get("/api/v1/agents/echo/scripts").await;
    assert_eq!(list["total"], 1, "refused versions are not kept");
    assert_eq!(s.ask("echo", "fine").await, 1);
    s.stop().await;
}

/// An uploaded agent's XSD, for a payload `Ask`, with `head` before its declarations and
/// `prologue` before the schema element.
fn xsd_body(name: &str, prologue: &str, head: &str) -> Value {
    let mut b = echo_body(name);
    b.as_object_mut().unwrap().remove("fields");
    b["xsd"] = json!(format!(
        r#"{prologue}<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">{head}<xs:element name="Ask"><xs:complexType><xs:sequence><xs:element name="text" type="xs:string"/></xs:sequence></xs:complexType></xs:element></xs:schema>"#
    ));
    b
}

#[tokio::test]
async fn an_uploaded_xsd_can_read_no_file_no_url_and_holds_no_slow_pattern() {
    // The attacker uploads an XSD that would have libxml2 read the operator's schema file
    // (relative or absolute), any file, or a URL when it compiles: by `include`, `import`,
    // `redefine`, `override`, or a DOCTYPE's entities. Each is refused before any compile,
    // on every path an XSD arrives by (a new agent, a new version, a dry run).
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    let theirs = dir.path().join("t.xsd");
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, r#"<xs:element name="Secret" type="xs:string"/>"#).unwrap();
    let (theirs, secret) = (theirs.display(), secret.display());
    let elsewhere = "may not take declarations from another document";
    let doctype = "DOCTYPE";
    let cases = [
        (
            "",
            r#"<xs:include schemaLocation="t.xsd"/>"#.to_string(),
            elsewhere,
        ),
        (
            "",
            format!(r#"<xs:include schemaLocation="{theirs}"/>"#),
            elsewhere,
        ),
        (
            "",
            format!(r#"<xs:include schemaLocation="file://{theirs}"/>"#),
            elsewhere,
        ),
        (
            "",
            r#"<xs:import namespace="urn:x" schemaLocation="http://127.0.0.1:9/x.xsd"/>"#
                .to_string(),
            elsewhere,
        ),
        (
            "",
            r#"<xs:import namespace="urn:x"/>"#.to_string(),
            elsewhere,
        ),
        (
            "",
            format!(r#"<xs:redefine schemaLocation="{theirs}"/>"#),
            elsewhere,
        ),
        (
            "",
            format!(r#"<xs:override schemaLocation="{theirs}"/>"#),
            elsewhere,
        ),
        (
            &*format!(r#"<!DOCTYPE xs:schema [<!ENTITY x SYSTEM "file://{secret}">]>"#),
            r#"<xs:annotation><xs:documentation>&x;</xs:documentation></xs:annotation>"#
                .to_string(),
            doctype,
        ),
        (
            r#"<!DOCTYPE xs:schema [<!ENTITY x "x">]>"#,
            String::new(),
            doctype,
        ),
    ];
    for (prologue, head, says) in &cases {
        let (st, e) = s
            .post("/api/v1/agents", xsd_body("bad", prologue, head))
            .await;
        assert_eq!(st, 422, "{head}: {e}");
        assert!(e.to_string().contains(says), "{head}: {e}");
        assert_eq!(
            s.get("/api/v1/agents/bad").await.0,
            404,
            "nothing was created"
        );
        let version = json!({"script": script(2), "xsd": xsd_body("echo", prologue, head)["xsd"]});
        for route in [
            "/api/v1/agents/echo/scripts",
            "/api/v1/agents/echo/scripts?dry_run=true",
        ] {
            let (st, e) = s.post(route, version.clone()).await;
            assert_eq!(st, 422, "{route} {head}: {e}");
            assert!(e.to_string().contains(says), "{route} {head}: {e}");
        }
        still_running(&s).await;
    }
    // A pattern libxml2 takes up to a second to refuse a value by: each payload sent to
    // the agent would hold a pump thread that long.
    let slow = r#"<xs:simpleType name="t"><xs:restriction base="xs:string"><xs:pattern value="(\w+\s?){1,100}c"/></xs:restriction></xs:simpleType>"#;
    let (st, e) = s.post("/api/v1/agents", xsd_body("bad", "", slow)).await;
    assert_eq!(st, 422, "{e}");
    assert!(e.to_string().contains("repeats a repetition"), "{e}");
    let version = json!({"script": script(2), "xsd": xsd_body("echo", "", slow)["xsd"]});
    let (st, e) = s.post("/api/v1/agents/echo/scripts", version).await;
    assert_eq!(st, 422, "{e}");
    let (_, list) = s.get("/api/v1/agents/echo/scripts").await;
    assert_eq!(list["total"], 1, "no version was kept");
    // A self-contained XSD is taken, and its agent answers.
    assert_eq!(
        s.post("/api/v1/agents", xsd_body("good", "", "")).await.0,
        201
    );
    assert_eq!(s.ask("good", "fine").await, 1);
    s.stop().await;
}

#[tokio::test]
async fn tenants_create_only_their_own_agents_and_talk_only_to_their_own_or_shared() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "auth: {methods: [keys]}\n", "");
    let config = Organism::builder().load_config(&path).unwrap();
    let mut keys = Vec::new();
    for (label, role, tenant) in [
        ("viewer", Role::Viewer, None),
        ("acme", Role::Operator, Some("acme")),
        ("beta", Role::Operator, Some("beta")),
        ("admin", Role::Admin, None),
    ] {
        let (key, row) = agentserver::access::new_key(label, role, tenant, None).unwrap();
        agentserver::access::KeySource::of(&config)
            .unwrap()
            .add(&row)
            .unwrap();
        keys.push((label, key));
    }
    let mut s = Server::start(&path).await;
    s.keys = keys;

    // Each tenant watches /ws: it sees its own agents' `deployment` events only.
    let ws_url = format!("{}/ws", s.base.replacen("http", "ws", 1));
    let mut watch = Vec::new();
    for who in ["acme", "beta"] {
        let mut ws = ws_connect(&ws_url).await;
        let token = s.keys.iter().find(|(n, _)| *n == who).unwrap().1.clone();
        send_json(&mut ws, json!({"cmd": "auth", "token": token})).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        watch.push(ws);
    }
    let (st, _) = s
        .call("POST", "/api/v1/agents", Some(echo_body("x")), "viewer")
        .await;
    assert_eq!(st, 403, "a viewer uploads nothing");
    let (st, made) = s
        .call(
            "POST",
            "/api/v1/agents",
            Some(echo_body("acme-echo")),
            "acme",
        )
        .await;
    assert_eq!(st, 201, "{made}");
    let seen = read_until(&mut watch[0], |v| v["event"] == "deployment").await;
    let d = seen.last().unwrap();
    assert_eq!(
        (
            d["agent"].as_str(),
            d["action"].as_str(),
            d["version"].as_u64()
        ),
        (Some("acme-echo"), Some("create"), Some(1)),
        "{d}"
    );
    assert_eq!(
        (d["ok"].as_bool(), d["author"].as_str()),
        (Some(true), Some("key:acme"))
    );
    // A refused upload is announced too, with the reason.
    let bad = json!({"script": "function handle(\n"});
    let (st, _) = s
        .call(
            "POST",
            "/api/v1/agents/acme-echo/scripts",
            Some(bad),
            "acme",
        )
        .await;
    assert_eq!(st, 422);
    let seen = read_until(&mut watch[0], |v| v["event"] == "deployment").await;
    let d = seen.last().unwrap();
    assert_eq!(
        (d["action"].as_str(), d["ok"].as_bool()),
        (Some("upload"), Some(false)),
        "{d}"
    );
    assert!(
        d["error"].as_str().unwrap_or("").contains("script v2"),
        "{d}"
    );
    let (_, agent) = s
        .call("GET", "/api/v1/agents/acme-echo/config", None, "acme")
        .await;
    assert_eq!(agent["config"]["tenant"], "acme", "{agent}");
    // Another tenant: as if it did not exist.
    for (method, p) in [
        ("GET", "/api/v1/agents/acme-echo/scripts"),
        ("GET", "/api/v1/agents/acme-echo/deployments"),
        ("DELETE", "/api/v1/agents/acme-echo"),
    ] {
        let (st, _) = s.call(method, p, None, "beta").await;
        assert_eq!(st, 404, "{method} {p}");
    }
    let (st, _) = s
        .call(
            "POST",
            "/api/v1/agents/acme-echo/scripts",
            Some(json!({"script": script(2)})),
            "beta",
        )
        .await;
    assert_eq!(st, 404);
    // A name not of its own tenant's: refused in the same words, before it is looked up,
    // whether another tenant's agent has it or nobody does.
    let (_, nobodys) = s
        .call(
            "POST",
            "/api/v1/agents",
            Some(echo_body("acme-new")),
            "beta",
        )
        .await;
    for name in ["acme-echo", "acme-new", "ghost"] {
        let (st, e) = s
            .call("POST", "/api/v1/agents", Some(echo_body(name)), "beta")
            .await;
        assert_eq!(st, 422, "{e}");
        assert!(e.to_string().contains("begins with `beta-`"), "{e}");
        let words = |v: &Value, n: &str| v.to_string().replace(n, "NAME");
        assert_eq!(words(&e, name), words(&nobodys, "acme-new"), "{name}");
    }
    // Naming another tenant, or talking to another tenant's agent.
    let mut other = echo_body("beta-echo");
    other["tenant"] = json!("acme");
    let (st, e) = s.call("POST", "/api/v1/agents", Some(other), "beta").await;
    assert_eq!(st, 400, "{e}");
    let mut nosy = echo_body("beta-echo");
    nosy["peers"] = json!(["acme-echo", "collector"]);
    let (st, e) = s.call("POST", "/api/v1/agents", Some(nosy), "beta").await;
    assert_eq!(st, 422, "{e}");
    assert!(
        e.to_string().contains(
            "`acme-echo` is not a listener of tenant `beta` nor one marked `shared: true`"
        ),
        "{e}"
    );
    // The same words for a name nobody has: no oracle for another tenant's names.
    let mut ghost = echo_body("beta-echo");
    ghost["peers"] = json!(["ghost-echo", "collector"]);
    let (st, e) = s.call("POST", "/api/v1/agents", Some(ghost), "beta").await;
    assert_eq!(st, 422, "{e}");
    assert!(
        e.to_string().contains(
            "`ghost-echo` is not a listener of tenant `beta` nor one marked `shared: true`"
        ),
        "{e}"
    );
    // No line of the operator's file in what a tenant is told.
    assert!(!e.to_string().contains("line "), "{e}");
    // Peers the file did not mark shared are off limits too.
    let mut file_peer = echo_body("beta-echo");
    file_peer["peers"] = json!(["b"]);
    let (st, e) = s
        .call("POST", "/api/v1/agents", Some(file_peer), "beta")
        .await;
    assert_eq!(st, 422, "{e}");
    // What a tenant's change reports names only its own tenant's listeners: never another
    // tenant's, nor the operator's own (a create, a deploy, a delete).
    let (st, made) = s
        .call(
            "POST",
            "/api/v1/agents",
            Some(echo_body("beta-echo")),
            "beta",
        )
        .await;
    assert_eq!(st, 201, "{made}");
    let v2 = json!({"script": script(2)});
    let (st, e) = s
        .call("POST", "/api/v1/agents/beta-echo/scripts", Some(v2), "beta")
        .await;
    assert_eq!(st, 201, "{e}");
    let deploy = json!({"version": 2});
    let (st, deployed) = s
        .call(
            "POST",
            "/api/v1/agents/beta-echo/deployments",
            Some(deploy),
            "beta",
        )
        .await;
    assert_eq!(st, 201, "{deployed}");
    let (st, deleted) = s
        .call("DELETE", "/api/v1/agents/beta-echo", None, "beta")
        .await;
    assert_eq!(st, 200, "{deleted}");
    let named = |answer: &Value| -> Vec<String> {
        ["added", "removed", "changed", "unchanged"]
            .iter()
            .flat_map(|k| answer["reload"][k].as_array().unwrap().clone())
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for (what, answer, own) in [
        ("create", &made, "added"),
        ("deploy", &deployed, "changed"),
        ("delete", &deleted, "removed"),
    ] {
        assert_eq!(
            answer["reload"][own],
            json!(["beta-echo"]),
            "{what}: {answer}"
        );
        let mut names = named(answer);
        names.sort();
        assert_eq!(names, ["beta-echo"], "{what}: {answer}");
    }
    // The organism-wide admin sees and changes every tenant's agents.
    let (st, made) = s
        .call(
            "POST",
            "/api/v1/agents",
            Some(echo_body("root-echo")),
            "admin",
        )
        .await;
    assert_eq!(st, 201, "{made}");
    let mut names = named(&made);
    names.sort();
    assert_eq!(
        names,
        ["a", "acme-echo", "b", "collector", "root-echo"],
        "{made}"
    );
    let (st, _) = s
        .call("GET", "/api/v1/agents/acme-echo/scripts", None, "admin")
        .await;
    assert_eq!(st, 200);
    // Every change is in the audit log with who made it.
    let (_, audit) = s
        .call("GET", "/api/v1/audit?action=POST", None, "admin")
        .await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["who"] == "key:acme"
                && e["target"]
                    .as_str()
                    .unwrap_or("")
                    .contains("/api/v1/agents")),
        "{audit}"
    );
    let (_, history) = s
        .call("GET", "/api/v1/agents/acme-echo/deployments", None, "acme")
        .await;
    assert_eq!(history["items"][0]["author"], "key:acme");
    // Beta's session saw none of acme's events: its first `deployment` is its own refusal.
    let seen = read_until(&mut watch[1], |v| v["event"] == "deployment").await;
    assert!(seen.iter().all(|v| v["agent"] != "acme-echo"), "{seen:?}");
    still_running(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn agents_versions_and_the_live_version_survive_a_restart_and_file_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    let (st, _) = s
        .post("/api/v1/agents/echo/scripts", json!({"script": script(2)}))
        .await;
    assert_eq!(st, 201);
    assert_eq!(
        s.post("/api/v1/agents/echo/deployments", json!({"version": 2}))
            .await
            .0,
        201
    );
    // A reload of the file keeps the API's agents.
    let report = s.organism.reload(None).unwrap();
    assert!(report.unchanged.contains(&"echo".to_string()), "{report:?}");
    assert_eq!(s.ask("echo", "after reload").await, 2);
    s.stop().await;

    let s = Server::start(&path).await;
    assert_eq!(s.ask("echo", "after restart").await, 2);
    let (_, list) = s.get("/api/v1/agents/echo/scripts").await;
    assert_eq!(list["total"], 2);
    // The file now defines a listener of the same name: the reload names both.
    write_files(
        dir.path(),
        "",
        "  - {name: echo, description: from the file, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n",
    );
    let e = s.organism.reload(None).unwrap_err().to_string();
    assert!(
        e.contains("defined in the organism file and was created through the API (version 2)"),
        "{e}"
    );
    assert_eq!(
        s.ask("echo", "still").await,
        2,
        "the running organism is unchanged"
    );
    s.stop().await;
}

/// The real binary, restarted by SIGTERM and by kill -9: the API's agent answers an inject
/// after each, as the user sees it (a reply in its thread), not only in the version list.
#[test]
fn an_api_agent_answers_after_a_sigterm_restart_and_after_kill_9() {
    use common::child::{serve, wait_exit, Running};
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let start = || -> (Running, String) {
        let mut cmd = common::child::agentserver();
        cmd.args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
        serve(cmd, std::process::Stdio::null())
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = http_blocking_free(&rt);
    // Injects an `Ask` to `echo` and waits for the version that answered in its thread.
    let ask = |url: &str| -> i64 {
        rt.block_on(async {
            let r: Value = http
                .post(format!("{url}/api/v1/inject"))
                .json(&json!({"to": "echo", "payload_xml": "<Ask><text>hi</text></Ask>"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let thread = r["thread_id"]
                .as_str()
                .unwrap_or_else(|| panic!("{r}"))
                .to_string();
            wait_until_async("a reply from echo", || async {
                reply_version(&http, url, &thread).await.is_some()
            })
            .await;
            reply_version(&http, url, &thread).await.unwrap()
        })
    };
    let (child, url) = start();
    let (st, body) = rt.block_on(async {
        let r = http
            .post(format!("{url}/api/v1/agents"))
            .json(&echo_body("echo"))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    assert_eq!(st, 201, "{body}");
    assert_eq!(ask(&url), 1);

    // SIGTERM: a clean stop, then a start from the file and the store.
    let mut child = child;
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(wait_exit(&mut child), Some(0));
    let (mut child, url) = start();
    assert_eq!(ask(&url), 1, "after a SIGTERM restart");

    // kill -9: no stop at all.
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (child, url) = start();
    assert_eq!(ask(&url), 1, "after kill -9");
    drop(child);
}

/// The version in the `Reply` of a thread, read through the API, once there is one.
async fn reply_version(http: &reqwest::Client, url: &str, thread: &str) -> Option<i64> {
    let r = http
        .get(format!("{url}/api/v1/threads/{thread}/messages"))
        .send()
        .await
        .ok()?;
    let v: Value = r.json().await.ok()?;
    let reply = v["items"]
        .as_array()?
        .iter()
        .find(|m| m["payload_type"] == "Reply")?;
    reply["payload"]["version"].as_i64()
}

fn http_blocking_free(rt: &tokio::runtime::Runtime) -> reqwest::Client {
    let _guard = rt.enter();
    http()
}

#[tokio::test]
async fn with_a_memory_store_agents_live_for_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("store: o.db", "store: memory");
    std::fs::write(&path, text).unwrap();
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    assert_eq!(s.ask("echo", "in memory").await, 1);
    s.stop().await;
    let s = Server::start(&path).await;
    assert_eq!(
        s.get("/api/v1/agents/echo").await.0,
        404,
        "gone with the process"
    );
    s.stop().await;
}

/// `agentserver agents|scripts …` against a server, as a handler author runs them.
async fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentserver"))
        .args(&args[..1])
        .args(["--url", url])
        .args(&args[1..])
        .env_remove("AGENTSERVER_TOKEN")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_creates_pushes_deploys_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    let d = dir.path();
    let mut spec = echo_body("echo");
    spec.as_object_mut().unwrap().remove("script");
    std::fs::write(d.join("echo.json"), spec.to_string()).unwrap();
    std::fs::write(d.join("v1.lua"), script(1)).unwrap();
    std::fs::write(d.join("v2.lua"), script(2)).unwrap();
    std::fs::write(d.join("bad.lua"), "function handle(\n").unwrap();
    let p = |f: &str| d.join(f).display().to_string();
    let url = &s.base;

    let (code, out, err) = cli(
        url,
        &[
            "agents",
            "create",
            &p("echo.json"),
            "--script",
            &p("v1.lua"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("echo: created, v1 live"), "{out}");
    let (code, out, _) = cli(
        url,
        &["scripts", "push", "echo", &p("v2.lua"), "-m", "louder"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("v2 kept") && out.contains("scripts deploy echo 2"),
        "{out}"
    );
    let (code, out, _) = cli(url, &["scripts", "deploy", "echo", "2"]).await;
    assert_eq!(
        (code, out.trim_end().ends_with(|c: char| c.is_ascii_digit())),
        (0, true),
        "{out}"
    );
    assert!(out.contains("v2 live (was v1)"), "{out}");
    assert_eq!(s.ask("echo", "cli").await, 2);
    let (_, out, _) = cli(url, &["scripts", "list", "echo"]).await;
    let first = out.lines().next().unwrap_or("");
    assert!(
        first.starts_with("v2") && first.contains("live") && first.contains("louder"),
        "{out}"
    );
    let (code, out, _) = cli(url, &["scripts", "rollback", "echo"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("v1 live (was v2)"), "{out}");
    assert_eq!(s.ask("echo", "rolled back").await, 1);
    let (_, out, _) = cli(url, &["scripts", "history", "echo"]).await;
    assert_eq!(out.lines().count(), 3, "{out}");
    let (_, out, _) = cli(url, &["scripts", "show", "echo", "1"]).await;
    assert_eq!(out, script(1));
    let (code, out, _) = cli(url, &["scripts", "--json", "list", "echo"]).await;
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["total"], 2);

    // Test vectors: a passing list exits 0, a failing one 1 with what did not match.
    let case = |v: u32| json!([{"payload": {"text": "t"}, "expect": {"outputs": [{"payload": {"text": "t", "version": v}}]}}]);
    std::fs::write(d.join("pass.json"), case(2).to_string()).unwrap();
    std::fs::write(d.join("fail.json"), case(9).to_string()).unwrap();
    let (code, out, _) = cli(url, &["scripts", "test", "echo", "2", &p("pass.json")]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("case 0: pass completed") && out.contains("1 passed, 0 failed"),
        "{out}"
    );
    // A failing report goes to stdout all the same; the exit code and stderr say it failed.
    let (code, out, err) = cli(url, &["scripts", "test", "echo", "2", &p("fail.json")]).await;
    assert_eq!(code, 1);
    assert!(
        out.contains("case 0: FAIL") && out.contains("outputs[0].payload"),
        "{out}"
    );
    assert!(
        err.contains("1 case(s) of") && err.contains("fail.json"),
        "{err}"
    );
    // The REST body's shape is taken too; a file of neither shape is named.
    std::fs::write(d.join("body.json"), json!({"cases": case(2)}).to_string()).unwrap();
    let (code, out, _) = cli(url, &["scripts", "test", "echo", "2", &p("body.json")]).await;
    assert_eq!(code, 0, "{out}");
    std::fs::write(d.join("odd.json"), json!({"case": []}).to_string()).unwrap();
    let (code, _, err) = cli(url, &["scripts", "test", "echo", "2", &p("odd.json")]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("odd.json") && err.contains("a list of cases"),
        "{err}"
    );
    // A refusal of the cases names the file.
    std::fs::write(d.join("none.json"), "[]").unwrap();
    let (code, _, err) = cli(url, &["scripts", "test", "echo", "2", &p("none.json")]).await;
    assert_eq!(code, 1);
    assert!(err.contains("none.json: refused (400"), "{err}");
    let (code, out, _) = cli(
        url,
        &[
            "scripts",
            "push",
            "echo",
            &p("v2.lua"),
            "--cases",
            &p("pass.json"),
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("would be kept") && out.contains("1 passed"),
        "{out}"
    );

    // Refusals: the server's reasons, exit 1; a file that cannot be read, exit 2.
    let (code, _, err) = cli(url, &["scripts", "push", "echo", &p("bad.lua")]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("422 invalid_agent") && err.contains("script v3"),
        "{err}"
    );
    let (code, _, err) = cli(url, &["scripts", "push", "echo", &p("missing.lua")]).await;
    assert_eq!(code, 2);
    assert!(err.contains("missing.lua"), "{err}");
    let (code, _, err) = cli(url, &["agents", "delete", "collector"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("409 file_listener"), "{err}");
    // A version whose kept cases fail: the refusal names the command's flag.
    let (code, out, _) = cli(
        url,
        &[
            "scripts",
            "push",
            "echo",
            &p("v2.lua"),
            "--cases",
            &p("fail.json"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = cli(url, &["scripts", "deploy", "echo", "3"]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("tests_failed") && err.contains("--force") && !err.contains("force: true"),
        "{err}"
    );
    let (code, out, _) = cli(url, &["agents", "delete", "echo"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("echo: deleted (was v1)"), "{out}");
    s.stop().await;
}

#[tokio::test]
async fn each_tenant_quota_is_enforced_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let quotas = "tenants:\n  default: {max_agents: 1}\n  acme: {max_agents: 2, cpu_ms_max: 200, max_concurrency: 2, max_script_bytes: 2000, max_versions: 2}\n";
    // A quota that is not one is a config error naming it.
    let wrong = write_files(dir.path(), "tenants:\n  acme: {max_agent: 2}\n", "");
    let e = Organism::builder()
        .load_config(&wrong)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tenants") && e.contains("max_agent"), "{e}");
    for key in ["max_active_threads", "max_streams"] {
        let zero = write_files(
            dir.path(),
            &format!("tenants:\n  default: {{{key}: 0}}\n"),
            "",
        );
        let e = Organism::builder()
            .load_config(&zero)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("tenants.default.{key}")) && e.contains("at least 1"),
            "{e}"
        );
    }
    let path = write_files(dir.path(), quotas, "");
    let s = Server::start(&path).await;
    let of = |tenant: &str, name: &str, extra: Value| {
        let mut b = echo_body(name);
        b["tenant"] = json!(tenant);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let refusals = [
        (
            of(
                "acme",
                "x",
                json!({"limits": {"cpu_ms": 500, "memory_mb": 16}}),
            ),
            "tenants.acme.cpu_ms_max (200)",
        ),
        (
            of("acme", "x", json!({"concurrency": 3})),
            "tenants.acme.max_concurrency (2)",
        ),
        (
            of(
                "acme",
                "x",
                json!({"script": format!("-- {}\n{}", "x".repeat(2100), script(1))}),
            ),
            "tenants.acme.max_script_bytes is 2000",
        ),
    ];
    for (body, says) in refusals {
        let (st, e) = s.post("/api/v1/agents", body).await;
        assert_eq!(st, 422, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    assert_eq!(
        s.post("/api/v1/agents", of("acme", "a1", json!({})))
            .await
            .0,
        201
    );
    assert_eq!(
        s.post("/api/v1/agents", of("acme", "a2", json!({})))
            .await
            .0,
        201
    );
    let (st, e) = s.post("/api/v1/agents", of("acme", "a3", json!({}))).await;
    assert_eq!(st, 422);
    assert!(e.to_string().contains("tenants.acme.max_agents"), "{e}");
    assert_eq!(
        s.post("/api/v1/agents", of("beta", "b1", json!({})))
            .await
            .0,
        201
    );
    let (st, e) = s.post("/api/v1/agents", of("beta", "b2", json!({}))).await;
    assert_eq!(st, 422);
    assert!(e.to_string().contains("tenants.default.max_agents"), "{e}");

    // max_versions: the newest two are kept, and always the live one.
    for v in [2, 3] {
        let (st, _) = s
            .post("/api/v1/agents/a1/scripts", json!({"script": script(v)}))
            .await;
        assert_eq!(st, 201);
    }
    let versions = |list: Value| -> Vec<u64> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        versions(s.get("/api/v1/agents/a1/scripts").await.1),
        [3, 2, 1]
    );
    assert_eq!(
        s.post("/api/v1/agents/a1/deployments", json!({"version": 3}))
            .await
            .0,
        201
    );
    assert_eq!(
        s.post("/api/v1/agents/a1/scripts", json!({"script": script(4)}))
            .await
            .0,
        201
    );
    assert_eq!(versions(s.get("/api/v1/agents/a1/scripts").await.1), [4, 3]);
    still_running(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn test_vectors_run_a_version_apart_from_the_live_organism() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    let threads_before = s.organism.threads().list().len();
    let good = json!({"cases": [
        {"payload": {"text": "hi"},
         "expect": {"status": "completed", "outputs": [{"to": "collector", "type": "Reply", "payload": {"text": "hi", "version": 1}}]}},
        {"payload": "<Ask><text>xml</text></Ask>", "expect": {"outputs": [{"payload": {"text": "nope", "version": 1}}]}},
        {"payload": "<Ask><nope/></Ask>", "expect": {"status": "failed"}},
    ]});
    let (st, r) = s.post("/api/v1/agents/echo/scripts/1/test", good).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        (r["passed"].as_u64(), r["failed"].as_u64()),
        (Some(2), Some(1)),
        "{r}"
    );
    assert_eq!(r["cases"][0]["outputs"][0]["to"], json!(["collector"]));
    assert!(
        r["cases"][1]["mismatches"][0]
            .as_str()
            .unwrap()
            .contains("payload"),
        "{r}"
    );
    assert!(
        r["cases"][2]["error"].as_str().unwrap().contains("payload"),
        "{r}"
    );
    assert_eq!(r["cases"][2]["pass"], true, "a failure that was expected");

    // Versions that fail, loop, or send where they may not: each case says so; the live
    // version keeps answering and nothing reached the organism.
    let versions = [
        ("function handle(p, m) error('kaboom') end\n", "kaboom"),
        ("function handle(p, m) while true do end end\n", "cpu"),
        (
            "function handle(p, m) return { to = \"b\", payload = \"<Note>x</Note>\" } end\n",
            "undeliverable",
        ),
    ];
    for (n, (text, says)) in versions.iter().enumerate() {
        let (st, v) = s
            .post("/api/v1/agents/echo/scripts", json!({"script": text}))
            .await;
        assert_eq!(st, 201, "{v}");
        let path = format!("/api/v1/agents/echo/scripts/{}/test", v["version"]);
        let (st, r) = s
            .post(&path, json!({"cases": [{"payload": {"text": "hi"}}]}))
            .await;
        assert_eq!(st, 200, "{r}");
        let case = &r["cases"][0];
        assert_eq!(
            (case["pass"].as_bool(), case["status"].as_str()),
            (Some(false), Some("failed")),
            "{n}: {r}"
        );
        assert!(r.to_string().contains(says), "{says}: {r}");
        assert_eq!(s.ask("echo", "live").await, 1);
    }
    assert_eq!(
        s.organism.threads().list().len(),
        threads_before + versions.len(),
        "only the live checks made threads"
    );

    // Each case says what it cost: CPU time on its sandbox's thread, and the most memory its
    // state held (here a 4 MB string kept while it loops).
    let heavy = "function handle(p, m)\n  local t = string.rep('x', 4000000)\n  local n = 0\n  for i = 1, 20000 do n = n + (i % 7) end\n  return { to = 'collector', payload = { text = tostring(#t + n), version = 9 } }\nend\n";
    let (st, v) = s
        .post("/api/v1/agents/echo/scripts", json!({"script": heavy}))
        .await;
    assert_eq!(st, 201, "{v}");
    let path = format!("/api/v1/agents/echo/scripts/{}/test", v["version"]);
    let (_, r) = s
        .post(
            &path,
            json!({"cases": [{"payload": {"text": "hi"}}, {"payload": "<Nope/>"}]}),
        )
        .await;
    let case = &r["cases"][0];
    assert_eq!(case["status"], "completed", "{r}");
    let cpu = case["cpu_ms"].as_f64().unwrap();
    assert!(
        cpu > 0.0 && cpu <= case["elapsed_ms"].as_f64().unwrap() + 1.0,
        "{r}"
    );
    assert!(case["memory_bytes"].as_u64().unwrap() > 4_000_000, "{r}");
    // A payload refused before the handler ran cost nothing there.
    assert_eq!(
        (&r["cases"][1]["cpu_ms"], &r["cases"][1]["memory_bytes"]),
        (&Value::Null, &Value::Null),
        "{r}"
    );

    for bad in [
        json!({"cases": []}),
        json!({"cases": vec![json!({"payload": "<Ask><text>x</text></Ask>"}); 51]}),
    ] {
        let (st, e) = s.post("/api/v1/agents/echo/scripts/1/test", bad).await;
        assert_eq!(st, 400, "{e}");
    }
    let (st, _) = s
        .post(
            "/api/v1/agents/echo/scripts/99/test",
            json!({"cases": [{"payload": "<Ask><text>x</text></Ask>"}]}),
        )
        .await;
    assert_eq!(st, 404);
    still_running(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn kept_cases_gate_a_deploy_and_a_dry_run_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    assert_eq!(s.post("/api/v1/agents", echo_body("echo")).await.0, 201);
    let expects_v2 = json!([{"payload": {"text": "t"},
        "expect": {"outputs": [{"to": "collector", "payload": {"text": "t", "version": 2}}]}}]);

    // A dry run: checked and tried, nothing kept.
    let (st, r) = s
        .post(
            "/api/v1/agents/echo/scripts?dry_run=true",
            json!({"script": script(3), "cases": expects_v2}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        (
            r["tests"]["failed"].as_u64(),
            r["version"]["version"].as_u64()
        ),
        (Some(1), Some(2)),
        "{r}"
    );
    assert_eq!(
        s.get("/api/v1/agents/echo/scripts").await.1["total"],
        1,
        "nothing kept"
    );

    // Kept with cases that fail: the deploy is refused, unless forced.
    let (st, v) = s
        .post(
            "/api/v1/agents/echo/scripts",
            json!({"script": script(3), "cases": expects_v2}),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, e) = s
        .post("/api/v1/agents/echo/deployments", json!({"version": 2}))
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (422, Some("tests_failed")),
        "{e}"
    );
    assert!(
        e["error"]["details"][0]
            .as_str()
            .unwrap()
            .contains("version"),
        "{e}"
    );
    assert_eq!(s.ask("echo", "still v1").await, 1);
    let (st, _) = s
        .post(
            "/api/v1/agents/echo/deployments",
            json!({"version": 2, "force": true}),
        )
        .await;
    assert_eq!(st, 201);
    assert_eq!(s.ask("echo", "forced").await, 3);

    // Kept with cases that pass: deployed.
    let (st, _) = s
        .post(
            "/api/v1/agents/echo/scripts",
            json!({"script": script(2), "cases": expects_v2}),
        )
        .await;
    assert_eq!(st, 201);
    let (st, d) = s
        .post("/api/v1/agents/echo/deployments", json!({"version": 3}))
        .await;
    assert_eq!(st, 201, "{d}");
    assert_eq!(s.ask("echo", "tested").await, 2);

    // Malformed cases are a 400 naming them.
    let (st, e) = s
        .post(
            "/api/v1/agents/echo/scripts",
            json!({"script": script(2), "cases": [{"payload": 1, "surprise": 2}]}),
        )
        .await;
    assert_eq!(
        (st, e["error"]["where"].as_str()),
        (400, Some("cases")),
        "{e}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_tenants_inject_rate_holds_for_all_its_credentials_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(
        dir.path(),
        "auth: {methods: [keys]}\ntenants:\n  acme: {inject_per_s: 2}\n",
        "",
    );
    let config = Organism::builder().load_config(&path).unwrap();
    let mut keys = Vec::new();
    for (label, tenant) in [
        ("acme-1", Some("acme")),
        ("acme-2", Some("acme")),
        ("beta", Some("beta")),
    ] {
        let (key, row) = agentserver::access::new_key(label, Role::Operator, tenant, None).unwrap();
        agentserver::access::KeySource::of(&config)
            .unwrap()
            .add(&row)
            .unwrap();
        keys.push((label, key));
    }
    let mut s = Server::start(&path).await;
    s.keys = keys;
    for (tenant, name) in [("acme", "acme-echo"), ("beta", "beta-echo")] {
        let mut b = echo_body(name);
        b["tenant"] = json!(tenant);
        let who = if tenant == "acme" { "acme-1" } else { "beta" };
        assert_eq!(s.call("POST", "/api/v1/agents", Some(b), who).await.0, 201);
    }
    let ask = |to: &str| json!({"to": to, "payload": {"text": "x"}});
    // A burst of two for the tenant, whichever of its keys asks; the third is refused.
    let (st1, _) = s
        .call("POST", "/api/v1/inject", Some(ask("acme-echo")), "acme-1")
        .await;
    let (st2, _) = s
        .call("POST", "/api/v1/inject", Some(ask("acme-echo")), "acme-2")
        .await;
    let (st3, e) = s
        .call("POST", "/api/v1/inject", Some(ask("acme-echo")), "acme-1")
        .await;
    assert_eq!((st1, st2, st3), (202, 202, 429), "{e}");
    assert!(e.to_string().contains("tenant `acme`"), "{e}");
    // Another tenant is not held back by it.
    let (st, _) = s
        .call("POST", "/api/v1/inject", Some(ask("beta-echo")), "beta")
        .await;
    assert_eq!(st, 202);
    s.stop().await;
}

#[tokio::test]
async fn hostile_scripts_uploaded_as_versions_fail_their_cases_cleanly_or_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(dir.path(), "", "");
    let s = Server::start(&path).await;
    let mut body = echo_body("echo");
    body["limits"] = json!({"cpu_ms": 50, "memory_mb": 8});
    assert_eq!(s.post("/api/v1/agents", body).await.0, 201);
    // Each either is refused at upload (422) or fails its case with a reason.
    let hostile = [
        "function handle(p, m) local s = string.rep('x', 1e9) end",
        "function handle(p, m) local t = {} for i = 1, 1e8 do t[i] = {i} end end",
        "function handle(p, m) local function f() return f() + 1 end return f() end",
        "function handle(p, m) local s = string.rep('a', 150000) return { xml = tostring(s:find('^.-.-b')) } end",
        "function handle(p, m) for i = 1, 10 do pcall(function() while true do end end) end return nil end",
        "function handle(p, m) load('return 1')() end",
        "function handle(p, m) getmetatable('').__index.upper = function() return 'pwned' end end",
        "function handle(p, m) return { to = 'collector', payload = string.rep('x', 2000000) } end",
        "function handle(p, m) error(string.rep('E', 1000000)) end",
        "local x = os.execute\nfunction handle(p, m) return x('true') end",
        "function init(c) error(string.rep('E', 1000000)) end\nfunction handle(p, m) end",
        "error(string.rep('T', 1000000))\nfunction handle(p, m) end",
    ];
    for script in hostile {
        let (st, v) = s
            .post("/api/v1/agents/echo/scripts", json!({"script": script}))
            .await;
        if st == 422 {
            assert!(
                v.to_string().len() < 64 * 1024,
                "refusals stay bounded: {script}"
            );
            continue;
        }
        assert_eq!(st, 201, "{script}: {v}");
        let path = format!("/api/v1/agents/echo/scripts/{}/test", v["version"]);
        let (st, r) = s
            .post(&path, json!({"cases": [{"payload": {"text": "x"}}]}))
            .await;
        assert_eq!(st, 200, "{script}: {r}");
        assert_eq!(r["cases"][0]["status"], "failed", "{script}: {r}");
        assert!(
            r.to_string().len() < 64 * 1024,
            "answers stay bounded: {script}"
        );
        assert_eq!(s.ask("echo", "alive").await, 1, "after {script}");
    }
    still_running(&s).await;
    s.stop().await;
}

#[tokio::test]
async fn a_tenants_active_threads_are_bounded_and_freed_as_they_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(
        dir.path(),
        "tenants:\n  acme: {max_active_threads: 2}\n",
        "",
    );
    let s = Server::start(&path).await;
    let mut b = echo_body("acme-echo");
    b["tenant"] = json!("acme");
    assert_eq!(s.post("/api/v1/agents", b).await.0, 201);
    assert_eq!(s.post("/api/v1/agents", echo_body("ops-echo")).await.0, 201);
    // Paused, the agent holds its threads active.
    s.organism.control().pause_listener("acme-echo").unwrap();
    let ask = |to: &str| json!({"to": to, "payload": {"text": "x"}});
    let mut threads = Vec::new();
    for _ in 0..2 {
        let (st, r) = s.post("/api/v1/inject", ask("acme-echo")).await;
        assert_eq!(st, 202, "{r}");
        threads.push(r["thread_id"].as_str().unwrap().to_string());
    }
    let (st, e) = s.post("/api/v1/inject", ask("acme-echo")).await;
    assert_eq!(st, 429, "{e}");
    assert_eq!(e["error"]["code"], "too_many_threads");
    assert_eq!(
        e["error"]["message"],
        "tenant `acme` has 2 active threads, its limit (tenants.acme.max_active_threads)"
    );
    // Continuing one of its active threads opens none; listeners of no tenant are not
    // counted.
    let mut cont = ask("acme-echo");
    cont["thread_id"] = json!(threads[0]);
    assert_eq!(s.post("/api/v1/inject", cont).await.0, 202);
    assert_eq!(s.post("/api/v1/inject", ask("ops-echo")).await.0, 202);
    // Once they finish, the tenant may open more.
    s.organism.control().resume_listener("acme-echo").unwrap();
    for t in &threads {
        assert_eq!(settle(&s.organism, t).await, ThreadStatus::Completed);
    }
    assert_eq!(s.post("/api/v1/inject", ask("acme-echo")).await.0, 202);
    s.stop().await;
}

/// A tenant's agents cannot fill the organism's queues for the others: the messages
/// pending in its threads are bounded together (`max_pending_messages`).
#[tokio::test]
async fn a_tenants_pending_messages_are_bounded_and_its_runaway_agent_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_files(
        dir.path(),
        "limits:\n  max_messages_per_thread: 300\ntenants:\n  acme: {max_pending_messages: 20, max_pending_bytes: 100000}\n",
        "",
    );
    let s = Server::start(&path).await;
    let of = |mut body: Value, tenant: &str| {
        body["tenant"] = json!(tenant);
        body
    };
    let fan = json!({
        "name": "acme-fan",
        "description": "answers each message with four to itself",
        "fields": {"Ask": {"text": "string"}},
        "accepts": ["Ask"],
        "peers": ["acme-fan"],
        "script": "function handle(p, meta)\n  local out = {}\n  for i = 1, 4 do\n    out[i] = { to = \"acme-fan\", payload = { text = p.text } }\n  end\n  return out\nend\n",
        "message": "first",
    });
    for body in [
        of(echo_body("acme-echo"), "acme"),
        of(fan, "acme"),
        of(echo_body("beta-echo"), "beta"),
    ] {
        let (st, r) = s.post("/api/v1/agents", body).await;
        assert_eq!(st, 201, "{r}");
    }
    let ask = |to: &str| json!({"to": to, "payload": {"text": "x"}});
    let said = "tenant `acme` has 20 messages pending in its threads, its limit \
                (tenants.acme.max_pending_messages)";

    // Paused, acme's agent holds what it is sent pending: 20 at most, in all its threads.
    s.organism.control().pause_listener("acme-echo").unwrap();
    let mut threads = Vec::new();
    for _ in 0..20 {
        let (st, r) = s.post("/api/v1/inject", ask("acme-echo")).await;
        assert_eq!(st, 202, "{r}");
        threads.push(r["thread_id"].as_str().unwrap().to_string());
    }
    let (st, e) = s.post("/api/v1/inject", ask("acme-echo")).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("too_many_pending")),
        "{e}"
    );
    assert_eq!(e["error"]["message"], said);
    // Another tenant's work goes on meanwhile.
    let (st, r) = s.post("/api/v1/inject", ask("beta-echo")).await;
    assert_eq!(st, 202, "{r}");
    let beta = r["thread_id"].as_str().unwrap().to_string();
    assert_eq!(settle(&s.organism, &beta).await, ThreadStatus::Completed);
    s.organism.control().resume_listener("acme-echo").unwrap();
    for t in &threads {
        assert_eq!(settle(&s.organism, t).await, ThreadStatus::Completed);
    }

    // An agent answering each message with four to itself: its outputs go on up to twice
    // the bound and fail past it, and its thread with them (its budget ends the rest).
    let (st, r) = s.post("/api/v1/inject", ask("acme-fan")).await;
    assert_eq!(st, 202, "{r}");
    let runaway = r["thread_id"].as_str().unwrap().to_string();
    assert_eq!(settle(&s.organism, &runaway).await, ThreadStatus::Error);
    let (_, t) = s.get(&format!("/api/v1/threads/{runaway}")).await;
    assert_eq!(
        t["error"],
        "tenant `acme` has 40 messages pending in its threads, twice its limit \
         (tenants.acme.max_pending_messages: 20)",
        "{t}"
    );
    // Its payloads are bounded by bytes too: one of 150 kB would pass 100 kB.
    let big = json!({"to": "acme-echo", "payload": {"text": "x".repeat(150_000)}});
    let (st, e) = s.post("/api/v1/inject", big.clone()).await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (429, Some("too_many_pending")),
        "{e}"
    );
    let said = e["error"]["message"].as_str().unwrap();
    assert!(
        said.starts_with("tenant `acme` has 0 bytes of payloads pending in its threads; ")
            && said.ends_with("more would pass its limit (tenants.acme.max_pending_bytes: 100000)"),
        "{said}"
    );
    let mut beta_big = big;
    beta_big["to"] = json!("beta-echo");
    assert_eq!(s.post("/api/v1/inject", beta_big).await.0, 202);
    // Its place is free again once its work is done, and beta's was never taken.
    assert_eq!(s.post("/api/v1/inject", ask("acme-echo")).await.0, 202);
    assert_eq!(s.post("/api/v1/inject", ask("beta-echo")).await.0, 202);
    s.stop().await;
}

#[tokio::test]
async fn a_lua_listener_of_the_file_has_its_scripts_as_versions_too() {
    let dir = tempfile::tempdir().unwrap();
    let flua = "  - {name: flua, description: from the file, kind: lua, script: flua.lua, fields: {Ask: {text: string}}, accepts: [Ask], peers: [collector]}\n";
    std::fs::write(dir.path().join("flua.lua"), script(1)).unwrap();
    let path = write_files(dir.path(), "", flua);
    let s = Server::start(&path).await;
    let versions = |v: &Value| -> Vec<(u64, bool)> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["version"].as_u64().unwrap(), i["live"] == true))
            .collect()
    };
    // Its first load is version 1, live.
    let (st, list) = s.get("/api/v1/agents/flua/scripts").await;
    assert_eq!(st, 200, "{list}");
    assert_eq!(versions(&list), [(1, true)]);
    let (_, v1) = s.get("/api/v1/agents/flua/scripts/1").await;
    assert_eq!(v1["script"], script(1));
    assert!(v1["message"].as_str().unwrap().contains("flua.lua"), "{v1}");

    // A reload that changed it, by the organism or by the listener's own reload, is the
    // next; one that did not change it is none.
    std::fs::write(dir.path().join("flua.lua"), script(2)).unwrap();
    s.organism.reload(None).unwrap();
    assert_eq!(s.ask("flua", "x").await, 2);
    s.organism.reload(None).unwrap();
    std::fs::write(dir.path().join("flua.lua"), script(3)).unwrap();
    s.organism.control().reload_listener("flua").unwrap();
    assert_eq!(s.ask("flua", "x").await, 3);
    let (_, list) = s.get("/api/v1/agents/flua/scripts").await;
    assert_eq!(versions(&list), [(3, true), (2, false), (1, false)]);
    let (_, history) = s.get("/api/v1/agents/flua/deployments").await;
    let seen: Vec<(String, Value, Value)> = history["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["action"].as_str().unwrap().to_string(),
                d["version"].clone(),
                d["from_version"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("file".to_string(), json!(3), json!(2)),
            ("file".to_string(), json!(2), json!(1)),
            ("file".to_string(), json!(1), Value::Null),
        ]
    );
    // Its versions are read, not made: the file is its source.
    let (st, e) = s
        .post("/api/v1/agents/flua/deployments", json!({"version": 1}))
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("file_listener"))
    );
    let (st, e) = s
        .post("/api/v1/agents/flua/scripts", json!({"script": script(4)}))
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("file_listener"))
    );
    // A listener that is not Lua has no scripts.
    let (st, e) = s.get("/api/v1/agents/a/scripts").await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("file_listener"))
    );
    s.stop().await;

    // A restart with the same script keeps the history as it was.
    let s = Server::start(&path).await;
    let (_, list) = s.get("/api/v1/agents/flua/scripts").await;
    assert_eq!(versions(&list), [(3, true), (2, false), (1, false)]);
    s.stop().await;
}
