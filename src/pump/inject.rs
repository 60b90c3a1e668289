//! Inject: the pump's entry for payloads from outside the organism (API, WebSocket, CLI,
//! embedders), checked and admitted like any routed output.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::events::EventKind;
use crate::threads::{Quota, ThreadError};
use crate::xml::{normalize_payload, parse_envelope, NormalizedPayload};

use super::admit::{Admission, Admitted};
use super::route::SYSTEM_IDENTITY;
use super::{FailureKind, InjectError, InjectReceipt, InjectRequest, Organism, STATUS_RUNNING};

impl Organism {
    /// Injects one payload for a listener. Validated before this returns: an accepted inject
    /// is queued and logged; a refused one is counted and published as an `error` event.
    pub fn inject(&self, req: InjectRequest) -> Result<InjectReceipt, InjectError> {
        self.inject_with_id(req, None)
    }

    /// [`Organism::inject`] with the message's id chosen by the client: `MessageIdTaken`
    /// if a message of the organism has it. (Its form is the caller's to check.)
    pub fn inject_with_id(
        &self,
        req: InjectRequest,
        message_id: Option<&str>,
    ) -> Result<InjectReceipt, InjectError> {
        self.inject_labelled(req, message_id, None)
    }

    /// [`Organism::inject_with_id`] with labels for its thread (added to those it has),
    /// each checked first (`threads::check_label`, at most `MAX_LABELS` in all).
    pub fn inject_labelled(
        &self,
        req: InjectRequest,
        message_id: Option<&str>,
        labels: Option<&crate::threads::Labels>,
    ) -> Result<InjectReceipt, InjectError> {
        let result = (|| {
            // Refused before anything else, whatever the thread holds already.
            if let Some(l) = labels {
                crate::threads::patched(None, &crate::threads::as_patch(l))?;
            }
            self.shared.shed()?;
            let payload = normalize_payload(&req.payload_xml, &self.shared.xml_limits)?;
            let thread = req.thread_id.as_deref();
            self.inject_normalized(&req.from, &req.to, payload, thread, message_id, labels)
        })();
        self.note_refusal(&result, &req.to);
        result
    }

    /// Whether the organism has room for an inject now (the store keeping up, the pending
    /// limit not reached): what [`Organism::inject`] asks first. A front end asks it before
    /// work of its own on a request (the API's JSON payload made XML).
    pub fn room(&self) -> Result<(), InjectError> {
        self.shared.shed()
    }

    /// Injects a whole `<message>` envelope. The envelope's `from` is ignored: the message is
    /// from `identity`. Its `thread`, if any, names the thread to continue.
    pub fn inject_envelope(&self, identity: &str, xml: &str) -> Result<InjectReceipt, InjectError> {
        let mut to = String::new();
        let result = (|| {
            self.shared.shed()?;
            let env = parse_envelope(xml, &self.shared.xml_limits)?;
            to = env.to.clone().ok_or(InjectError::NoTarget)?;
            self.inject_normalized(
                identity,
                &to,
                env.payload,
                env.thread.as_deref(),
                None,
                None,
            )
        })();
        self.note_refusal(&result, &to);
        result
    }

    pub(super) fn note_refusal(&self, result: &Result<InjectReceipt, InjectError>, to: &str) {
        if let Err(e) = result {
            self.shared.count_failure(FailureKind::InjectRefused);
            let agent = Some(to).filter(|t| !t.is_empty());
            self.shared
                .say_error(None, agent, format!("inject refused: {e}"));
        }
    }

    pub(super) fn inject_normalized(
        &self,
        from: &str,
        to: &str,
        payload: NormalizedPayload,
        thread_id: Option<&str>,
        message_id: Option<&str>,
        labels: Option<&crate::threads::Labels>,
    ) -> Result<InjectReceipt, InjectError> {
        let s = &self.shared;
        if s.life.status.load(Ordering::SeqCst) != STATUS_RUNNING {
            return Err(InjectError::Stopping);
        }
        let topo = s.topo();
        if topo.listeners.contains_key(from) || from.is_empty() || from == SYSTEM_IDENTITY {
            return Err(InjectError::ForgedIdentity(from.to_string()));
        }
        let listener = topo
            .listeners
            .get(to)
            .cloned()
            .ok_or_else(|| InjectError::UnknownListener(to.to_string()))?;
        let schema = listener
            .config
            .schema_for(&payload.payload_type)
            .ok_or_else(|| InjectError::NotAccepted {
                listener: to.to_string(),
                payload_type: payload.payload_type.to_string(),
            })?;
        let valid = schema.validate(payload).map_err(InjectError::Invalid)?;
        let entry = Entry {
            from: Arc::from(from),
            thread_id,
            message_id,
            parent_id: None,
            origin: None,
            labels,
            fork: None,
        };
        self.enter(&listener, valid, entry)
    }

    /// Admits `valid` for `listener` as `entry` says, in its thread (a new one, or one that
    /// continues), past what holds for every message that enters from outside: the store
    /// keeping up, the tenant's token budget, the organism's pending limit, the tenant's
    /// active threads. What an inject and a retry share.
    pub(super) fn enter(
        &self,
        listener: &Arc<super::dispatch::Listener>,
        valid: crate::schema::ValidatedPayload,
        entry: Entry<'_>,
    ) -> Result<InjectReceipt, InjectError> {
        let s = &self.shared;
        let topo = s.topo();
        let Entry {
            from,
            thread_id,
            message_id,
            parent_id,
            origin,
            labels,
            fork,
        } = entry;
        s.room_for(listener, thread_id, fork.is_some())?;
        // A thread injected to a tenant's listener counts against the tenant's
        // `max_active_threads`.
        let section;
        let quota = match listener.config.tenant.as_deref() {
            Some(owner) => {
                let (q, s) = topo.config.tenants.of(owner);
                section = s;
                Some(Quota {
                    owner,
                    max: q.max_active_threads,
                    max_pending: q.max_pending_messages,
                    max_pending_bytes: q.max_pending_bytes,
                    section: &section,
                    incoming: valid.xml().len(),
                })
            }
            None => None,
        };
        // A client's id is taken before the thread opens; given back if nothing is logged.
        let id = match message_id {
            Some(m) => Some(s.client_ids.take(m, s.store.as_deref())?),
            None => None,
        };
        let give_back = |_: &ThreadError| {
            if let Some(m) = message_id {
                s.client_ids.give_back(m);
            }
        };
        // The thread's labels with these added, checked (bound included) before anything is
        // done.
        let merged = s
            .entry_labels(thread_id, labels, fork.as_ref())
            .inspect_err(|_| {
                if let Some(m) = message_id {
                    s.client_ids.give_back(m);
                }
            })?;
        let opened = s.threads.open(thread_id, quota).inspect_err(give_back)?;
        if origin
            .as_ref()
            .is_some_and(|o| o.kind == crate::threads::OriginKind::Retry)
        {
            s.threads.clear_error(&opened.id);
        }
        let labelled = merged.and_then(|m| {
            s.threads.set_labels(&opened.id, m).ok()?;
            s.threads.labels(&opened.id)
        });
        if let Some(mut info) = opened.created {
            info.labels = labelled.clone();
            s.events.publish(EventKind::ThreadCreated { thread: info });
        }
        if labelled.is_some() {
            s.events.publish(EventKind::ThreadLabels {
                thread_id: opened.id.clone(),
                labels: labelled,
            });
        }
        if let Some(change) = opened.reactivated {
            s.publish_thread(change);
        }
        // A fork's copies, before the message that enters it, its parent the copy of its own.
        let parent_id = match &fork {
            Some(f) => {
                let ids = s.copy_into(&opened.id, f)?;
                parent_id.and_then(|p| ids.get(&p).cloned())
            }
            None => parent_id,
        };
        let admission = Admission {
            parent_id,
            from,
            valid,
            approval: None,
            id,
            origin,
        };
        let admitted = s
            .admit(&opened.id, listener, admission)
            .inspect_err(give_back)?;
        s.answer_admitted(&opened.id, admitted)
    }
}

/// How a message enters a thread from outside the running handlers: its sender, thread
/// (none: a new one), a client's id for it, its parent and origin (an inject has none).
pub(super) struct Entry<'a> {
    pub from: Arc<str>,
    pub thread_id: Option<&'a str>,
    pub message_id: Option<&'a str>,
    pub parent_id: Option<Arc<str>>,
    pub origin: Option<crate::threads::Origin>,
    /// Labels added to its thread's.
    pub labels: Option<&'a crate::threads::Labels>,
    /// A fork's: the new thread's copies and labels (`fork.rs`).
    pub fork: Option<ForkEntry<'a>>,
}

/// What `inject::enter` does for a fork, past what it does for any entry.
pub(super) struct ForkEntry<'a> {
    /// The thread forked, and the message forked at.
    pub thread: &'a str,
    pub at: &'a str,
    /// Copied into the new thread before the message enters.
    pub copies: &'a [crate::threads::MessageRecord],
    /// The labels the thread forked has (a client's, not the server's).
    pub inherited: crate::threads::Labels,
}

impl super::Shared {
    /// The refusals of an organism too busy for more, whatever is sent: the store failing
    /// or behind, the pending limit reached. Asked before a payload is read, so that a
    /// client retrying under load costs the read nothing; and again in [`Self::room_for`].
    fn shed(&self) -> Result<(), InjectError> {
        if let Some(store) = &self.store {
            if let Some(e) = store.failure() {
                return Err(InjectError::StoreFailed(e));
            }
            if store.backlogged() {
                return Err(InjectError::StoreBehind);
            }
        }
        let pending = self.load.pending.load(Ordering::SeqCst);
        if pending >= self.limits.max_pending_messages {
            return Err(InjectError::Overloaded {
                pending,
                max: self.limits.max_pending_messages,
            });
        }
        let bytes = self.load.pending_bytes.load(Ordering::Relaxed);
        if bytes >= self.limits.max_pending_bytes {
            return Err(InjectError::OverloadedBytes {
                bytes,
                max: self.limits.max_pending_bytes,
            });
        }
        Ok(())
    }

    /// What holds for every message that enters from outside before its thread opens: room
    /// ([`Self::shed`]), a thread the store holds and memory does not adopted, a fork's
    /// thread new, the tenant's token budget for an LLM listener.
    fn room_for(
        &self,
        listener: &super::dispatch::Listener,
        thread_id: Option<&str>,
        fork: bool,
    ) -> Result<(), InjectError> {
        let s = self;
        s.shed()?;
        // A thread from before a restart, or evicted from memory, continues where its
        // stored history ends.
        if let Some(id) = thread_id {
            s.adopt_stored(id);
        }
        // A fork opens a thread: one that exists is not one.
        if let Some(t) = thread_id.filter(|t| fork && s.threads.contains(t)) {
            return Err(ThreadError::Exists(t.to_string()).into());
        }
        // A tenant's LLM listener waits while a window of its tenant's budget is used up.
        if let (crate::config::ListenerKind::Llm, Some(t)) =
            (listener.config.kind, listener.config.tenant.as_deref())
        {
            if let Some(e) = s.budgets.exhausted(t) {
                return Err(InjectError::BudgetExhausted(e));
            }
        }
        Ok(())
    }

    /// The labels a thread entered has after the entry: its own (a fork's: those of the
    /// thread forked, a client's) with `labels` added, checked, then a fork's own.
    fn entry_labels(
        &self,
        thread_id: Option<&str>,
        labels: Option<&crate::threads::Labels>,
        fork: Option<&ForkEntry<'_>>,
    ) -> Result<Option<crate::threads::Labels>, InjectError> {
        if labels.is_none() && fork.is_none() {
            return Ok(None);
        }
        let now = match fork {
            Some(f) => Some(Arc::new(f.inherited.clone())),
            None => thread_id.and_then(|t| self.threads.labels(t)),
        };
        let patch = labels.map(crate::threads::as_patch).unwrap_or_default();
        let mut merged = crate::threads::patched(now.as_deref(), &patch)?;
        if let Some(f) = fork {
            merged.insert(crate::threads::FORKED_FROM.into(), f.thread.into());
            merged.insert(crate::threads::FORKED_AT.into(), f.at.into());
        }
        Ok(Some(merged))
    }

    /// Loads a thread the store has and memory does not (from before a restart, or
    /// evicted), once the store has what was published: else its count is behind, and a
    /// new message would take the slot of one not yet written.
    pub(super) fn adopt_stored(&self, id: &str) {
        if let Some(store) = self.store.as_ref().filter(|_| !self.threads.contains(id)) {
            store.catch_up(super::READ_CATCH_UP);
            if let Ok(Some(info)) = store.thread(id) {
                self.threads.adopt(&info);
            }
        }
    }

    /// An inject's answer for what its admission came to: a message logged but not queued
    /// (the inbox full, the thread over its budget) is published here, and refused.
    fn answer_admitted(
        &self,
        thread: &Arc<str>,
        admitted: Admitted,
    ) -> Result<InjectReceipt, InjectError> {
        let (record, e) = match admitted {
            Admitted::Queued(message_id) => {
                return Ok(InjectReceipt {
                    thread_id: thread.clone(),
                    message_id,
                })
            }
            Admitted::Refused(record, e) => (record, e),
            // Over the thread's budget: logged as failed.
            Admitted::NotQueued(record) => (
                record,
                ThreadError::BudgetExceeded {
                    id: thread.to_string(),
                    max: self.limits.max_messages_per_thread,
                },
            ),
        };
        self.events.publish(EventKind::Message { message: record });
        if let Some(change) = self.threads.settle(thread) {
            self.publish_thread(change);
        }
        Err(InjectError::Thread(e))
    }
}
