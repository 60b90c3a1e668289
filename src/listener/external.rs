//! `kind: external` (SPEC §11.4): each delivery is POSTed as JSON to the agent's `input_url`;
//! the agent answers later by callback, which the pump matches to the delivery it answers.
//!
//! This handler only forwards. A 2xx answer means "accepted, a reply will follow": the pump
//! then records a wait (the agent is `waiting`, the thread stays `active`) because
//! [`Handler::awaits_reply`] says so. Anything else fails the message with the cause.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;

use super::{Delivery, Handler, HandlerError, HandlerFuture};
use crate::config::{display_url, ExternalConfig, ListenerConfig};

/// Where an external agent's callback for `(agent, thread)` goes: an absolute URL, made by
/// the API that serves the callback route (set when its server binds).
pub type CallbackUrl = Arc<dyn Fn(&str, &str) -> String + Send + Sync>;

pub struct ExternalHandler {
    client: reqwest::Client,
    config: ExternalConfig,
    shown_url: String,
    listener: ListenerConfig,
    /// Where callbacks go, set when the API server binds; until then `callback_url` is
    /// `null` (nothing would answer a callback).
    callbacks: Arc<OnceLock<CallbackUrl>>,
}

impl ExternalHandler {
    pub fn new(
        listener: &ListenerConfig,
        callbacks: Arc<OnceLock<CallbackUrl>>,
    ) -> Result<ExternalHandler, String> {
        let config = listener
            .external
            .clone()
            .ok_or_else(|| "an external listener needs `input_url`".to_string())?;
        let client = crate::outbound::http_client()?
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(ExternalHandler {
            client,
            shown_url: display_url(&config.input_url),
            config,
            listener: listener.clone(),
            callbacks,
        })
    }
}

/// The innermost cause of an error, which is where "connection refused" lives.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Characters of a refusing agent's answer shown in the failure.
const SNIPPET_CHARS: usize = 200;

impl Handler for ExternalHandler {
    fn handle(&self, delivery: Delivery) -> HandlerFuture {
        let agent = self.listener.name.as_str();
        let thread = &*delivery.meta.thread_id;
        let callback_url = self.callbacks.get().map(|url| url(agent, thread));
        let payload = crate::schema::payload_json(
            self.listener
                .schema_for(delivery.payload.payload_type())
                .map(|s| &**s),
            delivery.payload.xml(),
        );
        let body = json!({
            "thread_id": thread,
            "message_id": &*delivery.meta.message_id,
            "agent": agent,
            "from": &*delivery.meta.from,
            "payload_type": delivery.meta.payload_type.to_string(),
            "payload": payload,
            "payload_xml": delivery.payload.xml(),
            "callback_url": callback_url,
        });
        let request = self.client.post(&self.config.input_url).json(&body);
        let shown = self.shown_url.clone();
        let timeout_ms = self.config.timeout.as_millis();
        Box::pin(async move {
            match request.send().await {
                Ok(resp) if resp.status().is_success() => Ok(Vec::new()),
                Ok(resp) => {
                    let status = resp.status();
                    let text = crate::outbound::body_start(resp, 4 * SNIPPET_CHARS).await;
                    let snippet: String = text.chars().take(SNIPPET_CHARS).collect();
                    Err(HandlerError(if snippet.trim().is_empty() {
                        format!("POST {shown} answered {status}")
                    } else {
                        format!("POST {shown} answered {status}: {}", snippet.trim())
                    }))
                }
                Err(e) if e.is_timeout() => Err(HandlerError(format!(
                    "POST {shown} timed out after {timeout_ms} ms"
                ))),
                Err(e) if e.is_connect() => Err(HandlerError(format!(
                    "POST {shown} could not connect: {}",
                    root_cause(&e)
                ))),
                Err(e) => Err(HandlerError(format!(
                    "POST {shown} failed: {}",
                    root_cause(&e)
                ))),
            }
        })
    }

    fn awaits_reply(&self) -> bool {
        true
    }
}
