//! Rewind: a thread taken back to one of its messages, keeping its id (an outside system
//! may share it). Every message after it is superseded (`threads::Rewind`: kept, hidden
//! from the thread's listings unless asked for, out of an LLM listener's context), and the
//! message (or its edited payload) passes the gate again as the organism is now, through
//! the one door an inject takes, at a new slot. A thread with work under way is refused,
//! or aborted first if the caller says so.

use std::sync::Arc;

use crate::config::ListenerKind;
use crate::events::EventKind;
use crate::threads::{superseded, MessageRecord, Origin, Page, ThreadError, ThreadStatus};

use super::inject::Entry;
use super::retry::RetryError;
use super::{InjectError, InjectReceipt, Organism};

/// What a rewind does to a thread with work under way (queued, running, or waiting for a
/// person).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IfActive {
    /// Refuse the rewind.
    #[default]
    Reject,
    /// Abort the thread first.
    Abort,
}

/// A rewind asked for.
#[derive(Debug, Clone, Default)]
pub struct RewindRequest<'a> {
    /// The message rewound to: admitted again.
    pub to: &'a str,
    /// Its payload, edited (else its own).
    pub payload_xml: Option<&'a str>,
    pub if_active: IfActive,
}

/// What a rewind does (or would do, for a dry run).
#[derive(Debug, Clone)]
pub struct RewindPlan {
    /// The message rewound to.
    pub at: MessageRecord,
    /// The messages after it, not superseded already: superseded by the rewind.
    pub superseded: Vec<MessageRecord>,
    /// Its receiver, and the kind of it.
    pub to: Arc<str>,
    pub kind: ListenerKind,
}

#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    #[error("no message `{at}` in thread `{thread}`")]
    NotFound { thread: String, at: String },
    #[error("thread `{0}` has work under way; say `if_active: abort` to abort it first")]
    Active(String),
    #[error(transparent)]
    Gate(#[from] RetryError),
}

impl From<InjectError> for RewindError {
    fn from(e: InjectError) -> Self {
        RewindError::Gate(RetryError::Inject(e))
    }
}

impl From<crate::store::StoreError> for RewindError {
    fn from(e: crate::store::StoreError) -> Self {
        RewindError::Gate(RetryError::Store(e))
    }
}

impl Organism {
    /// What rewinding `thread` as `req` says would do, checked as a rewind is (but for
    /// the thread being active); nothing changes.
    pub fn plan_rewind(
        &self,
        thread: &str,
        req: &RewindRequest<'_>,
    ) -> Result<RewindPlan, RewindError> {
        self.checked_rewind(thread, req).map(|(plan, _, _)| plan)
    }

    /// Rewinds `thread` as `req` says: what was done, and the receipt of the message
    /// admitted again.
    pub fn rewind(
        &self,
        thread: &str,
        req: &RewindRequest<'_>,
    ) -> Result<(RewindPlan, InjectReceipt), RewindError> {
        let (plan, listener, valid) = self.checked_rewind(thread, req)?;
        let s = &self.shared;
        s.adopt_stored(thread);
        match s.threads.status(thread) {
            Some(ThreadStatus::Killed) => {
                return Err(InjectError::from(ThreadError::Killed(thread.to_string())).into())
            }
            Some(ThreadStatus::Active | ThreadStatus::Waiting) => match req.if_active {
                IfActive::Reject => return Err(RewindError::Active(thread.to_string())),
                IfActive::Abort => {
                    let _ = self.control().abort_thread(thread, "rewound");
                }
            },
            _ => {}
        }
        let rewind = s
            .threads
            .rewind(thread, plan.at.slot_index)
            .map_err(InjectError::from)?;
        s.events.publish(EventKind::ThreadRewound {
            thread_id: Arc::from(thread),
            to: plan.at.id.clone(),
            rewind,
            superseded: plan.superseded.len() as u64,
        });
        let entry = Entry {
            from: plan.at.from.clone(),
            thread_id: Some(thread),
            message_id: None,
            parent_id: plan.at.parent_id.clone(),
            origin: Some(Origin::rewind(plan.at.id.clone())),
            labels: None,
            fork: None,
        };
        let receipt = self.enter(&listener, valid, entry)?;
        Ok((plan, receipt))
    }

    fn checked_rewind(
        &self,
        thread: &str,
        req: &RewindRequest<'_>,
    ) -> Result<
        (
            RewindPlan,
            Arc<super::dispatch::Listener>,
            crate::schema::ValidatedPayload,
        ),
        RewindError,
    > {
        let history = self.history();
        let log = history.thread_page(thread, Page::ALL)?;
        let log = log.map(|p| p.items).unwrap_or_default();
        let rewinds = history.rewinds(thread)?;
        let at = log
            .iter()
            .find(|m| &*m.id == req.to)
            .cloned()
            .ok_or_else(|| RewindError::NotFound {
                thread: thread.to_string(),
                at: req.to.to_string(),
            })?;
        let later = log
            .into_iter()
            .filter(|m| m.slot_index > at.slot_index && !superseded(&rewinds, m.slot_index));
        let superseded = later.collect();
        let to = at.to.clone().ok_or_else(|| RetryError::NoRoute {
            id: at.id.to_string(),
            to: "?".into(),
            why: "it named no receiver".into(),
        })?;
        let xml = req.payload_xml.unwrap_or(&at.payload_xml);
        let (listener, valid) = self.gate_again(&at, &to, xml)?;
        let plan = RewindPlan {
            kind: listener.config.kind,
            to,
            at,
            superseded,
        };
        Ok((plan, listener, valid))
    }
}
