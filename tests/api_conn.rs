//! What one client's connections may cost the server: a connection cap that keeps it
//! answering, a header-read timeout, an idle timeout. Real sockets against a real server.

mod common;

use std::time::Duration;

use agentserver::api::ApiOptions;
use agentserver::Organism;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn served(limits: &str) -> Served {
    serve_with(Organism::builder(), limits, CHAIN, ApiOptions::default()).await
}

/// Reads until the server closes the connection; everything it sent.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection in time");
    String::from_utf8_lossy(&all).to_string()
}

#[tokio::test]
async fn over_the_connection_cap_clients_get_503_and_the_server_answers_again_after() {
    let s = served("  max_connections: 4").await;
    let addr = s.server.local_addr();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Wait until the server has taken all four (a fifth is then refused).
    let refused = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    wait_until_async("a connection over the cap refused", || {
        let refused = refused.clone();
        async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            let _ = c
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                .await;
            let text = read_to_close_or_first(&mut c).await;
            let over = text.starts_with("HTTP/1.1 503");
            *refused.lock().unwrap() = text;
            over
        }
    })
    .await;
    let refused = refused.lock().unwrap().clone();
    assert!(refused.contains("too_many_connections"), "{refused}");
    assert!(refused.contains("limits.max_connections"), "{refused}");
    drop(held.pop());
    wait_until_async("/healthz answering again", || async {
        http_get(s.url("/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
}

/// The first answer on a connection (to its end, or what came within a short wait).
async fn read_to_close_or_first(stream: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).to_string(),
        _ => String::new(),
    }
}

#[tokio::test]
async fn a_client_slow_to_send_its_headers_is_closed() {
    let s = served("  header_timeout_ms: 300").await;
    let mut c = TcpStream::connect(s.server.local_addr()).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // Never finishes the headers: the server closes it (hyper may say 408 first).
    let said = read_to_close(&mut c).await;
    assert!(said.is_empty() || said.contains("408"), "{said}");
    assert_eq!(http_get(s.url("/healthz")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let s = served("  idle_timeout_ms: 300").await;
    let mut c = TcpStream::connect(s.server.local_addr()).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let said = read_to_close(&mut c).await;
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    // A connection that never sends a byte is closed too.
    let mut silent = TcpStream::connect(s.server.local_addr()).await.unwrap();
    assert_eq!(read_to_close(&mut silent).await, "");
}
