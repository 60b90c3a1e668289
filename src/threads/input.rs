//! What an input is: a message held at an approval gate, waiting for a person's decision,
//! as the pump keeps it, the store writes it and the API shows it; and how a thread waits
//! for its inputs (`waiting`), is woken, or is aborted.

use std::sync::Arc;

use super::{lock, MessageStatus, StatusChange, ThreadError, ThreadRegistry, ThreadStatus};
use crate::time::Timestamp;

/// What an input waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// A message held at its listener's approval gate.
    Approval,
    /// A message delivered to a `kind: human` listener, waiting for a person's answer.
    Question,
}

/// Where an input stands. Only `open` changes, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputStatus {
    Open,
    /// Let through (as it was, or edited: `result` names the new message).
    Approved,
    /// Refused by a person.
    Declined,
    /// A question answered: the answer's payloads were routed.
    Answered,
    /// Nobody decided in time; the gate's `on_timeout` was applied (`decision` says which).
    Expired,
    /// Nobody decided in time, and the gate passed the message on to `escalate_to`'s
    /// approvers: a new input holds it.
    Escalated,
    /// Withdrawn: its thread was killed or aborted, or its listener removed.
    Cancelled,
}

impl InputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Approval => "approval",
            InputKind::Question => "question",
        }
    }
}

impl InputStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            InputStatus::Open => "open",
            InputStatus::Approved => "approved",
            InputStatus::Declined => "declined",
            InputStatus::Answered => "answered",
            InputStatus::Expired => "expired",
            InputStatus::Escalated => "escalated",
            InputStatus::Cancelled => "cancelled",
        }
    }
}

/// One input: what waits, for whom, and how it was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRow {
    pub id: Arc<str>,
    pub kind: InputKind,
    pub status: InputStatus,
    pub thread_id: Arc<str>,
    /// The held message.
    pub message_id: Arc<str>,
    /// The listener whose gate holds it.
    pub listener: Arc<str>,
    pub tenant: Option<String>,
    /// The held message's sender, parent, slot, type and payload (shared with the held
    /// message's record: a row and its copies hold no strings of their own but these).
    pub from: Arc<str>,
    pub parent_id: Option<Arc<str>>,
    pub slot_index: u64,
    pub payload_type: Arc<str>,
    pub payload_xml: crate::xml::SharedXml,
    pub prompt: Option<String>,
    /// The identity that injected the thread's first message (`key:alice`), when known:
    /// what `distinct_from_sender` compares a decider with.
    pub requested_by: Option<Arc<str>>,
    pub created: Timestamp,
    pub expires: Option<Timestamp>,
    /// `key:alice`, a JWT `sub`, `timeout`, or `system` (a cancellation).
    pub decided_by: Option<String>,
    pub decided: Option<Timestamp>,
    /// `approve`, `edit`, `reject`, or for a cancellation what caused it.
    pub decision: Option<String>,
    pub reason: Option<String>,
    /// The message an edit let through instead.
    pub result: Option<String>,
}

/// Which inputs to read (all given must match).
#[derive(Debug, Clone, Default)]
pub struct InputFilter {
    pub status: Option<InputStatus>,
    pub listener: Option<String>,
    pub thread: Option<String>,
    pub kind: Option<InputKind>,
    /// A tenant's principal sees only its tenant's inputs.
    pub tenant: Option<String>,
}

impl InputFilter {
    pub fn matches(&self, r: &InputRow) -> bool {
        self.status.is_none_or(|s| r.status == s)
            && self.listener.as_deref().is_none_or(|l| &*r.listener == l)
            && self.thread.as_deref().is_none_or(|t| &*r.thread_id == t)
            && self.kind.is_none_or(|k| r.kind == k)
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| r.tenant.as_deref() == Some(t))
    }
}

impl ThreadRegistry {
    /// Whether the message at `slot` was in the thread when it was last aborted (so a stop
    /// of it now is that abort's).
    pub fn aborted_at(&self, thread: &str, slot: u64) -> bool {
        lock(self.shard(thread))
            .threads
            .get(thread)
            .is_some_and(|e| slot < e.abort_mark)
    }

    /// An input of the thread was opened apart from a message appended held (a question to
    /// a person, or one restored after a restart): the thread waits for it once quiet.
    pub fn open_input(&self, thread: &str) -> Option<StatusChange> {
        let mut shard = lock(self.shard(thread));
        let e = shard.threads.get_mut(thread)?;
        e.inputs += 1;
        self.settle_in(&mut shard, thread)
    }

    /// An open input of the thread was decided or withdrawn. With `held` (the slot of a
    /// message held at a gate), that message takes `status`: `Pending` queues it again (the
    /// thread is active), anything else is final. Returns the thread's change, if any.
    pub fn close_input(
        &self,
        thread: &str,
        held: Option<(u64, MessageStatus, Option<String>)>,
    ) -> Option<StatusChange> {
        let mut shard = lock(self.shard(thread));
        let shard = &mut *shard;
        let e = shard.threads.get_mut(thread)?;
        e.inputs = e.inputs.saturating_sub(1);
        e.last_activity = Timestamp::now();
        let mut counted = None;
        let mut revived = None;
        if let Some((slot, status, error)) = held {
            let index = slot.checked_sub(e.slot_base).map(|i| i as usize);
            // A failure is the thread's (first) error; a decline or a cancellation is not.
            let failed = matches!(status, MessageStatus::Undeliverable | MessageStatus::Failed);
            if failed && e.error.is_none() {
                e.error = error.clone();
            }
            if let Some(m) = index.and_then(|i| e.messages.get_mut(i)) {
                counted = Some((m.to.clone(), m.status, status));
                // An approved payload counts as pending (never refused: counted).
                if let Some(p) = &e.pending {
                    p.moved(m.payload_xml.len(), Some(m.status), status);
                }
                m.status = status;
                m.error = error;
            }
            if status == MessageStatus::Pending && e.status != ThreadStatus::Killed {
                e.add_outstanding();
                if e.status != ThreadStatus::Active {
                    // Work approved is never refused: counted, not checked.
                    let _ = self.activate(e.owner.as_ref(), None);
                    e.status = ThreadStatus::Active;
                    revived = Some(e.change());
                }
            }
        }
        if let Some((to, old, new)) = counted {
            shard.uncount_final(to.as_ref(), old);
            shard.count_final(to.as_ref(), new);
        }
        revived.or_else(|| self.settle_in(shard, thread))
    }

    /// A waiting thread gets work again (an edited message let through): it becomes active.
    /// Returns the change, if any.
    pub fn wake(&self, thread: &str) -> Option<StatusChange> {
        let mut shard = lock(self.shard(thread));
        let e = shard.threads.get_mut(thread)?;
        if e.status != ThreadStatus::Waiting {
            return None;
        }
        // Work approved is never refused: counted, not checked.
        let _ = self.activate(e.owner.as_ref(), None);
        e.status = ThreadStatus::Active;
        Some(e.change())
    }

    /// Who sent the thread's first message, if this registry holds it (the identity that
    /// injected the thread).
    pub fn first_sender(&self, thread: &str) -> Option<Arc<str>> {
        let shard = lock(self.shard(thread));
        let e = shard.threads.get(thread)?;
        if e.slot_base > 0 {
            return None;
        }
        e.messages.first().map(|m| m.from.clone())
    }

    /// Aborts a thread: it becomes `aborted` (not final: the next inject revives it), its
    /// running handlers are cancelled (their token is, and the thread gets a fresh one for
    /// what comes next). Returns the change; `None` if it was already aborted. A killed
    /// thread cannot be aborted.
    pub fn abort(&self, thread: &str) -> Result<Option<StatusChange>, ThreadError> {
        self.stop(thread, ThreadStatus::Aborted)
    }
}
