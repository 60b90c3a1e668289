//! A stream's accounting under overload: every reader is told what it missed, up to the
//! close. Readers that do not read while the pump runs overflow their queues on purpose;
//! when the server stops, each one's message frames plus the messages its `dropped` frames
//! announce equal the messages logged.

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
    let s = crate::chain_with_small_queues(32, 64 * 1024).await;
    const READERS: usize = 20;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut ws = ws_connect(&s.ws_url("/ws/messages")).await;
        assert_eq!(next_json(&mut ws).await["event"], "connected");
        readers.push(ws);
    }
    // Nobody reads while the pump runs: every queue overflows.
    let note = format!("<Note>{}</Note>", "z".repeat(16_000));
    let threads: Vec<String> = (0..300)
        .map(|_| inject(&s.organism, "a", &note, None).thread_id.to_string())
        .collect();
    for t in &threads {
        settle(&s.organism, t).await;
    }
    let logged = s.organism.info().total_messages;
    assert_eq!(logged, 900);

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
        assert_eq!(t.close, Some(CloseCode::Away), "{t:?}");
        if t.lagged == 0 {
            assert_eq!(t.messages + t.dropped_messages, logged, "{t:?}");
        } else {
            assert!(
                t.messages + t.dropped_messages <= logged
                    && logged <= t.messages + t.dropped_messages + t.lagged,
                "{t:?}"
            );
        }
    }
}
