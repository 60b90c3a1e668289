//! `agentserver restore`: a new store file rebuilt from an organism's mirrored event stream
//! (`organism.nats`).

use std::path::Path;
use std::time::Duration;

use crate::config::NatsConfig;
use crate::events::EventKind;
use crate::nats::mirror::{read, ReadFrom};
use crate::nats::Link;

/// How long `restore` waits for NATS to answer.
pub const RESTORE_CONNECT_WAIT: Duration = Duration::from_secs(30);

/// What a restore read and wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub events: u64,
    pub messages: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Events missing between the first and the last (dropped by the stream's limits, or
    /// never mirrored).
    pub missing: u64,
}

/// Writes a new store file at `store` from every event the stream holds: the messages,
/// their statuses and the threads, as the pump's store had them. Refuses to overwrite a
/// file.
pub async fn restore(config: &NatsConfig, store: &Path) -> Result<Restored, String> {
    if store.exists() {
        return Err(format!(
            "{} exists: restore writes a new store file (move it away, or name another)",
            store.display()
        ));
    }
    // A mistyped name must not read (or make) an empty stream: refuse it, naming those there.
    let (present, others) = crate::nats::events_streams(config).await?;
    if !present {
        return Err(crate::nats::missing_stream(config, &others));
    }
    let link = Link::connect(config, "agentserver restore").await?;
    if link
        .streams(tokio::time::Instant::now() + RESTORE_CONNECT_WAIT)
        .await
        .is_none()
    {
        return Err(format!(
            "NATS at {} did not answer within {} s",
            config.url,
            RESTORE_CONNECT_WAIT.as_secs()
        ));
    }
    let target =
        crate::store::Store::open(store).map_err(|e| format!("{}: {e}", store.display()))?;
    let mut done = Restored::default();
    read(
        &link,
        ReadFrom::Oldest,
        true,
        tokio_util::sync::CancellationToken::new(),
        |ev| {
            if done.events == 0 {
                done.first_seq = ev.seq;
            } else if ev.seq > done.last_seq + 1 {
                done.missing += ev.seq - done.last_seq - 1;
            }
            if ev.seq <= done.last_seq {
                return;
            }
            done.events += 1;
            done.last_seq = ev.seq;
            if matches!(ev.kind, EventKind::Message { .. }) {
                done.messages += 1;
            }
            target.record(ev.seq, &ev.kind);
        },
    )
    .await?;
    // Dropping the store commits everything it was sent.
    drop(target);
    Ok(done)
}
