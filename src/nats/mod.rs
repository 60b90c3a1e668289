//! Listeners placed on workers (`placement: workers`), through NATS JetStream.
//!
//! The pump stays the one gate and the one router. For a placed listener its handler is a
//! [`PlacedHandler`]: it publishes the validated delivery ([`WorkItem`]) to the work-queue
//! stream `<prefix>_work` on subject `<prefix>.work.<listener>` and waits for the answer. An
//! `agentserver worker` process pulls from that subject (a durable consumer per listener,
//! shared by every worker of it), validates the payload again against its own copy of the
//! listener's schema, runs the handler, and publishes the raw outputs ([`WorkResult`]) to
//! `<prefix>.results` (stream `<prefix>_results`), then acks. The pump matches a result to its
//! delivery by message id *and* the delivery's random nonce; its outputs then go through the
//! same gate as any in-process handler's: read, routed, validated. A result carries no
//! sender, thread or route of its own, so a worker cannot forge them.
//!
//! Since the handler call lasts until the answer comes, per (listener, thread) order,
//! `concurrency` and the organism's handler gate hold exactly as in-process.
//!
//! Failures: a worker that dies mid-call stops reporting progress (`AckKind::Progress`, every
//! third of `ack_wait`), so JetStream hands the delivery to another worker after `ack_wait`
//! (at-least-once). Its result is published with `Nats-Msg-Id` = the delivery's message id,
//! so a second result is dropped by JetStream's duplicate window, and one that comes later
//! still finds no open delivery at the pump and is dropped there: each delivery's outputs
//! enter the organism once. With no answer within `deliver_timeout` (no worker, NATS down)
//! the delivery fails with the reason, and is taken back out of the work stream.
//!
//! Workers announce themselves on `<prefix>.alive.<listener>` every second; `/readyz` names
//! a placed listener none has announced itself for lately ([`Placed::unserved`]).

pub mod event_wire;
mod event_wire_input;
mod event_wire_thread;
mod event_wire_usage;
#[cfg(test)]
mod format_tests;
mod link;
pub mod mirror;
mod placed;
mod wire;

pub use link::{events_streams, missing_stream, Link, Names};
pub use placed::{Metered, Metering, Placed, PlacedHandler};
pub use wire::{
    listener_version, WorkItem, WorkLog, WorkOutput, WorkResult, WorkUsage, MAX_LOG_LINES,
    MAX_LOG_LINE_BYTES, MAX_USAGE_ROWS,
};

/// How often a worker announces itself for each of its listeners.
pub const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A listener with no announcement for this long has no worker.
pub const ALIVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a task waits before trying NATS again after a failure.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// The value `rx` holds once it holds one, or `None` if `deadline` (if any) comes first or
/// the sender is gone.
pub(crate) async fn first_some<T: Clone>(
    rx: &tokio::sync::watch::Receiver<Option<T>>,
    deadline: Option<tokio::time::Instant>,
) -> Option<T> {
    let mut rx = rx.clone();
    let wait = async {
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        }
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, wait).await.ok().flatten(),
        None => wait.await,
    }
}

/// Waits [`RETRY_AFTER`]; false if `stop` came first (the caller ends).
pub async fn retry_after(stop: &tokio_util::sync::CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(RETRY_AFTER) => true,
    }
}

/// The next item of `stream` (`Some(None)` at its end); `None` if `stop` came first.
pub async fn next_or_stop<S: futures_util::Stream + Unpin>(
    stop: &tokio_util::sync::CancellationToken,
    stream: &mut S,
) -> Option<Option<S::Item>> {
    use futures_util::StreamExt;
    tokio::select! {
        _ = stop.cancelled() => None,
        n = stream.next() => Some(n),
    }
}
