//! The event mirror's format, version 1, as written and read back: what
//! `tests/fixtures/mirrored_events_v1.jsonl` holds (see `event_wire`).

use std::sync::Arc;

use super::mirror::{body_of, parse, Frames};
use crate::config::diff::{ReloadProblem, ReloadReport};
use crate::events::{AgentState, Event, EventKind, OrganismStatus, StatusAbout};
use crate::threads::{MessageRecord, MessageStatus, ThreadInfo, ThreadStatus};
use crate::time::Timestamp;

const FIXTURE: &str = "tests/fixtures/mirrored_events_v1.jsonl";

/// A status change of message `m1` in slot 2 of `t1`, from `greeter`, published as event
/// `message_seq`, its frame weighing `message_bytes`.
fn greeters(message_seq: u64, message_bytes: usize) -> StatusAbout {
    let core = crate::threads::MessageCore {
        id: "m1".into(),
        thread_id: "t1".into(),
        parent_id: None,
        slot_index: 2,
        from: Arc::from("greeter"),
        to: None,
        payload_type: None,
        payload_xml: crate::xml::SharedXml::default(),
        timestamp: Timestamp(1),
        origin: crate::threads::Origin::inject(),
    };
    StatusAbout {
        message: Arc::new(core),
        message_seq,
        message_bytes,
    }
}

/// One event of each kind with every optional part given, as today's pump writes them.
/// An input opened and decided (an edit), as the mirror carries them.
fn input_events(t: Timestamp) -> Vec<EventKind> {
    let open = crate::threads::InputRow {
        id: "i1".into(),
        kind: crate::threads::InputKind::Approval,
        status: crate::threads::InputStatus::Open,
        thread_id: "t1".into(),
        message_id: "m2".into(),
        listener: "payments".into(),
        tenant: Some("acme".into()),
        from: "planner".into(),
        parent_id: Some("m1".into()),
        slot_index: 3,
        payload_type: "Refund".into(),
        payload_xml: std::sync::Arc::new("<Refund><amount>120</amount></Refund>".into()),
        prompt: Some("Refund 120".into()),
        requested_by: Some("key:alice".into()),
        created: t,
        expires: Some(Timestamp(t.0 + 86_400_000)),
        decided_by: None,
        decided: None,
        decision: None,
        reason: None,
        result: None,
    };
    vec![
        EventKind::InputRequested {
            input: std::sync::Arc::new(open.clone()),
        },
        EventKind::InputResolved {
            input: std::sync::Arc::new(crate::threads::InputRow {
                status: crate::threads::InputStatus::Approved,
                decided_by: Some("key:bob".into()),
                decided: Some(Timestamp(t.0 + 60_000)),
                decision: Some("edit".into()),
                reason: Some("capped".into()),
                result: Some("m3".into()),
                ..open
            }),
        },
    ]
}

fn events() -> Vec<Event> {
    let t = Timestamp(1_764_000_000_123);
    let message = MessageRecord::new(
        crate::threads::MessageCore {
            id: Arc::from("m1"),
            thread_id: Arc::from("t1"),
            parent_id: Some(Arc::from("m0")),
            slot_index: 2,
            from: Arc::from("greeter"),
            to: Some(Arc::from("shouter")),
            payload_type: Some("{urn:x}Greeting".into()),
            payload_xml: Arc::new("<Greeting xmlns=\"urn:x\"><name>Dan</name></Greeting>".into()),
            origin: crate::threads::Origin::implied(Some(&Arc::from("m0")), "greeter"),
            timestamp: t,
        },
        MessageStatus::Delivered,
        None,
    );
    let kinds = vec![
        EventKind::AgentState {
            agent: "greeter".into(),
            state: AgentState::Processing,
            current_thread: Some("t1".into()),
        },
        EventKind::Message { message },
        EventKind::MessageStatus {
            id: "m1".into(),
            thread_id: "t1".into(),
            status: MessageStatus::Failed,
            error: Some("boom".into()),
            about: Some(greeters(0, 0)),
        },
        EventKind::ThreadCreated {
            thread: ThreadInfo {
                id: "t1".into(),
                status: ThreadStatus::Active,
                participants: vec!["api".into(), "greeter".into()],
                message_count: 1,
                created_at: t,
                last_activity: t,
                error: None,
                settings: None,
                labels: None,
                paused: false,
                owner: None,
            },
        },
        EventKind::ThreadUpdated {
            thread_id: "t1".into(),
            status: ThreadStatus::Error,
            message_count: 3,
            error: Some("budget".into()),
            paused: false,
            labels: None,
        },
        EventKind::Error {
            thread_id: None,
            agent: Some("shouter".into()),
            error: "lua: x".into(),
        },
        EventKind::OrganismState {
            status: OrganismStatus::Paused,
        },
        EventKind::Reload {
            agent: None,
            ok: false,
            error: Some("refused".into()),
            problems: vec![ReloadProblem {
                line: Some(7),
                listener: Some("greeter".into()),
                key: Some("peers".into()),
                message: "names no listener".into(),
            }],
            diff: Some(ReloadReport {
                rev: 3,
                added: vec!["a".into()],
                removed: vec![],
                changed: vec!["b".into()],
                unchanged: vec!["c".into()],
            }),
        },
        EventKind::Audit {
            who: Some("key:ops".into()),
            action: "POST /api/v1/organism/pause".into(),
            target: None,
            result: "204".into(),
        },
        EventKind::Deployment {
            agent: "acme-bot".into(),
            tenant: Some("acme".into()),
            action: "deploy".into(),
            version: Some(2),
            from_version: Some(1),
            author: Some("key:acme".into()),
            ok: true,
            error: None,
        },
        EventKind::Log {
            agent: "shouter".into(),
            thread_id: Some("t1".into()),
            level: "warn".into(),
            message: "careful".into(),
        },
    ];
    let kinds = kinds
        .into_iter()
        .chain(input_events(t))
        .chain(thread_edits());
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event::numbered(i as u64 + 1, t, kind, None::<String>, ()))
        .collect()
}

/// A thread's settings changed, a thread paused, and one rewound.
fn thread_edits() -> [EventKind; 3] {
    let settings = EventKind::ThreadSettings {
        thread_id: "t1".into(),
        settings: Some(Arc::new(crate::threads::ThreadSettings {
            model: Some("small".into()),
            temperature: Some(0.5),
        })),
    };
    let paused = EventKind::ThreadUpdated {
        thread_id: "t1".into(),
        status: ThreadStatus::Active,
        message_count: 4,
        error: None,
        paused: true,
        labels: Some(Arc::new(
            [("customer".to_string(), "acme".to_string())].into(),
        )),
    };
    let rewound = EventKind::ThreadRewound {
        thread_id: "t1".into(),
        to: "m1".into(),
        rewind: crate::threads::Rewind {
            after: 1,
            before: 4,
        },
        superseded: 2,
    };
    [settings, paused, rewound]
}

/// What this build writes is the fixture, byte for byte (a change of the format is a new
/// version, not a silent drift); `AGENTSERVER_BLESS=1` writes it anew.
#[test]
fn the_format_written_is_version_one_as_kept() {
    let none = |_: &Event| Frames {
        frame: None,
        message_frame: None,
    };
    let written: String = events()
        .iter()
        .map(|ev| {
            // The last follows a run of deltas left out: it names the event before them.
            let after = (ev.seq == events().len() as u64).then(|| ev.seq - 3);
            let body = body_of(ev, &none(ev), after).unwrap();
            String::from_utf8(body.to_vec()).unwrap() + "\n"
        })
        .collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    if std::env::var_os("AGENTSERVER_BLESS").is_some() {
        // Lines from before versions are kept as they are: they are history.
        let before: String = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("{\"v\""))
            .map(|l| l.to_string() + "\n")
            .collect();
        std::fs::write(&path, written.clone() + &before).unwrap();
    }
    let kept = std::fs::read_to_string(&path).unwrap();
    let kept: String = kept
        .lines()
        .filter(|l| l.starts_with("{\"v\""))
        .map(|l| l.to_string() + "\n")
        .collect();
    assert_eq!(written, kept);
}

/// Every line of the fixture reads back as the event it was written from, those written
/// before the format had a version included; a newer format is refused, not misread.
#[test]
fn version_one_and_older_events_read_back_and_a_newer_format_is_refused() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    let kept = std::fs::read_to_string(path).unwrap();
    let expected = events();
    let mut unversioned = 0;
    for line in kept.lines().filter(|l| !l.trim().is_empty()) {
        let ev = parse(line.as_bytes()).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(ev.v, 1);
        unversioned += usize::from(!line.starts_with("{\"v\""));
        let want = &expected[ev.seq as usize - 1];
        assert_eq!(
            format!("{:?}", ev.kind),
            format!("{:?}", want.kind),
            "{line}"
        );
        assert_eq!(ev.timestamp, want.timestamp);
    }
    assert!(
        unversioned >= 1,
        "the fixture keeps a line from before versions"
    );
    let newer = kept
        .lines()
        .next()
        .unwrap()
        .replacen("{\"v\":1", "{\"v\":2", 1);
    let e = parse(newer.as_bytes()).unwrap_err();
    assert!(e.contains("format 2"), "{e}");
}

/// A status event's `message_seq` (added to version 1, absent when 0) reads back as written.
#[test]
fn a_status_events_message_seq_reads_back() {
    let about = greeters(41, 300);
    let kind = EventKind::MessageStatus {
        id: "m1".into(),
        thread_id: "t1".into(),
        status: MessageStatus::Delivered,
        error: None,
        about: Some(about),
    };
    let ev = Event::numbered(42, Timestamp(1), kind, None::<String>, ());
    let none = Frames {
        frame: None,
        message_frame: None,
    };
    let body = body_of(&ev, &none, None).unwrap();
    let back = parse(&body).unwrap();
    let EventKind::MessageStatus { about: Some(a), .. } = back.kind else {
        panic!("{:?}", back.kind)
    };
    assert_eq!((a.message_seq, a.message_bytes), (41, 300));
}

/// A message's origin (added to version 1) is carried only when its sender and parent do not
/// imply it, and reads back as written either way.
#[test]
fn a_messages_origin_reads_back() {
    use crate::threads::Origin;
    let none = Frames {
        frame: None,
        message_frame: None,
    };
    let reply = match events().remove(1).kind {
        EventKind::Message { message } => message,
        other => panic!("{other:?}"),
    };
    let edit = reply
        .clone()
        .with_core(|c| c.origin = Origin::edit(Arc::from("m9")));
    for (m, carried) in [(reply, false), (edit, true)] {
        let origin = m.origin.clone();
        let kind = EventKind::Message { message: m };
        let ev = Event::numbered(7, Timestamp(1), kind, None::<String>, ());
        let body = body_of(&ev, &none, None).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body).contains("\"origin\""),
            carried
        );
        let EventKind::Message { message } = parse(&body).unwrap().kind else {
            panic!("not a message")
        };
        assert_eq!(message.origin, origin);
    }
}

/// A `delta` (added to version 1) reads back as written.
#[test]
fn a_delta_reads_back() {
    let kind = EventKind::Delta(crate::events::Delta {
        thread_id: Arc::from("t1"),
        agent: Arc::from("planner"),
        in_reply_to: Arc::from("m1"),
        kind: crate::events::DeltaKind::Thinking,
        index: 3,
        delta: "hm".into(),
    });
    let ev = Event::numbered(9, Timestamp(1), kind, None::<String>, ());
    let none = Frames {
        frame: None,
        message_frame: None,
    };
    let back = parse(&body_of(&ev, &none, Some(6)).unwrap()).unwrap();
    assert_eq!(
        back.after,
        Some(6),
        "a run of deltas left out before it is named"
    );
    let EventKind::Delta(d) = back.kind else {
        panic!("{:?}", back.kind)
    };
    assert_eq!(
        (
            &*d.agent,
            &*d.in_reply_to,
            d.kind,
            d.index,
            d.delta.as_str()
        ),
        ("planner", "m1", crate::events::DeltaKind::Thinking, 3, "hm")
    );
}

/// A thread's tenant (added to version 1) reads back, so a store restored from the mirror
/// prunes it as the pump's does; a thread without one is written as before.
#[test]
fn a_threads_owner_reads_back() {
    let thread = |owner: Option<&str>| ThreadInfo {
        id: "t1".into(),
        status: ThreadStatus::Active,
        participants: vec![],
        message_count: 0,
        created_at: Timestamp(1),
        last_activity: Timestamp(1),
        error: None,
        settings: None,
        labels: None,
        paused: false,
        owner: owner.map(Arc::from),
    };
    let none = Frames {
        frame: None,
        message_frame: None,
    };
    for owner in [Some("acme"), None] {
        let kind = EventKind::ThreadCreated {
            thread: thread(owner),
        };
        let ev = Event::numbered(9, Timestamp(1), kind, None::<String>, ());
        let body = body_of(&ev, &none, None).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&body).contains("owner"),
            owner.is_some()
        );
        let EventKind::ThreadCreated { thread } = parse(&body).unwrap().kind else {
            panic!("not a thread")
        };
        assert_eq!(thread.owner.as_deref(), owner);
    }
}
