//! The inbox: messages held at approval gates until a person decides (`approval:` on a
//! listener, `config::approval`).
//!
//! The gate is a pump property: [`Shared::admit`] asks the receiving listener's gate before
//! it queues anything, for injects and handler outputs alike, and for listeners placed on
//! workers (a delivery is published to workers only once queued). A held message is logged
//! `held` and published; its input is written to the store's `inputs` table at once (with the
//! message itself, so a restart restores it without the log) and kept here, with the
//! validated payload, until it is decided. Its thread is `waiting` once nothing else runs.
//!
//! A decision removes the input from [`Held`] under its lock, so of two people deciding at
//! once exactly one wins; the other is answered with the first decision. Approve queues the
//! message (`pending`, at the back of its (listener, thread) queue); reject makes it
//! `declined` (final, not a failure: no counter, no thread error); edit makes it
//! `superseded` and admits the edited payload, validated again, with the same sender and
//! parent. A timer (`timeout`, on the organism's [`Clock`]) applies `on_timeout`. A kill
//! cancels the thread's inputs; a listener removed by a reload makes its held messages
//! undeliverable when they are let through.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::config::approval::{Approval, Approvers, Decision, Human};
use crate::config::Role;
use crate::events::EventKind;
use crate::hash::SeededMap;
use crate::schema::ValidatedPayload;
use crate::store::inputs::InputsTable;
use crate::sync::lock;
use crate::threads::{
    InputFilter, InputKind, InputRow, InputStatus, MessageRecord, MessageStatus, NewMessage, Page,
    Paged, ThreadError,
};
use crate::time::{Clock, Timestamp};
use crate::xml::normalize_payload;

mod ask;
mod restore;
pub use ask::Answer;
pub(crate) use restore::EXPIRY_TICK;

use super::admit::{Admission, Admitted};
use super::dispatch::{Job, Listener};
use super::{InjectError, Organism, Shared};

/// Decided inputs kept in memory (newest), for a second decider's answer and for an
/// organism without a store.
const RECENT_DECIDED: usize = 4096;

/// Who decides: a principal as the pump sees it (the API maps its own).
#[derive(Debug, Clone)]
pub struct Decider {
    /// `key:NAME` for an API key, a JWT's `sub`; `None` without authentication.
    pub name: Option<String>,
    pub role: Role,
    /// A tenant's principal decides only its tenant's inputs.
    pub tenant: Option<String>,
}

impl Decider {
    fn shown(&self) -> String {
        self.name.clone().unwrap_or_else(|| "api".to_string())
    }
}

/// What a person decides.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Let it through; with a payload (XML), let that through instead (an edit).
    Approve {
        reason: Option<String>,
        payload_xml: Option<String>,
    },
    Reject {
        reason: Option<String>,
    },
}

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no input `{0}`")]
    NotFound(String),
    #[error("input `{}` was already decided: {}", .0.id, .0.status.as_str())]
    AlreadyDecided(Box<InputRow>),
    #[error("{0}")]
    NotAnApprover(String),
    #[error("this gate does not allow `{decision}` (it allows: {allowed})")]
    NotAllowed {
        decision: &'static str,
        allowed: String,
    },
    /// The edited payload: malformed, of a type the listener does not accept, or invalid.
    #[error("{0}")]
    Invalid(InjectError),
    /// An answer's payloads: every problem found (none was routed).
    #[error("{} of the answer's payloads cannot be accepted; nothing was", .0.len())]
    InvalidAnswer(Vec<String>),
    #[error("the organism is stopping")]
    Stopping,
    #[error("the store could not record the decision: {0}")]
    Store(crate::store::StoreError),
}

/// One open input.
struct Held {
    row: InputRow,
    record: MessageRecord,
    /// `None` for an input restored after a restart: validated again when let through.
    valid: Option<ValidatedPayload>,
    /// The gate as it was when the message was held (a reload applies to new messages).
    approval: Option<Arc<Approval>>,
    /// For a question: the human listener's settings when it was asked.
    human: Option<Arc<Human>>,
}

/// The open inputs, the recently decided ones, and the table that keeps them.
pub(crate) struct Inbox {
    open: Mutex<SeededMap<Arc<str>, Held>>,
    recent: Mutex<VecDeque<InputRow>>,
    /// Decisions since start by (listener, decision): how many, and the seconds their
    /// inputs waited.
    decisions: Mutex<SeededMap<(String, String), (u64, f64)>>,
    table: Option<InputsTable>,
    pub(crate) clock: Clock,
}

impl Inbox {
    pub(crate) fn new(table: Option<InputsTable>, clock: Clock) -> Self {
        Inbox {
            open: Mutex::default(),
            recent: Mutex::default(),
            decisions: Mutex::default(),
            table,
            clock,
        }
    }

    fn remember(&self, row: InputRow) {
        let decision = match row.status {
            InputStatus::Expired => "expired".to_string(),
            InputStatus::Cancelled => "cancelled".to_string(),
            _ => row.decision.clone().unwrap_or_default(),
        };
        let waited = row
            .decided
            .map_or(0.0, |d| d.0.saturating_sub(row.created.0) as f64 / 1000.0);
        let mut decisions = lock(&self.decisions);
        let entry = decisions
            .entry((row.listener.clone(), decision))
            .or_default();
        entry.0 += 1;
        entry.1 += waited;
        drop(decisions);
        let mut recent = lock(&self.recent);
        if recent.len() >= RECENT_DECIDED {
            recent.pop_front();
        }
        recent.push_back(row);
    }

    fn decided(&self, id: &str) -> Option<InputRow> {
        if let Some(r) = lock(&self.recent).iter().rev().find(|r| r.id == id) {
            return Some(r.clone());
        }
        self.table.as_ref()?.get(id).ok().flatten()
    }

    /// A tenant's open inputs, the threads they are in, and whether `thread` is one.
    fn tenant_totals(&self, tenant: &str, thread: &str) -> (usize, usize, bool) {
        let open = lock(&self.open);
        let mut threads = std::collections::HashSet::new();
        let mut inputs = 0;
        for h in open
            .values()
            .filter(|h| h.row.tenant.as_deref() == Some(tenant))
        {
            inputs += 1;
            threads.insert(h.row.thread_id.as_str());
        }
        let waits = threads.contains(thread);
        (inputs, threads.len(), waits)
    }

    fn held_totals(&self) -> (usize, usize) {
        let open = lock(&self.open);
        (
            open.len(),
            open.values().map(|h| h.row.payload_xml.len()).sum(),
        )
    }
}

impl Organism {
    /// The inbox: open and decided inputs, and decisions.
    pub fn inputs(&self) -> Inputs<'_> {
        Inputs { organism: self }
    }
}

/// The inbox of an organism ([`Organism::inputs`]).
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    organism: &'a Organism,
}

impl<'a> Inputs<'a> {
    fn shared(self) -> &'a Arc<Shared> {
        &self.organism.shared
    }

    /// One page of inputs, newest first: from the store when there is one, else from
    /// memory (the open ones and the last decided).
    pub fn list(
        self,
        filter: &InputFilter,
        page: Page,
    ) -> Result<Paged<InputRow>, crate::store::StoreError> {
        let inbox = &self.shared().inbox;
        if let Some(table) = &inbox.table {
            return table.page(filter, page);
        }
        let mut all: Vec<InputRow> = lock(&inbox.recent).iter().cloned().collect();
        all.extend(lock(&inbox.open).values().map(|h| h.row.clone()));
        all.retain(|r| filter.matches(r));
        all.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
        Ok(page.cut(all))
    }

    /// One input, open or decided.
    pub fn get(self, id: &str) -> Option<InputRow> {
        let inbox = &self.shared().inbox;
        if let Some(h) = lock(&inbox.open).get(id) {
            return Some(h.row.clone());
        }
        inbox.decided(id)
    }

    /// Inputs open now.
    pub fn open_count(self) -> usize {
        lock(&self.shared().inbox.open).len()
    }

    /// Inputs open now by (listener, kind), sorted.
    pub fn open_by_listener(self) -> Vec<(String, InputKind, u64)> {
        let mut counts: std::collections::BTreeMap<(String, &'static str), (InputKind, u64)> =
            Default::default();
        for h in lock(&self.shared().inbox.open).values() {
            let kind = match h.row.kind {
                InputKind::Approval => "approval",
                InputKind::Question => "question",
            };
            counts
                .entry((h.row.listener.clone(), kind))
                .or_insert((h.row.kind, 0))
                .1 += 1;
        }
        counts
            .into_iter()
            .map(|((l, _), (k, n))| (l, k, n))
            .collect()
    }

    /// Decisions since start by (listener, decision: `approve`, `edit`, `reject`,
    /// `answer`, `expired`, `cancelled`): how many, and the seconds their inputs waited in
    /// all. Sorted.
    pub fn decisions(self) -> Vec<(String, String, u64, f64)> {
        let mut v: Vec<_> = lock(&self.shared().inbox.decisions)
            .iter()
            .map(|((l, d), (n, s))| (l.clone(), d.clone(), *n, *s))
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        v
    }

    /// What a person may do with an open input now: `answer` a question; for a held
    /// message, what its gate allows (`approve`, `reject`, `edit`). Nothing once decided.
    pub fn allowed(self, id: &str) -> Vec<&'static str> {
        let open = lock(&self.shared().inbox.open);
        let Some(h) = open.get(id) else {
            return Vec::new();
        };
        if h.row.kind == InputKind::Question {
            return vec!["answer"];
        }
        let all = [Decision::Approve, Decision::Reject, Decision::Edit];
        all.into_iter()
            .filter(|d| h.approval.as_ref().is_none_or(|a| a.allows(*d)))
            .map(Decision::as_str)
            .collect()
    }

    /// The open input `id` as `who` may decide it (checked against its gate's approvers, or
    /// its human listener's): its row, and the gate. Not found outside `who`'s scope; already
    /// decided with the first decision.
    fn look(
        self,
        id: &str,
        who: &Decider,
    ) -> Result<(InputRow, Option<Arc<Approval>>), DecideError> {
        let s = self.shared();
        if s.life.status.load(Ordering::SeqCst) != super::STATUS_RUNNING {
            return Err(DecideError::Stopping);
        }
        let looked = lock(&s.inbox.open)
            .get(id)
            .map(|h| (h.row.clone(), h.approval.clone(), h.human.clone()));
        let Some((row, approval, human)) = looked else {
            return Err(match s.inbox.decided(id) {
                Some(r) if in_scope(&r, who) => DecideError::AlreadyDecided(Box::new(r)),
                _ => DecideError::NotFound(id.to_string()),
            });
        };
        if !in_scope(&row, who) {
            return Err(DecideError::NotFound(id.to_string()));
        }
        // Restored after a restart: the listener's settings now.
        let topo = s.topo();
        let now = topo.listeners.get(row.listener.as_str());
        let approval = approval.or_else(|| now.and_then(|l| l.config.approval.clone()));
        let human = human.or_else(|| now.and_then(|l| l.config.human.clone()));
        let approvers = match row.kind {
            InputKind::Approval => approval.as_ref().map(|a| &a.approvers),
            InputKind::Question => human.as_ref().map(|h| &h.approvers),
        };
        may_decide(approvers, &row, who)?;
        Ok((row, approval))
    }

    /// Decides an open input. Exactly one decision of an input is taken; a later one is
    /// answered [`DecideError::AlreadyDecided`] with the first.
    pub fn decide(
        self,
        id: &str,
        who: &Decider,
        verdict: Verdict,
    ) -> Result<InputRow, DecideError> {
        let s = self.shared();
        let decision = match &verdict {
            Verdict::Approve {
                payload_xml: Some(_),
                ..
            } => Decision::Edit,
            Verdict::Approve { .. } => Decision::Approve,
            Verdict::Reject { .. } => Decision::Reject,
        };
        let (row, approval) = self.look(id, who)?;
        let listener = row.listener.clone();
        if row.kind == InputKind::Question {
            return Err(DecideError::NotAllowed {
                decision: decision.as_str(),
                allowed: "answer".into(),
            });
        }
        if let Some(a) = approval.as_deref().filter(|a| !a.allows(decision)) {
            let allowed: Vec<&str> = a.allow.iter().map(|d| d.as_str()).collect();
            return Err(DecideError::NotAllowed {
                decision: decision.as_str(),
                allowed: allowed.join(", "),
            });
        }
        let edited = match &verdict {
            Verdict::Approve {
                payload_xml: Some(xml),
                ..
            } => Some(
                s.validate_for(&listener, xml)
                    .map_err(DecideError::Invalid)?,
            ),
            _ => None,
        };
        let (status, reason) = match verdict {
            Verdict::Approve { reason, .. } => (InputStatus::Approved, reason),
            Verdict::Reject { reason } => (InputStatus::Declined, reason),
        };
        let decided = InputRow {
            status,
            decided_by: Some(who.shown()),
            decided: Some(s.inbox.clock.now()),
            decision: Some(decision.as_str().to_string()),
            reason: reason.map(|r| s.clip_error(r)),
            ..row
        };
        s.close(decided, edited)
    }

    /// Applies `on_timeout` to every open input whose time has passed on the organism's
    /// clock. Returns how many expired. (A background task calls it; tests may too.)
    pub fn expire_due(self) -> usize {
        self.shared().expire_due()
    }
}

/// What a handler is told of the decision that let a held message through.
fn approved(decided: &InputRow) -> Option<Arc<crate::listener::Approved>> {
    Some(Arc::new(crate::listener::Approved {
        by: decided.decided_by.clone()?,
        at: decided.decided?,
        reason: decided.reason.clone(),
    }))
}

/// Whether `who` may see `row` at all (a tenant sees its own).
fn in_scope(row: &InputRow, who: &Decider) -> bool {
    who.tenant.is_none() || who.tenant == row.tenant
}

/// The gate's `approvers` against `who` (without a gate, an operator decides).
fn may_decide(
    approvers: Option<&Approvers>,
    row: &InputRow,
    who: &Decider,
) -> Result<(), DecideError> {
    let refuse = |why: String| Err(DecideError::NotAnApprover(why));
    let least = approvers.map_or(Role::Operator, |a| a.role);
    if who.role < least {
        return refuse(format!("deciding this input needs the role {least}"));
    }
    let Some(a) = approvers else { return Ok(()) };
    let name = who.name.as_deref();
    let key = name.and_then(|n| n.strip_prefix("key:"));
    let subject = name.filter(|n| !n.starts_with("key:"));
    let listed = !a.keys.is_empty() || !a.subjects.is_empty();
    let named = key.is_some_and(|k| a.keys.iter().any(|x| x == k))
        || subject.is_some_and(|s| a.subjects.iter().any(|x| x == s));
    if listed && !named {
        return refuse("this gate names its approvers, and this credential is not one".into());
    }
    if a.distinct_from_sender && name.is_some() && row.requested_by.as_deref() == name {
        return refuse(
            "this gate needs a second person: the credential that started the thread cannot decide"
                .into(),
        );
    }
    Ok(())
}

impl Shared {
    /// The gate of `listener` holds this admission: logs it `held`, opens its input, and
    /// lets the thread wait. Past `limits.max_held_messages` / `max_held_bytes` it is logged
    /// `failed` instead ([`Admitted::Refused`]).
    pub(crate) fn hold(
        self: &Arc<Self>,
        thread: &str,
        listener: &Arc<Listener>,
        admission: Admission,
        approval: Arc<Approval>,
    ) -> Result<Admitted, ThreadError> {
        if let Some(e) = self.gates_full(thread, listener, admission.valid.xml().len()) {
            return self.refuse_full(thread, listener, admission, e);
        }
        let Admission {
            parent_id,
            from,
            valid,
            ..
        } = admission;
        let requested_by = self
            .threads
            .first_sender(thread)
            .or_else(|| Some(from.clone()));
        let mut record = self.threads.append(
            thread,
            NewMessage {
                id: crate::threads::new_id(),
                parent_id,
                from,
                to: Some(listener.config.name.arc()),
                payload_type: Some(valid.payload_type().written()),
                payload_xml: valid.xml_arc(),
                status: MessageStatus::Held,
                error: None,
            },
        )?;
        if record.status != MessageStatus::Held {
            return Ok(Admitted::NotQueued(record));
        }
        record.seq = self.events.publish(EventKind::Message {
            message: record.clone(),
        });
        let row = self.input_row(
            &record,
            &valid,
            listener,
            approval.prompt.as_deref(),
            approval.timeout,
            requested_by.map(|r| r.to_string()),
        );
        let message_id = record.id.clone();
        self.open_input(Held {
            row,
            record,
            valid: Some(valid),
            approval: Some(approval),
            human: None,
        });
        if let Some(change) = self.threads.settle(thread) {
            self.publish_thread(change);
        }
        Ok(Admitted::Queued(message_id))
    }

    /// Logs `admission` `failed` for `e` (the inbox is full): not published, the caller
    /// answers for it.
    fn refuse_full(
        &self,
        thread: &str,
        listener: &Listener,
        admission: Admission,
        e: ThreadError,
    ) -> Result<Admitted, ThreadError> {
        let record = self.threads.append(
            thread,
            NewMessage {
                id: crate::threads::new_id(),
                parent_id: admission.parent_id,
                from: admission.from,
                to: Some(listener.config.name.arc()),
                payload_type: Some(admission.valid.payload_type().written()),
                payload_xml: admission.valid.xml_arc(),
                status: MessageStatus::Failed,
                error: Some(e.to_string()),
            },
        )?;
        self.count_failure(super::FailureKind::Undeliverable);
        Ok(Admitted::Refused(record, e))
    }

    /// Opens `held`'s input: written to the store's inbox (a failure is reported: a
    /// restart would lose it), told (`input_requested`), kept open here.
    fn open_input(&self, held: Held) {
        let row = &held.row;
        if let Some(table) = &self.inbox.table {
            if let Err(e) = table.insert(row) {
                self.events.publish(EventKind::Error {
                    thread_id: Some(row.thread_id.clone()),
                    agent: Some(row.listener.clone()),
                    error: self.clip_error(format!(
                        "the message {} is not in the store's inbox, so a restart would lose its input: {e}",
                        row.message_id
                    )),
                });
            }
        }
        self.events.publish(EventKind::InputRequested {
            input: Box::new(row.clone()),
        });
        lock(&self.inbox.open).insert(Arc::from(row.id.as_str()), held);
    }

    /// Writes a decision to the store's inbox; a failure is reported (the input would be
    /// open again after a restart).
    fn record_decision(&self, decided: &InputRow) {
        if let Some(table) = &self.inbox.table {
            if let Err(e) = table.decide(decided) {
                self.events.publish(EventKind::Error {
                    thread_id: Some(decided.thread_id.clone()),
                    agent: Some(decided.listener.clone()),
                    error: self.clip_error(format!(
                        "the decision of input {} is not in the store: {e}",
                        decided.id
                    )),
                });
            }
        }
    }

    /// Whether the inbox holds as much as it may, one more input of `listener`'s in
    /// `thread` with a payload of `size` bytes counted: organism-wide (`limits`), and for a
    /// tenant's listener its `max_open_inputs` and `max_waiting_threads`. The limit passed,
    /// as the refusal.
    fn gates_full(&self, thread: &str, listener: &Listener, size: usize) -> Option<ThreadError> {
        if let Some(tenant) = listener.config.tenant.as_deref() {
            let (q, key) = self.topo().config.tenants.of(tenant);
            let (inputs, threads, this_waits) = self.inbox.tenant_totals(tenant, thread);
            if inputs >= q.max_open_inputs {
                return Some(ThreadError::TooManyHeld {
                    held: format!("{inputs} open inputs of tenant `{tenant}`"),
                    limit: format!("{key}.max_open_inputs"),
                });
            }
            if !this_waits && threads >= q.max_waiting_threads {
                return Some(ThreadError::TooManyHeld {
                    held: format!("{threads} waiting threads of tenant `{tenant}`"),
                    limit: format!("{key}.max_waiting_threads"),
                });
            }
        }
        let (count, bytes) = self.inbox.held_totals();
        if count >= self.limits.max_held_messages {
            Some(ThreadError::TooManyHeld {
                held: format!("{count} messages"),
                limit: "limits.max_held_messages".into(),
            })
        } else if bytes + size > self.limits.max_held_bytes {
            Some(ThreadError::TooManyHeld {
                held: format!("{bytes} bytes of payloads"),
                limit: "limits.max_held_bytes".into(),
            })
        } else {
            None
        }
    }

    /// The open input of `record` at `listener`: its `prompt` filled from the payload,
    /// expiring `timeout` from now.
    fn input_row(
        &self,
        record: &MessageRecord,
        valid: &ValidatedPayload,
        listener: &Listener,
        prompt: Option<&str>,
        timeout: Option<std::time::Duration>,
        requested_by: Option<String>,
    ) -> InputRow {
        let now = self.inbox.clock.now();
        let prompt = prompt.map(|p| {
            let fields = valid.to_json();
            crate::listener::fill(
                p,
                |v: &str| v.to_string(),
                |name| crate::listener::field_text(&fields, name),
            )
            .unwrap_or_else(|_| p.to_string())
        });
        let ms = |t: std::time::Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        InputRow {
            id: crate::threads::new_id().to_string(),
            kind: InputKind::Approval,
            status: InputStatus::Open,
            thread_id: record.thread_id.to_string(),
            message_id: record.id.to_string(),
            listener: listener.name().to_string(),
            tenant: listener.config.tenant.clone(),
            from: record.from.to_string(),
            parent_id: record.parent_id.as_ref().map(|p| p.to_string()),
            slot_index: record.slot_index,
            payload_type: valid.payload_type().written().to_string(),
            payload_xml: valid.xml().to_string(),
            prompt,
            requested_by,
            created: now,
            expires: timeout.map(|t| Timestamp(now.0.saturating_add(ms(t)))),
            decided_by: None,
            decided: None,
            decision: None,
            reason: None,
            result: None,
        }
    }

    /// A payload `listener` accepts, from XML: normalized and validated as an inject is.
    fn validate_for(&self, listener: &str, xml: &str) -> Result<ValidatedPayload, InjectError> {
        let payload = normalize_payload(xml, &self.xml_limits)?;
        let topo = self.topo();
        let l = topo
            .listeners
            .get(listener)
            .ok_or_else(|| InjectError::UnknownListener(listener.to_string()))?;
        let schema =
            l.config
                .schema_for(&payload.payload_type)
                .ok_or_else(|| InjectError::NotAccepted {
                    listener: listener.to_string(),
                    payload_type: payload.payload_type.to_string(),
                })?;
        schema.validate(payload).map_err(InjectError::Invalid)
    }

    /// Takes the open input `decided.id` (whoever takes it decides) and applies `decided`:
    /// recorded, published, and the held message let through (approved or expired by
    /// approval, `edited` instead of it when given), declined, or killed (cancelled).
    fn close(
        self: &Arc<Self>,
        mut decided: InputRow,
        edited: Option<ValidatedPayload>,
    ) -> Result<InputRow, DecideError> {
        if decided.kind == InputKind::Question {
            return self.close_question(decided, Vec::new());
        }
        let Some(held) = lock(&self.inbox.open).remove(decided.id.as_str()) else {
            return Err(match self.inbox.decided(&decided.id) {
                Some(r) => DecideError::AlreadyDecided(Box::new(r)),
                None => DecideError::NotFound(decided.id),
            });
        };
        let record = held.record;
        let thread = record.thread_id.clone();
        let topo = self.topo();
        let listener = topo.listeners.get(decided.listener.as_str()).cloned();
        let lets_through = decided.decision.as_deref() != Some("reject")
            && matches!(decided.status, InputStatus::Approved | InputStatus::Expired);
        let declined_by = || {
            let by = decided.decided_by.as_deref().unwrap_or("?");
            self.clip_error(match &decided.reason {
                Some(r) => format!("declined by {by}: {r}"),
                None => format!("declined by {by}"),
            })
        };
        let (status, error) = match (lets_through, &listener, &edited) {
            (true, None, _) => (
                MessageStatus::Undeliverable,
                Some(format!(
                    "`{}` was removed by a reload before its held message was let through",
                    decided.listener
                )),
            ),
            (true, Some(_), Some(_)) => (MessageStatus::Superseded, None),
            (true, Some(_), None) => (MessageStatus::Pending, None),
            (false, None, _) if decided.status == InputStatus::Cancelled => {
                (MessageStatus::Undeliverable, decided.decision.clone())
            }
            (false, ..) if decided.status == InputStatus::Cancelled => {
                (MessageStatus::Killed, decided.decision.clone())
            }
            (false, ..) => (MessageStatus::Declined, Some(declined_by())),
        };
        if let (MessageStatus::Superseded, Some(l), Some(valid)) = (status, &listener, edited) {
            // The edit: a new message, same sender and parent, let through at once.
            if let Some(change) = self.threads.wake(&thread) {
                self.publish_thread(change);
            }
            let admission = Admission {
                parent_id: record.parent_id.clone(),
                from: record.from.clone(),
                valid,
                approval: approved(&decided),
            };
            if let Ok(Admitted::Queued(id)) = self.admit_now(&thread, l, admission) {
                decided.result = Some(id.to_string());
            }
        }
        self.record_decision(&decided);
        if status == MessageStatus::Undeliverable {
            self.count_failure(super::FailureKind::Undeliverable);
        }
        let change = self
            .threads
            .close_input(&thread, Some((record.slot_index, status, error.clone())));
        if let Some(change) = change {
            self.publish_thread(change);
        }
        self.events.publish(EventKind::MessageStatus {
            id: record.id.clone(),
            thread_id: record.thread_id.clone(),
            status,
            error,
            about: Some(crate::events::StatusAbout::of(&record)),
        });
        if let (MessageStatus::Pending, Some(l)) = (status, &listener) {
            let mut record = record;
            record.status = MessageStatus::Pending;
            self.add_pending(1);
            let valid = match held.valid {
                Some(v) => Ok(v),
                None => self.validate_for(l.name(), &record.payload_xml),
            };
            match valid {
                Ok(payload) => self.enqueue(
                    l,
                    Job {
                        record,
                        payload,
                        approval: approved(&decided),
                    },
                ),
                Err(e) => {
                    // Restored after a restart, and its listener's schema changed since.
                    self.fail_message(&record, super::FailureKind::Invalid, e.to_string());
                    self.release(&thread);
                }
            }
        }
        self.events.publish(EventKind::InputResolved {
            input: Box::new(decided.clone()),
        });
        self.inbox.remember(decided.clone());
        Ok(decided)
    }
}
