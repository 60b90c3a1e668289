//! What a batch writes, and the coalescing that lets a message written twice in one batch
//! be stored once (with its last status).

use super::*;

/// Maps keyed by small integer tuples or by the organism's own names (agents and payload
/// types, in the writer's name cache), hashed a word at a time (the multiply-rotate scheme
/// of Firefox's hash) at a fraction of SipHash's cost.
pub(super) type FastMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<WordHash>>;

#[derive(Default)]
pub(super) struct WordHash(u64);

impl WordHash {
    pub(super) fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for WordHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.mix(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the writer writes for one operation, or for several coalesced: borrowed from the
/// batch's events.
#[derive(Clone, Copy)]
pub(super) enum Write<'a> {
    Message {
        m: &'a MessageRecord,
        /// The message's status and error, or those of a later change in the same batch.
        status: MessageStatus,
        error: Option<&'a str>,
        /// The `seq` of the event that published it.
        event_seq: u64,
    },
    Status {
        id: &'a str,
        thread_id: &'a str,
        status: MessageStatus,
        error: Option<&'a str>,
        /// When the change was published.
        at: Timestamp,
    },
    Thread {
        id: &'a str,
        status: ThreadStatus,
        message_count: u64,
        /// Given when the thread is created.
        created_at: Option<Timestamp>,
        error: Option<&'a str>,
        /// Its last activity: the latest time of the events folded into this write.
        at: Timestamp,
        /// Its tenant, given when the thread is created for one.
        owner: Option<&'a str>,
    },
    /// A thread with messages (or status changes) in a batch that has no thread write of
    /// its own: its row's count rises to at least `message_count`, its last activity to at
    /// least `at` (the time of the latest of them), and it takes `error` if it has none (a
    /// thread's error is the first its messages met, as in memory). Thread events come with
    /// thread status changes only, so without this a running thread would show the count and
    /// time of its creation, and a killed one no error.
    Touch {
        id: &'a str,
        message_count: u64,
        error: Option<&'a str>,
        at: Timestamp,
    },
    Seq(u64),
    /// An input opened (`input_requested`) with its decision when the same batch holds it
    /// (inserted decided: one row written, not two), and one decided (`input_resolved`).
    InputOpened(
        &'a crate::threads::InputRow,
        Option<&'a crate::threads::InputRow>,
    ),
    InputDecided(&'a crate::threads::InputRow),
    /// An idempotency key's record, and the time before which older ones go.
    Key(&'a super::idempotency::KeyRow, Timestamp),
    /// A call to a model, and when it was published.
    Usage(&'a crate::events::Usage, Timestamp),
    /// A thread's new `settings`.
    Settings(&'a str, Option<&'a crate::threads::ThreadSettings>),
    /// A thread's labels now.
    Labels(&'a str, Option<&'a crate::threads::Labels>),
    /// A thread rewound.
    Rewound(&'a str, crate::threads::Rewind),
    /// Listeners' work, and when it was taken.
    Work(&'a [super::usage::WorkRow], Timestamp),
}

impl<'a> Write<'a> {
    /// Folds a touch into this write of a thread (or touch of it): the larger count, the
    /// later time, the first error. False if this is no thread's write.
    pub(super) fn touch(&mut self, count: u64, e: Option<&'a str>, t: Timestamp) -> bool {
        match self {
            Write::Thread {
                message_count,
                error,
                at,
                ..
            }
            | Write::Touch {
                message_count,
                error,
                at,
                ..
            } => {
                *message_count = (*message_count).max(count);
                *error = error.or(e);
                *at = (*at).max(t);
                true
            }
            _ => false,
        }
    }

    pub(super) fn of(op: &'a Op) -> Option<Write<'a>> {
        let event = match op {
            Op::Event(event) => event,
            Op::Seq(s) => return Some(Write::Seq(*s)),
            Op::Key(k) => return Some(Write::Key(&k.0, k.1)),
            Op::Work(w) => return Some(Write::Work(&w.0, w.1)),
            Op::Flush(_) | Op::Prune { .. } => return None,
        };
        Some(match &event.kind {
            EventKind::Message { message: m } => Write::Message {
                m,
                status: m.status,
                error: m.error.as_deref(),
                event_seq: event.seq,
            },
            EventKind::MessageStatus {
                id,
                thread_id,
                status,
                error,
                ..
            } => Write::Status {
                id,
                thread_id,
                status: *status,
                error: error.as_deref(),
                at: event.timestamp,
            },
            EventKind::ThreadCreated { thread: t } => Write::Thread {
                id: &t.id,
                status: t.status,
                message_count: t.message_count,
                created_at: Some(t.created_at),
                error: t.error.as_deref(),
                at: t.last_activity,
                owner: t.owner.as_deref(),
            },
            EventKind::ThreadUpdated {
                thread_id,
                status,
                message_count,
                error,
                ..
            } => Write::Thread {
                id: thread_id,
                status: *status,
                message_count: *message_count,
                created_at: None,
                error: error.as_deref(),
                at: event.timestamp,
                owner: None,
            },
            EventKind::InputRequested { input } => Write::InputOpened(input, None),
            EventKind::InputResolved { input } => Write::InputDecided(input),
            EventKind::Usage(u) => Write::Usage(u, event.timestamp),
            EventKind::ThreadSettings {
                thread_id,
                settings,
            } => Write::Settings(thread_id, settings.as_deref()),
            EventKind::ThreadLabels { thread_id, labels } => {
                Write::Labels(thread_id, labels.as_deref())
            }
            EventKind::ThreadRewound {
                thread_id, rewind, ..
            } => Write::Rewound(thread_id, *rewind),
            _ => return None,
        })
    }
}

/// A batch's writes, fewer than its operations but writing the same: a status change of a
/// message inserted in the same batch becomes part of the insert, as does the decision of an
/// input opened in it, and a thread written
/// several times is written once, in the place of its first write, with its last state (and
/// its first `created_at`), so the thread row exists before the batch's messages name it.
/// Keeps its buffers from batch to batch: a batch's worth of new memory each time (about
/// 1 MB at 8,192 operations) came fresh from the OS, and the writer spent a tenth of its time
/// in the page faults that zeroed it.
#[derive(Default)]
pub(super) struct Coalescer {
    /// Empty between batches; its allocation is what is kept.
    pub(super) writes: Vec<Write<'static>>,
    /// For each operation of the last batch, the write it went into (none for a flush).
    pub(super) into: Vec<Option<usize>>,
    /// Positions in `writes` of the batch's message inserts, by message id, and of its
    /// thread writes, by thread id (ids clients can choose: hashed with a per-map seed).
    pub(super) messages: hashbrown::HashTable<usize>,
    pub(super) threads: hashbrown::HashTable<usize>,
    /// Positions of the batch's inputs opened, by input id.
    pub(super) inputs: hashbrown::HashTable<usize>,
    pub(super) seed: crate::hash::SeededState,
}

impl Coalescer {
    /// The batch's writes; `self.into` says which write each operation went into. Give the
    /// writes back with [`Coalescer::recycle`].
    pub(super) fn coalesce<'a>(&mut self, batch: &'a [Op]) -> Vec<Write<'a>> {
        let mut writes: Vec<Write<'a>> = std::mem::take(&mut self.writes);
        let Coalescer {
            into,
            messages,
            threads,
            inputs,
            seed,
            ..
        } = self;
        into.clear();
        messages.clear();
        threads.clear();
        inputs.clear();
        let mut index = Index {
            messages,
            threads,
            inputs,
            seed,
        };
        for op in batch {
            let Some(w) = Write::of(op) else {
                into.push(None);
                continue;
            };
            index.touch(&mut writes, &w);
            let earlier = index.earlier(&writes, &w);
            let unmerged = match earlier {
                Some(at) => merge(&mut writes[at], w).err(),
                None => Some(w),
            };
            match unmerged {
                None => into.push(earlier),
                Some(w) => {
                    into.push(Some(writes.len()));
                    writes.push(w);
                }
            }
        }
        writes
    }

    /// Takes back a batch's writes, keeping their allocation for the next batch. (An emptied
    /// vector's iterator collected into a vector of the same layout reuses its allocation;
    /// were it not to, the next batch would only allocate anew.)
    pub(super) fn recycle(&mut self, mut writes: Vec<Write<'_>>) {
        writes.clear();
        self.writes = writes.into_iter().map(|_| Write::Seq(0)).collect();
    }
}

/// Where a batch's message inserts (by message id) and thread writes (by thread id) are in
/// its writes.
struct Index<'m> {
    messages: &'m mut hashbrown::HashTable<usize>,
    threads: &'m mut hashbrown::HashTable<usize>,
    inputs: &'m mut hashbrown::HashTable<usize>,
    seed: &'m crate::hash::SeededState,
}

fn message_id<'a>(w: &Write<'a>) -> &'a str {
    match w {
        Write::Message { m, .. } => &m.id,
        _ => "",
    }
}

fn input_id<'a>(w: &Write<'a>) -> &'a str {
    match w {
        Write::InputOpened(r, _) => &r.id,
        _ => "",
    }
}

fn thread_id<'a>(w: &Write<'a>) -> &'a str {
    match w {
        Write::Thread { id, .. } | Write::Touch { id, .. } => id,
        _ => "",
    }
}

impl Index<'_> {
    fn hash(&self, id: &str) -> u64 {
        std::hash::BuildHasher::hash_one(self.seed, id)
    }

    /// The batch's write of `thread` so far.
    fn thread(&self, writes: &[Write<'_>], thread: &str) -> Option<usize> {
        self.threads
            .find(self.hash(thread), |&i| thread_id(&writes[i]) == thread)
            .copied()
    }

    /// Records that the thread write at `at` (about to be pushed) is `thread`'s.
    fn add_thread(&mut self, writes: &[Write<'_>], thread: &str, at: usize) {
        let seed = self.seed;
        let hash = |id: &str| std::hash::BuildHasher::hash_one(seed, id);
        self.threads
            .insert_unique(hash(thread), at, |&i| hash(thread_id(&writes[i])));
    }

    /// A message or status change touches its thread: folded into the batch's write of that
    /// thread, or a touch of its own (placed before the operation's own write, whose position
    /// [`Index::earlier`] records).
    fn touch<'a>(&mut self, writes: &mut Vec<Write<'a>>, w: &Write<'a>) {
        let (thread, count, e, t) = match *w {
            Write::Message { m, error, .. } => {
                (&*m.thread_id, m.slot_index + 1, error, m.timestamp)
            }
            Write::Status {
                thread_id,
                error,
                at,
                ..
            } => (thread_id, 0, error, at),
            _ => return,
        };
        let found = self.thread(writes, thread);
        if !found.is_some_and(|i| writes[i].touch(count, e, t)) {
            self.add_thread(writes, thread, writes.len());
            writes.push(Write::Touch {
                id: thread,
                message_count: count,
                error: e,
                at: t,
            });
        }
    }

    /// The earlier write `w` folds into, if any; records where `w` goes if it is pushed.
    fn earlier(&mut self, writes: &[Write<'_>], w: &Write<'_>) -> Option<usize> {
        match w {
            Write::Message { m, .. } => {
                // A message written twice (again after a retry): a later status change
                // belongs to its last write.
                let seed = self.seed;
                let hash = |id: &str| std::hash::BuildHasher::hash_one(seed, id);
                let entry = self.messages.entry(
                    hash(&m.id),
                    |&i| message_id(&writes[i]) == &*m.id,
                    |&i| hash(message_id(&writes[i])),
                );
                match entry {
                    hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = writes.len(),
                    hashbrown::hash_table::Entry::Vacant(e) => {
                        e.insert(writes.len());
                    }
                }
                None
            }
            Write::Status { id, .. } => self
                .messages
                .find(self.hash(id), |&i| message_id(&writes[i]) == *id)
                .copied(),
            Write::Thread { id, .. } => {
                let first = self.thread(writes, id);
                if first.is_none() {
                    self.add_thread(writes, id, writes.len());
                }
                first
            }
            Write::InputOpened(r, _) => {
                let seed = self.seed;
                let hash = |id: &str| std::hash::BuildHasher::hash_one(seed, id);
                self.inputs
                    .insert_unique(hash(&r.id), writes.len(), |&i| hash(input_id(&writes[i])));
                None
            }
            Write::InputDecided(r) => self
                .inputs
                .find(self.hash(&r.id), |&i| input_id(&writes[i]) == &*r.id)
                .copied(),
            // Made by `touch`, never read from an operation.
            Write::Seq(_) | Write::Touch { .. } => None,
            Write::Key(..)
            | Write::Usage(..)
            | Write::Settings(..)
            | Write::Labels(..)
            | Write::Rewound(..)
            | Write::Work(..) => None,
        }
    }
}

/// Folds `w` into the earlier write `slot`: a status change into its message's insert, a
/// thread write into the thread's first; `w` back if they do not fold.
fn merge<'a>(slot: &mut Write<'a>, w: Write<'a>) -> Result<(), Write<'a>> {
    match (slot, w) {
        // An input decided in the batch that opened it (the pump decides once; a second
        // decision stays a write of its own, which changes nothing).
        (Write::InputOpened(_, decided @ None), Write::InputDecided(d)) => {
            *decided = Some(d);
        }
        (
            Write::Message { status, error, .. },
            Write::Status {
                status: s,
                error: e,
                ..
            },
        ) => {
            (*status, *error) = (s, e);
        }
        (
            Write::Thread {
                status,
                message_count,
                created_at,
                error,
                at,
                owner,
                ..
            },
            Write::Thread {
                status: s,
                message_count: c,
                created_at: created,
                error: e,
                at: t,
                owner: o,
                ..
            },
        ) => {
            *owner = owner.or(o);
            *status = s;
            *message_count = (*message_count).max(c);
            *created_at = created_at.or(created);
            *at = (*at).max(t);
            // The row keeps an error once given (the thread statements in `Writes`).
            if e.is_some() {
                *error = e;
            }
        }
        // A thread event after a touch of the same thread: the touch becomes the thread's
        // write, with the larger count.
        (slot @ Write::Touch { .. }, thread @ Write::Thread { .. }) => {
            if let Write::Touch {
                message_count,
                error,
                at,
                ..
            } = std::mem::replace(slot, thread)
            {
                slot.touch(message_count, error, at);
            }
        }
        (_, w) => return Err(w),
    }
    Ok(())
}
