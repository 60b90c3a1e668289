//! What one client's connections may cost the server: a connection cap that keeps it
//! answering, a header-read timeout, an idle timeout. Real sockets against a real server.

use std::time::Duration;

use crate::common::*;
use agentserver::api::ApiOptions;
use agentserver::Organism;
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

/// Sockets that send nothing at all hold their slots only until the header timeout (not
/// the idle timeout): past the cap, another client is answered again soon after.
#[tokio::test]
async fn six_hundred_silent_sockets_keep_no_one_out_past_the_header_timeout() {
    let s = served("  header_timeout_ms: 1000").await;
    let addr = s.server.local_addr();
    let mut silent = Vec::new();
    for _ in 0..600 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    // The default cap (512) is full for a second; then every silent one is closed.
    wait_until_async("a normal request answered 200", || async {
        http_get(s.url("/healthz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    for mut c in silent.into_iter().take(5) {
        assert_eq!(read_to_close(&mut c).await, "", "closed without a word");
    }
}

/// With `ulimit -n 256` (soft and hard) and the default cap of 512, every one of 300
/// clients is answered: 200 within the lowered cap, 503 past it, none left hanging.
#[test]
fn with_few_file_descriptors_every_client_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!("organism:\n  name: fds\n  store: memory\nlisteners:\n{CHAIN}\n"),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "ulimit -n 256 && exec \"$0\" run \"$1\" --listen 127.0.0.1:0",
        env!("CARGO_BIN_EXE_agentserver"),
        path.to_str().unwrap(),
    ]);
    let (_child, url) = crate::common::child::serve(cmd, std::process::Stdio::null());
    let addr = url.trim_start_matches("http://").to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (ok, refused) = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..300 {
            let mut c = TcpStream::connect(&addr).await.unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                .await
                .unwrap();
            conns.push(c);
        }
        let (mut ok, mut refused) = (0, 0);
        for (i, c) in conns.iter_mut().enumerate() {
            let mut buf = vec![0u8; 1024];
            let n = tokio::time::timeout(WAIT, c.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("client {i} got no answer"))
                .unwrap_or(0);
            let said = String::from_utf8_lossy(&buf[..n]);
            if said.starts_with("HTTP/1.1 200") {
                ok += 1;
            } else if said.starts_with("HTTP/1.1 503") && said.contains("too_many_connections") {
                refused += 1;
            } else {
                panic!("client {i}: {said:?}");
            }
        }
        (ok, refused)
    });
    assert_eq!(ok + refused, 300);
    assert!(
        ok >= 100 && refused >= 1,
        "{ok} answered, {refused} refused"
    );
}
