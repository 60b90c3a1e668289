//! Clients of a running server, for the `tail` and `inject` commands, `agents` and
//! `scripts` (`agents.rs`), and anyone embedding.

pub mod agents;
mod follow;
pub mod inputs;
pub mod keys;
pub mod stream;
pub mod threads;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::outbound::{self, Frame, OpenError};
use serde_json::Value;

use crate::InjectReceipt;

/// What went wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("`{0}` is not an http:// or https:// URL")]
    BadUrl(String),
    #[error("{0}")]
    Tls(String),
    #[error("cannot reach {url}: {message}")]
    Connect { url: String, message: String },
    #[error("the server answered {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("the server ended the stream{0}")]
    Ended(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// An error with its causes (`error sending request: … : Connection refused`): reqwest's
/// own text leaves out why.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
        source = cause.source();
    }
    text
}

/// Why a connection failed, with what to do about a certificate the client refused.
fn connect_failure(e: &dyn std::error::Error) -> String {
    let text = with_causes(e);
    let hint = if text.contains("UnknownIssuer") {
        "the server's certificate is not signed by a root this client trusts: pass the PEM file of its CA (or of the certificate itself) with --ca-cert"
    } else if text.contains("CaUsedAsEndEntity") {
        "the server presents a CA certificate as its own; it needs a leaf certificate (basicConstraints CA:FALSE), e.g. openssl req -x509 … -addext basicConstraints=critical,CA:FALSE"
    } else if text.contains("NotValidForName") {
        "the server's certificate does not name the host in --url"
    } else if text.contains("certificate") {
        "the server's certificate was refused; for a private or self-signed certificate, pass its PEM file with --ca-cert"
    } else {
        return text;
    };
    format!("{text} ({hint})")
}

fn base(url: &str) -> Result<&str, ClientError> {
    let trimmed = url.trim_end_matches('/');
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        Ok(trimmed)
    } else {
        Err(ClientError::BadUrl(url.to_string()))
    }
}

/// A running server as a client reaches it: its URL (`http://` or `https://`), the
/// credential it presents, and the TLS roots it trusts (the system's, plus a `--ca-cert`
/// file for a server with a private or self-signed certificate).
pub struct Remote {
    base: String,
    token: Option<String>,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
    http: reqwest::Client,
}

impl Remote {
    pub fn new(
        url: &str,
        token: Option<&str>,
        ca_cert: Option<&Path>,
    ) -> Result<Remote, ClientError> {
        let base = base(url)?.to_string();
        let extra = match ca_cert {
            Some(path) => crate::outbound::read_roots(path).map_err(ClientError::Tls)?,
            None => Vec::new(),
        };
        let tls = crate::outbound::tls_config(&extra).map_err(ClientError::Tls)?;
        let http = crate::outbound::http_client_with(tls.clone())
            .build()
            .map_err(|e| ClientError::Tls(with_causes(&e)))?;
        Ok(Remote {
            base,
            token: token.map(str::to_string),
            tls,
            http,
        })
    }

    /// The server's URL, without a trailing slash.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// One request to `path` (`/api/v1/…`) with a JSON body, if any; the JSON answer of a
    /// 2xx, else [`ClientError::Refused`] with the server's answer.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        self.call_with(method, path, body, &[]).await
    }

    /// [`Remote::call`] with these request headers.
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, ClientError> {
        let endpoint = format!("{}{path}", self.base);
        let mut request = match method {
            "GET" => self.http.get(&endpoint),
            "DELETE" => self.http.delete(&endpoint),
            _ => self.http.post(&endpoint),
        };
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = match body {
            Some(b) => request.json(&b),
            None => request,
        };
        let response = self
            .authorized(request)
            .send()
            .await
            .map_err(|e| ClientError::Connect {
                url: endpoint.clone(),
                message: connect_failure(&e),
            })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let body = outbound::body_start(response, REFUSAL_BYTES).await;
            return Err(ClientError::Refused { status, body });
        }
        answer_json(response).await
    }

    /// `request` with `Authorization: Bearer <token>` when there is a token.
    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }
}

/// A server's answer the client reads, at most: far above any page the server sends (16 MiB)
/// and a message of any `max_message_bytes` in use; a server that sends more is refused, not
/// held.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Of a refusal's body, the client reads (and shows) at most this much.
pub const REFUSAL_BYTES: usize = 64 * 1024;

/// A 2xx answer's JSON, read at most [`MAX_ANSWER_BYTES`]; an answer too large or not JSON
/// is [`ClientError::Refused`], saying so (with its start, if not JSON).
async fn answer_json(response: reqwest::Response) -> Result<Value, ClientError> {
    let status = response.status().as_u16();
    let refused = |body| ClientError::Refused { status, body };
    let bytes = outbound::body_at_most(response, MAX_ANSWER_BYTES)
        .await
        .map_err(refused)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        let start = crate::clip::clip(String::from_utf8_lossy(&bytes).into_owned(), 600);
        refused(format!("{start} (not the JSON expected: {e})"))
    })
}

/// How a client command reaches a running server (`--url`, `--token`, `--ca-cert`).
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// The server (`http://…`, or `https://…` for one with `organism.tls`).
    #[arg(long, default_value = DEFAULT_URL)]
    pub url: String,
    /// An API key or JWT, for a server with `auth.methods`.
    #[arg(long, env = "AGENTSERVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM file of certificates to trust besides the system's, for an `https://` server
    /// with a private or self-signed certificate.
    #[arg(long, env = "AGENTSERVER_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
}

/// Where the client commands look for a server by default.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8765";

impl ServerArgs {
    pub fn remote(&self) -> Result<Remote, ClientError> {
        Remote::new(&self.url, self.token.as_deref(), self.ca_cert.as_deref())
    }
}

/// `tail` filters; each maps to a `/ws/messages` query parameter.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TailFilter {
    /// Only messages from or to agents matching this glob (`shout*`).
    #[arg(long)]
    pub agent: Option<String>,
    /// Only this thread: its history first, then live (its event stream).
    #[arg(long)]
    pub thread: Option<String>,
    /// Only this payload type (`Local` or `{namespace}Local`).
    #[arg(long = "type")]
    pub payload_type: Option<String>,
    /// Only threads with this label, `KEY:VALUE` (`KEY:V1,V2` for either); repeatable, all
    /// must hold (sent as a `subscribe` command: the query string does not carry them).
    #[arg(long = "label", value_name = "KEY:VALUE")]
    pub labels: Vec<String>,
}

impl TailFilter {
    /// The `subscribe` command that asks for this filter, labels included.
    fn subscribe(&self) -> Value {
        fn list(v: &Option<String>) -> Vec<&str> {
            v.as_deref()
                .map(|s| s.split(',').collect())
                .unwrap_or_default()
        }
        serde_json::json!({
            "cmd": "subscribe",
            "request_id": "tail",
            "agents": list(&self.agent),
            "threads": list(&self.thread),
            "payload_types": list(&self.payload_type),
            "label": self.labels,
        })
    }
}

/// A `/ws` command's `error` frame as the client's error: its status, words and place.
fn refused_command(frame: &Value) -> ClientError {
    let words = frame["error"]
        .as_str()
        .or_else(|| frame["message"].as_str())
        .unwrap_or("the command was refused");
    ClientError::Refused {
        status: frame["status"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(400),
        body: format!("{words} (at {})", frame["where"]),
    }
}

fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'*' | b'?' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `--label KEY=VALUE` arguments (`inject`, `threads fork`) as labels; what is wrong with the
/// first that is not one.
pub fn label_args(labels: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    labels
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(format!("--label `{l}` is not KEY=VALUE")),
        })
        .collect()
}

/// The `/ws/messages` URL for a server URL and filters.
pub fn tail_url(url: &str, f: &TailFilter) -> Result<String, ClientError> {
    let base = base(url)?;
    let mut q = Vec::new();
    if let Some(a) = &f.agent {
        q.push(format!("agents={}", encode(a)));
    }
    if let Some(t) = &f.thread {
        q.push(format!("threads={}", encode(t)));
    }
    if let Some(p) = &f.payload_type {
        q.push(format!("payload_types={}", encode(p)));
    }
    // `http://…` → `ws://…`, `https://…` → `wss://…`.
    let ws = format!("ws{}", &base["http".len()..]);
    Ok(if q.is_empty() {
        format!("{ws}/ws/messages")
    } else {
        format!("{ws}/ws/messages?{}", q.join("&"))
    })
}

/// One readable line for a `/ws/messages` frame; `None` for frames that are neither a
/// message nor a message's status change. A message shows its full thread id (what
/// `inject --thread` takes), then its status change a line of its own:
/// `time thread #slot from -> to Type [status]`.
pub fn tail_line(frame: &Value) -> Option<String> {
    let s = |k: &str| frame.get(k).and_then(Value::as_str).unwrap_or("");
    let event = s("event");
    if event != "message" && event != "message_status" {
        return None;
    }
    let time = s("timestamp").get(11..23).unwrap_or("");
    let to = frame.get("to").and_then(Value::as_str).unwrap_or("(none)");
    let ty = s("payload_type");
    let ty = crate::xml::local_of(ty);
    let mut line = format!(
        "{time} {thread} #{slot:<3} {from} -> {to} {ty} [{status}]",
        thread = s("thread_id"),
        slot = frame.get("slot_index").and_then(Value::as_u64).unwrap_or(0),
        from = s("from"),
        status = s("status"),
    );
    if event == "message" {
        line.push(' ');
        line.push_str(
            &frame
                .get("payload")
                .map(Value::to_string)
                .unwrap_or_default(),
        );
    }
    if let Some(e) = frame.get("error").and_then(Value::as_str) {
        line.push_str(&format!(" error: {e}"));
    }
    Some(line)
}

/// What a refused credential's status means, and what to do.
fn refused_credential(status: u16) -> &'static str {
    match status {
        401 => "the credential was refused (unknown, revoked, expired or mistyped); pass a valid one with --token KEY or AGENTSERVER_TOKEN",
        403 => "the credential's role may not read this stream",
        _ => "too many failed credentials from this address; wait a minute",
    }
}

/// Without a token: says at once when the server needs one (a stream would wait for a
/// credential in its first frame, as a browser sends it), rather than after its timeout.
async fn needs_no_credential(remote: &Remote) -> Result<(), ClientError> {
    match remote.call("GET", "/api/v1/me", None).await {
        Err(ClientError::Refused { status: 401, .. }) => Err(ClientError::Refused {
            status: 401,
            body: "this server needs a credential: pass --token KEY, or set AGENTSERVER_TOKEN"
                .into(),
        }),
        _ => Ok(()),
    }
}

/// Streams `/ws/messages` to `out`, one line per message and per status change (or the raw
/// JSON frames with `json`); with a thread, that thread's event stream, its history first. Notices (`dropped`, `resync_required`) go to stderr. Ends with
/// [`ClientError::Ended`] when the server ends the stream (it stopped, or went away).
pub async fn tail(
    remote: &Remote,
    filter: &TailFilter,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), ClientError> {
    if remote.token.is_none() {
        needs_no_credential(remote).await?;
    }
    // One thread: its history first, then live.
    if let Some(thread) = &filter.thread {
        return follow::follow(remote, thread, filter, json, out).await;
    }
    let ws_url = tail_url(remote.url(), filter)?;
    let mut socket = outbound::websocket(&ws_url, remote.token.as_deref(), remote.tls.clone())
        .await
        .map_err(|e| match e {
            OpenError::Status(status @ (401 | 403 | 429)) => ClientError::Refused {
                status,
                body: refused_credential(status).into(),
            },
            OpenError::Status(status) => ClientError::Connect {
                url: ws_url.clone(),
                message: format!("the server answered the upgrade with HTTP {status}"),
            },
            OpenError::Failed(e) => ClientError::Connect {
                url: ws_url.clone(),
                message: connect_failure(&*e),
            },
        })?;
    if let Some(globs) = &filter.agent {
        for glob in unmatched_agent_globs(remote, globs).await {
            eprintln!("agentserver tail: {glob}");
        }
    }
    // Labels are asked for by a command: until the server acknowledges it, the frames are
    // those of the connection's first filter and are not shown.
    let mut subscribing = !filter.labels.is_empty();
    if subscribing {
        let ask = filter.subscribe().to_string();
        socket
            .send_text(ask)
            .await
            .map_err(|e| ClientError::Ended(format!(" ({})", with_causes(&*e))))?;
    }
    while let Some(frame) = socket.next().await {
        let text = match frame {
            Frame::Text(t) => t,
            Frame::Closed(reason) if reason.is_empty() => {
                return Err(ClientError::Ended(String::new()))
            }
            Frame::Closed(reason) => return Err(ClientError::Ended(format!(" ({reason})"))),
            Frame::Failed(e) => return Err(ClientError::Ended(format!(" ({})", with_causes(&*e)))),
        };
        if subscribing {
            let value = serde_json::from_str::<Value>(text.as_str()).unwrap_or(Value::Null);
            let ours = value.get("request_id").and_then(Value::as_str) == Some("tail");
            match value.get("event").and_then(Value::as_str) {
                Some("ack") if ours => {
                    subscribing = false;
                    eprintln!(
                        "agentserver tail: following threads labelled {}",
                        filter.labels.join(" and ")
                    );
                    continue;
                }
                // The labels were refused: nothing this connection sends is what was asked.
                Some("error") if ours => {
                    if json {
                        writeln!(out, "{}", text.as_str())?;
                    }
                    return Err(refused_command(&value));
                }
                // Another error is shown as any error is.
                Some("error") => {}
                _ => continue,
            }
        }
        if json {
            writeln!(out, "{}", text.as_str())?;
            out.flush()?;
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else {
            continue;
        };
        match tail_line(&value) {
            Some(line) => {
                writeln!(out, "{line}")?;
                out.flush()?;
            }
            None => match value.get("event").and_then(Value::as_str) {
                Some("error") => return Err(refused_command(&value)),
                Some("dropped") => eprintln!(
                    "agentserver tail: {} message frame(s) dropped (seq {} to {}): this terminal is too slow",
                    value["count"], value["from_seq"], value["to_seq"]
                ),
                Some("resync_required") => {
                    eprintln!("agentserver tail: the server asked for a resync")
                }
                _ => {}
            },
        }
    }
    Err(ClientError::Ended(String::new()))
}

/// Warnings for the `--agent` globs (comma-separated) that match no listener of the server
/// and no injector identity (`api`, `ws`, `cli`, `system`): such a filter shows nothing until
/// a reload adds a listener it matches. A server whose agents cannot be read (within 5 s)
/// gets no warning.
async fn unmatched_agent_globs(remote: &Remote, globs: &str) -> Vec<String> {
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), agent_names(remote));
    let Some(names) = read.await.ok().flatten() else {
        return Vec::new();
    };
    let known = || {
        names
            .iter()
            .map(String::as_str)
            .chain(crate::config::INJECTOR_NAMES)
    };
    globs
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty() && !known().any(|n| crate::threads::glob_match(g, n)))
        .map(|g| {
            format!(
                "no agent matches `{g}` (agents: {}; `*` matches any run of characters, `?` any one, the rest is literal); waiting for one",
                names.join(", ")
            )
        })
        .collect()
}

/// The names of a server's agents (`GET /api/v1/agents`, every page), or `None` if they
/// cannot be read.
async fn agent_names(remote: &Remote) -> Option<Vec<String>> {
    const PAGE: usize = 1000;
    let mut names = Vec::new();
    loop {
        let endpoint = format!(
            "{}/api/v1/agents?limit={PAGE}&offset={}",
            remote.url(),
            names.len()
        );
        let response = remote
            .authorized(remote.http.get(&endpoint))
            .send()
            .await
            .ok()?;
        let page = answer_json(response).await.ok()?;
        let items = page.get("items")?.as_array()?;
        names.extend(
            items
                .iter()
                .filter_map(|a| a.get("name")?.as_str().map(str::to_string)),
        );
        let total = page.get("total")?.as_u64()? as usize;
        if items.is_empty() || names.len() >= total {
            return Some(names);
        }
    }
}

/// An inject as the client sends it: the body of `POST /api/v1/inject` (the API's
/// document says what each field means).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InjectBody {
    pub to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_xml: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// Sent as the `Idempotency-Key` header: a retry with the same key runs once.
    #[serde(skip)]
    pub idempotency_key: Option<String>,
    /// Labels for its thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

/// Posts one inject to a running server.
pub async fn inject(remote: &Remote, body: &InjectBody) -> Result<InjectReceipt, ClientError> {
    let v = post_inject(remote, body, None).await?;
    Ok(InjectReceipt {
        thread_id: Arc::from(v["thread_id"].as_str().unwrap_or_default()),
        message_id: Arc::from(v["message_id"].as_str().unwrap_or_default()),
    })
}

/// Posts one inject and waits (up to `seconds`, at most 60) for its thread to be no longer
/// active: the server's answer, `{thread_id, message_id, thread_status, messages}`.
pub async fn inject_and_wait(
    remote: &Remote,
    body: &InjectBody,
    seconds: u64,
) -> Result<Value, ClientError> {
    post_inject(remote, body, Some(seconds)).await
}

async fn post_inject(
    remote: &Remote,
    body: &InjectBody,
    wait: Option<u64>,
) -> Result<Value, ClientError> {
    let path = match wait {
        Some(w) => format!("/api/v1/inject?wait={w}"),
        None => "/api/v1/inject".to_string(),
    };
    let json = serde_json::to_value(body).map_err(|e| ClientError::Io(std::io::Error::other(e)))?;
    let key = body
        .idempotency_key
        .as_deref()
        .map(|k| ("Idempotency-Key", k));
    remote
        .call_with("POST", &path, Some(json), key.as_slice())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refused_certificates_say_what_to_do() {
        let said = |cause: &str| connect_failure(&std::io::Error::other(cause.to_string()));
        assert!(said("invalid peer certificate: UnknownIssuer").contains("--ca-cert"));
        assert!(said("invalid peer certificate: Other(CaUsedAsEndEntity)").contains("CA:FALSE"));
        assert!(said("invalid peer certificate: NotValidForName").contains("does not name"));
        assert_eq!(said("Connection refused"), "Connection refused");
    }

    #[test]
    fn tail_urls_carry_filters_and_lines_read_well() {
        let f = TailFilter {
            agent: Some("shout*".into()),
            thread: None,
            payload_type: Some("{urn:x}A b".into()),
            labels: Vec::new(),
        };
        assert_eq!(
            tail_url("http://127.0.0.1:1/", &f).unwrap(),
            "ws://127.0.0.1:1/ws/messages?agents=shout*&payload_types=%7Burn%3Ax%7DA%20b"
        );
        assert_eq!(
            tail_url("https://h:8/", &TailFilter::default()).unwrap(),
            "wss://h:8/ws/messages"
        );
        assert!(tail_url("ftp://x", &f).is_err());
        assert!(tail_url("httpx://x", &f).is_err());
        let line = tail_line(&json!({
            "event": "message", "timestamp": "2026-01-15T10:30:01.123Z", "thread_id": "0123456789abcdef",
            "slot_index": 2, "from": "greeter", "to": "shouter", "payload_type": "{urn:x}Shouted",
            "status": "delivered", "payload": {"message": "HI"}
        }))
        .unwrap();
        assert_eq!(
            line,
            "10:30:01.123 0123456789abcdef #2   greeter -> shouter Shouted [delivered] {\"message\":\"HI\"}"
        );
        let status = tail_line(&json!({
            "event": "message_status", "timestamp": "2026-01-15T10:30:01.200Z", "thread_id": "0123456789abcdef",
            "id": "m", "slot_index": 2, "from": "greeter", "to": "shouter", "payload_type": "Shouted",
            "status": "failed", "error": "boom"
        }))
        .unwrap();
        assert_eq!(
            status,
            "10:30:01.200 0123456789abcdef #2   greeter -> shouter Shouted [failed] error: boom"
        );
        assert!(tail_line(&json!({"event": "connected"})).is_none());
    }
}
