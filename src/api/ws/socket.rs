//! A session's two socket tasks: the writer drains its queue into the socket, the reader
//! hands the client's frames to the session.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::frames::frame_len;
use super::protocol_close;

/// Frames written to a client's socket per flush, at most.
const WRITE_BATCH: usize = 256;

/// The writer task: drains a session's queue into its socket. Frames already queued go out
/// together: fed one by one, flushed (written to the socket) once, so a busy client costs
/// one write per batch, not per frame. Each batch has `write_timeout`; the bytes it carried
/// are paid back to `queued`. Ends at a close frame, a failed write or the queue's end.
pub(super) async fn write_frames(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Message>,
    writer_queued: Arc<AtomicUsize>,
    write_timeout: Duration,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(msg) => batch.push(msg),
                Err(_) => break,
            }
        }
        let len: usize = batch.iter().map(frame_len).sum();
        let closing = batch.iter().any(|m| matches!(m, Message::Close(_)));
        let frames = std::mem::take(&mut batch);
        let sent = tokio::time::timeout(write_timeout, async {
            for msg in frames {
                let last = matches!(msg, Message::Close(_));
                sink.feed(msg).await?;
                if last {
                    break;
                }
            }
            sink.flush().await
        })
        .await;
        writer_queued.fetch_sub(len, Ordering::Relaxed);
        if !matches!(sent, Ok(Ok(()))) || closing {
            break;
        }
    }
    let _ = tokio::time::timeout(write_timeout, sink.close()).await;
}

/// The reader task: a client's frames into `in_tx` (`None` once it is gone); a protocol
/// error becomes the close frame it owes (1009, 1007, 1002).
pub(super) async fn read_frames(
    mut stream: SplitStream<WebSocket>,
    in_tx: mpsc::Sender<Option<Message>>,
) {
    loop {
        match stream.next().await {
            Some(Ok(msg)) => {
                if in_tx.send(Some(msg)).await.is_err() {
                    return;
                }
            }
            // A protocol error ends the session with its close code.
            Some(Err(e)) => {
                if let Some(frame) = protocol_close(e) {
                    let _ = in_tx.send(Some(Message::Close(Some(frame)))).await;
                }
                break;
            }
            None => break,
        }
    }
    let _ = in_tx.send(None).await;
}
