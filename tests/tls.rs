//! HTTPS and WSS with `organism.tls`, against a certificate generated in the test, through
//! a real TLS client; and the start-up errors of bad certificate files.

mod common;

use std::sync::Arc;

use agentserver::api::{ApiOptions, ApiServer};
use agentserver::Organism;
use common::*;
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// A self-signed certificate for `localhost` written as `cert.pem` and `key.pem` in `dir`;
/// its DER, for the client to trust.
fn certificate(dir: &std::path::Path) -> rustls_pki_types::CertificateDer<'static> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let made = rcgen::generate_simple_self_signed(names).unwrap();
    std::fs::write(dir.join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
    made.cert.der().clone()
}

fn organism(dir: &std::path::Path, tls: &str) -> Organism {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.join("o.yaml");
    std::fs::write(
        &path,
        format!("organism:\n  name: tls\n  store: memory\n  tls: {tls}\nlisteners:\n{CHAIN}\n"),
    )
    .unwrap();
    Organism::builder().load(&path).unwrap()
}

fn connector(trusted: rustls_pki_types::CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_stream(
    server: &ApiServer,
    trusted: rustls_pki_types::CertificateDer<'static>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector(trusted).connect(name, tcp).await.unwrap()
}

#[tokio::test]
async fn the_api_serves_https_and_wss_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let der = certificate(dir.path());
    let o = organism(dir.path(), "{cert: cert.pem, key: key.pem}");
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );

    let mut s = tls_stream(&server, der.clone()).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#"{"status":"ok"}"#), "{answer}");

    let s = tls_stream(&server, der).await;
    let port = server.local_addr().port();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("wss://localhost:{port}/ws"), s)
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
    assert_eq!(v["event"], "connected");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));
}

#[tokio::test]
async fn bad_certificate_files_are_start_up_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    certificate(dir.path());
    let other = tempfile::tempdir().unwrap();
    certificate(other.path());
    std::fs::copy(
        other.path().join("key.pem"),
        dir.path().join("other-key.pem"),
    )
    .unwrap();
    std::fs::write(dir.path().join("garbage.pem"), "not a certificate").unwrap();
    for (tls, says) in [
        ("{cert: missing.pem, key: key.pem}", "missing.pem"),
        ("{cert: garbage.pem, key: key.pem}", "no certificate"),
        ("{cert: cert.pem, key: garbage.pem}", "no private key"),
        ("{cert: cert.pem, key: other-key.pem}", "does not go with"),
    ] {
        let o = organism(dir.path(), tls);
        let e = ApiServer::bind(o, "127.0.0.1:0", ApiOptions::default())
            .await
            .err()
            .unwrap_or_else(|| panic!("{tls} was accepted"))
            .to_string();
        assert!(e.contains(says) && e.contains("organism.tls"), "{tls}: {e}");
    }
}

fn cli() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentserver"));
    c.env_remove("AGENTSERVER_TOKEN")
        .env_remove("AGENTSERVER_CA_CERT")
        .kill_on_drop(true);
    c
}

#[tokio::test]
async fn the_cli_injects_and_tails_over_https_trusting_a_ca_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    certificate(dir.path());
    let ca = dir.path().join("cert.pem");
    let o = organism(dir.path(), "{cert: cert.pem, key: key.pem}");
    let server = ApiServer::bind(o.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let url = server.url();

    // Without the certificate trusted, the CLI refuses the server and says why.
    let out = cli()
        .args(["inject", "--url", &url, "--to", "a", "<Note>x</Note>"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(said.contains("certificate"), "{said}");
    assert!(o.threads().list().is_empty(), "nothing was injected");

    // `tail` over wss, with the file given through the environment.
    let mut tail = cli()
        .args(["tail", "--json", "--url", &url])
        .env("AGENTSERVER_CA_CERT", &ca)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.contains("\"connected\""), "{first}");

    let ca_arg = ca.to_str().unwrap();
    let out = cli()
        .args(["inject", "--url", &url, "--ca-cert", ca_arg])
        .args(["--to", "a", "<Note>over tls</Note>", "--wait=10"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 3, "a -> b -> c: {stdout}");

    let seen = tokio::time::timeout(WAIT, async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap();
            if line.contains("over tls") && line.contains("\"to\":\"c\"") {
                return line;
            }
        }
    })
    .await
    .unwrap();
    assert!(seen.contains("\"event\":\"message\""), "{seen}");

    // A file that is not a certificate is named.
    std::fs::write(dir.path().join("junk.pem"), "junk").unwrap();
    let junk = dir.path().join("junk.pem");
    let out = cli()
        .args(["inject", "--url", &url, "--to", "a", "<Note>x</Note>"])
        .arg("--ca-cert")
        .arg(&junk)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("junk.pem") && said.contains("no PEM certificate"),
        "{said}"
    );
}
