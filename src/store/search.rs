//! Text search (`organism.search.payload_text`): FTS5 indexes kept by triggers while the
//! setting is on, so the writer's own work is unchanged and nothing is written while it is
//! off: the words of every message's payload (`message_text`, schema v20, by the message's
//! thread and slot, so a match names its thread with no other read), each thread's text
//! once (`thread_words`, v23, `words.rs`), and each thread's id, error and labels by
//! trigram (`thread_text`, v21, by the thread's number), none keeping a copy of the text.
//! Turned off, the triggers go and the indexes are emptied; turned on, threads are indexed
//! at once and messages from then on. `q=` on `/threads` then finds a thread by its id,
//! error or labels through the trigrams (a substring of 3 characters or more, in any case)
//! and by its payloads' words in order (an FTS5 phrase): up to `words::PHRASE_WORDS`
//! words of ASCII letters and digits through `thread_words`, anything else through
//! `message_text`; a shorter `q` reads every thread, as without the setting.

use std::sync::atomic::Ordering;

use super::{Store, StoreError};

/// A thread row's text as `thread_text` keeps it, for a row named `t`.
macro_rules! thread_text {
    ($t:literal) => {
        concat!(
            $t,
            ".id || ' ' || COALESCE(",
            $t,
            ".error, '') || ' ' || COALESCE((SELECT \
             group_concat(key || ' ' || value, ' ') FROM json_each(",
            $t,
            ".labels)), '')"
        )
    };
}

/// The threads' text, indexed when the setting is turned on (the triggers then keep it).
const FILL: &str = concat!(
    "DELETE FROM thread_text; INSERT INTO thread_text(rowid, text) SELECT n, ",
    thread_text!("threads"),
    " FROM threads;"
);

const THREAD_TRIGGERS: &str = concat!(
    "CREATE TRIGGER IF NOT EXISTS thread_text_add AFTER INSERT ON threads BEGIN
  INSERT INTO thread_text(rowid, text) VALUES (new.n, ",
    thread_text!("new"),
    ");
END;
CREATE TRIGGER IF NOT EXISTS thread_text_change AFTER UPDATE OF error, labels ON threads
  WHEN old.error IS NOT new.error OR old.labels IS NOT new.labels BEGIN
  DELETE FROM thread_text WHERE rowid = old.n;
  INSERT INTO thread_text(rowid, text) VALUES (new.n, ",
    thread_text!("new"),
    ");
END;
CREATE TRIGGER IF NOT EXISTS thread_text_gone AFTER DELETE ON threads BEGIN
  DELETE FROM thread_text WHERE rowid = old.n;
END;"
);

const ON: &str = "
CREATE TRIGGER IF NOT EXISTS message_text_add AFTER INSERT ON messages BEGIN
  INSERT INTO message_text(rowid, text)
    VALUES ((new.thread << 32) | new.slot_index, new.payload_xml);
END;
CREATE TRIGGER IF NOT EXISTS message_text_gone AFTER DELETE ON messages BEGIN
  DELETE FROM message_text WHERE rowid = (old.thread << 32) | old.slot_index;
END;";

/// Each thread's text once (`words.rs`), from the messages `message_text` holds.
const WORDS_FILL: &str = "
DELETE FROM thread_words;
INSERT INTO thread_words(rowid, text)
  SELECT (thread << 32) | slot_index, w FROM (
    SELECT thread, slot_index, new_words(thread, slot_index, payload_xml) AS w FROM messages
    WHERE ((thread << 32) | slot_index) IN (SELECT rowid FROM message_text)
    ORDER BY thread, slot_index)
  WHERE w IS NOT NULL;";

/// And from then on, as messages are written and deleted.
const WORDS_TRIGGERS: &str = "
CREATE TRIGGER IF NOT EXISTS thread_words_add AFTER INSERT ON messages BEGIN
  INSERT INTO thread_words(rowid, text)
    SELECT (new.thread << 32) | new.slot_index, w
    FROM (SELECT new_words(new.thread, new.slot_index, new.payload_xml) AS w) WHERE w IS NOT NULL;
END;
CREATE TRIGGER IF NOT EXISTS thread_words_gone AFTER DELETE ON messages BEGIN
  DELETE FROM thread_words WHERE rowid = (old.thread << 32) | old.slot_index;
  SELECT forget_words(old.thread);
END;";

const OFF: &str = "
DROP TRIGGER IF EXISTS message_text_add;
DROP TRIGGER IF EXISTS message_text_gone;
DELETE FROM message_text;
DROP TRIGGER IF EXISTS thread_words_add;
DROP TRIGGER IF EXISTS thread_words_gone;
DELETE FROM thread_words;
DROP TRIGGER IF EXISTS thread_text_add;
DROP TRIGGER IF EXISTS thread_text_change;
DROP TRIGGER IF EXISTS thread_text_gone;
DELETE FROM thread_text;";

/// `q` as an FTS5 phrase (its words in order, whatever characters it holds); none when it
/// has no word to look for.
pub(super) fn phrase(q: &str) -> Option<String> {
    q.chars()
        .any(char::is_alphanumeric)
        .then(|| format!("\"{}\"", q.replace('"', "\"\"")))
}

impl Store {
    /// Keeps the payload index (`on`) or stops keeping it and empties it.
    pub fn search_payloads(&self, on: bool) -> Result<(), StoreError> {
        let done = self.read(|tx| {
            // Kept already, or not: a start with the setting as it was writes nothing, and
            // threads are indexed when it is turned on.
            let kept = |trigger: &str| -> rusqlite::Result<bool> {
                tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' \
                     AND name = ?1)",
                    [trigger],
                    |r| r.get(0),
                )
            };
            // A change starts from no remembered words (what an earlier time on left, or
            // what the index has: the fill's), and forgets them again if it fails.
            let change = |batches: &[&str]| -> rusqlite::Result<()> {
                self.words.clear();
                batches.iter().try_for_each(|b| tx.execute_batch(b))
            };
            match (on, kept("thread_text_add")?) {
                (true, false) => change(&[FILL, ON, THREAD_TRIGGERS, WORDS_TRIGGERS]),
                // A store kept by an older version: its threads' words from its index.
                (true, true) if !kept("thread_words_add")? => change(&[WORDS_FILL, WORDS_TRIGGERS]),
                (false, true) => change(&[OFF]),
                _ => Ok(()),
            }
        });
        if done.is_err() {
            self.words.clear();
        }
        done?;
        self.payload_search.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `q=` looks in payloads' text.
    pub(super) fn searches_payloads(&self) -> bool {
        self.payload_search.load(Ordering::Relaxed)
    }
}
