//! The API's JSON: a serializable, documented counterpart of each core type the API shows,
//! mapped from it here. The core's types carry no `utoipa` derives and no JSON shape of the
//! API; a view is made where an answer or a frame is written, and named as its OpenAPI
//! component (`Message`, `Thread`, `Agent`, `Organism`, …).
//!
//! A message's `payload` (its JSON view) is typed by the schema its receiver accepts its
//! payload type with, as the organism has it now ([`PayloadSchemas`]); a message to an
//! identity that is not a listener (`api`, …), or of a type its receiver no longer accepts,
//! shows its leaves as text. So a message shows the same JSON on every route, live or read
//! back from the store.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::pump::PayloadSchemas;
use crate::threads::MessageRecord;

/// A core enum's API counterpart: same variants, `snake_case` names, and a conversion each
/// way that the compiler checks is exhaustive.
macro_rules! mirror {
    ($(#[$meta:meta])* $name:ident = $core:path { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl From<$core> for $name {
            fn from(c: $core) -> Self {
                use $core as C;
                match c {
                    $(C::$variant => $name::$variant),+
                }
            }
        }

        impl From<$name> for $core {
            fn from(v: $name) -> Self {
                use $core as C;
                match v {
                    $($name::$variant => C::$variant),+
                }
            }
        }
    };
}

mirror!(
    ThreadStatus = crate::threads::ThreadStatus {
        Active,
        /// Nothing queued or running, at least one open input (a held message, a question).
        Waiting,
        Completed,
        Error,
        /// Stopped by an abort; the next inject to it revives it.
        Aborted,
        Killed,
    }
);

mirror!(
    MessageStatus = crate::threads::MessageStatus {
        /// Queued for, or being handled by, a listener.
        Pending,
        /// Stopped at its listener's approval gate until a person decides.
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
);

mirror!(
    /// Why a message exists.
    OriginKind = crate::threads::OriginKind {
        /// A client injected it.
        Inject,
        /// A listener's output while handling `of`.
        Reply,
        /// The pump's `<huh>` about `of`.
        Notice,
        /// A person's edit of the held message `of`, which it supersedes.
        Edit,
        /// The message `of`, which had failed, admitted again (`POST /messages/{id}/retry`).
        Retry,
        /// In a fork (`POST /threads/{id}/fork`): a copy of the message `of` of the thread
        /// forked, or `of` admitted again.
        Fork,
        /// The message `of` admitted again after its thread was rewound to it
        /// (`POST /threads/{id}/rewind`).
        Rewind,
    }
);

/// Why a message exists, and the message it came of.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageOrigin<'a> {
    pub kind: OriginKind,
    /// The message it came of (`null` for an inject).
    pub of: Option<&'a str>,
    /// On `/ws/messages`, where a message's fields are its frame's: the command that made
    /// it (as `origin` on every frame of `/ws`), when a client's command did.
    /// (Not in REST answers: left out of the document.)
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub cause: Option<CauseView<'a>>,
}

/// The client's command an event was caused by: its `request_id` (`X-Request-Id` on REST,
/// a `/ws` command's `request_id`) and the `/ws` connection (`conn` of its `connected`
/// frame; `null` for REST).
#[derive(Debug, Serialize, ToSchema)]
pub struct CauseView<'a> {
    #[schema(value_type = Object)]
    pub request_id: &'a serde_json::Value,
    pub conn: Option<&'a str>,
}

impl<'a> From<&'a crate::events::Cause> for CauseView<'a> {
    fn from(c: &'a crate::events::Cause) -> Self {
        CauseView {
            request_id: &c.request_id,
            conn: c.conn.as_deref(),
        }
    }
}

mirror!(
    /// Where an input stands; only `open` changes, once.
    InputStatus = crate::threads::InputStatus {
        Open,
        /// Let through, as it was or edited (`result_message_id`).
        Approved,
        /// Refused by a person: the message is `declined`.
        Declined,
        /// A question answered: its payloads were routed.
        Answered,
        /// Nobody decided in time: the gate's `on_timeout` was applied (`decision`).
        Expired,
        /// Nobody decided in time: a new input holds the message for `escalate_to`'s approvers.
        Escalated,
        /// Withdrawn: its thread was killed or aborted, or its listener removed.
        Cancelled,
    }
);

mirror!(
    /// What an input waits for.
    InputKind = crate::threads::InputKind {
        /// A message held at its listener's approval gate.
        Approval,
        /// A message to a `kind: human` listener, waiting for a person's answer.
        Question,
    }
);

mirror!(
    AgentState = crate::events::AgentState {
        Idle,
        Processing,
        /// An external agent owes a reply (and is not handling a delivery right now).
        Waiting,
        /// Idle, and its last handler call failed; the next successful call clears it.
        Error,
        Paused,
    }
);

mirror!(
    OrganismStatus = crate::events::OrganismStatus {
        Running,
        Paused,
        Stopping,
        Stopped,
    }
);

/// A point in time as the API writes it: RFC 3339, UTC, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Timestamp(pub crate::time::Timestamp);

impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::DateTime,
            )))
            .description(Some("RFC 3339, UTC, milliseconds"))
            .examples(["2026-01-15T10:30:01.123Z"])
            .into()
    }
}

impl ToSchema for Timestamp {}

impl From<crate::time::Timestamp> for Timestamp {
    fn from(t: crate::time::Timestamp) -> Self {
        Timestamp(t)
    }
}

/// The message object of SPEC §9, as serialized: the seed's fields plus ours.
#[derive(Debug, Serialize, ToSchema)]
pub struct Message<'a> {
    pub id: &'a str,
    pub thread_id: &'a str,
    /// The sender: a listener, an injector identity (`api`, `ws`, `cli`), or `system`.
    pub from: &'a str,
    /// The receiver; `null` when no route was found.
    pub to: Option<&'a str>,
    /// `{namespace}Local`, or `Local` without a namespace.
    pub payload_type: Option<&'a str>,
    /// The payload as JSON: child elements are keys, repeats arrays, attributes `@name`,
    /// mixed text `#text`; leaves typed as the schema declares.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// The normalized payload XML, as validated.
    pub payload_xml: &'a str,
    pub timestamp: Timestamp,
    /// The message this one answers or was produced from.
    pub parent_id: Option<&'a str>,
    /// Position in its thread, from 0.
    pub slot_index: u64,
    pub origin: MessageOrigin<'a>,
    /// Superseded by a rewind of its thread (`POST /threads/{id}/rewind`); shown only when
    /// it is, in a listing asked for with `include_superseded=true`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// (`status` and `error` come last: `api::frame` shows a new status by rewriting them.)
    pub status: MessageStatus,
    /// What went wrong, for operators.
    pub error: Option<&'a str>,
}

impl<'a> Message<'a> {
    /// The view of `m`, its payload typed by its receiver's schema in `schemas`.
    pub fn of(m: &'a MessageRecord, schemas: &PayloadSchemas) -> Self {
        let schema = match (&m.to, &m.payload_type) {
            (Some(to), Some(t)) => schemas.get(to, t),
            _ => None,
        };
        Message {
            id: &m.id,
            thread_id: &m.thread_id,
            from: &m.from,
            to: m.to.as_deref(),
            payload_type: m.payload_type.as_deref(),
            payload: crate::schema::payload_json(schema.map(|s| &**s), &m.payload_xml),
            payload_xml: &m.payload_xml,
            timestamp: m.timestamp.into(),
            parent_id: m.parent_id.as_deref(),
            slot_index: m.slot_index,
            origin: MessageOrigin {
                kind: m.origin.kind.into(),
                of: m.origin.of.as_deref(),
                cause: None,
            },
            superseded: false,
            status: m.status.into(),
            error: m.error.as_deref(),
        }
    }

    /// Views of `records`, typed against one snapshot of the organism's schemas.
    pub fn all(records: &'a [MessageRecord], schemas: &PayloadSchemas) -> Vec<Self> {
        Self::marked(records, schemas, &[])
    }

    /// [`Message::all`], each marked `superseded` if one of its thread's `rewinds` did.
    pub fn marked(
        records: &'a [MessageRecord],
        schemas: &PayloadSchemas,
        rewinds: &[crate::threads::Rewind],
    ) -> Vec<Self> {
        let mark = |m: &'a MessageRecord| Message {
            superseded: crate::threads::superseded(rewinds, m.slot_index),
            ..Message::of(m, schemas)
        };
        records.iter().map(mark).collect()
    }
}

/// A thread as the API shows it (seed Thread object).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Thread {
    pub id: String,
    pub status: ThreadStatus,
    pub participants: Vec<String>,
    pub message_count: u64,
    pub created_at: Timestamp,
    pub last_activity: Timestamp,
    pub error: Option<String>,
    /// What a client chose for the thread's LLM listeners (`PATCH /threads/{id}`); absent
    /// when nothing is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<ThreadSettings>,
    /// Its labels (`key: value`); absent when it has none. Keys under `agentserver.` are
    /// the server's (a fork's `agentserver.forked_from` and `agentserver.forked_at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// Paused (`POST /threads/{id}/pause`): its queued messages wait.
    pub paused: bool,
    /// The thread and message it was forked from (`POST /threads/{id}/fork`); absent when
    /// it is not a fork.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// Where a fork came from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkedFrom {
    pub thread: String,
    pub message: String,
}

impl ForkedFrom {
    /// What a thread's labels say it was forked from.
    fn of(labels: &crate::threads::Labels) -> Option<Self> {
        Some(ForkedFrom {
            thread: labels.get(crate::threads::FORKED_FROM)?.clone(),
            message: labels.get(crate::threads::FORKED_AT)?.clone(),
        })
    }
}

/// What a client chose for a thread's `kind: llm` listeners (`PATCH /threads/{id}`); each
/// listener applies what its `overridable` names.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ThreadSettings {
    /// A model of `models:` by name (`GET /models`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// 0 to 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

impl From<&crate::threads::ThreadSettings> for ThreadSettings {
    fn from(s: &crate::threads::ThreadSettings) -> Self {
        ThreadSettings {
            model: s.model.clone(),
            temperature: s.temperature,
        }
    }
}

impl From<crate::threads::ThreadInfo> for Thread {
    fn from(t: crate::threads::ThreadInfo) -> Self {
        Thread {
            id: t.id,
            status: t.status.into(),
            participants: t.participants,
            message_count: t.message_count,
            created_at: t.created_at.into(),
            last_activity: t.last_activity.into(),
            error: t.error,
            settings: t.settings.as_deref().map(ThreadSettings::from),
            forked_from: t.labels.as_deref().and_then(ForkedFrom::of),
            paused: t.paused,
            labels: t.labels.as_deref().cloned(),
        }
    }
}

/// A listener as observers see it: the seed's Agent object plus `kind`, `accepts` and
/// counters.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Agent {
    pub name: String,
    pub description: String,
    pub kind: String,
    pub is_agent: bool,
    pub peers: Vec<String>,
    /// The first accepted payload type (the seed's field; see `accepts` for all).
    pub payload_class: Option<String>,
    pub accepts: Vec<String>,
    pub state: AgentState,
    pub current_thread: Option<String>,
    pub queue_depth: usize,
    pub last_activity: Option<Timestamp>,
    /// Handler calls made.
    pub handled: u64,
    /// Handler calls that failed or panicked.
    pub errors: u64,
    /// Mean handler time, milliseconds.
    pub mean_handler_ms: f64,
    /// 99th percentile handler time, milliseconds (within 25 %).
    pub p99_handler_ms: f64,
}

impl From<crate::pump::AgentInfo> for Agent {
    fn from(a: crate::pump::AgentInfo) -> Self {
        Agent {
            name: a.name,
            description: a.description,
            kind: a.kind,
            is_agent: a.is_agent,
            peers: a.peers,
            payload_class: a.payload_class,
            accepts: a.accepts,
            state: a.state.into(),
            current_thread: a.current_thread,
            queue_depth: a.queue_depth,
            last_activity: a.last_activity.map(Timestamp),
            handled: a.handled,
            errors: a.errors,
            mean_handler_ms: a.mean_handler_ms,
            p99_handler_ms: a.p99_handler_ms,
        }
    }
}

/// The organism as observers see it: the seed's Organism object plus our additions.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Organism {
    pub name: String,
    pub status: OrganismStatus,
    pub uptime_seconds: u64,
    pub started_at: Timestamp,
    pub agent_count: usize,
    pub active_threads: usize,
    pub total_messages: u64,
    /// Messages queued or being handled.
    pub pending_messages: usize,
    /// Bumped by every successful reload.
    pub config_rev: u64,
    /// The `seq` of the last event.
    pub last_seq: u64,
}

impl From<crate::pump::OrganismInfo> for Organism {
    fn from(o: crate::pump::OrganismInfo) -> Self {
        Organism {
            name: o.name,
            status: o.status.into(),
            uptime_seconds: o.uptime_seconds,
            started_at: o.started_at.into(),
            agent_count: o.agent_count,
            active_threads: o.active_threads,
            total_messages: o.total_messages,
            pending_messages: o.pending_messages,
            config_rev: o.config_rev,
            last_seq: o.last_seq,
        }
    }
}

/// The answer to an accepted inject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct InjectReceipt {
    pub thread_id: String,
    pub message_id: String,
}

impl From<crate::InjectReceipt> for InjectReceipt {
    fn from(r: crate::InjectReceipt) -> Self {
        InjectReceipt {
            thread_id: r.thread_id.to_string(),
            message_id: r.message_id.to_string(),
        }
    }
}

/// What a reload changed. Also the body of the `reload` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReloadReport {
    /// The config revision now running.
    pub rev: u64,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
}

impl From<&crate::config::diff::ReloadReport> for ReloadReport {
    fn from(r: &crate::config::diff::ReloadReport) -> Self {
        ReloadReport {
            rev: r.rev,
            added: r.added.clone(),
            removed: r.removed.clone(),
            changed: r.changed.clone(),
            unchanged: r.unchanged.clone(),
        }
    }
}

/// One reason a reload was refused: the listener and key it is about, when it is about one.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadProblem<'a> {
    pub listener: Option<&'a str>,
    pub key: Option<&'a str>,
    pub message: &'a str,
}

impl<'a> From<&'a crate::config::diff::ReloadProblem> for ReloadProblem<'a> {
    fn from(p: &'a crate::config::diff::ReloadProblem) -> Self {
        ReloadProblem {
            listener: p.listener.as_deref(),
            key: p.key.as_deref(),
            message: &p.message,
        }
    }
}

/// What an accepted callback did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReplyReceipt {
    pub thread_id: String,
    /// The delivered message this reply answers (the parent of its payloads).
    pub in_reply_to: String,
    /// The payload types accepted, in order.
    pub payload_types: Vec<String>,
}

impl From<crate::pump::ReplyReceipt> for ReplyReceipt {
    fn from(r: crate::pump::ReplyReceipt) -> Self {
        ReplyReceipt {
            thread_id: r.thread_id,
            in_reply_to: r.in_reply_to,
            payload_types: r.payload_types,
        }
    }
}

/// One page of a list, with the total number of matches.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Paged<T> {
    pub items: Vec<T>,
    pub total: u64,
    /// The page size served: the one asked for (at most 1000), or, for messages, fewer when
    /// the page reached 16 MiB; the next page starts at `offset + limit`.
    pub limit: usize,
    pub offset: usize,
}

impl<T> Paged<T> {
    /// The page `p` with each item mapped by `f`.
    pub fn map<U>(p: crate::threads::Paged<U>, f: impl FnMut(U) -> T) -> Self {
        Paged {
            items: p.items.into_iter().map(f).collect(),
            total: p.total,
            limit: p.limit,
            offset: p.offset,
        }
    }
}
