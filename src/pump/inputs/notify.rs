//! A gate's notifications (`approval.notify`): each input it opens is POSTed as
//! `{input, links}` to the gate's URL, signed `X-Agentserver-Signature: sha256=<hex HMAC-SHA256
//! of the body>` with the secret when one is set. A failed attempt (no answer within
//! [`NOTIFY_TIMEOUT`], or not 2xx) is counted and published as an `error` event, and tried
//! again after a backoff that doubles from [`NOTIFY_FIRST_RETRY`], [`NOTIFY_ATTEMPTS`] times in
//! all. The input waits the same whether or not anyone was told.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};

use super::Shared;
use crate::config::approval::Notify;
use crate::threads::InputRow;

/// How long one attempt may take.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts per input, the first included.
pub const NOTIFY_ATTEMPTS: u32 = 5;
/// The wait before the second attempt; it doubles after each failure.
pub const NOTIFY_FIRST_RETRY: Duration = Duration::from_millis(500);

/// The signature header's value: `sha256=` and the hex HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = match Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

impl Shared {
    /// Tells `notify.url` of the input `row`, in the background.
    pub(super) fn notify(self: &Arc<Self>, notify: &Notify, row: &InputRow) {
        let id = &row.id;
        let body = serde_json::json!({
            "input": {
                "id": id,
                "kind": "approval",
                "thread_id": row.thread_id,
                "message_id": row.message_id,
                "listener": row.listener,
                "from": row.from,
                "payload_type": row.payload_type,
                "payload_xml": row.payload_xml,
                "prompt": row.prompt,
                "created_at": row.created,
                "expires_at": row.expires,
            },
            "links": {
                "input": format!("/api/v1/inputs/{id}"),
                "approve": format!("/api/v1/inputs/{id}/approve"),
                "reject": format!("/api/v1/inputs/{id}/reject"),
            },
        })
        .to_string();
        let signed = notify
            .secret
            .as_deref()
            .map(|s| signature(s, body.as_bytes()));
        let (url, shared) = (notify.url.clone(), self.clone());
        let (thread, listener, input) = (row.thread_id.clone(), row.listener.clone(), id.clone());
        self.life.runtime.spawn(async move {
            let client = crate::outbound::http_client()
                .and_then(|b| b.timeout(NOTIFY_TIMEOUT).build().map_err(|e| e.to_string()));
            let mut wait = NOTIFY_FIRST_RETRY;
            for attempt in 1..=NOTIFY_ATTEMPTS {
                let sent = match &client {
                    Err(e) => Err(e.clone()),
                    Ok(c) => {
                        let mut req = c
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body.clone());
                        if let Some(sig) = &signed {
                            req = req.header("x-agentserver-signature", sig);
                        }
                        match req.send().await {
                            Ok(r) if r.status().is_success() => Ok(()),
                            Ok(r) => Err(format!("answered {}", r.status().as_u16())),
                            Err(e) => Err(crate::clip::clip(e.to_string(), 512)),
                        }
                    }
                };
                let Err(why) = sent else { return };
                shared.inbox.notify_failures.fetch_add(1, Ordering::Relaxed);
                let last = attempt == NOTIFY_ATTEMPTS;
                shared.say_error(
                    Some(&thread),
                    Some(&listener),
                    format!(
                        "the notification of input {} to {} failed ({why}); attempt {attempt} of {NOTIFY_ATTEMPTS}{}",
                        input,
                        crate::config::display_url(&url),
                        if last { ", giving up" } else { "" }
                    ),
                );
                if last || shared.life.stopped.is_cancelled() {
                    return;
                }
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_is_the_hmac_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
