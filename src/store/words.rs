//! Each thread's payload text once (`thread_words`, schema v23): what lets `q=` of a short
//! phrase (up to [`PHRASE_WORDS`] words of ASCII letters and digits) count the threads that
//! hold it by reading about one index entry a thread, not one a message. The message
//! trigger (`search.rs`) hands each payload to `new_words(thread, slot, text)`, which
//! returns only the stretches of the text its thread has not had yet, and indexes those
//! under the message's row; deleting a thread's messages calls `forget_words`.
//!
//! A payload is cut into runs at ASCII characters that are not letters or digits (FTS5's
//! tokenizer cuts there and maybe elsewhere). Every window of [`PHRASE_WORDS`] runs that
//! hold an ASCII letter or digit (with the runs that may hold no word around them) is a
//! key; a message gives the windows its thread has not had, verbatim, stretches apart
//! joined by [`BARRIER`]. A phrase of at most [`PHRASE_WORDS`] words lies within one
//! window, so a thread whose message holds it has given that window (now or before), and
//! nothing given holds a phrase its messages do not: the barrier is a word no ASCII word
//! folds to.
//!
//! Which windows a thread has had is kept here, in memory, within [`WORDS_BYTES`]; a thread
//! no longer kept (pushed out, a restart, a transaction rolled back) has its text indexed
//! again, so the index may name a thread twice, never miss one: `q=` reads it as a set.

use std::sync::{Arc, Mutex};

use rusqlite::functions::FunctionFlags;

use super::coalesce::FastMap;
use crate::hash::SeededSet;

/// The most words a phrase `thread_words` answers may have: each thread keeps a key of
/// this many words for every place in its payloads (longer phrases read `message_text`).
pub const PHRASE_WORDS: usize = 4;

/// What separates two stretches of one payload given together: a word of a letter that no
/// ASCII word folds to, so no phrase `thread_words` is asked for runs across it.
const BARRIER: &str = "\u{3c9}";

/// Bytes of words kept in memory, across threads (the newest half kept whole when full;
/// past it by one payload's words at most).
pub const WORDS_BYTES: usize = 16 << 20;

/// What each entry costs beyond its bytes (set slot, box), counted against [`WORDS_BYTES`].
const ENTRY_BYTES: usize = 32;

#[derive(Default)]
struct Seen {
    words: SeededSet<Box<str>>,
    bytes: usize,
}

#[derive(Default)]
struct Generations {
    /// The threads written to since `old` was started; `bytes` counts theirs.
    now: FastMap<i64, Seen>,
    old: FastMap<i64, Seen>,
    bytes: usize,
    /// The last message asked about (thread, slot) and the answer: SQLite may evaluate the
    /// trigger's call more than once, and each must get the same words.
    last: Option<(i64, i64, Option<String>)>,
}

/// The words each recent thread has had (shared by the store's connections).
#[derive(Clone, Default)]
pub(super) struct Words(Arc<Mutex<Generations>>);

impl Words {
    /// Forgets every thread (their next words are indexed again).
    pub(super) fn clear(&self) {
        if let Ok(mut g) = self.0.lock() {
            *g = Generations::default();
        }
    }

    fn forget(&self, thread: i64) {
        if let Ok(mut g) = self.0.lock() {
            g.old.remove(&thread);
            g.last = None;
            if let Some(seen) = g.now.remove(&thread) {
                g.bytes -= seen.bytes;
            }
        }
    }

    /// The runs of `text` (the payload of message `slot`) that `thread` has not had before
    /// that message, separated by spaces (none if none).
    fn new_words(&self, thread: i64, slot: i64, text: &str) -> Option<String> {
        let Ok(mut g) = self.0.lock() else {
            return Some(text.to_owned());
        };
        let g = &mut *g;
        match &g.last {
            Some((t, s, words)) if (*t, *s) == (thread, slot) => return words.clone(),
            _ => {}
        }
        let out = g.add(thread, text);
        g.last = Some((thread, slot, out.clone()));
        out
    }
}

impl Generations {
    /// The stretches of `text` whose windows `thread` has not had, now had.
    fn add(&mut self, thread: i64, text: &str) -> Option<String> {
        let mut seen = match self.now.remove(&thread) {
            Some(seen) => {
                self.bytes -= seen.bytes;
                seen
            }
            None => self.old.remove(&thread).unwrap_or_default(),
        };
        let runs: Vec<&str> = text
            .split(|c: char| c.is_ascii() && !c.is_ascii_alphanumeric())
            .filter(|r| !r.is_empty())
            .collect();
        let mut out = String::new();
        // Where the stretch given last ends (a run's index, exclusive).
        let mut given = 0;
        let mut key = String::new();
        for (start, end) in windows(&runs) {
            key.clear();
            for run in &runs[start..end] {
                if !key.is_empty() {
                    key.push(' ');
                }
                key.push_str(run);
            }
            key.make_ascii_lowercase();
            if seen.words.contains(key.as_str()) {
                continue;
            }
            seen.bytes += key.len() + ENTRY_BYTES;
            seen.words.insert(key.as_str().into());
            let from = if out.is_empty() || start > given {
                if !out.is_empty() {
                    out.push(' ');
                    out.push_str(BARRIER);
                }
                start
            } else {
                given
            };
            for run in &runs[from..end] {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(run);
            }
            given = end;
        }
        self.bytes += seen.bytes;
        self.now.insert(thread, seen);
        if self.bytes > WORDS_BYTES / 2 {
            self.old = std::mem::take(&mut self.now);
            self.bytes = 0;
        }
        (!out.is_empty()).then_some(out)
    }
}

/// The windows of `runs` (first run, end exclusive), in order: each holds [`PHRASE_WORDS`]
/// runs with an ASCII letter or digit (FTS5 makes a word of each), the runs without one
/// between them and those beside them up to the next run with one (they may hold no word,
/// so a phrase may span them); all the runs when fewer have one. Starts and ends rise.
fn windows(runs: &[&str]) -> impl Iterator<Item = (usize, usize)> + use<> {
    let len = runs.len();
    let solid: Vec<usize> = (0..len)
        .filter(|&i| runs[i].bytes().any(|b| b.is_ascii_alphanumeric()))
        .collect();
    let whole = solid.len() <= PHRASE_WORDS;
    let count = if len == 0 {
        0
    } else {
        solid.len().saturating_sub(PHRASE_WORDS) + 1
    };
    (0..count).map(move |j| {
        if whole {
            return (0, len);
        }
        let start = j.checked_sub(1).map_or(0, |p| solid[p] + 1);
        let end = solid.get(j + PHRASE_WORDS).copied().unwrap_or(len);
        (start, end)
    })
}

impl Words {
    /// Makes `new_words` and `forget_words` callable on `conn` (its triggers call them);
    /// on the writer's (`rolled_back`), every thread is forgotten when a transaction is
    /// rolled back.
    pub(super) fn register(
        &self,
        conn: &mut rusqlite::Connection,
        rolled_back: bool,
    ) -> rusqlite::Result<()> {
        let words = self.clone();
        conn.create_scalar_function("new_words", 3, FunctionFlags::SQLITE_UTF8, move |ctx| {
            let (thread, slot) = (ctx.get(0)?, ctx.get(1)?);
            let text = ctx.get_raw(2);
            let text = text.as_str_or_null()?.unwrap_or("");
            Ok(words.new_words(thread, slot, text))
        })?;
        let words = self.clone();
        conn.create_scalar_function("forget_words", 1, FunctionFlags::SQLITE_UTF8, move |ctx| {
            words.forget(ctx.get(0)?);
            Ok(None::<i64>)
        })?;
        if rolled_back {
            let words = self.clone();
            conn.rollback_hook(Some(move || words.clear()))?;
        }
        Ok(())
    }
}

/// Whether `thread_words` answers `q`: at most [`PHRASE_WORDS`] words of ASCII letters and
/// digits (which every tokenizer keeps whole), with only ASCII between them; anything else
/// only `message_text` answers.
pub(super) fn short_phrase(q: &str) -> bool {
    let words = q
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .count();
    q.is_ascii() && (1..=PHRASE_WORDS).contains(&words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gives_the_windows_it_has_not_had_in_any_case() {
        let w = Words::default();
        let give = |slot, text| w.new_words(1, slot, text);
        assert_eq!(
            give(1, "a b c d e f g h").as_deref(),
            Some("a b c d e f g h")
        );
        assert_eq!(give(2, "A-b c d e f g h"), None);
        // A new end gives its last window; a new start its first.
        assert_eq!(give(3, "a b c d e f g X").as_deref(), Some("e f g X"));
        assert_eq!(give(4, "Y b c d e f g h").as_deref(), Some("Y b c d"));
        assert_eq!(
            give(4, "Y b c d e f g h").as_deref(),
            Some("Y b c d"),
            "the same message asked about again (SQLite may): the same words"
        );
        // Stretches that touch are given as one; apart, with the barrier between.
        assert_eq!(
            give(5, "Z b c d e f g W").as_deref(),
            Some("Z b c d e f g W")
        );
        assert_eq!(
            give(6, "Q b c d e f g h i j V").as_deref(),
            Some("Q b c d \u{3c9} f g h i j V")
        );
        // Runs that may hold no word stay inside the windows beside them.
        assert_eq!(
            give(7, "k l m n \u{2014} o").as_deref(),
            Some("k l m n \u{2014} o")
        );
        assert_eq!(give(8, "l m n \u{2014} o"), None);
        // Another thread has its own windows; a thread forgotten has them again.
        assert_eq!(w.new_words(2, 9, "a b").as_deref(), Some("a b"));
        w.forget(1);
        assert_eq!(give(10, "a b c d").as_deref(), Some("a b c d"));
    }

    #[test]
    fn windows_hold_phrase_words_and_the_runs_between() {
        let runs = ["\u{e9}", "a", "b", "\u{2014}", "c", "d", "e", "\u{2014}"];
        let all: Vec<_> = windows(&runs).collect();
        assert_eq!(all, [(0, 6), (2, 8)]);
        assert_eq!(windows(&["a", "b"]).collect::<Vec<_>>(), [(0, 2)]);
        assert_eq!(windows(&[]).count(), 0);
    }

    #[test]
    fn memory_stays_within_its_bytes() {
        let w = Words::default();
        for t in 0..200_000i64 {
            w.new_words(t, 0, &format!("word{t} other{t} third{t}"));
        }
        let g = w.0.lock().unwrap();
        let total: usize = g.now.values().chain(g.old.values()).map(|s| s.bytes).sum();
        assert!(total <= WORDS_BYTES, "{total}");
    }

    #[test]
    fn short_phrases_are_ascii_words() {
        for q in [
            " w50000 ",
            "two words",
            "a-b",
            "\"the customer\"",
            "a b c d",
        ] {
            assert!(short_phrase(q), "{q}");
        }
        for q in ["a b c d e", "caf\u{e9}", "", "--", "\u{3c9}"] {
            assert!(!short_phrase(q), "{q}");
        }
    }
}
