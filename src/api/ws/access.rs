//! Who a session is: the credential of its upgrade request or first frame, what a tenant's
//! session sees, and its end when the credential is revoked or expires.

use super::*;

/// Who opens a session: known from the upgrade request, or (`principal: None`) still to
/// present a credential in its first frame; and from which address.
pub struct Who {
    pub(super) principal: Option<Principal>,
    pub(super) remote: Option<std::net::IpAddr>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, ApiError> {
        let remote = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        match (
            parts.extensions.get::<Principal>(),
            parts.extensions.get::<AuthPending>(),
        ) {
            (Some(p), _) => Ok(Who {
                principal: Some(p.clone()),
                remote,
            }),
            (None, Some(_)) => Ok(Who {
                principal: None,
                remote,
            }),
            (None, None) => Err(unauthorized(&Refused::Missing)),
        }
    }
}

/// How long a session whose upgrade carried no credential may take to send it.
pub const AUTH_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Close codes of sessions refused or ended for their credential.
pub(in crate::api) const CLOSE_UNAUTHORIZED: u16 = 4401;

impl Session {
    /// What the session's principal sees now.
    pub(super) fn scope(&mut self) -> Scope {
        let Some((config, scope)) = &mut self.tenant_view else {
            return Scope::default();
        };
        let now = self.state.inner.organism.config();
        if !Arc::ptr_eq(config, &now) {
            *scope = self.principal.scope(&now);
            *config = now;
        }
        scope.clone()
    }

    /// Whether a tenant's session sees `ev` (every event, for an organism-wide one).
    pub(super) fn sees(&mut self, ev: &Event) -> bool {
        if self.tenant_view.is_none() {
            return true;
        }
        let scope = self.scope();
        let threads = self.state.inner.organism.threads();
        let thread = |id: &str| {
            threads
                .info(id)
                .is_some_and(|t| scope.sees_thread(&t.participants))
        };
        match &ev.kind {
            EventKind::AgentState { agent, .. } | EventKind::Log { agent, .. } => scope.sees(agent),
            EventKind::Message { message } => {
                scope.sees_message(&message.from, message.to.as_deref())
            }
            EventKind::MessageStatus { about: Some(a), .. } => {
                scope.sees_message(&a.from, a.to.as_deref())
            }
            EventKind::MessageStatus { thread_id, .. }
            | EventKind::ThreadUpdated { thread_id, .. } => thread(thread_id),
            EventKind::ThreadCreated { thread: t } => {
                scope.sees_thread(&t.participants) || thread(&t.id)
            }
            EventKind::Error { agent: Some(a), .. } => scope.sees(a),
            EventKind::Error {
                thread_id: Some(t), ..
            } => thread(t),
            EventKind::Reload { agent: Some(a), .. } => scope.sees(a),
            EventKind::Deployment { tenant, .. } => {
                tenant.is_some() && *tenant == self.principal.tenant
            }
            EventKind::OrganismState { .. } => true,
            EventKind::Error { .. } | EventKind::Reload { .. } | EventKind::Audit { .. } => false,
        }
    }

    /// Whether the session's credential still holds (looked up off the async workers).
    pub(super) async fn still_valid(&self) -> bool {
        let Some(auth) = self.state.inner.auth.clone() else {
            return true;
        };
        let p = self.principal.clone();
        tokio::task::spawn_blocking(move || auth.still_valid(&p))
            .await
            .unwrap_or(false)
    }

    pub(super) fn close_unauthorized(&self) {
        tracing::info!(
            endpoint = self.ep.path(),
            principal = ?self.principal.name,
            "closing a WebSocket session: its credential was revoked or expired"
        );
        let _ = self.tx.try_send(Message::Close(Some(CloseFrame {
            code: CLOSE_UNAUTHORIZED,
            reason: Utf8Bytes::from_static("credential revoked or expired"),
        })));
    }
}

/// Waits up to [`AUTH_FRAME_TIMEOUT`] for `{"cmd": "auth", "token": …}` as the session's
/// first frame. Err: the close reason (the same whatever was wrong; the log has the detail).
pub(in crate::api) async fn first_frame_auth(
    auth: Option<Arc<crate::api::auth::Authenticator>>,
    stream: &mut futures_util::stream::SplitStream<WebSocket>,
    from: Option<std::net::IpAddr>,
) -> Result<Principal, &'static str> {
    let failed = || match (&auth, from) {
        (Some(a), Some(ip)) if a.limits.failed_auth(ip).is_err() => {
            "too many failed authentications from this address"
        }
        _ => REFUSED,
    };
    const REFUSED: &str = "unauthorized: send {\"cmd\": \"auth\", \"token\": …} first";
    let Some(auth) = auth.clone() else {
        return Ok(Principal::implicit());
    };
    let first = loop {
        match tokio::time::timeout(AUTH_FRAME_TIMEOUT, stream.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => break t,
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            Err(_) => {
                tracing::info!("WebSocket session sent no credential in time");
                return Err(failed());
            }
            _ => return Err(failed()),
        }
    };
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AuthFrame {
        cmd: String,
        token: String,
    }
    let token = match serde_json::from_str::<AuthFrame>(first.as_str()) {
        Ok(f) if f.cmd == "auth" => f.token,
        _ => {
            tracing::info!("WebSocket session's first frame is not an auth command");
            return Err(failed());
        }
    };
    match tokio::task::spawn_blocking(move || auth.verify(&token)).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(Refused::Invalid(why))) => {
            tracing::info!("WebSocket credential refused: {why}");
            Err(failed())
        }
        _ => Err(failed()),
    }
}
