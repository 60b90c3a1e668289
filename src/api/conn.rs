//! The accept loop: what one client's connection may cost the server.
//!
//! - `limits.max_connections` connections at once. One more is answered `503
//!   too_many_connections` (a fixed answer written within a second) and closed, so the
//!   server keeps answering, with an error, rather than running out of file descriptors;
//!   `/healthz` answers again as soon as a connection closes.
//! - `limits.header_timeout_ms` to send a request's first byte (a connection that sends
//!   nothing is closed then, not at the idle timeout) and then its headers (hyper's
//!   header-read timer): a slow-header client is closed.
//! - The process's file descriptors: at start the soft `RLIMIT_NOFILE` is raised to the hard
//!   one where allowed; if `max_connections`, the refusals under way ([`REFUSING`]) and the
//!   server's own descriptors ([`OWN_DESCRIPTORS`]) still do not fit, the cap is lowered to
//!   what does, and the log says so. So a client past the cap is always answered 503.
//! - `limits.idle_timeout_ms` without a byte read or written closes a connection
//!   ([`Idle`]), keep-alive or WebSocket alike (a live session's pings keep it busy).
//! - `TCP_NODELAY` on every connection: answers and frames leave at once, not after the
//!   peer's delayed ACK.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::Limits;

/// What the accept loop enforces, from `limits:`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Descriptors kept for the server's own use besides connections: the listener, the
/// runtime's, the store's files and connections, the file watch, NATS, logs.
pub const OWN_DESCRIPTORS: usize = 64;

/// Connections over the cap being answered 503 at once; the accept loop waits for one of
/// these slots, so each such client is answered rather than left without a descriptor.
pub const REFUSING: usize = 32;

impl ConnLimits {
    pub fn of(l: &Limits) -> Self {
        ConnLimits {
            max_connections: descriptor_cap(l.max_connections),
            header_timeout: Duration::from_millis(l.header_timeout_ms),
            idle_timeout: Duration::from_millis(l.idle_timeout_ms),
        }
    }
}

/// `max_connections`, or fewer when the process may not open that many descriptors beside
/// its own and the refusals': the soft `RLIMIT_NOFILE` is raised to the hard one first.
fn descriptor_cap(max_connections: usize) -> usize {
    let Some(limit) = raise_descriptor_limit() else {
        return max_connections;
    };
    let room = (limit as usize)
        .saturating_sub(OWN_DESCRIPTORS + REFUSING)
        .max(1);
    if room < max_connections {
        tracing::warn!(
            "limits.max_connections is {max_connections}, but this process may open {limit} \
             file descriptors (RLIMIT_NOFILE, its hard limit included); taking {room} \
             connections at once, so that every one past them is still answered 503 \
             (raise the limit with `ulimit -n`, or lower limits.max_connections)"
        );
    }
    room.min(max_connections)
}

/// The soft descriptor limit after raising it to the hard one where allowed; `None` when it
/// cannot be read (it is then not a bound this code can see).
fn raise_descriptor_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the valid, exclusively borrowed struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `setrlimit` reads one valid `rlimit`; raising the soft limit up to the hard
        // one is allowed to any process.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

const TOO_MANY_BODY: &str = r#"{"error":{"code":"too_many_connections","message":"the server holds limits.max_connections connections; try again"}}"#;

/// Serves `app` on `listener` until `closing` is cancelled, then waits for open
/// connections to finish (the caller bounds that wait).
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    closing: CancellationToken,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> io::Result<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let refusing = Arc::new(tokio::sync::Semaphore::new(REFUSING));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let builder = Arc::new(builder);
    let mut accept_errors = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors or a passing fault: say so (once a second at most)
                    // and let the loop breathe rather than spin.
                    if accept_errors.is_multiple_of(10) {
                        tracing::error!("accept failed: {e}");
                    }
                    accept_errors += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = closing.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Wait for a refusal slot: the client is answered, never left without one.
            let Ok(slot) = refusing.clone().acquire_owned().await else {
                continue;
            };
            tokio::spawn(async move {
                refuse(stream).await;
                drop(slot);
            });
            continue;
        };
        let service = hyper::service::service_fn({
            let app = app.clone();
            move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                app.clone().oneshot(req)
            }
        });
        let io = Idle::new(stream, limits.idle_timeout);
        let builder = builder.clone();
        let watcher = graceful.watcher();
        match &tls {
            None => {
                tokio::spawn(async move {
                    // Nothing sent by the header timeout (or the idle one, if shorter):
                    // closed (hyper's header timer starts at the first byte).
                    let wait = limits.header_timeout.min(limits.idle_timeout);
                    if !first_byte(&io.inner, wait).await {
                        return;
                    }
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
                    let _ = watcher.watch(conn.into_owned()).await;
                    drop(permit);
                });
            }
            Some(acceptor) => {
                // The handshake is bounded as the request's headers are.
                let handshake = acceptor.accept(io);
                tokio::spawn(async move {
                    let Ok(Ok(tls)) = tokio::time::timeout(limits.header_timeout, handshake).await
                    else {
                        return;
                    };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                    let _ = watcher.watch(conn.into_owned()).await;
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Whether the client sent a byte (or closed) within `timeout`.
async fn first_byte(stream: &TcpStream, timeout: Duration) -> bool {
    let mut one = [0u8; 1];
    matches!(
        tokio::time::timeout(timeout, stream.peek(&mut one)).await,
        Ok(Ok(_))
    )
}

/// Answers a connection over the cap and closes it, within a second.
async fn refuse(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         connection: close\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{TOO_MANY_BODY}",
        TOO_MANY_BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A stream that fails with `TimedOut` once nothing was read or written for `timeout`.
struct Idle {
    inner: TcpStream,
    timeout: Duration,
    last: Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Idle {
    fn new(inner: TcpStream, timeout: Duration) -> Self {
        Idle {
            inner,
            timeout,
            last: Instant::now(),
            timer: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    /// A poll of the stream: ready is activity (the idle clock restarts); not ready is a
    /// look at the idle clock.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.last = Instant::now();
                Poll::Ready(r)
            }
            Poll::Pending => self.check(cx).map(Err),
        }
    }

    /// Called when the stream is not ready: an error once the stream has been idle too
    /// long, else the timer is (re)armed to wake this task then.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let due = self.last + self.timeout;
            if Instant::now() >= due {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "idle longer than limits.idle_timeout_ms",
                ));
            }
            let deadline = tokio::time::Instant::from_std(due);
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => continue,
            }
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.progress(cx, polled)
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The TLS acceptor of `organism.tls`: the certificate chain and private key read from their
/// PEM files. An error names the file and what is wrong with it.
pub(super) fn tls_acceptor(
    files: &crate::config::TlsFiles,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let shown = |p: &std::path::Path| p.display().to_string();
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| format!("organism.tls.cert {}: {e}", shown(&files.cert)))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("organism.tls.cert {}: {e}", shown(&files.cert)))?;
    if certs.is_empty() {
        return Err(format!(
            "organism.tls.cert {}: no certificate (PEM `BEGIN CERTIFICATE`) in it",
            shown(&files.cert)
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        format!(
            "organism.tls.key {}: no private key in it: {e}",
            shown(&files.key)
        )
    })?;
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("organism.tls: {e}"))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| {
        format!(
            "organism.tls: the key {} does not go with the certificate {}: {e}",
            shown(&files.key),
            shown(&files.cert)
        )
    })?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}
