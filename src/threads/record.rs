//! What a thread and a message are, as the registry keeps and reports them: statuses,
//! `MessageRecord`, `ThreadInfo`, the registry's errors and the values its operations take
//! and give.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::time::Timestamp;
use crate::xml::SharedXml;

/// Stored by these names (`snake_case`), as the API shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatus {
    Active,
    /// No queued or running work, and at least one open input (a held message, a question
    /// to a person): not finished, and not counted as active against a tenant's quota.
    Waiting,
    Completed,
    Error,
    /// Stopped by an abort: not final, the next inject revives it.
    Aborted,
    Killed,
}

impl ThreadStatus {
    /// Done for now: completed, error, aborted or killed (not active, not waiting).
    pub fn is_finished(self) -> bool {
        !matches!(self, ThreadStatus::Active | ThreadStatus::Waiting)
    }
}

/// Stored by these names (`snake_case`), as the API shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageStatus {
    /// Queued for, or being handled by, a listener.
    Pending,
    /// Stopped at its listener's approval gate, waiting for a person's decision.
    Held,
    /// Handled by its listener without error.
    Delivered,
    /// Reached a non-listener identity (`api`, `cli`, …): logged, streamed, ended.
    Terminal,
    /// Refused by the gate: malformed, or invalid against the receiver's schema.
    Rejected,
    /// No route, or a route the peers rules forbid.
    Undeliverable,
    /// The handler failed, panicked, or the thread's budget was exceeded.
    Failed,
    /// Dropped or cancelled by a kill, or by stop after its grace period.
    Killed,
    /// Refused at an approval gate by a person (not a failure).
    Declined,
    /// Replaced by an edited message.
    Superseded,
}

impl MessageStatus {
    /// Will not change again by itself (neither pending nor held).
    pub fn is_final(self) -> bool {
        !matches!(self, MessageStatus::Pending | MessageStatus::Held)
    }
}

/// One message in the log (SPEC §9 message object): what it is ([`MessageCore`], fixed when
/// it was logged and shared by every copy of the record: the registry's, its event's, the
/// queued job's) and its status, which changes. Reads of the core's fields go through
/// `Deref`.
#[derive(Debug, Clone)]
pub struct MessageRecord {
    core: Arc<MessageCore>,
    pub status: MessageStatus,
    pub error: Option<String>,
    /// The `seq` of the event that published it, in the copy the pump queues (a status
    /// event names it, `StatusAbout::message_seq`); 0 elsewhere.
    pub seq: u64,
}

/// What a message is, fixed when it is logged. One allocation shared by every copy of its
/// record, so copying a record costs one count on the message's own line, not one on each
/// name its listeners share with every other message.
#[derive(Debug, Clone)]
pub struct MessageCore {
    pub id: Arc<str>,
    pub thread_id: Arc<str>,
    pub parent_id: Option<Arc<str>>,
    pub slot_index: u64,
    pub from: Arc<str>,
    pub to: Option<Arc<str>>,
    /// Shared with the payload type it was read as.
    pub payload_type: Option<Arc<str>>,
    pub payload_xml: SharedXml,
    pub timestamp: Timestamp,
    pub origin: Origin,
}

impl MessageRecord {
    /// The record of a message `core` with `status` (and `error`), not yet published.
    pub fn new(core: MessageCore, status: MessageStatus, error: Option<String>) -> Self {
        MessageRecord {
            core: Arc::new(core),
            status,
            error,
            seq: 0,
        }
    }

    /// About how many bytes holding this record costs.
    pub fn weight(&self) -> usize {
        256 + self.payload_xml.len() + self.error.as_ref().map_or(0, String::len)
    }

    /// The part every copy shares.
    pub fn core(&self) -> &Arc<MessageCore> {
        &self.core
    }

    /// This record with its fixed part changed by `change` (a new core, for tests).
    #[cfg(test)]
    pub(crate) fn with_core(self, change: impl FnOnce(&mut MessageCore)) -> Self {
        let mut core = (*self.core).clone();
        change(&mut core);
        MessageRecord::new(core, self.status, self.error)
    }
}

impl std::ops::Deref for MessageRecord {
    type Target = MessageCore;

    fn deref(&self) -> &MessageCore {
        &self.core
    }
}

/// A thread: its status, participants and counters (the API's `Thread`).
#[derive(Debug, Clone)]
pub struct ThreadInfo {
    pub id: String,
    pub status: ThreadStatus,
    pub participants: Vec<String>,
    pub message_count: u64,
    pub created_at: Timestamp,
    pub last_activity: Timestamp,
    pub error: Option<String>,
    /// What a client chose for its LLM listeners (`PATCH /threads/{id}`).
    pub settings: Option<Arc<super::ThreadSettings>>,
    /// Its labels (`key: value`), for finding it.
    pub labels: Option<Arc<super::Labels>>,
    /// Paused (`POST /threads/{id}/pause`): its queued messages wait (kept in memory only).
    pub paused: bool,
    /// The tenant whose listener it was opened at (none: the organism's): whose quotas it
    /// counts against, and whose share of the history it is when retention prunes.
    pub owner: Option<Arc<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadError {
    #[error("thread id {}", ID_RULE)]
    InvalidId,
    #[error("thread {0} was killed")]
    Killed(String),
    #[error("no thread {0}")]
    NotFound(String),
    #[error("thread {0} exists: a fork opens a new thread")]
    Exists(String),
    #[error("thread {id} exceeded its budget of {max} messages")]
    BudgetExceeded { id: String, max: u64 },
    #[error("approval gates hold {held} ({limit} is the limit)")]
    TooManyHeld { held: String, limit: String },
    #[error("tenant `{owner}` has {max} active threads, its limit ({quota})")]
    TooManyActive {
        owner: String,
        max: usize,
        quota: String,
    },
    #[error("tenant `{owner}` has {max} messages pending in its threads, its limit ({quota})")]
    TooManyPending {
        owner: String,
        max: usize,
        quota: String,
    },
    #[error(
        "tenant `{owner}` has {bytes} bytes of payloads pending in its threads; {incoming} \
         more would pass its limit ({quota}: {max})"
    )]
    TooManyPendingBytes {
        owner: String,
        bytes: usize,
        incoming: usize,
        max: usize,
        quota: String,
    },
}

/// Whom a thread opened by an inject counts against (a tenant whose listener it was
/// injected to), and how many of its threads may be active at once.
pub struct Quota<'a> {
    pub owner: &'a str,
    pub max: usize,
    /// Messages pending in the owner's threads at once, at most, and the bytes of their
    /// payloads not yet handled.
    pub max_pending: usize,
    pub max_pending_bytes: usize,
    /// Where these bounds are set (`tenants.acme`, or `tenants.default`), for the errors.
    pub section: &'a str,
    /// The bytes of the payload the inject brings.
    pub incoming: usize,
}

/// A status change the pump should publish.
#[derive(Debug, Clone)]
pub struct StatusChange {
    pub thread_id: Arc<str>,
    pub status: ThreadStatus,
    pub message_count: u64,
    pub error: Option<String>,
    pub paused: bool,
    pub labels: Option<Arc<super::Labels>>,
}

/// What [`ThreadRegistry::open`](super::ThreadRegistry::open) did.
pub struct Opened {
    pub id: Arc<str>,
    /// The thread is new: publish `thread_created`.
    pub created: Option<ThreadInfo>,
    /// A finished thread became active again.
    pub reactivated: Option<StatusChange>,
}

/// Why a message exists: `inject` (a client sent it), `reply` (a listener's output while
/// handling `of`), `notice` (the pump's `<huh>` about `of`), `edit` (a person's edit of the
/// held message `of`, which it supersedes), `retry` (the message `of`, which had failed,
/// admitted again), `fork` (a copy, in a fork, of the message `of` in the thread forked; or
/// the message forked at, admitted again there), `rewind` (`of` admitted again after its
/// thread was rewound to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    Inject,
    Reply,
    Notice,
    Edit,
    Retry,
    Fork,
    Rewind,
}

impl OriginKind {
    pub fn name(self) -> &'static str {
        match self {
            OriginKind::Inject => "inject",
            OriginKind::Reply => "reply",
            OriginKind::Notice => "notice",
            OriginKind::Edit => "edit",
            OriginKind::Retry => "retry",
            OriginKind::Fork => "fork",
            OriginKind::Rewind => "rewind",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Inject,
            Self::Reply,
            Self::Notice,
            Self::Edit,
            Self::Retry,
            Self::Fork,
            Self::Rewind,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// A message's `origin {kind, of}`: why it exists, and the message it came of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub kind: OriginKind,
    pub of: Option<Arc<str>>,
}

impl Origin {
    /// What a message's sender and parent imply, for every kind but an edit: a message
    /// from `system` is a notice about its parent, one with a parent a reply to it, one
    /// without an inject. (The store keeps only an origin that differs from this.)
    pub fn implied(parent_id: Option<&Arc<str>>, from: &str) -> Self {
        let kind = match parent_id {
            Some(_) if from == SYSTEM_SENDER => OriginKind::Notice,
            Some(_) => OriginKind::Reply,
            None => OriginKind::Inject,
        };
        Origin {
            kind,
            of: parent_id.cloned(),
        }
    }

    /// A client's inject.
    pub fn inject() -> Self {
        Origin {
            kind: OriginKind::Inject,
            of: None,
        }
    }

    /// The message `of`, admitted again.
    pub fn retry(of: Arc<str>) -> Self {
        Origin {
            kind: OriginKind::Retry,
            of: Some(of),
        }
    }

    /// A person's edit of the held message `of`.
    pub fn edit(of: Arc<str>) -> Self {
        Origin {
            kind: OriginKind::Edit,
            of: Some(of),
        }
    }

    /// `of` admitted again after its thread was rewound to it.
    pub fn rewind(of: Arc<str>) -> Self {
        Origin {
            kind: OriginKind::Rewind,
            of: Some(of),
        }
    }

    /// A copy of `of` in a fork, or `of` admitted again there.
    pub fn fork(of: Arc<str>) -> Self {
        Origin {
            kind: OriginKind::Fork,
            of: Some(of),
        }
    }
}

/// The sender the pump's own messages have.
pub const SYSTEM_SENDER: &str = "system";

/// A message to append to a thread's log.
pub struct NewMessage {
    pub id: Arc<str>,
    pub parent_id: Option<Arc<str>>,
    pub from: Arc<str>,
    pub to: Option<Arc<str>>,
    pub payload_type: Option<Arc<str>>,
    pub payload_xml: SharedXml,
    pub status: MessageStatus,
    pub error: Option<String>,
    pub origin: Origin,
}

/// Ids a thread or a message may not have: the routes beside `/threads/{id}` and
/// `/messages/{id}` (`GET /threads/count`, `POST /threads/batch`, `POST /messages/retry`),
/// which would hide it.
pub const RESERVED_IDS: [&str; 3] = ["batch", "count", "retry"];

/// What a valid thread or message id is, said where one is refused.
pub const ID_RULE: &str =
    "must be 1-128 characters of A-Z a-z 0-9 _ -, and not batch, count or retry (routes)";

/// Thread (and message) ids are `[A-Za-z0-9_-]{1,128}` (SPEC §6), but none of
/// [`RESERVED_IDS`].
pub fn valid_thread_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !RESERVED_IDS.contains(&id)
}

/// A new id for a thread or a message: a UUID v7 (time-ordered), written straight into its
/// shared text (one allocation, not a `String` copied into an `Arc`). The ids of a process
/// sort in the order they were made, on every thread: the thread listing's order
/// (`created_at DESC, id DESC`) relies on it. Its bits: the millisecond (48), the version
/// (4), a counter of the millisecond's ids (12, then 10 after the variant's 2), random (52).
/// The counter starts at a random point of its lower half each millisecond, so two
/// processes' ids of one millisecond differ there too; at its end the millisecond moves on.
pub fn new_id() -> Arc<str> {
    let random: u128 = rand::random();
    let (ms, counter) = next_tick(&LAST, Timestamp::now().0, random as u64);
    let bits = u128::from(ms) << 80
        | 0x7 << 76
        | u128::from(counter >> 10) << 64
        | 0b10 << 62
        | u128::from(counter & 0x3ff) << 52
        | random >> 76;
    let mut buf = uuid::Uuid::encode_buffer();
    Arc::from(
        &*uuid::Uuid::from_u128(bits)
            .hyphenated()
            .encode_lower(&mut buf),
    )
}

/// Bits of the counter within a millisecond.
const COUNTER_BITS: u32 = 22;
const COUNTER_MAX: u64 = (1 << COUNTER_BITS) - 1;
/// Milliseconds an id can name (to the year 2109).
const MS_MAX: u64 = (1 << (64 - COUNTER_BITS)) - 1;

/// The last id's millisecond (high bits) and counter (low [`COUNTER_BITS`]). One atomic
/// word: every id a thread makes after another's (as seen through any synchronization) is
/// above it.
static LAST: AtomicU64 = AtomicU64::new(0);

/// The millisecond and counter of the next id after `last`'s, `now` being the clock's
/// millisecond: after the last id's even if the clock went back.
pub(super) fn next_tick(last_id: &AtomicU64, now: u64, random: u64) -> (u64, u64) {
    let seed = random & (COUNTER_MAX >> 1);
    let now = now.min(MS_MAX);
    let mut last = last_id.load(Ordering::Relaxed);
    loop {
        let (ms, counter) = (last >> COUNTER_BITS, last & COUNTER_MAX);
        let next = if now > ms {
            now << COUNTER_BITS | seed
        } else if counter < COUNTER_MAX {
            last + 1
        } else {
            (ms + 1).min(MS_MAX) << COUNTER_BITS | seed
        };
        match last_id.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return (next >> COUNTER_BITS, next & COUNTER_MAX),
            Err(seen) => last = seen,
        }
    }
}
