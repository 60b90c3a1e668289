//! Writes: rows, coalescing, the kept counts.

use super::*;

#[test]
fn a_thread_row_follows_its_messages_between_its_status_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    let stored = |id: &str| store.thread(id).unwrap().unwrap();
    thread(&store, "a", ThreadStatus::Active, 1);
    store.flush(1);
    let created = stored("a");
    assert_eq!(created.message_count, 0);
    // Messages in a later batch than the thread's last status change, one batch each.
    for slot in 0..2 {
        store.record(
            2 + slot,
            &EventKind::Message {
                message: msg("a", slot, "api", "g", 10 + slot),
            },
        );
        store.flush(2 + slot);
        assert_eq!(stored("a").message_count, slot + 1);
    }
    // Its last activity is its latest message's time, as in memory, not the writer's.
    let after_messages = stored("a");
    assert_eq!(created.last_activity, Timestamp(1));
    assert_eq!(after_messages.last_activity, Timestamp(11));
    assert_eq!(after_messages.status, ThreadStatus::Active);
    // A status change alone moves the thread's last activity, never its count back.
    store.record(
        4,
        &EventKind::MessageStatus {
            id: "a-1".into(),
            thread_id: "a".into(),
            status: MessageStatus::Delivered,
            error: None,
            about: None,
        },
    );
    store.flush(4);
    let after_status = stored("a");
    assert_eq!(after_status.message_count, 2);
    assert!(after_status.last_activity >= after_messages.last_activity);
    assert_eq!(after_status.error, None);
    // The first error its messages meet becomes the thread's, as in memory (a kill
    // fails the queued messages after the thread's own status change).
    for (seq, (slot, error)) in [(0, "first"), (1, "second")].into_iter().enumerate() {
        store.record(
            10 + seq as u64,
            &EventKind::MessageStatus {
                id: format!("a-{slot}").into(),
                thread_id: "a".into(),
                status: MessageStatus::Failed,
                error: Some(error.into()),
                about: None,
            },
        );
        store.flush(10 + seq as u64);
        assert_eq!(stored("a").error.as_deref(), Some("first"));
    }
    // A message of a thread with no row gets one, counted.
    store.record(
        5,
        &EventKind::Message {
            message: msg("unrecorded", 0, "api", "g", 20),
        },
    );
    store.flush(5);
    assert_eq!(stored("unrecorded").message_count, 1);
}

#[test]
fn stored_status_words_are_the_api_words() {
    for s in [
        MessageStatus::Pending,
        MessageStatus::Delivered,
        MessageStatus::Terminal,
        MessageStatus::Rejected,
        MessageStatus::Undeliverable,
        MessageStatus::Failed,
        MessageStatus::Killed,
    ] {
        assert_eq!(status_str(s), status_json(s));
        assert_eq!(parse_status::<MessageStatus>(status_str(s)), Some(s));
    }
    for s in [
        ThreadStatus::Active,
        ThreadStatus::Completed,
        ThreadStatus::Error,
        ThreadStatus::Killed,
    ] {
        assert_eq!(status_str(s), status_json(s));
    }
}

#[test]
fn coalescing_keeps_what_a_batch_writes() {
    let batch = vec![
        event_op(EventKind::Message {
            message: msg("t", 0, "api", "a", 1),
        }),
        event_op(EventKind::ThreadCreated {
            thread: ThreadInfo {
                id: "t".into(),
                status: ThreadStatus::Active,
                participants: vec![],
                message_count: 1,
                created_at: Timestamp(5),
                last_activity: Timestamp(5),
                error: None,
                settings: None,
                labels: None,
                paused: false,
                owner: None,
            },
        }),
        event_op(EventKind::MessageStatus {
            id: "t-0".into(),
            thread_id: "t".into(),
            status: MessageStatus::Delivered,
            error: None,
            about: None,
        }),
        event_op(EventKind::MessageStatus {
            id: "elsewhere".into(),
            thread_id: "e".into(),
            status: MessageStatus::Failed,
            error: Some("x".into()),
            about: None,
        }),
        event_op(EventKind::ThreadUpdated {
            thread_id: "t".into(),
            status: ThreadStatus::Completed,
            message_count: 1,
            error: None,
            paused: false,
            labels: None,
        }),
        Op::Seq(9),
    ];
    let mut coalescer = Coalescer::default();
    // Twice: the second time with the buffers the first left behind.
    for _ in 0..2 {
        let writes = coalescer.coalesce(&batch);
        assert_coalesced(&writes);
        // The write each operation went into: a failed write holds every event it took.
        assert_eq!(
            coalescer.into,
            [Some(1), Some(0), Some(1), Some(3), Some(0), Some(4)]
        );
        coalescer.recycle(writes);
    }
    assert!(coalescer.writes.capacity() >= 4, "the allocation is kept");
}

#[test]
fn a_status_change_coalesces_into_the_last_write_of_a_message_written_twice() {
    let mut batch = Vec::new();
    // Many messages, so the table's probing has something to get wrong.
    for slot in 0..64 {
        batch.push(event_op(EventKind::Message {
            message: msg("t", slot, "api", "a", 1),
        }));
    }
    batch.push(event_op(EventKind::Message {
        message: with_status(msg("t", 7, "api", "a", 1), MessageStatus::Delivered),
    }));
    batch.push(event_op(EventKind::MessageStatus {
        id: "t-7".into(),
        thread_id: "t".into(),
        status: MessageStatus::Failed,
        error: None,
        about: None,
    }));
    let mut coalescer = Coalescer::default();
    let writes = coalescer.coalesce(&batch);
    // The thread's touch first, then the 65 message writes.
    assert_eq!(writes.len(), 66);
    assert!(matches!(
        writes[0],
        Write::Touch {
            id: "t",
            message_count: 64,
            error: None,
            ..
        }
    ));
    assert_eq!(message_status(&writes[8]), Some(MessageStatus::Pending));
    assert_eq!(message_status(&writes[65]), Some(MessageStatus::Failed));
    assert_eq!(coalescer.into[65], Some(65));
}

#[test]
fn a_message_written_twice_is_stored_once_with_its_last_status() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    thread(&store, "t", ThreadStatus::Completed, 1);
    let write = |slot: u64, status: MessageStatus| {
        store.record(
            1,
            &EventKind::Message {
                message: with_status(msg("t", slot, "api", "g", slot), status),
            },
        )
    };
    // Twice in one batch (the second in the same multi-row insert as the first or not),
    for slot in 0..40 {
        write(slot, MessageStatus::Pending);
    }
    for slot in (0..40).step_by(3) {
        write(slot, MessageStatus::Delivered);
    }
    store.flush(1);
    // and again in a later batch.
    for slot in (0..40).step_by(5) {
        write(slot, MessageStatus::Failed);
    }
    store.flush(2);
    let rows = all_rows(&store);
    assert_eq!(rows.len(), 40);
    for m in &rows {
        let want = match m.slot_index {
            s if s % 5 == 0 => MessageStatus::Failed,
            s if s % 3 == 0 => MessageStatus::Delivered,
            _ => MessageStatus::Pending,
        };
        assert_eq!(m.status, want, "slot {}", m.slot_index);
    }
    assert_kept_counts_match_scans(&store);
    // New messages after the duplicates still get their own places.
    write(40, MessageStatus::Pending);
    store.flush(3);
    assert_eq!(all_rows(&store).len(), 41);
    assert_kept_counts_match_scans(&store);
}

#[test]
fn a_status_change_finds_its_message_whether_or_not_the_writer_remembers_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let status = |store: &Store, slot: u64, status: MessageStatus| {
        store.record(
            2,
            &EventKind::MessageStatus {
                id: format!("t-{slot}").into(),
                thread_id: "t".into(),
                status,
                error: None,
                about: None,
            },
        )
    };
    {
        let store = Store::open(&path).unwrap();
        thread(&store, "t", ThreadStatus::Completed, 1);
        for slot in 0..4 {
            store.record(
                1,
                &EventKind::Message {
                    message: msg("t", slot, "api", "g", slot),
                },
            );
        }
        store.flush(1);
        // Remembered as pending by the writer that stored it (twice for slot 1: it is
        // still pending after the first change).
        status(&store, 0, MessageStatus::Delivered);
        status(&store, 1, MessageStatus::Pending);
        store.flush(2);
        status(&store, 1, MessageStatus::Failed);
        store.flush(3);
        assert_kept_counts_match_scans(&store);
    }
    // A new writer knows none of them: it looks them up. (Opening fails slot 3, left
    // pending by the store before.)
    let store = Store::open(&path).unwrap();
    status(&store, 2, MessageStatus::Rejected);
    status(&store, 0, MessageStatus::Killed);
    store.flush(4);
    let got: Vec<MessageStatus> = all_rows(&store).iter().map(|m| m.status).collect();
    assert_eq!(
        got,
        [
            MessageStatus::Killed,
            MessageStatus::Failed,
            MessageStatus::Rejected,
            MessageStatus::Failed
        ]
    );
    assert_kept_counts_match_scans(&store);
}

#[test]
fn a_thread_begun_again_under_a_stored_id_keeps_its_row_and_gets_its_messages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let message = |store: &Store, t: &str, slot: u64| {
        store.record(
            1,
            &EventKind::Message {
                message: msg(t, slot, "api", "g", 10 + slot),
            },
        )
    };
    {
        let store = Store::open(&path).unwrap();
        finished_thread(&store, "t", 1, 1);
        store.flush(1);
    }
    // A new writer, which takes "t" for a new thread when it is created again, in the
    // same batch as a thread that is new, each with a message.
    let store = Store::open(&path).unwrap();
    thread(&store, "t", ThreadStatus::Active, 50);
    thread(&store, "u", ThreadStatus::Active, 50);
    message(&store, "t", 1);
    message(&store, "u", 0);
    store.record(
        1,
        &EventKind::ThreadUpdated {
            thread_id: "t".into(),
            status: ThreadStatus::Completed,
            message_count: 2,
            error: None,
            paused: false,
            labels: None,
        },
    );
    store.flush(2);
    let t = store.thread("t").unwrap().unwrap();
    assert_eq!(
        (t.status, t.message_count, t.created_at),
        (ThreadStatus::Completed, 2, Timestamp(1))
    );
    let of = |id: &str| {
        let filter = MessageFilter {
            thread: Some(id.into()),
            ..Default::default()
        };
        let page = store.query_messages(&filter, Page::default()).unwrap();
        let slots: Vec<u64> = page.items.iter().map(|m| m.slot_index).collect();
        (page.total, slots)
    };
    assert_eq!(of("t"), (2, vec![0, 1]));
    assert_eq!(of("u"), (1, vec![0]));
    let threads = store
        .query_threads(&ThreadFilter::default(), Page::default())
        .unwrap();
    assert_eq!(threads.total, 2);
    assert_kept_counts_match_scans(&store);
}

#[test]
fn a_message_keeps_its_origin_across_a_reopen() {
    use crate::threads::{Origin, OriginKind};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let first = msg("t", 0, "api", "a", 1);
    let reply = msg("t", 1, "a", "b", 2).with_core(|c| {
        c.parent_id = Some(first.id.clone());
        c.origin = Origin::implied(Some(&first.id), "a");
    });
    // An edit of an injected message: no parent, yet not an inject.
    let edit = msg("t", 2, "api", "a", 3).with_core(|c| c.origin = Origin::edit(first.id.clone()));
    let notice = msg("t", 3, "system", "a", 4).with_core(|c| {
        c.parent_id = Some(reply.id.clone());
        c.origin = Origin::implied(Some(&reply.id), "system");
    });
    {
        let store = Store::open(&path).unwrap();
        thread(&store, "t", ThreadStatus::Completed, 1);
        for (seq, m) in [&first, &reply, &edit, &notice].into_iter().enumerate() {
            store.record(seq as u64 + 2, &EventKind::Message { message: m.clone() });
        }
        store.flush(5);
    }
    let store = Store::open(&path).unwrap();
    let origins: Vec<(OriginKind, Option<String>)> = all_rows(&store)
        .into_iter()
        .map(|m| (m.origin.kind, m.origin.of.as_deref().map(str::to_string)))
        .collect();
    assert_eq!(
        origins,
        [
            (OriginKind::Inject, None),
            (OriginKind::Reply, Some(first.id.to_string())),
            (OriginKind::Edit, Some(first.id.to_string())),
            (OriginKind::Notice, Some(reply.id.to_string())),
        ]
    );
}

#[test]
fn an_input_decided_in_the_batch_that_opened_it_is_inserted_decided() {
    use crate::threads::{InputRow, InputStatus};
    let opened = |id: &str| Arc::new(input(id));
    let decided = |id: &str, status: InputStatus, decision: &str| {
        Arc::new(InputRow {
            status,
            decided_by: Some("key:ops".into()),
            decided: Some(Timestamp(9)),
            decision: Some(decision.into()),
            ..input(id)
        })
    };
    let batch = vec![
        event_op(EventKind::InputRequested { input: opened("a") }),
        event_op(EventKind::InputRequested { input: opened("b") }),
        event_op(EventKind::InputResolved {
            input: decided("a", InputStatus::Declined, "reject"),
        }),
        // A second decision (the pump never makes one) and one of an input opened before.
        event_op(EventKind::InputResolved {
            input: decided("a", InputStatus::Approved, "approve"),
        }),
        event_op(EventKind::InputResolved {
            input: decided("c", InputStatus::Approved, "approve"),
        }),
    ];
    let mut coalescer = Coalescer::default();
    let writes = coalescer.coalesce(&batch);
    assert_eq!(
        coalescer.into,
        [Some(0), Some(1), Some(0), Some(2), Some(3)]
    );
    let shown: Vec<(&str, Option<&str>)> = writes
        .iter()
        .map(|w| match w {
            Write::InputOpened(r, d) => (&*r.id, d.and_then(|d| d.decision.as_deref())),
            Write::InputDecided(r) => (&*r.id, Some("update")),
            _ => ("other", None),
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("in-a", Some("reject")),
            ("in-b", None),
            ("in-a", Some("update")),
            ("in-c", Some("update"))
        ]
    );
    // What the row holds: the decision's columns from the decision, the rest as opened.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let conn = super::super::open::side_connection(&path).unwrap();
    let d = decided("a", InputStatus::Declined, "reject");
    super::super::inputs::insert(&conn, &input("a"), Some(&d)).unwrap();
    super::super::inputs::decide(&conn, &decided("a", InputStatus::Approved, "approve")).unwrap();
    drop(conn);
    let table = super::super::inputs::InputsTable::open(&path).unwrap();
    let row = table.get("in-a").unwrap().unwrap();
    assert_eq!(
        (
            row.status,
            row.decision.as_deref(),
            row.decided_by.as_deref()
        ),
        (InputStatus::Declined, Some("reject"), Some("key:ops"))
    );
    assert_eq!(
        (row.payload_xml.as_str(), row.created),
        ("<Note/>", Timestamp(3))
    );
    assert!(table.open_inputs().unwrap().is_empty());
}
