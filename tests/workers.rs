//! Listeners placed on workers (`placement: workers`): a real `nats-server` with JetStream on a
//! loopback port, the pump in this process, and real `agentserver worker` processes.
//!
//! `relay` (the `delay` built-in) runs on workers and sends each note on to `collector` (a
//! sink, in-process), so the collector's log is what the workers' outputs became.

mod common;
#[path = "workers/llm.rs"]
mod llm;
mod nats;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;

use agentserver::threads::{MessageStatus, ThreadStatus};
use agentserver::Organism;
use common::child::{agentserver, Running};
use common::*;
use futures_util::StreamExt;
use nats::Nats;

/// Writes the organism: `relay` on workers (waits `delay_ms`, then on to `collector`).
fn organism_file(dir: &Path, nats: &Nats, delay_ms: u64, nats_extra: &str) -> PathBuf {
    std::fs::write(dir.join("t.xsd"), TEST_XSD).unwrap();
    let prefix = nats.prefix();
    let yaml = format!(
        "organism:
  name: workers
  store: memory
  nats: {{url: {url}, stream_prefix: {prefix}, ack_wait_ms: 1000{nats_extra}}}
listeners:
  - {{name: relay, description: on workers, kind: native, handler: delay, schema: t.xsd, accepts: [Note], config: {{ms: {delay_ms}, to: collector}}, peers: [collector], concurrency: 8, placement: workers}}
  - {{name: collector, description: keeps notes, kind: native, handler: sink, schema: t.xsd, accepts: [Note], concurrency: 8}}
",
        url = nats.url()
    );
    let path = dir.join("o.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A worker process serving `relay`; its stderr lines arrive on the receiver.
fn worker(path: &Path, name: &str) -> (Running, mpsc::Receiver<String>) {
    worker_of(path, "relay", name)
}

/// A worker process serving `listeners`; its stderr lines arrive on the receiver.
fn worker_of(path: &Path, listeners: &str, name: &str) -> (Running, mpsc::Receiver<String>) {
    let mut child = Running::spawn(
        agentserver()
            .args(["worker"])
            .arg(path)
            .args(["--listeners", listeners, "--name", name])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Stops a worker with SIGTERM; how many deliveries it says it answered.
fn stop_worker(mut child: Running, lines: mpsc::Receiver<String>) -> u64 {
    let pid = child.id() as i32;
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(child::wait_exit(&mut child), Some(0), "the worker exits 0");
    let all: Vec<String> = lines.try_iter().collect();
    all.iter()
        .find_map(|l| l.split("answered ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in the worker's stderr: {all:?}"))
}

use common::child;

/// Every note sent to the collector and not refused, as (thread, text), in order.
fn collected(o: &Organism, threads: &[String]) -> Vec<(String, String)> {
    threads
        .iter()
        .flat_map(|t| {
            messages(o, t)
                .into_iter()
                .filter(|m| {
                    to_of(m) == "collector"
                        && matches!(m.status, MessageStatus::Delivered | MessageStatus::Pending)
                })
                .map(|m| (t.clone(), m.payload_xml.to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn note(text: &str) -> String {
    format!("<Note>{text}</Note>")
}

/// Injects `per_thread` notes into each of `threads` new threads, one after another in each.
fn inject_all(o: &Organism, threads: usize, per_thread: usize) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for t in 0..threads {
        let first = inject(o, "relay", &note(&format!("t{t}-0")), None);
        ids.push(first.thread_id.to_string());
        for i in 1..per_thread {
            inject(o, "relay", &note(&format!("t{t}-{i}")), Some(&ids[t]));
        }
    }
    ids
}

async fn settle_all(o: &Organism, threads: &[String]) {
    for t in threads {
        let status = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            o.history().wait_thread(t),
        )
        .await
        .expect("the thread settles")
        .expect("the thread exists");
        assert_eq!(
            status,
            ThreadStatus::Completed,
            "thread {t}: {:?}",
            messages(o, t)
        );
    }
}

/// Each thread's notes reached the collector once each, in the order they were injected.
fn assert_once_in_order(o: &Organism, threads: &[String], per_thread: usize) {
    let got = collected(o, threads);
    assert_eq!(got.len(), threads.len() * per_thread, "{got:?}");
    for (t, id) in threads.iter().enumerate() {
        let texts: Vec<String> = got
            .iter()
            .filter(|(thread, _)| thread == id)
            .map(|(_, x)| x.clone())
            .collect();
        let expected: Vec<String> = (0..per_thread)
            .map(|i| note(&format!("t{t}-{i}")))
            .collect();
        assert_eq!(texts, expected, "thread {t}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_share_a_listener_and_keep_each_threads_order() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 20, "");
    let o = Organism::builder().load(&path).unwrap();
    assert_eq!(o.metrics().unserved_listeners(), vec!["relay".to_string()]);
    let (a, a_lines) = worker(&path, "a");
    let (b, b_lines) = worker(&path, "b");
    wait_until_async("both workers to announce themselves", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;

    let threads = inject_all(&o, 8, 6);
    settle_all(&o, &threads).await;
    assert_once_in_order(&o, &threads, 6);
    // The pump sets `from`: the outputs are relay's, whichever worker ran it.
    for t in &threads {
        for m in messages(&o, t).iter().filter(|m| to_of(m) == "collector") {
            assert_eq!(&*m.from, "relay");
        }
    }
    let (na, nb) = (stop_worker(a, a_lines), stop_worker(b, b_lines));
    assert_eq!(na + nb, 48, "each delivery answered once");
    assert!(
        na > 0 && nb > 0,
        "both workers took deliveries: {na} and {nb}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_call_loses_nothing_and_duplicates_nothing() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 200, "");
    let o = Organism::builder().load(&path).unwrap();
    let (mut a, _a_lines) = worker(&path, "a");
    wait_until_async("worker a", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;

    let threads = inject_all(&o, 6, 4);
    // Worker a alone holds deliveries mid-call: kill it without a chance to answer.
    wait_until_async("a first delivery to be answered", || async {
        !collected(&o, &threads).is_empty()
    })
    .await;
    a.kill().unwrap();
    a.wait().unwrap();
    let (b, b_lines) = worker(&path, "b");
    settle_all(&o, &threads).await;
    assert_once_in_order(&o, &threads, 4);
    let failed: Vec<_> = threads
        .iter()
        .flat_map(|t| with_status(&messages(&o, t), MessageStatus::Failed))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(stop_worker(b, b_lines) > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_stopped_and_restarted_mid_load_loses_nothing() {
    let mut nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 20, ", deliver_timeout_ms: 60000");
    let o = Organism::builder().load(&path).unwrap();
    let (w, w_lines) = worker(&path, "w");
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;

    let threads = inject_all(&o, 6, 5);
    wait_until_async("some notes through", || async {
        !collected(&o, &threads).is_empty()
    })
    .await;
    nats.down();
    // The rest of the organism keeps running while NATS is away.
    let local = inject(&o, "collector", &note("local"), None);
    assert_eq!(settle(&o, &local.thread_id).await, ThreadStatus::Completed);
    nats.up();
    settle_all(&o, &threads).await;
    assert_once_in_order(&o, &threads, 5);
    stop_worker(w, w_lines);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_worker_a_delivery_fails_with_the_reason() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, ", deliver_timeout_ms: 800");
    let o = Organism::builder().load(&path).unwrap();
    let mut events = o.events().subscribe();
    let r = inject(&o, "relay", &note("alone"), None);
    wait_until_async("relay to show it waits for a worker", || async {
        o.agent("relay").unwrap().state == agentserver::events::AgentState::Waiting
    })
    .await;
    // Observers are told too.
    tokio::time::timeout(WAIT, async {
        loop {
            let ev = events.recv().await.unwrap();
            if let agentserver::events::EventKind::AgentState { agent, state, .. } = &ev.kind {
                if &**agent == "relay" && *state == agentserver::events::AgentState::Waiting {
                    return;
                }
            }
        }
    })
    .await
    .expect("an agent_state event: waiting");
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let failed = with_status(&messages(&o, &r.thread_id), MessageStatus::Failed);
    let error = failed[0].error.as_deref().unwrap_or_default().to_string();
    assert!(
        error.contains("no worker answered within 800 ms")
            && error.contains("no worker of it is running"),
        "{error}"
    );
    assert_eq!(o.metrics().unserved_listeners(), vec!["relay".to_string()]);
}

/// A client of NATS that is not the worker the delivery went to answers it: with the wrong
/// nonce it is refused; the real answer (taken from the work queue like a worker) is
/// accepted, and its invalid output is refused by the pump's gate like any handler's.
#[tokio::test(flavor = "multi_thread")]
async fn forged_and_invalid_results_are_refused() {
    use async_nats::jetstream::{self, consumer::pull};
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, ", deliver_timeout_ms: 20000");
    let o = Organism::builder().load(&path).unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let prefix = nats.prefix();
    let r = inject(&o, "relay", &note("forge me"), None);

    // The pump sets the stream up once NATS answers.
    let work = format!("{prefix}_work");
    wait_until_async("the work stream", || async {
        js.get_stream(&work).await.is_ok()
    })
    .await;
    let stream = js.get_stream(&work).await.unwrap();
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            "work-relay",
            pull::Config {
                durable_name: Some("work-relay".into()),
                filter_subject: format!("{prefix}.work.relay"),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut batch = consumer
        .batch()
        .max_messages(1)
        .expires(std::time::Duration::from_secs(10))
        .messages()
        .await
        .unwrap();
    let msg = batch.next().await.unwrap().unwrap();
    let item: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(item["thread_id"], r.thread_id.to_string());
    let answer = |nonce: &str, payload: &str, id: &str| {
        serde_json::to_vec(&serde_json::json!({
            "message_id": item["message_id"],
            "nonce": nonce,
            "worker": "rogue",
            "outputs": [{"payload": payload, "to": "collector"}],
        }))
        .map(|body| (body, id.to_string()))
        .unwrap()
    };
    let publish = |(body, id): (Vec<u8>, String)| {
        let js = js.clone();
        let subject = format!("{prefix}.results");
        async move {
            js.send_publish(
                subject,
                jetstream::message::PublishMessage::build()
                    .payload(body.into())
                    .message_id(id),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
    };
    // A wrong nonce: refused, the delivery still open.
    publish(answer(
        "00112233445566778899aabbccddeeff",
        "<Note>forged</Note>",
        "f1",
    ))
    .await;
    wait_until_async("the forged result to be refused", || async {
        o.metrics().worker_results().0 == 1
    })
    .await;
    assert_eq!(
        o.threads().status(&r.thread_id).unwrap(),
        ThreadStatus::Active
    );
    // The right nonce, but an output no schema accepts: the gate refuses it.
    let nonce = item["nonce"].as_str().unwrap().to_string();
    publish(answer(&nonce, "<Shout>not a note</Shout>", "r1")).await;
    msg.ack().await.unwrap();
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let ms = messages(&o, &r.thread_id);
    let through = collected(&o, std::slice::from_ref(&r.thread_id.to_string()));
    assert!(through.is_empty(), "{through:?} {ms:?}");
    let error = ms
        .iter()
        .find_map(|m| m.error.as_deref())
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("Shout"), "{ms:?}");
}

#[test]
fn a_worker_for_a_listener_not_placed_on_workers_refuses_to_start() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    let out = child::run_to_exit([
        "worker".as_ref(),
        path.as_os_str(),
        "--listeners".as_ref(),
        "collector".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listener `collector` is not placed on workers"),
        "{stderr}"
    );
}

/// Messages in the work stream now.
async fn queued(js: &async_nats::jetstream::Context, prefix: &str) -> u64 {
    match js.get_stream(format!("{prefix}_work")).await {
        Ok(mut s) => s.info().await.map_or(u64::MAX, |i| i.state.messages),
        Err(_) => u64::MAX,
    }
}

/// An organism whose `relay` runs on workers (none running: its deliveries wait in the work
/// stream), a JetStream client, and the streams' prefix.
struct NoWorkers {
    _nats: Nats,
    _dir: tempfile::TempDir,
    o: Organism,
    js: async_nats::jetstream::Context,
    prefix: String,
}

impl NoWorkers {
    async fn start() -> NoWorkers {
        let nats = Nats::start();
        let dir = tempfile::tempdir().unwrap();
        let path = organism_file(dir.path(), &nats, 0, ", deliver_timeout_ms: 20000");
        let o = Organism::builder().load(&path).unwrap();
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let prefix = nats.prefix();
        NoWorkers {
            _nats: nats,
            _dir: dir,
            o,
            js,
            prefix,
        }
    }

    async fn queued_becomes(&self, n: u64, what: &str) {
        wait_until_async(what, || async { queued(&self.js, &self.prefix).await == n }).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_a_thread_takes_its_delivery_back_from_the_workers_queue() {
    let t = NoWorkers::start().await;
    let r = inject(&t.o, "relay", &note("doomed"), None);
    t.queued_becomes(1, "the delivery queued for workers").await;
    t.o.control().kill_thread(&r.thread_id).unwrap();
    assert_eq!(settle(&t.o, &r.thread_id).await, ThreadStatus::Killed);
    t.queued_becomes(0, "the delivery taken back").await;
}

/// A thread killed at any moment of its delivery's way into the workers' queue (before it
/// is published, while the stream takes it and the pump awaits the stream's answer, after)
/// leaves nothing there: 60 threads, each killed a few scheduler turns later than the one
/// before.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_killed_on_its_way_to_the_workers_queue_is_taken_back() {
    let t = NoWorkers::start().await;
    for i in 0..60 {
        let r = inject(&t.o, "relay", &note(&format!("doomed {i}")), None);
        for _ in 0..i * 20 {
            tokio::task::yield_now().await;
        }
        t.o.control().kill_thread(&r.thread_id).unwrap();
        assert_eq!(settle(&t.o, &r.thread_id).await, ThreadStatus::Killed);
    }
    t.queued_becomes(0, "every delivery taken back").await;
}

/// A worker whose file differs from the pump's refuses the delivery, saying so; once its
/// file matches, it reloads it and runs the next.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_reloads_its_file_to_run_the_pumps_version() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    let o = Organism::builder().load(&path).unwrap();
    let pumps = std::fs::read_to_string(&path).unwrap();
    let workers_file = dir.path().join("worker.yaml");
    std::fs::write(&workers_file, pumps.replace("ms: 0,", "ms: 1,")).unwrap();
    let (w, w_lines) = worker(&workers_file, "w");
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;

    let r = inject(&o, "relay", &note("v?"), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let error = messages(&o, &r.thread_id)
        .iter()
        .find_map(|m| m.error.clone())
        .unwrap_or_default();
    assert!(
        error.contains("on worker w: this worker's `relay`")
            && error.contains("differs from the pump's"),
        "{error}"
    );

    std::fs::write(&workers_file, &pumps).unwrap();
    let r = inject(&o, "relay", &note("v!"), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    assert_eq!(collected(&o, &[r.thread_id.to_string()]).len(), 1);
    stop_worker(w, w_lines);
}

/// `concurrency` bounds the deliveries out at workers, however many workers and slots
/// there are: with `concurrency: 2`, never more than two in flight.
#[tokio::test(flavor = "multi_thread")]
async fn concurrency_bounds_deliveries_across_all_workers() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 100, "");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen(
            "concurrency: 8, placement: workers",
            "concurrency: 2, placement: workers",
            1,
        ),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let (a, a_lines) = worker(&path, "a");
    let (b, b_lines) = worker(&path, "b");
    wait_until_async("both workers", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;
    let in_flight = || {
        o.metrics()
            .handler_metrics()
            .into_iter()
            .filter(|(agent, _)| agent == "relay")
            .flat_map(|(_, ms)| ms)
            .find(|m| m.name == "agentserver_worker_in_flight")
            .map_or(0.0, |m| m.value)
    };
    let threads = inject_all(&o, 8, 1);
    let mut most = 0.0f64;
    let mut done = false;
    let started = std::time::Instant::now();
    while !done {
        assert!(started.elapsed() < WAIT, "the threads did not end in time");
        most = most.max(in_flight());
        done = threads
            .iter()
            .all(|t| o.threads().status(t) != Some(ThreadStatus::Active));
        tokio::task::yield_now().await;
    }
    assert_eq!(most, 2.0, "deliveries out at once, at most");
    assert_eq!(in_flight(), 0.0);
    assert_once_in_order(&o, &threads, 1);
    let (na, nb) = (stop_worker(a, a_lines), stop_worker(b, b_lines));
    assert_eq!(na + nb, 8);
}

/// Pausing a placed listener holds its deliveries in the pump: nothing reaches the work
/// queue until it is resumed.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_placed_listener_hands_nothing_to_workers() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    let o = Organism::builder().load(&path).unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    wait_until_async("the work stream", || async {
        queued(&js, &nats.prefix()).await == 0
    })
    .await;
    o.control().pause_listener("relay").unwrap();
    let r = inject(&o, "relay", &note("held"), None);
    wait_until_async("relay to show it is paused", || async {
        o.agent("relay").unwrap().queue_depth == 1
    })
    .await;
    assert_eq!(queued(&js, &nats.prefix()).await, 0);
    let (w, w_lines) = worker(&path, "w");
    o.control().resume_listener("relay").unwrap();
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    assert_eq!(stop_worker(w, w_lines), 1);
}

/// Makes `relay` (in the organism file at `path`, made with no delay) a Lua listener
/// running `script` (written beside it), with `extra` keys (YAML flow, each ending `,`).
fn relay_in_lua(path: &Path, script: &str, extra: &str) {
    std::fs::write(path.with_file_name("relay.lua"), script).unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let relay = "kind: native, handler: delay, schema: t.xsd, accepts: [Note], config: {ms: 0, to: collector},";
    assert!(text.contains(relay), "relay in the file");
    let lua = format!("kind: lua, script: relay.lua, schema: t.xsd, accepts: [Note],{extra}");
    std::fs::write(path, text.replacen(relay, &lua, 1)).unwrap();
}

/// A Lua handler on a worker runs in the same sandbox as in-process, and the lines it logs
/// come back to the pump as the agent's `log` events of that thread.
#[tokio::test(flavor = "multi_thread")]
async fn a_lua_handler_on_a_worker_logs_to_the_pumps_stream() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    relay_in_lua(
        &path,
        "function handle(p, m)\n  log.info('relaying for ' .. m.from)\n  log.warn('twice')\n  return { to = 'collector', type = 'Note', payload = p }\nend\n",
        "",
    );
    let o = Organism::builder().load(&path).unwrap();
    let (w, w_lines) = worker(&path, "w");
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;
    let mut events = o.events().subscribe();
    let r = inject(&o, "relay", &note("lua"), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    assert_eq!(
        collected(&o, &[r.thread_id.to_string()]),
        vec![(r.thread_id.to_string(), note("lua"))]
    );
    let mut logged = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let agentserver::events::EventKind::Log {
            agent,
            thread_id,
            level,
            message,
        } = &ev.kind
        {
            assert_eq!(
                (agent.as_str(), thread_id.as_deref()),
                ("relay", Some(&*r.thread_id))
            );
            logged.push((level.clone(), message.clone()));
        }
    }
    assert_eq!(
        logged,
        vec![
            ("info".to_string(), "relaying for api".to_string()),
            ("warn".to_string(), "twice".to_string())
        ]
    );
    stop_worker(w, w_lines);
}

/// The scale-out commands refuse what they cannot do, saying why: a worker for a listener
/// the file lacks, a worker for an organism without `organism.nats`, and a gateway beyond
/// loopback with no credentials to check.
#[test]
fn workers_and_gateways_refuse_bad_set_ups() {
    let dir = tempfile::tempdir().unwrap();
    let nats = Nats::start();
    let path = organism_file(dir.path(), &nats, 0, "");
    let refused = |args: &[&std::ffi::OsStr], says: &str| {
        let out = child::run_to_exit(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    };
    refused(
        &[
            "worker".as_ref(),
            path.as_os_str(),
            "--listeners".as_ref(),
            "ghost".as_ref(),
        ],
        "the organism has no listener `ghost`",
    );
    let plain = dir.path().join("plain.yaml");
    std::fs::write(
        &plain,
        "organism: {name: plain, store: memory}\nlisteners:\n  - {name: c, description: sink, kind: native, handler: sink, schema: t.xsd}\n",
    )
    .unwrap();
    refused(
        &[
            "worker".as_ref(),
            plain.as_os_str(),
            "--listeners".as_ref(),
            "c".as_ref(),
        ],
        "no `organism.nats`",
    );
    refused(
        &[
            "gateway".as_ref(),
            "--nats".as_ref(),
            nats.url().as_ref(),
            "--organism".as_ref(),
            "workers".as_ref(),
            "--listen".as_ref(),
            "0.0.0.0:0".as_ref(),
        ],
        "is beyond this machine",
    );
}

/// NATS carries at most `max_payload` bytes a message: a delivery larger than that fails at
/// once, saying so, and so does a worker's answer (its outputs are refused on the worker,
/// which tells the pump instead of retrying forever).
#[tokio::test(flavor = "multi_thread")]
async fn deliveries_and_answers_over_nats_max_payload_fail_saying_so() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, ", deliver_timeout_ms: 20000");
    std::fs::write(
        dir.path().join("big.lua"),
        "function handle(p, m)\n  return { to = 'collector', type = 'Note', payload = string.rep('x', 1100000) }\nend\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replacen("listeners:\n", "limits: {max_message_bytes: 4194304}\nlisteners:\n", 1)
        + "  - {name: big, description: answers large, kind: lua, script: big.lua, schema: t.xsd, accepts: [Note], peers: [collector], placement: workers, limits: {memory_mb: 64}}\n";
    std::fs::write(&path, text).unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let mut w = Running::spawn(
        agentserver()
            .args(["worker"])
            .arg(&path)
            .args(["--listeners", "relay,big", "--name", "w"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;

    let error_of = |thread: &str| {
        messages(&o, thread)
            .iter()
            .find_map(|m| m.error.clone())
            .unwrap_or_default()
    };
    let large = inject(&o, "relay", &note(&"y".repeat(1_100_000)), None);
    assert_eq!(settle(&o, &large.thread_id).await, ThreadStatus::Error);
    let error = error_of(&large.thread_id);
    assert!(
        error.contains("the delivery cannot go to workers")
            && error.contains("over the NATS server's max_payload"),
        "{error}"
    );

    let answers_large = inject(&o, "big", &note("small"), None);
    assert_eq!(
        settle(&o, &answers_large.thread_id).await,
        ThreadStatus::Error
    );
    let error = error_of(&answers_large.thread_id);
    assert!(
        error.contains("on worker w: the handler's answer is")
            && error.contains("over the NATS server's max_payload"),
        "{error}"
    );
    let _ = w.kill();
}

/// A tenant's listener on a worker: its outputs come back as text and take the same routing
/// step, so one sent to another tenant's listener is refused (with the words a name that
/// does not exist gets) and one to its own tenant's is delivered.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_listener_on_a_worker_reaches_no_other_tenant() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.xsd"), TEST_XSD).unwrap();
    let path = dir.path().join("o.yaml");
    std::fs::write(
        &path,
        format!(
            "organism:
  name: tenants-on-workers
  store: memory
  nats: {{url: {url}, stream_prefix: {prefix}, ack_wait_ms: 1000}}
listeners:
  - {{name: relay, description: acme's, kind: native, handler: delay, schema: t.xsd, accepts: [Note], config: {{ms: 0, to: beta-sink}}, tenant: acme, placement: workers}}
  - {{name: relay-own, description: acme's, kind: native, handler: delay, schema: t.xsd, accepts: [Note], config: {{ms: 0, to: acme-sink}}, tenant: acme, placement: workers}}
  - {{name: acme-sink, description: acme's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: acme}}
  - {{name: beta-sink, description: beta's, kind: native, handler: sink, schema: t.xsd, accepts: [Note], tenant: beta}}
",
            url = nats.url(),
            prefix = nats.prefix()
        ),
    )
    .unwrap();
    let o = Organism::builder().load(&path).unwrap();
    let mut w = Running::spawn(
        agentserver()
            .args(["worker"])
            .arg(&path)
            .args(["--listeners", "relay,relay-own", "--name", "w"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_until_async("the worker to announce itself", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;
    let crossing = inject(&o, "relay", &note("for beta"), None);
    settle(&o, &crossing.thread_id).await;
    let log = messages(&o, &crossing.thread_id);
    assert!(
        log.iter()
            .all(|m| to_of(m) != "beta-sink" || m.status == MessageStatus::Undeliverable),
        "{log:?}"
    );
    let refused = log
        .iter()
        .find(|m| m.status == MessageStatus::Undeliverable)
        .unwrap_or_else(|| panic!("{log:?}"));
    assert_eq!(
        refused.error.as_deref(),
        Some("`relay` sent to `beta-sink`: no listener in its scope has that name")
    );
    let own = inject(&o, "relay-own", &note("for acme"), None);
    assert_eq!(settle(&o, &own.thread_id).await, ThreadStatus::Completed);
    assert!(messages(&o, &own.thread_id)
        .iter()
        .any(|m| to_of(m) == "acme-sink" && m.status == MessageStatus::Delivered));
    let _ = w.kill();
}

/// NATS trouble is visible: `/readyz` answers 503 naming the link while NATS is away and
/// 200 once it is back, `agentserver_nats_connected` follows, and a worker says it serves.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_and_a_metric_show_the_link_to_nats() {
    let mut nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    let o = Organism::builder().load(&path).unwrap();
    let server = agentserver::api::ApiServer::bind(
        o.clone(),
        "127.0.0.1:0",
        agentserver::api::ApiOptions::default(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", server.local_addr());
    let (w, w_lines) = worker(&path, "w");
    let ready = |base: String| async move {
        let r = http_get(format!("{base}/readyz")).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let gauge = |base: String| async move {
        http_get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .lines()
            .find(|l| l.starts_with("agentserver_nats_connected "))
            .map(str::to_string)
    };
    wait_until_async("ready with the worker", || async {
        ready(base.clone()).await.0 == 200
    })
    .await;
    assert_eq!(
        gauge(base.clone()).await.as_deref(),
        Some("agentserver_nats_connected 1")
    );
    nats.down();
    wait_until_async("not ready without NATS", || async {
        let (status, body) = ready(base.clone()).await;
        status == 503 && body.contains("the link to nats://") && body.contains("is down")
    })
    .await;
    assert_eq!(
        gauge(base.clone()).await.as_deref(),
        Some("agentserver_nats_connected 0")
    );
    nats.up();
    wait_until_async("ready again", || async {
        ready(base.clone()).await.0 == 200
    })
    .await;
    let first = w_lines
        .recv_timeout(WAIT)
        .expect("the worker says it serves");
    assert!(
        first.starts_with("agentserver worker w: serving relay through NATS at nats://"),
        "{first}"
    );
    stop_worker(w, w_lines);
    server.shutdown().await;
}

/// An approval gate holds for a listener placed on workers too: nothing reaches the work
/// stream until a person approves, and the worker's Lua handler sees who did.
#[tokio::test(flavor = "multi_thread")]
async fn a_gate_holds_a_placed_listeners_message_until_approved() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let path = organism_file(dir.path(), &nats, 0, "");
    relay_in_lua(
        &path,
        "function handle(p, m)\n  return { to = 'collector', xml = '<Note>approved by ' .. m.approval.by .. '</Note>' }\nend\n",
        " approval: {},",
    );
    let o = Organism::builder().load(&path).unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let (w, w_lines) = worker(&path, "w");
    wait_until_async("the worker", || async {
        o.metrics().unserved_listeners().is_empty()
    })
    .await;
    let r = inject(&o, "relay", &note("pay"), None);
    wait_until_async("the input", || async { o.inputs().open_count() == 1 }).await;
    assert_eq!(
        o.threads().status(&r.thread_id),
        Some(ThreadStatus::Waiting)
    );
    assert_eq!(
        queued(&js, &nats.prefix()).await,
        0,
        "nothing went to the workers"
    );
    let filter = agentserver::threads::InputFilter::default();
    let input = o
        .inputs()
        .list(&filter, agentserver::threads::Page::new(None, None))
        .unwrap()
        .items
        .remove(0);
    let boss = agentserver::pump::Decider {
        name: Some("key:boss".into()),
        role: agentserver::config::Role::Operator,
        tenant: None,
    };
    o.inputs()
        .decide(
            &input.id,
            &boss,
            agentserver::pump::Verdict::Approve {
                reason: None,
                payload_xml: None,
            },
        )
        .unwrap();
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
    assert_eq!(
        collected(&o, &[r.thread_id.to_string()]),
        vec![(r.thread_id.to_string(), note("approved by key:boss"))]
    );
    stop_worker(w, w_lines);
}
