//! Every connection this crate opens (the CLI's requests and WebSockets, an external agent's
//! forwards) is built here, with one TLS client configuration: rustls with the `ring`
//! provider, the system's root certificates, and any extra roots the caller trusts.
//!
//! reqwest is built with `rustls-no-provider`, so `reqwest::Client::new()` would panic for
//! want of a process-wide provider; `clippy.toml` forbids it and [`http_client`] is the way.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio_rustls::rustls;

/// A TLS client configuration trusting the system's roots and `extra_roots`. A machine
/// without system roots still gets one (trusting only `extra_roots`): plain `http://` must
/// keep working there, and `https://` fails at the handshake naming the unknown issuer.
pub fn tls_config(
    extra_roots: &[CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    let config = match rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra_roots.iter().cloned(),
        provider,
    ) {
        Ok(verifier) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth(),
        Err(system) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in extra_roots {
                roots
                    .add(cert.clone())
                    .map_err(|e| format!("a trusted certificate is not usable: {e}"))?;
            }
            if roots.is_empty() {
                tracing::debug!("no system root certificates ({system}); https trusts nothing");
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(Arc::new(config))
}

/// The configuration trusting the system's roots only, built once (reading the system's
/// certificates takes milliseconds).
fn default_tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG.get_or_init(|| tls_config(&[])).clone()
}

/// A reqwest client builder with this crate's TLS (system roots): the only way to make a
/// reqwest client here.
pub fn http_client() -> Result<reqwest::ClientBuilder, String> {
    Ok(http_client_with(default_tls_config()?))
}

/// A reqwest client builder with the given TLS configuration.
#[allow(clippy::disallowed_methods)] // the one place that builds reqwest clients
pub fn http_client_with(tls: Arc<rustls::ClientConfig>) -> reqwest::ClientBuilder {
    reqwest::Client::builder().tls_backend_preconfigured((*tls).clone())
}

/// The first bytes of an answer's body, at most `max`: enough to say what went wrong, and no
/// more read however much the other side sends (the rest is left unread; the connection goes).
pub async fn body_start(mut resp: reqwest::Response, max: usize) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < max {
        match resp.chunk().await {
            Ok(Some(c)) => bytes.extend_from_slice(&c[..c.len().min(max - bytes.len())]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// An answer's whole body if it is at most `max` bytes; past that, an error saying so, and
/// the rest is left unread.
pub async fn body_at_most(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) if bytes.len() + c.len() > max => {
                return Err(format!(
                    "the answer is over {max} bytes; the rest was not read"
                ))
            }
            Ok(Some(c)) => bytes.extend_from_slice(&c),
            Ok(None) => return Ok(bytes),
            Err(e) => return Err(format!("the answer broke off: {e}")),
        }
    }
}

/// The certificates of a PEM file, to trust as roots (`--ca-cert`, `AGENTSERVER_CA_CERT`).
/// Errors name the file.
pub fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown} is not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    Ok(certs)
}

/// A WebSocket this crate opened as a client (the CLI's `tail`), read as text frames.
pub struct WebSocket(
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
);

/// An error with its causes, as the caller shows it.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Why a WebSocket was not opened.
#[derive(Debug)]
pub enum OpenError {
    /// The server answered the upgrade with this HTTP status instead.
    Status(u16),
    /// A bad URL or token, or the connection or TLS handshake failed.
    Failed(Failure),
}

/// What came next on a [`WebSocket`].
#[derive(Debug)]
pub enum Frame {
    Text(String),
    /// The server closed it, with this reason (maybe empty).
    Closed(String),
    Failed(Failure),
}

/// Opens a WebSocket to `url` (`ws://` or `wss://`), presenting `bearer` if given, with `tls`.
pub async fn websocket(
    url: &str,
    bearer: Option<&str>,
    tls: Arc<rustls::ClientConfig>,
) -> Result<WebSocket, OpenError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url
        .into_client_request()
        .map_err(|e| OpenError::Failed(e.into()))?;
    if let Some(t) = bearer {
        let value = format!("Bearer {t}")
            .parse()
            .map_err(|_| OpenError::Failed("the token is not a valid header value".into()))?;
        request.headers_mut().insert("authorization", value);
    }
    let tls = tokio_tungstenite::Connector::Rustls(tls);
    match tokio_tungstenite::connect_async_tls_with_config(request, None, false, Some(tls)).await {
        Ok((socket, _)) => Ok(WebSocket(socket)),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            Err(OpenError::Status(r.status().as_u16()))
        }
        Err(e) => Err(OpenError::Failed(e.into())),
    }
}

impl WebSocket {
    /// Sends one text frame.
    pub async fn send_text(&mut self, text: String) -> Result<(), Failure> {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        self.0
            .send(Message::Text(text.into()))
            .await
            .map_err(Into::into)
    }

    /// The next text frame, or how the stream ended; `None` once it has.
    pub async fn next(&mut self) -> Option<Frame> {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        loop {
            return Some(match self.0.next().await? {
                Ok(Message::Text(t)) => Frame::Text(t.as_str().to_string()),
                Ok(Message::Close(frame)) => {
                    Frame::Closed(frame.map(|f| f.reason.to_string()).unwrap_or_default())
                }
                Ok(_) => continue,
                Err(e) => Frame::Failed(e.into()),
            });
        }
    }
}
