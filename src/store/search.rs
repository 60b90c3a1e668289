//! Payload text search (`organism.search.payload_text`): an FTS5 index of the words of
//! every message's payload (`message_text`, schema v20, keyed by the message's `seq`, no
//! copy of the text), kept by triggers on `messages` while the setting is on, so the
//! writer's own work is unchanged and nothing is written while it is off. Turned off, the
//! triggers go and the index is emptied; turned on, messages are indexed from then on.
//! `q=` on `/threads` then also finds a thread one of whose payloads holds its words, in
//! order (an FTS5 phrase).

use std::sync::atomic::Ordering;

use super::{Store, StoreError};

/// The threads (their numbers) one of whose messages' payloads holds the phrase bound
/// at its `?`.
pub(super) const THREADS_MATCHING: &str = "(SELECT thread FROM messages WHERE seq IN \
     (SELECT rowid FROM message_text WHERE message_text MATCH ?))";

const ON: &str = "
CREATE TRIGGER IF NOT EXISTS message_text_add AFTER INSERT ON messages BEGIN
  INSERT INTO message_text(rowid, text) VALUES (new.seq, new.payload_xml);
END;
CREATE TRIGGER IF NOT EXISTS message_text_gone AFTER DELETE ON messages BEGIN
  DELETE FROM message_text WHERE rowid = old.seq;
END;";

const OFF: &str = "
DROP TRIGGER IF EXISTS message_text_add;
DROP TRIGGER IF EXISTS message_text_gone;
DELETE FROM message_text;";

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
        self.read(|tx| tx.execute_batch(if on { ON } else { OFF }))?;
        self.payload_search.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `q=` looks in payloads' text.
    pub(super) fn searches_payloads(&self) -> bool {
        self.payload_search.load(Ordering::Relaxed)
    }
}
