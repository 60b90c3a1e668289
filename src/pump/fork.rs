//! Fork: a new thread that begins as another did, up to one of its messages, and goes on
//! from there, perhaps another way. A message here is whole (a payload, a receiver, a
//! parent), so nothing is restored: the messages before it are copied into the new thread
//! (its causal path, or every earlier message), each a new message with
//! `origin {kind: fork, of}` and the status it had, and the message itself (or its edited
//! payload, or to another receiver) passes the gate again as the organism is now, through
//! the one door an inject takes (`inject::enter`). The fork is labelled with the thread and
//! message it came of (`agentserver.forked_from`, `agentserver.forked_at`), inherits the
//! thread's labels, and counts as a thread opened; the thread forked is not touched.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::ListenerKind;
use crate::threads::{
    Labels, MessageRecord, MessageStatus, NewMessage, Origin, Page, ThreadError, RESERVED_PREFIX,
};

use super::inject::{Entry, ForkEntry};
use super::retry::RetryError;
use super::{InjectError, InjectReceipt, Organism, Shared};

/// What a fork copies before the message it is forked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ForkCopy {
    /// The message's causal path: its parent, its parent's parent, … to the first.
    #[default]
    Path,
    /// Every earlier message of the thread.
    Prefix,
}

/// A fork asked for.
#[derive(Debug, Clone, Default)]
pub struct ForkRequest<'a> {
    /// The message forked at: admitted again in the fork.
    pub at: &'a str,
    /// Its payload, edited (else its own).
    pub payload_xml: Option<&'a str>,
    /// Another receiver for it (else its own).
    pub to: Option<&'a str>,
    /// The fork's id (else a new one); a thread that exists is refused.
    pub thread_id: Option<&'a str>,
    /// Labels for the fork, over those it inherits.
    pub labels: Option<&'a Labels>,
    pub copy: ForkCopy,
}

/// What a fork does (or would do, for a dry run).
#[derive(Debug, Clone)]
pub struct ForkPlan {
    /// The message forked at, as the thread has it.
    pub at: MessageRecord,
    /// The messages copied before it, first to last.
    pub copies: Vec<MessageRecord>,
    /// Who receives it in the fork, and the kind of it (an external or LLM listener's call
    /// has effects, or a cost, beyond the organism).
    pub to: Arc<str>,
    pub kind: ListenerKind,
}

#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("no message `{at}` in thread `{thread}`")]
    NotFound { thread: String, at: String },
    #[error("a fork at `{at}` holds {messages} messages; a thread holds at most {max}")]
    TooLong {
        at: String,
        messages: usize,
        max: u64,
    },
    #[error(transparent)]
    Gate(#[from] RetryError),
}

impl From<InjectError> for ForkError {
    fn from(e: InjectError) -> Self {
        ForkError::Gate(RetryError::Inject(e))
    }
}

impl From<crate::store::StoreError> for ForkError {
    fn from(e: crate::store::StoreError) -> Self {
        ForkError::Gate(RetryError::Store(e))
    }
}

impl Organism {
    /// What forking `thread` as `req` says would do, checked as a fork is; nothing changes.
    pub fn plan_fork(&self, thread: &str, req: &ForkRequest<'_>) -> Result<ForkPlan, ForkError> {
        self.checked_fork(thread, req).map(|(plan, _, _)| plan)
    }

    /// Forks `thread` as `req` says: what was done, and the receipt of the message admitted
    /// in the new thread.
    pub fn fork(
        &self,
        thread: &str,
        req: &ForkRequest<'_>,
    ) -> Result<(ForkPlan, InjectReceipt), ForkError> {
        let (plan, listener, valid) = self.checked_fork(thread, req)?;
        let inherited = self
            .history()
            .thread_info(thread)?
            .and_then(|t| t.labels)
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let entry = Entry {
            from: plan.at.from.clone(),
            thread_id: req.thread_id,
            message_id: None,
            parent_id: plan.at.parent_id.clone(),
            origin: Some(Origin::fork(plan.at.id.clone())),
            labels: req.labels,
            fork: Some(ForkEntry {
                thread,
                at: &plan.at.id,
                copies: &plan.copies,
                inherited,
            }),
        };
        let receipt = self.enter(&listener, valid, entry)?;
        Ok((plan, receipt))
    }

    fn checked_fork(
        &self,
        thread: &str,
        req: &ForkRequest<'_>,
    ) -> Result<
        (
            ForkPlan,
            Arc<super::dispatch::Listener>,
            crate::schema::ValidatedPayload,
        ),
        ForkError,
    > {
        let not_found = || ForkError::NotFound {
            thread: thread.to_string(),
            at: req.at.to_string(),
        };
        let log = self.history().thread_page(thread, Page::ALL)?;
        let log = log.map(|p| p.items).unwrap_or_default();
        let at = log
            .iter()
            .find(|m| &*m.id == req.at)
            .cloned()
            .ok_or_else(not_found)?;
        let copies: Vec<MessageRecord> = match req.copy {
            ForkCopy::Prefix => {
                // What a rewind superseded is no longer the thread's past.
                let rewinds = self.history().rewinds(thread)?;
                log.iter()
                    .filter(|m| m.slot_index < at.slot_index)
                    .filter(|m| !crate::threads::superseded(&rewinds, m.slot_index))
                    .cloned()
                    .collect()
            }
            ForkCopy::Path => {
                let by_id: HashMap<&str, &MessageRecord> =
                    log.iter().map(|m| (&*m.id, m)).collect();
                let mut path = Vec::new();
                let mut next = at.parent_id.as_deref();
                while let Some(m) = next.and_then(|p| by_id.get(p)) {
                    // A parent comes before its child: a loop cannot form, but a bound holds.
                    if path.len() > log.len() {
                        break;
                    }
                    path.push((*m).clone());
                    next = m.parent_id.as_deref();
                }
                path.reverse();
                path
            }
        };
        let max = self.shared.limits.max_messages_per_thread;
        if copies.len() as u64 >= max {
            return Err(ForkError::TooLong {
                at: req.at.to_string(),
                messages: copies.len() + 1,
                max,
            });
        }
        let to: Arc<str> = match (req.to, &at.to) {
            (Some(t), _) => Arc::from(t),
            (None, Some(t)) => t.clone(),
            (None, None) => {
                return Err(ForkError::Gate(RetryError::NoRoute {
                    id: req.at.to_string(),
                    to: "?".into(),
                    why: "it named no receiver: say `to`".into(),
                }))
            }
        };
        let xml = req.payload_xml.unwrap_or(&at.payload_xml);
        let (listener, valid) = self.gate_again(&at, &to, xml)?;
        let plan = ForkPlan {
            kind: listener.config.kind,
            to,
            at,
            copies,
        };
        Ok((plan, listener, valid))
    }
}

impl Shared {
    /// `fork`'s copies logged in `thread`, first to last, each a new message pointing at
    /// its original (`origin {kind: fork, of}`) and at the copy of its parent; a message not
    /// finished when copied is copied `killed`. The thread does not take their errors. The
    /// new id of each original.
    pub(super) fn copy_into(
        &self,
        thread: &str,
        fork: &ForkEntry<'_>,
    ) -> Result<HashMap<Arc<str>, Arc<str>>, ThreadError> {
        let mut ids: HashMap<Arc<str>, Arc<str>> = HashMap::with_capacity(fork.copies.len());
        for m in fork.copies {
            let (status, error) = if m.status.is_final() {
                (m.status, m.error.clone())
            } else {
                (
                    MessageStatus::Killed,
                    Some("not finished when forked".into()),
                )
            };
            let copy = NewMessage {
                id: crate::threads::new_id(),
                parent_id: m.parent_id.as_ref().and_then(|p| ids.get(p).cloned()),
                from: m.from.clone(),
                to: m.to.clone(),
                payload_type: m.payload_type.clone(),
                payload_xml: m.payload_xml.clone(),
                status,
                error,
                origin: Origin::fork(m.id.clone()),
            };
            let new = copy.id.clone();
            // A new thread is neither killed nor over its budget (checked): the copy is kept.
            let _ = self.log_kept(thread, copy)?;
            ids.insert(m.id.clone(), new);
        }
        self.threads.clear_error(thread);
        Ok(ids)
    }
}
