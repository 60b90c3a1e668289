//! Text search: `q=` of a short phrase (each thread's text once, `thread_words`) finds
//! exactly the threads FTS5's index of every message finds, through deletes, a write rolled
//! back and a store kept by an older version.

use super::*;
use crate::threads::ThreadFilter;

/// A message of `thread` at `slot` whose payload is `<Note>{text}</Note>`.
fn note(store: &Store, thread: &str, slot: u64, text: &str) {
    store.record(
        1,
        &EventKind::Message {
            message: msg(thread, slot, "api", "g", slot).with_core(|c| {
                c.payload_xml = crate::xml::SharedXml::new(format!("<Note>{text}</Note>"))
            }),
        },
    );
}

/// The store at `path` with payload search on.
fn searching(path: &std::path::Path) -> Store {
    let store = Store::open(path).unwrap();
    store.search_payloads(true).unwrap();
    store
}

/// Threads found by `q`, as `/threads` counts them.
fn found(store: &Store, q: &str) -> u64 {
    let filter = ThreadFilter {
        q: Some(q.into()),
        ..Default::default()
    };
    store.query_threads(&filter, Page::default()).unwrap().total
}

/// Threads one of whose messages holds the words of `q` in order, by the index of every
/// message.
fn by_messages(store: &Store, q: &str) -> u64 {
    let sql = "SELECT count(*) FROM threads WHERE n IN \
               (SELECT rowid >> 32 FROM message_text WHERE message_text MATCH ?)";
    let phrase = super::super::search::phrase(q).unwrap();
    let n: i64 = store
        .read(|tx| tx.query_row(sql, [phrase], |r| r.get(0)))
        .unwrap();
    n as u64
}

/// Words and phrases: one word, phrases of up to 4 words (`thread_words`), across runs
/// that hold no word (a dash) or a word folded to ASCII (`é`), and longer or not ASCII
/// (`message_text`).
const WORDS: [&str; 24] = [
    "alpha",
    "ALPHA",
    "beta1",
    "gamma2",
    "w7",
    "w13",
    "note",
    "caf",
    "x",
    "nope",
    "\u{dc}n\u{ef}",
    "a",
    "alpha beta1",
    "cafe x",
    "a amp b",
    "b note",
    "two three",
    "six e seven",
    "four five six e",
    "seven w1",
    "w1 seven",
    "alpha one",
    "note one two three four",
    "five six \u{e9} seven w2",
];

/// Twenty threads of four messages, words repeated within and across threads, in any
/// case, cut by characters of every kind.
fn fill(store: &Store, from: usize) {
    for i in from..from + 20 {
        let t = format!("t{i}");
        thread(store, &t, ThreadStatus::Completed, 1);
        note(store, &t, 0, &format!("alpha Beta{} café-x w{i}", i % 3));
        note(store, &t, 1, &format!("ALPHA gamma{} a&amp;b", i % 5));
        note(store, &t, 2, &format!("über-Ünï ßtraße w{i} alpha"));
        let text = format!(
            "one two \u{2014} three four five six \u{e9} seven w{}",
            i % 4
        );
        note(store, &t, 3, &text);
    }
}

#[test]
fn short_phrases_find_what_the_index_of_every_message_finds() {
    let dir = tempfile::tempdir().unwrap();
    let store = searching(&dir.path().join("s.db"));
    fill(&store, 0);
    store.flush(1);
    let expect = |store: &Store| {
        for word in WORDS {
            assert_eq!(found(store, word), by_messages(store, word), "{word}");
        }
    };
    assert_eq!(found(&store, "alpha"), 20);
    assert_eq!(found(&store, "beta1"), 7);
    assert_eq!(found(&store, "w7"), 1);
    assert_eq!(found(&store, "nope"), 0);
    assert_eq!(found(&store, "two three"), 20);
    assert_eq!(found(&store, "seven w1"), 5);
    assert_eq!(found(&store, "w1 seven"), 0);
    expect(&store);
    // Pruned threads are forgotten: threads written after them have their words again.
    store.prune(Some(40), None).unwrap();
    fill(&store, 20);
    store.flush(1);
    assert_eq!(found(&store, "alpha"), 30);
    expect(&store);
    // Reopened (what was kept in memory is gone): a thread's later words are found, once.
    drop(store);
    let store = searching(&dir.path().join("s.db"));
    note(&store, "t25", 4, "alpha zebra");
    store.flush(1);
    assert_eq!((found(&store, "alpha"), found(&store, "zebra")), (30, 1));
    expect(&store);
}

#[test]
fn a_store_indexed_by_an_older_version_has_its_threads_text_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = searching(&path);
    fill(&store, 0);
    store.flush(1);
    drop(store);
    // As schema v22 left it (each thread's words alone, no phrase), then as v21 (none).
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TABLE thread_words; CREATE VIRTUAL TABLE thread_words USING fts5(text, \
         content='', contentless_delete=1, detail=none); PRAGMA user_version = 22;",
    )
    .unwrap();
    drop(conn);
    let store = searching(&path);
    assert_eq!(found(&store, "seven w1"), 5);
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TRIGGER thread_words_add; DROP TRIGGER thread_words_gone; DELETE FROM thread_words;",
    )
    .unwrap();
    drop(conn);
    let store = searching(&path);
    assert_eq!(found(&store, "w7"), 1);
    note(&store, "t3", 4, "zebra");
    store.flush(1);
    assert_eq!(found(&store, "zebra"), 1);
    for word in WORDS {
        assert_eq!(found(&store, word), by_messages(&store, word), "{word}");
    }
}

#[test]
fn words_of_a_write_that_failed_are_found_once_it_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(&dir.path().join("s.db"), Some(120)).unwrap();
    store.search_payloads(true).unwrap();
    // Payloads of a page each with no word in them: the indexes stay small.
    let big = ".".repeat(3000);
    thread(&store, "old", ThreadStatus::Completed, 1);
    for slot in 0..60 {
        note(&store, "old", slot, &big);
    }
    store.flush(1);
    assert_eq!(store.failure(), None);
    // The disk fills while thread "new" brings its words: the batch is rolled back.
    thread(&store, "new", ThreadStatus::Completed, 2);
    note(&store, "new", 0, "zebra");
    for slot in 1..60 {
        note(&store, "new", slot, &big);
    }
    crate::testing::wait_until("the write failure is reported", || {
        store.failure().is_some()
    });
    store.prune(Some(60), None).unwrap();
    crate::testing::wait_until("the held writes commit", || store.failure().is_none());
    store.flush(2);
    assert_eq!(
        found(&store, "zebra"),
        1,
        "a word of the failed write is found"
    );
    assert_eq!(by_messages(&store, "zebra"), 1);
}

/// Threads `t0`…`t{n-1}` of one message each, created in that order, every one holding
/// `all`, one in three `third` and only `t7` `w7`.
fn one_message_threads(store: &Store, n: usize) {
    for i in 0..n {
        let t = format!("t{i:03}");
        thread(store, &t, ThreadStatus::Completed, i as u64 + 1);
        let third = if i % 3 == 0 { "third" } else { "" };
        note(store, &t, 0, &format!("all {third} w{i}"));
    }
    store.flush(1);
}

/// The total `q` finds and the ids of its page.
fn ids_of(store: &Store, q: &str, page: Page) -> (u64, Vec<String>) {
    let filter = ThreadFilter {
        q: Some(q.into()),
        ..Default::default()
    };
    let p = store.query_threads(&filter, page).unwrap();
    (p.total, p.items.into_iter().map(|t| t.id).collect())
}

/// Of threads `t000`…`t599` created in that order, the page of those `keep` takes, newest
/// first: what a filter by hand finds.
fn newest(keep: &dyn Fn(usize) -> bool, page: Page) -> Vec<String> {
    (0..600)
        .rev()
        .filter(|i| keep(*i))
        .map(|i| format!("t{i:03}"))
        .skip(page.offset)
        .take(page.limit)
        .collect()
}

#[test]
fn each_way_of_reading_a_page_of_q_gives_the_same_threads_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = searching(&dir.path().join("s.db"));
    one_message_threads(&store, 600);
    let ids = |q: &str, page: Page| ids_of(&store, q, page);
    // Every thread, a page of one: each row tested against the indexes.
    for offset in [0, 1, 599] {
        let page = Page { limit: 1, offset };
        assert_eq!(ids("all", page), (600, newest(&|_| true, page)), "{offset}");
    }
    // One in three, a page of 50: the found set read once, the rows scanned in order.
    for offset in [0, 150] {
        let page = Page { limit: 50, offset };
        assert_eq!(ids("third", page), (200, newest(&|i| i % 3 == 0, page)));
    }
    // One thread: read by its number. A thread whose id holds `q` is found either way.
    let page = Page {
        limit: 50,
        offset: 0,
    };
    assert_eq!(ids("w7", page), (1, vec!["t007".to_string()]));
    assert_eq!(ids("t00", page), (10, newest(&|i| i < 10, page)));
    assert_eq!(ids("t599", page), (1, vec!["t599".to_string()]));
    // Two words in order (each thread's text), on every plan; five (every message's).
    assert_eq!(
        ids(
            "all third",
            Page {
                limit: 1,
                offset: 0
            }
        )
        .0,
        200
    );
    let first = Page {
        limit: 1,
        offset: 0,
    };
    assert_eq!(ids("Note all", first), (600, newest(&|_| true, first)));
    assert_eq!(ids("third w9", page), (1, vec!["t009".to_string()]));
    assert_eq!(ids("note all third w9 note", first).0, 1);
}

#[test]
fn distinct_threads_counts_each_number_once_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    for (values, n) in [
        ("(1),(1),(2),(5),(5),(5)", 3),
        ("(3),(1),(1),(2),(3),(2)", 3),
        ("(7)", 1),
    ] {
        let sql = format!("SELECT distinct_threads(column1) FROM (VALUES {values})");
        let got: i64 = store
            .read(|tx| tx.query_row(&sql, [], |r| r.get(0)))
            .unwrap();
        assert_eq!(got, n, "{values}");
    }
    let none: i64 = store
        .read(|tx| tx.query_row("SELECT distinct_threads(n) FROM threads", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(none, 0);
}

#[test]
fn any_short_phrase_of_any_text_finds_what_the_index_of_every_message_finds() {
    let dir = tempfile::tempdir().unwrap();
    let store = searching(&dir.path().join("s.db"));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    // Runs that hold no word (a dash), one folded to ASCII (`é`), several words in one run,
    // any case; each thread's messages are pieces of one text, so windows repeat in new
    // places.
    let words = [
        "a",
        "b",
        "C",
        "c",
        "d",
        "e",
        "f",
        "\u{2014}",
        "\u{e9}",
        "x\u{2014}a",
        "b\u{e9}",
    ];
    let mut texts = Vec::new();
    for t in 0..40 {
        let id = format!("r{t}");
        thread(&store, &id, ThreadStatus::Completed, 1);
        let base: Vec<&str> = (0..24).map(|_| words[next(words.len())]).collect();
        for slot in 0..8 {
            let mut text = Vec::new();
            for _ in 0..2 {
                let from = next(20);
                text.extend_from_slice(&base[from..(from + 2 + next(8)).min(24)]);
            }
            note(&store, &id, slot, &text.join([" ", ".", "\n"][next(3)]));
            texts.push(text);
        }
    }
    store.flush(1);
    // Phrases as payloads hold them, up to 4 words longer than `thread_words` answers alone.
    for _ in 0..400 {
        let text = &texts[next(texts.len())];
        let from = next(text.len());
        let q: Vec<String> = text[from..]
            .iter()
            .map(|w| w.replace('\u{2014}', " ").replace('\u{e9}', "e"))
            .collect();
        let q = q.join(" ");
        let most = super::super::words::PHRASE_WORDS + 4;
        let q: Vec<&str> = q.split_whitespace().take(1 + next(most)).collect();
        let q = q.join(" ");
        if q.is_empty() {
            continue;
        }
        assert_eq!(found(&store, &q), by_messages(&store, &q), "{q}");
        // With another filter too (every thread is completed).
        let filter = ThreadFilter {
            q: Some(q.clone()),
            status: Some(ThreadStatus::Completed),
            ..Default::default()
        };
        let total = store.query_threads(&filter, Page::default()).unwrap().total;
        assert_eq!(total, by_messages(&store, &q), "{q} completed");
    }
}

#[test]
fn a_phrase_whose_pieces_a_thread_had_apart_is_found() {
    use super::super::words::PHRASE_WORDS as K;
    let dir = tempfile::tempdir().unwrap();
    let store = searching(&dir.path().join("s.db"));
    let words = |first: &str, from: usize, to: usize| -> String {
        (from..to)
            .map(|i| format!("{first}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The longest phrase, across a run that holds no word (a dash): each window of as many
    // runs had before, the phrase only in the last message.
    let dash = "\u{2014}";
    thread(&store, "dash", ThreadStatus::Completed, 1);
    let texts = [
        format!("p0 {dash} {} x", words("p", 1, K - 1)),
        format!("y {dash} {}", words("p", 1, K)),
        format!("p0 {dash} {}", words("p", 1, K)),
    ];
    // A word more than that: each phrase of its words but the whole had before.
    thread(&store, "more", ThreadStatus::Completed, 1);
    let more = [
        format!("{} x", words("f", 0, K)),
        format!("y {}", words("f", 1, K + 1)),
        format!("z {}", words("f", 0, K + 1)),
    ];
    for slot in 0..3 {
        note(&store, "dash", slot as u64, &texts[slot]);
        note(&store, "more", slot as u64, &more[slot]);
    }
    // A longer phrase's windows given in one message at places apart (those between had
    // before): not side by side, so not the phrase.
    thread(&store, "apart", ThreadStatus::Completed, 1);
    let middle = words("b", 1, K);
    note(&store, "apart", 0, &format!("{middle} Z {middle}"));
    note(&store, "apart", 1, &format!("a0 {middle} Z {middle} e"));
    // A word too long for a shingle: found by its place.
    let long = "L".repeat(40);
    thread(&store, "long", ThreadStatus::Completed, 1);
    note(
        &store,
        "long",
        0,
        &format!("x {long} y {}", words("g", 0, K)),
    );
    // Two words in one run (no tag around them either).
    thread(&store, "run", ThreadStatus::Completed, 1);
    store.record(
        1,
        &EventKind::Message {
            message: msg("run", 0, "api", "g", 0)
                .with_core(|c| c.payload_xml = crate::xml::SharedXml::new(format!("q{dash}r"))),
        },
    );
    store.flush(1);
    let with_long = [
        long.clone(),
        format!("x {long} y"),
        format!("{long} y {}", words("g", 0, K)),
    ];
    for q in [words("p", 0, K), words("f", 0, K + 1), "q r".into()]
        .into_iter()
        .chain(with_long)
    {
        assert_eq!((found(&store, &q), by_messages(&store, &q)), (1, 1), "{q}");
    }
    let q = format!("a0 {middle} e");
    assert_eq!((found(&store, &q), by_messages(&store, &q)), (0, 0), "{q}");
    // The longer phrase is checked message by message in that thread: within the budget.
    store.set_read_budget(std::time::Duration::ZERO);
    let filter = ThreadFilter {
        q: Some(words("f", 0, K + 1)),
        ..Default::default()
    };
    let e = store.query_threads(&filter, Page::default()).unwrap_err();
    assert!(e.timed_out, "{e}");
}

#[test]
fn each_way_of_reading_a_page_of_a_longer_phrase_gives_the_same_threads_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = searching(&dir.path().join("s.db"));
    for i in 0..600 {
        let t = format!("t{i:03}");
        thread(&store, &t, ThreadStatus::Completed, i as u64 + 1);
        let third = if i % 3 == 0 { "v w x y z" } else { "" };
        note(&store, &t, 0, &format!("a b c d e {third} n{i}"));
    }
    store.flush(1);
    let ids = |q: &str, page: Page| ids_of(&store, q, page);
    // Every thread, a page of one (the first threads walked); one in three, pages of 50
    // (the found set scanned); one thread (looked up).
    for offset in [0, 1, 599] {
        let page = Page { limit: 1, offset };
        assert_eq!(ids("a b c d e", page), (600, newest(&|_| true, page)));
    }
    for offset in [0, 150] {
        let page = Page { limit: 50, offset };
        let third = |i: usize| i.is_multiple_of(3);
        assert_eq!(ids("e v w x y z", page), (200, newest(&third, page)));
    }
    let page = Page {
        limit: 50,
        offset: 0,
    };
    assert_eq!(
        ids("c d e v w x y z n9", page),
        (1, vec!["t009".to_string()])
    );
    assert_eq!(ids("c d e n10 note", page), (1, vec!["t010".to_string()]));
}
