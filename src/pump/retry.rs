//! Retry: a message that ended `failed`, `rejected`, `undeliverable` or `killed` admitted
//! again, to the same receiver in the same thread, as a new message with the same sender
//! and parent and `origin {kind: retry, of}`. A message here is whole (a payload, a
//! receiver, a parent), so nothing is restored: it passes the gate again as the organism is
//! now (the receiver's schema, the sender's peers, approval gates, quotas) through the one
//! door an inject takes (`inject::enter`). A message is retried once (a retry that fails is
//! retried in turn), so a first try has one chain of retries, of at most
//! [`MAX_RETRY_DEPTH`].

use std::sync::Arc;

use crate::config::ListenerKind;
use crate::schema::ValidatedPayload;
use crate::threads::{MessageRecord, MessageStatus, Origin, OriginKind};
use crate::xml::normalize_payload;

use super::dispatch::Listener;
use super::inject::Entry;
use super::{InjectError, InjectReceipt, Organism};

/// Retries of one first try, at most.
pub const MAX_RETRY_DEPTH: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("no message `{0}`")]
    NotFound(String),
    #[error(
        "message `{id}` is `{status}`: only a failed, rejected, undeliverable or killed message is retried"
    )]
    NotRetryable { id: String, status: String },
    #[error(
        "message `{id}` was retried {MAX_RETRY_DEPTH} times already (a retry of a retry counts)"
    )]
    Limit { id: String },
    #[error("message `{id}` was retried already, by `{by}`: retry that one")]
    Retried { id: String, by: String },
    #[error("message `{id}` cannot go to `{to}` now: {why}")]
    NoRoute { id: String, to: String, why: String },
    #[error(transparent)]
    Inject(#[from] InjectError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The newest retry of message `id` in its thread's `log`, if it was retried.
fn retry_of<'l>(log: &'l [MessageRecord], id: &str) -> Option<&'l MessageRecord> {
    log.iter()
        .rev()
        .find(|m| m.origin.kind == OriginKind::Retry && m.origin.of.as_deref() == Some(id))
}

/// What a retry does (or would do, for a dry run).
#[derive(Debug, Clone)]
pub struct RetryPlan {
    /// The message retried.
    pub message: MessageRecord,
    /// Its receiver, and the kind of it: an external or LLM listener's call has effects (or
    /// a cost) beyond the organism.
    pub to: Arc<str>,
    pub kind: ListenerKind,
    /// This retry's place in its chain (1: a retry of a first try).
    pub depth: u32,
}

impl Organism {
    /// What retrying message `id` would do, checked as a retry is; nothing changes.
    pub fn plan_retry(&self, id: &str) -> Result<RetryPlan, RetryError> {
        self.checked_retry(id).map(|(plan, _, _)| plan)
    }

    /// Retries each failed message of thread `id` that was not retried already (the newest
    /// of each chain) nor superseded by a rewind: how many, or why it stopped at one (none: nothing to retry).
    pub fn retry_failures(&self, id: &str) -> Result<usize, String> {
        let log = self.history().thread_page(id, crate::threads::Page::ALL);
        let log = log
            .map_err(|e| e.to_string())?
            .map(|p| p.items)
            .unwrap_or_default();
        // What a rewind superseded is no longer the thread's to retry.
        let rewinds = self.history().rewinds(id).map_err(|e| e.to_string())?;
        let failed: Vec<&MessageRecord> = log
            .iter()
            .filter(|m| m.status == MessageStatus::Failed && retry_of(&log, &m.id).is_none())
            .filter(|m| !crate::threads::superseded(&rewinds, m.slot_index))
            .collect();
        if failed.is_empty() {
            return Err("no failed message to retry".into());
        }
        for m in &failed {
            self.retry(&m.id).map_err(|e| e.to_string())?;
        }
        Ok(failed.len())
    }

    /// Retries message `id`: the new message's receipt.
    pub fn retry(&self, id: &str) -> Result<InjectReceipt, RetryError> {
        let (plan, listener, valid) = self.checked_retry(id)?;
        let m = plan.message;
        let entry = Entry {
            from: m.from.clone(),
            thread_id: Some(&m.thread_id),
            message_id: None,
            parent_id: m.parent_id.clone(),
            origin: Some(Origin::retry(m.id.clone())),
            labels: None,
            fork: None,
        };
        Ok(self.enter(&listener, valid, entry)?)
    }

    fn checked_retry(
        &self,
        id: &str,
    ) -> Result<(RetryPlan, Arc<Listener>, ValidatedPayload), RetryError> {
        let history = self.history();
        let message = history
            .message(id)?
            .ok_or_else(|| RetryError::NotFound(id.to_string()))?;
        if !matches!(
            message.status,
            MessageStatus::Failed
                | MessageStatus::Rejected
                | MessageStatus::Undeliverable
                | MessageStatus::Killed
        ) {
            return Err(RetryError::NotRetryable {
                id: id.to_string(),
                status: format!("{:?}", message.status).to_lowercase(),
            });
        }
        // One chain of retries a first try: a message retried already is not again.
        let log = history.thread_page(&message.thread_id, crate::threads::Page::ALL)?;
        let log = log.map(|p| p.items).unwrap_or_default();
        if let Some(by) = retry_of(&log, id) {
            return Err(RetryError::Retried {
                id: id.to_string(),
                by: by.id.to_string(),
            });
        }
        let mut depth = 1;
        let mut at = message.clone();
        while at.origin.kind == OriginKind::Retry {
            depth += 1;
            if depth > MAX_RETRY_DEPTH {
                return Err(RetryError::Limit { id: id.to_string() });
            }
            let Some(of) = at.origin.of.as_deref().map(|o| history.message(o)) else {
                break;
            };
            match of? {
                Some(earlier) => at = earlier,
                None => break,
            }
        }
        let to = message.to.clone().ok_or_else(|| RetryError::NoRoute {
            id: id.to_string(),
            to: "?".into(),
            why: "it named no receiver".into(),
        })?;
        let (listener, valid) = self.gate_again(&message, &to, &message.payload_xml)?;
        let plan = RetryPlan {
            kind: listener.config.kind,
            to,
            message,
            depth,
        };
        Ok((plan, listener, valid))
    }

    /// `payload_xml` checked as `m` would be were it sent to `to` now: the receiver's
    /// schema, and (when `m`'s sender is a listener) the sender's peers, as the hop that
    /// made `m` was checked (a reply to the sender of what it handled always may). What a
    /// retry and a fork admit again.
    pub(super) fn gate_again(
        &self,
        m: &MessageRecord,
        to: &Arc<str>,
        payload_xml: &str,
    ) -> Result<(Arc<Listener>, ValidatedPayload), RetryError> {
        let no_route = |why: String| RetryError::NoRoute {
            id: m.id.to_string(),
            to: to.to_string(),
            why,
        };
        let listener = self
            .shared
            .topo()
            .listeners
            .get(&**to)
            .cloned()
            .ok_or_else(|| no_route("it is not a listener now".into()))?;
        let payload =
            normalize_payload(payload_xml, &self.shared.xml_limits).map_err(InjectError::from)?;
        let ty = payload.payload_type.clone();
        let schema = listener
            .config
            .schema_for(&ty)
            .ok_or_else(|| InjectError::NotAccepted {
                listener: to.to_string(),
                payload_type: ty.to_string(),
            })?;
        let valid = schema.validate(payload).map_err(InjectError::Invalid)?;
        if self.shared.topo().listeners.contains_key(&*m.from) {
            let handling = match &m.parent_id {
                Some(p) => self.history().message(p)?.map(|p| p.from.to_string()),
                None => None,
            };
            let receivers = self
                .route_preview(&m.from, handling.as_deref().unwrap_or(""), Some(to), &ty)
                .map_err(no_route)?;
            if !receivers.contains(to) {
                return Err(no_route("the sender's peers do not reach it".into()));
            }
        }
        Ok((listener, valid))
    }
}
