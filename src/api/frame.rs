//! The WebSocket frames of events: how an [`Event`] is written as JSON for `/ws` and for
//! `/ws/messages`. The hub keeps each rendered frame with its event, so a frame is rendered
//! once however many clients send it; this module is the one renderer.

use axum::extract::ws::Utf8Bytes;
use serde::Serialize;

use super::view::{
    AgentState, CauseView, Message, MessageStatus, OrganismStatus, ReloadProblem, ReloadReport,
    Thread, ThreadStatus, Timestamp,
};
use crate::events::{Event, EventKind, StatusAbout};
use crate::Organism;

/// The `/ws` frame of `ev`: one JSON object (`seq`, `timestamp`, `event`, fields), rendered
/// once. (`None` cannot happen: this is the only renderer of events.)
pub fn event_frame<'e>(ev: &'e Event, organism: &Organism) -> Option<&'e Utf8Bytes> {
    ev.frame(|ev| {
        let frame = Frame {
            seq: ev.seq,
            timestamp: ev.timestamp.into(),
            origin: ev.cause.as_deref().map(CauseView::from),
            kind: Kind::of(&ev.kind, organism),
        };
        Utf8Bytes::from(serde_json::to_string(&frame).unwrap_or_default())
    })
}

/// The `/ws/messages` frame of `ev`, rendered once: for a `message` event the message object
/// with `event` and `seq` beside its fields; for a `message_status` event its `/ws` frame
/// (`id`, `thread_id`, `from`, `to`, `payload_type`, `slot_index`, `status`, `error`).
/// `None` for other events.
pub fn message_frame<'e>(ev: &'e Event, organism: &Organism) -> Option<&'e Utf8Bytes> {
    ev.message_frame(|ev| match &ev.kind {
        EventKind::MessageStatus { about: Some(_), .. } => event_frame(ev, organism).cloned(),
        EventKind::Message { message } => {
            #[derive(Serialize)]
            struct MessageFrame<'a> {
                event: &'static str,
                seq: u64,
                #[serde(flatten)]
                message: Message<'a>,
            }
            let mut message = Message::of(message, &organism.schemas());
            message.origin.cause = ev.cause.as_deref().map(CauseView::from);
            serde_json::to_string(&MessageFrame {
                event: "message",
                seq: ev.seq,
                message,
            })
            .ok()
            .map(Utf8Bytes::from)
        }
        _ => None,
    })
    .and_then(Option::as_ref)
}

/// For a `message_status` event, the `/ws/messages` frame of the message it is about
/// (`held` gives that message's frame, asked for by the one client that renders it) showing
/// the event's status and error instead: rendered once, for every client that still holds
/// the message's frame when its status changes. `None` for other events.
pub fn merged_frame(ev: &Event, held: impl FnOnce() -> Option<Utf8Bytes>) -> Option<&Utf8Bytes> {
    let EventKind::MessageStatus { status, error, .. } = &ev.kind else {
        return None;
    };
    ev.merged_frame(|_| {
        held().and_then(|held| with_status(&held, (*status).into(), error.as_deref()))
    })
    .and_then(Option::as_ref)
}

/// `frame`, a message's `/ws/messages` frame (whose last fields are `status` and `error`),
/// showing `status` and `error`. `None` if it does not end with them. (Inside a JSON string
/// every `"` is escaped, so `,"status":"` is found only as the field itself.)
fn with_status(frame: &str, status: MessageStatus, error: Option<&str>) -> Option<Utf8Bytes> {
    let at = frame.rfind(r#","status":""#)?;
    let status = serde_json::to_string(&status).ok()?;
    let error = serde_json::to_string(&error).ok()?;
    let mut merged = String::with_capacity(at + status.len() + error.len() + 24);
    merged.push_str(&frame[..at]);
    merged.push_str(r#","status":"#);
    merged.push_str(&status);
    merged.push_str(r#","error":"#);
    merged.push_str(&error);
    merged.push('}');
    Some(Utf8Bytes::from(merged))
}

#[derive(Serialize)]
struct Frame<'a> {
    seq: u64,
    timestamp: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<CauseView<'a>>,
    #[serde(flatten)]
    kind: Kind<'a>,
}

/// Which message a `message_status` event is about.
#[derive(Serialize)]
struct About<'a> {
    from: &'a str,
    to: Option<&'a str>,
    payload_type: Option<&'a str>,
    slot_index: u64,
}

impl<'a> From<&'a StatusAbout> for About<'a> {
    fn from(a: &'a StatusAbout) -> Self {
        About {
            from: &a.from,
            to: a.to.as_deref(),
            payload_type: a.payload_type.as_deref(),
            slot_index: a.slot_index,
        }
    }
}

/// A `delta`'s fields.
#[derive(Serialize)]
struct DeltaFrame<'a> {
    thread_id: &'a str,
    agent: &'a str,
    in_reply_to: &'a str,
    kind: crate::events::DeltaKind,
    index: u64,
    delta: &'a str,
}

impl<'a> From<&'a crate::events::Delta> for DeltaFrame<'a> {
    fn from(d: &'a crate::events::Delta) -> Self {
        DeltaFrame {
            thread_id: &d.thread_id,
            agent: &d.agent,
            in_reply_to: &d.in_reply_to,
            kind: d.kind,
            index: d.index,
            delta: &d.delta,
        }
    }
}

/// A `usage`'s fields.
#[derive(Serialize)]
struct UsageFrame<'a> {
    tenant: Option<&'a str>,
    listener: &'a str,
    thread_id: &'a str,
    message_id: &'a str,
    model: &'a str,
    input_tokens: u64,
    output_tokens: u64,
    cached_tokens: u64,
    cost_micros: u64,
    estimated: bool,
    ms: u64,
}

impl<'a> From<&'a crate::events::Usage> for UsageFrame<'a> {
    fn from(u: &'a crate::events::Usage) -> Self {
        UsageFrame {
            tenant: u.tenant.as_deref(),
            listener: &u.listener,
            thread_id: &u.thread_id,
            message_id: &u.message_id,
            model: &u.model,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cached_tokens,
            cost_micros: u.cost_micros,
            estimated: u.estimated,
            ms: u.ms,
        }
    }
}

/// What happened. Shapes follow the seed API (`001_…txt`) with our additions.
#[derive(Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Kind<'a> {
    InputRequested {
        input: Box<super::inputs::Input>,
    },
    InputResolved {
        id: &'a str,
        status: super::view::InputStatus,
        decided_by: Option<&'a str>,
        decision: Option<&'a str>,
        reason: Option<&'a str>,
        thread_id: &'a str,
        listener: &'a str,
        message_id: &'a str,
        result_message_id: Option<&'a str>,
    },
    AgentState {
        agent: &'a str,
        state: AgentState,
        current_thread: Option<&'a str>,
    },
    Message {
        message: Message<'a>,
    },
    MessageStatus {
        id: &'a str,
        thread_id: &'a str,
        status: MessageStatus,
        error: Option<&'a str>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        about: Option<About<'a>>,
    },
    ThreadCreated {
        thread: Thread,
    },
    ThreadUpdated {
        thread_id: &'a str,
        status: ThreadStatus,
        message_count: u64,
        error: Option<&'a str>,
        /// Shown only when it is.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        paused: bool,
        /// Shown only when it has any.
        #[serde(skip_serializing_if = "Option::is_none")]
        labels: Option<&'a crate::threads::Labels>,
    },
    ThreadSettings {
        thread_id: &'a str,
        settings: Option<super::view::ThreadSettings>,
    },
    ThreadLabels {
        thread_id: &'a str,
        labels: Option<&'a crate::threads::Labels>,
    },
    ThreadRewound {
        thread_id: &'a str,
        /// The message rewound to, entering again.
        to: &'a str,
        /// Messages superseded: those of the thread with a slot above `after` and below
        /// `before`.
        superseded: u64,
        after: u64,
        before: u64,
    },
    Error {
        thread_id: Option<&'a str>,
        agent: Option<&'a str>,
        error: &'a str,
    },
    OrganismState {
        status: OrganismStatus,
    },
    Reload {
        agent: Option<&'a str>,
        ok: bool,
        error: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        problems: Vec<ReloadProblem<'a>>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        diff: Option<ReloadReport>,
    },
    Log {
        agent: &'a str,
        thread_id: Option<&'a str>,
        level: &'a str,
        message: &'a str,
    },
    Delta(DeltaFrame<'a>),
    Usage(UsageFrame<'a>),
    /// Never sent: no client sees an `Omitted` placeholder (`Filter::passes`).
    Omitted,
    Audit {
        who: Option<&'a str>,
        action: &'a str,
        target: Option<&'a str>,
        result: &'a str,
    },
    Deployment {
        agent: &'a str,
        tenant: Option<&'a str>,
        action: &'a str,
        version: Option<u64>,
        from_version: Option<u64>,
        author: Option<&'a str>,
        ok: bool,
        error: Option<&'a str>,
    },
}

impl<'a> Kind<'a> {
    /// A thread's settings or labels changed.
    fn edit(kind: &'a EventKind) -> Self {
        match kind {
            EventKind::ThreadSettings {
                thread_id,
                settings,
            } => Kind::ThreadSettings {
                thread_id,
                settings: settings.as_deref().map(Into::into),
            },
            EventKind::ThreadLabels { thread_id, labels } => Kind::ThreadLabels {
                thread_id,
                labels: labels.as_deref(),
            },
            EventKind::ThreadRewound {
                thread_id,
                to,
                superseded,
                rewind,
            } => Kind::ThreadRewound {
                thread_id,
                to,
                superseded: *superseded,
                after: rewind.after,
                before: rewind.before,
            },
            _ => Kind::Omitted,
        }
    }

    fn deployment(kind: &'a EventKind) -> Self {
        match kind {
            EventKind::Deployment {
                agent,
                tenant,
                action,
                version,
                from_version,
                author,
                ok,
                error,
            } => Kind::Deployment {
                agent,
                tenant: tenant.as_deref(),
                action,
                version: *version,
                from_version: *from_version,
                author: author.as_deref(),
                ok: *ok,
                error: error.as_deref(),
            },
            _ => Kind::Omitted,
        }
    }

    fn resolved(r: &'a crate::threads::InputRow) -> Self {
        Kind::InputResolved {
            id: &r.id,
            status: r.status.into(),
            decided_by: r.decided_by.as_deref(),
            decision: r.decision.as_deref(),
            reason: r.reason.as_deref(),
            thread_id: &r.thread_id,
            listener: &r.listener,
            message_id: &r.message_id,
            result_message_id: r.result.as_deref(),
        }
    }

    fn of(kind: &'a EventKind, organism: &Organism) -> Self {
        match kind {
            EventKind::InputRequested { input } => Kind::InputRequested {
                input: Box::new(super::inputs::Input::of(input, organism)),
            },
            EventKind::InputResolved { input } => Kind::resolved(input),
            EventKind::AgentState {
                agent,
                state,
                current_thread,
            } => Kind::AgentState {
                agent,
                state: (*state).into(),
                current_thread: current_thread.as_deref(),
            },
            EventKind::Message { message } => Kind::Message {
                message: Message::of(message, &organism.schemas()),
            },
            EventKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
                about,
            } => Kind::MessageStatus {
                id,
                thread_id,
                status: (*status).into(),
                error: error.as_deref(),
                about: about.as_ref().map(About::from),
            },
            EventKind::ThreadCreated { thread } => Kind::ThreadCreated {
                thread: thread.clone().into(),
            },
            EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
                paused,
                labels,
            } => Kind::ThreadUpdated {
                thread_id,
                status: (*status).into(),
                message_count: *message_count,
                error: error.as_deref(),
                paused: *paused,
                labels: labels.as_deref(),
            },
            EventKind::ThreadSettings { .. }
            | EventKind::ThreadLabels { .. }
            | EventKind::ThreadRewound { .. } => Kind::edit(kind),
            EventKind::Error {
                thread_id,
                agent,
                error,
            } => Kind::Error {
                thread_id: thread_id.as_deref(),
                agent: agent.as_deref(),
                error,
            },
            EventKind::OrganismState { status } => Kind::OrganismState {
                status: (*status).into(),
            },
            EventKind::Reload {
                agent,
                ok,
                error,
                problems,
                diff,
            } => Kind::Reload {
                agent: agent.as_deref(),
                ok: *ok,
                error: error.as_deref(),
                problems: problems.iter().map(ReloadProblem::from).collect(),
                diff: diff.as_ref().map(ReloadReport::from),
            },
            EventKind::Log {
                agent,
                thread_id,
                level,
                message,
            } => Kind::Log {
                agent,
                thread_id: thread_id.as_deref(),
                level,
                message,
            },
            EventKind::Delta(d) => Kind::Delta(d.into()),
            EventKind::Usage(u) => Kind::Usage((&**u).into()),
            EventKind::Omitted => Kind::Omitted,
            EventKind::Audit {
                who,
                action,
                target,
                result,
            } => Kind::Audit {
                who: who.as_deref(),
                action,
                target: target.as_deref(),
                result,
            },
            EventKind::Deployment { .. } => Kind::deployment(kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventHub;
    use crate::threads::{MessageRecord, ThreadStatus};
    use std::sync::Arc;

    fn organism() -> Organism {
        let yaml = "organism: { name: frames, store: memory }\nlisteners:\n  \
                    - { name: a, description: typed, kind: native, handler: sink, fields: { Ping: { n: integer } } }\n";
        let names = crate::listener::HandlerRegistry::default();
        let config = crate::config::load_str(
            yaml,
            "frames.yaml",
            std::path::Path::new("."),
            crate::config::Known {
                handlers: &names.names(),
                check_script: crate::lua::check_syntax,
            },
        )
        .unwrap();
        Organism::builder().build(config).unwrap()
    }

    #[tokio::test]
    async fn events_serialize_flat_with_their_type_seq_and_timestamp() {
        let organism = organism();
        let hub = EventHub::new(4);
        let mut rx = hub.subscribe();
        hub.publish(EventKind::ThreadUpdated {
            thread_id: "t".into(),
            status: ThreadStatus::Completed,
            message_count: 3,
            error: None,
            paused: false,
            labels: None,
        });
        let ev = rx.try_recv().unwrap();
        let frame = event_frame(&ev, &organism).unwrap();
        let json: serde_json::Value = serde_json::from_str(frame.as_str()).unwrap();
        assert_eq!(json["event"], "thread_updated");
        assert_eq!(json["seq"], 1);
        assert_eq!(json["status"], "completed");
        assert_eq!(json["message_count"], 3);
        assert!(json["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(hub.last_seq(), 1);
        // Rendered once: every client sends the same buffer.
        assert_eq!(
            event_frame(&ev, &organism).unwrap().as_str().as_ptr(),
            frame.as_str().as_ptr()
        );
        assert!(message_frame(&ev, &organism).is_none());
    }

    fn record(to: &str) -> MessageRecord {
        MessageRecord::new(
            crate::threads::MessageCore {
                id: Arc::from("m"),
                thread_id: Arc::from("t"),
                parent_id: None,
                slot_index: 0,
                from: Arc::from("api"),
                to: Some(Arc::from(to)),
                payload_type: Some("Ping".into()),
                payload_xml: crate::xml::SharedXml::new("<Ping><n>7</n></Ping>".into()),
                origin: crate::threads::Origin::inject(),
                timestamp: crate::time::Timestamp::now(),
            },
            crate::threads::MessageStatus::Pending,
            None,
        )
    }

    #[tokio::test]
    async fn a_message_is_typed_by_its_receivers_schema_and_untyped_without_one() {
        let organism = organism();
        for (to, n) in [("a", serde_json::json!(7)), ("api", serde_json::json!("7"))] {
            let ev = Event::new(
                5,
                EventKind::Message {
                    message: record(to),
                },
            );
            let frame: serde_json::Value =
                serde_json::from_str(event_frame(&ev, &organism).unwrap().as_str()).unwrap();
            assert_eq!(frame["event"], "message");
            assert_eq!(frame["message"]["payload"]["n"], n, "to {to}");
            let flat: serde_json::Value =
                serde_json::from_str(message_frame(&ev, &organism).unwrap().as_str()).unwrap();
            assert_eq!(
                (&flat["event"], &flat["seq"]),
                (&"message".into(), &5.into())
            );
            assert_eq!(flat["payload"]["n"], n, "to {to}");
        }
    }
}
