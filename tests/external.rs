//! External agents (SPEC §11.4) against real HTTP servers on 127.0.0.1:0: the organism's API
//! server, and a stand-in agent (axum) that records what it is sent and answers as told.

mod common;

use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use agentserver::api::ApiOptions;
use agentserver::threads::MessageStatus;
use agentserver::OrganismBuilder;
use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const TOKEN_VAR: &str = "AGENTSERVER_TEST_EXTERNAL_TOKEN";
const TOKEN: &str = "s3cret-token";

fn set_token() {
    static SET: Once = Once::new();
    SET.call_once(|| std::env::set_var(TOKEN_VAR, TOKEN));
}

/// How the stand-in agent answers a delivery.
#[derive(Clone, Copy)]
enum Answer {
    Status(u16),
    /// Answers 200 after this long.
    Slow(Duration),
    /// Answers 500 with a body that never ends.
    Endless,
}

/// A stand-in external agent: every delivery's JSON goes to `seen`.
struct Agent {
    url: String,
    seen: mpsc::UnboundedReceiver<Value>,
    answer: Arc<Mutex<Answer>>,
}

async fn agent(answer: Answer) -> Agent {
    let (tx, seen) = mpsc::unbounded_channel();
    let answer = Arc::new(Mutex::new(answer));
    let how = answer.clone();
    let app = axum::Router::new().route(
        "/in",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let tx = tx.clone();
            let how = *how.lock().unwrap();
            async move {
                let _ = tx.send(body);
                use axum::response::IntoResponse;
                match how {
                    Answer::Status(s) => {
                        (StatusCode::from_u16(s).unwrap(), "agent says no").into_response()
                    }
                    Answer::Slow(d) => {
                        tokio::time::sleep(d).await;
                        (StatusCode::OK, "").into_response()
                    }
                    Answer::Endless => {
                        let chunk =
                            bytes::Bytes::from(format!("overloaded {}", "x".repeat(65_536)));
                        let body = futures_util::stream::repeat_with(move || {
                            Ok::<_, std::convert::Infallible>(chunk.clone())
                        });
                        let body = axum::body::Body::from_stream(body);
                        (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Agent {
        // Credentials and a query in the URL must never be shown.
        url: format!("http://user:pw@{addr}/in?key=hidden"),
        seen,
        answer,
    }
}

impl Agent {
    async fn next(&mut self) -> Value {
        tokio::time::timeout(WAIT, self.seen.recv())
            .await
            .expect("a delivery in time")
            .expect("agent running")
    }
}

/// An organism with `ext` (external, accepts Note) and `after` (a sink for Pong).
/// Waits for `thread` to end in error, and returns its message `id`, which failed.
async fn failed_message(s: &Served, thread: &str, id: &str) -> agentserver::threads::MessageRecord {
    assert_eq!(
        settle(&s.organism, thread).await,
        agentserver::threads::ThreadStatus::Error
    );
    let m = messages(&s.organism, thread)
        .into_iter()
        .find(|m| *m.id == *id)
        .unwrap();
    assert_eq!(m.status, MessageStatus::Failed);
    m
}

async fn served(input_url: &str, extra: &str, limits: &str) -> Served {
    served_by(OrganismBuilder::default(), input_url, extra, limits).await
}

async fn served_by(builder: OrganismBuilder, input_url: &str, extra: &str, limits: &str) -> Served {
    set_token();
    let listeners = format!(
        "  - {{name: ext, description: an agent elsewhere, kind: external, input_url: \"{input_url}\", token_env: {TOKEN_VAR}, schema: t.xsd, accepts: [Note]{extra}}}
  - {{name: after, description: takes replies, kind: native, handler: sink, schema: t.xsd, accepts: [Pong]}}"
    );
    serve_with(builder, limits, &listeners, ApiOptions::default()).await
}

impl Served {
    async fn reply(
        &self,
        agent: &str,
        thread: &str,
        token: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.url(&format!(
                "/api/v1/external/{agent}/threads/{thread}/messages"
            )))
            .header("content-type", "application/xml")
            .body(body.to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("POST callback");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn inject_into(&self, thread: &str) -> String {
        let (status, body) = self
            .post(
                "/api/v1/inject",
                json!({"to": "ext", "payload_xml": "<Note>hello</Note>", "thread_id": thread}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["thread_id"], thread, "the caller's thread id is kept");
        body["message_id"].as_str().unwrap().to_string()
    }

    async fn agent_state(&self, name: &str) -> String {
        let (_, a) = self.get(&format!("/api/v1/agents/{name}")).await;
        a["state"].as_str().unwrap_or_default().to_string()
    }
}

#[tokio::test]
async fn round_trip_forward_then_callback_with_several_payloads_reaches_the_next_listener() {
    let mut agent = agent(Answer::Status(202)).await;
    let s = served(&agent.url, "", "").await;
    let mut ws = ws_connect(&s.ws_url("/ws")).await;
    let asked = s.inject_into("ticket-1").await;

    let got = agent.next().await;
    assert_eq!(got["thread_id"], "ticket-1");
    assert_eq!(got["message_id"], asked.as_str());
    assert_eq!(got["agent"], "ext");
    assert_eq!(got["from"], "api");
    assert_eq!(got["payload_type"], "Note");
    assert_eq!(got["payload"], "hello");
    assert_eq!(got["payload_xml"], "<Note>hello</Note>");
    assert_eq!(
        got["callback_url"],
        s.url("/api/v1/external/ext/threads/ticket-1/messages")
    );

    // Waiting: in the agent's state, in agent_state events, and the thread stays active.
    let frames = read_until(&mut ws, |v| {
        v["event"] == "agent_state" && v["agent"] == "ext" && v["state"] == "waiting"
    })
    .await;
    assert!(!frames.is_empty());
    until(&s.organism, || {
        s.organism.agent("ext").map(|a| a.state).ok()
            == Some(agentserver::events::AgentState::Waiting)
    })
    .await;
    assert_eq!(s.agent_state("ext").await, "waiting");
    let (_, t) = s.get("/api/v1/threads/ticket-1").await;
    assert_eq!(t["status"], "active");

    // A dirty body with two payloads: both enter, as ext's output, children of `asked`.
    let (status, body) = s
        .reply(
            "ext",
            "ticket-1",
            Some(TOKEN),
            "<?xml version=\"1.0\"?>thinking… <Pong><n>1</n></Pong>\n and <Pong><n>2</n></Pong> done",
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["in_reply_to"], asked.as_str());
    assert_eq!(body["payload_types"], json!(["Pong", "Pong"]));
    settle(&s.organism, "ticket-1").await;
    let ms = messages(&s.organism, "ticket-1");
    let pongs: Vec<_> = ms
        .iter()
        .filter(|m| m.payload_type.as_deref() == Some("Pong"))
        .collect();
    assert_eq!(pongs.len(), 2);
    for p in &pongs {
        assert_eq!(&*p.from, "ext");
        assert_eq!(p.to.as_deref(), Some("after"));
        assert_eq!(p.parent_id.as_deref(), Some(asked.as_str()));
        assert_eq!(p.status, MessageStatus::Delivered);
    }
    let (_, t) = s.get("/api/v1/threads/ticket-1").await;
    assert_eq!(t["status"], "completed");
    assert_eq!(s.agent_state("ext").await, "idle");
    read_until(&mut ws, |v| {
        v["event"] == "agent_state" && v["agent"] == "ext" && v["state"] == "idle"
    })
    .await;

    // Answered: a second reply is owed nothing.
    let (status, body) = s
        .reply("ext", "ticket-1", Some(TOKEN), "<Pong><n>3</n></Pong>")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_waiting"))
    );
}

/// A reply for a thread the pump does not hold is looked up in the store: a store that cannot
/// be read answers 503 `store_failed`, not "no such thread", and nothing is taken.
#[tokio::test]
async fn a_reply_the_store_cannot_be_asked_about_is_not_called_unknown() {
    let agent = agent(Answer::Status(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("log.db");
    let overrides = agentserver::pump::Overrides {
        listen: None,
        store: Some(Some(store.clone())),
    };
    let s = served_by(
        OrganismBuilder::default().overrides(overrides),
        &agent.url,
        "",
        "",
    )
    .await;
    let pong = "<Pong><n>1</n></Pong>";
    let conn = rusqlite::Connection::open(&store).unwrap();
    conn.execute_batch("ALTER TABLE threads RENAME TO gone")
        .unwrap();
    let (code, body) = s.reply("ext", "t-elsewhere", Some(TOKEN), pong).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_failed", "{body}");
    conn.execute_batch("ALTER TABLE gone RENAME TO threads")
        .unwrap();
    let (code, body) = s.reply("ext", "t-elsewhere", Some(TOKEN), pong).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_thread", "{body}");
    assert_eq!(s.organism.info().total_messages, 0, "nothing was taken");
}

#[tokio::test]
async fn callbacks_are_refused_with_the_right_status_and_the_wait_survives_bad_ones() {
    let mut agent = agent(Answer::Status(200)).await;
    let s = served(&agent.url, "", "  max_message_bytes: 2048").await;
    s.inject_into("t-refusals").await;
    agent.next().await;
    until(&s.organism, || {
        s.organism.agent("ext").map(|a| a.state).ok()
            == Some(agentserver::events::AgentState::Waiting)
    })
    .await;
    let pong = "<Pong><n>1</n></Pong>";
    // (agent, thread, token, body, status, code)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, String, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("ext", "t-refusals", None, pong.into(), 401, "unauthorized"),
        (
            "ext",
            "t-refusals",
            Some("wrong"),
            pong.into(),
            401,
            "unauthorized",
        ),
        (
            "nobody",
            "t-refusals",
            Some(TOKEN),
            pong.into(),
            404,
            "unknown_agent",
        ),
        // A native listener is not an external agent.
        (
            "after",
            "t-refusals",
            Some(TOKEN),
            pong.into(),
            404,
            "unknown_agent",
        ),
        (
            "ext",
            "no-such-thread",
            Some(TOKEN),
            pong.into(),
            404,
            "unknown_thread",
        ),
        (
            "ext",
            "t-refusals",
            Some(TOKEN),
            format!("<Pong><n>{}</n></Pong>", "1".repeat(3000)),
            413,
            "too_large",
        ),
        (
            "ext",
            "t-refusals",
            Some(TOKEN),
            "just words".into(),
            422,
            "malformed_payload",
        ),
        (
            "ext",
            "t-refusals",
            Some(TOKEN),
            "<Pong><n>1</n></Pong><Pong><n>two</n></Pong>".into(),
            422,
            "invalid_payload",
        ),
        (
            "ext",
            "t-refusals",
            Some(TOKEN),
            "<Unknown/>".into(),
            422,
            "invalid_payload",
        ),
    ];
    for (agent_name, thread, token, body, status, code) in cases {
        let (got, err) = s.reply(agent_name, thread, token, &body).await;
        assert_eq!(
            (got, err["error"]["code"].as_str()),
            (status, Some(code)),
            "{agent_name} {thread} {token:?} {body:.60}: {err}"
        );
        assert!(err["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let (_, err) = s
        .reply(
            "ext",
            "t-refusals",
            Some(TOKEN),
            "<Pong><n>1</n></Pong><Pong><n>two</n></Pong>",
        )
        .await;
    let details = err["error"]["details"].to_string();
    assert!(
        details.contains("payload 2") && details.contains("after"),
        "{details}"
    );
    // Refusals are recorded, and nothing of a refused reply entered the pump.
    assert!(s.metrics().await.contains("kind=\"reply_refused\""));
    assert!(messages(&s.organism, "t-refusals")
        .iter()
        .all(|m| m.payload_type.as_deref() != Some("Pong")));
    // The wait survived every bad callback: a good one is still accepted.
    let (status, body) = s.reply("ext", "t-refusals", Some(TOKEN), pong).await;
    assert_eq!(status, 202, "{body}");
    settle(&s.organism, "t-refusals").await;

    // A thread that exists but owes nothing from ext.
    let (status, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "after", "payload_xml": pong, "thread_id": "t-other"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    settle(&s.organism, "t-other").await;
    let (status, body) = s.reply("ext", "t-other", Some(TOKEN), pong).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_waiting"))
    );
}

#[tokio::test]
async fn failed_forwards_are_recorded_with_the_cause_and_never_show_credentials() {
    // Non-2xx.
    let mut failing = agent(Answer::Status(500)).await;
    let s = served(&failing.url, ", timeout_ms: 300", "").await;
    let mut events = s.organism.events().subscribe();
    let asked = s.inject_into("t-500").await;
    failing.next().await;
    let m = failed_message(&s, "t-500", &asked).await;
    let error = m.error.clone().unwrap();
    assert!(
        error.contains("answered 500") && error.contains("/in"),
        "{error}"
    );
    assert!(
        !error.contains("pw") && !error.contains("hidden"),
        "{error}"
    );
    loop {
        let ev = tokio::time::timeout(WAIT, events.recv())
            .await
            .unwrap()
            .unwrap();
        if let agentserver::events::EventKind::Error { agent, error, .. } = &ev.kind {
            assert_eq!(agent.as_deref(), Some("ext"));
            assert!(
                error.contains("127.0.0.1") && !error.contains("pw"),
                "{error}"
            );
            break;
        }
    }
    assert_ne!(s.agent_state("ext").await, "waiting");

    // An answer that never ends: its first bytes are shown, the rest never read (read
    // whole, it would have taken the minute of timeout_ms and all the memory it could).
    let mut endless = agent(Answer::Endless).await;
    let s2 = served(&endless.url, ", timeout_ms: 60000", "").await;
    let asked = s2.inject_into("t-endless").await;
    endless.next().await;
    let m = failed_message(&s2, "t-endless", &asked).await;
    let error = m.error.clone().unwrap();
    assert!(
        error.contains("answered 500 Internal Server Error: overloaded xxx"),
        "{error}"
    );
    assert!(error.len() < 400, "{error}");

    // Too slow for timeout_ms.
    *failing.answer.lock().unwrap() = Answer::Slow(Duration::from_secs(3));
    s.inject_into("t-slow").await;
    failing.next().await;
    settle(&s.organism, "t-slow").await;
    let error = messages(&s.organism, "t-slow")[0].error.clone().unwrap();
    assert!(error.contains("timed out after 300 ms"), "{error}");

    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = served(&format!("http://{closed}/in"), "", "").await;
    s.inject_into("t-refused").await;
    settle(&s.organism, "t-refused").await;
    let m = &messages(&s.organism, "t-refused")[0];
    assert_eq!(m.status, MessageStatus::Failed);
    let error = m.error.clone().unwrap();
    assert!(error.contains("could not connect"), "{error}");
    // A late callback for a failed forward finds nothing owed.
    let (status, _) = s
        .reply("ext", "t-refused", Some(TOKEN), "<Pong><n>1</n></Pong>")
        .await;
    assert_eq!(status, 409);
}

/// An https endpoint with a self-signed certificate (no system trusts it): completes no
/// handshake, so nothing reaches an HTTP layer.
async fn untrusted_https() -> std::net::SocketAddr {
    use tokio_rustls::rustls;
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = acceptor.accept(tcp).await;
        }
    });
    addr
}

#[tokio::test]
async fn an_https_agent_is_reached_over_tls_and_an_untrusted_certificate_fails_the_forward() {
    let addr = untrusted_https().await;
    let s = served(&format!("https://{addr}/in"), "", "").await;
    s.inject_into("t-tls").await;
    settle(&s.organism, "t-tls").await;
    let m = &messages(&s.organism, "t-tls")[0];
    assert_eq!(m.status, MessageStatus::Failed);
    let error = m.error.clone().unwrap();
    assert!(
        error.contains("could not connect") && error.to_lowercase().contains("certificate"),
        "{error}"
    );
}

#[tokio::test]
async fn a_reply_not_received_in_time_fails_the_wait_and_a_late_one_is_refused() {
    let mut agent = agent(Answer::Status(200)).await;
    let s = served(&agent.url, ", reply_timeout: 300ms", "").await;
    let asked = s.inject_into("t-late").await;
    agent.next().await;
    let m = failed_message(&s, "t-late", &asked).await;
    assert!(
        m.error.as_deref().unwrap_or("").contains("reply timeout"),
        "{m:?}"
    );
    let (_, t) = s.get("/api/v1/threads/t-late").await;
    assert!(
        t["error"].as_str().unwrap_or("").contains("reply timeout"),
        "{t}"
    );
    assert_eq!(s.agent_state("ext").await, "idle");
    let (status, body) = s
        .reply("ext", "t-late", Some(TOKEN), "<Pong><n>1</n></Pong>")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_waiting"))
    );
}

#[tokio::test]
async fn killing_a_waiting_thread_refuses_the_late_reply() {
    let mut agent = agent(Answer::Status(200)).await;
    let s = served(&agent.url, "", "").await;
    s.inject_into("t-kill").await;
    agent.next().await;
    until(&s.organism, || {
        s.organism.agent("ext").map(|a| a.state).ok()
            == Some(agentserver::events::AgentState::Waiting)
    })
    .await;
    let (status, _) = s.post("/api/v1/threads/t-kill/kill", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(s.agent_state("ext").await, "idle");
    let (status, body) = s
        .reply("ext", "t-kill", Some(TOKEN), "<Pong><n>1</n></Pong>")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("thread_killed"))
    );
}

#[tokio::test]
async fn caller_chosen_thread_ids_are_kept_and_invalid_ones_refused() {
    let agent = agent(Answer::Status(200)).await;
    let s = served(&agent.url, "", "").await;
    let (status, body) = s
        .post(
            "/api/v1/inject",
            json!({"to": "after", "payload_xml": "<Pong><n>1</n></Pong>", "thread_id": "ui_Shared-42"}),
        )
        .await;
    assert_eq!(
        (status, body["thread_id"].as_str()),
        (202, Some("ui_Shared-42"))
    );
    for bad in ["has space", "slash/no", &"x".repeat(129), ""] {
        let (status, body) = s
            .post(
                "/api/v1/inject",
                json!({"to": "after", "payload_xml": "<Pong><n>1</n></Pong>", "thread_id": bad}),
            )
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_thread_id");
    }
}

#[tokio::test]
async fn removing_a_waiting_agent_by_reload_fails_what_it_owed() {
    let mut agent = agent(Answer::Status(200)).await;
    let s = served(&agent.url, "", "").await;
    let asked = s.inject_into("t-removed").await;
    agent.next().await;
    until(&s.organism, || {
        s.organism.agent("ext").map(|a| a.state).ok()
            == Some(agentserver::events::AgentState::Waiting)
    })
    .await;
    // Rewrite the organism without `ext`.
    let path = s.organism.config().source.clone().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.contains("name: ext")).collect();
    std::fs::write(&path, kept.join("\n")).unwrap();
    let r = s.organism.reload(None).unwrap();
    assert_eq!(r.removed, vec!["ext".to_string()]);
    let m = failed_message(&s, "t-removed", &asked).await;
    assert!(m.error.unwrap().contains("removed by a reload"));
    let (status, body) = s
        .reply("ext", "t-removed", Some(TOKEN), "<Pong><n>1</n></Pong>")
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_agent"))
    );
}
