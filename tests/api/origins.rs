//! What a web page in the operator's browser cannot make a loopback server do: cross-origin
//! WebSocket upgrades and control requests, form and text bodies, rebound host names.
//! A real server on 127.0.0.1:0, real HTTP and WebSocket clients sending browser headers.

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

struct Server {
    organism: Organism,
    base: String,
    addr: std::net::SocketAddr,
    _server: ApiServer,
    _dir: tempfile::TempDir,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("organism.yaml");
    std::fs::write(
        &path,
        format!(
            "organism:\n  name: test\n  store: memory\n  allowed_origins: ['http://dash.example:3000']\n  allowed_hosts: ['agents.example']\nlisteners:\n{CHAIN}\n"
        ),
    )
    .unwrap();
    let organism = Organism::builder().load(&path).unwrap();
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let addr = server.local_addr();
    Server {
        organism,
        base: format!("http://{addr}"),
        addr,
        _server: server,
        _dir: dir,
    }
}

/// A request with the given headers; the status and the JSON body.
async fn send(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Value) {
    let mut r = http().request(method, format!("{}{path}", s.base));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(b) = body {
        r = r.body(b.to_string());
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn ws_at(s: &Server, path: &str, headers: &[(&str, &str)]) -> Result<(), (u16, String)> {
    let mut req = format!("ws://{}{path}", s.addr)
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok(_) => Ok(()),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).to_string())
                .unwrap_or_default();
            Err((resp.status().as_u16(), body))
        }
        Err(e) => panic!("{e}"),
    }
}

async fn ws_with(s: &Server, headers: &[(&str, &str)]) -> Result<(), (u16, String)> {
    ws_at(s, "/ws", headers).await
}

#[tokio::test]
async fn cross_origin_websocket_upgrades_are_refused_and_others_pass() {
    let s = server().await;
    let own = format!("http://{}", s.addr);
    for path in ["/ws", "/ws/messages"] {
        let (code, body) = ws_at(&s, path, &[("origin", "http://evil.example")])
            .await
            .unwrap_err();
        assert_eq!(code, 403, "{path}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "cross_origin");
        assert_eq!(body["error"]["where"], "Origin");
    }
    let (code, body) = ws_with(&s, &[("origin", "null")]).await.unwrap_err();
    assert_eq!(code, 403, "{body}");
    ws_with(&s, &[]).await.expect("no Origin: not a browser");
    ws_with(&s, &[("origin", &own)]).await.expect("same origin");
    ws_with(&s, &[("origin", "http://dash.example:3000")])
        .await
        .expect("a listed origin");
    assert_eq!(
        s.organism.status(),
        agentserver::events::OrganismStatus::Running
    );
}

#[tokio::test]
async fn control_posts_a_page_could_send_cross_site_are_refused() {
    let s = server().await;
    let post = reqwest::Method::POST;
    // A form POST, a text/plain fetch and a typeless body: what a page sends without asking.
    for (headers, body) in [
        (
            vec![("content-type", "application/x-www-form-urlencoded")],
            Some("a=1"),
        ),
        (vec![("content-type", "text/plain")], Some("{}")),
        (
            vec![("content-type", "multipart/form-data; boundary=x")],
            Some("--x--"),
        ),
        (vec![], Some("x")),
    ] {
        for path in [
            "/api/v1/organism/stop",
            "/api/v1/organism/pause",
            "/api/v1/inject",
        ] {
            let (st, e) = send(&s, post.clone(), path, &headers, body).await;
            assert_eq!(st, 415, "{path} {headers:?}: {e}");
            assert_eq!(e["error"]["code"], "unsupported_media_type");
            assert_eq!(e["error"]["where"], "Content-Type");
        }
    }
    // A JSON or body-less POST from another origin (a no-cors fetch) is refused by Origin.
    let (st, e) = send(
        &s,
        post.clone(),
        "/api/v1/organism/pause",
        &[("origin", "https://evil.example")],
        None,
    )
    .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (403, Some("cross_origin")),
        "{e}"
    );
    assert_eq!(
        s.organism.status(),
        agentserver::events::OrganismStatus::Running
    );

    // Without Origin (curl, the CLI) a body-less POST and a JSON POST work.
    let (st, e) = send(&s, post.clone(), "/api/v1/organism/pause", &[], None).await;
    assert_eq!(st, 200, "{e}");
    let (st, e) = send(
        &s,
        post.clone(),
        "/api/v1/organism/resume",
        &[("content-type", "application/json")],
        Some(""),
    )
    .await;
    assert_eq!(st, 200, "{e}");
    // The page's own origin may.
    let own = format!("http://{}", s.addr);
    let (st, e) = send(
        &s,
        post,
        "/api/v1/inject",
        &[("origin", &own), ("content-type", "application/json")],
        Some(r#"{"to":"a","payload_xml":"<Note>x</Note>"}"#),
    )
    .await;
    assert_eq!(st, 202, "{e}");
}

#[tokio::test]
async fn a_host_name_that_is_not_ours_gets_421() {
    let s = server().await;
    let get = reqwest::Method::GET;
    let (st, e) = send(
        &s,
        get.clone(),
        "/api/v1/organism",
        &[("host", "attacker.example:8765")],
        None,
    )
    .await;
    assert_eq!(st, 421, "{e}");
    assert_eq!(e["error"]["code"], "host_not_allowed");
    assert_eq!(e["error"]["where"], "Host");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("organism.allowed_hosts"));
    let port = s.addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]".to_string(),
        "agents.example".to_string(),
        format!("Agents.Example:{port}"),
        "dash.localhost".to_string(),
    ] {
        let (st, e) = send(
            &s,
            get.clone(),
            "/api/v1/organism",
            &[("host", &host)],
            None,
        )
        .await;
        assert_eq!(st, 200, "{host}: {e}");
    }
    // WebSockets too: a rebound name cannot open the event stream.
    let (code, _) = ws_with(&s, &[("host", "attacker.example")])
        .await
        .unwrap_err();
    assert_eq!(code, 421);
    let (st, _) = send(&s, get, "/healthz", &[("host", "attacker.example")], None).await;
    assert_eq!(st, 421);
}
