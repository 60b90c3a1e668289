//! Shared set-up for integration tests: a real organism built from YAML in a temp directory,
//! real XSDs, and handlers that let tests observe and hold deliveries.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentserver::listener::{Delivery, FnHandler, Handler, HandlerFuture, Output};
use agentserver::threads::{MessageRecord, MessageStatus, ThreadStatus};
use agentserver::{InjectRequest, Organism, OrganismBuilder};
use tokio::sync::Semaphore;

#[path = "../child/mod.rs"]
pub mod child;
#[allow(unused_imports)]
pub use child::testing::{wait_until, wait_until_async};

pub const TEST_XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Ping"><xs:complexType><xs:sequence>
    <xs:element name="n" type="xs:int"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Pong"><xs:complexType><xs:sequence>
    <xs:element name="n" type="xs:int"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Note" type="xs:string"/>
</xs:schema>"#;

pub const WAIT: Duration = Duration::from_secs(10);

/// Writes `t.xsd` and an organism with `listeners` (YAML list items) and `limits` (YAML body
/// lines, may be empty) into a temp dir, and builds it with `builder`.
pub fn organism_with(
    builder: OrganismBuilder,
    limits: &str,
    scheduling: &str,
    listeners: &str,
) -> (Organism, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).expect("write xsd");
    let limits_block = if limits.trim().is_empty() {
        String::new()
    } else {
        format!("limits:\n{limits}\n")
    };
    let yaml = format!(
        "organism:\n  name: test\n  store: memory\n  scheduling: {scheduling}\n{limits_block}listeners:\n{listeners}\n"
    );
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, yaml).expect("write yaml");
    let organism = builder.load(&path).expect("organism builds");
    (organism, dir)
}

pub fn organism(builder: OrganismBuilder, listeners: &str) -> (Organism, tempfile::TempDir) {
    organism_with(builder, "", "breadth-first", listeners)
}

pub fn ping(n: i64) -> String {
    format!("<Ping><n>{n}</n></Ping>")
}

pub fn inject(
    o: &Organism,
    to: &str,
    xml: &str,
    thread: Option<&str>,
) -> agentserver::InjectReceipt {
    o.inject(InjectRequest {
        from: "api".into(),
        to: to.into(),
        payload_xml: xml.into(),
        thread_id: thread.map(str::to_string),
    })
    .expect("inject accepted")
}

/// Waits (event-driven, with a timeout) for the thread to stop being active.
pub async fn settle(o: &Organism, thread: &str) -> ThreadStatus {
    tokio::time::timeout(WAIT, o.history().wait_thread(thread))
        .await
        .expect("thread settles in time")
        .expect("thread exists")
}

pub fn messages(o: &Organism, thread: &str) -> Vec<MessageRecord> {
    o.history().thread_messages(thread).expect("thread exists")
}

pub fn to_of(m: &MessageRecord) -> &str {
    m.to.as_deref().unwrap_or("")
}

pub fn with_status(ms: &[MessageRecord], status: MessageStatus) -> Vec<MessageRecord> {
    ms.iter().filter(|m| m.status == status).cloned().collect()
}

/// Records every delivery (listener, thread, payload) in order.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<(String, String, String)>>>);

impl Log {
    pub fn handler(&self) -> impl Handler {
        let log = self.clone();
        FnHandler(move |d: Delivery| {
            log.0.lock().unwrap().push((
                d.meta.own_name.to_string(),
                d.meta.thread_id.to_string(),
                d.payload.xml().to_string(),
            ));
            async { Ok(Vec::new()) }
        })
    }

    pub fn entries(&self) -> Vec<(String, String, String)> {
        self.0.lock().unwrap().clone()
    }
}

/// A handler that holds each delivery until the test adds a permit, then records it.
#[derive(Clone)]
pub struct Valve {
    pub permits: Arc<Semaphore>,
    pub log: Log,
}

impl Valve {
    pub fn closed() -> Self {
        Valve {
            permits: Arc::new(Semaphore::new(0)),
            log: Log::default(),
        }
    }

    pub fn open(&self, n: usize) {
        self.permits.add_permits(n);
    }
}

impl Handler for Valve {
    fn handle(&self, d: Delivery) -> HandlerFuture {
        let permits = self.permits.clone();
        let log = self.log.clone();
        Box::pin(async move {
            let permit = permits
                .acquire()
                .await
                .map_err(|e| agentserver::listener::HandlerError(e.to_string()))?;
            permit.forget();
            log.0.lock().unwrap().push((
                d.meta.own_name.to_string(),
                d.meta.thread_id.to_string(),
                d.payload.xml().to_string(),
            ));
            Ok(Vec::<Output>::new())
        })
    }
}

/// Waits until `cond` holds, re-checking on every pump event, with a timeout.
pub async fn until(o: &Organism, mut cond: impl FnMut() -> bool) {
    let mut rx = o.events().subscribe();
    tokio::time::timeout(WAIT, async {
        while !cond() {
            let _ = rx.recv().await;
        }
    })
    .await
    .expect("condition reached in time");
}

/// An organism served by a real API server on 127.0.0.1:0.
pub struct Served {
    pub organism: Organism,
    pub server: agentserver::api::ApiServer,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
}

pub async fn serve_with(
    builder: OrganismBuilder,
    limits: &str,
    listeners: &str,
    options: agentserver::api::ApiOptions,
) -> Served {
    let (organism, dir) = organism_with(builder, limits, "breadth-first", listeners);
    Served::over(organism, dir, options).await
}

/// A three-listener chain a → b → c over `Note`, each forwarding, c a sink.
pub const CHAIN: &str = "  - {name: a, description: first, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b}}
  - {name: b, description: second, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: c}}
  - {name: c, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}";

impl Served {
    /// `organism` (its files in `dir`) served on a port of its own.
    pub async fn over(
        organism: Organism,
        dir: tempfile::TempDir,
        options: agentserver::api::ApiOptions,
    ) -> Served {
        let server = agentserver::api::ApiServer::bind(organism.clone(), "127.0.0.1:0", options)
            .await
            .expect("server binds");
        let base = format!("http://{}", server.local_addr());
        Served {
            organism,
            server,
            base,
            http: http(),
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.replacen("http://", "ws://", 1))
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.http.get(self.url(path)).send().await.expect("GET");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let r = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("GET /metrics");
        r.text().await.expect("body")
    }

    pub async fn inject_note(&self, to: &str, text: &str) -> String {
        let (status, body) = self
            .post(
                "/api/v1/inject",
                serde_json::json!({"to": to, "payload_xml": format!("<Note>{text}</Note>")}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body["thread_id"].as_str().expect("thread_id").to_string()
    }
}

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn ws_connect(url: &str) -> Ws {
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("WebSocket connects");
    ws
}

/// The next JSON text frame (pings and pongs skipped), with a timeout.
pub async fn next_json(ws: &mut Ws) -> serde_json::Value {
    use futures_util::StreamExt;
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("stream open")
            .expect("frame ok");
        if let tokio_tungstenite::tungstenite::Message::Text(t) = frame {
            return serde_json::from_str(t.as_str()).expect("frames are JSON");
        }
    }
}

/// `/ws/messages` frames as a client keeps them: each `message_status` frame folded into its
/// message's frame (when that came before), so that a status a session merged into the
/// message's frame and one it sent apart compare equal.
pub fn fold_statuses(frames: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let mut kept: Vec<serde_json::Value> = Vec::new();
    for f in frames {
        if f["event"] == "message_status" {
            let message = kept
                .iter_mut()
                .rev()
                .find(|m| m["event"] == "message" && m["id"] == f["id"]);
            if let Some(m) = message {
                m["status"] = f["status"].clone();
                m["error"] = f["error"].clone();
                continue;
            }
        }
        kept.push(f);
    }
    kept
}

/// Reads frames until one satisfies `pred`; returns every frame read, the match last.
pub async fn read_until(
    ws: &mut Ws,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    loop {
        let v = next_json(ws).await;
        let done = pred(&v);
        seen.push(v);
        if done {
            return seen;
        }
    }
}

pub async fn send_json(ws: &mut Ws, v: serde_json::Value) {
    use futures_util::SinkExt;
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        v.to_string().into(),
    ))
    .await
    .expect("send");
}

/// A reqwest client the way the crate makes them (`agentserver::outbound`, ring TLS).
pub fn http() -> reqwest::Client {
    agentserver::outbound::http_client()
        .unwrap()
        .build()
        .unwrap()
}

/// `GET url` with [`http`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http().get(url).send().await
}

/// A raw client's three protocol errors on `url` (after its first frame, if any: `first`),
/// each on its own connection: the close code each gets (1009, 1007, 1002 expected).
pub async fn protocol_error_closes(
    url: &str,
    first: Option<serde_json::Value>,
    big: usize,
) -> Vec<Option<u16>> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::Message;
    let oversized = Message::Text("x".repeat(big).into());
    let not_utf8 = Message::Frame(Frame::message(
        vec![0xff, 0xfe, 0xfd],
        OpCode::Data(Data::Text),
        true,
    ));
    let stray_continuation = Message::Frame(Frame::message(
        b"orphan".to_vec(),
        OpCode::Data(Data::Continue),
        true,
    ));
    let mut codes = Vec::new();
    for bad in [oversized, not_utf8, stray_continuation] {
        let mut ws = ws_connect(url).await;
        if let Some(f) = &first {
            send_json(&mut ws, f.clone()).await;
        }
        let _ = ws.send(bad).await;
        let code = tokio::time::timeout(WAIT, async {
            while let Some(m) = ws.next().await {
                match m {
                    Ok(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
                    Ok(_) => continue,
                    Err(_) => return None,
                }
            }
            None
        })
        .await
        .expect("the server closes in time");
        codes.push(code);
    }
    codes
}

/// A refusal for too many failed credentials, as the API and a gateway give it: 429,
/// `Retry-After` between 1 and 60 seconds, code `rate_limited`.
pub fn assert_rate_limited(status: u16, retry_after: Option<&str>, body: &serde_json::Value) {
    assert_eq!(status, 429, "{body}");
    let retry: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
}

/// Keys of `who` (name, role, tenant) added to the key source `config` names; each key's
/// text by its name.
pub fn keys_for(
    config: &agentserver::config::OrganismConfig,
    who: &[(&'static str, agentserver::config::Role, Option<&str>)],
) -> std::collections::HashMap<&'static str, String> {
    let source = agentserver::access::KeySource::of(config).expect("a key source");
    who.iter()
        .map(|(name, role, tenant)| {
            let (key, row) = agentserver::access::new_key(name, *role, *tenant, None).unwrap();
            source.add(&row).unwrap();
            (*name, key)
        })
        .collect()
}
