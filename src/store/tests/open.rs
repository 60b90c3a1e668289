//! Opening, migrating, recovering, locking, and failing loudly.

use super::*;

#[test]
fn reopening_keeps_history_marks_active_threads_interrupted_and_continues_seq() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path).unwrap();
        thread(&store, "live", ThreadStatus::Active, 1);
        thread(&store, "done", ThreadStatus::Completed, 2);
        store.record(
            5,
            &EventKind::Message {
                message: msg("live", 0, "api", "g", 3),
            },
        );
        store.record(
            6,
            &EventKind::Message {
                message: with_status(msg("done", 0, "api", "h", 4), MessageStatus::Delivered),
            },
        );
        store.flush(777);
    }
    let store = Store::open(&path).unwrap();
    let r = store.recovered();
    assert_eq!(
        (
            r.last_seq,
            r.total_messages,
            r.interrupted,
            r.interrupted_messages
        ),
        (777, 2, 1, 1)
    );
    let live = store.thread("live").unwrap().unwrap();
    assert_eq!(
        (live.status, live.error.as_deref()),
        (ThreadStatus::Error, Some("interrupted"))
    );
    assert_eq!(
        store.thread("done").unwrap().unwrap().status,
        ThreadStatus::Completed
    );
    // The message left pending failed with the same reason; the delivered one is as it
    // was; the counts moved with it.
    let rows = all_rows(&store);
    let status_of = |id: &str| {
        let m = rows.iter().find(|m| &*m.id == id).unwrap();
        (m.status, m.error.clone())
    };
    assert_eq!(
        status_of("live-0"),
        (MessageStatus::Failed, Some("interrupted".into()))
    );
    assert_eq!(status_of("done-0"), (MessageStatus::Delivered, None));
    let with = |status| MessageFilter {
        status: Some(status),
        ..Default::default()
    };
    let total = |f: &MessageFilter| store.query_messages(f, Page::default()).unwrap().total;
    assert_eq!(total(&with(MessageStatus::Pending)), 0);
    assert_eq!(total(&with(MessageStatus::Failed)), 1);
    assert_kept_counts_match_scans(&store);
    // Nothing is left to recover a second time.
    drop(store);
    let again = Store::open(&path).unwrap();
    assert_eq!(
        (
            again.recovered().interrupted,
            again.recovered().interrupted_messages
        ),
        (0, 0)
    );
}

#[test]
fn a_store_dropped_without_a_flush_commits_everything_before_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path).unwrap();
        thread(&store, "t", ThreadStatus::Active, 1);
        for slot in 0..100 {
            store.record(
                2 + slot,
                &EventKind::Message {
                    message: msg("t", slot, "api", "g", slot),
                },
            );
        }
        // No flush: the drop waits for the writer.
    }
    // Opened again at once: no second writer races the first for the file.
    let store = Store::open(&path).unwrap();
    let r = store.recovered();
    assert_eq!((r.last_seq, r.total_messages, r.interrupted), (101, 100, 1));
    assert_eq!(all_rows(&store).len(), 100);
}

#[test]
fn a_version_1_file_is_migrated_with_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        for (i, (from, to)) in [("api", "g"), ("g", "s"), ("s", "g")].iter().enumerate() {
            conn.execute(
                "INSERT INTO messages VALUES (?1, 't', NULL, ?2, ?3, ?4, '{urn:x}Note', '<Note/>', 'delivered', NULL, ?5)",
                params![format!("m{i}"), i as i64, from, to, 10 - i as i64],
            )
            .unwrap();
        }
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.recovered().total_messages, 3);
    let g = by_agent(&store, "g");
    assert_eq!(g.total, 3);
    let ids: Vec<&str> = g.items.iter().map(|m| &*m.id).collect();
    assert_eq!(ids, vec!["m2", "m1", "m0"], "v1 rows keep their time order");
    assert_kept_counts_match_scans(&store);
    // New writes name agents by the numbers the migration gave them (and new ones).
    store.record(
        1,
        &EventKind::Message {
            message: msg("t2", 0, "g", "z", 20),
        },
    );
    store.flush(1);
    let count = |agent: &str| by_agent(&store, agent);
    assert_eq!((count("g").total, count("g").items.len()), (4, 4));
    assert_eq!(count("z").total, 1);
    assert_eq!(count("z").items[0].thread_id.as_ref(), "t2");
    assert_eq!(count("nobody").total, 0);
    assert!(count("nobody").items.is_empty());
    assert_kept_counts_match_scans(&store);
}

#[test]
fn a_full_disk_fails_loudly_keeps_the_writes_and_commits_them_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(&dir.path().join("s.db"), Some(120)).unwrap();
    // Rows of about 3 kB: one a page, away from SQLite's overflow threshold (near it, what
    // pruning frees and what the held writes need are laid out differently).
    let big = |t: &str, slot: u64| {
        // The new thread's receiver is an agent first named by writes that fail.
        let m = msg(t, slot, "api", if t == "new" { "h" } else { "g" }, slot);
        m.with_core(|c| {
            c.payload_xml = crate::xml::SharedXml::new(format!(
                "<Note xmlns=\"urn:x\">{}</Note>",
                "x".repeat(3000)
            ))
        })
    };
    thread(&store, "old", ThreadStatus::Completed, 1);
    for slot in 0..60 {
        store.record(
            1,
            &EventKind::Message {
                message: big("old", slot),
            },
        );
    }
    store.flush(1);
    assert_eq!(store.failure(), None);
    thread(&store, "new", ThreadStatus::Completed, 2);
    for slot in 0..60 {
        store.record(
            2,
            &EventKind::Message {
                message: big("new", slot),
            },
        );
    }
    // Status changes and the thread's last state, coalesced into the writes that fail.
    for slot in (0..60).step_by(2) {
        store.record(
            2,
            &EventKind::MessageStatus {
                id: format!("new-{slot}").into(),
                thread_id: "new".into(),
                status: MessageStatus::Delivered,
                error: None,
                about: None,
            },
        );
    }
    store.record(
        2,
        &EventKind::ThreadUpdated {
            thread_id: "new".into(),
            status: ThreadStatus::Error,
            message_count: 60,
            error: Some("budget".into()),
            paused: false,
            labels: None,
        },
    );
    crate::testing::wait_until("the write failure is reported", || {
        store.failure().is_some()
    });
    let failure = store.failure().unwrap();
    assert!(failure.contains("full"), "{failure}");
    assert!(
        store.queued() > 0,
        "the failed writes are held, not dropped"
    );
    // Retention frees pages inside the file; the held writes then commit.
    store.prune(Some(60), None).unwrap();
    crate::testing::wait_until("the held writes commit", || store.failure().is_none());
    store.flush(2);
    let new = store
        .query_messages(
            &MessageFilter {
                thread: Some("new".into()),
                ..Default::default()
            },
            Page::default(),
        )
        .unwrap();
    assert_eq!(new.total, 60, "no write was lost");
    let delivered = all_rows(&store)
        .iter()
        .filter(|m| &*m.thread_id == "new" && m.status == MessageStatus::Delivered)
        .count();
    assert_eq!(delivered, 30, "no status change was lost");
    let t = store.thread("new").unwrap().unwrap();
    assert_eq!(
        (t.status, t.message_count, t.error.as_deref()),
        (ThreadStatus::Error, 60, Some("budget"))
    );
    assert_kept_counts_match_scans(&store);
    assert_eq!(store.queued(), 0);
    let h = by_agent(&store, "h");
    assert_eq!(
        (h.total, h.items.len()),
        (60, 50),
        "the agent first named by failed writes is found"
    );
}

#[test]
fn bad_files_give_clear_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x42u8; 8192]).unwrap();
    let e = Store::open(&junk).err().unwrap();
    assert!(
        e.to_string().contains("junk.db") && e.message.contains("not a usable"),
        "{e}"
    );

    let newer = dir.path().join("newer.db");
    Connection::open(&newer)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let e = Store::open(&newer).err().unwrap();
    assert!(e.message.contains("schema version 99 is newer"), "{e}");

    let blocked = dir.path().join("file-not-dir");
    std::fs::write(&blocked, "x").unwrap();
    let e = Store::open(&blocked.join("s.db")).err().unwrap();
    assert!(e.message.contains("cannot create directory"), "{e}");

    // A directory, named with or without a trailing slash: refused before anything is
    // created beside it.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    for given in [sub.clone(), PathBuf::from(format!("{}/", sub.display()))] {
        let e = Store::open(&given).err().unwrap();
        assert!(e.message.contains("is a directory"), "{e}");
    }
    let e = Store::open(&dir.path().join("new/")).err().unwrap();
    assert!(e.message.contains("is a directory"), "{e}");
    let e = Store::open(Path::new("")).err().unwrap();
    assert!(e.message.contains("no file given"), "{e}");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "file-not-dir",
            "junk.db",
            "junk.db.lock",
            "newer.db",
            "newer.db.lock",
            "sub"
        ]
    );
    assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 0);
}

#[test]
fn a_file_in_use_by_another_store_is_refused_until_that_one_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let first = Store::open(&path).unwrap();
    thread(&first, "t1", ThreadStatus::Completed, 5);
    let e = Store::open(&path).err().unwrap();
    assert!(
        e.to_string().contains("s.db")
            && e.message.contains("in use by another agentserver")
            && e.message.contains("s.db.lock"),
        "{e}"
    );
    // The refused open changed nothing: the first store still writes.
    first.flush(1);
    drop(first);
    let again = Store::open(&path).unwrap();
    assert_eq!(again.recovered().last_seq, 1);
    assert!(again.thread("t1").unwrap().is_some());
}

#[test]
fn the_writer_keeps_inputs_and_a_held_message_without_its_input_is_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let held = |t: &str| with_status(msg(t, 0, "api", "g", 3), MessageStatus::Held);
    {
        let store = Store::open(&path).unwrap();
        // `kept` and `decided`: held messages whose inputs the writer recorded; `lost`: the
        // process ended after its held message was committed and before its input was.
        for (seq, t) in [(2, "kept"), (5, "lost"), (8, "decided")] {
            thread(&store, t, ThreadStatus::Waiting, 1);
            store.record(seq, &EventKind::Message { message: held(t) });
            if t != "lost" {
                store.record(
                    seq + 1,
                    &EventKind::InputRequested {
                        input: std::sync::Arc::new(input(t)),
                    },
                );
            }
        }
        let decided = crate::threads::InputRow {
            status: crate::threads::InputStatus::Declined,
            decided_by: Some("key:ops".into()),
            decided: Some(Timestamp(9)),
            decision: Some("reject".into()),
            ..input("decided")
        };
        store.record(
            10,
            &EventKind::InputResolved {
                input: std::sync::Arc::new(decided.clone()),
            },
        );
        // A second decision of the same input (it never is in the pump) changes nothing.
        store.record(
            11,
            &EventKind::InputResolved {
                input: std::sync::Arc::new(crate::threads::InputRow {
                    decision: Some("approve".into()),
                    status: crate::threads::InputStatus::Approved,
                    ..decided
                }),
            },
        );
        store.flush(11);
    }
    let store = Store::open(&path).unwrap();
    let table = super::super::inputs::InputsTable::open(&path).unwrap();
    let open: Vec<String> = table
        .open_inputs()
        .unwrap()
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(open, ["in-kept"]);
    let decided = table.get("in-decided").unwrap().unwrap();
    assert_eq!(
        (decided.status, decided.decision.as_deref()),
        (crate::threads::InputStatus::Declined, Some("reject"))
    );
    // The thread with an open input waits; a held message without one failed, and its
    // thread with it.
    let status = |t: &str| {
        let t = store.thread(t).unwrap().unwrap();
        (t.status, t.error)
    };
    assert_eq!(status("kept"), (ThreadStatus::Waiting, None));
    assert_eq!(
        status("lost"),
        (ThreadStatus::Error, Some("interrupted".into()))
    );
    let rows = all_rows(&store);
    let of = |id: &str| {
        let m = rows.iter().find(|m| &*m.id == id).unwrap();
        (m.status, m.error.clone())
    };
    assert_eq!(of("kept-0"), (MessageStatus::Held, None));
    // As is one whose decision was committed and its let-through not: nothing would move it.
    for id in ["lost-0", "decided-0"] {
        assert_eq!(of(id), (MessageStatus::Failed, Some("interrupted".into())));
    }
    assert_eq!(store.recovered().interrupted_messages, 2);
    assert_kept_counts_match_scans(&store);
}
