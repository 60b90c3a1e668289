//! A stream's accounting under overload: every reader is told what it missed, up to the
//! close. Readers that do not read while the pump runs overflow their queues on purpose;
//! when the server stops, each one's message frames plus the messages its `dropped` frames
//! announce equal the messages logged.

use agentserver::api::ApiOptions;
use agentserver::Organism;
use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

/// What one reader got until its close: message frames, and the `dropped` frames' sums.
#[derive(Debug, Default)]
struct Tally {
    messages: u64,
    dropped_messages: u64,
    lagged: u64,
    close: Option<CloseCode>,
    /// The last `seq` a frame showed (a `dropped` frame's `to_seq`).
    last_seq: u64,
}

async fn tally(mut ws: Ws) -> Tally {
    let mut t = Tally::default();
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let f: Value = serde_json::from_str(text.as_str()).unwrap();
                // Every frame comes in `seq` order, and a gap's notice between the frames
                // before the gap and those after it.
                let first = f["from_seq"].as_u64().or(f["seq"].as_u64());
                if let Some(first) = first {
                    assert!(first > t.last_seq, "{f} after seq {}", t.last_seq);
                    t.last_seq = f["seq"].as_u64().unwrap_or(first);
                }
                match f["event"].as_str() {
                    Some("message") => t.messages += 1,
                    Some("dropped") => {
                        let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k}: {f}"));
                        assert!(n("messages") + n("lagged") <= n("count"), "{f}");
                        t.dropped_messages += n("messages");
                        t.lagged += n("lagged");
                    }
                    _ => {}
                }
            }
            Some(Ok(Message::Close(c))) => {
                t.close = c.map(|c| c.code);
                return t;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return t,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn overloaded_readers_are_told_every_message_they_missed_up_to_the_close() {
    // Queues full by bytes: a few large frames at a time.
    overloaded_readers(64 * 1024, &"z".repeat(16_000)).await;
}

/// Small frames overflow a queue of 32 frames in the middle of what a `/ws/messages` session
/// held through a period and queues together: the frames that fit go, the others are
/// announced, in `seq` order.
#[tokio::test(flavor = "multi_thread")]
async fn readers_overloaded_by_frame_count_are_told_what_they_missed_in_order() {
    overloaded_readers(16 * 1024 * 1024, "z").await;
}

async fn overloaded_readers(queue_bytes: usize, text: &str) {
    let s = crate::chain_with_small_queues(32, queue_bytes).await;
    let readers = connect(&s, 20).await;
    // Nobody reads while the pump runs: every queue overflows.
    let logged = burst(&s, |_| format!("<Note>{text}</Note>")).await;

    // The server stops while its readers are far behind; then they read.
    let Served {
        server, organism, ..
    } = s;
    let stopping = tokio::spawn(server.shutdown());
    let tallies = futures_util::future::join_all(readers.into_iter().map(tally)).await;
    stopping.await.unwrap();
    organism.stop().await;
    for t in &tallies {
        assert!(t.dropped_messages > 0, "the overload happened: {t:?}");
        exact(t, logged);
    }
}

/// `n` readers of `/ws/messages`, each past its `connected` frame.
async fn connect(s: &Served, n: usize) -> Vec<Ws> {
    let mut readers = Vec::new();
    for _ in 0..n {
        let mut ws = ws_connect(&s.ws_url("/ws/messages")).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        readers.push(ws);
    }
    readers
}

/// Injects 300 threads at once (payload `note(i)`) and waits for them: the messages logged.
async fn burst(s: &Served, note: impl Fn(usize) -> String) -> u64 {
    let threads: Vec<String> = (0..300)
        .map(|i| {
            inject(&s.organism, "a", &note(i), None)
                .thread_id
                .to_string()
        })
        .collect();
    for t in &threads {
        settle(&s.organism, t).await;
    }
    let logged = s.organism.info().total_messages;
    assert_eq!(logged, 900);
    logged
}

/// A reader closed at the server's stop, told every message it missed: exactly, or within
/// what it lagged behind the hub (events of kinds it cannot know).
fn exact(t: &Tally, logged: u64) {
    assert_eq!(t.close, Some(CloseCode::Away), "{t:?}");
    let told = t.messages + t.dropped_messages;
    if t.lagged == 0 {
        assert_eq!(told, logged, "{t:?}");
    } else {
        assert!(told <= logged && logged <= told + t.lagged, "{t:?}");
    }
}

/// A `/ws/messages` session holds a message's frame as its event in the hub, taken from
/// there when it goes out. A hub of 64 events lets go of most of a burst before the
/// sessions' holding periods end: what they held and can no longer take is announced with
/// what they lagged behind, and each reader's count stays exact.
#[tokio::test(flavor = "multi_thread")]
async fn held_messages_the_hub_let_go_of_are_announced() {
    let s = serve_with(
        Organism::builder().event_capacity(64),
        "  max_pending_messages: 100000",
        CHAIN,
        ApiOptions::default(),
    )
    .await;
    let readers: Vec<_> = (connect(&s, 5).await.into_iter())
        .map(|ws| tokio::spawn(tally(ws)))
        .collect();
    let logged = burst(&s, |i| format!("<Note>{i}</Note>")).await;
    let Served {
        server, organism, ..
    } = s;
    server.shutdown().await;
    organism.stop().await;
    let mut missed = 0;
    for r in readers {
        let t = r.await.unwrap();
        exact(&t, logged);
        missed += logged - t.messages;
    }
    assert!(
        missed > 0,
        "the hub let go of events the readers had not sent"
    );
}
