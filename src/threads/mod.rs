//! The thread registry: every thread's status, participants, counters, budget and message log.
//!
//! Sharded by thread id so that no lock is global: each operation locks one shard briefly and
//! never across an `.await`. The pump is the only writer; observers read snapshots.
//! Finished threads are retained up to a cap (oldest finished evicted first) so memory stays
//! bounded until the durable store takes over history.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::hash::SeededMap;
use crate::sync::lock;
use crate::time::Timestamp;

mod errors;
mod input;
mod labels;
mod owned;
mod pause;
mod read;
mod rewind;
pub use labels::{
    as_patch, check_label, patched, LabelError, LabelPatch, Labels, FORKED_AT, FORKED_FROM,
    MAX_LABELS, RESERVED_PREFIX,
};
pub use rewind::{superseded, Rewind};
mod query;
mod record;
mod settings;
pub use input::{InputFilter, InputKind, InputRow, InputStatus};
pub use query::{glob_match, LabelTest, MessageFilter, Page, Paged, ThreadFilter, MAX_PAGE};
pub use settings::ThreadSettings;

pub use record::{
    new_id, valid_thread_id, MessageCore, MessageRecord, MessageStatus, NewMessage, Opened, Origin,
    OriginKind, Quota, StatusChange, ThreadError, ThreadInfo, ThreadStatus, ID_RULE, RESERVED_IDS,
    SYSTEM_SENDER,
};

const SHARDS: usize = 16;

struct Entry {
    /// Its id, the map's own key: a status change names the thread without a copy.
    id: Arc<str>,
    status: ThreadStatus,
    /// Inline up to four (most threads'), so a new thread allocates no list for them.
    participants: smallvec::SmallVec<[Arc<str>; 4]>,
    created_at: Timestamp,
    last_activity: Timestamp,
    error: Option<String>,
    /// Messages queued for or being handled by a listener.
    outstanding: u64,
    /// Open inputs: messages held at a gate, questions to a person.
    inputs: u64,
    /// The thread's message count when it was last aborted: a message below it killed
    /// later was stopped by that abort (not the thread's failure).
    abort_mark: u64,
    /// Messages of this thread logged before it was (re)loaded here: slots continue after them.
    slot_base: u64,
    /// While it counts among the finished threads kept: the number of its finish, and what
    /// its messages weighed then.
    finished: Option<(u64, usize)>,
    messages: Vec<MessageRecord>,
    /// The token its waiting handlers race against, made by the first that asks
    /// ([`ThreadRegistry::cancel_token`]): most threads' handlers answer at once and never
    /// need one. A stop cancels it and lets go of it.
    cancel: Option<CancellationToken>,
    /// Whose active threads it counts among ([`Quota`]), while active.
    owner: Option<Arc<str>>,
    /// What its owner's threads hold pending together (`owned.rs`): its `outstanding` and
    /// the bytes of its `Pending` messages count there.
    pending: Option<Arc<owned::Owned>>,
    settings: Option<Arc<ThreadSettings>>,
    labels: Option<Arc<Labels>>,
    paused: bool,
    /// Its rewinds (`rewind.rs`), in memory; the store keeps them too.
    rewinds: Vec<Rewind>,
}

impl Drop for Entry {
    /// What it still counts for its owner goes with it: a killed thread evicted before its
    /// queued work is cancelled finds no entry to finish that work in.
    fn drop(&mut self) {
        if let Some(p) = &self.pending {
            p.gone(self.outstanding, &self.messages);
        }
    }
}

impl Entry {
    /// One more message queued or handled, or reply owed: counted for its owner too.
    fn add_outstanding(&mut self) {
        self.outstanding += 1;
        if let Some(p) = &self.pending {
            p.add();
        }
    }

    /// One of them is done.
    fn finish_outstanding(&mut self) {
        if self.outstanding > 0 {
            self.outstanding -= 1;
            if let Some(p) = &self.pending {
                p.done(1);
            }
        }
    }

    fn info(&self, id: &str) -> ThreadInfo {
        ThreadInfo {
            id: id.to_string(),
            status: self.status,
            participants: self.participants.iter().map(|p| p.to_string()).collect(),
            message_count: self.count(),
            created_at: self.created_at,
            last_activity: self.last_activity,
            error: self.error.clone(),
            settings: self.settings.clone(),
            labels: self.labels.clone(),
            paused: self.paused,
            owner: self.owner.clone(),
        }
    }

    fn change(&self) -> StatusChange {
        StatusChange {
            thread_id: self.id.clone(),
            status: self.status,
            message_count: self.count(),
            error: self.error.clone(),
            paused: self.paused,
            labels: self.labels.clone(),
        }
    }

    fn count(&self) -> u64 {
        self.slot_base + self.messages.len() as u64
    }

    fn note_participant(&mut self, who: &Arc<str>) {
        if !self.participants.iter().any(|p| p == who) {
            self.participants.push(who.clone());
        }
    }

    /// Quiescent and not killed: waiting while an input is open, else completed, or error
    /// if a failure happened. True if the status changed.
    fn settle(&mut self) -> bool {
        if !matches!(self.status, ThreadStatus::Active | ThreadStatus::Waiting)
            || self.outstanding > 0
        {
            return false;
        }
        let next = if self.inputs > 0 {
            ThreadStatus::Waiting
        } else if self.error.is_some() {
            ThreadStatus::Error
        } else {
            ThreadStatus::Completed
        };
        let changed = next != self.status;
        self.status = next;
        changed
    }
}

#[derive(Default)]
struct Shard {
    threads: SeededMap<Arc<str>, Entry>,
    /// Finished threads, oldest first, each with the number of its finish
    /// ([`Entry::finished`]): an entry whose thread finished again since is stale and let go
    /// of when it comes up.
    finished: VecDeque<(Arc<str>, u64)>,
    /// Threads finished now (the entries of `finished` not stale).
    finished_now: usize,
    /// What their messages weighed when they finished.
    finished_bytes: usize,
    /// Finishes numbered so far.
    finishes: u64,
    /// Messages appended here, ever.
    appended: u64,
    /// Messages that reached a final status, by receiver (`""` if none) and status.
    finals: SeededMap<(Arc<str>, MessageStatus), u64>,
}

impl Shard {
    fn uncount_final(&mut self, to: Option<&Arc<str>>, status: MessageStatus) {
        if status.is_final() {
            let to = to.cloned().unwrap_or_else(|| Arc::from(""));
            if let Some(n) = self.finals.get_mut(&(to, status)) {
                *n = n.saturating_sub(1);
            }
        }
    }

    fn count_final(&mut self, to: Option<&Arc<str>>, status: MessageStatus) {
        if status.is_final() {
            let to = to.cloned().unwrap_or_else(|| Arc::from(""));
            *self.finals.entry((to, status)).or_default() += 1;
        }
    }
}

pub struct ThreadRegistry {
    shards: Vec<Mutex<Shard>>,
    /// Active threads by owner. Locked only by threads with an owner, inside their shard's
    /// lock, where one changes between active and not.
    owned: Mutex<SeededMap<Arc<str>, usize>>,
    /// Messages pending in each owner's threads (`owned.rs`), shared by its threads.
    pending_owned: Mutex<SeededMap<Arc<str>, Arc<owned::Owned>>>,
    hasher: crate::hash::SeededState,
    max_messages: u64,
    retain_finished: usize,
    /// Bytes of finished threads' messages kept, at most (oldest finished evicted first).
    retain_bytes: usize,
    /// Bytes held elsewhere that count against `retain_bytes` (payloads held at approval
    /// gates): finished threads keep that much less.
    reserved: std::sync::atomic::AtomicUsize,
    /// Threads paused (`pause.rs`): none, the common case, is known without a lock.
    paused: std::sync::atomic::AtomicUsize,
}

impl ThreadRegistry {
    /// Keeps up to `retain_finished` finished threads, whose messages weigh at most
    /// `retain_bytes` together ([`MessageRecord::weight`]).
    pub fn new(max_messages_per_thread: u64, retain_finished: usize, retain_bytes: usize) -> Self {
        ThreadRegistry {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            owned: Mutex::default(),
            pending_owned: Mutex::default(),
            hasher: Default::default(),
            max_messages: max_messages_per_thread,
            retain_finished,
            retain_bytes,
            reserved: Default::default(),
            paused: Default::default(),
        }
    }

    fn shard(&self, id: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(id) as usize) % SHARDS]
    }

    /// Opens a new thread (`requested` = None: a uuid v7) or continues an existing one. With
    /// a quota, a new thread counts against its owner, and neither a new one nor a finished
    /// one of that owner becomes active while the owner has `max` active already; nor is one
    /// of the owner's threads opened or continued while its threads hold `max_pending`
    /// messages, or `max_pending_bytes` with the inject's payload.
    pub fn open(
        &self,
        requested: Option<&str>,
        quota: Option<Quota<'_>>,
    ) -> Result<Opened, ThreadError> {
        let id: Arc<str> = match requested {
            Some(r) if !valid_thread_id(r) => return Err(ThreadError::InvalidId),
            Some(r) => Arc::from(r),
            None => new_id(),
        };
        let mut shard = lock(self.shard(&id));
        if let Some(e) = shard.threads.get_mut(&id) {
            // Adopted (from before a restart, or let go of here): its owner's pending counts
            // are shared from now on, while it holds no work.
            if let (Some(o), Some(q), None, 0) = (&e.owner, &quota, &e.pending, e.outstanding) {
                if **o == *q.owner {
                    e.pending = Some(self.owned(o, q));
                }
            }
            let incoming = quota.as_ref().map_or(0, |q| q.incoming);
            if let Some(full) = e.pending.as_ref().and_then(|p| p.full(incoming)) {
                return Err(full);
            }
            return match e.status {
                ThreadStatus::Killed => Err(ThreadError::Killed(id.to_string())),
                ThreadStatus::Active => Ok(Opened {
                    id,
                    created: None,
                    reactivated: None,
                }),
                _ => {
                    let quota = quota.filter(|q| e.owner.as_deref() == Some(q.owner));
                    self.activate(e.owner.as_ref(), quota.as_ref())?;
                    e.status = ThreadStatus::Active;
                    let change = e.change();
                    Ok(Opened {
                        id,
                        created: None,
                        reactivated: Some(change),
                    })
                }
            };
        }
        let owner = quota.as_ref().map(|q| Arc::<str>::from(q.owner));
        let pending = match (&owner, &quota) {
            (Some(o), Some(q)) => Some(self.owned(o, q)),
            _ => None,
        };
        let incoming = quota.as_ref().map_or(0, |q| q.incoming);
        if let Some(full) = pending.as_ref().and_then(|p| p.full(incoming)) {
            return Err(full);
        }
        self.activate(owner.as_ref(), quota.as_ref())?;
        let now = Timestamp::now();
        let entry = Entry {
            id: id.clone(),
            owner,
            pending,
            status: ThreadStatus::Active,
            participants: smallvec::SmallVec::new(),
            created_at: now,
            last_activity: now,
            error: None,
            outstanding: 0,
            inputs: 0,
            abort_mark: 0,
            slot_base: 0,
            finished: None,
            messages: Vec::new(),
            cancel: None,
            settings: None,
            labels: None,
            paused: false,
            rewinds: Vec::new(),
        };
        let info = entry.info(&id);
        shard.threads.insert(id.clone(), entry);
        Ok(Opened {
            id,
            created: Some(info),
            reactivated: None,
        })
    }

    /// Loads a thread known from the durable log (after a restart, or after it was evicted
    /// here) so that it can continue: its slots continue after `info.message_count`. A killed
    /// thread stays killed. Does nothing if the thread is already here.
    pub fn adopt(&self, info: &ThreadInfo) {
        let id: Arc<str> = Arc::from(info.id.as_str());
        let mut shard = lock(self.shard(&id));
        if shard.threads.contains_key(&id) {
            return;
        }
        let entry = Entry {
            id: id.clone(),
            status: info.status,
            participants: info
                .participants
                .iter()
                .map(|p| Arc::from(p.as_str()))
                .collect(),
            created_at: info.created_at,
            last_activity: info.last_activity,
            error: info.error.clone(),
            outstanding: 0,
            inputs: 0,
            abort_mark: 0,
            slot_base: info.message_count,
            finished: None,
            messages: Vec::new(),
            cancel: None,
            // Its tenant's again (its counts shared from the next inject that names it).
            owner: info.owner.clone(),
            pending: None,
            settings: info.settings.clone(),
            labels: info.labels.clone(),
            paused: false,
            rewinds: Vec::new(),
        };
        if entry.status == ThreadStatus::Active {
            let _ = self.activate(entry.owner.as_ref(), None);
        }
        let finished = info.status.is_finished();
        shard.threads.insert(id.clone(), entry);
        if finished {
            self.note_finished(&mut shard, &id);
        }
    }

    /// Is this thread held here (not evicted, not from before a restart)?
    pub fn contains(&self, thread: &str) -> bool {
        lock(self.shard(thread)).threads.contains_key(thread)
    }

    /// Appends a message to its thread's log; a `Pending` one counts as outstanding work.
    /// Nothing offered is lost: in a killed thread the message is recorded as `Killed`, and past
    /// the thread's budget as `Failed` (the thread then records the failure). The caller reads
    /// the returned record's status.
    pub fn append(&self, thread: &str, mut m: NewMessage) -> Result<MessageRecord, ThreadError> {
        let mut shard = lock(self.shard(thread));
        let shard = &mut *shard;
        let Some(e) = shard.threads.get_mut(thread) else {
            return Err(ThreadError::NotFound(thread.to_string()));
        };
        // The stored key (the entry's `id`) is the shared id every record of the thread
        // points at.
        let key = e.id.clone();
        if e.status == ThreadStatus::Killed {
            m.status = MessageStatus::Killed;
            m.error = Some("thread killed".into());
        } else if e.status == ThreadStatus::Aborted && !m.status.is_final() {
            // Work that was under way when the thread was aborted does not go on.
            m.status = MessageStatus::Killed;
            m.error = Some("thread aborted".into());
        } else if e.count() >= self.max_messages && m.status == MessageStatus::Pending {
            m.status = MessageStatus::Failed;
            m.error = Some(
                ThreadError::BudgetExceeded {
                    id: thread.to_string(),
                    max: self.max_messages,
                }
                .to_string(),
            );
        } else if m.status == MessageStatus::Pending {
            // Its owner's threads hold as many pending messages as they may.
            let incoming = m.payload_xml.len();
            if let Some(why) = e.pending.as_ref().and_then(|p| p.overflow(incoming)) {
                m.status = MessageStatus::Failed;
                m.error = Some(why);
            }
        }
        if let Some(p) = &e.pending {
            p.moved(m.payload_xml.len(), None, m.status);
        }
        let now = Timestamp::now();
        e.note_participant(&m.from);
        if let Some(to) = &m.to {
            e.note_participant(to);
        }
        match m.status {
            MessageStatus::Pending => e.add_outstanding(),
            MessageStatus::Held => e.inputs += 1,
            _ => {}
        }
        if let Some(err) = &m.error {
            if e.error.is_none() {
                e.error = Some(err.clone());
            }
        }
        e.last_activity = now;
        let record = MessageRecord::new(
            MessageCore {
                id: m.id,
                thread_id: key,
                parent_id: m.parent_id,
                slot_index: e.count(),
                from: m.from,
                to: m.to,
                payload_type: m.payload_type,
                payload_xml: m.payload_xml,
                timestamp: now,
                origin: m.origin,
            },
            m.status,
            m.error,
        );
        e.messages.push(record.clone());
        shard.appended += 1;
        shard.count_final(record.to.as_ref(), record.status);
        Ok(record)
    }

    /// Sets the final status of a message. A failure becomes the thread's error if first.
    pub fn set_message_status(
        &self,
        thread: &str,
        slot: u64,
        status: MessageStatus,
        error: Option<String>,
    ) {
        let mut shard = lock(self.shard(thread));
        let shard = &mut *shard;
        let mut counted = None;
        if let Some(e) = shard.threads.get_mut(thread) {
            // What an abort stops, a person declines or a newer message supersedes is not
            // the thread's failure: it goes on after.
            let not_failed = matches!(status, MessageStatus::Declined | MessageStatus::Superseded)
                || (status == MessageStatus::Killed && slot < e.abort_mark);
            if let Some(err) = error.as_ref().filter(|_| !not_failed) {
                if e.error.is_none() {
                    e.error = Some(err.clone());
                }
            }
            e.last_activity = Timestamp::now();
            let index = slot.checked_sub(e.slot_base).map(|i| i as usize);
            if let Some(m) = index.and_then(|i| e.messages.get_mut(i)) {
                if m.status != status {
                    counted = Some((m.to.clone(), m.status));
                }
                if let Some(p) = &e.pending {
                    p.moved(m.payload_xml.len(), Some(m.status), status);
                }
                m.status = status;
                m.error = error;
            }
        }
        if let Some((to, old)) = counted {
            // A final status can still change (a delivered external request whose reply
            // never came fails): the counts move with it.
            shard.uncount_final(to.as_ref(), old);
            shard.count_final(to.as_ref(), status);
        }
    }

    /// Sets the bytes held elsewhere that count against the finished threads' byte budget.
    pub fn reserve_bytes(&self, bytes: usize) {
        self.reserved
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Work outside any message is owed to the thread (an external agent's reply): it stays
    /// active until [`ThreadRegistry::finish_one`] is called for it. False if the thread is
    /// unknown or killed.
    pub fn hold(&self, thread: &str) -> bool {
        let mut shard = lock(self.shard(thread));
        match shard.threads.get_mut(thread) {
            Some(e) if e.status != ThreadStatus::Killed => {
                e.add_outstanding();
                if e.status != ThreadStatus::Active {
                    // Work owed is never refused: counted, not checked.
                    let _ = self.activate(e.owner.as_ref(), None);
                    e.status = ThreadStatus::Active;
                }
                true
            }
            _ => false,
        }
    }

    /// One outstanding message of the thread is done. Returns the status change if the thread
    /// became quiescent.
    pub fn finish_one(&self, thread: &str) -> Option<StatusChange> {
        let mut shard = lock(self.shard(thread));
        let shard = &mut *shard;
        let e = shard.threads.get_mut(thread)?;
        e.finish_outstanding();
        self.settle_in(shard, thread)
    }

    /// Settles a thread that may have no outstanding work (e.g. its only message was refused).
    pub fn settle(&self, thread: &str) -> Option<StatusChange> {
        let mut shard = lock(self.shard(thread));
        self.settle_in(&mut shard, thread)
    }

    fn settle_in(&self, shard: &mut Shard, thread: &str) -> Option<StatusChange> {
        let e = shard.threads.get_mut(thread)?;
        let was = e.status;
        if !e.settle() {
            return None;
        }
        if was == ThreadStatus::Active {
            self.deactivate(e.owner.as_ref());
        }
        let change = e.change();
        if e.status.is_finished() {
            self.note_finished(shard, thread);
        }
        Some(change)
    }

    /// A thread of `owner` becomes active: counted, and refused past `quota` if given.
    fn activate(
        &self,
        owner: Option<&Arc<str>>,
        quota: Option<&Quota<'_>>,
    ) -> Result<(), ThreadError> {
        let Some(owner) = owner else {
            return Ok(());
        };
        let mut owned = lock(&self.owned);
        let n = owned.entry(owner.clone()).or_default();
        if let Some(q) = quota.filter(|q| *n >= q.max) {
            return Err(ThreadError::TooManyActive {
                owner: owner.to_string(),
                max: q.max,
                quota: format!("{}.max_active_threads", q.section),
            });
        }
        *n += 1;
        Ok(())
    }

    /// A thread of `owner` stops being active.
    fn deactivate(&self, owner: Option<&Arc<str>>) {
        let Some(owner) = owner else {
            return;
        };
        let mut owned = lock(&self.owned);
        if let Some(n) = owned.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                owned.remove(owner);
            }
        }
    }

    /// Active threads that count against `owner`.
    pub fn active_owned(&self, owner: &str) -> usize {
        lock(&self.owned).get(owner).copied().unwrap_or(0)
    }

    fn note_finished(&self, shard: &mut Shard, thread: &str) {
        shard.finishes += 1;
        let number = shard.finishes;
        let Some(e) = shard.threads.get_mut(thread) else {
            return;
        };
        // The map's own id, shared (not copied) into the list of finished threads.
        let id = e.id.clone();
        let weight = e.messages.iter().map(MessageRecord::weight).sum();
        // A thread that finishes again counts once, with what it weighs now.
        if let Some((_, before)) = e.finished.replace((number, weight)) {
            shard.finished_bytes -= before;
            shard.finished_now -= 1;
        }
        shard.finished.push_back((id, number));
        shard.finished_bytes += weight;
        shard.finished_now += 1;
        let cap = self.retain_finished / SHARDS + 1;
        let reserved = self.reserved.load(std::sync::atomic::Ordering::Relaxed);
        let byte_cap = self.retain_bytes.saturating_sub(reserved) / SHARDS;
        // The thread just finished stays (its inject's answer may still read it).
        while shard.finished_now > cap
            || (shard.finished_bytes > byte_cap && shard.finished_now > 1)
        {
            let Some((old, number)) = shard.finished.pop_front() else {
                break;
            };
            let std::collections::hash_map::Entry::Occupied(mut o) = shard.threads.entry(old)
            else {
                continue;
            };
            let e = o.get_mut();
            // Stale: it finished again later (a later entry counts it).
            let Some((_, weight)) = e.finished.filter(|(n, _)| *n == number) else {
                continue;
            };
            e.finished = None;
            shard.finished_bytes -= weight;
            shard.finished_now -= 1;
            // A thread revived since is kept (it counts again when it finishes).
            if e.status.is_finished() {
                self.forget_pause(e.paused);
                o.remove();
            }
        }
    }

    /// Marks a thread killed and cancels its running handlers. Returns the change, or an
    /// error if there is no such thread. Killing a killed thread changes nothing.
    pub fn kill(&self, thread: &str) -> Result<Option<StatusChange>, ThreadError> {
        self.stop(thread, ThreadStatus::Killed)
    }

    /// Stops a thread, `to` killed (final: every token it gives is cancelled) or aborted
    /// (its abort mark set; the next token it gives is fresh): running handlers' token is
    /// cancelled. Stopping it as it already is changes nothing; a killed thread cannot be
    /// aborted.
    fn stop(&self, thread: &str, to: ThreadStatus) -> Result<Option<StatusChange>, ThreadError> {
        let mut shard = lock(self.shard(thread));
        let shard = &mut *shard;
        let e = shard
            .threads
            .get_mut(thread)
            .ok_or_else(|| ThreadError::NotFound(thread.to_string()))?;
        match e.status {
            s if s == to => return Ok(None),
            ThreadStatus::Killed => return Err(ThreadError::Killed(thread.to_string())),
            ThreadStatus::Active => self.deactivate(e.owner.as_ref()),
            _ => {}
        }
        e.status = to;
        if to == ThreadStatus::Aborted {
            e.abort_mark = e.count();
        }
        // The handlers waiting now are cancelled; those that ask later get a fresh token
        // (an aborted thread goes on), or a cancelled one (a killed thread does not).
        if let Some(token) = e.cancel.take() {
            token.cancel();
        }
        let change = e.change();
        self.note_finished(shard, thread);
        Ok(Some(change))
    }
}

#[cfg(test)]
mod tests;
