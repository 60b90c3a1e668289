//! The tenant boundary, tried as the other tenant would: two tenants and the organism's own
//! listeners in one organism, every sender shape ({peers absent, peers declared} × {file
//! listener, API agent}, and the organism's own) sending by `to` and by broadcast, live and
//! in a test vector's preview. Nothing crosses but to `shared` listeners, and no refusal
//! names a listener out of the sender's scope.

mod common;

use std::path::Path;

use agentserver::pump::agents::{NewAgent, NewVersion};
use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::Organism;
use common::*;
use serde_json::json;

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Go"><xs:complexType><xs:sequence>
    <xs:element name="to" type="xs:string" minOccurs="0"/></xs:sequence></xs:complexType></xs:element>
  <xs:element name="Secret"><xs:complexType><xs:sequence>
    <xs:element name="text" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

/// Sends a `Secret` to `p.to`, or broadcasts it when `to` is absent.
const SENDER: &str = r#"
function handle(p, meta)
  local out = { xml = "<Secret><text>for tenant eyes only</text></Secret>" }
  if p.to then out.to = p.to end
  return out
end
"#;

const SINK: &str = "function handle(p, meta) return nil end\n";

/// Receivers of `Secret`: each tenant's own, shared ones, and the organism's own.
const RECEIVERS: [&str; 7] = [
    "a-recv",
    "a-api-recv",
    "b-recv",
    "b-api-recv",
    "b-shared",
    "o-recv",
    "o-shared",
];

/// Names no sender of tenant `a` may learn anything about.
const B_AND_ORGANISM: [&str; 3] = ["b-recv", "b-api-recv", "o-recv"];

fn write(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("s.xsd"), XSD).unwrap();
    std::fs::write(dir.join("sender.lua"), SENDER).unwrap();
    let sender = |name: &str, extra: &str| {
        format!("  - {{name: {name}, description: sends, kind: lua, script: sender.lua, schema: s.xsd, accepts: [Go]{extra}}}\n")
    };
    let sink = |name: &str, extra: &str| {
        format!("  - {{name: {name}, description: keeps, kind: native, handler: sink, schema: s.xsd, accepts: [Secret]{extra}}}\n")
    };
    let mut listeners = String::new();
    listeners += &sender("a-free", ", tenant: a");
    listeners += &sender("a-peered", ", tenant: a, peers: [a-recv, o-shared]");
    listeners += &sender("o-free", "");
    listeners += &sender("o-peered", ", peers: [a-recv, o-recv]");
    listeners += &sink("a-recv", ", tenant: a");
    listeners += &sink("b-recv", ", tenant: b");
    listeners += &sink("b-shared", ", tenant: b, shared: true");
    listeners += &sink("o-recv", "");
    listeners += &sink("o-shared", ", shared: true");
    let path = dir.join("o.yaml");
    std::fs::write(
        &path,
        format!("organism:\n  name: tenants\n  store: memory\nlisteners:\n{listeners}"),
    )
    .unwrap();
    path
}

fn new_agent(
    name: &str,
    tenant: &str,
    script: &str,
    accepts: &str,
    peers: Option<&[&str]>,
) -> NewAgent {
    let mut definition = json!({"description": "an API agent", "accepts": [accepts]});
    if let Some(p) = peers {
        definition["peers"] = json!(p);
    }
    NewAgent {
        name: name.into(),
        tenant: Some(tenant.into()),
        definition,
        version: NewVersion {
            script: script.into(),
            xsd: Some(XSD.into()),
            ..Default::default()
        },
    }
}

fn organism(dir: &Path) -> Organism {
    let o = Organism::builder().load(&write(dir)).expect("builds");
    for new in [
        new_agent("a-api-recv", "a", SINK, "Secret", None),
        new_agent("b-api-recv", "b", SINK, "Secret", None),
        new_agent("a-api-free", "a", SENDER, "Go", None),
        new_agent(
            "a-api-peered",
            "a",
            SENDER,
            "Go",
            Some(&["a-recv", "o-shared"]),
        ),
    ] {
        o.create_agent(new, None).expect("agent created");
    }
    o
}

/// Injects a `Go` to `sender` (to `to`, or a broadcast), and returns who received the
/// `Secret` and the errors of the refused ones.
async fn send(o: &Organism, sender: &str, to: Option<&str>) -> (Vec<String>, Vec<String>) {
    let go = match to {
        Some(t) => format!("<Go><to>{t}</to></Go>"),
        None => "<Go/>".into(),
    };
    let r = inject(o, sender, &go, None);
    settle(o, &r.thread_id).await;
    let log = messages(o, &r.thread_id);
    let mut got: Vec<String> = log
        .iter()
        .filter(|m| m.payload_type.as_deref() == Some("Secret"))
        .filter(|m| m.status == MessageStatus::Delivered)
        .map(|m| to_of(m).to_string())
        .collect();
    got.sort();
    let errors = log.iter().filter_map(|m| m.error.clone()).collect();
    (got, errors)
}

fn names(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn nothing_crosses_a_tenant_but_to_shared_listeners_on_any_path() {
    let dir = tempfile::tempdir().unwrap();
    let o = organism(dir.path());

    // Tenant a's senders, without peers, file and API alike: by broadcast, its own and the
    // shared ones; never tenant b's nor the organism's own.
    for sender in ["a-free", "a-api-free"] {
        let (got, errors) = send(&o, sender, None).await;
        assert_eq!(
            got,
            names(&["a-recv", "a-api-recv", "b-shared", "o-shared"]),
            "{sender} broadcast"
        );
        assert!(errors.is_empty(), "{errors:?}");
        for to in RECEIVERS.iter().chain(&["ghost"]) {
            let (got, errors) = send(&o, sender, Some(to)).await;
            if B_AND_ORGANISM.contains(to) || *to == "ghost" {
                assert!(got.is_empty(), "{sender} → {to}: {got:?}");
                // The same words whether the name is another's or nobody's.
                assert_eq!(
                    errors,
                    vec![format!(
                        "`{sender}` sent to `{to}`: no listener in its scope has that name"
                    )],
                    "{sender} → {to}"
                );
            } else {
                assert_eq!(got, names(&[to]), "{sender} → {to}");
            }
        }
    }

    // With peers declared: only those of its peers in scope.
    for sender in ["a-peered", "a-api-peered"] {
        let (got, _) = send(&o, sender, None).await;
        assert_eq!(got, names(&["a-recv", "o-shared"]), "{sender} broadcast");
        for to in RECEIVERS {
            let (got, errors) = send(&o, sender, Some(to)).await;
            let expected: &[&str] = match to {
                "a-recv" | "o-shared" => &[to],
                _ => &[],
            };
            assert_eq!(got, names(expected), "{sender} → {to}");
            for e in &errors {
                for hidden in B_AND_ORGANISM.iter().filter(|h| **h != to) {
                    assert!(!e.contains(hidden), "{sender} → {to}: {e}");
                }
            }
        }
    }

    // A tenant that declares the type the other broadcasts receives nothing of it, and its
    // own broadcast (b's receivers are sinks) never reaches a: checked above from a's side;
    // from the organism's: its broadcast is not offered to a tenant's listener it does not
    // name, unless shared.
    let (got, _) = send(&o, "o-free", None).await;
    assert_eq!(
        got,
        names(&["b-shared", "o-recv", "o-shared"]),
        "o-free broadcast"
    );
    let (got, _) = send(&o, "o-free", Some("a-recv")).await;
    assert_eq!(
        got,
        names(&["a-recv"]),
        "the organism's own names a tenant's listener"
    );
    let (got, _) = send(&o, "o-peered", None).await;
    assert_eq!(got, names(&["a-recv", "o-recv"]), "o-peered broadcast");

    // A test vector's preview routes as the pump does, and says as little.
    let tester = o.prepare_test("a-api-free", 1).expect("a tester");
    let outcome = tester.run(&json!({}), Some("Go")).await;
    let mut to = outcome.outputs[0].to.clone();
    to.sort();
    assert_eq!(to, names(&["a-recv", "a-api-recv", "b-shared", "o-shared"]));
    for hidden in B_AND_ORGANISM.iter().chain(&["ghost"]) {
        let outcome = tester.run(&json!({ "to": hidden }), Some("Go")).await;
        let out = &outcome.outputs[0];
        assert_eq!(
            out.error.as_deref(),
            Some(
                format!("undeliverable: `a-api-free` sent to `{hidden}`: no listener in its scope has that name")
                    .as_str()
            ),
            "{out:?}"
        );
    }
    let r = inject(&o, "a-free", "<Go/>", None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    o.stop().await;
}

#[test]
fn a_tenants_listener_may_not_name_a_peer_out_of_its_scope_nor_learn_if_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    for peer in ["b-recv", "o-recv", "ghost"] {
        let bad = text.replace(
            "peers: [a-recv, o-shared]",
            &format!("peers: [a-recv, {peer}]"),
        );
        std::fs::write(&path, bad).unwrap();
        let e = Organism::builder()
            .load(&path)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains(&format!(
                "`{peer}` is not a listener of tenant `a` nor one marked `shared: true`"
            )),
            "{e}"
        );
        assert!(!e.contains("names no listener"), "{e}");
    }
}
