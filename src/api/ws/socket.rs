//! A session's two socket tasks: the writer drains its queue into the socket, the reader
//! hands the client's frames to the session.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::frames::frame_len;
use super::protocol_close;

/// Frames the writer takes from the queue at once, at least (a session's held frames go as
/// one [`Out::Texts`]).
const WRITE_BATCH: usize = 256;

/// Frames of one [`Out::Texts`] written to the socket per flush, at most: the client starts
/// reading while the rest is copied, and each frame is copied while it is still in the
/// cache (ws50: 2 % less CPU per hop than one flush per entry; BENCHMARKS.md).
const FLUSH_EVERY: usize = 96;

/// What a session queues for its writer: one frame, or text frames that go out together
/// (the frames a `/ws/messages` session held through a period): one place in the queue and
/// one wake-up of the writer for all of them.
pub(super) enum Out {
    One(Message),
    Texts { texts: Vec<Utf8Bytes>, bytes: usize },
}

impl From<Message> for Out {
    fn from(m: Message) -> Self {
        Out::One(m)
    }
}

impl Out {
    pub(super) fn frames(&self) -> usize {
        match self {
            Out::One(_) => 1,
            Out::Texts { texts, .. } => texts.len(),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Out::One(m) => frame_len(m),
            Out::Texts { bytes, .. } => *bytes,
        }
    }
}

/// What a session's queue holds now: frames not yet taken by the writer, and bytes not yet
/// written. The session adds what it queues; the writer pays frames back as it takes them,
/// bytes once they are written. Both are bounded (`ApiOptions::client_queue`,
/// `client_queue_bytes`).
#[derive(Default)]
pub(super) struct Queued {
    frames: AtomicUsize,
    bytes: AtomicUsize,
}

impl Queued {
    pub(super) fn frames(&self) -> usize {
        self.frames.load(Ordering::Relaxed)
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(super) fn add(&self, out: &Out) {
        self.frames.fetch_add(out.frames(), Ordering::Relaxed);
        self.bytes.fetch_add(out.bytes(), Ordering::Relaxed);
    }

    /// `frames` were taken from the queue by the writer.
    fn taken(&self, frames: usize) {
        self.frames.fetch_sub(frames, Ordering::Relaxed);
    }

    /// `bytes` were written (or given up on).
    fn written(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The writer task: drains a session's queue into its socket. Frames already queued go out
/// together: fed one by one, flushed (written to the socket) once per [`FLUSH_EVERY`]
/// frames and at the end, so a busy client costs a write per many frames, not per frame.
/// Each batch has `write_timeout`; its frames are paid
/// back to `queued` as they are taken, its bytes once written. Ends at a close frame, a
/// failed write or the queue's end.
pub(super) async fn write_frames(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Out>,
    queued: Arc<Queued>,
    write_timeout: Duration,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while let Some(first) = rx.recv().await {
        let mut frames = first.frames();
        batch.push(first);
        while frames < WRITE_BATCH {
            match rx.try_recv() {
                Ok(out) => {
                    frames += out.frames();
                    batch.push(out);
                }
                Err(_) => break,
            }
        }
        queued.taken(frames);
        let bytes: usize = batch.iter().map(Out::bytes).sum();
        let closing = batch
            .iter()
            .any(|o| matches!(o, Out::One(Message::Close(_))));
        let taken = std::mem::take(&mut batch);
        let sent = tokio::time::timeout(write_timeout, async {
            for out in taken {
                match out {
                    Out::One(msg) => {
                        let last = matches!(msg, Message::Close(_));
                        sink.feed(msg).await?;
                        if last {
                            break;
                        }
                    }
                    Out::Texts { texts, .. } => {
                        for (i, text) in texts.into_iter().enumerate() {
                            sink.feed(Message::Text(text)).await?;
                            if (i + 1) % FLUSH_EVERY == 0 {
                                sink.flush().await?;
                            }
                        }
                    }
                }
            }
            sink.flush().await
        })
        .await;
        queued.written(bytes);
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
