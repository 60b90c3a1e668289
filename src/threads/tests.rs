//! The registry's own tests.

use super::*;

fn msg(status: MessageStatus) -> NewMessage {
    NewMessage {
        id: Arc::from("m"),
        parent_id: None,
        from: Arc::from("api"),
        to: Some(Arc::from("a")),
        payload_type: Some("X".into()),
        payload_xml: crate::xml::SharedXml::new("<X/>".into()),
        status,
        error: None,
        origin: crate::threads::Origin::inject(),
    }
}

#[test]
fn thread_completes_when_quiescent_and_errors_after_a_failure() {
    let r = ThreadRegistry::new(10, 100, usize::MAX);
    let t = r.open(None, None).unwrap().id;
    r.append(&t, msg(MessageStatus::Pending)).unwrap();
    let done = r.finish_one(&t).unwrap();
    assert_eq!(done.status, ThreadStatus::Completed);

    let again = r.open(Some(&t), None).unwrap();
    assert!(again.reactivated.is_some());
    r.append(&t, msg(MessageStatus::Pending)).unwrap();
    r.set_message_status(&t, 1, MessageStatus::Failed, Some("boom".into()));
    assert_eq!(r.finish_one(&t).unwrap().status, ThreadStatus::Error);
    assert_eq!(r.info(&t).unwrap().participants, vec!["api", "a"]);
}

#[test]
fn invalid_and_killed_threads_are_refused() {
    let r = ThreadRegistry::new(10, 100, usize::MAX);
    assert_eq!(
        r.open(Some("bad id!"), None).err(),
        Some(ThreadError::InvalidId)
    );
    let t = r.open(Some("t-1"), None).unwrap().id;
    r.kill(&t).unwrap();
    assert!(matches!(
        r.open(Some("t-1"), None),
        Err(ThreadError::Killed(_))
    ));
}

#[test]
fn budget_is_enforced_per_thread() {
    let r = ThreadRegistry::new(2, 100, usize::MAX);
    let t = r.open(None, None).unwrap().id;
    r.append(&t, msg(MessageStatus::Pending)).unwrap();
    r.append(&t, msg(MessageStatus::Pending)).unwrap();
    let over = r.append(&t, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(over.status, MessageStatus::Failed);
    assert!(r.info(&t).unwrap().error.unwrap().contains("budget of 2"));
}

#[test]
fn an_owner_has_at_most_its_quota_of_active_threads() {
    let r = ThreadRegistry::new(10, 100, usize::MAX);
    let q = || {
        Some(Quota {
            owner: "acme",
            max: 2,
            max_pending: 100,
            max_pending_bytes: usize::MAX,
            section: "tenants.acme",
            incoming: 0,
        })
    };
    let a = r.open(None, q()).unwrap().id;
    let b = r.open(None, q()).unwrap().id;
    let refused = r.open(None, q()).err().unwrap();
    assert_eq!(
        refused.to_string(),
        "tenant `acme` has 2 active threads, its limit (tenants.acme.max_active_threads)"
    );
    // Others are not counted against it; continuing an active thread opens nothing.
    r.open(None, None).unwrap();
    r.open(Some(&a), q()).unwrap();
    assert_eq!(r.active_owned("acme"), 2);

    // A thread that finishes or is killed frees its place.
    r.append(&a, msg(MessageStatus::Pending)).unwrap();
    r.finish_one(&a).unwrap();
    r.kill(&b).unwrap();
    assert_eq!(r.active_owned("acme"), 0);
    let c = r.open(None, q()).unwrap().id;
    // Reviving a finished thread of the owner counts and is checked.
    r.open(Some(&a), q()).unwrap();
    assert!(r.open(None, q()).is_err());
    r.settle(&c);
    assert_eq!(r.active_owned("acme"), 1);
    // Work owed (an external agent's reply) revives without the check.
    r.hold(&c);
    r.hold(&c);
    assert_eq!(r.active_owned("acme"), 2);
}

#[test]
fn an_owners_threads_hold_at_most_its_quota_of_pending_messages() {
    let r = ThreadRegistry::new(100, 100, usize::MAX);
    let q = |max_pending| {
        Some(Quota {
            owner: "acme",
            max: 1000,
            max_pending,
            max_pending_bytes: usize::MAX / 4,
            section: "tenants.acme",
            incoming: 4,
        })
    };
    let a = r.open(None, q(3)).unwrap().id;
    r.append(&a, msg(MessageStatus::Pending)).unwrap();
    r.append(&a, msg(MessageStatus::Pending)).unwrap();
    let b = r.open(None, q(3)).unwrap().id;
    r.append(&b, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(r.pending_owned("acme").0, 3);
    // An inject may neither open nor continue one of its threads meanwhile.
    let said = "tenant `acme` has 3 messages pending in its threads, its limit \
                (tenants.acme.max_pending_messages)";
    assert_eq!(r.open(None, q(3)).err().unwrap().to_string(), said);
    assert_eq!(r.open(Some(&a), q(3)).err().unwrap().to_string(), said);
    // Handlers' outputs go on up to twice it; past that they fail, and their thread.
    for _ in 0..3 {
        let out = r.append(&b, msg(MessageStatus::Pending)).unwrap();
        assert_eq!(out.status, MessageStatus::Pending);
    }
    let over = r.append(&b, msg(MessageStatus::Pending)).unwrap();
    let said = "tenant `acme` has 6 messages pending in its threads, twice its limit \
                (tenants.acme.max_pending_messages: 3)";
    assert_eq!(
        (over.status, over.error.as_deref()),
        (MessageStatus::Failed, Some(said))
    );
    assert_eq!(r.pending_owned("acme").0, 6);
    // Others' threads are not counted.
    let other = r.open(None, None).unwrap().id;
    r.append(&other, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(r.pending_owned("acme").0, 6);
    // What is done frees its place.
    for _ in 0..4 {
        r.finish_one(&b);
    }
    assert_eq!(r.pending_owned("acme").0, 2);
    r.open(None, q(3)).unwrap();

    // A bound changed by a reload holds for the threads already open too, from the next
    // inject on: at 2 pending, an inject that reads a bound of 1 is refused, and the
    // threads' outputs fail at twice that.
    assert!(r.open(None, q(1)).is_err());
    let out = r.append(&b, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(out.status, MessageStatus::Failed, "{:?}", out.error);
    assert!(out
        .error
        .unwrap()
        .contains("twice its limit (tenants.acme.max_pending_messages: 1)"));

    // Killed threads evicted before their queued work is cancelled give their share back
    // as they go; the work cancelled later finds no entry and counts nothing twice.
    let r = ThreadRegistry::new(100, 0, usize::MAX);
    let ids: Vec<_> = (0..40)
        .map(|_| {
            let t = r.open(None, q(1000)).unwrap().id;
            r.append(&t, msg(MessageStatus::Pending)).unwrap();
            r.kill(&t).unwrap();
            t
        })
        .collect();
    // As the pump does for each job it cancels: its message killed, then released.
    for t in &ids {
        r.set_message_status(t, 0, MessageStatus::Killed, Some("thread killed".into()));
        r.finish_one(t);
    }
    assert_eq!(r.pending_owned("acme"), (0, 0));
}

#[test]
fn an_owners_threads_hold_at_most_its_quota_of_pending_bytes() {
    let r = ThreadRegistry::new(100, 100, usize::MAX);
    let q = |incoming| {
        Some(Quota {
            owner: "acme",
            max: 1000,
            max_pending: 1000,
            max_pending_bytes: 10,
            section: "tenants.acme",
            incoming,
        })
    };
    // Payloads of 4 bytes (`<X/>`).
    let a = r.open(None, q(4)).unwrap().id;
    r.append(&a, msg(MessageStatus::Pending)).unwrap();
    r.append(&a, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(r.pending_owned("acme"), (2, 8));
    // An inject of 4 more would pass 10: refused, naming the bound; one of 2 fits.
    assert_eq!(
        r.open(None, q(4)).err().unwrap().to_string(),
        "tenant `acme` has 8 bytes of payloads pending in its threads; 4 more would pass \
         its limit (tenants.acme.max_pending_bytes: 10)"
    );
    r.open(None, q(2)).unwrap();
    // Outputs go on up to twice it, then fail.
    for _ in 0..3 {
        let out = r.append(&a, msg(MessageStatus::Pending)).unwrap();
        assert_eq!(out.status, MessageStatus::Pending);
    }
    let over = r.append(&a, msg(MessageStatus::Pending)).unwrap();
    assert_eq!(over.status, MessageStatus::Failed);
    assert_eq!(
        over.error.as_deref(),
        Some(
            "tenant `acme` has 20 bytes of payloads pending in its threads; 4 more would \
             pass twice its limit (tenants.acme.max_pending_bytes: 10)"
        )
    );
    assert_eq!(r.pending_owned("acme"), (5, 20));
    // A message handled, or stopped, gives its bytes back, once.
    r.set_message_status(&a, 0, MessageStatus::Delivered, None);
    r.set_message_status(&a, 1, MessageStatus::Killed, Some("thread killed".into()));
    assert_eq!(r.pending_owned("acme").1, 12);
    r.set_message_status(&a, 0, MessageStatus::Failed, Some("no reply".into()));
    assert_eq!(r.pending_owned("acme").1, 12);
    // A thread that goes takes what it still holds pending with it.
    r.kill(&a).unwrap();
    drop(r);
}

/// Bytes reserved (payloads held at approval gates) count against what finished threads
/// keep: with half the budget reserved, about half as many stay.
#[test]
fn reserved_bytes_leave_finished_threads_less_room() {
    let retained = |reserved: usize| {
        let r = ThreadRegistry::new(10, 100_000, SHARDS * 2_000);
        r.reserve_bytes(reserved);
        let big = "<X>".to_string() + &"x".repeat(600) + "</X>";
        let mut ids = Vec::new();
        for _ in 0..256 {
            let t = r.open(None, None).unwrap().id;
            let mut m = msg(MessageStatus::Pending);
            m.payload_xml = crate::xml::SharedXml::new(big.clone());
            r.append(&t, m).unwrap();
            r.finish_one(&t).unwrap();
            ids.push(t);
        }
        ids.iter().filter(|t| r.contains(t)).count()
    };
    let all = retained(0);
    let half = retained(SHARDS * 1_000);
    assert!(all >= 2 * SHARDS, "{all}");
    assert!(half < all && half >= SHARDS, "{half} of {all}");
}

#[test]
fn a_new_id_is_a_version_7_uuid_of_now_and_ids_sort_as_they_were_made() {
    let before = crate::time::Timestamp::now().0;
    let ids: Vec<_> = (0..10_000).map(|_| new_id()).collect();
    let after = crate::time::Timestamp::now().0;
    // Many in one millisecond: the thread listing orders those by id.
    for pair in ids.windows(2) {
        assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
    }
    for id in &ids {
        assert!(valid_thread_id(id), "{id}");
        let u = uuid::Uuid::parse_str(id).unwrap();
        assert_eq!(u.hyphenated().to_string(), **id, "the canonical text");
        assert_eq!(u.get_version_num(), 7, "{id}");
        assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{id}");
        let (s, ns) = u.get_timestamp().unwrap().to_unix();
        let ms = s * 1000 + u64::from(ns / 1_000_000);
        assert!(before <= ms && ms <= after, "{id}: {before} {ms} {after}");
    }
}

/// Ids made on many threads, each made before the next (a lock between), sort in that order.
#[test]
fn ids_made_on_many_threads_sort_in_the_order_they_were_made() {
    let made = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5_000 {
                    let mut made = made.lock().unwrap();
                    made.push(new_id());
                }
            });
        }
    });
    let made = made.into_inner().unwrap();
    assert_eq!(made.len(), 20_000);
    for pair in made.windows(2) {
        assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
    }
}

/// The next id's millisecond and counter: a new millisecond starts its counter in the lower
/// half; a clock gone back, or a millisecond's counter at its end, still moves forward.
#[test]
fn the_id_clock_moves_forward_when_the_wall_clock_goes_back_and_past_a_full_millisecond() {
    use super::record::next_tick;
    use std::sync::atomic::AtomicU64;
    let last = AtomicU64::new(0);
    let (ms, c) = next_tick(&last, 1_000, u64::MAX);
    assert_eq!(ms, 1_000);
    assert_eq!(c, (1 << 21) - 1, "the seed is in the counter's lower half");
    // The clock goes back: the same millisecond, the next count.
    assert_eq!(next_tick(&last, 900, 0), (1_000, c + 1));
    // A later millisecond starts again from its seed.
    assert_eq!(next_tick(&last, 1_001, 5), (1_001, 5));
    // A millisecond whose counter is full moves on to the next.
    let last = AtomicU64::new(2_000 << 22 | ((1 << 22) - 1));
    assert_eq!(next_tick(&last, 2_000, 7), (2_001, 7));
}

#[test]
fn a_stop_cancels_the_token_handlers_hold_and_an_aborted_thread_gives_a_fresh_one() {
    let r = ThreadRegistry::new(10, 100, usize::MAX);
    let t = r.open(None, None).unwrap().id;
    let waiting = r.cancel_token(&t).unwrap();
    let also = r.cancel_token(&t).unwrap();
    r.abort(&t).unwrap();
    assert!(waiting.is_cancelled() && also.is_cancelled());
    let next = r.cancel_token(&t).unwrap();
    assert!(!next.is_cancelled(), "an aborted thread goes on");

    r.kill(&t).unwrap();
    assert!(next.is_cancelled());
    assert!(
        r.cancel_token(&t).unwrap().is_cancelled(),
        "a killed thread stays so"
    );
    assert!(r.is_cancelled(&t));
    assert!(r.cancel_token("gone").is_none() && r.is_cancelled("gone"));
}
