//! What a tenant's threads hold pending together: their outstanding messages (queued for or
//! being handled by a listener, or a reply owed), against `max_pending_messages`, and the
//! bytes of their payloads not yet handled, against `max_pending_bytes` (its active threads
//! are counted in `mod.rs`). An inject is refused at either bound, a handler's output fails
//! at twice it: so one tenant's agents, however they fan out, cannot fill the organism's
//! queues or memory for the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{MessageRecord, MessageStatus, Quota, ThreadError, ThreadRegistry};
use crate::sync::{lock, take_off};

/// What a tenant's threads share (each holds it): their pending messages and bytes, and the
/// bounds as the latest inject of it that opened (or tried to open) a thread read them from
/// the configuration, so a reload's change holds for all its threads from then on.
pub(super) struct Owned {
    owner: Arc<str>,
    count: AtomicUsize,
    bytes: AtomicUsize,
    max: AtomicUsize,
    max_bytes: AtomicUsize,
    /// Where the bounds are set (`tenants.acme`, or `tenants.default`).
    section: Mutex<Arc<str>>,
}

impl Owned {
    fn new(owner: Arc<str>) -> Self {
        Owned {
            owner,
            count: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            max_bytes: AtomicUsize::new(0),
            section: Mutex::new(Arc::from("")),
        }
    }

    fn load(&self) -> (usize, usize, usize, usize) {
        let get = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        (
            get(&self.count),
            get(&self.bytes),
            get(&self.max),
            get(&self.max_bytes),
        )
    }

    fn section(&self) -> Arc<str> {
        lock(&self.section).clone()
    }

    /// The refusal of an inject bringing `incoming` bytes, if the owner has as many
    /// messages, or as many bytes, pending as it may.
    pub(super) fn full(&self, incoming: usize) -> Option<ThreadError> {
        let (n, bytes, max, max_bytes) = self.load();
        let owner = self.owner.to_string();
        if n >= max {
            let quota = format!("{}.max_pending_messages", self.section());
            return Some(ThreadError::TooManyPending { owner, max, quota });
        }
        (bytes.saturating_add(incoming) > max_bytes).then(|| ThreadError::TooManyPendingBytes {
            owner,
            bytes,
            incoming,
            max: max_bytes,
            quota: format!("{}.max_pending_bytes", self.section()),
        })
    }

    /// Why a handler's output of `incoming` bytes fails, if the owner's threads hold twice
    /// as many messages or bytes pending as its injects may bring: room for the work under
    /// way to finish (each output of a message handled at the bound), none for a fan-out to
    /// grow without end.
    pub(super) fn overflow(&self, incoming: usize) -> Option<String> {
        let (n, bytes, max, max_bytes) = self.load();
        let owner = &self.owner;
        if n >= max.saturating_mul(2) {
            return Some(format!(
                "tenant `{owner}` has {n} messages pending in its threads, twice its limit \
                 ({}.max_pending_messages: {max})",
                self.section()
            ));
        }
        (bytes.saturating_add(incoming) > max_bytes.saturating_mul(2)).then(|| {
            format!(
                "tenant `{owner}` has {bytes} bytes of payloads pending in its threads; \
                 {incoming} more would pass twice its limit ({}.max_pending_bytes: {max_bytes})",
                self.section()
            )
        })
    }

    /// One more outstanding message (or reply owed).
    pub(super) fn add(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` of them are done (as many in all as [`Self::add`]ed).
    pub(super) fn done(&self, n: u64) {
        take_off(&self.count, n as usize);
    }

    /// A message of `len` bytes went from `from` (`None`: it was just logged) to `to`: its
    /// payload counts while its status is `Pending` (not yet handled), and from no other
    /// change. Every change of a stored message's status goes through here.
    pub(super) fn moved(&self, len: usize, from: Option<MessageStatus>, to: MessageStatus) {
        let was = from == Some(MessageStatus::Pending);
        let is = to == MessageStatus::Pending;
        if is && !was {
            self.bytes.fetch_add(len, Ordering::Relaxed);
        } else if was && !is {
            take_off(&self.bytes, len);
        }
    }

    /// The thread holding `messages` goes: what they still hold pending goes with it.
    pub(super) fn gone(&self, outstanding: u64, messages: &[MessageRecord]) {
        self.done(outstanding);
        let pending = messages
            .iter()
            .filter(|m| m.status == MessageStatus::Pending)
            .map(|m| m.payload_xml.len())
            .sum();
        take_off(&self.bytes, pending);
    }
}

impl ThreadRegistry {
    /// What `owner`'s threads share, its bounds set as `quota` says.
    pub(super) fn owned(&self, owner: &Arc<str>, quota: &Quota<'_>) -> Arc<Owned> {
        let shared = lock(&self.pending_owned)
            .entry(owner.clone())
            .or_insert_with(|| Arc::new(Owned::new(owner.clone())))
            .clone();
        shared.max.store(quota.max_pending, Ordering::Relaxed);
        shared
            .max_bytes
            .store(quota.max_pending_bytes, Ordering::Relaxed);
        let mut section = lock(&shared.section);
        if **section != *quota.section {
            *section = Arc::from(quota.section);
        }
        drop(section);
        shared
    }

    /// Messages pending in the threads `owner` opened (and those of its threads from before a
    /// restart, once continued), and the bytes of their payloads not yet handled.
    pub fn pending_owned(&self, owner: &str) -> (usize, usize) {
        lock(&self.pending_owned).get(owner).map_or((0, 0), |c| {
            (
                c.count.load(Ordering::Relaxed),
                c.bytes.load(Ordering::Relaxed),
            )
        })
    }
}
