//! Hot reload of the organism (SPEC §12): by editing the file (watched), by the API, under
//! load. Real files, real Lua, real HTTP and WebSocket clients.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use agentserver::api::{ApiOptions, ApiServer};
use agentserver::events::EventKind;
use agentserver::listener::{Delivery, FnHandler, Output};
use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::{InjectRequest, Organism, OrganismBuilder, ReloadReport};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

const HEAD: &str = "organism: { name: live, store: memory }\nlisteners:\n";
const A: &str = "  - {name: a, description: first, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: b}}\n";
const B: &str = "  - {name: b, description: second, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {to: c}}\n";
const C: &str = "  - {name: c, description: last, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n";

struct Rig {
    organism: Organism,
    server: ApiServer,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

impl Rig {
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// Rewrites the organism file as editors that save by rename do.
    fn save(&self, listeners: &str) {
        let tmp = self.path("organism.yaml.tmp");
        std::fs::write(&tmp, format!("{HEAD}{listeners}")).unwrap();
        std::fs::rename(&tmp, self.path("organism.yaml")).unwrap();
    }

    async fn post(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .post(format!("http://{}{path}", self.server.local_addr()))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        self.http
            .get(format!("http://{}/metrics", self.server.local_addr()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

async fn rig_with(builder: OrganismBuilder, listeners: &str, files: &[(&str, &str)]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let path = dir.path().join("organism.yaml");
    std::fs::write(&path, format!("{HEAD}{listeners}")).unwrap();
    let organism = builder.load(&path).expect("builds");
    let server = ApiServer::bind(organism.clone(), "127.0.0.1:0", ApiOptions::default())
        .await
        .unwrap();
    Rig {
        organism,
        server,
        http: http(),
        dir,
    }
}

async fn rig(listeners: &str) -> Rig {
    rig_with(Organism::builder(), listeners, &[]).await
}

/// The next `reload` event for the whole organism.
async fn next_reload(
    events: &mut agentserver::events::Receiver,
) -> (bool, Option<String>, Option<ReloadReport>) {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(ev) = events.recv().await {
                if let EventKind::Reload {
                    agent: None,
                    ok,
                    error,
                    diff,
                    ..
                } = &ev.kind
                {
                    return (*ok, error.clone(), diff.clone());
                }
            }
        }
    })
    .await
    .expect("a reload event")
}

fn note(o: &Organism, to: &str, text: &str) -> String {
    inject(o, to, &format!("<Note>{text}</Note>"), None)
        .thread_id
        .to_string()
}

#[tokio::test]
async fn editing_the_file_adds_removes_and_changes_listeners_and_observers_follow() {
    let r = rig(&format!("{A}{B}{C}")).await;
    let mut events = r.organism.events().subscribe();
    r.organism.watch_files(Duration::from_millis(50));
    // A /ws client filtered on the listener about to appear.
    let ws_url = format!("ws://{}/ws?agents=d", r.server.local_addr());
    let mut ws = ws_connect(&ws_url).await;
    assert_eq!(next_json(&mut ws).await["event"], "connected");

    // Add d, change b to forward to d, remove c — one save, picked up by the watch.
    let d = "  - {name: d, description: new end, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n";
    let b2 = B.replace("to: c", "to: d");
    r.save(&format!("{A}{b2}{d}"));
    let (ok, error, diff) = next_reload(&mut events).await;
    assert!(ok, "{error:?}");
    let diff = diff.unwrap();
    assert_eq!(
        (
            diff.rev,
            diff.added.clone(),
            diff.removed.clone(),
            diff.changed.clone(),
            diff.unchanged.clone()
        ),
        (
            2,
            vec!["d".to_string()],
            vec!["c".to_string()],
            vec!["b".to_string()],
            vec!["a".to_string()]
        )
    );
    assert_eq!(r.organism.info().config_rev, 2);
    let names: Vec<String> = r.organism.agents().into_iter().map(|a| a.name).collect();
    assert_eq!(names, vec!["a", "b", "d"]);

    // The new topology carries messages; the filtered subscriber sees the new agent.
    let t = note(&r.organism, "a", "after");
    assert_eq!(settle(&r.organism, &t).await, ThreadStatus::Completed);
    let ms = messages(&r.organism, &t);
    assert_eq!(to_of(&ms[2]), "d");
    let seen = read_until(&mut ws, |v| {
        v["event"] == "message" && v["message"]["to"] == "d"
    })
    .await;
    assert!(seen.iter().all(|v| v["event"] != "message"
        || v["message"]["to"] == "d"
        || v["message"]["from"] == "d"));
    // A new snapshot lists the new agents.
    let mut fresh = ws_connect(&format!("ws://{}/ws", r.server.local_addr())).await;
    let hello = next_json(&mut fresh).await;
    let agents: Vec<&str> = hello["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(agents, vec!["a", "b", "d"]);
    assert_eq!(hello["organism"]["config_rev"], 2);
}

#[tokio::test]
async fn broken_files_keep_the_running_organism_and_say_why() {
    let lua_ok = "function handle(p, m) return { to = 'c', type = 'Note', payload = p } end";
    let listeners = format!(
        "{A}  - {{name: b, description: lua, kind: lua, script: s.lua, schema: t.xsd, accepts: [Note]}}\n{C}"
    );
    let r = rig_with(Organism::builder(), &listeners, &[("s.lua", lua_ok)]).await;
    // (what, how to break it, what the reason says)
    type Breakage = Box<dyn Fn(&Rig)>;
    let cases: Vec<(&str, Breakage, &str)> = vec![
        (
            "broken YAML",
            Box::new(|r: &Rig| std::fs::write(r.path("organism.yaml"), "organism: [oops").unwrap()),
            "not valid YAML",
        ),
        (
            "broken XSD",
            Box::new(|r: &Rig| std::fs::write(r.path("t.xsd"), "<xs:schema").unwrap()),
            "schema",
        ),
        (
            "script that does not compile",
            Box::new(|r: &Rig| {
                std::fs::write(r.path("s.lua"), "function handle(p, m) return {").unwrap()
            }),
            "does not compile",
        ),
        (
            "script whose init fails",
            Box::new(|r: &Rig| {
                std::fs::write(
                    r.path("s.lua"),
                    "function init(c) error('no database') end function handle(p, m) end",
                )
                .unwrap()
            }),
            "no database",
        ),
    ];
    for (what, break_it, why) in cases {
        let mut events = r.organism.events().subscribe();
        break_it(&r);
        let (status, body) = r.post("/api/v1/organism/reload").await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("reload_failed")),
            "{what}: {body}"
        );
        let details = body["error"]["details"].to_string();
        assert!(details.contains(why), "{what}: {details}");
        let (ok, error, _) = next_reload(&mut events).await;
        assert!(!ok && error.unwrap_or_default().contains(why), "{what}");
        assert!(
            r.metrics().await.contains("agentserver_config_stale 1"),
            "{what}"
        );
        // The old organism runs on, unchanged.
        assert_eq!(r.organism.info().config_rev, 1, "{what}");
        let t = note(&r.organism, "a", what);
        assert_eq!(
            settle(&r.organism, &t).await,
            ThreadStatus::Completed,
            "{what}"
        );
        // Mend it for the next case.
        std::fs::write(r.path("organism.yaml"), format!("{HEAD}{listeners}")).unwrap();
        std::fs::write(r.path("t.xsd"), TEST_XSD).unwrap();
        std::fs::write(r.path("s.lua"), lua_ok).unwrap();
    }
    // A mended file reloads, and the config is no longer stale.
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(status, 200, "{body}");
    assert!(r.metrics().await.contains("agentserver_config_stale 0"));
}

#[tokio::test]
async fn settings_that_need_a_restart_and_stale_revisions_are_refused() {
    let r = rig(&format!("{A}{B}{C}")).await;
    std::fs::write(
        r.path("organism.yaml"),
        format!("organism: {{ name: live, store: memory, listen: '127.0.0.1:9' }}\nlisteners:\n{A}{B}{C}"),
    )
    .unwrap();
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(status, 422, "{body}");
    let details = body["error"]["details"].to_string();
    assert!(
        details.contains("organism.listen") && details.contains("needs a restart"),
        "{details}"
    );
    std::fs::write(r.path("organism.yaml"), format!("{HEAD}{A}{B}{C}")).unwrap();
    let (status, body) = r.post("/api/v1/organism/reload?if_rev=7").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("rev_mismatch"))
    );
    // The right revision is taken; the file is what runs, so the revision stays.
    let (status, body) = r.post("/api/v1/organism/reload?if_rev=1").await;
    assert_eq!((status, body["rev"].as_u64()), (200, Some(1)), "{body}");
}

#[tokio::test]
async fn a_thread_in_flight_through_a_changed_listener_completes() {
    // `hold` forwards to c once the test lets it.
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let builder = Organism::builder().handler(
        "hold",
        FnHandler(move |d: Delivery| {
            let g = g.clone();
            async move {
                g.acquire().await.unwrap().forget();
                Ok(vec![Output::to("c", d.payload.xml().to_string())])
            }
        }),
    );
    let hold = "  - {name: b, description: holds, kind: native, handler: hold, schema: t.xsd, accepts: [Note]}\n";
    let r = rig_with(builder, &format!("{A}{hold}{C}"), &[]).await;
    let first = note(&r.organism, "a", "in flight");
    until(&r.organism, || {
        r.organism.agent("b").map(|a| a.state) == Ok(agentserver::events::AgentState::Processing)
    })
    .await;
    let queued = note(&r.organism, "a", "queued behind");
    until(&r.organism, || {
        r.organism.agent("b").map(|a| a.queue_depth) == Ok(1)
    })
    .await;

    // Change b while its call is in flight and a message waits in its queue.
    std::fs::write(
        r.path("organism.yaml"),
        format!("{HEAD}{A}{}{C}", hold.replace("holds", "holds (revised)")),
    )
    .unwrap();
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(
        (status, body["changed"].clone()),
        (200, json!(["b"])),
        "{body}"
    );
    assert_eq!(
        r.organism.agent("b").unwrap().description,
        "holds (revised)"
    );
    gate.add_permits(2);
    for t in [&first, &queued] {
        assert_eq!(settle(&r.organism, t).await, ThreadStatus::Completed);
        let ms = messages(&r.organism, t);
        assert_eq!(to_of(ms.last().unwrap()), "c", "{ms:?}");
    }
    assert_eq!(
        r.organism.agent("b").unwrap().handled,
        2,
        "counters carry over"
    );
}

#[tokio::test]
async fn removing_a_listener_makes_its_queued_messages_undeliverable() {
    let z = "  - {name: z, description: to be removed, kind: native, handler: sink, schema: t.xsd, accepts: [Note]}\n";
    let r = rig(&format!("{A}{B}{C}{z}")).await;
    r.organism.control().pause_listener("z").unwrap();
    let t = note(&r.organism, "z", "stranded");
    until(&r.organism, || {
        r.organism.agent("z").map(|a| a.queue_depth) == Ok(1)
    })
    .await;
    std::fs::write(r.path("organism.yaml"), format!("{HEAD}{A}{B}{C}")).unwrap();
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(
        (status, body["removed"].clone()),
        (200, json!(["z"])),
        "{body}"
    );
    assert_eq!(settle(&r.organism, &t).await, ThreadStatus::Error);
    let last = messages(&r.organism, &t).pop().unwrap();
    assert_eq!(last.status, MessageStatus::Undeliverable);
    assert!(last.error.unwrap().contains("removed by a reload"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_continuous_load_loses_and_duplicates_nothing() {
    let r = rig(&format!("{A}{B}{C}")).await;
    let extra = "  - {name: x, description: extra, kind: native, handler: sink, schema: t.xsd, accepts: [Pong]}\n";
    let injectors = 4;
    let per_injector = 300;
    let mut tasks = Vec::new();
    for i in 0..injectors {
        let o = r.organism.clone();
        tasks.push(tokio::spawn(async move {
            let mut threads = Vec::new();
            for n in 0..per_injector {
                loop {
                    match o.inject(InjectRequest {
                        from: "api".into(),
                        to: "a".into(),
                        payload_xml: format!("<Note>{i}-{n}</Note>"),
                        thread_id: None,
                    }) {
                        Ok(receipt) => {
                            threads.push(receipt.thread_id);
                            break;
                        }
                        // Over load: try again; never give up on a message.
                        Err(agentserver::InjectError::Overloaded { .. }) => {
                            tokio::task::yield_now().await
                        }
                        Err(e) => panic!("inject refused: {e}"),
                    }
                }
                if n % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            threads
        }));
    }
    // Meanwhile: change b back and forth, and add and remove an unrelated listener.
    until(&r.organism, || r.organism.metrics().pending() > 0).await;
    let mut busy_reloads = 0;
    for round in 0..6 {
        if r.organism.metrics().pending() > 0 {
            busy_reloads += 1;
        }
        let b = B.replace("second", &format!("second (round {round})"));
        let more = if round % 2 == 0 { extra } else { "" };
        std::fs::write(r.path("organism.yaml"), format!("{HEAD}{A}{b}{C}{more}")).unwrap();
        let (status, body) = r.post("/api/v1/organism/reload").await;
        assert_eq!(status, 200, "{body}");
        tokio::task::yield_now().await;
    }
    let mut threads = Vec::new();
    for t in tasks {
        threads.extend(t.await.unwrap());
    }
    assert_eq!(threads.len(), injectors * per_injector);
    assert!(busy_reloads > 0, "reloads ran while messages were pending");
    let mut at_c: HashMap<String, usize> = HashMap::new();
    for t in &threads {
        assert_eq!(settle(&r.organism, t).await, ThreadStatus::Completed, "{t}");
        let ms = messages(&r.organism, t);
        assert_eq!(ms.len(), 3, "{ms:?}");
        for m in ms.iter().filter(|m| to_of(m) == "c") {
            assert_eq!(m.status, MessageStatus::Delivered);
            *at_c.entry(t.to_string()).or_default() += 1;
        }
    }
    assert_eq!(at_c.len(), threads.len(), "every thread reached c");
    assert!(at_c.values().all(|n| *n == 1), "no duplicate");
    assert_eq!(r.organism.info().config_rev, 7);
}

#[tokio::test]
async fn a_schema_that_appears_after_the_file_naming_it_is_picked_up() {
    let r = rig(&format!("{A}{B}{C}")).await;
    let mut events = r.organism.events().subscribe();
    r.organism.watch_files(Duration::from_millis(50));
    let late = "  - {name: late, description: typed later, kind: native, handler: sink, schema: late.xsd}\n";
    r.save(&format!("{A}{B}{C}{late}"));
    let (ok, error, _) = next_reload(&mut events).await;
    assert!(!ok && error.unwrap_or_default().contains("late.xsd"));
    // The schema arrives: the watch sees the directory change and reloads.
    std::fs::write(
        r.path("late.xsd"),
        r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="Late" type="xs:string"/></xs:schema>"#,
    )
    .unwrap();
    let (ok, error, diff) = next_reload(&mut events).await;
    assert!(ok, "{error:?}");
    assert_eq!(diff.unwrap().added, vec!["late".to_string()]);
    assert!(!r.organism.metrics().config_stale());
}

#[tokio::test]
async fn a_reload_that_changes_nothing_reports_unchanged_and_keeps_the_revision() {
    let r = rig(&format!("{A}{B}{C}")).await;
    // Saved again with only a comment added: what runs is the same.
    std::fs::write(
        r.path("organism.yaml"),
        format!("# a comment\n{HEAD}{A}{B}{C}"),
    )
    .unwrap();
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rev"], 1, "{body}");
    assert_eq!(body["unchanged"], json!(["a", "b", "c"]));
    assert_eq!(body["changed"], json!([]));
    assert_eq!(r.organism.info().config_rev, 1);
    // A real change still takes a new revision.
    r.save(&format!("{A}{}{C}", B.replace("second", "second renamed")));
    let (status, body) = r.post("/api/v1/organism/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["rev"].as_u64(), body["changed"].clone()),
        (Some(2), json!(["b"]))
    );
}

#[tokio::test]
async fn a_script_changed_on_disk_counts_as_a_lua_reload() {
    let up =
        "function handle(p, m) return { to = 'c', type = 'Note', payload = string.upper(p) } end\n";
    let lua = "  - {name: l, description: script, kind: lua, script: l.lua, schema: t.xsd, accepts: [Note]}\n";
    let r = rig_with(Organism::builder(), &format!("{lua}{C}"), &[("l.lua", up)]).await;
    let mut events = r.organism.events().subscribe();
    r.organism.watch_files(Duration::from_millis(50));
    std::fs::write(r.path("l.lua"), up.replace("upper", "lower")).unwrap();
    let (ok, error, diff) = next_reload(&mut events).await;
    assert!(ok, "{error:?}");
    assert_eq!(diff.unwrap().changed, vec!["l".to_string()]);
    let text = r.metrics().await;
    assert!(
        text.contains("agentserver_lua_reloads_total{agent=\"l\"} 1"),
        "{}",
        text.lines()
            .filter(|l| l.contains("lua_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
