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
        o.uploads().create_agent(new, None).expect("agent created");
    }
    o
}

/// Injects a `Go` to `sender` (to `to`, or a broadcast), and returns who received the
/// `Secret` and the errors of the refused ones. A refused one never names a target out of
/// the sender's scope as its `to` (another tenant's viewer would see it).
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
    for m in log
        .iter()
        .filter(|m| m.status == MessageStatus::Undeliverable)
    {
        let to = to_of(m);
        assert!(
            !B_AND_ORGANISM.contains(&to) || !sender.starts_with('a'),
            "{sender}'s refusal is shown to {to}: {m:?}"
        );
    }
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
    let tester = o.uploads().prepare_test("a-api-free", 1).expect("a tester");
    let mut outcome = tester.run(&json!({}), Some("Go")).await;
    let mut to = tester.output(outcome.outputs.remove(0)).to;
    to.sort();
    assert_eq!(to, names(&["a-recv", "a-api-recv", "b-shared", "o-shared"]));
    for hidden in B_AND_ORGANISM.iter().chain(&["ghost"]) {
        let mut outcome = tester.run(&json!({ "to": hidden }), Some("Go")).await;
        let out = tester.output(outcome.outputs.remove(0));
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
            .load_config(&path)
            .expect_err("refused")
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

/// A script that answers each case with 12 outputs of 900 kB.
const BIG: &str = r#"
local big = string.rep("x", 900000)
function handle(p, meta)
  local out = {}
  for i = 1, 12 do
    out[i] = { to = meta.from, xml = "<Big><text>" .. big .. "</text></Big>" }
  end
  return out
end
"#;

/// A process's resident and peak resident memory, in bytes (Linux `/proc`).
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap()
    };
    (kb("VmRSS:") * 1024, kb("VmHWM:") * 1024)
}

/// One tenant operator's test vectors that answer far more than the limit: the answers stay
/// within `limits.max_test_answer_bytes`, at most `max_tests_at_once` run together (the
/// rest are told 429), the server's peak memory rises by less than the limit times that
/// bound plus 100 MB, and it keeps answering.
#[test]
fn test_vector_answers_are_bounded_by_bytes_and_runs_by_tenant() {
    use agentserver::access::{KeySource, Role};
    use common::child::{agentserver, serve};
    const LIMIT: usize = 4 * 1024 * 1024;
    const AT_ONCE: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.xsd"), XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism:\n  name: big\n  store: o.db\nauth: {{methods: [keys]}}\nlimits: {{max_test_answer_bytes: {LIMIT}, max_tests_at_once: {AT_ONCE}}}\nlisteners:\n  - {{name: o-recv, description: keeps, kind: native, handler: sink, schema: s.xsd, accepts: [Secret]}}\n"
        ),
    )
    .unwrap();
    let config = Organism::builder().load_config(&path).unwrap();
    let (key, row) =
        agentserver::access::new_key("acme-op", Role::Operator, Some("acme"), None).unwrap();
    KeySource::of(&config).unwrap().add(&row).unwrap();
    drop(config);
    let mut cmd = agentserver();
    cmd.args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    let (child, url) = serve(cmd, std::process::Stdio::null());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = {
        let _guard = rt.enter();
        http()
    };
    let post = |path: String, body: serde_json::Value| {
        let req = http
            .post(format!("{url}{path}"))
            .bearer_auth(&key)
            .json(&body);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let bytes = r.bytes().await.unwrap();
            (status, bytes)
        }
    };
    let (st, body) = rt.block_on(post(
        "/api/v1/agents".into(),
        json!({"name": "acme-big", "description": "answers big", "fields": {"Go": {"to": "string?"}},
               "script": BIG, "limits": {"memory_mb": 64, "cpu_ms": 1000}}),
    ));
    assert_eq!(st, 201, "{}", String::from_utf8_lossy(&body));
    let cases: Vec<serde_json::Value> = (0..50).map(|_| json!({"payload": {}})).collect();
    let test = || {
        post(
            "/api/v1/agents/acme-big/scripts/1/test".into(),
            json!({"cases": cases}),
        )
    };
    // Warm: one case, so what the first run sets up once is in the baseline.
    let (st, body) = rt.block_on(post(
        "/api/v1/agents/acme-big/scripts/1/test".into(),
        json!({"cases": [{"payload": {}}]}),
    ));
    assert_eq!(st, 200);
    assert!(body.len() <= LIMIT + 256 * 1024, "{} bytes", body.len());
    let (rss_before, _) = memory_of(child.id());

    let answers = rt.block_on(async {
        let runs: Vec<_> = (0..AT_ONCE + 2).map(|_| tokio::spawn(test())).collect();
        let mut out = Vec::new();
        for r in runs {
            out.push(r.await.unwrap());
        }
        out
    });
    let (_, peak) = memory_of(child.id());
    let mut ran = 0;
    for (st, body) in &answers {
        match st {
            200 => {
                ran += 1;
                // Within the limit, plus the verdicts' own small fields.
                assert!(body.len() <= LIMIT + 256 * 1024, "{} bytes", body.len());
                let report: serde_json::Value = serde_json::from_slice(body).unwrap();
                assert_eq!(report["truncated"], true);
                let first = &report["cases"][0]["outputs"][0];
                assert_eq!(first["type"], "Big", "{first}");
                let cut = report["cases"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|c| c["outputs"].as_array().unwrap())
                    .find(|o| o["truncated"] == true)
                    .unwrap();
                assert!(cut["payload"].is_null());
                assert!(cut["payload_xml"].as_str().unwrap().contains("bytes cut]"));
            }
            429 => {
                let e: serde_json::Value = serde_json::from_slice(body).unwrap();
                assert_eq!(e["error"]["code"], "too_many_tests", "{e}");
            }
            other => panic!("{other}: {}", String::from_utf8_lossy(body)),
        }
    }
    assert!((1..=AT_ONCE).contains(&ran), "{ran} ran");
    let rise = peak.saturating_sub(rss_before);
    eprintln!("test vectors: RSS {rss_before} before, peak {peak} (+{rise}); {ran} ran");
    assert!(
        rise < (LIMIT * AT_ONCE) as u64 + 100 * 1024 * 1024,
        "peak {peak} rose {rise} bytes over {rss_before}"
    );
    // Still healthy: an inject is taken and the server answers.
    let (st, _) = rt.block_on(post(
        "/api/v1/inject".into(),
        json!({"to": "acme-big", "payload_xml": "<Go/>"}),
    ));
    assert_eq!(st, 202);
    drop(child);
}

/// An agent's payload types are unique on its side of the tenant boundary only, and the
/// clash names only listeners there.
#[test]
fn an_agents_unique_types_are_checked_and_named_within_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    let agent = |name: &str, tenant: &str| {
        format!("  - {{name: {name}, description: an agent, kind: lua, script: sender.lua, schema: s.xsd, accepts: [Go], agent: true, peers: [], tenant: {tenant}}}\n")
    };
    // Tenant b has no other listener of `Go`: accepted.
    std::fs::write(&path, format!("{text}{}", agent("b-agent", "b"))).unwrap();
    Organism::builder()
        .load_config(&path)
        .expect("no clash within b's scope");
    // Tenant a's senders take `Go` too: the clash names them, not the organism's own.
    std::fs::write(&path, format!("{text}{}", agent("a-agent", "a"))).unwrap();
    let e = Organism::builder()
        .load_config(&path)
        .expect_err("a clash")
        .to_string();
    assert!(e.contains("also accepted by a-free, a-peered;"), "{e}");
    assert!(!e.contains("o-free") && !e.contains("o-peered"), "{e}");
}

/// An output that is not even XML, aimed at another tenant's listener: refused, and its
/// record does not name that listener as its `to` (its viewer would see it, payload and all);
/// aimed at one in scope, it keeps its target.
#[tokio::test]
async fn a_malformed_output_to_another_tenant_is_not_shown_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = organism(dir.path());
    let bad =
        "function handle(p, meta)\n  return { to = p.to, xml = \"<Secret><text>unclosed\" }\nend\n";
    o.uploads()
        .create_agent(new_agent("a-api-bad", "a", bad, "Go", None), None)
        .expect("agent created");
    for (to, shown) in [("b-recv", None), ("a-recv", Some("a-recv"))] {
        let r = inject(&o, "a-api-bad", &format!("<Go><to>{to}</to></Go>"), None);
        settle(&o, &r.thread_id).await;
        let log = messages(&o, &r.thread_id);
        let refused = log
            .iter()
            .find(|m| m.status == MessageStatus::Rejected)
            .unwrap_or_else(|| panic!("{log:?}"));
        assert_eq!(refused.to.as_deref(), shown, "{to}: {refused:?}");
    }
    o.stop().await;
}
