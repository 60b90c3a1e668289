//! `organism.nats`: the NATS JetStream server that carries deliveries to workers, as
//! written and as checked.

use std::fmt;

use serde::Deserialize;

/// `organism.nats` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NatsSection {
    pub url: String,
    pub stream_prefix: Option<String>,
    pub credentials_env: Option<String>,
    pub ack_wait_ms: Option<u64>,
    pub deliver_timeout_ms: Option<u64>,
    pub max_deliver: Option<u32>,
    pub mirror_events: Option<bool>,
    pub mirror_deltas: Option<bool>,
    pub events_max_bytes: Option<u64>,
    pub events_max_age: Option<String>,
}

/// `organism.nats`: the NATS JetStream server that carries deliveries to workers
/// (`placement: workers`).
#[derive(Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port` (or several, comma-separated).
    pub url: String,
    /// The names' prefix: streams `<prefix>_work` and `<prefix>_results`, subjects
    /// `<prefix>.work.<listener>` and `<prefix>.results`.
    pub stream_prefix: String,
    /// The environment variable holding the credential (`user:password` or a token).
    pub credentials_env: Option<String>,
    /// Its value, read when the config is loaded. Never shown (`Debug` hides it).
    pub credentials: Option<String>,
    /// A delivery a worker took and neither answered nor reported progress on within this
    /// goes to another worker (a worker reports progress every third of it while it runs).
    pub ack_wait: std::time::Duration,
    /// How long a delivery to workers is awaited, from when it is published, before it
    /// fails (no worker running, or none answered).
    pub deliver_timeout: std::time::Duration,
    /// A delivery is handed to workers at most this many times (each worker that took it
    /// died or hung).
    pub max_deliver: u32,
    /// `agentserver run` mirrors every event to the stream `<prefix>_events`...
    pub mirror_events: bool,
    /// ...but a model's streamed pieces (`delta`) only with this (default false): they are
    /// ephemeral, and a gateway knows the events between two mirrored ones were deltas.
    pub mirror_deltas: bool,
    /// The events stream keeps at most this many bytes (the oldest go first)...
    pub events_max_bytes: u64,
    /// ...and nothing older than this.
    pub events_max_age: std::time::Duration,
}

impl NatsConfig {
    /// `agentserver_<name>`, with every character but letters, digits and `-` as `_`.
    pub fn default_prefix(organism: &str) -> String {
        let name: String = organism
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        format!("agentserver_{name}")
    }

    /// The settings of a client of the streams (a gateway, restore): the server, the
    /// prefix, the credential; the rest as the defaults.
    pub fn client(url: &str, stream_prefix: &str, credentials: Option<String>) -> NatsConfig {
        NatsConfig {
            url: url.to_string(),
            stream_prefix: stream_prefix.to_string(),
            credentials_env: None,
            credentials,
            ack_wait: std::time::Duration::from_millis(super::DEFAULT_NATS_ACK_WAIT_MS),
            deliver_timeout: std::time::Duration::from_millis(
                super::DEFAULT_NATS_DELIVER_TIMEOUT_MS,
            ),
            max_deliver: super::DEFAULT_NATS_MAX_DELIVER,
            mirror_events: true,
            mirror_deltas: false,
            events_max_bytes: super::DEFAULT_EVENTS_MAX_BYTES,
            events_max_age: super::DEFAULT_EVENTS_MAX_AGE,
        }
    }
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &self.url)
            .field("stream_prefix", &self.stream_prefix)
            .field("credentials_env", &self.credentials_env)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<hidden>"),
            )
            .field("ack_wait", &self.ack_wait)
            .field("deliver_timeout", &self.deliver_timeout)
            .field("max_deliver", &self.max_deliver)
            .field("mirror_events", &self.mirror_events)
            .field("mirror_deltas", &self.mirror_deltas)
            .field("events_max_bytes", &self.events_max_bytes)
            .field("events_max_age", &self.events_max_age)
            .finish()
    }
}
