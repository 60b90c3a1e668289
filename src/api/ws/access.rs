//! Who a session is: the credential of its upgrade request or first frame. (What a tenant's
//! session sees, and its end when the credential is revoked or expires, are in `session.rs`.)

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::StreamExt;
use serde::Deserialize;

use crate::api::auth::{unauthorized, AuthPending, Principal, Refused};
use crate::api::error::ApiError;

/// Who opens a session: known from the upgrade request, or (`principal: None`) still to
/// present a credential in its first frame; and from which address.
pub struct Who {
    pub(in crate::api) principal: Option<Principal>,
    pub(in crate::api) remote: Option<std::net::IpAddr>,
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
/// The close code of a session refused because its tenant has `max_streams` open.
pub(in crate::api) const CLOSE_TOO_MANY_STREAMS: u16 = 4429;

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
