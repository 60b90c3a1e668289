//! Routing (SPEC §6) against the real pump: payload types, `to`, broadcast, peers, replies,
//! identity.

use crate::common::*;
use agentserver::listener::{Delivery, FnHandler, HandlerError, Output};
use agentserver::pump::{FailureKind, InjectError};
use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::{InjectRequest, Organism};

fn emitting(outputs: Vec<Output>) -> impl agentserver::listener::Handler {
    FnHandler(move |_d: Delivery| {
        let o = outputs.clone();
        async move { Ok(o) }
    })
}

#[tokio::test]
async fn output_is_routed_by_payload_type() {
    // An output without `to` goes to the listener that accepts its type.
    let log = Log::default();
    let builder = Organism::builder()
        .handler(
            "emit",
            emitting(vec![Output::broadcast("<Pong><n>1</n></Pong>")]),
        )
        .handler("log", log.handler());
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: emits Pong, kind: native, handler: emit, schema: t.xsd, accepts: [Ping] }
  - { name: b, description: takes Pong, kind: native, handler: log, schema: t.xsd, accepts: [Pong] }
"#,
    );
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms.len(), 2);
    assert_eq!((&*ms[1].from, to_of(&ms[1])), ("a", "b"));
    assert_eq!(ms[1].parent_id.as_deref(), Some(&*ms[0].id));
    assert_eq!(ms[1].slot_index, 1);
    assert_eq!(log.entries()[0].2, "<Pong><n>1</n></Pong>");
}

#[tokio::test]
async fn to_a_listener_that_does_not_accept_the_type_is_undeliverable() {
    let builder = Organism::builder()
        .handler(
            "emit",
            emitting(vec![Output::to("b", "<Ping><n>2</n></Ping>")]),
        )
        .handler("sink2", emitting(vec![]));
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: sends Ping to b, kind: native, handler: emit, schema: t.xsd, accepts: [Ping] }
  - { name: b, description: takes Pong only, kind: native, handler: sink2, schema: t.xsd, accepts: [Pong] }
"#,
    );
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms[1].status, MessageStatus::Undeliverable);
    assert!(ms[1]
        .error
        .as_deref()
        .unwrap()
        .contains("`b` does not accept payload type `Ping`"));
    assert_eq!(o.metrics().failure_count(FailureKind::Undeliverable), 1);
    let thread = o.threads().info(&r.thread_id).unwrap();
    assert!(thread.error.unwrap().contains("does not accept"));
}

#[tokio::test]
async fn broadcast_reaches_every_listener_that_accepts_the_type() {
    let log = Log::default();
    let builder = Organism::builder()
        .handler("emit", emitting(vec![Output::broadcast("<Note>hi</Note>")]))
        .handler("log", log.handler());
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: broadcasts, kind: native, handler: emit, schema: t.xsd, accepts: [Ping] }
  - { name: b, description: listens, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
  - { name: c, description: listens, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
  - { name: d, description: listens, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
"#,
    );
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    let mut got: Vec<String> = log.entries().into_iter().map(|e| e.0).collect();
    got.sort();
    assert_eq!(got, vec!["b", "c", "d"]);
    assert_eq!(
        with_status(&messages(&o, &r.thread_id), MessageStatus::Delivered).len(),
        4
    );
}

#[tokio::test]
async fn agent_peers_are_deny_by_default() {
    // An agent with no peers reaches no one but its sender.
    let log = Log::default();
    let builder = Organism::builder()
        .handler(
            "emit",
            emitting(vec![
                Output::broadcast("<Pong><n>1</n></Pong>"),
                Output::to("b", "<Pong><n>2</n></Pong>"),
            ]),
        )
        .handler("log", log.handler());
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: lonely agent, kind: native, handler: emit, schema: t.xsd, accepts: [Ping], agent: true }
  - { name: b, description: takes Pong, kind: native, handler: log, schema: t.xsd, accepts: [Pong] }
"#,
    );
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    let refused = with_status(&ms, MessageStatus::Undeliverable);
    assert_eq!(refused.len(), 2);
    assert!(refused[0]
        .error
        .as_deref()
        .unwrap()
        .contains("not peers of `a`"));
    assert!(refused[1]
        .error
        .as_deref()
        .unwrap()
        .contains("not in its peers"));
    assert!(log.entries().is_empty());
}

#[tokio::test]
async fn reply_to_the_sender_needs_no_peer_entry() {
    // b is an agent with no peers; replying to a (its sender) is still allowed, and a reply to
    // the injector is a terminal output.
    let log = Log::default();
    let builder = Organism::builder()
        .handler(
            "ask",
            emitting(vec![Output::to("b", "<Pong><n>1</n></Pong>")]),
        )
        .handler(
            "reply",
            FnHandler(|d: Delivery| async move {
                Ok(vec![Output::to(
                    d.meta.from.to_string(),
                    "<Note>thanks</Note>",
                )])
            }),
        )
        .handler("log", log.handler());
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: asks b, kind: native, handler: ask, schema: t.xsd, accepts: [Ping] }
  - { name: b, description: agent that replies, kind: native, handler: reply, schema: t.xsd, accepts: [Pong], agent: true }
  - { name: c, description: also takes notes, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
"#,
    );
    let r = inject(&o, "a", &ping(1), None);
    settle(&o, &r.thread_id).await;
    let ms = messages(&o, &r.thread_id);
    // a does not accept Note, so b's reply to a is undeliverable; it was routed to a (the
    // sender), not refused as a peer violation.
    let reply = ms.iter().find(|m| &*m.from == "b").unwrap();
    assert_eq!(to_of(reply), "a");
    assert!(reply
        .error
        .as_deref()
        .unwrap()
        .contains("`a` does not accept payload type `Note`"));
    assert!(log.entries().is_empty());

    // Replying to the injector ends as a terminal output.
    let echo = Organism::builder();
    let (o2, _d2) = organism(
        echo,
        r#"
  - { name: e, description: echoes, kind: native, handler: echo, schema: t.xsd, agent: true }
"#,
    );
    let r2 = inject(&o2, "e", "<Note>hey</Note>", None);
    assert_eq!(settle(&o2, &r2.thread_id).await, ThreadStatus::Completed);
    let ms2 = messages(&o2, &r2.thread_id);
    assert_eq!(ms2[1].status, MessageStatus::Terminal);
    assert_eq!((&*ms2[1].from, to_of(&ms2[1])), ("e", "api"));
}

#[tokio::test]
async fn a_forged_from_is_overwritten_by_the_pump() {
    let builder = Organism::builder();
    let (o, _d) = organism(
        builder,
        r#"
  - { name: greeter, description: echoes, kind: native, handler: echo, schema: t.xsd }
"#,
    );
    let env = format!(
        "<message xmlns=\"{}\"><meta><from>greeter</from><to>greeter</to></meta><Note xmlns=\"\">hi</Note></message>",
        agentserver::xml::ENVELOPE_NS
    );
    let r = o.inject_envelope("api", &env).expect("accepted");
    settle(&o, &r.thread_id).await;
    let ms = messages(&o, &r.thread_id);
    assert_eq!(&*ms[0].from, "api");
    // The echo goes back to the real injector, not to the forged sender.
    assert_eq!(to_of(&ms[1]), "api");
    assert_eq!(ms[1].status, MessageStatus::Terminal);

    // A listener name cannot be used as an injector identity.
    let err = o
        .inject(InjectRequest {
            from: "greeter".into(),
            to: "greeter".into(),
            payload_xml: "<Note/>".into(),
            thread_id: None,
        })
        .unwrap_err();
    assert!(matches!(err, InjectError::ForgedIdentity(_)));
    // Nor can the pump's own identity.
    let err = o
        .inject(InjectRequest {
            from: "system".into(),
            to: "greeter".into(),
            payload_xml: "<Note/>".into(),
            thread_id: None,
        })
        .unwrap_err();
    assert!(matches!(err, InjectError::ForgedIdentity(_)));
}

#[tokio::test]
async fn invalid_payload_is_rejected_with_the_validators_reason() {
    let builder = Organism::builder().handler(
        "emit",
        emitting(vec![Output::to("b", "<Pong><n>not-a-number</n></Pong>")]),
    );
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: emits a bad Pong, kind: native, handler: emit, schema: t.xsd, accepts: [Ping, huh] }
  - { name: b, description: takes Pong, kind: native, handler: sink, schema: t.xsd, accepts: [Pong] }
"#,
    );
    // At inject: refused before the answer, with the validator's line and message.
    let err = o
        .inject(InjectRequest {
            from: "api".into(),
            to: "a".into(),
            payload_xml: "<Ping><n>x</n></Ping>".into(),
            thread_id: None,
        })
        .unwrap_err();
    let InjectError::Invalid(v) = err else {
        panic!("expected Invalid, got {err:?}")
    };
    assert!(v.messages[0].starts_with("line 1:"), "{v}");
    assert!(v.messages[0].contains("'x' is not a valid value"), "{v}");

    // A handler's output: rejected in the log, thread error, and a <huh> back to the sender.
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    let rejected = &with_status(&ms, MessageStatus::Rejected)[0];
    assert!(
        rejected.error.as_deref().unwrap().contains("not-a-number"),
        "{:?}",
        rejected.error
    );
    let huh = ms.iter().find(|m| &*m.from == "system").expect("huh sent");
    assert_eq!(to_of(huh), "a");
    assert!(huh
        .payload_xml
        .contains("<error>rejected: invalid payload</error>"));
    assert_eq!(huh.status, MessageStatus::Delivered);
}

#[tokio::test]
async fn handler_errors_fail_the_message_and_the_thread() {
    let builder = Organism::builder().handler(
        "fail",
        FnHandler(|_d: Delivery| async { Err(HandlerError("database unavailable".into())) }),
    );
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: always fails, kind: native, handler: fail, schema: t.xsd }
"#,
    );
    let mut events = o.events().subscribe();
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms[0].status, MessageStatus::Failed);
    assert!(ms[0]
        .error
        .as_deref()
        .unwrap()
        .contains("database unavailable"));
    assert_eq!(o.metrics().failure_count(FailureKind::HandlerError), 1);
    // An error event names the thread and the agent.
    let mut saw_error = false;
    while let Ok(ev) = events.try_recv() {
        if let agentserver::events::EventKind::Error {
            thread_id, agent, ..
        } = &ev.kind
        {
            saw_error =
                thread_id.as_deref() == Some(&*r.thread_id) && agent.as_deref() == Some("a");
        }
    }
    assert!(saw_error);
}

#[tokio::test]
async fn route_preview_answers_what_routing_would_do_without_sending() {
    let builder = Organism::builder().handler("quiet", emitting(vec![]));
    let (o, _d) = organism(
        builder,
        r#"
  - { name: a, description: agent, kind: native, handler: quiet, schema: t.xsd, accepts: [Ping], agent: true, peers: [b] }
  - { name: b, description: takes Pong, kind: native, handler: quiet, schema: t.xsd, accepts: [Pong] }
  - { name: c, description: takes Pong too, kind: native, handler: quiet, schema: t.xsd, accepts: [Pong] }
"#,
    );
    let pong = agentserver::xml::PayloadType::parse("Pong");
    let names = |r: Result<Vec<std::sync::Arc<str>>, String>| {
        r.map(|v| v.iter().map(|n| n.to_string()).collect::<Vec<_>>())
    };
    // Broadcast: only the peers among the listeners that accept the type.
    assert_eq!(
        names(o.route_preview("a", "api", None, &pong)),
        Ok(vec!["b".to_string()])
    );
    // A reply to the sender ends at that identity, peers or not.
    assert_eq!(
        names(o.route_preview("a", "api", Some("api"), &pong)),
        Ok(vec!["api".to_string()])
    );
    // `to` outside the peers, a type nobody takes, an unknown sender: the reasons routing gives.
    assert!(o
        .route_preview("a", "api", Some("c"), &pong)
        .unwrap_err()
        .contains("not in its peers"));
    let nobody = agentserver::xml::PayloadType::parse("Nobody");
    assert!(o
        .route_preview("b", "a", None, &nobody)
        .unwrap_err()
        .contains("no listener accepts"));
    assert!(o
        .route_preview("zz", "api", None, &pong)
        .unwrap_err()
        .contains("not a listener"));
    // Nothing was sent.
    assert_eq!(o.info().total_messages, 0);
}

#[tokio::test]
async fn a_paused_queue_does_not_hold_a_stop_for_its_grace_period() {
    let (o, _d) = organism_with(
        Organism::builder(),
        "  stop_grace_ms: 600000",
        "breadth-first",
        CHAIN,
    );
    o.control().pause_listener("b").unwrap();
    let t = inject(&o, "a", "<Note>held</Note>", None);
    until(&o, || o.agent("b").unwrap().queue_depth == 1).await;
    assert_eq!(o.control().paused_backlog(), vec![("b".to_string(), 1)]);
    // Ten minutes of grace, yet the stop ends at once: nothing else can move.
    let report = tokio::time::timeout(WAIT, o.stop())
        .await
        .expect("the stop does not wait for a paused queue");
    assert!(!report.drained);
    assert_eq!(report.killed_threads, 1);
    assert_eq!(
        o.threads().info(&t.thread_id).unwrap().status,
        agentserver::threads::ThreadStatus::Killed
    );
}

/// An output that repeats the payload its listener was given is not read again, but it is
/// still validated against its receiver's schema, which may ask more than the sender's.
#[tokio::test]
async fn a_forwarded_payload_is_validated_for_its_receiver() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let strict = TEST_XSD.replace(
        r#"<xs:element name="n" type="xs:int"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Pong">"#,
        r#"<xs:element name="n"><xs:simpleType><xs:restriction base="xs:int"><xs:maxInclusive value="5"/></xs:restriction></xs:simpleType></xs:element></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Pong">"#,
    );
    assert_ne!(strict, TEST_XSD);
    std::fs::write(dir.path().join("strict.xsd"), strict).unwrap();
    let yaml = "organism: {name: t, store: memory}
listeners:
  - {name: a, description: passes on, kind: native, handler: forward, schema: t.xsd, accepts: [Ping], config: {to: b}}
  - {name: b, description: strict, kind: native, handler: sink, schema: strict.xsd, accepts: [Ping]}
";
    let path = dir.path().join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let ok = inject(&o, "a", "<Ping>\n  <n>3</n>\n</Ping>", None);
    assert_eq!(settle(&o, &ok.thread_id).await, ThreadStatus::Completed);
    let ms = messages(&o, &ok.thread_id);
    assert_eq!(ms[1].payload_xml.as_str(), ms[0].payload_xml.as_str());
    assert_eq!(ms[1].status, MessageStatus::Delivered);
    let bad = inject(&o, "a", &ping(7), None);
    assert_eq!(settle(&o, &bad.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &bad.thread_id);
    let rejected = &with_status(&ms, MessageStatus::Rejected)[0];
    assert_eq!(to_of(rejected), "b");
    assert!(
        rejected.error.as_deref().unwrap().contains("maxInclusive")
            || rejected.error.as_deref().unwrap().contains("5"),
        "{:?}",
        rejected.error
    );
}

/// A handler that sends the payload it was given, unchanged, to `to`.
fn echoing(to: &'static str) -> impl agentserver::listener::Handler {
    FnHandler(move |d: Delivery| async move { Ok(vec![Output::to(to, d.payload.xml())]) })
}

#[tokio::test]
async fn an_echoed_payload_is_held_to_its_receivers_schema_not_to_the_senders() {
    // `a` and `b` pass on what they were given. A payload valid for their schema is refused
    // by a receiver whose schema (another text) refuses it, and delivered to one whose
    // schema has the same text in another file: the verdict a payload earned is reused only
    // for a schema that would give the same.
    let dir = tempfile::tempdir().unwrap();
    let strict = TEST_XSD.replace(
        r#"name="n" type="xs:int""#,
        r#"name="n" type="xs:positiveInteger""#,
    );
    assert_ne!(strict, TEST_XSD);
    for (file, xsd) in [
        ("t.xsd", TEST_XSD),
        ("twin.xsd", TEST_XSD),
        ("strict.xsd", &strict),
    ] {
        std::fs::write(dir.path().join(file), xsd).unwrap();
    }
    let yaml = r#"organism: { name: test, store: memory }
listeners:
  - { name: a, description: echoes to strict, kind: native, handler: echo-strict, schema: t.xsd, accepts: [Ping] }
  - { name: b, description: echoes to twin, kind: native, handler: echo-twin, schema: t.xsd, accepts: [Ping] }
  - { name: strict, description: positive n only, kind: native, handler: log, schema: strict.xsd, accepts: [Ping] }
  - { name: twin, description: the same text as t.xsd, kind: native, handler: log, schema: twin.xsd, accepts: [Ping] }
"#;
    std::fs::write(dir.path().join("o.yaml"), yaml).unwrap();
    let log = Log::default();
    let o = Organism::builder()
        .handler("echo-strict", echoing("strict"))
        .handler("echo-twin", echoing("twin"))
        .handler("log", log.handler())
        .load(&dir.path().join("o.yaml"))
        .unwrap();

    let r = inject(&o, "a", &ping(-1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms.len(), 2, "{ms:?}");
    assert_eq!(ms[1].status, MessageStatus::Rejected);
    let error = ms[1].error.as_deref().unwrap();
    assert!(
        error.contains("is invalid for `strict`") && error.contains("positiveInteger"),
        "{error}"
    );

    let r = inject(&o, "b", &ping(-1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    let ms = messages(&o, &r.thread_id);
    assert_eq!(ms[1].status, MessageStatus::Delivered);
    assert_eq!(to_of(&ms[1]), "twin");
    assert_eq!(log.entries().len(), 1);
    assert_eq!(log.entries()[0].2, ping(-1));

    // A valid payload goes through `a` to `strict` as well.
    let r = inject(&o, "a", &ping(5), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    assert_eq!(log.entries().len(), 2);
}
