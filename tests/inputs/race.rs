//! Two people deciding one input at the same moment: one decision is taken, and the other is
//! told it (409 with the first decision), never that the input does not exist, however
//! their steps interleave. Many inputs, each raced by two OS threads started together.

use std::sync::{Arc, Barrier};

use agentserver::pump::{DecideError, Decider, Verdict};

use super::common;

const INPUTS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_of_two_deciders_at_once_is_told_the_first_decision() {
    let s = super::gated("{}").await;
    let o = s.organism.clone();
    for i in 0..INPUTS {
        common::inject(&o, "a", &format!("<Note>{i}</Note>"), None);
    }
    let opened = o.clone();
    common::wait_until_async("every message held", || {
        let n = opened.inputs().open_count();
        async move { n == INPUTS }
    })
    .await;
    let page = o
        .inputs()
        .list(
            &agentserver::threads::InputFilter::default(),
            agentserver::threads::Page {
                limit: INPUTS,
                offset: 0,
            },
        )
        .unwrap();
    let ids: Vec<String> = page.items.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(ids.len(), INPUTS);
    let race = |id: String, verdict: Verdict| {
        let o = o.clone();
        let both = Arc::new(Barrier::new(2));
        let start = both.clone();
        let who = |name: &str| Decider {
            name: Some(format!("key:{name}")),
            role: agentserver::config::Role::Operator,
            tenant: None,
        };
        let (alice, bob) = (who("alice"), who("bob"));
        let other = {
            let (o, id, verdict) = (o.clone(), id.clone(), verdict.clone());
            std::thread::spawn(move || {
                start.wait();
                o.inputs()
                    .decide(&id, &bob, verdict)
                    .map(|r| r.decided_by.clone())
            })
        };
        both.wait();
        let mine = o
            .inputs()
            .decide(&id, &alice, verdict)
            .map(|r| r.decided_by.clone());
        (mine, other.join().unwrap())
    };
    for (i, id) in ids.into_iter().enumerate() {
        let verdict = if i % 2 == 0 {
            Verdict::Approve {
                reason: None,
                payload_xml: None,
            }
        } else {
            Verdict::Reject { reason: None }
        };
        let outcomes = race(id.clone(), verdict);
        let (won, lost) = match outcomes {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("input {id}: exactly one decision is taken, got {other:?}"),
        };
        match lost {
            DecideError::AlreadyDecided(first) => {
                assert_eq!(first.decided_by, won, "input {id}: told the first decision")
            }
            e => panic!("input {id}: the second decider is told the first decision, not `{e}`"),
        }
    }
}
