//! Reads: pages, filters and exact totals.

use super::*;

#[test]
fn writes_are_batched_and_read_back_with_filters_and_exact_totals() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("sub/dir/s.db")).unwrap();
    thread(&store, "a", ThreadStatus::Active, 1);
    thread(&store, "b", ThreadStatus::Active, 2);
    for (i, (t, from, to)) in [("a", "api", "g"), ("a", "g", "s"), ("b", "api", "s")]
        .iter()
        .enumerate()
    {
        store.record(
            10 + i as u64,
            &EventKind::Message {
                message: msg(t, i as u64 % 2, from, to, 100 + i as u64),
            },
        );
    }
    store.record(
        20,
        &EventKind::MessageStatus {
            id: "a-0".into(),
            thread_id: "a".into(),
            status: MessageStatus::Delivered,
            error: None,
            about: None,
        },
    );
    store.flush(20);
    let all = store
        .query_messages(&MessageFilter::default(), Page::default())
        .unwrap();
    assert_eq!(all.total, 3);
    assert_eq!(all.items[0].status, MessageStatus::Delivered);
    let s = MessageFilter {
        agent: Some("s".into()),
        ..Default::default()
    };
    assert_eq!(store.query_messages(&s, Page::default()).unwrap().total, 2);
    let typed = MessageFilter {
        payload_type: Some("Note".into()),
        ..Default::default()
    };
    assert_eq!(
        store
            .query_messages(&typed, Page::new(Some(1), Some(1)))
            .unwrap()
            .items
            .len(),
        1
    );
    let window = MessageFilter {
        since: Some(Timestamp(101)),
        until: Some(Timestamp(102)),
        ..Default::default()
    };
    assert_eq!(
        store
            .query_messages(&window, Page::default())
            .unwrap()
            .total,
        1
    );
    let by_agent = ThreadFilter {
        agent: Some("g".into()),
        ..Default::default()
    };
    let threads = store.query_threads(&by_agent, Page::default()).unwrap();
    assert_eq!(threads.total, 1);
    assert_eq!(threads.items[0].participants, vec!["api", "g", "s"]);
    assert!(store.committed_batches() >= 1);
}

#[test]
fn filtered_pages_and_totals_across_many_blocks_match_a_row_by_row_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let agents = ["api", "a", "b", "c", "d"];
    let types = [
        Some("{urn:x}Note"),
        Some("{urn:y}Note"),
        Some("Plain"),
        None,
    ];
    let mut i = 0u64;
    for t in 0..120u64 {
        let id = format!("t{t:03}");
        thread(&store, &id, ThreadStatus::Completed, t);
        for slot in 0..12u64 {
            let from = agents[((t + slot) % 5) as usize];
            let to = match i % 11 {
                0 => None,
                1 => Some(from),
                _ => Some(agents[((t + slot + 1) % 5) as usize]),
            };
            // Times not quite in write order, as under concurrent writers.
            let m = msg(&id, slot, from, "x", 1000 + i - (i % 7) * 3).with_core(|c| {
                c.to = to.map(Arc::from);
                c.payload_type = types[(i % 4) as usize].map(Arc::from);
            });
            let m = if i % 37 == 5 {
                with_status(m, MessageStatus::Failed)
            } else {
                m
            };
            store.record(i, &EventKind::Message { message: m });
            i += 1;
        }
        // Batches end at many places within blocks.
        if t % 17 == 3 {
            store.flush(i);
        }
    }
    store.flush(i);
    let filters = many_filters();
    let pages = [
        Page::new(Some(50), Some(0)),
        Page::new(Some(7), Some(255)),
        Page::new(Some(50), Some(250)),
        Page::new(Some(100), Some(700)),
        Page::new(Some(50), Some(10_000)),
    ];
    assert_counts_match_rows(&store, &filters, &pages);
    // Status changes a batch later, in blocks written long before.
    for t in (0..120u64).step_by(3) {
        for slot in 0..12u64 {
            store.record(
                i,
                &EventKind::MessageStatus {
                    id: format!("t{t:03}-{slot}").into(),
                    thread_id: format!("t{t:03}").into(),
                    status: MessageStatus::Delivered,
                    error: None,
                    about: None,
                },
            );
        }
    }
    store.flush(i);
    assert_counts_match_rows(&store, &filters, &pages);
    // Pruning the oldest threads empties whole blocks and cuts others.
    assert_eq!(store.prune(Some(700), None).unwrap(), 1440 - 696);
    assert_counts_match_rows(&store, &filters, &pages);
    assert_eq!(store.prune(Some(0), None).unwrap(), 696);
    assert_counts_match_rows(&store, &filters, &pages);
}

/// Filters of every kind the block walk answers: agents, types (qualified or not), statuses,
/// time windows cutting blocks, empty windows, and a thread.
fn many_filters() -> Vec<MessageFilter> {
    let window = |since: Option<u64>, until: Option<u64>, f: MessageFilter| MessageFilter {
        since: since.map(Timestamp),
        until: until.map(Timestamp),
        ..f
    };
    let agent = |a: &str| MessageFilter {
        agent: Some(a.into()),
        ..Default::default()
    };
    vec![
        MessageFilter::default(),
        agent("a"),
        agent("api"),
        MessageFilter {
            payload_type: Some("Note".into()),
            ..Default::default()
        },
        MessageFilter {
            payload_type: Some("{urn:y}Note".into()),
            agent: Some("c".into()),
            ..Default::default()
        },
        MessageFilter {
            status: Some(MessageStatus::Failed),
            ..Default::default()
        },
        MessageFilter {
            status: Some(MessageStatus::Delivered),
            ..Default::default()
        },
        window(Some(1300), None, MessageFilter::default()),
        window(None, Some(1700), MessageFilter::default()),
        window(Some(1290), Some(2001), agent("b")),
        window(
            Some(1100),
            Some(2300),
            MessageFilter {
                payload_type: Some("Plain".into()),
                status: Some(MessageStatus::Pending),
                ..Default::default()
            },
        ),
        window(Some(5000), None, MessageFilter::default()),
        window(None, Some(0), MessageFilter::default()),
        window(
            Some(1500),
            None,
            MessageFilter {
                thread: Some("t050".into()),
                ..Default::default()
            },
        ),
    ]
}

#[test]
fn a_read_past_its_budget_is_stopped_and_says_which_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let mut seq = 0;
    for t in 0..20u64 {
        let id = format!("t{t:02}");
        thread(&store, &id, ThreadStatus::Completed, t);
        for slot in 0..100u64 {
            let m = msg(&id, slot, "a", "b", 1000 + seq);
            store.record(seq, &EventKind::Message { message: m });
            seq += 1;
        }
    }
    store.flush(seq);
    // A tenant's view: a set of agents, read row by row.
    let tenant = MessageFilter {
        within: Some(vec!["b".to_string()]),
        ..Default::default()
    };
    assert_eq!(
        store
            .query_messages(&tenant, Page::default())
            .unwrap()
            .total,
        2000
    );
    store.set_read_budget(std::time::Duration::ZERO);
    let e = store.query_messages(&tenant, Page::default()).unwrap_err();
    assert!(e.timed_out, "{e}");
    assert!(e.message.contains("limits.max_query_ms (0 ms)"), "{e}");
    // The connection is usable again once the budget allows.
    store.set_read_budget(std::time::Duration::from_secs(5));
    assert_eq!(
        store
            .query_messages(&tenant, Page::default())
            .unwrap()
            .total,
        2000
    );
}

/// A read that takes long (up to `limits.max_query_ms`) holds one connection: the others
/// read on, and a read that finds every connection taken waits for the first given back.
#[test]
fn a_long_read_holds_one_connection_and_the_others_read_on() {
    use crate::store::readers::READERS;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    finished_thread(&store, "t", 1, 2);
    store.flush(1);
    let total = |store: &Store| {
        store
            .query_messages(&MessageFilter::default(), Page::default())
            .unwrap()
            .total
    };
    let mut held: Vec<_> = (1..READERS).map(|_| store.readers.take()).collect();
    assert_eq!(total(&store), 2, "one connection left reads");
    held.push(store.readers.take());
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| tx.send(total(&store)).unwrap());
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "every connection taken: the read waits"
        );
        held.pop();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    });
}
