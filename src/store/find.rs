//! `q=` on `/threads` through the text indexes (`search.rs` keeps them): a thread is found
//! by its id, error or labels (`thread_text`, trigrams: 3 characters or more) or by its
//! payloads' words in order (a phrase of up to `words::PHRASE_WORDS` ASCII words through
//! `thread_words`, about an index entry a thread; anything else through `message_text`, one
//! a message, except that a longer phrase of ASCII words is looked for in `thread_words`
//! first and only the threads it cannot settle are checked message by message:
//! `long_found`). With `q` the only filter, [`q_plan`] counts from the indexes alone and
//! picks how to read the page.

use rusqlite::functions::{Aggregate, Context, FunctionFlags};
use rusqlite::types::Value as V;

use super::search::phrase;
use super::words::LongPhrase;

/// The threads (their numbers, as `t`) whose id, error or labels hold the text bound at its
/// `?` (3 characters or more).
const NAMED: &str = "SELECT rowid AS t FROM thread_text WHERE thread_text MATCH ?";

/// The index of payloads that answers `q` and what it is asked: `thread_words` for a short
/// phrase of ASCII words (`words::short_phrase`), `message_text` for anything else (`q`'s
/// `phrase`). Either's row is a message's (`thread << 32 | slot`), in thread order.
fn payload_index(q: &str, phrase: &str) -> (&'static str, String) {
    match super::words::short_phrase(q) {
        Some(asked) => ("thread_words", asked),
        None => ("message_text", phrase.to_owned()),
    }
}

/// The threads (their numbers as `t`, some more than once) one of whose messages' payloads
/// the index `ix` finds for the phrase bound at its `?`.
fn in_payloads(ix: &str) -> String {
    format!("SELECT rowid >> 32 AS t FROM {ix} WHERE {ix} MATCH ?")
}

/// `q` as a clause on `threads`: its id, error and labels hold it, or (with the setting on,
/// `payloads`) its payloads hold its words in order.
pub(super) fn q_clause(w: &mut super::Where, q: &str, payloads: bool) {
    // The labels' set is read once (not per thread): a scan of `thread_labels`.
    let mentions = "instr(id, ?) > 0 OR instr(COALESCE(error, ''), ?) > 0 OR n IN \
         (SELECT thread FROM thread_labels WHERE instr(key, ?) > 0 OR instr(value, ?) > 0)";
    let text = std::iter::repeat_n(V::Text(q.to_owned()), 4);
    if let Some(phrase) = indexed(q, payloads) {
        // Both indexes: no thread is read but those they name.
        let (ix, asked) = payload_index(q, &phrase);
        w.and(
            format!("(n IN ({NAMED}) OR n IN ({}))", in_payloads(ix)),
            [V::Text(phrase), V::Text(asked)],
        )
    } else if let Some(phrase) = phrase(q).filter(|_| payloads) {
        let (ix, asked) = payload_index(q, &phrase);
        w.and(
            format!("({mentions} OR n IN ({}))", in_payloads(ix)),
            text.chain([V::Text(asked)]),
        )
    } else {
        w.and(format!("({mentions})"), text)
    }
}

/// Whether `q`, with other filters, is a longer phrase of ASCII words that [`long_clause`]
/// adds in the read (found through `thread_words` first, as when alone).
pub(super) fn long_apart(q: &str, payloads: bool) -> bool {
    indexed(q, payloads).is_some() && super::words::long_phrase(q).is_some()
}

/// `q`'s clause when [`long_apart`]: the threads [`long_found`] finds, by number.
pub(super) fn long_clause(
    tx: &rusqlite::Transaction<'_>,
    q: &str,
    w: &mut super::Where,
    deadline: std::time::Instant,
) -> rusqlite::Result<()> {
    let (Some(phrase), Some(long)) = (phrase(q), super::words::long_phrase(q)) else {
        return Ok(());
    };
    let found = long_found(tx, &phrase, &long, deadline)?;
    among(w, "n", &found);
    Ok(())
}

/// Adds to `w` that `column` (`n`, or `+n` to read rows in `created_at` order) is one of
/// the thread numbers `found` (bound as JSON, which `json_each` reads).
fn among(w: &mut super::Where, column: &str, found: &[i64]) {
    let numbers = serde_json::to_string(found).unwrap_or_else(|_| "[]".into());
    w.and(
        format!("{column} IN (SELECT value FROM json_each(?))"),
        [V::Text(numbers)],
    );
}

/// `q` as the phrase both indexes look for, when together they answer it: the setting on
/// (`payloads`) and 3 characters or more (the trigrams' least).
fn indexed(q: &str, payloads: bool) -> Option<String> {
    phrase(q).filter(|_| payloads && q.chars().count() >= 3)
}

/// `q` when it is `/threads`'s only filter and the indexes answer it all (the setting on,
/// 3 characters or more): [`q_plan`] counts and pages it.
pub(super) fn q_alone(filter: &crate::threads::ThreadFilter, payloads: bool) -> Option<&str> {
    let alone = super::thread_fields::labels_and_q_only(filter) && filter.labels.is_empty();
    let q = filter.q.as_deref()?;
    (alone && indexed(q, payloads).is_some()).then_some(q)
}

/// A page found by testing rows one by one costs about this many times a row of the found
/// set read whole (measured: 40–60 µs for both indexes' tests against 0.1 µs).
const PROBE_COST: u64 = 400;

/// Counts the threads `q` finds from the indexes alone (each thread once; no thread row is
/// read), and adds `q`'s clause to `w` in the form that reads the page cheapest: when so
/// many threads match that the page is among the first few rows in `created_at` order,
/// each row is tested against the indexes (`EXISTS`, a look-up each); when a short scan
/// finds it, the found set is read once and the rows scanned in order; otherwise the rows
/// are read by their numbers from the found set and sorted.
pub(super) fn q_plan(
    tx: &rusqlite::Transaction<'_>,
    q: &str,
    page: crate::threads::Page,
    w: &mut super::Where,
    deadline: std::time::Instant,
) -> rusqlite::Result<u64> {
    use super::thread_fields::{query_count, rows_before_page, SCAN_ROWS};
    let phrase = phrase(q).unwrap_or_default();
    let (ix, asked) = payload_index(q, &phrase);
    let payload = in_payloads(ix);
    // A longer phrase of ASCII words: its threads found through `thread_words` first.
    let long = match super::words::long_phrase(q) {
        Some(long) => Some(long_found(tx, &phrase, &long, deadline)?),
        None => None,
    };
    let matched = match &long {
        Some(found) => found.len() as u64,
        None => query_count(
            tx,
            &format!("SELECT distinct_threads(t) FROM ({NAMED} UNION ALL {payload})"),
            [&phrase, &asked],
        )?,
    };
    let all = query_count(tx, "SELECT COUNT(*) FROM threads", [])?;
    let rows = rows_before_page(page, all, matched);
    let probe = rows.is_some_and(|r| r.saturating_mul(PROBE_COST) <= matched);
    if let Some(found) = long {
        // The found set, or when the page is among the first rows, those of its threads up
        // to the page's end (a look-up each).
        match probe {
            true => among(w, "n", &first_in_order(tx, &found, page, deadline)?),
            false if rows.is_some_and(|r| r <= SCAN_ROWS) => among(w, "+n", &found),
            false => among(w, "n", &found),
        }
        return Ok(matched);
    }
    let clause = if probe {
        format!(
            "(EXISTS (SELECT 1 FROM thread_text WHERE thread_text MATCH ? AND rowid = threads.n) \
             OR EXISTS (SELECT 1 FROM {ix} WHERE {ix} MATCH ? \
             AND rowid BETWEEN threads.n << 32 AND (threads.n << 32) + 4294967295))"
        )
    } else if rows.is_some_and(|r| r <= SCAN_ROWS) {
        // `+n`: not through the numbers' index, so rows are read in `created_at` order.
        format!("(+n IN ({NAMED}) OR +n IN ({payload}))")
    } else {
        format!("(n IN ({NAMED}) OR n IN ({payload}))")
    };
    w.and(clause, [V::Text(phrase), V::Text(asked)]);
    Ok(matched)
}

/// The threads (their numbers, in order) `q` finds when it is a [`LongPhrase`] (`phrase`
/// is `q` for `message_text`): those whose id, error or labels hold it, those whose message
/// gave it whole (`chain`), and of those that hold its first words (`head`) and are neither,
/// the ones `message_text` finds it in, checked one by one until `deadline` (then the read
/// fails as interrupted, as SQLite's own check of `limits.max_query_ms` fails it).
fn long_found(
    tx: &rusqlite::Transaction<'_>,
    phrase: &str,
    long: &LongPhrase,
    deadline: std::time::Instant,
) -> rusqlite::Result<Vec<i64>> {
    let threads = |sql: &str, asked: &str| -> rusqlite::Result<Vec<i64>> {
        let mut all: Vec<i64> = tx
            .prepare_cached(sql)?
            .query_map([asked], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        all.dedup();
        Ok(all)
    };
    let words = in_payloads("thread_words");
    let mut found = threads(NAMED, phrase)?;
    found.extend(threads(&words, &long.chain)?);
    found.sort_unstable();
    found.dedup();
    let mut holds = tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM message_text WHERE message_text MATCH ?1 \
         AND rowid BETWEEN ?2 << 32 AND (?2 << 32) + 4294967295)",
    )?;
    let mut checked = Vec::new();
    for t in threads(&words, &long.head)? {
        if found.binary_search(&t).is_ok() {
            continue;
        }
        if std::time::Instant::now() >= deadline {
            return Err(interrupted());
        }
        if holds.query_row(rusqlite::params![phrase, t], |r| r.get(0))? {
            checked.push(t);
        }
    }
    found.extend(checked);
    found.sort_unstable();
    Ok(found)
}

/// The first of the threads `found` (their numbers, in order) in `/threads`'s order, up to
/// the end of `page`, walking the threads newest first until `deadline`.
fn first_in_order(
    tx: &rusqlite::Transaction<'_>,
    found: &[i64],
    page: crate::threads::Page,
    deadline: std::time::Instant,
) -> rusqlite::Result<Vec<i64>> {
    let want = page.offset.saturating_add(page.limit);
    let walk = format!(
        "SELECT n FROM threads ORDER BY {}",
        super::query::THREAD_ORDER
    );
    let mut walk = tx.prepare_cached(&walk)?;
    let mut rows = walk.query([])?;
    let mut first = Vec::new();
    let mut walked = 0u32;
    while first.len() < want {
        let Some(row) = rows.next()? else { break };
        let n: i64 = row.get(0)?;
        if found.binary_search(&n).is_ok() {
            first.push(n);
        }
        walked = walked.wrapping_add(1);
        if walked.is_multiple_of(1024) && std::time::Instant::now() >= deadline {
            return Err(interrupted());
        }
    }
    Ok(first)
}

/// The error of a read stopped past its budget (as SQLite's progress handler stops one).
fn interrupted() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
        None,
    )
}

/// `distinct_threads(t)`: how many different numbers it is given, in one pass when they
/// come in order (each run counted once, as an index's rows of a thread come); numbers out
/// of order are sorted at the end. It holds 8 bytes a thread found.
struct DistinctThreads;

#[derive(Default)]
struct Runs {
    last: Option<i64>,
    firsts: Vec<i64>,
    sorted: bool,
}

impl Aggregate<Runs, i64> for DistinctThreads {
    fn init(&self, _: &mut Context<'_>) -> rusqlite::Result<Runs> {
        Ok(Runs {
            sorted: true,
            ..Runs::default()
        })
    }

    fn step(&self, ctx: &mut Context<'_>, runs: &mut Runs) -> rusqlite::Result<()> {
        let t: i64 = ctx.get(0)?;
        if runs.last != Some(t) {
            runs.sorted &= runs.last.is_none_or(|last| last < t);
            runs.firsts.push(t);
            runs.last = Some(t);
        }
        Ok(())
    }

    fn finalize(&self, _: &mut Context<'_>, runs: Option<Runs>) -> rusqlite::Result<i64> {
        let Some(mut runs) = runs else { return Ok(0) };
        if !runs.sorted {
            runs.firsts.sort_unstable();
            runs.firsts.dedup();
        }
        Ok(runs.firsts.len() as i64)
    }
}

/// Makes `distinct_threads` callable on `conn`.
pub(super) fn register(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.create_aggregate_function(
        "distinct_threads",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        DistinctThreads,
    )
}
