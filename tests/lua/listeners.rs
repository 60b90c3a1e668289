//! Lua listeners end to end: the bridge, outputs, the schema DSL, logs, metrics, and script
//! reload by API and by file watch. Real Luau, real libxml2, a real server.

use std::time::Duration;

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::events::EventKind;
use agentserver::threads::ThreadStatus;
use agentserver::Organism;
use serde_json::json;

const ORDER_XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:shop" elementFormDefault="qualified">
  <xs:element name="Order"><xs:complexType><xs:sequence>
    <xs:element name="customer" type="xs:string"/>
    <xs:element name="line" maxOccurs="unbounded"><xs:complexType><xs:sequence>
      <xs:element name="sku" type="xs:string"/><xs:element name="qty" type="xs:int"/></xs:sequence>
      <xs:attribute name="gift" type="xs:boolean"/></xs:complexType></xs:element>
    <xs:element name="note" type="xs:string" minOccurs="0"/>
    <xs:element name="total" type="xs:decimal"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

struct Rig {
    organism: Organism,
    dir: tempfile::TempDir,
}

fn rig(files: &[(&str, &str)], listeners: &str) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    std::fs::write(dir.path().join("order.xsd"), ORDER_XSD).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!("organism: {{ name: lua, store: memory }}\nlisteners:\n{listeners}\n"),
    )
    .unwrap();
    let organism = Organism::builder().load(&path).expect("builds");
    Rig { organism, dir }
}

#[tokio::test]
async fn the_bridge_round_trips_nested_repeated_optional_typed_fields_in_schema_order() {
    // The script reads typed fields and writes the output with keys in no particular order.
    let script = r#"
function handle(order, meta)
  assert(type(order.line[1].qty) == "number", "qty is a number")
  assert(order.line[1]._attr.gift == true, "gift is a boolean")
  assert(order.note == nil, "absent optional field is nil")
  local total = 0
  local lines = {}
  for i, l in ipairs(order.line) do
    total = total + l.qty * 2
    lines[i] = { qty = l.qty * 2, sku = string.upper(l.sku), _attr = { gift = not l._attr or not l._attr.gift } }
  end
  return {
    to = "store",
    payload = { total = total + 0.5, note = "doubled for " .. meta.from, line = lines, customer = order.customer },
  }
end
"#;
    let r = rig(
        &[("double.lua", script)],
        "  - { name: double, description: doubles, kind: lua, script: double.lua, schema: order.xsd, peers: [store] }
  - { name: store, description: keeps, kind: native, handler: sink, schema: order.xsd }",
    );
    let xml = r#"<Order xmlns="urn:shop"><customer>Ada</customer><line gift="true"><sku>a1</sku><qty>2</qty></line><line><sku>b2</sku><qty>3</qty></line><total>0</total></Order>"#;
    let t = inject(&r.organism, "double", xml, None);
    let status = settle(&r.organism, &t.thread_id).await;
    assert_eq!(
        status,
        ThreadStatus::Completed,
        "{:#?}",
        messages(&r.organism, &t.thread_id)
    );
    let log = messages(&r.organism, &t.thread_id);
    assert_eq!(log.len(), 2, "{log:#?}");
    assert_eq!(
        &*log[1].payload_xml,
        r#"<Order xmlns="urn:shop"><customer>Ada</customer><line gift="false"><sku>A1</sku><qty>4</qty></line><line gift="true"><sku>B2</sku><qty>6</qty></line><note>doubled for api</note><total>10.5</total></Order>"#
    );
    let view = serde_json::to_value(agentserver::api::view::Message::of(
        &log[1],
        &r.organism.schemas(),
    ))
    .unwrap();
    assert_eq!(view["payload"]["line"][1]["qty"], json!(6));
    assert_eq!(view["payload"]["total"], json!(10.5));
    assert_eq!(view["payload"]["line"][0]["@gift"], json!(false));
}

#[tokio::test]
async fn outputs_can_be_a_list_a_reply_raw_xml_or_nothing_and_logs_become_events() {
    let script = r#"
function handle(p, meta)
  log.info("got " .. p .. " from " .. meta.from .. " as " .. meta.payload_type)
  if p == "none" then return nil end
  return {
    { to = meta.from, type = "Note", payload = "reply to " .. meta.own_name },
    { to = "sink", xml = "<Ping><n>" .. #p .. "</n></Ping>" },
    { to = "sink", payload = { n = 7 } },
  }
end
"#;
    let r = rig(
        &[("multi.lua", script)],
        "  - { name: multi, description: many outputs, kind: lua, script: multi.lua, schema: t.xsd, accepts: [Note] }
  - { name: sink, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Ping] }",
    );
    let mut events = r.organism.events().subscribe();
    let t = inject(&r.organism, "multi", "<Note>four</Note>", None);
    assert_eq!(
        settle(&r.organism, &t.thread_id).await,
        ThreadStatus::Completed
    );
    let log = messages(&r.organism, &t.thread_id);
    let hops: Vec<(String, String)> = log
        .iter()
        .map(|m| {
            (
                m.to.as_deref().unwrap_or("").to_string(),
                m.payload_xml.to_string(),
            )
        })
        .collect();
    assert_eq!(
        hops[1..],
        [
            ("api".to_string(), "<Note>reply to multi</Note>".to_string()),
            ("sink".to_string(), "<Ping><n>4</n></Ping>".to_string()),
            ("sink".to_string(), "<Ping><n>7</n></Ping>".to_string()),
        ]
    );
    let logged = loop {
        let ev = events.recv().await.unwrap();
        if let EventKind::Log {
            agent,
            message,
            level,
            ..
        } = &ev.kind
        {
            break (agent.clone(), level.clone(), message.clone());
        }
    };
    assert_eq!(
        logged,
        (
            "multi".into(),
            "info".into(),
            "got four from api as Note".into()
        )
    );

    let t = inject(&r.organism, "multi", "<Note>none</Note>", None);
    assert_eq!(
        settle(&r.organism, &t.thread_id).await,
        ThreadStatus::Completed
    );
    assert_eq!(messages(&r.organism, &t.thread_id).len(), 1);

    // A malformed return value fails the message and says why.
    std::fs::write(
        r.dir.path().join("multi.lua"),
        "function handle(p, m) return { to = 'sink', payload = {n = 1}, colour = 'red' } end",
    )
    .unwrap();
    r.organism.control().reload_listener("multi").unwrap();
    let t = inject(&r.organism, "multi", "<Note>x</Note>", None);
    assert_eq!(settle(&r.organism, &t.thread_id).await, ThreadStatus::Error);
    let err = messages(&r.organism, &t.thread_id)[0]
        .error
        .clone()
        .unwrap();
    assert!(
        err.contains("lua output: output #1: unknown key `colour`"),
        "{err}"
    );
}

#[tokio::test]
async fn a_dsl_listener_validates_with_its_generated_xsd_which_the_api_serves() {
    let r = rig(
        &[
            ("echo.lua", "function handle(p, m) return { to = 'keep', type = 'Reading', payload = { celsius = p.celsius + 1, tags = p.tags } } end"),
            ("keep.lua", "function handle() end"),
        ],
        "  - name: probe
    description: adds one degree
    kind: lua
    script: echo.lua
    fields: { Reading: { celsius: number, tags: [string], where?: { room: string } } }
    peers: [keep]
  - name: keep
    description: keeps readings
    kind: lua
    script: keep.lua
    fields: { Reading: { celsius: number, tags: [string], where?: { room: string } } }",
    );
    let t = inject(
        &r.organism,
        "probe",
        "<Reading><celsius>20.5</celsius><tags>a</tags><tags>b</tags></Reading>",
        None,
    );
    assert_eq!(
        settle(&r.organism, &t.thread_id).await,
        ThreadStatus::Completed
    );
    let log = messages(&r.organism, &t.thread_id);
    assert_eq!(
        &*log[1].payload_xml,
        "<Reading><celsius>21.5</celsius><tags>a</tags><tags>b</tags></Reading>"
    );
    // Refused by the generated XSD: a wrong type, and a missing field.
    let bad = r.organism.inject(agentserver::InjectRequest {
        from: "api".into(),
        to: "probe".into(),
        payload_xml: "<Reading><celsius>warm</celsius></Reading>".into(),
        thread_id: None,
    });
    assert!(
        matches!(bad, Err(agentserver::pump::InjectError::Invalid(_))),
        "{bad:?}"
    );

    let server = ApiServer::bind(r.organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let xsd = http_get(format!(
        "http://{}/api/v1/agents/probe/schema",
        server.local_addr()
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(
        xsd.contains("Generated from the listener's `fields:`"),
        "{xsd}"
    );
    assert!(
        xsd.contains(
            r#"<xs:element name="tags" type="xs:string" minOccurs="0" maxOccurs="unbounded"/>"#
        ),
        "{xsd}"
    );
}

#[tokio::test]
async fn reload_by_api_swaps_behaviour_keeps_the_old_script_on_error_and_loses_nothing() {
    let v1 = "function handle(p, m) local t = os.clock() while os.clock() - t < 0.05 do end return { to = m.from, type = 'Note', payload = 'v1 ' .. p } end";
    let r = rig(
        &[("s.lua", v1)],
        "  - { name: svc, description: versions, kind: lua, script: s.lua, schema: t.xsd, accepts: [Note], limits: { cpu_ms: 2000 } }",
    );
    let server = ApiServer::bind(r.organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let http = http();
    let reload = || {
        let url = format!("http://{}/api/v1/agents/svc/reload", server.local_addr());
        let http = http.clone();
        async move {
            let r = http.post(url).send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let mut events = r.organism.events().subscribe();

    // A message in flight on v1 while v2 is loaded, and messages queued during the reload.
    let inflight = inject(&r.organism, "svc", "<Note>a</Note>", None);
    until(&r.organism, || {
        r.organism.agent("svc").unwrap().state == agentserver::events::AgentState::Processing
    })
    .await;
    std::fs::write(
        r.dir.path().join("s.lua"),
        "function handle(p, m) return { to = m.from, type = 'Note', payload = 'v2 ' .. p } end",
    )
    .unwrap();
    let queued: Vec<_> = (0..5)
        .map(|i| inject(&r.organism, "svc", &format!("<Note>q{i}</Note>"), None))
        .collect();
    let (status, agent) = reload().await;
    assert_eq!(status, 200, "{agent}");
    assert_eq!(agent["name"], "svc");
    assert_eq!(
        settle(&r.organism, &inflight.thread_id).await,
        ThreadStatus::Completed
    );
    assert_eq!(
        &*messages(&r.organism, &inflight.thread_id)[1].payload_xml,
        "<Note>v1 a</Note>"
    );
    for q in &queued {
        assert_eq!(
            settle(&r.organism, &q.thread_id).await,
            ThreadStatus::Completed,
            "no queued message is lost"
        );
    }
    let after = inject(&r.organism, "svc", "<Note>b</Note>", None);
    settle(&r.organism, &after.thread_id).await;
    assert_eq!(
        &*messages(&r.organism, &after.thread_id)[1].payload_xml,
        "<Note>v2 b</Note>"
    );

    // A script that does not compile, and one whose init fails: 422, v2 keeps running.
    for broken in [
        "function handle(p, m) return {",
        "function init(c) error('missing key') end function handle() end",
    ] {
        std::fs::write(r.dir.path().join("s.lua"), broken).unwrap();
        let (status, body) = reload().await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["code"], "reload_failed");
        let t = inject(&r.organism, "svc", "<Note>c</Note>", None);
        settle(&r.organism, &t.thread_id).await;
        assert_eq!(
            &*messages(&r.organism, &t.thread_id)[1].payload_xml,
            "<Note>v2 c</Note>"
        );
    }
    let mut outcomes = Vec::new();
    while outcomes.len() < 3 {
        if let EventKind::Reload {
            agent, ok, error, ..
        } = &events.recv().await.unwrap().kind
        {
            outcomes.push((agent.clone(), *ok, error.clone().unwrap_or_default()));
        }
    }
    assert!(outcomes[0].1);
    assert!(
        !outcomes[1].1 && outcomes[1].2.contains("does not compile"),
        "{outcomes:?}"
    );
    assert!(
        !outcomes[2].1
            && outcomes[2].2.contains("init failed")
            && outcomes[2].2.contains("missing key"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[0].0.as_deref(), Some("svc"));

    // Native listeners have nothing to reload; unknown ones are 404.
    let url = format!("http://{}/api/v1/agents/nobody/reload", server.local_addr());
    assert_eq!(http.post(url).send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn editing_the_script_reloads_it_by_file_watch() {
    let r = rig(
        &[("s.lua", "function handle(p, m) return { to = m.from, type = 'Note', payload = 'old' } end")],
        "  - { name: svc, description: versions, kind: lua, script: s.lua, schema: t.xsd, accepts: [Note] }",
    );
    let mut events = r.organism.events().subscribe();
    r.organism.watch_files(Duration::from_millis(50));
    // Save by rename, as editors do.
    let tmp = r.dir.path().join("s.lua.tmp");
    std::fs::write(
        &tmp,
        "function handle(p, m) return { to = m.from, type = 'Note', payload = 'new, longer' } end",
    )
    .unwrap();
    std::fs::rename(&tmp, r.dir.path().join("s.lua")).unwrap();
    tokio::time::timeout(WAIT, async {
        loop {
            if let EventKind::Reload { ok: true, .. } = events.recv().await.unwrap().kind {
                return;
            }
        }
    })
    .await
    .expect("a reload event");
    let t = inject(&r.organism, "svc", "<Note>x</Note>", None);
    settle(&r.organism, &t.thread_id).await;
    assert_eq!(
        &*messages(&r.organism, &t.thread_id)[1].payload_xml,
        "<Note>new, longer</Note>"
    );
}

#[tokio::test]
async fn lua_metrics_count_calls_errors_by_kind_and_memory() {
    let r = rig(
        &[("s.lua", "function handle(p, m) if p == 'boom' then error('boom') end if p == 'spin' then while true do end end end")],
        "  - { name: svc, description: x, kind: lua, script: s.lua, schema: t.xsd, accepts: [Note], limits: { cpu_ms: 20 } }",
    );
    for p in ["ok", "boom", "spin"] {
        let t = inject(&r.organism, "svc", &format!("<Note>{p}</Note>"), None);
        settle(&r.organism, &t.thread_id).await;
    }
    let server = ApiServer::bind(r.organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    let text = http_get(format!("http://{}/metrics", server.local_addr()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "agentserver_lua_calls_total{agent=\"svc\"} 3",
        "agentserver_lua_errors_total{agent=\"svc\",kind=\"runtime\"} 1",
        "agentserver_lua_errors_total{agent=\"svc\",kind=\"cpu\"} 1",
        "agentserver_lua_errors_total{agent=\"svc\",kind=\"memory\"} 0",
        "# TYPE agentserver_lua_memory_bytes gauge",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}
