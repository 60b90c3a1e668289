//! Each thread's payload words, once (`thread_words`, schema v22): what lets `q=` with one
//! word count the threads that hold it by reading one index entry a thread, not one a
//! message. The message trigger (`search.rs`) hands each payload to `new_words(thread,
//! slot, text)`, which returns only the runs of the text its thread has not had yet, and
//! indexes those under the message's row; deleting a thread's messages calls
//! `forget_words`.
//!
//! Which words a thread has had is kept here, in memory, within [`WORDS_BYTES`]; a thread
//! no longer kept (pushed out, a restart, a transaction rolled back) has its words indexed
//! again, so the index may name a thread twice, never miss one: `q=` reads it as a set. The
//! runs are cut only at ASCII characters that are not letters or digits (FTS5's
//! tokenizer cuts there and maybe elsewhere), so a run left out holds exactly the index
//! terms of a run indexed before.

use std::sync::{Arc, Mutex};

use rusqlite::functions::FunctionFlags;

use super::coalesce::FastMap;
use crate::hash::SeededSet;

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
    /// The runs of `text` that `thread` has not had, now had.
    fn add(&mut self, thread: i64, text: &str) -> Option<String> {
        let mut seen = match self.now.remove(&thread) {
            Some(seen) => {
                self.bytes -= seen.bytes;
                seen
            }
            None => self.old.remove(&thread).unwrap_or_default(),
        };
        let mut out = String::new();
        for run in text
            .split(|c: char| c.is_ascii() && !c.is_ascii_alphanumeric())
            .filter(|r| !r.is_empty())
        {
            let key = run.to_ascii_lowercase();
            if seen.words.contains(key.as_str()) {
                continue;
            }
            seen.bytes += key.len() + ENTRY_BYTES;
            seen.words.insert(key.into_boxed_str());
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(run);
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

/// `q` as `thread_words` can find it: one word of ASCII letters and digits (which every
/// tokenizer keeps whole); none for anything else, which only `message_text` answers.
pub(super) fn one_word(q: &str) -> Option<&str> {
    let q = q.trim();
    (!q.is_empty() && q.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_s_words_are_given_once_in_any_case() {
        let w = Words::default();
        assert_eq!(
            w.new_words(1, 1, "<Note>the Customer, the café</Note>")
                .as_deref(),
            Some("Note the Customer café")
        );
        assert_eq!(
            w.new_words(1, 2, "<note>CUSTOMER new</note>").as_deref(),
            Some("new")
        );
        assert_eq!(
            w.new_words(1, 2, "<note>CUSTOMER new</note>").as_deref(),
            Some("new"),
            "the same message asked about again (SQLite may): the same words"
        );
        assert_eq!(w.new_words(1, 3, "<Note>the</Note>"), None);
        // Another thread has its own words; a thread forgotten has them again.
        assert_eq!(w.new_words(2, 4, "the").as_deref(), Some("the"));
        w.forget(1);
        assert_eq!(w.new_words(1, 5, "the").as_deref(), Some("the"));
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
    fn one_word_is_ascii_letters_and_digits() {
        assert_eq!(one_word(" w50000 "), Some("w50000"));
        for q in ["two words", "café", "a-b", "", "x\"y"] {
            assert_eq!(one_word(q), None, "{q}");
        }
    }
}
