//! The durable log: history survives a restart (and a `kill -9`), filters and totals come
//! from SQLite, retention prunes, bad files are refused clearly. A real SQLite file.

mod common;
use common::child;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentserver::threads::{MessageFilter, Page, ThreadFilter, ThreadStatus};
use agentserver::Organism;
use common::*;

fn write_organism(dir: &Path, store: &str, extra: &str) -> std::path::PathBuf {
    organism_file(
        dir,
        format!("organism: {{ name: durable, store: {store}{extra} }}\nlisteners:\n{CHAIN}\n"),
    )
}

/// `yaml` as `dir`'s organism file, beside the test schema `t.xsd`.
fn organism_file(dir: &Path, yaml: impl AsRef<str>) -> std::path::PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml.as_ref()).unwrap();
    path
}

/// `n` threads through the chain, each completed before the next starts.
async fn completed_threads(o: &Organism, n: usize) -> Vec<String> {
    completed_threads_at(o, "a", n).await
}

/// `n` threads injected to `to`, each completed before the next starts.
async fn completed_threads_at(o: &Organism, to: &str, n: usize) -> Vec<String> {
    let mut threads = Vec::new();
    for i in 0..n {
        let t = inject(o, to, &format!("<Note>n{i}</Note>"), None);
        settle(o, &t.thread_id).await;
        threads.push(t.thread_id.to_string());
    }
    threads
}

/// A thread whose second message waits at `b`, paused for it.
async fn held_at_b(o: &Organism, text: &str) -> agentserver::InjectReceipt {
    o.control().pause_listener("b").unwrap();
    let t = inject(o, "a", &format!("<Note>{text}</Note>"), None);
    until(o, || o.agent("b").unwrap().queue_depth == 1).await;
    t
}

/// A runtime of its own: for one run of an organism, dropping it ends the run as the end of
/// a process would, with nothing stopped (its tasks, and with them the store, are dropped);
/// for a synchronous test, its HTTP and WebSocket clients.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn history_filters_and_thread_states_survive_a_restart_and_seq_keeps_increasing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "data/log.db", "");
    let first = runtime();
    let (threads, last_seq) = first.block_on(async {
        let o = Organism::builder().load(&path).unwrap();
        let mut threads = completed_threads(&o, 5).await;
        // One thread still active when the process ends.
        let stuck = held_at_b(&o, "stuck").await;
        let last = o.events().last_seq();
        o.history().store().unwrap().flush(last);
        // The store's row of a thread still active counts its messages and their time,
        // though no status change has been written since it was created.
        let second = o
            .history()
            .query_messages(
                &MessageFilter {
                    thread: Some(stuck.thread_id.to_string()),
                    ..Default::default()
                },
                Page::default(),
            )
            .unwrap()
            .items[1]
            .timestamp;
        let active = ThreadFilter {
            status: Some(ThreadStatus::Active),
            since: Some(second),
            ..Default::default()
        };
        let listed = o.history().query_threads(&active, Page::default()).unwrap();
        assert_eq!(listed.total, 1, "active since its second message");
        assert_eq!(listed.items[0].message_count, 2);
        assert!(listed.items[0].last_activity >= second);
        threads.push(stuck.thread_id.to_string());
        // While it runs, no second organism may write its file.
        let e = Organism::builder().load(&path).err().expect("refused");
        assert!(
            e.to_string().contains("in use by another agentserver"),
            "{e}"
        );
        (threads, last)
    });
    drop(first);
    assert!(
        dir.path().join("data/log.db").exists(),
        "the directory is created"
    );

    runtime().block_on(restarted(&path, &threads, last_seq));
}

/// The second run of the test above.
async fn restarted(path: &Path, threads: &[String], last_seq: u64) {
    let o = Organism::builder().load(path).unwrap();
    assert!(
        o.events().last_seq() > last_seq,
        "seq continues past the old run"
    );
    let all = o
        .history()
        .query_messages(&MessageFilter::default(), Page::default())
        .unwrap();
    assert_eq!(
        all.total, 17,
        "5 threads of 3 messages, and the stuck one's 2"
    );
    assert_eq!(o.info().total_messages, 17);
    let b = MessageFilter {
        agent: Some("b".into()),
        ..Default::default()
    };
    assert_eq!(
        o.history()
            .query_messages(&b, Page::default())
            .unwrap()
            .total,
        11
    );
    let done = ThreadFilter {
        status: Some(ThreadStatus::Completed),
        ..Default::default()
    };
    assert_eq!(
        o.history()
            .query_threads(&done, Page::default())
            .unwrap()
            .total,
        5
    );
    let stuck = o.history().thread_info(&threads[5]).unwrap().unwrap();
    assert_eq!(
        (stuck.status, stuck.error.as_deref(), stuck.message_count),
        (ThreadStatus::Error, Some("interrupted"), 2)
    );
    // Said, not silent: counted, and an `error` event.
    assert_eq!(
        o.metrics()
            .failure_count(agentserver::pump::FailureKind::Interrupted),
        1
    );
    let oldest = o.events().subscribe_since(Some(0)).resync_from.unwrap();
    let retained = o.events().subscribe_since(Some(oldest - 1)).replay;
    assert!(
        retained.iter().any(|e| matches!(
            &e.kind,
            agentserver::events::EventKind::Error { error, .. }
                if error.contains("1 active thread(s)") && error.contains("1 pending message(s)")
        )),
        "an error event reports the interrupted work"
    );
    // Its message that was queued at `b` failed with it: nothing will handle it now.
    let pending = MessageFilter {
        status: Some(agentserver::threads::MessageStatus::Pending),
        ..Default::default()
    };
    assert_eq!(
        o.history()
            .query_messages(&pending, Page::default())
            .unwrap()
            .total,
        0
    );
    let queued = &o
        .history()
        .query_messages(
            &MessageFilter {
                thread: Some(threads[5].clone()),
                ..Default::default()
            },
            Page::default(),
        )
        .unwrap()
        .items[1];
    assert_eq!(
        (queued.status, queued.error.as_deref()),
        (
            agentserver::threads::MessageStatus::Failed,
            Some("interrupted")
        )
    );

    // A thread from before the restart continues where it ended.
    let more = inject(&o, "a", "<Note>again</Note>", Some(&threads[0]));
    settle(&o, &more.thread_id).await;
    o.history().store().unwrap().flush(o.events().last_seq());
    let t0 = MessageFilter {
        thread: Some(threads[0].clone()),
        ..Default::default()
    };
    let log = o.history().query_messages(&t0, Page::default()).unwrap();
    assert_eq!(log.total, 6);
    let slots: Vec<u64> = log.items.iter().map(|m| m.slot_index).collect();
    assert_eq!(slots, vec![0, 1, 2, 3, 4, 5]);

    // Continued again: its page joins the stored slots and the live ones at once, before
    // the writer commits the new messages.
    let third = inject(&o, "a", "<Note>third</Note>", Some(&threads[0]));
    settle(&o, &third.thread_id).await;
    let page = o
        .history()
        .thread_page(&threads[0], Page::default())
        .unwrap()
        .unwrap();
    let slots: Vec<u64> = page.items.iter().map(|m| m.slot_index).collect();
    assert_eq!(slots, (0..9).collect::<Vec<u64>>());
    assert_eq!(page.total, 9);
    let second = o
        .history()
        .thread_page(&threads[0], Page::new(Some(2), Some(5)))
        .unwrap()
        .unwrap();
    assert_eq!((second.total, second.items[0].slot_index), (9, 5));
}

#[tokio::test]
async fn a_thread_is_found_the_moment_its_inject_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "s.db", "");
    let o = Organism::builder().load(&path).unwrap();
    o.control().pause_listener("b").unwrap();
    let t = inject(&o, "a", "<Note>now</Note>", None);
    // At once: the store's writer gathers for 20 ms before it commits anything.
    let info = o
        .history()
        .thread_info(&t.thread_id)
        .unwrap()
        .expect("found at once");
    assert_eq!(info.status, ThreadStatus::Active);
    let page = o
        .history()
        .thread_page(&t.thread_id, Page::default())
        .unwrap()
        .expect("its messages at once");
    assert_eq!(&*page.items[0].id, &*t.message_id);
    assert!(o
        .history()
        .thread_page("no-such-thread", Page::default())
        .unwrap()
        .is_none());
    assert!(o.history().thread_info("no-such-thread").unwrap().is_none());
    // Lists too: they read once the store has what was published before them.
    let listed = o
        .history()
        .query_threads(&ThreadFilter::default(), Page::default())
        .unwrap();
    assert!(
        listed.items.iter().any(|i| i.id.as_str() == &*t.thread_id),
        "{:?}",
        listed.items
    );
    let filter = MessageFilter {
        thread: Some(t.thread_id.to_string()),
        ..Default::default()
    };
    let messages = o
        .history()
        .query_messages(&filter, Page::default())
        .unwrap();
    assert_eq!(messages.total, 1);
}

#[tokio::test]
async fn page_totals_are_exact_while_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "log.db", "");
    let o = Organism::builder().load(&path).unwrap();
    let writer = {
        let o = o.clone();
        tokio::spawn(async move {
            for i in 0..300 {
                let t = inject(&o, "a", &format!("<Note>{i}</Note>"), None);
                settle(&o, &t.thread_id).await;
            }
        })
    };
    let mut last_total = 0;
    while !writer.is_finished() {
        for offset in [0, 7, 100] {
            let page = o
                .history()
                .query_messages(&MessageFilter::default(), Page::new(Some(25), Some(offset)))
                .unwrap();
            let expected = (page.total as usize).saturating_sub(offset).min(25);
            assert_eq!(
                page.items.len(),
                expected,
                "a page agrees with its own total"
            );
            assert!(page.total >= last_total, "totals never go back");
            last_total = page.total;
        }
        tokio::task::yield_now().await;
    }
    writer.await.unwrap();
}

#[tokio::test]
async fn retention_prunes_the_oldest_threads_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(
        dir.path(),
        "log.db",
        ", store_retention: { max_messages: 6 }",
    );
    let o = Organism::builder().load(&path).unwrap();
    let mut threads = Vec::new();
    for i in 0..5 {
        let t = inject(&o, "a", &format!("<Note>{i}</Note>"), None);
        settle(&o, &t.thread_id).await;
        threads.push(t.thread_id);
    }
    o.history().store().unwrap().flush(o.events().last_seq());
    wait_until_async("9 messages pruned", || async {
        o.history().pruned_messages() >= 9
    })
    .await;
    let left = o
        .history()
        .query_threads(&ThreadFilter::default(), Page::default())
        .unwrap();
    let ids: Vec<&str> = left.items.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec![&*threads[4], &*threads[3]], "the newest survive");
}

/// A thread waiting for a person's decision is not finished: retention, however old the
/// thread, leaves its messages, and the decision continues it whole.
#[tokio::test]
async fn retention_never_prunes_a_thread_waiting_for_a_decision() {
    use agentserver::pump::{Decider, Verdict};
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(
        dir.path(),
        format!(
            "organism: {{ name: gated, store: log.db, store_retention: {{ max_messages: 2 }} }}
listeners:
  - {{name: pay, description: payments, kind: native, handler: forward, schema: t.xsd, accepts: [Note], config: {{to: c}}, approval: {{timeout: 7d}}}}
{CHAIN}
"
        ),
    );
    let o = Organism::builder().load(&path).unwrap();
    // The oldest thread: held at `pay`'s gate, waiting.
    let waiting = inject(&o, "pay", "<Note>approve me</Note>", None).thread_id;
    let filter = agentserver::threads::InputFilter {
        thread: Some(waiting.to_string()),
        ..Default::default()
    };
    let open = || o.inputs().list(&filter, Page::default()).unwrap().items;
    until(&o, || !open().is_empty()).await;
    // Then five finished threads of three messages each: 16 messages, 2 allowed.
    completed_threads(&o, 5).await;
    o.history().store().unwrap().flush(o.events().last_seq());
    wait_until_async("12 messages pruned", || async {
        o.history().pruned_messages() >= 12
    })
    .await;
    let messages = |o: &Organism| {
        let filter = MessageFilter {
            thread: Some(waiting.to_string()),
            ..Default::default()
        };
        o.history()
            .query_messages(&filter, Page::default())
            .unwrap()
            .items
            .into_iter()
            .map(|m| format!("{}>{}", m.from, m.to.clone().unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    assert_eq!(messages(&o), ["api>pay"], "the waiting thread kept");
    // Approved, it goes on with its history whole.
    let who = Decider {
        name: None,
        role: agentserver::access::Role::Operator,
        tenant: None,
    };
    o.inputs()
        .decide(
            &open()[0].id,
            &who,
            Verdict::Approve {
                reason: None,
                payload_xml: None,
            },
        )
        .unwrap();
    settle(&o, &waiting).await;
    o.history().store().unwrap().flush(o.events().last_seq());
    assert_eq!(messages(&o), ["api>pay", "pay>c"]);
}

/// The attacker is a tenant sending as much as it likes while the organism's retention is
/// on: the history pruned is its own, never the other tenant's older threads.
#[tokio::test]
async fn one_tenants_volume_prunes_its_own_history_not_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let sink = |name: &str, tenant: &str| {
        format!("  - {{name: {name}, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: {tenant}}}\n")
    };
    let path = organism_file(
        dir.path(),
        format!(
            "organism: {{ name: shared, store: log.db, store_retention: {{ max_messages: 10 }} }}\nlisteners:\n{}{}",
            sink("acme-note", "acme"),
            sink("beta-note", "beta")
        ),
    );
    let o = Organism::builder().load(&path).unwrap();
    let run = |to: &str, n: usize| {
        (0..n)
            .map(|i| inject(&o, to, &format!("<Note>{i}</Note>"), None).thread_id)
            .collect::<Vec<_>>()
    };
    let beta = run("beta-note", 3);
    let acme = run("acme-note", 30);
    for t in beta.iter().chain(&acme) {
        settle(&o, t).await;
    }
    o.history().store().unwrap().flush(o.events().last_seq());
    // 33 messages, 10 kept: acme's 30 come down to 7, beta's 3 stay.
    wait_until_async("23 messages pruned", || async {
        o.history().pruned_messages() >= 23
    })
    .await;
    let kept = |threads: &[std::sync::Arc<str>]| {
        threads
            .iter()
            .filter(|t| {
                let filter = MessageFilter {
                    thread: Some(t.to_string()),
                    ..Default::default()
                };
                let page = o.history().query_messages(&filter, Page::default());
                page.unwrap().total > 0
            })
            .count()
    };
    assert_eq!(kept(&beta), 3, "beta's older history is whole");
    assert_eq!(kept(&acme), 7, "acme's oldest went");
    assert_eq!(kept(&acme[23..]), 7, "acme's newest stay");
}

#[tokio::test]
async fn retention_added_or_changed_by_a_reload_applies_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "log.db", "");
    let o = Organism::builder().load(&path).unwrap();
    let threads = completed_threads(&o, 5).await;
    o.history().store().unwrap().flush(o.events().last_seq());
    assert_eq!(
        o.history().pruned_messages(),
        0,
        "no retention, nothing pruned"
    );
    let retain = |max: u64| {
        write_organism(
            dir.path(),
            "log.db",
            &format!(", store_retention: {{ max_messages: {max} }}"),
        );
        o.reload(None).unwrap();
    };
    // Added by a reload: the organism started without it.
    retain(6);
    wait_until_async("9 messages pruned", || async {
        o.history().pruned_messages() >= 9
    })
    .await;
    let ids = |o: &Organism| {
        o.history()
            .query_threads(&ThreadFilter::default(), Page::default())
            .unwrap()
            .items
            .into_iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&o), vec![threads[4].clone(), threads[3].clone()]);
    // Tightened by another.
    retain(3);
    wait_until_async("12 messages pruned", || async {
        o.history().pruned_messages() >= 12
    })
    .await;
    assert_eq!(ids(&o), vec![threads[4].clone()]);
    assert_eq!(
        o.history().pruned_messages(),
        12,
        "one thread more, no other"
    );
}

async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

#[test]
fn a_full_disk_at_run_time_is_said_refuses_injects_and_the_organism_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "log.db", "");
    // The process may not grow a file past 1 MiB (`ulimit -f`, in 512-byte blocks): the
    // kernel then refuses the store's writes as a full disk would. The signal it would send
    // is ignored, as the shell passes on to the server.
    let mut run = Command::new("sh");
    run.args([
        "-c",
        "trap '' XFSZ; ulimit -f 2048; exec \"$0\" \"$@\"",
        env!("CARGO_BIN_EXE_agentserver"),
        "run",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let (mut child, url) = child::serve(run, Stdio::piped());
    let rt = runtime();
    let http = http();
    rt.block_on(async {
        let mut events = ws_connect(&format!("{}/ws", url.replacen("http", "ws", 1))).await;
        let note = serde_json::json!({"to": "a", "payload_xml": format!("<Note>{}</Note>", "x".repeat(16_000))});
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut accepted, mut behind) = (0, 0);
        let refused = loop {
            assert!(Instant::now() < deadline, "never refused: {accepted} accepted");
            let r = http
                .post(format!("{url}/api/v1/inject"))
                .json(&note)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            match status {
                202 => accepted += 1,
                // The writer falls behind while it retries, before it reports the failure.
                429 => {
                    assert_eq!(body["error"]["code"], "store_behind", "{body}");
                    behind += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => break (status, body),
            }
        };
        assert!(accepted > 10, "the store took writes first: {accepted}");
        assert_eq!(
            (refused.0, refused.1["error"]["code"].as_str()),
            (503, Some("store_failed")),
            "{} after {accepted} accepted and {behind} told to wait",
            refused.1
        );
        // Said three ways: an `error` event naming the file, a failing readiness check,
        // and the metric.
        let said = read_until(&mut events, |e| {
            e["event"] == "error" && e["error"].as_str().is_some_and(|t| t.contains("writes fail"))
        })
        .await;
        let error = said.last().unwrap()["error"].as_str().unwrap().to_string();
        assert!(error.contains("log.db"), "{error}");
        let ready = http.get(format!("{url}/readyz")).send().await.unwrap();
        assert_eq!(ready.status().as_u16(), 503);
        let metrics = http.get(format!("{url}/metrics")).send().await.unwrap();
        assert!(metrics.text().await.unwrap().contains("agentserver_store_failed 1"));
        // The organism still runs and answers reads.
        let o = get_json(&http, &format!("{url}/api/v1/organism")).await;
        assert_eq!(o["status"], "running", "{o}");
    });
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    // A stop cannot commit what the disk refuses: the process says so, and its exit status
    // too.
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let said = stderr
        .lines()
        .find(|l| l.contains("could not commit"))
        .unwrap_or_else(|| panic!("no word of the lost writes in:\n{stderr}"));
    assert!(
        said.contains("log.db") && said.contains("change(s)"),
        "{said}"
    );
    // The log, read from a pipe, is plain text (no terminal colours).
    assert!(
        stderr.contains("store write failed") && !stderr.contains('\x1b'),
        "{stderr}"
    );
}

#[test]
fn unwritable_and_corrupted_store_files_are_clear_startup_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    let path = write_organism(dir.path(), "a-file/log.db", "");
    let out = child::agentserver()
        .args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a-file/log.db") && err.contains("cannot create directory"),
        "{err}"
    );

    std::fs::write(dir.path().join("junk.db"), vec![7u8; 4096]).unwrap();
    let path = write_organism(dir.path(), "junk.db", "");
    let out = child::agentserver()
        .args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("junk.db") && err.contains("not a usable agentserver store"),
        "{err}"
    );
}

#[test]
fn kill_9_under_load_keeps_every_answered_message_and_duplicates_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(dir.path(), "log.db", "");
    let start = || {
        let mut run = child::agentserver();
        run.args(["run", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
        child::serve(run, Stdio::null())
    };
    let rt = runtime();
    let (mut child, url) = start();
    let http = http();
    // Inject as fast as one client can for a while, noting when each 202 came back.
    let answered: Vec<(String, Instant)> = rt.block_on(async {
        let mut answered = Vec::new();
        let until = Instant::now() + Duration::from_millis(1500);
        let mut i = 0;
        while Instant::now() < until {
            let r = http
                .post(format!("{url}/api/v1/inject"))
                .json(&serde_json::json!({"to": "a", "payload_xml": format!("<Note>{i}</Note>")}))
                .send()
                .await
                .unwrap();
            if r.status() == 202 {
                let v: serde_json::Value = r.json().await.unwrap();
                answered.push((
                    v["message_id"].as_str().unwrap().to_string(),
                    Instant::now(),
                ));
            }
            i += 1;
        }
        answered
    });
    Command::new("kill")
        .args(["-9", &child.id().to_string()])
        .status()
        .unwrap();
    let killed_at = Instant::now();
    child.wait().unwrap();
    assert!(answered.len() > 50, "load was applied: {}", answered.len());

    let (mut child, url) = start();
    let stored: Vec<String> = rt.block_on(async {
        let mut ids = Vec::new();
        let mut offset = 0;
        loop {
            let page = format!("{url}/api/v1/messages?limit=1000&offset={offset}");
            let v = get_json(&http, &page).await;
            let items = v["items"].as_array().unwrap();
            if items.is_empty() {
                break;
            }
            ids.extend(items.iter().map(|m| m["id"].as_str().unwrap().to_string()));
            offset += items.len();
        }
        ids
    });
    let unique: std::collections::HashSet<&String> = stored.iter().collect();
    assert_eq!(unique.len(), stored.len(), "no message is stored twice");
    // One batch window is 20 ms; allow the commit itself generous time on this 2-core machine.
    let margin = Duration::from_millis(250);
    let missing: Vec<&String> = answered
        .iter()
        .filter(|(_, at)| killed_at.duration_since(*at) > margin)
        .map(|(id, _)| id)
        .filter(|id| !unique.contains(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} answered messages lost: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Every read a client makes, of one organism's history, in a form two runs can compare
/// (ids and times differ from run to run; statuses, counts, errors and shapes must not).
fn view(o: &Organism, threads: &[String]) -> Vec<String> {
    // Error texts name threads: by their place in `threads`, the same in both runs.
    let anon = |line: String| {
        threads.iter().enumerate().fold(line, |line, (i, id)| {
            line.replace(id.as_str(), &format!("<thread {i}>"))
        })
    };
    let sorted = |lines: Vec<String>| {
        let mut lines: Vec<String> = lines.into_iter().map(anon).collect();
        lines.sort();
        lines
    };
    let all = Page::new(Some(1000), None);
    let mut out = Vec::new();
    let listed = o
        .history()
        .query_threads(&ThreadFilter::default(), all)
        .unwrap();
    out.push(format!("threads {}", listed.total));
    // Sorted: threads created in one millisecond are listed by id, which differs by run.
    out.extend(sorted(
        listed
            .items
            .iter()
            .map(|t| {
                format!(
                    "thread {:?} {} {:?} {:?}",
                    t.status, t.message_count, t.participants, t.error
                )
            })
            .collect(),
    ));
    let log = o
        .history()
        .query_messages(&MessageFilter::default(), all)
        .unwrap();
    out.push(format!("messages {}", log.total));
    // Sorted: the store pages in write order, memory by millisecond and then thread, so
    // messages of one millisecond may come in another order.
    out.extend(sorted(
        log.items
            .iter()
            .map(|m| {
                format!(
                    "message {} {:?} {:?} {:?} {:?} {}",
                    m.from, m.to, m.payload_type, m.status, m.error, m.slot_index
                )
            })
            .collect(),
    ));
    // Filtered totals.
    for agent in ["a", "b", "c", "api"] {
        let by_agent = ThreadFilter {
            agent: Some(agent.into()),
            ..Default::default()
        };
        let messages = MessageFilter {
            agent: Some(agent.into()),
            ..Default::default()
        };
        out.push(format!(
            "agent {agent}: {} threads, {} messages",
            o.history().query_threads(&by_agent, all).unwrap().total,
            o.history().query_messages(&messages, all).unwrap().total
        ));
    }
    for status in [
        ThreadStatus::Completed,
        ThreadStatus::Killed,
        ThreadStatus::Active,
    ] {
        let f = ThreadFilter {
            status: Some(status),
            ..Default::default()
        };
        out.push(format!(
            "{status:?}: {}",
            o.history().query_threads(&f, all).unwrap().total
        ));
    }
    for status in [
        agentserver::threads::MessageStatus::Delivered,
        agentserver::threads::MessageStatus::Killed,
        agentserver::threads::MessageStatus::Pending,
    ] {
        let f = MessageFilter {
            status: Some(status),
            payload_type: Some("Note".into()),
            ..Default::default()
        };
        out.push(format!(
            "{status:?} notes: {}",
            o.history().query_messages(&f, all).unwrap().total
        ));
    }
    for id in threads {
        let t = o.history().thread_info(id).unwrap().unwrap();
        let page = o.history().thread_page(id, all).unwrap().unwrap();
        let statuses: Vec<_> = page.items.iter().map(|m| m.status).collect();
        out.push(anon(format!(
            "one {:?} {} {:?} {} {statuses:?}",
            t.status, t.message_count, t.error, page.total
        )));
    }
    out
}

#[tokio::test]
async fn the_store_and_memory_show_the_same_history() {
    let mut views = Vec::new();
    for store in ["s.db", "memory"] {
        let dir = tempfile::tempdir().unwrap();
        let o = Organism::builder()
            .load(&write_organism(dir.path(), store, ""))
            .unwrap();
        let mut threads = completed_threads(&o, 3).await;
        // Killed while its message waits at a paused listener.
        let killed = held_at_b(&o, "kill").await;
        o.control().kill_thread(&killed.thread_id).unwrap();
        settle(&o, &killed.thread_id).await;
        o.control().resume_listener("b").unwrap();
        threads.push(killed.thread_id.to_string());
        // Continued once it has completed.
        let again = inject(&o, "a", "<Note>more</Note>", Some(&threads[0]));
        settle(&o, &again.thread_id).await;
        // Injected straight to the last listener.
        let last = inject(&o, "c", "<Note>last</Note>", None);
        settle(&o, &last.thread_id).await;
        threads.push(last.thread_id.to_string());
        if let Some(s) = o.history().store() {
            s.flush(o.events().last_seq());
        }
        views.push(view(&o, &threads));
        o.stop().await;
    }
    assert_eq!(views[0], views[1]);
}

#[tokio::test]
async fn the_store_and_memory_show_the_same_failures() {
    // Over a thread's budget, and undeliverable when a reload removes the listener.
    let mut views = Vec::new();
    for store in ["s.db", "memory"] {
        let dir = tempfile::tempdir().unwrap();
        let path = write_organism(dir.path(), store, "");
        // Two messages a thread: the chain's third hop is over budget.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            format!("limits: {{ max_messages_per_thread: 2 }}\n{text}"),
        )
        .unwrap();
        let o = Organism::builder().load(&path).unwrap();
        let mut threads = completed_threads(&o, 2).await;
        // A message waiting at `c` when a reload removes `c` (and makes `b` a sink).
        o.control().pause_listener("c").unwrap();
        let one = inject(&o, "b", "<Note>to c</Note>", None);
        until(&o, || o.agent("c").unwrap().queue_depth == 1).await;
        let text = std::fs::read_to_string(&path).unwrap();
        let kept: Vec<String> = text
            .lines()
            .filter(|l| !l.contains("name: c,"))
            .map(|l| {
                l.replace(
                    "handler: forward, schema: t.xsd, accepts: [Note], config: {to: c}",
                    "handler: sink, schema: t.xsd, accepts: [Note]",
                )
            })
            .collect();
        std::fs::write(&path, kept.join("\n")).unwrap();
        assert_eq!(o.reload(None).unwrap().removed, vec!["c".to_string()]);
        settle(&o, &one.thread_id).await;
        threads.push(one.thread_id.to_string());
        if let Some(s) = o.history().store() {
            s.flush(o.events().last_seq());
        }
        let v = view(&o, &threads);
        assert!(
            v.iter().any(|l| l.contains("budget")) && v.iter().any(|l| l.contains("Undeliverable")),
            "the budget and the reload failed something: {v:?}"
        );
        views.push(v);
        o.stop().await;
    }
    assert_eq!(views[0], views[1]);
}

#[tokio::test]
async fn a_stopped_organism_whose_handles_are_gone_leaves_its_file_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_organism(
        dir.path(),
        "s.db",
        ", store_retention: { max_messages: 100 }",
    );
    for round in 0..3 {
        let o = Organism::builder().load(&path).unwrap();
        // Every background task: retention, the store's health, the file watch.
        o.watch_files(Duration::from_millis(50));
        let t = completed_threads(&o, 1).await;
        assert!(
            Organism::builder().load(&path).is_err(),
            "in use while it runs"
        );
        o.stop().await;
        drop(o);
        // At once: stop waited for the background tasks, so nothing holds the store.
        let again = Organism::builder().load(&path).unwrap();
        assert!(
            again.history().thread_info(&t[0]).unwrap().is_some(),
            "round {round}"
        );
        again.stop().await;
    }
}

/// The attacker is a tenant reviving its old threads after a restart (memory holds none of
/// them): each revived thread is the tenant's again, counted against its quota, so old
/// threads are no way around `max_active_threads` or `max_pending_messages`.
#[tokio::test]
async fn a_tenants_threads_from_before_a_restart_count_against_its_quotas() {
    revived_threads_count_against_quotas(false).await;
}

/// The same with threads written before the store kept their tenants (schema v25): the
/// first start that knows the listeners' tenants gives those threads theirs.
#[tokio::test]
async fn a_tenants_threads_from_before_their_owners_were_kept_count_against_its_quotas() {
    revived_threads_count_against_quotas(true).await;
}

async fn revived_threads_count_against_quotas(written_before_owners: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(
        dir.path(),
        "organism: { name: quota, store: log.db }
tenants:
  acme: { max_active_threads: 2, max_pending_messages: 3 }
listeners:
  - {name: acme-note, description: keeps, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}
",
    );
    let o = Organism::builder().load(&path).unwrap();
    let threads = completed_threads_at(&o, "acme-note", 3).await;
    o.stop().await;
    drop(o);
    if written_before_owners {
        let conn = rusqlite::Connection::open(dir.path().join("log.db")).unwrap();
        conn.execute_batch(
            "DELETE FROM thread_owners; DELETE FROM meta WHERE key = 'owners_adopted'",
        )
        .unwrap();
    }
    let o = Organism::builder().load(&path).unwrap();
    let send = |t: &str| {
        o.inject(agentserver::InjectRequest {
            from: "api".into(),
            to: "acme-note".into(),
            payload_xml: "<Note>again</Note>".into(),
            thread_id: Some(t.to_string()),
        })
    };
    o.control().pause_listener("acme-note").unwrap();
    send(&threads[0]).unwrap();
    send(&threads[1]).unwrap();
    let e = send(&threads[2]).unwrap_err().to_string();
    assert!(e.contains("tenants.acme.max_active_threads"), "{e}");
    // Its pending messages count too: one more in a revived thread is the third, the next
    // is refused.
    send(&threads[0]).unwrap();
    let e = send(&threads[1]).unwrap_err().to_string();
    assert!(e.contains("tenants.acme.max_pending_messages"), "{e}");
    o.control().resume_listener("acme-note").unwrap();
    for t in &threads[..2] {
        settle(&o, t).await;
    }
    send(&threads[2]).unwrap();
    settle(&o, &threads[2]).await;
    o.stop().await;
}

/// A thread continued again and again, each time after it finished, while other threads
/// push finished ones out of memory: every message of it is in the store, each in its own
/// slot (a thread let go of and taken up again continues after what was written).
#[tokio::test]
async fn a_thread_continued_after_each_finish_keeps_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(
        dir.path(),
        format!("organism: {{ name: durable, store: data.db }}\nlimits: {{ max_retained_bytes: 1048576 }}\nlisteners:\n{CHAIN}\n"),
    );
    let o = Organism::builder().load(&path).unwrap();
    let pad = "x".repeat(4000);
    for i in 0..300 {
        inject(&o, "a", &format!("<Note>{i} {pad}</Note>"), Some("kept"));
        // Others finish in between, so `kept` is let go of from memory now and then.
        let other = inject(&o, "a", &format!("<Note>other {i} {pad}</Note>"), None);
        settle(&o, &other.thread_id).await;
        wait_until_async("`kept` finishes", || async {
            o.history()
                .thread_info("kept")
                .ok()
                .flatten()
                .is_some_and(|t| t.status == ThreadStatus::Completed)
        })
        .await;
    }
    let filter = agentserver::threads::MessageFilter {
        thread: Some("kept".into()),
        ..Default::default()
    };
    let page = o.history().query_messages(&filter, Page::ALL).unwrap();
    assert_eq!(page.total, 900, "three hops for each of the 300 injects");
    let slots: Vec<u64> = page.items.iter().map(|m| m.slot_index).collect();
    assert_eq!(slots, (0..900).collect::<Vec<u64>>());
    o.stop().await;
}
