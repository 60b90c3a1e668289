//! `/ws/messages?since=` from before the event ring: the gap read back from the store (each
//! message as it is now), then the ring from where the store read ended, then live events.
//! A gap the store cannot give whole (pruned, older than event numbers, or over
//! `limits.max_replay_messages` or the client's queue bytes) is `resync_required` as before.

use super::session::Session;
use super::Pump;
use crate::events::{Event, EventKind, Subscription};
use crate::store::Replay;

/// The newest events the store read leaves to the ring: published, but perhaps not yet
/// handed to the store's writer when it caught up.
const IN_FLIGHT: u64 = 256;

/// Offers the messages published after `since` up to near `head` from the store, and
/// subscribes from where they end: the subscription and that `seq`. `None` when the store
/// cannot give the whole gap, or the ring has moved past its end meanwhile.
pub(super) async fn from_store(
    s: &mut Session<Pump>,
    since: u64,
    head: u64,
) -> Option<(Subscription, u64)> {
    let organism = s.source.0.inner.organism.clone();
    let until = head.saturating_sub(IN_FLIGHT).max(since);
    // No more than the client's queue holds: a replay is not dropped in part.
    let max = (organism.config().limits.max_replay_messages).min(s.options.client_queue);
    if max == 0 {
        return None;
    }
    let bytes = s.options.client_queue_bytes;
    let o = organism.clone();
    let read = tokio::task::spawn_blocking(move || o.history().replay(since, until, max, bytes));
    let rows = match read.await {
        Ok(Ok(Replay::Whole(rows))) => rows,
        Ok(Ok(Replay::Unavailable(why))) => {
            tracing::debug!(
                since,
                until,
                why,
                "/ws/messages resumes with resync_required"
            );
            return None;
        }
        Ok(Err(e)) => {
            tracing::warn!(since, error = %e, "/ws/messages could not read its gap from the store");
            return None;
        }
        Err(_) => return None,
    };
    let sub = organism.events().subscribe_since(Some(until));
    if sub.resync_from.is_some() {
        return None;
    }
    for (seq, message) in rows {
        s.offer_from(&Event::new(seq, EventKind::Message { message }), false);
    }
    Some((sub, until))
}
