//! The frames a `/ws/messages` session holds before queueing them, so that a message's
//! status change that comes meanwhile goes in the message's frame (one frame instead of two,
//! rendered once for every client: `api::frame::merged_frame`), and frames go out together.
//!
//! Each frame is held one whole period ([`HOLD`]) or up to two: at the end of a period the
//! frames held through all of it go out, in order, and the others wait for the next end. An
//! answer to a command, a gap's notice and the server's stop send every frame held first, so
//! `seq` never goes back and a reader's count stays exact.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use tokio::time::Instant;

use crate::api::frame::frame_of;

/// How long one holding period of a `/ws/messages` session lasts: a frame waits one or two.
pub const HOLD: Duration = Duration::from_millis(10);

/// Frames a session holds, at most: past that, they all go out (a replay goes out in turns of
/// this many).
const HELD_MAX: usize = 4096;

/// Places in a session's index of held message frames (a power of two).
const INDEX: usize = 2048;

/// The frames a session holds, not yet queued.
#[derive(Default)]
pub(super) struct Held {
    frames: VecDeque<HeldFrame>,
    /// Frames sent so far (wrapping): a frame's position is this plus its place in `frames`.
    sent: u32,
    /// The first this many of `frames` have been held through a whole period.
    older: usize,
    /// A message frame's position, by the address of the message's id (the id every event
    /// about the message shares; not cloned, as 50 sessions cloning one `Arc` contend for its
    /// count). Direct-mapped: a message whose place another took is not found, and its
    /// status change goes in a frame of its own. Made on first use.
    index: Vec<u32>,
    /// The end of the current period.
    pub(super) until: Option<Instant>,
}

struct HeldFrame {
    frame: Utf8Bytes,
    seq: u64,
    /// A message's frame: the address of its id.
    message: Option<usize>,
}

impl Held {
    fn place(id: &Arc<str>) -> (usize, usize) {
        let at = Arc::as_ptr(id).cast::<u8>() as usize;
        (at, (at >> 4 ^ at >> 15) & (INDEX - 1))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frame held for message `id`, if any.
    pub(super) fn message(&mut self, id: &Arc<str>) -> Option<&mut Utf8Bytes> {
        let (at, place) = Self::place(id);
        let pos = *self.index.get(place)?;
        let i = pos.wrapping_sub(self.sent) as usize;
        let held = self.frames.get_mut(i).filter(|h| h.message == Some(at))?;
        // The address may be another message's by now, if the first one's events were all
        // freed: the frame must be this message's.
        frame_of(&held.frame, id).then_some(&mut held.frame)
    }

    /// Holds the frame of event `seq` (a message's, with its id); true when the session
    /// holds as many as it may and must send them.
    pub(super) fn push(&mut self, frame: Utf8Bytes, seq: u64, message: Option<&Arc<str>>) -> bool {
        if self.until.is_none() {
            self.until = Some(Instant::now() + HOLD);
        }
        self.put(frame, seq, message);
        self.frames.len() >= HELD_MAX
    }

    /// The end of a period: the frames held through all of it, to send now; the others wait
    /// for the next end.
    pub(super) fn due(&mut self) -> Vec<(Utf8Bytes, u64, bool)> {
        let due = self.take(self.older);
        self.older = self.frames.len();
        self.until = (!self.frames.is_empty()).then(|| Instant::now() + HOLD);
        due
    }

    /// Every frame held, to send now.
    pub(super) fn all(&mut self) -> Vec<(Utf8Bytes, u64, bool)> {
        let all = self.take(self.frames.len());
        self.older = 0;
        self.until = None;
        all
    }

    /// The first `n` frames (each with its event's `seq` and whether it is a message's).
    fn take(&mut self, n: usize) -> Vec<(Utf8Bytes, u64, bool)> {
        self.sent = self.sent.wrapping_add(n as u32);
        self.frames
            .drain(..n)
            .map(|h| (h.frame, h.seq, h.message.is_some()))
            .collect()
    }

    fn put(&mut self, frame: Utf8Bytes, seq: u64, message: Option<&Arc<str>>) {
        let message = message.map(|id| {
            let (at, place) = Self::place(id);
            if self.index.is_empty() {
                self.index = vec![u32::MAX; INDEX];
            }
            self.index[place] = self.sent.wrapping_add(self.frames.len() as u32);
            at
        });
        self.frames.push_back(HeldFrame {
            frame,
            seq,
            message,
        });
    }
}
