//! The connection to NATS and the streams (work, results, events, snapshot), shared by the
//! pump, workers, gateways and restore.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::NatsConfig;

/// The most the work stream holds, in bytes: beyond it a publish is refused (and retried
/// until the delivery's timeout), never an older delivery dropped.
pub const WORK_STREAM_MAX_BYTES: i64 = 1 << 30;
/// The most the results stream holds, in bytes (as above).
pub const RESULTS_STREAM_MAX_BYTES: i64 = 256 << 20;
/// The most the snapshot stream (one message, the latest) holds, in bytes.
pub const SNAPSHOT_STREAM_MAX_BYTES: i64 = 64 << 20;
/// Bytes kept free in a message for its headers (`Nats-Msg-Id`, the seq).
const HEADER_ROOM: usize = 256;
/// JetStream's window for dropping a second message with the same `Nats-Msg-Id`.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Every stream, subject and consumer name, from `organism.nats.stream_prefix`.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.to_string(),
        }
    }

    pub fn work_stream(&self) -> String {
        format!("{}_work", self.prefix)
    }

    pub fn results_stream(&self) -> String {
        format!("{}_results", self.prefix)
    }

    pub fn work_subject(&self, listener: &str) -> String {
        format!("{}.work.{listener}", self.prefix)
    }

    pub fn results_subject(&self) -> String {
        format!("{}.results", self.prefix)
    }

    pub fn events_stream(&self) -> String {
        format!("{}_events", self.prefix)
    }

    pub fn events_subject(&self) -> String {
        format!("{}.events", self.prefix)
    }

    pub fn snapshot_stream(&self) -> String {
        format!("{}_snapshot", self.prefix)
    }

    pub fn snapshot_subject(&self) -> String {
        format!("{}.snapshot", self.prefix)
    }

    pub fn alive_subject(&self, listener: &str) -> String {
        format!("{}.alive.{listener}", self.prefix)
    }

    /// Every listener's announcements.
    pub fn alive_all(&self) -> String {
        format!("{}.alive.>", self.prefix)
    }

    /// The listener named in an announcement's subject.
    pub fn alive_listener<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".alive.")
    }

    /// The durable consumer every worker of `listener` shares. Consumer names allow fewer
    /// characters than listener names, so a name with others is hashed.
    pub fn work_consumer(&self, listener: &str) -> String {
        if listener
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            format!("work-{listener}")
        } else {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(listener.as_bytes());
            let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
            format!("work-h{hex}")
        }
    }

    /// The pump's consumer of results.
    pub fn results_consumer(&self) -> &'static str {
        "pump"
    }
}

/// The streams, once they exist on the server.
#[derive(Clone)]
pub struct Streams {
    pub work: stream::Stream,
    pub results: stream::Stream,
    pub events: stream::Stream,
    /// The latest snapshot of the organism (agents, threads), for gateways' `connected`.
    pub snapshot: stream::Stream,
}

/// A connection to NATS (reconnecting by itself) and, once the server answers, the streams.
/// Everything that needs the streams waits for them with a deadline, so a NATS server that
/// is down holds up only the placed listeners.
#[derive(Clone)]
pub struct Link {
    pub names: Names,
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    streams: watch::Receiver<Option<Streams>>,
    shown_url: String,
}

impl Link {
    /// Connects (in the background: this returns at once, whether or not the server is up)
    /// and sets the streams up as soon as it answers. Must run inside a tokio runtime.
    pub async fn connect(config: &NatsConfig, client_name: &str) -> Result<Link, String> {
        // Each loss of the link and each recovery is logged once, as it happens.
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shown = config.url.clone();
        let who = client_name.to_string();
        let options = connect_options(config)
            .name(client_name)
            .event_callback(move |event| {
                let (lost, shown, who) = (lost.clone(), shown.clone(), who.clone());
                async move {
                    use std::sync::atomic::Ordering;
                    match event {
                        async_nats::Event::Disconnected if !lost.swap(true, Ordering::SeqCst) => {
                            tracing::warn!(url = %shown, client = %who, "the link to NATS is lost; reconnecting");
                        }
                        // At the loss's level, so whoever saw the loss sees its end.
                        async_nats::Event::Connected if lost.swap(false, Ordering::SeqCst) => {
                            tracing::warn!(url = %shown, client = %who, "the link to NATS is back");
                        }
                        _ => {}
                    }
                }
            })
            .retry_on_initial_connect()
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((attempts as u64 * 100).min(1_000))
            });
        let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
        let client = options
            .connect(urls.as_slice())
            .await
            .map_err(|e| format!("cannot use NATS at {}: {e}", config.url))?;
        let jetstream = jetstream::new(client.clone());
        let names = Names::new(&config.stream_prefix);
        let (tx, rx) = watch::channel(None);
        let js = jetstream.clone();
        let n = names.clone();
        let url = config.url.clone();
        let limits = (config.events_max_bytes, config.events_max_age);
        tokio::spawn(async move {
            let mut told = false;
            loop {
                match ensure_streams(&js, &n, limits).await {
                    Ok(streams) => {
                        let _ = tx.send(Some(streams));
                        if told {
                            tracing::info!(url = %url, "NATS JetStream answers; placed listeners resume");
                        }
                        return;
                    }
                    Err(e) => {
                        if !told {
                            tracing::warn!(url = %url, error = %e, "NATS JetStream does not answer yet; placed listeners wait");
                            told = true;
                        }
                        if tx.is_closed() {
                            return;
                        }
                        tokio::time::sleep(super::RETRY_AFTER).await;
                    }
                }
            }
        });
        Ok(Link {
            names,
            client,
            jetstream,
            streams: rx,
            shown_url: config.url.clone(),
        })
    }

    /// The streams, once set up; `None` if that has not happened by `deadline`.
    pub async fn streams(&self, deadline: Instant) -> Option<Streams> {
        super::first_some(&self.streams, Some(deadline)).await
    }

    /// The streams, once set up however long that takes; `None` if `stop` comes first.
    pub async fn streams_or_stop(
        &self,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<Streams> {
        tokio::select! {
            _ = stop.cancelled() => None,
            s = super::first_some(&self.streams, None) => s,
        }
    }

    /// Whether a message of `len` bytes (and our headers) fits the server's `max_payload`;
    /// `Err` says why not. Such a message can never be sent: retrying it is pointless.
    pub fn fits(&self, len: usize) -> Result<(), String> {
        let max = self.client.max_payload();
        if len + HEADER_ROOM > max {
            return Err(format!(
                "{len} bytes, over the NATS server's max_payload ({max} bytes)"
            ));
        }
        Ok(())
    }

    /// Publishes `body` to `subject` with `id` as its `Nats-Msg-Id` and waits for the
    /// stream to take it.
    pub async fn publish(
        &self,
        subject: &str,
        body: bytes::Bytes,
        id: &str,
    ) -> Result<jetstream::publish::PublishAck, String> {
        let message = jetstream::message::PublishMessage::build()
            .payload(body)
            .message_id(id);
        self.jetstream
            .send_publish(subject.to_string(), message)
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())
    }

    /// Whether the connection to the server is up now.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The server's URL as configured (it holds no credential: the config refuses one).
    pub fn url(&self) -> &str {
        &self.shown_url
    }
}

/// The options every connection to `config`'s server starts from: its credential, and a
/// 5 s bound on connecting.
fn connect_options(config: &NatsConfig) -> async_nats::ConnectOptions {
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5));
    match config
        .credentials
        .as_deref()
        .map(|c| c.split_once(':').ok_or(c))
    {
        Some(Ok((user, password))) => {
            options.user_and_password(user.to_string(), password.to_string())
        }
        Some(Err(token)) => options.token(token.to_string()),
        None => options,
    }
}

/// Whether the organism of `config` has an events stream on its NATS server, and the
/// others' there: `(present, other organisms' events streams)`. For the commands that read
/// an organism's stream (`restore`, `gateway`), which must not make one for a mistyped name.
/// Connects once (no retry: a server that does not answer is an error).
pub async fn events_streams(config: &NatsConfig) -> Result<(bool, Vec<String>), String> {
    use futures_util::StreamExt;
    let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let client = connect_options(config)
        .connect(urls.as_slice())
        .await
        .map_err(|e| format!("cannot use NATS at {}: {e}", config.url))?;
    let js = jetstream::new(client);
    let wanted = Names::new(&config.stream_prefix).events_stream();
    let mut names = js.stream_names();
    let mut others = Vec::new();
    let mut present = false;
    // Every name is read; at most 50 others are kept to show.
    while let Some(name) = names.next().await {
        let name = name.map_err(|e| format!("NATS at {}: listing streams: {e}", config.url))?;
        if name == wanted {
            present = true;
        } else if name.ends_with("_events") && others.len() < 50 {
            others.push(name);
        }
    }
    others.sort();
    Ok((present, others))
}

async fn ensure_streams(
    js: &jetstream::Context,
    names: &Names,
    (events_max_bytes, events_max_age): (u64, Duration),
) -> Result<Streams, String> {
    let work = js
        .get_or_create_stream(stream::Config {
            name: names.work_stream(),
            subjects: vec![format!(
                "{}.>",
                names.work_subject("").trim_end_matches('.')
            )],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            max_bytes: WORK_STREAM_MAX_BYTES,
            discard: stream::DiscardPolicy::New,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", names.work_stream()))?;
    let results = js
        .get_or_create_stream(stream::Config {
            name: names.results_stream(),
            subjects: vec![names.results_subject()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            max_bytes: RESULTS_STREAM_MAX_BYTES,
            discard: stream::DiscardPolicy::New,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", names.results_stream()))?;
    let events = js
        .get_or_create_stream(stream::Config {
            name: names.events_stream(),
            subjects: vec![names.events_subject()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_bytes: i64::try_from(events_max_bytes).unwrap_or(i64::MAX),
            max_age: events_max_age,
            discard: stream::DiscardPolicy::Old,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", names.events_stream()))?;
    let snapshot = js
        .get_or_create_stream(stream::Config {
            name: names.snapshot_stream(),
            subjects: vec![names.snapshot_subject()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_messages_per_subject: 1,
            max_bytes: SNAPSHOT_STREAM_MAX_BYTES,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", names.snapshot_stream()))?;
    Ok(Streams {
        work,
        results,
        events,
        snapshot,
    })
}

/// Why a command that reads an organism's events refuses a name with no stream.
pub fn missing_stream(config: &crate::config::NatsConfig, others: &[String]) -> String {
    let wanted = Names::new(&config.stream_prefix).events_stream();
    let there = if others.is_empty() {
        "it holds no organism's events stream yet (has the organism run with organism.nats?)"
            .to_string()
    } else {
        format!("its organisms' are {}", others.join(", "))
    };
    format!(
        "NATS at {} has no stream {wanted}: {there}; --organism NAME reads NAME's \
         (--stream-prefix P reads P_events)",
        config.url
    )
}
