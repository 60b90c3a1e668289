//! What a tenant's threads hold pending together: their outstanding messages (queued for or
//! being handled by a listener, or a reply owed), against `max_pending_messages`, and the
//! bytes of their payloads not yet handled, against `max_pending_bytes` (its active threads
//! are counted in `mod.rs`). An inject is refused at either bound, a handler's output fails
//! at twice it: so one tenant's agents, however they fan out, cannot fill the organism's
//! queues or memory for the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{MessageRecord, MessageStatus, Quota, ThreadError, ThreadRegistry};
use crate::sync::lock;

/// What a tenant's threads share: their pending messages and bytes, and the bounds as the
/// latest inject of it that opened (or tried to open) a thread read them from the
/// configuration, so a reload's change holds for all its threads from then on.
#[derive(Default)]
pub(super) struct Owned {
    count: AtomicUsize,
    bytes: AtomicUsize,
    max: AtomicUsize,
    max_bytes: AtomicUsize,
    /// Where the bounds are set (`tenants.acme`, or `tenants.default`).
    section: Mutex<Arc<str>>,
}

/// A thread's hold on its owner's [`Owned`].
pub(super) struct OwnerPending {
    owner: Arc<str>,
    shared: Arc<Owned>,
}

impl OwnerPending {
    fn load(&self) -> (usize, usize, usize, usize) {
        let s = &self.shared;
        let get = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        (get(&s.count), get(&s.bytes), get(&s.max), get(&s.max_bytes))
    }

    fn section(&self) -> Arc<str> {
        lock(&self.shared.section).clone()
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
        self.shared.count.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` of them are done (as many in all as [`Self::add`]ed).
    pub(super) fn done(&self, n: u64) {
        sub(&self.shared.count, n as usize);
    }

    /// A payload of `len` bytes is pending (not yet handled).
    pub(super) fn add_bytes(&self, len: usize) {
        self.shared.bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Payloads of `len` bytes are pending no more.
    pub(super) fn done_bytes(&self, len: usize) {
        sub(&self.shared.bytes, len);
    }
}

/// The bytes of the payloads among `messages` not yet handled.
pub(super) fn pending_bytes(messages: &[MessageRecord]) -> usize {
    messages
        .iter()
        .filter(|m| m.status == MessageStatus::Pending)
        .map(|m| m.payload_xml.len())
        .sum()
}

/// Takes `n` off, never below 0 (each is given back once; this only keeps a mistake from
/// wrapping round to refusing everything).
fn sub(a: &AtomicUsize, n: usize) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

impl ThreadRegistry {
    /// A hold on what `owner`'s threads share, its bounds set as `quota` says.
    pub(super) fn owner_pending(&self, owner: &Arc<str>, quota: &Quota<'_>) -> Box<OwnerPending> {
        let shared = lock(&self.pending_owned)
            .entry(owner.clone())
            .or_default()
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
        Box::new(OwnerPending {
            owner: owner.clone(),
            shared,
        })
    }

    /// Messages pending in the threads `owner` opened (those from before a restart apart),
    /// and the bytes of their payloads not yet handled.
    pub fn pending_owned(&self, owner: &str) -> (usize, usize) {
        lock(&self.pending_owned).get(owner).map_or((0, 0), |c| {
            (
                c.count.load(Ordering::Relaxed),
                c.bytes.load(Ordering::Relaxed),
            )
        })
    }
}
