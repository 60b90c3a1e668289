//! The event mirror's format on JetStream: every event kind as the stream carries it, owned
//! here so the core's types (`EventKind`, `MessageRecord`, `ThreadInfo`, the reload's
//! report) carry no serde form of their own. The format is versioned ([`FORMAT`], the `v`
//! of each mirrored event); a reader refuses an event of a version it does not know instead
//! of misreading it, and `tests/fixtures/mirrored_events_v1.jsonl` is what this version
//! writes, read back by `format_tests.rs`.
//!
//! Version 1's shape is serde's of the core types as they were when the mirror began
//! (`{"message": {"message": {…}}}`, snake case), so streams written before `v` existed
//! read as version 1.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub(super) use super::event_wire_input::WireInput;
pub(super) use super::event_wire_thread::WireThread;
pub(super) use super::event_wire_usage::{WireDelta, WireUsage};
use crate::config::diff::{ReloadProblem, ReloadReport};
use crate::events::{AgentState, EventKind, OrganismStatus, StatusAbout};
use crate::threads::{
    MessageCore, MessageRecord, MessageStatus, Origin, OriginKind, ThreadSettings, ThreadStatus,
};
use crate::time::Timestamp;

/// The version of the format this build writes (and the newest it reads).
pub const FORMAT: u32 = 1;

/// One event kind on the stream.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum WireKind {
    AgentState {
        agent: Arc<str>,
        state: AgentState,
        current_thread: Option<Arc<str>>,
    },
    Message {
        message: WireMessage,
    },
    MessageStatus {
        id: Arc<str>,
        thread_id: Arc<str>,
        status: MessageStatus,
        error: Option<String>,
        about: Option<WireAbout>,
    },
    ThreadCreated {
        thread: WireThread,
    },
    ThreadUpdated {
        thread_id: Arc<str>,
        status: ThreadStatus,
        message_count: u64,
        error: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        paused: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        labels: Option<crate::threads::Labels>,
    },
    ThreadSettings {
        thread_id: Arc<str>,
        settings: Option<ThreadSettings>,
    },
    ThreadLabels {
        thread_id: Arc<str>,
        labels: Option<crate::threads::Labels>,
    },
    ThreadRewound {
        thread_id: Arc<str>,
        to: Arc<str>,
        rewind: crate::threads::Rewind,
        superseded: u64,
    },
    Error {
        thread_id: Option<String>,
        agent: Option<String>,
        error: String,
    },
    OrganismState {
        status: OrganismStatus,
    },
    InputRequested {
        input: WireInput,
    },
    InputResolved {
        input: WireInput,
    },
    Reload {
        agent: Option<String>,
        ok: bool,
        error: Option<String>,
        problems: Vec<WireProblem>,
        diff: Option<WireReport>,
    },
    Audit {
        who: Option<String>,
        action: String,
        target: Option<String>,
        result: String,
    },
    Deployment {
        agent: String,
        tenant: Option<String>,
        action: String,
        version: Option<u64>,
        from_version: Option<u64>,
        author: Option<String>,
        ok: bool,
        error: Option<String>,
    },
    Log {
        agent: String,
        thread_id: Option<String>,
        level: String,
        message: String,
    },
    Delta(WireDelta),
    Usage(WireUsage),
    Omitted,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireAbout {
    from: Arc<str>,
    to: Option<Arc<str>>,
    payload_type: Option<Arc<str>>,
    slot_index: u64,
    /// Absent (0) in streams written before it was added.
    #[serde(default, skip_serializing_if = "is_zero")]
    message_seq: u64,
    /// Absent (0) in streams written before it was added.
    #[serde(default, skip_serializing_if = "is_zero")]
    message_bytes: u64,
}

impl From<&StatusAbout> for WireAbout {
    fn from(a: &StatusAbout) -> Self {
        WireAbout {
            from: a.from.clone(),
            to: a.to.clone(),
            payload_type: a.payload_type.clone(),
            slot_index: a.slot_index,
            message_seq: a.message_seq,
            message_bytes: a.message_bytes as u64,
        }
    }
}

impl WireAbout {
    /// The message as another process named it: a core holding its names, without the
    /// payload, time and origin a status event does not carry.
    fn about(self, id: &Arc<str>, thread_id: &Arc<str>) -> StatusAbout {
        let named = MessageCore {
            id: id.clone(),
            thread_id: thread_id.clone(),
            parent_id: None,
            slot_index: self.slot_index,
            from: self.from,
            to: self.to,
            payload_type: self.payload_type,
            payload_xml: crate::xml::SharedXml::default(),
            timestamp: Timestamp(0),
            origin: Origin::inject(),
        };
        StatusAbout {
            message: Arc::new(named),
            message_seq: self.message_seq,
            // Read back, it only weighs the event in a gateway's hub: a figure past a
            // gigabyte is not believed (it would empty the hub).
            message_bytes: usize::try_from(self.message_bytes)
                .unwrap_or(0)
                .min(1 << 30),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireMessage {
    id: Arc<str>,
    thread_id: Arc<str>,
    parent_id: Option<Arc<str>>,
    slot_index: u64,
    from: Arc<str>,
    to: Option<Arc<str>>,
    payload_type: Option<Arc<str>>,
    payload_xml: Arc<String>,
    status: MessageStatus,
    error: Option<String>,
    timestamp: Timestamp,
    /// Only an origin its sender and parent do not imply (`Origin::implied`): absent in
    /// streams written before it was added, and for most messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<WireOrigin>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireOrigin {
    kind: OriginKind,
    of: Option<Arc<str>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireProblem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line: Option<usize>,
    listener: Option<String>,
    key: Option<String>,
    message: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireReport {
    rev: u64,
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
    unchanged: Vec<String>,
}

impl From<&MessageRecord> for WireMessage {
    fn from(m: &MessageRecord) -> Self {
        WireMessage {
            id: m.id.clone(),
            thread_id: m.thread_id.clone(),
            parent_id: m.parent_id.clone(),
            slot_index: m.slot_index,
            from: m.from.clone(),
            to: m.to.clone(),
            payload_type: m.payload_type.clone(),
            payload_xml: m.payload_xml.clone(),
            status: m.status,
            error: m.error.clone(),
            timestamp: m.timestamp,
            origin: (m.origin != Origin::implied(m.parent_id.as_ref(), &m.from)).then(|| {
                WireOrigin {
                    kind: m.origin.kind,
                    of: m.origin.of.clone(),
                }
            }),
        }
    }
}

impl From<WireMessage> for MessageRecord {
    fn from(m: WireMessage) -> Self {
        let origin = match m.origin {
            Some(o) => Origin {
                kind: o.kind,
                of: o.of,
            },
            None => Origin::implied(m.parent_id.as_ref(), &m.from),
        };
        MessageRecord::new(
            MessageCore {
                origin,
                id: m.id,
                thread_id: m.thread_id,
                parent_id: m.parent_id,
                slot_index: m.slot_index,
                from: m.from,
                to: m.to,
                payload_type: m.payload_type,
                payload_xml: m.payload_xml,
                timestamp: m.timestamp,
            },
            m.status,
            m.error,
        )
    }
}

impl From<&ReloadProblem> for WireProblem {
    fn from(p: &ReloadProblem) -> Self {
        WireProblem {
            line: p.line,
            listener: p.listener.clone(),
            key: p.key.clone(),
            message: p.message.clone(),
        }
    }
}

impl From<WireProblem> for ReloadProblem {
    fn from(p: WireProblem) -> Self {
        ReloadProblem {
            line: p.line,
            listener: p.listener,
            key: p.key,
            message: p.message,
        }
    }
}

impl From<&ReloadReport> for WireReport {
    fn from(r: &ReloadReport) -> Self {
        WireReport {
            rev: r.rev,
            added: r.added.clone(),
            removed: r.removed.clone(),
            changed: r.changed.clone(),
            unchanged: r.unchanged.clone(),
        }
    }
}

impl From<WireReport> for ReloadReport {
    fn from(r: WireReport) -> Self {
        ReloadReport {
            rev: r.rev,
            added: r.added,
            removed: r.removed,
            changed: r.changed,
            unchanged: r.unchanged,
        }
    }
}

impl WireKind {
    /// A listener's log line.
    fn log(k: &EventKind) -> WireKind {
        match k {
            EventKind::Log {
                agent,
                thread_id,
                level,
                message,
            } => WireKind::Log {
                agent: agent.clone(),
                thread_id: thread_id.clone(),
                level: level.clone(),
                message: message.clone(),
            },
            _ => WireKind::Omitted,
        }
    }

    /// A thread's settings or labels changed.
    fn edit(k: &EventKind) -> WireKind {
        match k {
            EventKind::ThreadSettings {
                thread_id,
                settings,
            } => WireKind::ThreadSettings {
                thread_id: thread_id.clone(),
                settings: settings.as_deref().cloned(),
            },
            EventKind::ThreadLabels { thread_id, labels } => WireKind::ThreadLabels {
                thread_id: thread_id.clone(),
                labels: labels.as_deref().cloned(),
            },
            EventKind::ThreadRewound {
                thread_id,
                to,
                rewind,
                superseded,
            } => WireKind::ThreadRewound {
                thread_id: thread_id.clone(),
                to: to.clone(),
                rewind: *rewind,
                superseded: *superseded,
            },
            _ => WireKind::Omitted,
        }
    }
}

/// A thread's settings or labels changed.
fn edit_event(k: WireKind) -> EventKind {
    match k {
        WireKind::ThreadSettings {
            thread_id,
            settings,
        } => EventKind::ThreadSettings {
            thread_id,
            settings: settings.and_then(ThreadSettings::kept),
        },
        WireKind::ThreadLabels { thread_id, labels } => EventKind::ThreadLabels {
            thread_id,
            labels: labels.filter(|l| !l.is_empty()).map(Arc::new),
        },
        WireKind::ThreadRewound {
            thread_id,
            to,
            rewind,
            superseded,
        } => EventKind::ThreadRewound {
            thread_id,
            to,
            rewind,
            superseded,
        },
        _ => EventKind::Omitted,
    }
}

impl From<&EventKind> for WireKind {
    fn from(k: &EventKind) -> Self {
        match k {
            EventKind::AgentState {
                agent,
                state,
                current_thread,
            } => WireKind::AgentState {
                agent: agent.clone(),
                state: *state,
                current_thread: current_thread.clone(),
            },
            EventKind::Message { message } => WireKind::Message {
                message: message.into(),
            },
            EventKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
                about,
            } => WireKind::MessageStatus {
                id: id.clone(),
                thread_id: thread_id.clone(),
                status: *status,
                error: error.clone(),
                about: about.as_ref().map(WireAbout::from),
            },
            EventKind::ThreadCreated { thread } => WireKind::ThreadCreated {
                thread: thread.into(),
            },
            EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
                paused,
                labels,
            } => WireKind::ThreadUpdated {
                thread_id: thread_id.clone(),
                status: *status,
                message_count: *message_count,
                error: error.clone(),
                paused: *paused,
                labels: labels.as_deref().cloned(),
            },
            EventKind::ThreadSettings { .. }
            | EventKind::ThreadLabels { .. }
            | EventKind::ThreadRewound { .. } => WireKind::edit(k),
            EventKind::Error {
                thread_id,
                agent,
                error,
            } => WireKind::Error {
                thread_id: thread_id.clone(),
                agent: agent.clone(),
                error: error.clone(),
            },
            EventKind::OrganismState { status } => WireKind::OrganismState { status: *status },
            EventKind::Reload {
                agent,
                ok,
                error,
                problems,
                diff,
            } => WireKind::Reload {
                agent: agent.clone(),
                ok: *ok,
                error: error.clone(),
                problems: problems.iter().map(Into::into).collect(),
                diff: diff.as_ref().map(Into::into),
            },
            EventKind::Audit {
                who,
                action,
                target,
                result,
            } => WireKind::Audit {
                who: who.clone(),
                action: action.clone(),
                target: target.clone(),
                result: result.clone(),
            },
            EventKind::Deployment {
                agent,
                tenant,
                action,
                version,
                from_version,
                author,
                ok,
                error,
            } => WireKind::Deployment {
                agent: agent.clone(),
                tenant: tenant.clone(),
                action: action.clone(),
                version: *version,
                from_version: *from_version,
                author: author.clone(),
                ok: *ok,
                error: error.clone(),
            },
            EventKind::InputRequested { input } => WireKind::InputRequested {
                input: (&**input).into(),
            },
            EventKind::InputResolved { input } => WireKind::InputResolved {
                input: (&**input).into(),
            },
            EventKind::Log { .. } => WireKind::log(k),
            EventKind::Delta(d) => WireKind::Delta(d.into()),
            EventKind::Usage(u) => WireKind::Usage((&**u).into()),
            EventKind::Omitted => WireKind::Omitted,
        }
    }
}

impl From<WireKind> for EventKind {
    fn from(k: WireKind) -> Self {
        match k {
            WireKind::AgentState {
                agent,
                state,
                current_thread,
            } => EventKind::AgentState {
                agent,
                state,
                current_thread,
            },
            WireKind::Message { message } => EventKind::Message {
                message: message.into(),
            },
            WireKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
                about,
            } => EventKind::MessageStatus {
                about: about.map(|a| a.about(&id, &thread_id)),
                id,
                thread_id,
                status,
                error,
            },
            WireKind::ThreadCreated { thread } => EventKind::ThreadCreated {
                thread: thread.into(),
            },
            WireKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
                paused,
                labels,
            } => EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
                paused,
                labels: labels.filter(|l| !l.is_empty()).map(Arc::new),
            },
            k @ (WireKind::ThreadSettings { .. }
            | WireKind::ThreadLabels { .. }
            | WireKind::ThreadRewound { .. }) => edit_event(k),
            WireKind::Error {
                thread_id,
                agent,
                error,
            } => EventKind::Error {
                thread_id,
                agent,
                error,
            },
            WireKind::OrganismState { status } => EventKind::OrganismState { status },
            WireKind::Reload {
                agent,
                ok,
                error,
                problems,
                diff,
            } => EventKind::Reload {
                agent,
                ok,
                error,
                problems: problems.into_iter().map(Into::into).collect(),
                diff: diff.map(Into::into),
            },
            WireKind::Audit {
                who,
                action,
                target,
                result,
            } => EventKind::Audit {
                who,
                action,
                target,
                result,
            },
            WireKind::Deployment {
                agent,
                tenant,
                action,
                version,
                from_version,
                author,
                ok,
                error,
            } => EventKind::Deployment {
                agent,
                tenant,
                action,
                version,
                from_version,
                author,
                ok,
                error,
            },
            WireKind::InputRequested { input: i } => EventKind::InputRequested { input: i.into() },
            WireKind::InputResolved { input: i } => EventKind::InputResolved { input: i.into() },
            WireKind::Log {
                agent,
                thread_id,
                level,
                message,
            } => EventKind::Log {
                agent,
                thread_id,
                level,
                message,
            },
            WireKind::Delta(d) => EventKind::Delta(d.into()),
            WireKind::Usage(u) => EventKind::Usage(Box::new(u.into())),
            WireKind::Omitted => EventKind::Omitted,
        }
    }
}
