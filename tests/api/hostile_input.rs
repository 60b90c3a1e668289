//! Hostile XML is refused before it can do harm, and the organism keeps working after it.

use crate::common::*;
use agentserver::pump::InjectError;
use agentserver::threads::ThreadStatus;
use agentserver::xml::XmlError;
use agentserver::{InjectRequest, Organism};

fn attempt(o: &Organism, xml: &str) -> Result<agentserver::InjectReceipt, InjectError> {
    o.inject(InjectRequest {
        from: "api".into(),
        to: "a".into(),
        payload_xml: xml.into(),
        thread_id: None,
    })
}

fn small_organism(limits: &str) -> (Organism, tempfile::TempDir) {
    organism_with(
        Organism::builder(),
        limits,
        "breadth-first",
        "  - { name: a, description: echoes, kind: native, handler: echo, schema: t.xsd }",
    )
}

async fn still_healthy(o: &Organism) {
    let r = inject(o, "a", &ping(7), None);
    assert_eq!(settle(o, &r.thread_id).await, ThreadStatus::Completed);
}

#[tokio::test]
async fn xxe_is_refused_without_reading_the_file() {
    let (o, _d) = small_organism("");
    let xxe = r#"<?xml version="1.0"?><!DOCTYPE Note [<!ENTITY x SYSTEM "file:///etc/passwd">]><Note>&x;</Note>"#;
    assert!(matches!(
        attempt(&o, xxe),
        Err(InjectError::Malformed(XmlError::DoctypeRefused))
    ));
    // An entity reference without a DOCTYPE is not expanded either.
    assert!(matches!(
        attempt(&o, "<Note>&x;</Note>"),
        Err(InjectError::Malformed(XmlError::UndefinedEntity(_)))
    ));
    still_healthy(&o).await;
}

#[tokio::test]
async fn billion_laughs_is_refused() {
    let (o, _d) = small_organism("");
    let mut bomb = String::from("<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">");
    for i in 1..10 {
        let prev = if i == 1 {
            "lol".to_string()
        } else {
            format!("lol{}", i - 1)
        };
        bomb.push_str(&format!(
            "<!ENTITY lol{i} \"{}\">",
            format!("&{prev};").repeat(10)
        ));
    }
    bomb.push_str("]><Note>&lol9;</Note>");
    assert!(matches!(
        attempt(&o, &bomb),
        Err(InjectError::Malformed(XmlError::DoctypeRefused))
    ));
    still_healthy(&o).await;
}

#[tokio::test]
async fn oversized_input_is_refused_before_parsing() {
    let (o, _d) = small_organism("  max_message_bytes: 1000");
    let big = format!("<Note>{}</Note>", "a".repeat(2000));
    assert!(matches!(
        attempt(&o, &big),
        Err(InjectError::Malformed(XmlError::TooLarge { max: 1000, .. }))
    ));
    still_healthy(&o).await;
}

#[tokio::test]
async fn over_deep_input_is_refused() {
    let (o, _d) = small_organism("  max_depth: 16");
    let deep = format!("<Note>{}{}</Note>", "<x>".repeat(100), "</x>".repeat(100));
    assert!(matches!(
        attempt(&o, &deep),
        Err(InjectError::Malformed(XmlError::TooDeep { max: 16 }))
    ));
    // Far past any parser's own limit, still a clean refusal.
    let very_deep = format!(
        "<Note>{}{}</Note>",
        "<x>".repeat(100_000),
        "</x>".repeat(100_000)
    );
    let (o2, _d2) = small_organism("  max_message_bytes: 4000000");
    assert!(matches!(
        attempt(&o2, &very_deep),
        Err(InjectError::Malformed(XmlError::TooDeep { .. }))
    ));
    still_healthy(&o).await;
}

#[tokio::test]
async fn malformed_and_unknown_inputs_get_precise_errors() {
    let (o, _d) = small_organism("");
    assert!(matches!(
        attempt(&o, "<Note>unclosed"),
        Err(InjectError::Malformed(XmlError::Malformed { .. }))
    ));
    assert!(matches!(
        attempt(&o, "<Other/>"),
        Err(InjectError::NotAccepted { .. })
    ));
    let err = o
        .inject(InjectRequest {
            from: "api".into(),
            to: "nobody".into(),
            payload_xml: "<Note/>".into(),
            thread_id: None,
        })
        .unwrap_err();
    assert!(matches!(err, InjectError::UnknownListener(_)));
    let err = o
        .inject(InjectRequest {
            from: "api".into(),
            to: "a".into(),
            payload_xml: "<Note/>".into(),
            thread_id: Some("bad id!".into()),
        })
        .unwrap_err();
    assert!(err.to_string().contains("thread id must be"), "{err}");
    assert_eq!(
        o.metrics()
            .failure_count(agentserver::pump::FailureKind::InjectRefused),
        4
    );
    still_healthy(&o).await;
}

#[tokio::test]
async fn an_element_with_too_many_attributes_is_refused_before_parsing_on() {
    let (o, _d) = small_organism("  max_attributes: 100");
    let attrs = |n: usize| (0..n).map(|i| format!(" a{i}=\"v\"")).collect::<String>();
    // 90,000 attributes in under 1 MB: refused by count, on the root and deeper.
    let root = format!("<Note{}>x</Note>", attrs(90_000));
    assert!(root.len() < 1_048_576);
    assert!(matches!(
        attempt(&o, &root),
        Err(InjectError::Malformed(XmlError::TooManyAttributes {
            line: 1,
            max: 100
        }))
    ));
    let inner = format!("<Ping>\n<n{}>1</n></Ping>", attrs(101));
    assert!(matches!(
        attempt(&o, &inner),
        Err(InjectError::Malformed(XmlError::TooManyAttributes {
            line: 2,
            ..
        }))
    ));
    // At the limit it reaches the schema, which refuses undeclared attributes as usual.
    let at_limit = format!("<Ping><n{}>1</n></Ping>", attrs(100));
    assert!(matches!(
        attempt(&o, &at_limit),
        Err(InjectError::Invalid(_))
    ));
    still_healthy(&o).await;
}

#[tokio::test]
async fn an_xml_declaration_anywhere_but_the_very_start_is_refused() {
    let (o, _d) = small_organism("");
    assert!(attempt(&o, "<?xml version=\"1.0\"?><Ping><n>1</n></Ping>").is_ok());
    assert!(attempt(&o, "\u{feff}<?xml version=\"1.0\"?><Ping><n>1</n></Ping>").is_ok());
    for bad in [
        "<?xml version=\"1.0\"?><?xml version=\"1.0\"?><Ping><n>1</n></Ping>",
        "<!-- c --><?xml version=\"1.0\"?><Ping><n>1</n></Ping>",
        " <?xml version=\"1.0\"?><Ping><n>1</n></Ping>",
        "<Ping><n>1</n></Ping><?xml version=\"1.0\"?>",
    ] {
        match attempt(&o, bad) {
            Err(InjectError::Malformed(XmlError::Malformed { message, .. })) => {
                assert!(message.contains("XML declaration"), "{bad}: {message}")
            }
            Err(InjectError::Malformed(XmlError::TrailingContent { .. })) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
    still_healthy(&o).await;
}

#[tokio::test]
async fn validator_messages_are_capped_with_a_count_of_the_rest() {
    let (o, _d) = small_organism("");
    let attrs: String = (0..200).map(|i| format!(" bad{i}=\"v\"")).collect();
    let xml = format!("<Ping><n{attrs}>1</n></Ping>");
    match attempt(&o, &xml) {
        Err(InjectError::Invalid(v)) => {
            assert_eq!(v.messages.len(), 21, "{:?}", v.messages);
            assert!(
                v.messages[20].contains("and 180 more"),
                "{}",
                v.messages[20]
            );
            assert!(v.messages[0].starts_with("line 1:"), "{}", v.messages[0]);
        }
        other => panic!("{other:?}"),
    }
    still_healthy(&o).await;
}

#[tokio::test]
async fn large_payloads_are_held_in_memory_within_max_retained_bytes() {
    let (o, _d) = organism_with(
        Organism::builder(),
        "  max_retained_bytes: 8388608",
        "breadth-first",
        CHAIN,
    );
    let big = "y".repeat(100_000);
    let mut threads = Vec::new();
    for _ in 0..120 {
        let t = inject(&o, "a", &format!("<Note>{big}</Note>"), None);
        assert_eq!(settle(&o, &t.thread_id).await, ThreadStatus::Completed);
        threads.push(t.thread_id);
    }
    // 120 threads of three 100 kB messages: 36 MB of payloads, and three times that as
    // events. Memory holds what 8 MiB allows (three quarters for threads, a quarter for
    // events; each of the registry's 16 shards may keep its newest thread beyond it), the
    // newest; the rest is let go of.
    let held: Vec<_> = o.threads().list();
    let held_bytes: usize = held
        .iter()
        .filter_map(|t| o.history().thread_messages(&t.id))
        .flatten()
        .map(|m| m.weight())
        .sum();
    let thread_weight = 3 * (100_000 + 256 + 20);
    assert!(held.len() < 60, "{} threads held", held.len());
    assert!(held_bytes <= 6_291_456 + 16 * thread_weight, "{held_bytes}");
    assert!(o
        .history()
        .thread_messages(threads.last().unwrap())
        .is_some());
    assert!(
        o.events().retained_bytes() <= 2_097_152,
        "{}",
        o.events().retained_bytes()
    );
    let t = inject(&o, "a", "<Note>small</Note>", None);
    assert_eq!(settle(&o, &t.thread_id).await, ThreadStatus::Completed);
}

/// A character XML 1.0 does not allow (a NUL, another control, U+FFFF), raw or by a
/// character reference, in XML or in a JSON payload's text, is refused naming the character
/// and where it is (libxml2 would say "Premature end of data" of a NUL, about the text
/// after it); tab, line feed and carriage return pass, and the organism goes on.
#[tokio::test]
async fn a_character_xml_does_not_allow_is_refused_saying_which_and_where() {
    let listeners = format!(
        "{CHAIN}\n  - {{name: p, description: pings, kind: native, handler: sink, schema: t.xsd, accepts: [Ping]}}"
    );
    let s = serve_with(
        Organism::builder(),
        "",
        &listeners,
        agentserver::api::ApiOptions::default(),
    )
    .await;
    let cases = [
        (
            serde_json::json!({"to": "a", "payload_xml": "<Note>\nok\u{0}then</Note>"}),
            "invalid_payload",
            "payload",
            "line 2: character U+0000",
        ),
        (
            serde_json::json!({"to": "a", "payload_xml": "<Note>\u{7}</Note>"}),
            "invalid_payload",
            "payload",
            "line 1: character U+0007",
        ),
        (
            serde_json::json!({"to": "a", "payload_xml": "<Note a='\u{FFFF}'/>"}),
            "invalid_payload",
            "payload",
            "line 1: character U+FFFF",
        ),
        (
            serde_json::json!({"to": "a", "payload_xml": "<Note>\n\n&#1;</Note>"}),
            "malformed_xml",
            "payload line 3",
            "&#1; names a character U+0001",
        ),
        (
            serde_json::json!({"to": "a", "payload": "bad\u{1b}"}),
            "invalid_payload",
            "payload",
            "U+001B",
        ),
        (
            serde_json::json!({"to": "p", "payload": {"n": "1\u{0}"}}),
            "invalid_payload",
            "payload.n",
            "U+0000",
        ),
    ];
    for (body, code, place, says) in cases {
        let (st, e) = s.post("/api/v1/inject", body.clone()).await;
        assert_eq!(st, 422, "{body}: {e}");
        assert_eq!(e["error"]["code"], code, "{body}: {e}");
        assert_eq!(e["error"]["where"], place, "{body}: {e}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {e}");
        assert!(message.contains("not allowed in XML 1.0"), "{body}: {e}");
    }
    // The characters XML allows, and the escaped ones, pass and are delivered.
    let (st, r) = s
        .post(
            "/api/v1/inject",
            serde_json::json!({"to": "a", "payload_xml": "<Note>a\tb\r\nc &#9;&#xFFFD;\u{FFFD}</Note>"}),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    let thread = r["thread_id"].as_str().unwrap_or_default();
    assert_eq!(settle(&s.organism, thread).await, ThreadStatus::Completed);
}
