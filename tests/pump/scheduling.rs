//! Ordering, fairness and control (SPEC §6, §7) against the real pump.

use crate::common::*;
use agentserver::events::{AgentState, OrganismStatus};
use agentserver::listener::{Delivery, FnHandler, Output};
use agentserver::pump::{FailureKind, InjectError};
use agentserver::threads::{MessageStatus, ThreadError, ThreadStatus};
use agentserver::{InjectRequest, Organism};

fn n_of(xml: &str) -> i64 {
    let start = xml.find("<n>").unwrap() + 3;
    let end = xml.find("</n>").unwrap();
    xml[start..end].parse().unwrap()
}

fn agent_state(o: &Organism, name: &str) -> (AgentState, usize) {
    let a = o.agents().into_iter().find(|a| a.name == name).unwrap();
    (a.state, a.queue_depth)
}

/// An organism with one listener `a` whose handler waits on `valve`.
fn held_organism(valve: &Valve) -> (Organism, tempfile::TempDir) {
    organism(
        Organism::builder().handler("valve", valve.clone()),
        "  - { name: a, description: held, kind: native, handler: valve, schema: t.xsd }",
    )
}

#[tokio::test]
async fn order_is_kept_per_listener_and_thread() {
    // Several threads interleaved on a listener with concurrency 4: each thread's messages
    // are still handled one at a time, in arrival order.
    let log = Log::default();
    let (o, _d) = organism(
        Organism::builder().handler("log", log.handler()),
        r#"
  - { name: a, description: logs, kind: native, handler: log, schema: t.xsd, concurrency: 4 }
"#,
    );
    let threads = ["t1", "t2", "t3"];
    for n in 0..60 {
        inject(&o, "a", &ping(n), Some(threads[(n % 3) as usize]));
    }
    for t in threads {
        settle(&o, t).await;
    }
    for t in threads {
        let seen: Vec<i64> = log
            .entries()
            .iter()
            .filter(|e| e.1 == t)
            .map(|e| n_of(&e.2))
            .collect();
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "thread {t} out of order");
        assert_eq!(seen.len(), 20);
    }
}

#[tokio::test]
async fn a_busy_thread_does_not_starve_another() {
    let valve = Valve::closed();
    let (o, _d) = held_organism(&valve);
    inject(&o, "a", &ping(0), Some("busy"));
    until(&o, || agent_state(&o, "a").0 == AgentState::Processing).await;
    for n in 1..20 {
        inject(&o, "a", &ping(n), Some("busy"));
    }
    inject(&o, "a", &ping(100), Some("other"));
    valve.open(100);
    settle(&o, "busy").await;
    settle(&o, "other").await;
    let order: Vec<String> = valve.log.entries().into_iter().map(|e| e.1).collect();
    // Round robin: the other thread is served right after the message that was running.
    assert_eq!(
        order.iter().position(|t| t == "other"),
        Some(1),
        "{order:?}"
    );
}

#[tokio::test]
async fn an_agent_working_through_its_queue_stays_processing() {
    // Four threads' messages wait while the first is handled; the calls are let through one
    // at a time. The agent goes from one call to the next with no idle moment told between
    // them, and is idle once, at the end.
    use agentserver::events::EventKind;
    let valve = Valve::closed();
    let (o, _d) = held_organism(&valve);
    inject(&o, "a", &ping(0), Some("q0"));
    until(&o, || agent_state(&o, "a").0 == AgentState::Processing).await;
    for n in 1..5 {
        inject(&o, "a", &ping(n), Some(&format!("q{n}")));
    }
    let mut events = o.events().subscribe();
    let mut states = Vec::new();
    // Reads events, keeping `a`'s states, until `last` says stop.
    let mut read_until = async |last: &dyn Fn(&EventKind) -> bool| {
        tokio::time::timeout(WAIT, async {
            loop {
                let ev = events.recv().await.expect("events");
                if let EventKind::AgentState { agent, state, .. } = &ev.kind {
                    if &**agent == "a" {
                        states.push(*state);
                    }
                }
                if last(&ev.kind) {
                    return;
                }
            }
        })
        .await
        .expect("in time");
    };
    for n in 0..5 {
        valve.open(1);
        let thread = format!("q{n}");
        read_until(&|k| {
            matches!(k, EventKind::ThreadUpdated { thread_id, status: ThreadStatus::Completed, .. }
                if **thread_id == *thread)
        })
        .await;
    }
    read_until(&|k| matches!(k, EventKind::AgentState { agent, .. } if &**agent == "a")).await;
    assert_eq!(states, [AgentState::Idle]);
}

#[tokio::test]
async fn a_tenant_with_many_threads_does_not_starve_another_tenant() {
    // One handler at a time, organism-wide: acme's agent has eleven threads waiting for it
    // when beta's one message arrives. Threads alone would take turns (beta's last);
    // tenants take turns first.
    let valve = Valve::closed();
    let (o, _d) = organism_with(
        Organism::builder().handler("valve", valve.clone()),
        "  max_concurrent_handlers: 1",
        "breadth-first",
        "  - { name: a, description: acme's, kind: native, handler: valve, schema: t.xsd, tenant: acme, concurrency: 16 }
  - { name: b, description: beta's, kind: native, handler: valve, schema: t.xsd, tenant: beta }",
    );
    inject(&o, "a", &ping(0), Some("acme-0"));
    until(&o, || agent_state(&o, "a").0 == AgentState::Processing).await;
    for n in 1..12 {
        inject(&o, "a", &ping(n), Some(&format!("acme-{n}")));
    }
    inject(&o, "b", &ping(100), Some("beta"));
    // Every job taken from its queue is waiting for the one permit.
    until(&o, || {
        agent_state(&o, "a").1 == 0 && agent_state(&o, "b").1 == 0
    })
    .await;
    valve.open(100);
    for n in 0..12 {
        settle(&o, &format!("acme-{n}")).await;
    }
    settle(&o, "beta").await;
    let order: Vec<String> = valve.log.entries().into_iter().map(|e| e.1).collect();
    // The first call took its permit without waiting; of those that waited, acme (earliest)
    // was served first, then beta.
    assert_eq!(order.iter().position(|t| t == "beta"), Some(2), "{order:?}");
}

/// A job taken from its queue and waiting for the one organism-wide handler slot when its
/// thread is killed never reaches its handler: it is recorded as killed once it gets the
/// slot.
#[tokio::test]
async fn a_job_waiting_for_a_slot_when_its_thread_is_killed_does_not_run() {
    let valve = Valve::closed();
    let log = Log::default();
    let (o, _d) = organism_with(
        Organism::builder()
            .handler("valve", valve.clone())
            .handler("log", log.handler()),
        "  max_concurrent_handlers: 1",
        "breadth-first",
        r#"
  - { name: hold, description: holds the slot, kind: native, handler: valve, schema: t.xsd, accepts: [Ping] }
  - { name: x, description: logs, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
"#,
    );
    inject(&o, "hold", &ping(0), Some("busy"));
    until(&o, || agent_state(&o, "hold").0 == AgentState::Processing).await;
    inject(&o, "x", "<Note>late</Note>", Some("doomed"));
    // Taken from x's queue: waiting for the slot.
    until(&o, || agent_state(&o, "x") == (AgentState::Processing, 0)).await;
    o.control().kill_thread("doomed").unwrap();
    valve.open(1);
    settle(&o, "busy").await;
    until(&o, || {
        messages(&o, "doomed")
            .iter()
            .all(|m| m.status == MessageStatus::Killed)
    })
    .await;
    assert!(log.entries().is_empty(), "{:?}", log.entries());
    assert_eq!(o.threads().status("doomed"), Some(ThreadStatus::Killed));
}

#[tokio::test]
async fn kill_drops_queued_work_and_cancels_the_running_handler() {
    let valve = Valve::closed();
    let (o, _d) = held_organism(&valve);
    for n in 0..5 {
        inject(&o, "a", &ping(n), Some("doomed"));
    }
    until(&o, || agent_state(&o, "a") == (AgentState::Processing, 4)).await;
    o.control().kill_thread("doomed").unwrap();
    until(&o, || {
        messages(&o, "doomed")
            .iter()
            .all(|m| m.status != MessageStatus::Pending)
    })
    .await;
    let ms = messages(&o, "doomed");
    assert_eq!(with_status(&ms, MessageStatus::Killed).len(), 5);
    assert_eq!(o.threads().status("doomed"), Some(ThreadStatus::Killed));
    assert!(valve.log.entries().is_empty());
    assert_eq!(agent_state(&o, "a").1, 0);
    let again = o.inject(InjectRequest {
        from: "api".into(),
        to: "a".into(),
        payload_xml: ping(9),
        thread_id: Some("doomed".into()),
    });
    assert!(matches!(
        again,
        Err(InjectError::Thread(ThreadError::Killed(_)))
    ));
    assert!(o.control().kill_thread("no-such-thread").is_err());
    // The listener still works for other threads.
    valve.open(1);
    let r = inject(&o, "a", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Completed);
}

#[tokio::test]
async fn pause_holds_messages_and_resume_delivers_them_in_order() {
    let log = Log::default();
    let (o, _d) = organism(
        Organism::builder().handler("log", log.handler()),
        r#"
  - { name: a, description: logs, kind: native, handler: log, schema: t.xsd }
"#,
    );
    o.control().pause_listener("a").unwrap();
    assert_eq!(agent_state(&o, "a").0, AgentState::Paused);
    for n in 0..5 {
        inject(&o, "a", &ping(n), Some("p"));
    }
    assert_eq!(agent_state(&o, "a"), (AgentState::Paused, 5));
    assert!(log.entries().is_empty());
    o.control().resume_listener("a").unwrap();
    assert_eq!(settle(&o, "p").await, ThreadStatus::Completed);
    let seen: Vec<i64> = log.entries().iter().map(|e| n_of(&e.2)).collect();
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);

    // The whole organism.
    o.control().pause();
    assert_eq!(o.status(), OrganismStatus::Paused);
    inject(&o, "a", &ping(5), Some("q"));
    assert_eq!(agent_state(&o, "a"), (AgentState::Paused, 1));
    o.control().resume();
    assert_eq!(settle(&o, "q").await, ThreadStatus::Completed);
    assert!(o.control().pause_listener("nobody").is_err());
}

#[tokio::test]
async fn exceeding_the_thread_budget_fails_the_thread() {
    // A listener that forwards to itself forever is stopped by the budget.
    let (o, _d) = organism_with(
        Organism::builder(),
        "  max_messages_per_thread: 20",
        "breadth-first",
        r#"
  - { name: loop, description: forwards to itself, kind: native, handler: forward, schema: t.xsd, config: { to: loop } }
"#,
    );
    let r = inject(&o, "loop", &ping(1), None);
    assert_eq!(settle(&o, &r.thread_id).await, ThreadStatus::Error);
    let info = o.threads().info(&r.thread_id).unwrap();
    assert!(info.error.unwrap().contains("exceeded its budget of 20"));
    let ms = messages(&o, &r.thread_id);
    assert_eq!(with_status(&ms, MessageStatus::Failed).len(), 1);
    assert_eq!(o.metrics().failure_count(FailureKind::Budget), 1);
}

#[tokio::test]
async fn a_panicking_handler_does_not_stop_others() {
    let (o, _d) = organism(
        Organism::builder().handler(
            "fragile",
            FnHandler(|d: Delivery| async move {
                if d.payload.xml().contains("<n>1</n>") {
                    panic!("boom on one");
                }
                Ok(vec![Output::to(d.meta.from.to_string(), d.payload.xml())])
            }),
        ),
        r#"
  - { name: a, description: panics on 1, kind: native, handler: fragile, schema: t.xsd, concurrency: 2 }
"#,
    );
    let bad = inject(&o, "a", &ping(1), None);
    let good = inject(&o, "a", &ping(2), None);
    assert_eq!(settle(&o, &bad.thread_id).await, ThreadStatus::Error);
    assert_eq!(settle(&o, &good.thread_id).await, ThreadStatus::Completed);
    let failed = &messages(&o, &bad.thread_id)[0];
    assert!(failed
        .error
        .as_deref()
        .unwrap()
        .contains("panicked: boom on one"));
    assert_eq!(o.metrics().failure_count(FailureKind::HandlerPanic), 1);
    let later = inject(&o, "a", &ping(3), None);
    assert_eq!(settle(&o, &later.thread_id).await, ThreadStatus::Completed);
}

#[tokio::test]
async fn stop_drains_pending_work_and_refuses_new_injects() {
    let valve = Valve::closed();
    let (o, _d) = held_organism(&valve);
    for n in 0..3 {
        inject(&o, "a", &ping(n), Some("s"));
    }
    let stopper = tokio::spawn({
        let o = o.clone();
        async move { o.stop().await }
    });
    until(&o, || o.status() == OrganismStatus::Stopping).await;
    let refused = o.inject(InjectRequest {
        from: "api".into(),
        to: "a".into(),
        payload_xml: ping(9),
        thread_id: None,
    });
    assert!(matches!(refused, Err(InjectError::Stopping)));
    valve.open(3);
    let report = tokio::time::timeout(WAIT, stopper).await.unwrap().unwrap();
    assert!(report.drained);
    assert_eq!(o.status(), OrganismStatus::Stopped);
    assert_eq!(
        with_status(&messages(&o, "s"), MessageStatus::Delivered).len(),
        3
    );
}

#[tokio::test]
async fn stop_kills_what_outlives_the_grace_period() {
    let valve = Valve::closed();
    let (o, _d) = organism_with(
        Organism::builder().handler("valve", valve.clone()),
        "  stop_grace_ms: 100",
        "breadth-first",
        r#"
  - { name: a, description: held forever, kind: native, handler: valve, schema: t.xsd }
"#,
    );
    inject(&o, "a", &ping(0), Some("stuck"));
    let report = tokio::time::timeout(WAIT, o.stop()).await.unwrap();
    assert!(!report.drained);
    assert_eq!(report.killed_threads, 1);
    assert_eq!(messages(&o, "stuck")[0].status, MessageStatus::Killed);
}

async fn first_served(scheduling: &str) -> String {
    // One organism-wide handler slot, held by `hold`. Two messages of the same thread wait for
    // it: x's is older (slot 1), y's newer (slot 2). The policy picks which runs first.
    let valve = Valve::closed();
    let log = Log::default();
    let builder = Organism::builder()
        .handler("valve", valve.clone())
        .handler("log", log.handler());
    let (o, _d) = organism_with(
        builder,
        "  max_concurrent_handlers: 1",
        scheduling,
        r#"
  - { name: hold, description: holds the slot, kind: native, handler: valve, schema: t.xsd, accepts: [Ping] }
  - { name: x, description: logs, kind: native, handler: log, schema: t.xsd, accepts: [Note] }
  - { name: y, description: logs, kind: native, handler: log, schema: t.xsd, accepts: [Pong] }
"#,
    );
    inject(&o, "hold", &ping(0), Some("t"));
    until(&o, || agent_state(&o, "hold").0 == AgentState::Processing).await;
    inject(&o, "x", "<Note>older</Note>", Some("t"));
    inject(&o, "y", "<Pong><n>1</n></Pong>", Some("t"));
    until(&o, || {
        agent_state(&o, "x").0 == AgentState::Processing
            && agent_state(&o, "y").0 == AgentState::Processing
    })
    .await;
    valve.open(1);
    settle(&o, "t").await;
    log.entries()[0].0.clone()
}

#[tokio::test]
async fn breadth_first_takes_the_oldest_ready_message_and_depth_first_the_newest() {
    assert_eq!(first_served("breadth-first").await, "x");
    assert_eq!(first_served("depth-first").await, "y");
}
