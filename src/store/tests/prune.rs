//! Pruning and retention.

use super::*;

#[test]
fn kept_counts_stay_exact_through_status_changes_and_pruning() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    for (i, t) in ["x", "y", "z"].iter().enumerate() {
        thread(&store, t, ThreadStatus::Completed, i as u64);
        store.record(
            1,
            &EventKind::Message {
                message: msg(t, 0, "api", "g", 1),
            },
        );
        // A message to itself counts once for its agent.
        store.record(
            1,
            &EventKind::Message {
                message: msg(t, 1, "g", "g", 2),
            },
        );
    }
    store.flush(1);
    assert_eq!(
        store
            .query_messages(
                &MessageFilter {
                    agent: Some("g".into()),
                    ..Default::default()
                },
                Page::default()
            )
            .unwrap()
            .total,
        6
    );
    assert_kept_counts_match_scans(&store);
    // Status changes in a later batch than the insert.
    for (t, status) in [
        ("x", MessageStatus::Delivered),
        ("y", MessageStatus::Failed),
    ] {
        for slot in 0..2 {
            store.record(
                2,
                &EventKind::MessageStatus {
                    id: format!("{t}-{slot}").into(),
                    thread_id: t.into(),
                    status,
                    error: None,
                    about: None,
                },
            );
        }
    }
    store.flush(2);
    assert_kept_counts_match_scans(&store);
    assert_eq!(store.prune(Some(4), None).unwrap(), 2);
    assert_kept_counts_match_scans(&store);
}

#[test]
fn pruning_passes_end_while_writes_keep_coming_and_never_fail_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let (pass_tx, passes) = mpsc::channel();
    let pruner = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let n = store.prune(Some(500), None).unwrap();
                let _ = pass_tx.send(n);
            }
        })
    };
    // Write without pause until three passes that pruned have ended (each pass's target
    // is fixed when it starts, so it ends even though arrivals never stop; a pass with
    // nothing over the limit ends at once).
    let (mut i, mut ended) = (0u64, 0);
    while ended < 3 {
        finished_thread(&store, &format!("t{i:06}"), i, 3);
        if i % 100 == 0 {
            store.flush(1);
            assert_eq!(store.failure(), None, "a write failed beside pruning");
        }
        if i > 300_000 {
            panic!("no pruning pass ended within 300,000 threads of writes");
        }
        ended += passes.try_iter().filter(|n| *n > 0).count();
        i += 1;
    }
    store.flush(1);
    done.store(true, Ordering::Relaxed);
    pruner.join().unwrap();
    assert_eq!(store.failure(), None, "a write failed beside pruning");
    // One last pass with nothing arriving brings the log down to the limit.
    store.prune(Some(500), None).unwrap();
    let kept = store
        .query_messages(&MessageFilter::default(), Page::default())
        .unwrap()
        .total;
    assert!(kept <= 500, "{kept} messages kept, limit 500");
    assert!(store.pruned() > 0);
    assert_kept_counts_match_scans(&store);
}

#[test]
fn an_age_prune_of_more_than_one_chunk_of_one_message_threads_deletes_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let threads = PRUNE_CHUNK + 50;
    for i in 0..threads {
        finished_thread(&store, &format!("t{i:05}"), i, 1);
    }
    store.flush(1);
    // A pass that deletes nothing: the next chunk is then PRUNE_CHUNK exactly (nothing
    // has arrived since).
    assert_eq!(store.prune(None, None).unwrap(), 0);
    store
        .readers
        .take()
        .conn()
        .unwrap()
        .execute("UPDATE threads SET last_activity = 1", [])
        .unwrap();
    // Every thread is ancient by the clock: the first chunk is exactly full, and the
    // pass must go on to the rest.
    assert_eq!(
        store.prune(None, Some(Duration::from_secs(1))).unwrap(),
        threads
    );
    assert_eq!(store.pruned(), threads);
    assert_kept_counts_match_scans(&store);
}

#[test]
fn a_prune_larger_than_one_chunk_deletes_exactly_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let threads = PRUNE_CHUNK * 2 + 10;
    for i in 0..threads {
        finished_thread(&store, &format!("t{i:04}"), i, 2);
    }
    store.flush(1);
    // Keep the newest 20 threads' messages: everything older goes, in three chunks.
    let deleted = store.prune(Some(40), None).unwrap();
    assert_eq!(deleted, (threads - 20) * 2);
    let left = store
        .query_threads(&ThreadFilter::default(), Page::default())
        .unwrap();
    assert_eq!(left.total, 20);
    assert_kept_counts_match_scans(&store);
    // The writer was never locked out: a write after the prune commits at once.
    thread(&store, "after", ThreadStatus::Completed, 1);
    store.flush(1);
    assert!(store.failure().is_none());
    assert!(store.thread("after").unwrap().is_some());
}

#[test]
fn retention_prunes_whole_threads_oldest_first_and_never_active_or_waiting_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    for (i, t) in ["old", "mid", "new"].iter().enumerate() {
        thread(&store, t, ThreadStatus::Completed, i as u64);
        for slot in 0..2 {
            store.record(
                1,
                &EventKind::Message {
                    message: msg(t, slot, "api", "g", 10 * i as u64 + slot),
                },
            );
        }
    }
    // Neither a running thread nor one waiting for a person's decision is finished.
    thread(&store, "running", ThreadStatus::Active, 0);
    thread(&store, "waiting", ThreadStatus::Waiting, 0);
    for t in ["running", "waiting"] {
        store.record(
            1,
            &EventKind::Message {
                message: msg(t, 0, "api", "g", 1),
            },
        );
    }
    store.flush(1);
    // Make activity order explicit: old < mid < new; running and waiting are oldest but
    // not finished.
    active_in_order(&store, &["waiting", "running", "old", "mid", "new"]);
    // An LLM call in the thread pruned and in one kept.
    for t in ["old", "new"] {
        store.record(
            2,
            &EventKind::Usage(Box::new(crate::events::Usage {
                tenant: None,
                listener: "g".into(),
                thread_id: t.into(),
                message_id: format!("{t}-0").into(),
                model: "m".into(),
                input_tokens: 10,
                output_tokens: 5,
                cached_tokens: 0,
                cost_micros: 0,
                estimated: false,
                ms: 1,
            })),
        );
    }
    store.flush(2);
    assert_eq!(store.prune(Some(4), None).unwrap(), 4);
    // The pruned thread's calls went with it (the usage table is as bounded as the log);
    // the kept thread's still count.
    assert_eq!(store.thread_usage("g", "old").unwrap(), 0);
    assert_eq!(store.thread_usage("g", "new").unwrap(), 15);
    let day: i64 = store
        .readers
        .take()
        .conn()
        .unwrap()
        .query_row(
            "SELECT SUM(input_tokens + output_tokens) FROM usage_daily",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(day, 30, "the day's sums stay");
    let left: Vec<String> = store
        .query_threads(&ThreadFilter::default(), Page::default())
        .unwrap()
        .items
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(left, vec!["new", "waiting", "running"]);
    assert_eq!(
        store.prune(None, Some(Duration::from_secs(1))).unwrap(),
        2,
        "new is old by the clock; running and waiting stay"
    );
}

/// A replay gives exactly the messages published in its range, and refuses a range that
/// pruning cut into or that holds more than its bounds.
#[test]
fn a_replay_is_whole_or_refused() {
    use crate::store::Replay;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    // Threads t0..t9, two messages each, published at event seqs 10t+1 and 10t+2; each
    // thread in batches of its own.
    for t in 0..10u64 {
        let id = format!("t{t}");
        thread(&store, &id, ThreadStatus::Completed, t);
        for slot in 0..2 {
            store.record(
                10 * t + 1 + slot,
                &EventKind::Message {
                    message: msg(&id, slot, "api", "g", t),
                },
            );
        }
        store.flush(10 * t + 5);
    }
    let ids = |r: Replay| match r {
        Replay::Whole(rows) => rows
            .into_iter()
            .map(|(seq, m)| format!("{seq}:{}", m.id))
            .collect::<Vec<_>>(),
        Replay::Unavailable(why) => vec![why.to_string()],
    };
    assert_eq!(
        ids(store.replay(22, 41, 100, 1 << 20).unwrap()),
        ["31:t3-0", "32:t3-1", "41:t4-0"]
    );
    assert_eq!(
        ids(store.replay(22, 41, 2, 1 << 20).unwrap()),
        ["more messages than a replay holds"]
    );
    assert_eq!(
        ids(store.replay(0, 100, 100, 10).unwrap()),
        ["more messages than a replay holds"]
    );
    // Pruning the two oldest threads: a range from before their newest event is refused.
    assert_eq!(store.prune(Some(16), None).unwrap(), 4);
    assert_eq!(
        ids(store.replay(5, 41, 100, 1 << 20).unwrap()),
        ["messages of the gap were pruned"]
    );
    assert_eq!(
        ids(store.replay(12, 22, 100, 1 << 20).unwrap()),
        ["21:t2-0", "22:t2-1"]
    );
    // A message from before event numbers were kept: a replay over it is refused, one
    // that starts past it is not.
    rusqlite::Connection::open(dir.path().join("s.db"))
        .unwrap()
        .execute("UPDATE messages SET event_seq = NULL WHERE id = 't6-0'", [])
        .unwrap();
    assert_eq!(
        ids(store.replay(55, 80, 100, 1 << 20).unwrap()),
        ["messages written before event numbers were kept"]
    );
    assert_eq!(
        ids(store.replay(65, 71, 100, 1 << 20).unwrap()),
        ["71:t7-0"]
    );
}

#[test]
fn shares_take_from_whoever_holds_the_most_down_to_a_common_level() {
    use super::super::prune::{shares, Holder};
    let t = |n: &str| Holder::Tenant(n.into());
    let of = |h: &[(Holder, u64)]| shares(h.to_vec(), 30);
    // The largest alone gives while it is above the others.
    assert_eq!(
        of(&[(Holder::Organism, 4), (t("acme"), 40), (t("beta"), 6)]),
        [(t("acme"), 30)]
    );
    // Down to a common level, then alike; what is left comes from the largest first.
    assert_eq!(
        of(&[(t("a"), 20), (t("b"), 20), (t("c"), 5)]),
        [(t("a"), 15), (t("b"), 15)]
    );
    assert_eq!(
        shares(vec![(t("a"), 20), (t("b"), 19), (t("c"), 5)], 6),
        [(t("a"), 4), (t("b"), 2)]
    );
    assert_eq!(
        shares(vec![(t("a"), 10), (t("b"), 10), (t("c"), 10)], 4),
        [(t("a"), 2), (t("b"), 1), (t("c"), 1)]
    );
    // More than everything: everything.
    assert_eq!(
        shares(vec![(t("a"), 3), (Holder::Organism, 2)], 9),
        [(t("a"), 3), (Holder::Organism, 2)]
    );
    assert_eq!(shares(Vec::new(), 5), []);
}

/// One tenant sending as much as it likes, with the organism's retention on: its own oldest
/// threads go, never the older threads of the other tenant or of the organism, while it
/// holds more than they do; a thread keeps the tenant it was created for.
#[test]
fn retention_prunes_the_largest_holders_history_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let owned = |id: &str, owner: Option<&str>, created: u64| {
        owned_thread(&store, id, ThreadStatus::Active, created, owner);
        for slot in 0..2 {
            store.record(
                1,
                &EventKind::Message {
                    message: msg(id, slot, "api", "g", created),
                },
            );
        }
        store.record(
            1,
            &EventKind::ThreadUpdated {
                thread_id: id.into(),
                status: ThreadStatus::Completed,
                message_count: 2,
                error: None,
                paused: false,
                labels: None,
            },
        );
    };
    // Oldest first: the organism's 2 threads, beta's 3, then acme's 20.
    for i in 0..2 {
        owned(&format!("o{i}"), None, i);
    }
    for i in 0..3 {
        owned(&format!("beta-{i}"), Some("beta"), 10 + i);
    }
    for i in 0..20 {
        owned(&format!("acme-{i:02}"), Some("acme"), 100 + i);
    }
    store.flush(1);
    active_in_order(&store, &["o0", "o1", "beta-0", "beta-1", "beta-2"]);
    let owner = |id: &str| store.thread(id).unwrap().unwrap().owner;
    assert_eq!(
        owner("acme-00").as_deref(),
        Some("acme"),
        "kept past an update"
    );
    assert_eq!(owner("o0"), None);
    // 50 messages, 20 kept: acme's 40 come down to 10.
    assert_eq!(store.prune(Some(20), None).unwrap(), 30);
    let left = |prefix: &str| {
        store
            .query_threads(&ThreadFilter::default(), Page::default())
            .unwrap()
            .items
            .into_iter()
            .filter(|t| t.id.starts_with(prefix))
            .count()
    };
    assert_eq!((left("o"), left("beta"), left("acme")), (2, 3, 5));
    assert!(
        store.thread("acme-14").unwrap().is_none(),
        "acme's oldest went"
    );
    assert!(store.thread("acme-15").unwrap().is_some());
    // Past the others' level, all give alike (whole threads: 8, 3 and 1 asked, 8, 4 and 2
    // given).
    assert_eq!(store.prune(Some(8), None).unwrap(), 14);
    assert_eq!((left("o"), left("beta"), left("acme")), (1, 1, 1));
    assert_kept_counts_match_scans(&store);
}

/// Sets the threads' last activity in the order given (the first the oldest, at 0, 1, …).
fn active_in_order(store: &Store, threads: &[&str]) {
    let mut lease = store.readers.take();
    let conn = lease.conn().unwrap();
    for (i, t) in threads.iter().enumerate() {
        conn.execute(
            "UPDATE threads SET last_activity = ? WHERE id = ?",
            params![i as i64, t],
        )
        .unwrap();
    }
}
