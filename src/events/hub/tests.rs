use super::*;

#[test]
fn events_are_numbered_and_their_frames_rendered_once() {
    let hub = EventHub::new(4);
    let mut rx = hub.subscribe();
    hub.publish(EventKind::ThreadUpdated {
        thread_id: "t".into(),
        status: ThreadStatus::Completed,
        message_count: 3,
        error: None,
        paused: false,
        labels: None,
    });
    let ev = rx.try_recv().unwrap();
    assert_eq!(ev.seq, 1);
    assert_eq!(hub.last_seq(), 1);
    assert_eq!(ev.name(), "thread_updated");
    let first = ev.frame(|e| format!("{}", e.seq)).cloned();
    let again = ev.frame::<String>(|_| unreachable!("rendered once"));
    assert_eq!(
        (first.as_deref(), again.map(String::as_str)),
        (Some("1"), Some("1"))
    );
    assert_eq!(ev.frame::<u8>(|_| unreachable!("rendered once")), None);
    assert_eq!(ev.message_frame(|_| None::<String>), Some(&None));
    let again = ev.message_frame::<Option<String>>(|_| unreachable!("rendered once"));
    assert_eq!(again, Some(&None));
}

fn log(hub: &EventHub, bytes: usize) -> u64 {
    hub.publish(EventKind::Log {
        agent: "a".into(),
        thread_id: None,
        level: "info".into(),
        message: "x".repeat(bytes),
    })
}

#[test]
fn clients_asking_for_one_frame_at_once_all_send_the_same() {
    let hub = EventHub::new(4);
    let mut rx = hub.subscribe();
    hub.publish(EventKind::ThreadLabels {
        thread_id: "t".into(),
        labels: None,
    });
    let ev = rx.try_recv().unwrap();
    // Eight threads ask at once, each with its own renderer: some may render (none waits
    // for another), and every one reads back the same frame, the first kept.
    let start = std::sync::Barrier::new(8);
    let seen: Vec<String> = std::thread::scope(|s| {
        let renders: Vec<_> = (0..8)
            .map(|i| {
                let (ev, start) = (&ev, &start);
                s.spawn(move || {
                    start.wait();
                    ev.message_frame(|_| format!("render {i}")).cloned()
                })
            })
            .collect();
        renders
            .into_iter()
            .map(|r| r.join().unwrap().unwrap())
            .collect()
    });
    assert!(seen.iter().all(|f| f == &seen[0]), "{seen:?}");
    assert_eq!(
        ev.message_frame::<String>(|_| unreachable!("kept")),
        Some(&seen[0])
    );
    assert!(seen[0].starts_with("render "));
}

#[test]
fn a_byte_budget_lets_go_of_the_oldest_events_and_laggards_are_told() {
    let hub = EventHub::new(1024);
    hub.set_byte_budget(10_000);
    let mut behind = hub.subscribe();
    for _ in 0..100 {
        log(&hub, 1_000);
    }
    // Each weighs about 2,256 bytes: four fit under 10,000, with the newest always kept.
    assert!(hub.retained_bytes() <= 10_000, "{}", hub.retained_bytes());
    let oldest = hub.ring.oldest(hub.last_seq());
    assert!(oldest > 90 && oldest <= 100, "{oldest}");
    match behind.try_recv() {
        Err(TryRecvError::Lagged(n)) => assert_eq!(n, oldest - 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(behind.try_recv().unwrap().seq, oldest);
    // Resumption from before the floor needs a resync; small events fill the ring again.
    assert_eq!(hub.subscribe_since(Some(50)).resync_from, Some(oldest));
    for _ in 0..1000 {
        organism_state(&hub);
    }
    assert!(hub.retained_bytes() <= 10_000);
    let seq = hub.last_seq();
    assert_eq!(hub.subscribe_since(Some(seq - 20)).replay.len(), 20);
}

fn organism_state(hub: &EventHub) -> u64 {
    hub.publish(EventKind::OrganismState {
        status: OrganismStatus::Running,
    })
}

#[test]
fn resumption_replays_retained_events_then_continues_live() {
    let hub = EventHub::new(4);
    for _ in 0..3 {
        organism_state(&hub);
    }
    let mut sub = hub.subscribe_since(Some(1));
    assert_eq!(sub.resync_from, None);
    let replayed: Vec<u64> = sub.replay.iter().map(|e| e.seq).collect();
    assert_eq!(replayed, vec![2, 3]);
    organism_state(&hub);
    assert_eq!(sub.live.try_recv().unwrap().seq, 4);

    // Up to date: nothing to replay.
    assert!(hub.subscribe_since(Some(4)).replay.is_empty());
}

#[test]
fn resumption_from_a_point_no_longer_retained_or_in_the_future_needs_a_resync() {
    let hub = EventHub::new(2);
    for _ in 0..5 {
        organism_state(&hub);
    }
    // Retained: 4 and 5. After 3 is still complete; after 2 is not.
    assert_eq!(hub.subscribe_since(Some(3)).resync_from, None);
    assert_eq!(hub.subscribe_since(Some(2)).resync_from, Some(4));
    assert_eq!(hub.subscribe_since(Some(9)).resync_from, Some(4));
    // A fresh hub: since 0 is complete.
    assert_eq!(EventHub::new(2).subscribe_since(Some(0)).resync_from, None);
}
#[test]
fn a_receiver_more_than_the_capacity_behind_is_told_how_many_it_lost() {
    let hub = EventHub::new(4);
    let mut rx = hub.subscribe();
    for _ in 0..10 {
        organism_state(&hub);
    }
    // Held: 7..=10. Lost: 1..=6.
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Lagged(6));
    let rest: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok().map(|e| e.seq)).collect();
    assert_eq!(rest, vec![7, 8, 9, 10]);
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(hub.subscribers(), 1);
    drop(rx);
    assert_eq!(hub.subscribers(), 0);
}

#[test]
fn a_lent_event_is_the_next_one_and_lag_is_reported_the_same() {
    let hub = EventHub::new(4);
    let mut rx = hub.subscribe();
    organism_state(&hub);
    assert_eq!(rx.try_recv_with(|e| e.seq), Ok(1));
    assert_eq!(rx.try_recv_with(|e| e.seq), Err(TryRecvError::Empty));
    for _ in 0..6 {
        organism_state(&hub);
    }
    // Held: 4..=7. Lost: 2 and 3.
    assert_eq!(rx.try_recv_with(|e| e.seq), Err(TryRecvError::Lagged(2)));
    assert_eq!(rx.try_recv_with(|e| e.seq), Ok(4));
    assert_eq!(rx.try_recv().unwrap().seq, 5);
}

#[test]
fn a_hub_that_continues_a_stored_history_starts_after_it() {
    let hub = EventHub::with_sink(4, 100, None);
    let mut rx = hub.subscribe();
    assert_eq!(organism_state(&hub), 101);
    assert_eq!(rx.try_recv().unwrap().seq, 101);
    // Before 101 is the store's history, not the hub's.
    assert_eq!(hub.subscribe_since(Some(99)).resync_from, Some(101));
    assert_eq!(hub.subscribe_since(Some(100)).replay.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_receivers_wake_for_each_event_and_close_with_the_hub() {
    let hub = Arc::new(EventHub::new(64));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let mut rx = hub.subscribe();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    match rx.recv().await {
                        Ok(e) => seen.push(e.seq),
                        Err(RecvError::Closed) => return seen,
                        Err(RecvError::Lagged(n)) => panic!("lost {n}"),
                    }
                }
            })
        })
        .collect();
    for _ in 0..20 {
        organism_state(&hub);
        // Let the readers catch up and wait again, so every event wakes them.
        tokio::task::yield_now().await;
    }
    drop(Arc::into_inner(hub).expect("the only reference"));
    for r in readers {
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), r)
            .await
            .expect("closed in time")
            .unwrap();
        assert_eq!(seen, (1..=20).collect::<Vec<u64>>());
    }
}

#[test]
fn publishers_on_many_threads_reach_every_receiver_in_seq_order_and_the_sink_once_each() {
    const THREADS: u64 = 4;
    const EACH: u64 = 5_000;
    let sunk = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = sunk.clone();
    let hub = Arc::new(EventHub::with_sink(
        1 << 16,
        0,
        Some(Box::new(move |e: &Arc<Event>| {
            s.lock().unwrap().push(e.seq)
        })),
    ));
    let mut readers: Vec<Receiver> = (0..3).map(|_| hub.subscribe()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let read: Vec<_> = readers
        .drain(..)
        .map(|mut rx| {
            runtime.spawn(async move {
                let mut seen = Vec::new();
                while (seen.len() as u64) < THREADS * EACH {
                    seen.push(rx.recv().await.expect("nothing lost").seq);
                }
                seen
            })
        })
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..EACH {
                    organism_state(&hub);
                }
            });
        }
    });
    let all: Vec<u64> = (1..=THREADS * EACH).collect();
    for r in read {
        assert_eq!(runtime.block_on(r).unwrap(), all);
    }
    let mut sunk = sunk.lock().unwrap().clone();
    sunk.sort_unstable();
    assert_eq!(sunk, all);
    assert_eq!(hub.last_seq(), THREADS * EACH);
}

#[test]
fn a_receiver_that_lagged_is_told_how_many_messages_it_lost_while_the_hub_remembers() {
    let hub = EventHub::new(4);
    let mut rx = hub.subscribe();
    // 1..=10: messages at 2, 3, 5 and 9; lost: 1..=6, which hold three of them.
    for seq in 1..=10u64 {
        if [2, 3, 5, 9].contains(&seq) {
            hub.publish(message(&seq.to_string()).0);
        } else {
            organism_state(&hub);
        }
    }
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Lagged(6));
    assert_eq!(rx.messages_among(1, 6), (3, 0));
    // Beyond what the hub remembers (16 rings of 4): unknown.
    for _ in 0..100 {
        organism_state(&hub);
    }
    assert_eq!(rx.messages_among(1, 6), (0, 6));
    assert_eq!(rx.messages_among(100, 110), (0, 0));
}

/// A `message` event's kind (message `id` of thread `t`), and its record.
fn message(id: &str) -> (EventKind, crate::threads::MessageRecord) {
    let record = crate::threads::MessageRecord::new(
        crate::threads::MessageCore {
            id: Arc::from(id),
            thread_id: Arc::from("t"),
            parent_id: None,
            slot_index: 0,
            from: Arc::from("a"),
            to: Some(Arc::from("b")),
            payload_type: Some("Note".into()),
            payload_xml: crate::xml::SharedXml::new("<Note/>".into()),
            origin: crate::threads::Origin::inject(),
            timestamp: crate::time::Timestamp(0),
        },
        crate::threads::MessageStatus::Pending,
        None,
    );
    let kind = EventKind::Message {
        message: record.clone(),
    };
    (kind, record)
}

#[test]
fn a_reader_of_messages_passes_over_the_other_events_unread() {
    let hub = EventHub::new(128);
    let mut rx = hub.subscribe();
    assert_eq!(rx.pass_over_others(), None, "nothing published");
    organism_state(&hub);
    organism_state(&hub);
    let (kind, record) = message("m");
    let m = hub.publish(kind);
    assert_eq!(rx.pass_over_others(), Some(2));
    assert_eq!(rx.try_recv().unwrap().seq, m);
    // A status change is not passed over either.
    let status = hub.publish(EventKind::MessageStatus {
        id: record.id.clone(),
        thread_id: record.thread_id.clone(),
        status: MessageStatus::Delivered,
        error: None,
        about: Some(StatusAbout::of(&record)),
    });
    assert_eq!(rx.pass_over_others(), None);
    assert_eq!(rx.try_recv().unwrap().seq, status);
    // At most `PASS_OVER_MAX` at a call; a lag among them goes untold (the ring of 128 has
    // come round, the hub remembers their kinds).
    let mut last = 0;
    for _ in 0..1500 {
        last = organism_state(&hub);
    }
    assert_eq!(rx.pass_over_others(), Some(status + PASS_OVER_MAX));
    assert_eq!(rx.pass_over_others(), Some(last));
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    // A lag at a message is told, as is one past what the hub remembers of kinds.
    for i in 0..200 {
        hub.publish(message(&i.to_string()).0);
    }
    assert_eq!(rx.pass_over_others(), None);
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Lagged(72));
    for _ in 0..3000 {
        organism_state(&hub);
    }
    assert_eq!(rx.pass_over_others(), None);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Lagged(_))));
}

/// An event is found by its `seq` while the ring holds it, and not once the ring has come
/// round past it, nor before it is published.
#[test]
fn an_event_is_found_by_its_seq_while_the_ring_holds_it() {
    let hub = EventHub::new(4);
    let first = log(&hub, 1);
    assert_eq!(hub.event(first).map(|e| e.seq), Some(first));
    assert!(hub.event(first + 1).is_none(), "not published yet");
    let last = (0..4).map(|_| log(&hub, 1)).max().unwrap_or(first);
    assert!(hub.event(first).is_none(), "the ring came round past it");
    assert_eq!(hub.event(last).map(|e| e.seq), Some(last));
}
