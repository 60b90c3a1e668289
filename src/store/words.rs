//! Each thread's short phrases once (`thread_words`, schema v23): what lets `q=` of up to
//! [`PHRASE_WORDS`] words of ASCII letters and digits count the threads that hold it by
//! reading about one index entry a thread, not one a message. The message trigger
//! (`search.rs`) hands each payload to `new_words(thread, slot, text)`, which returns only
//! what its thread has not had yet, indexed under the message's row; deleting a thread's
//! messages calls `forget_words`.
//!
//! A payload is cut into runs at ASCII characters that are not letters or digits (FTS5's
//! tokenizer cuts there and maybe elsewhere). A run of ASCII letters and digits alone (of
//! at most [`SHINGLE_RUN`] bytes) is one FTS5 word, so a phrase of such runs side by side
//! is given as one word, a shingle (`the_customer_`: `_` is a letter of this index's
//! tokenizer, never in a run, and ends every shingle, so no payload word is one): at each
//! place, the phrases that start there (keyed by the longest; the longest of each place
//! come first, in order, so a longer phrase is the longest words of its places side by
//! side when one message gave it all). A phrase that takes in another run (one that may
//! hold several words, a folded one, none, or a long one) is found by its words' places:
//! every window of
//! [`PHRASE_WORDS`] runs that hold an ASCII letter or digit (with the runs that may hold no
//! word around them) that holds such a run is given verbatim, stretches apart joined by
//! [`BARRIER`]. A phrase of at most [`PHRASE_WORDS`] words is a shingle or lies within one
//! such window, so a thread whose message holds it has given it (now or before), and
//! nothing given holds a phrase its messages do not: `q` asks for the shingle or the words
//! in order (`short_phrase`), and the barrier is a word no ASCII word folds to. A longer
//! phrase narrows the threads to check (`long_phrase`, `find.rs`).
//!
//! Which keys a thread has had are kept here, in memory, within [`WORDS_BYTES`]; a thread
//! no longer kept (pushed out, a restart, a transaction rolled back) has its text indexed
//! again, so the index may name a thread twice, never miss one: `q=` reads it as a set.

use std::sync::{Arc, Mutex};

use rusqlite::functions::FunctionFlags;

use super::coalesce::FastMap;
use crate::hash::SeededSet;

/// The most words a phrase `thread_words` answers may have: each thread keeps a key of up
/// to this many words for every place in its payloads and gives a shingle of each length
/// (longer phrases read `message_text`).
pub const PHRASE_WORDS: usize = 4;

/// The longest run given in shingles: a longer one is given verbatim, so what a payload
/// gives is at most about ten times its new text (a place's four shingles).
const SHINGLE_RUN: usize = 32;

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

impl Seen {
    /// Whether the thread has not had `key` (now had).
    fn fresh(&mut self, key: &str) -> bool {
        if self.words.contains(key) {
            return false;
        }
        self.bytes += key.len() + ENTRY_BYTES;
        self.words.insert(key.into());
        true
    }

    /// Gives, at each place of `runs` that starts a stretch of words alone (short runs of
    /// ASCII letters and digits, `pure`, one FTS5 word each) whose next [`PHRASE_WORDS`] the thread
    /// has not had, each phrase that starts there as one word: its words, lower case, each
    /// followed by `_` (so no word of a payload is one). The longest of each place go to
    /// `out` in order, places apart joined by [`BARRIER`] (so a longer phrase is the longest
    /// of its places side by side), the others to `shorter`.
    fn shingles(&mut self, runs: &[&str], pure: &[bool], out: &mut String, shorter: &mut String) {
        let mut key = String::new();
        let mut last = None;
        for p in (0..runs.len()).filter(|&p| pure[p]) {
            let most = runs.len().min(p + PHRASE_WORDS);
            let end = (p..most).find(|&i| !pure[i]).unwrap_or(most);
            key.clear();
            for run in &runs[p..end] {
                key.push_str(run);
                key.push('_');
            }
            key.make_ascii_lowercase();
            if !self.fresh(&key) {
                continue;
            }
            if last.is_some_and(|l| l + 1 != p) {
                give(out, BARRIER);
            }
            last = Some(p);
            give(out, &key);
            let mut len = 0;
            for run in &runs[p..end - 1] {
                len += run.len() + 1;
                give(shorter, &key[..len]);
            }
        }
    }

    /// Gives, verbatim, the windows of `runs` that hold a run not `pure` (a phrase across it
    /// is found by its words' places) and the thread has not had; stretches apart are joined
    /// by [`BARRIER`].
    fn verbatim(&mut self, runs: &[&str], pure: &[bool], out: &mut String) {
        // Where the stretch given last ends (a run's index, exclusive), if one was.
        let mut given = None;
        let mut key = String::new();
        for (start, end) in windows(runs).filter(|&(s, e)| !pure[s..e].iter().all(|&p| p)) {
            key.clear();
            for run in &runs[start..end] {
                if !key.is_empty() {
                    key.push(' ');
                }
                key.push_str(run);
            }
            key.make_ascii_lowercase();
            if !self.fresh(&key) {
                continue;
            }
            let from = match given {
                Some(given) if start <= given => given,
                Some(_) => {
                    give(out, BARRIER);
                    start
                }
                None => start,
            };
            for run in &runs[from..end] {
                give(out, run);
            }
            given = Some(end);
        }
    }
}

impl Generations {
    /// What of `text` `thread` has not had (its phrases as shingles, its other windows
    /// verbatim), now had.
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
        let pure: Vec<bool> = runs
            .iter()
            .map(|r| r.len() <= SHINGLE_RUN && r.bytes().all(|b| b.is_ascii_alphanumeric()))
            .collect();
        let (mut out, mut shorter, mut verbatim) = (String::new(), String::new(), String::new());
        seen.shingles(&runs, &pure, &mut out, &mut shorter);
        seen.verbatim(&runs, &pure, &mut verbatim);
        for part in [shorter, verbatim].iter().filter(|p| !p.is_empty()) {
            if !out.is_empty() {
                give(&mut out, BARRIER);
            }
            give(&mut out, part);
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

/// Appends `words` to `out`, a space between.
fn give(out: &mut String, words: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(words);
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

/// `q`'s words (ASCII letters and digits), when it is ASCII.
fn ascii_words(q: &str) -> Option<Vec<&str>> {
    q.is_ascii().then(|| {
        q.split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect()
    })
}

/// `words` as one word of `thread_words` (`the_customer_`, lower case).
fn shingle(words: &[&str]) -> String {
    let joined: String = words.iter().flat_map(|w| [w, "_"]).collect();
    joined.to_ascii_lowercase()
}

/// What `thread_words` is asked for `words` (at most [`PHRASE_WORDS`]): an FTS5 expression,
/// the phrase as one word or its words in order.
fn asked(words: &[&str]) -> String {
    format!("\"{}\" OR \"{}\"", shingle(words), words.join(" "))
}

/// What `thread_words` is asked for `q` when it answers `q`: at most [`PHRASE_WORDS`] words
/// of ASCII letters and digits (which every tokenizer keeps whole), with only ASCII between
/// them; anything else only `message_text` answers.
pub(super) fn short_phrase(q: &str) -> Option<String> {
    let words = ascii_words(q)?;
    (1..=PHRASE_WORDS)
        .contains(&words.len())
        .then(|| asked(&words))
}

/// A longer phrase of ASCII words as `thread_words` narrows it: every thread that holds it
/// holds its first [`PHRASE_WORDS`] words (`head`, an FTS5 expression), and a thread whose
/// message gave it whole holds each window of it as the longest word of places side by side
/// (`chain`, an FTS5 phrase); a thread found by `head` and not `chain` is checked in
/// `message_text`.
pub(super) struct LongPhrase {
    pub(super) head: String,
    pub(super) chain: String,
}

/// `q` as a [`LongPhrase`], when it is more than [`PHRASE_WORDS`] ASCII words.
pub(super) fn long_phrase(q: &str) -> Option<LongPhrase> {
    let words = ascii_words(q)?;
    (words.len() > PHRASE_WORDS).then(|| {
        let windows: Vec<String> = words.windows(PHRASE_WORDS).map(shingle).collect();
        LongPhrase {
            head: asked(&words[..PHRASE_WORDS]),
            chain: format!("\"{}\"", windows.join(" ")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gives_the_phrases_it_has_not_had_in_any_case() {
        let w = Words::default();
        let give = |slot, text| w.new_words(1, slot, text);
        // The longest phrase of each place first, then the shorter ones.
        assert_eq!(
            give(1, "a b c").as_deref(),
            Some("a_b_c_ b_c_ c_ \u{3c9} a_ a_b_ b_")
        );
        assert_eq!(give(2, "A-b c"), None);
        // A word more: the places it follows within a phrase's reach give again.
        let longer = Some("a_b_c_d_ b_c_d_ c_d_ d_ \u{3c9} a_ a_b_ a_b_c_ b_ b_c_ c_");
        assert_eq!(give(3, "a b c d").as_deref(), longer);
        assert_eq!(
            give(3, "a b c d").as_deref(),
            longer,
            "the same message asked about again (SQLite may): the same words"
        );
        // A run that may hide words (not ASCII): its window verbatim, with its places.
        assert_eq!(
            give(4, "x\u{2014}y z").as_deref(),
            Some("z_ \u{3c9} x\u{2014}y z")
        );
        assert_eq!(
            give(5, "z x\u{2014}Y, z").as_deref(),
            Some("z x\u{2014}Y z")
        );
        // Verbatim stretches apart are joined by the barrier.
        let words: Vec<String> = (0..2 * PHRASE_WORDS + 2).map(|i| format!("w{i}")).collect();
        let text = format!("\u{e9} {} \u{e9}", words.join(" "));
        let given = give(6, &text).unwrap();
        let verbatim = &given[given.find('\u{e9}').unwrap()..];
        assert_eq!(verbatim.matches(BARRIER).count(), 1, "{verbatim}");
        assert!(verbatim.starts_with("\u{e9} w0 w1") && verbatim.ends_with("\u{e9}"));
        // Places apart (those between had): their longest phrases joined by the barrier.
        let w2 = Words::default();
        w2.new_words(1, 1, "p q r s t u");
        let given = w2.new_words(1, 2, "X q r s t u Y").unwrap();
        assert!(
            given.starts_with("x_q_r_s_ \u{3c9} s_t_u_y_ t_u_y_ u_y_ y_ \u{3c9} x_ "),
            "{given}"
        );
        // A run too long for a shingle is given verbatim (once, not in four shingles).
        let long = "L".repeat(SHINGLE_RUN + 1);
        let given = Words::default().new_words(1, 1, &format!("x {long} y"));
        let verbatim = format!("x_ \u{3c9} y_ \u{3c9} x {long} y");
        assert_eq!(given.as_deref(), Some(verbatim.as_str()));
        // Another thread has its own phrases; a thread forgotten has them again.
        assert_eq!(w.new_words(2, 9, "a").as_deref(), Some("a_"));
        w.forget(1);
        assert_eq!(give(10, "c").as_deref(), Some("c_"));
    }

    #[test]
    fn windows_hold_phrase_words_and_the_runs_between() {
        const K: usize = PHRASE_WORDS;
        // One word more than a window holds, runs that may hold none around and between.
        let mut runs = vec!["\u{e9}", "a", "b", "\u{2014}"];
        runs.extend(["c"; K - 1]);
        runs.push("\u{2014}");
        let all: Vec<_> = windows(&runs).collect();
        assert_eq!(all, [(0, K + 2), (2, K + 4)]);
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
    fn a_longer_phrase_is_asked_by_its_head_and_its_windows() {
        let q = ["A"; PHRASE_WORDS + 2].join(" ");
        assert_eq!(short_phrase(&q), None);
        let long = long_phrase(&q).unwrap();
        let window = shingle(&["a"; PHRASE_WORDS]);
        assert_eq!(long.chain, format!("\"{window} {window} {window}\""));
        assert_eq!(long.head, asked(&["A"; PHRASE_WORDS]));
        assert!(long_phrase(&["a"; PHRASE_WORDS].join(" ")).is_none());
        assert!(long_phrase(&format!("caf\u{e9} {q}")).is_none());
    }

    #[test]
    fn short_phrases_are_ascii_words() {
        assert_eq!(
            short_phrase(" The-customer ").as_deref(),
            Some("\"the_customer_\" OR \"The customer\"")
        );
        let most = ["w"; PHRASE_WORDS].join(" ");
        for q in [" w50000 ", "two words", "a_b", "\"x\"", most.as_str()] {
            assert!(short_phrase(q).is_some(), "{q}");
        }
        let more = format!("{most} w");
        for q in [more.as_str(), "caf\u{e9}", "", "--", "\u{3c9}"] {
            assert_eq!(short_phrase(q), None, "{q}");
        }
    }
}
