//! The frames a `/ws/messages` session holds before queueing them, so that a message's
//! status change that comes meanwhile goes in the message's frame (one frame instead of two,
//! rendered once for every client: `api::frame::merged_frame`), and frames go out together.
//!
//! Each frame is held one whole period ([`HOLD`]) or up to two: at the end of a period the
//! frames held through all of it go out, in order, and the others wait for the next end. An
//! answer to a command, a gap's notice and the server's stop send every frame held first, so
//! `seq` never goes back and a reader's count stays exact. A status event names the `seq` of
//! its message's event (`StatusAbout::message_seq`), and held frames are in `seq` order: the
//! message's frame is found exactly, by a search that starts where evenly spaced seqs would
//! put it. A message's frame is held as its event in the hub (`None`), and only taken from
//! there when a status change merges into it or it goes out: most are merged, so most
//! sessions never take a reference to the message's own frame.

use std::collections::VecDeque;
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use tokio::time::Instant;

/// How long one holding period of a `/ws/messages` session lasts: a frame waits one or two.
pub const HOLD: Duration = Duration::from_millis(10);

/// Frames a session holds, at most: past that, they all go out (a replay goes out in turns of
/// this many).
const HELD_MAX: usize = 4096;

/// The frames a session holds, not yet queued, in `seq` order.
#[derive(Default)]
pub(super) struct Held {
    /// A message's frame is `None` until a status change merges into it, or until it goes
    /// out: it is the hub's (its event's frame), taken from there only then.
    frames: VecDeque<Option<Utf8Bytes>>,
    /// Beside each frame, its event's `seq << 1`, `| 1` for a message's frame: what a search
    /// reads, packed (a search reads a few of them, not the frames).
    seqs: VecDeque<u64>,
    /// The first this many of `frames` have been held through a whole period.
    older: usize,
    /// The end of the current period.
    pub(super) until: Option<Instant>,
}

pub(super) struct HeldFrame {
    /// `None`: the frame of the message event `seq`, as the hub holds it.
    pub(super) frame: Option<Utf8Bytes>,
    pub(super) seq: u64,
    /// A message's frame (which a status change may go into).
    pub(super) message: bool,
}

impl Held {
    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frame held for the message event `seq`, if any. Held seqs rise at nearly even
    /// steps, so the search starts where `seq` would be if they were even, gallops towards
    /// it (steps doubling), then halves the last step: a few looks, where a search from
    /// either end takes a dozen or more.
    pub(super) fn message(&self, seq: u64) -> Option<usize> {
        let len = self.seqs.len();
        let first = self.seqs.front()? >> 1;
        let last = self.seqs.back()? >> 1;
        if seq < first || seq > last {
            return None;
        }
        let at = |i: usize| self.seqs[i] >> 1;
        let span = (last - first).max(1);
        let guess = (seq - first)
            .checked_mul(len as u64 - 1)
            .and_then(|p| usize::try_from(p / span).ok())
            .map_or(len - 1, |g| g.min(len - 1));
        // Then `at(lo) <= seq < at(hi)`, `hi == len` standing for past the end.
        let (mut lo, mut hi) = if at(guess) <= seq {
            let (mut lo, mut step) = (guess, 1);
            loop {
                let next = lo + step;
                if next >= len || at(next) > seq {
                    break (lo, next.min(len));
                }
                lo = next;
                step *= 2;
            }
        } else {
            // `at(0) == first <= seq`: the walk back stops at 0 at the latest.
            let (mut hi, mut step) = (guess, 1);
            loop {
                let prev = hi.saturating_sub(step);
                if at(prev) <= seq {
                    break (prev, hi);
                }
                hi = prev;
                step *= 2;
            }
        };
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at(mid) <= seq {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (self.seqs[lo] == ((seq << 1) | 1)).then_some(lo)
    }

    /// The frame held at `i` (`None`: its message's frame, still the hub's).
    pub(super) fn frame(&self, i: usize) -> Option<&Utf8Bytes> {
        self.frames.get(i).and_then(Option::as_ref)
    }

    /// Holds `frame` at `i` instead of what was there.
    pub(super) fn replace(&mut self, i: usize, frame: Utf8Bytes) {
        if let Some(f) = self.frames.get_mut(i) {
            *f = Some(frame);
        }
    }

    /// Holds the frame of event `seq`; true when the session holds as many as it may and must
    /// send them.
    pub(super) fn push(&mut self, frame: Option<Utf8Bytes>, seq: u64, message: bool) -> bool {
        if self.until.is_none() {
            self.until = Some(Instant::now() + HOLD);
        }
        self.frames.push_back(frame);
        self.seqs.push_back((seq << 1) | u64::from(message));
        self.frames.len() >= HELD_MAX
    }

    /// The next frame to send at the end of a period (one held through all of it); `None`
    /// once they are out, and the others wait for the next end.
    pub(super) fn next_due(&mut self) -> Option<HeldFrame> {
        if self.older == 0 {
            self.older = self.frames.len();
            self.until = (!self.frames.is_empty()).then(|| Instant::now() + HOLD);
            return None;
        }
        self.older -= 1;
        self.pop()
    }

    fn pop(&mut self) -> Option<HeldFrame> {
        let frame = self.frames.pop_front()?;
        let seq = self.seqs.pop_front()?;
        Some(HeldFrame {
            frame,
            seq: seq >> 1,
            message: seq & 1 == 1,
        })
    }

    /// The next frame held, to send now (every one goes).
    pub(super) fn next(&mut self) -> Option<HeldFrame> {
        let next = self.pop();
        if next.is_none() {
            self.older = 0;
            self.until = None;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::Held;

    /// The search from the newest frames finds exactly what a binary search finds: every
    /// message frame held, and nothing for a `seq` not held or not a message's.
    #[test]
    fn a_held_message_is_found_by_its_seq_and_nothing_else_is() {
        for len in 0..40u64 {
            let mut held = Held::default();
            // Every third seq is missing, and past the middle the steps grow (uneven
            // spacing); every fourth frame is not a message's.
            let seqs: Vec<u64> = (1..=len * 3 / 2)
                .filter(|s| s % 3 != 0)
                .map(|s| if s > len / 2 { s * s } else { s })
                .collect();
            for (i, &s) in seqs.iter().enumerate() {
                held.push(Some(s.to_string().into()), s, i % 4 != 3);
            }
            for seq in 0..=(len * 3 / 2).pow(2) + 1 {
                let expected = seqs
                    .iter()
                    .position(|&s| s == seq)
                    .filter(|i| i % 4 != 3)
                    .map(|_| seq.to_string());
                let found = held
                    .message(seq)
                    .and_then(|i| held.frame(i))
                    .map(|f| f.as_str().to_string());
                assert_eq!(found, expected, "{len} frames, seq {seq}");
            }
        }
    }
}
