//! Reads of the history: pages of messages and threads (from the store when it is on, else
//! from memory), one thread, and waiting for a thread to settle.

use std::sync::Arc;

use crate::events::OrganismStatus;
use crate::threads::{MessageRecord, ThreadStatus};

use super::{Organism, READ_CATCH_UP};

impl Organism {
    /// The organism's history: pages of messages and threads, one thread, waiting for one.
    pub fn history(&self) -> History<'_> {
        History { organism: self }
    }
}

/// Reads of the history ([`Organism::history`]): from the store when it is on, else from
/// memory; a thread the organism still holds is read live.
#[derive(Clone, Copy)]
pub struct History<'a> {
    organism: &'a Organism,
}

impl<'a> History<'a> {
    /// Messages removed from the store by retention since start.
    pub fn pruned_messages(self) -> u64 {
        self.organism
            .shared
            .store
            .as_ref()
            .map_or(0, |s| s.pruned())
    }

    /// The durable store, unless the organism runs with `store: memory`.
    pub fn store(self) -> Option<&'a Arc<crate::store::Store>> {
        self.organism.shared.store.as_ref()
    }

    /// One page of the message log: from the store when there is one, else from memory.
    pub fn query_messages(
        self,
        filter: &crate::threads::MessageFilter,
        page: crate::threads::Page,
    ) -> Result<crate::threads::Paged<MessageRecord>, crate::store::StoreError> {
        match &self.organism.shared.store {
            Some(store) => {
                store.catch_up(READ_CATCH_UP);
                store.query_messages(filter, page)
            }
            None => Ok(self.organism.shared.threads.query_messages(filter, page)),
        }
    }

    /// The message `id`: from the store when there is one (once it has what was published
    /// before the call), else from the threads held in memory.
    pub fn message(self, id: &str) -> Result<Option<MessageRecord>, crate::store::StoreError> {
        match &self.organism.shared.store {
            Some(store) => {
                store.catch_up(READ_CATCH_UP);
                store.message(id)
            }
            None => Ok(self.organism.shared.threads.find_message(id)),
        }
    }

    /// The thread's rewinds: those made since the organism held it, and those the store
    /// kept from before.
    pub fn rewinds(
        self,
        id: &str,
    ) -> Result<Vec<crate::threads::Rewind>, crate::store::StoreError> {
        let mut all = self.organism.shared.threads.rewinds(id);
        if let Some(store) = &self.organism.shared.store {
            for r in store.rewinds(id)? {
                if !all.contains(&r) {
                    all.push(r);
                }
            }
        }
        Ok(all)
    }

    /// One page of threads: from the store when there is one (after it has committed what
    /// was published before the call, [`READ_CATCH_UP`] at most), else from memory.
    pub fn query_threads(
        self,
        filter: &crate::threads::ThreadFilter,
        page: crate::threads::Page,
    ) -> Result<crate::threads::Paged<crate::threads::ThreadInfo>, crate::store::StoreError> {
        match &self.organism.shared.store {
            Some(store) => {
                store.catch_up(READ_CATCH_UP);
                // A pause is kept in memory only: shown over the stored row.
                let mut found = store.query_threads(filter, page)?;
                let threads = &self.organism.shared.threads;
                for t in &mut found.items {
                    t.paused = threads.is_paused(&t.id);
                }
                Ok(found)
            }
            None => Ok(self.organism.shared.threads.query_threads(filter, page)),
        }
    }

    /// One thread: live from memory while the organism holds it (so a thread is found the
    /// moment its inject is answered, before the store's writer commits it), else from the
    /// store.
    pub fn thread_info(
        self,
        id: &str,
    ) -> Result<Option<crate::threads::ThreadInfo>, crate::store::StoreError> {
        match (
            self.organism.shared.threads.info(id),
            &self.organism.shared.store,
        ) {
            (Some(live), _) => Ok(Some(live)),
            (None, Some(store)) => store.thread(id),
            (None, None) => Ok(None),
        }
    }

    /// The messages published after event `since` and at or before `until`, as the store
    /// has them once it has caught up ([`crate::store::Store::replay`]); unavailable without
    /// a store.
    pub fn replay(
        self,
        since: u64,
        until: u64,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<crate::store::Replay, crate::store::StoreError> {
        let Some(store) = &self.organism.shared.store else {
            return Ok(crate::store::Replay::Unavailable(
                "the organism keeps no store",
            ));
        };
        store.catch_up(READ_CATCH_UP);
        store.replay(since, until, max_messages, max_bytes)
    }

    /// The usage account's sums ([`crate::store::Store::usage`]), once the store has every
    /// call published so far; `None` without a store.
    pub fn usage(
        self,
        q: &crate::store::usage::UsageQuery,
    ) -> Option<Result<Vec<crate::store::usage::UsageRow>, crate::store::StoreError>> {
        let store = self.organism.shared.store.as_ref()?;
        store.catch_up(READ_CATCH_UP);
        Some(store.usage(q))
    }

    /// Where each token window of `tenant` stands now (`tenants.X.tokens_per_*`).
    pub fn budgets(self, tenant: &str) -> Vec<crate::llm::WindowState> {
        self.organism.shared.budgets.state(tenant)
    }

    /// A thread's messages from slot `from` on, in slot order: at most `limit`, and no more
    /// than fit in `max_bytes` of payloads (at least one); and whether more follow. Read by
    /// slot (no count, no offset): from memory where the organism holds them, else from the
    /// store. `None` for no such thread.
    pub fn thread_slice(
        self,
        id: &str,
        from: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Option<(Vec<MessageRecord>, bool)>, crate::store::StoreError> {
        let shared = &self.organism.shared;
        let held = shared.threads.log(id, from, limit.saturating_add(1));
        match (held, &shared.store) {
            (Some((base, live)), Some(store)) if from < base => {
                let (mut part, more) = store.thread_slice(id, from, limit, max_bytes)?;
                part.retain(|m| m.slot_index < base);
                // The live part follows a store part that reached it (not one cut short).
                let reached = part.last().is_none_or(|m| m.slot_index + 1 >= base);
                if !reached || (more && part.len() == limit) {
                    return Ok(Some((part, true)));
                }
                let used = part.iter().map(|m| m.payload_xml.len()).sum();
                let room = limit - part.len();
                let (live, more) = within(live, room, max_bytes, used);
                part.extend(live);
                Ok(Some((part, more)))
            }
            (Some((_, live)), _) => Ok(Some(within(live, limit, max_bytes, 0))),
            (None, Some(store)) => {
                let (part, more) = store.thread_slice(id, from, limit, max_bytes)?;
                if part.is_empty() && store.thread(id)?.is_none() {
                    return Ok(None);
                }
                Ok(Some((part, more)))
            }
            (None, None) => Ok(None),
        }
    }

    /// One page of a thread's messages in slot order, `None` for an unknown thread. What
    /// the organism holds in memory is live (every message, current statuses); slots before
    /// it (a thread continued after a restart) and threads no longer held come from the
    /// store.
    pub fn thread_page(
        self,
        id: &str,
        page: crate::threads::Page,
    ) -> Result<Option<crate::threads::Paged<MessageRecord>>, crate::store::StoreError> {
        let filter = crate::threads::MessageFilter {
            thread: Some(id.to_string()),
            ..Default::default()
        };
        match (
            self.organism.shared.threads.log(id, 0, usize::MAX),
            &self.organism.shared.store,
        ) {
            (Some((0, live)), _) | (Some((_, live)), None) => Ok(Some(page.cut(live))),
            (Some((base, live)), Some(store)) => {
                let mut log: Vec<MessageRecord> = store
                    .query_messages(&filter, crate::threads::Page::ALL)?
                    .items
                    .into_iter()
                    .filter(|m| m.slot_index < base)
                    .collect();
                log.extend(live);
                Ok(Some(page.cut(log)))
            }
            (None, Some(store)) => match store.thread(id)? {
                Some(_) => store.query_messages(&filter, page).map(Some),
                None => Ok(None),
            },
            (None, None) => Ok(None),
        }
    }

    /// Waits until the thread is no longer active; returns its status (`None`: no such thread).
    /// Each waiter is woken by its own thread's change only, so many waiters cost nothing per
    /// event.
    pub async fn wait_thread(self, id: &str) -> Option<ThreadStatus> {
        loop {
            match self.organism.shared.threads.status(id) {
                Some(ThreadStatus::Active) => {}
                other => return other,
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            crate::sync::lock(&self.organism.shared.thread_waiters)
                .entry(id.to_string())
                .or_default()
                .push(tx);
            // It may have settled between the check and the registration: then withdraw.
            match self.organism.shared.threads.status(id) {
                Some(ThreadStatus::Active) => {}
                other => {
                    drop(rx);
                    let mut w = crate::sync::lock(&self.organism.shared.thread_waiters);
                    if let Some(list) = w.get_mut(id) {
                        list.retain(|tx| !tx.is_closed());
                        if list.is_empty() {
                            w.remove(id);
                        }
                    }
                    return other;
                }
            }
            match rx.await {
                Ok(status) if status != ThreadStatus::Active => return Some(status),
                // Dropped (the organism went away) or reactivated: look again.
                _ => {
                    if self.organism.status() == OrganismStatus::Stopped {
                        return self.organism.shared.threads.status(id);
                    }
                }
            }
        }
    }

    /// The thread's messages, in slot order.
    pub fn thread_messages(self, id: &str) -> Option<Vec<MessageRecord>> {
        self.organism.shared.threads.messages(id)
    }
}

/// A thread's messages as a handler reads them (`kind: llm`'s context): the organism's, while
/// it lives.
pub(super) struct ThreadLog(pub(super) std::sync::Weak<super::Shared>);

impl crate::llm::ThreadHistory for ThreadLog {
    fn messages(&self, thread: &str) -> Vec<MessageRecord> {
        // What a rewind superseded is not part of the conversation, nor the message it
        // went back to: that turn is taken again.
        let Some(s) = self.0.upgrade() else {
            return Vec::new();
        };
        let rewinds = s.threads.rewinds(thread);
        let mut log = s.threads.messages(thread).unwrap_or_default();
        let redone: Vec<Arc<str>> = log
            .iter()
            .filter(|m| m.origin.kind == crate::threads::OriginKind::Rewind)
            .filter_map(|m| m.origin.of.clone())
            .collect();
        log.retain(|m| {
            !crate::threads::superseded(&rewinds, m.slot_index) && !redone.contains(&m.id)
        });
        log
    }
}

/// The usage account as budgets read it: a tenant's tokens between two days.
pub(super) struct StoredUsage(pub(super) Arc<crate::store::Store>);

impl crate::llm::UsageSource for StoredUsage {
    fn used(&self, tenant: &str, from: &str, to: &str) -> u64 {
        self.0.catch_up(READ_CATCH_UP);
        let q = crate::store::usage::UsageQuery {
            from: Some(from.to_string()),
            to: Some(to.to_string()),
            tenant: Some(tenant.to_string()),
            ..Default::default()
        };
        self.0.usage(&q).map_or(0, |rows| {
            rows.iter().map(|r| r.input_tokens + r.output_tokens).sum()
        })
    }

    fn used_in_thread(&self, listener: &str, thread: &str) -> u64 {
        self.0.catch_up(READ_CATCH_UP);
        self.0.thread_usage(listener, thread).unwrap_or(0)
    }
}

/// The first of `messages` that fit in `limit` and in `max_bytes` with `used` taken (at
/// least one when nothing is), and whether any is left.
fn within(
    mut messages: Vec<MessageRecord>,
    limit: usize,
    max_bytes: usize,
    used: usize,
) -> (Vec<MessageRecord>, bool) {
    let mut bytes = used;
    let fit = messages
        .iter()
        .take(limit)
        .take_while(|m| {
            bytes += m.payload_xml.len();
            bytes <= max_bytes
        })
        .count()
        .max(usize::from(used == 0 && limit > 0 && !messages.is_empty()));
    let more = messages.len() > fit;
    messages.truncate(fit);
    (messages, more)
}
