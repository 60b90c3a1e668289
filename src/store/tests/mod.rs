//! The store's unit tests, by room, and the helpers they share.

mod open;
mod prune;
mod query;
mod search;
mod writes;

use super::open::MIGRATIONS;
use super::*;

fn msg(thread: &str, slot: u64, from: &str, to: &str, ts: u64) -> MessageRecord {
    MessageRecord::new(
        MessageCore {
            id: Arc::from(format!("{thread}-{slot}")),
            thread_id: Arc::from(thread),
            parent_id: None,
            slot_index: slot,
            from: Arc::from(from),
            to: Some(Arc::from(to)),
            payload_type: Some("{urn:x}Note".into()),
            payload_xml: crate::xml::SharedXml::new("<Note xmlns=\"urn:x\">hi</Note>".into()),
            origin: crate::threads::Origin::inject(),
            timestamp: Timestamp(ts),
        },
        MessageStatus::Pending,
        None,
    )
}

/// `m` with `status`.
fn with_status(mut m: MessageRecord, status: MessageStatus) -> MessageRecord {
    m.status = status;
    m
}

/// An input as the gate opens it for `thread`'s message in slot 0.
fn input(thread: &str) -> crate::threads::InputRow {
    crate::threads::InputRow {
        id: format!("in-{thread}").into(),
        kind: crate::threads::InputKind::Approval,
        status: crate::threads::InputStatus::Open,
        thread_id: thread.into(),
        message_id: format!("{thread}-0").into(),
        listener: "g".into(),
        tenant: None,
        from: "api".into(),
        parent_id: None,
        slot_index: 0,
        payload_type: "Note".into(),
        payload_xml: std::sync::Arc::new("<Note/>".into()),
        prompt: None,
        requested_by: Some("api".into()),
        created: Timestamp(3),
        expires: None,
        decided_by: None,
        decided: None,
        decision: None,
        reason: None,
        result: None,
    }
}

/// The first page of the messages naming `agent`.
fn by_agent(store: &Store, agent: &str) -> Paged<MessageRecord> {
    store
        .query_messages(
            &MessageFilter {
                agent: Some(agent.into()),
                ..Default::default()
            },
            Page::default(),
        )
        .unwrap()
}

/// A completed thread `t` created at `created`, with `messages` messages from `api` to
/// `g`, each stamped `created`.
fn finished_thread(store: &Store, t: &str, created: u64, messages: u64) {
    thread(store, t, ThreadStatus::Completed, created);
    for slot in 0..messages {
        store.record(
            1,
            &EventKind::Message {
                message: msg(t, slot, "api", "g", created),
            },
        );
    }
}

fn thread(store: &Store, id: &str, status: ThreadStatus, created: u64) {
    owned_thread(store, id, status, created, None);
}

/// A thread created for `owner` (a tenant; none: the organism's).
fn owned_thread(store: &Store, id: &str, status: ThreadStatus, created: u64, owner: Option<&str>) {
    store.record(
        1,
        &EventKind::ThreadCreated {
            thread: ThreadInfo {
                id: id.into(),
                status,
                participants: vec![],
                message_count: 0,
                created_at: Timestamp(created),
                last_activity: Timestamp(created),
                error: None,
                settings: None,
                labels: None,
                paused: false,
                owner: owner.map(Arc::from),
            },
        },
    );
}

/// An operation carrying `kind`, as the hub would publish it.
fn event_op(kind: EventKind) -> Op {
    Op::Event(Arc::new(Event::new(1, kind)))
}

/// The status a message insert writes (`None` for any other write).
fn message_status(w: &Write<'_>) -> Option<MessageStatus> {
    match w {
        Write::Message { status, .. } => Some(*status),
        _ => None,
    }
}

fn assert_coalesced(writes: &[Write<'_>]) {
    assert_eq!(writes.len(), 5);
    // The thread is written once, where it was first touched (by its message), in its
    // last state and with the count its messages imply.
    assert!(matches!(
        writes[0],
        Write::Thread {
            status: ThreadStatus::Completed,
            created_at: Some(Timestamp(5)),
            message_count: 1,
            ..
        }
    ));
    assert_eq!(message_status(&writes[1]), Some(MessageStatus::Delivered));
    // A status change of a thread the batch writes nothing else of touches it.
    assert!(matches!(
        writes[2],
        Write::Touch {
            id: "e",
            message_count: 0,
            error: Some("x"),
            ..
        }
    ));
    assert!(matches!(
        writes[3],
        Write::Status {
            id: "elsewhere",
            ..
        }
    ));
    assert!(matches!(writes[4], Write::Seq(9)));
}

/// Every row, in write order, read directly.
fn all_rows(store: &Store) -> Vec<MessageRecord> {
    let mut lease = store.readers.take();
    let conn = lease.conn().unwrap();
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM {MESSAGES} ORDER BY m.seq"
        ))
        .unwrap();
    let rows = stmt
        .query_map([], row_to_message)
        .unwrap()
        .collect::<rusqlite::Result<Vec<_>>>()
        .unwrap();
    rows
}

/// The kept counts (`blocks`, `message_counts`, `block_times`) are exactly what the rows
/// say, and every filter's pages and totals are the ones a row-by-row filter gives.
fn assert_counts_match_rows(store: &Store, filters: &[MessageFilter], pages: &[Page]) {
    {
        let mut lease = store.readers.take();
        let conn = lease.conn().unwrap();
        let differ = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        // The counts per block, recounted here from the rows.
        let mut want: std::collections::BTreeMap<(i64, i64, i64, String), i64> = Default::default();
        let mut stmt = conn
            .prepare("SELECT seq, sender, receiver, payload_type, status FROM messages")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let seq: i64 = r.get(0).unwrap();
            let from: i64 = r.get(1).unwrap();
            let to: Option<i64> = r.get(2).unwrap();
            let status: String = r.get(4).unwrap();
            let mut agents = vec![0, from];
            agents.extend(to.filter(|t| *t != from));
            for agent in agents {
                *want
                    .entry((agent, seq >> 8, r.get(3).unwrap(), status.clone()))
                    .or_default() += 1;
            }
        }
        let have: std::collections::BTreeMap<(i64, i64, i64, String), i64> = conn
            .prepare("SELECT agent, block, type, status, n FROM blocks")
            .unwrap()
            .query_map([], |r| {
                Ok(((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?), r.get(4)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(have, want, "blocks");
        for sql in [
            "SELECT COUNT(*) FROM (SELECT agent, type, status, SUM(n) FROM blocks GROUP BY 1, 2, 3 \
             EXCEPT SELECT * FROM message_counts WHERE n != 0)",
            "SELECT COUNT(*) FROM (SELECT * FROM message_counts WHERE n != 0 \
             EXCEPT SELECT agent, type, status, SUM(n) FROM blocks GROUP BY 1, 2, 3)",
            // Every block's time range holds its messages' times.
            "SELECT COUNT(*) FROM messages m LEFT JOIN block_times t ON t.block = m.seq >> 8 \
             WHERE t.block IS NULL OR m.ts < t.min_ts OR m.ts > t.max_ts",
            // No time range outlives its block's messages.
            "SELECT COUNT(*) FROM block_times t WHERE NOT EXISTS \
             (SELECT 1 FROM messages m WHERE m.seq >> 8 = t.block)",
        ] {
            assert_eq!(differ(sql), 0, "{sql}");
        }
    }
    let rows = all_rows(store);
    for f in filters {
        let matching: Vec<&MessageRecord> = rows.iter().filter(|m| f.matches(m)).collect();
        for &page in pages {
            let want = page.cut(matching.clone());
            let got = store.query_messages(f, page).unwrap();
            assert_eq!(got.total, want.total, "{f:?} {page:?}");
            let ids = |v: Vec<&str>| v.join(" ");
            assert_eq!(
                ids(got.items.iter().map(|m| &*m.id).collect()),
                ids(want.items.iter().map(|m| &*m.id).collect()),
                "{f:?} {page:?}"
            );
        }
    }
}

/// Filters the small tests check (agents `api` and `g`, type `{urn:x}Note`).
fn small_filters() -> Vec<MessageFilter> {
    let mut filters = vec![
        MessageFilter::default(),
        MessageFilter {
            agent: Some("g".into()),
            ..Default::default()
        },
        MessageFilter {
            agent: Some("api".into()),
            status: Some(MessageStatus::Delivered),
            ..Default::default()
        },
        MessageFilter {
            payload_type: Some("Note".into()),
            status: Some(MessageStatus::Pending),
            ..Default::default()
        },
        MessageFilter {
            payload_type: Some("{urn:x}Note".into()),
            ..Default::default()
        },
        MessageFilter {
            payload_type: Some("Other".into()),
            ..Default::default()
        },
        MessageFilter {
            agent: Some("nobody".into()),
            ..Default::default()
        },
    ];
    // The same through a time window that holds everything.
    let windowed: Vec<MessageFilter> = filters
        .iter()
        .map(|f| MessageFilter {
            since: Some(Timestamp(0)),
            ..f.clone()
        })
        .collect();
    filters.extend(windowed);
    filters
}

fn assert_kept_counts_match_scans(store: &Store) {
    assert_counts_match_rows(
        store,
        &small_filters(),
        &[Page::default(), Page::new(Some(1), Some(1))],
    );
}
