//! The approval gate: a message held (logged `held`, its input opened and kept), the
//! inbox's limits, and a decision applied (approved, edited, declined, withdrawn). What is
//! shared with questions (`ask.rs`) is here: the limits, an input opened, a decision kept.

use std::sync::Arc;

use super::{
    approved, expires, DecideError, Held, InputKind, InputRow, InputStatus, Opening, Shared,
};
use crate::config::approval::Approval;
use crate::events::EventKind;
use crate::schema::ValidatedPayload;
use crate::threads::{MessageRecord, MessageStatus, ThreadError};
use crate::xml::normalize_payload;

use super::super::admit::{Admission, Admitted};
use super::super::dispatch::{Job, Listener};
use super::super::InjectError;

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
        let opening = Opening {
            status: MessageStatus::Held,
            kind: InputKind::Approval,
            prompt: approval.prompt.as_deref(),
            timeout: approval.timeout,
        };
        let (record, valid, row) = match self.log_input(thread, listener, admission, opening)? {
            Ok(logged) => logged,
            Err(answered) => return Ok(answered),
        };
        let message_id = record.id.clone();
        // Told once open: whoever is notified may decide at once.
        let notify = approval.notify.clone().map(|n| (n, row.clone()));
        self.open_input(Held {
            row: Arc::new(row),
            record,
            valid: Some(valid),
            approval: Some(approval),
            human: None,
        });
        if let Some((n, row)) = notify {
            self.notify(&n, &row);
        }
        if let Some(change) = self.threads.settle(thread) {
            self.publish_thread(change);
        }
        Ok(Admitted::Queued(message_id))
    }

    /// Logs `admission` `failed` for `e` (the inbox is full): not published, the caller
    /// answers for it.
    pub(super) fn refuse_full(
        &self,
        thread: &str,
        listener: &Listener,
        admission: Admission,
        e: ThreadError,
    ) -> Result<Admitted, ThreadError> {
        let (m, _, _) =
            admission.into_message(listener, MessageStatus::Failed, Some(e.to_string()));
        let record = self.threads.append(thread, m)?;
        self.count_failure(crate::pump::FailureKind::Undeliverable);
        Ok(Admitted::Refused(record, e))
    }

    /// Opens `held`'s input: kept open here, then told (`input_requested`), which the
    /// store's writer records in its inbox after the held message. The thread must count it
    /// already (an answer may come the moment it is told).
    pub(super) fn open_input(&self, held: Held) {
        // Open before it is told: whoever hears of it may decide it at once.
        let told = EventKind::InputRequested {
            input: held.row.clone(),
        };
        self.keep_open(held);
        self.events.publish(told);
    }

    /// Tells of a decision (`input_resolved`, which the store's writer records in its inbox)
    /// before anything the decision causes is published: after a restart the store holds
    /// either the decision and what followed, or the input still open and nothing that
    /// followed.
    pub(super) fn resolved(&self, row: Arc<InputRow>) -> Arc<InputRow> {
        // One row, shared by the event, the inbox's recent decisions and the decider.
        self.events
            .publish(EventKind::InputResolved { input: row.clone() });
        self.inbox.remember(row.clone());
        row
    }

    /// Whether the inbox holds as much as it may, one more input of `listener`'s in
    /// `thread` with a payload of `size` bytes counted: organism-wide (`limits`), and for a
    /// tenant's listener its `max_open_inputs`, `max_held_bytes` and `max_waiting_threads`. The limit passed,
    /// as the refusal.
    pub(super) fn gates_full(
        &self,
        thread: &str,
        listener: &Listener,
        size: usize,
    ) -> Option<ThreadError> {
        if let Some(tenant) = listener.config.tenant.as_deref() {
            let (q, key) = self.topo().config.tenants.of(tenant);
            let t = self.inbox.tenant_totals(tenant, thread);
            if t.inputs >= q.max_open_inputs {
                return Some(ThreadError::TooManyHeld {
                    held: format!("{} open inputs of tenant `{tenant}`", t.inputs),
                    limit: format!("{key}.max_open_inputs"),
                });
            }
            if t.bytes + size > q.max_held_bytes {
                return Some(ThreadError::TooManyHeld {
                    held: format!("{} bytes of payloads of tenant `{tenant}`", t.bytes),
                    limit: format!("{key}.max_held_bytes"),
                });
            }
            if !t.this_waits && t.threads >= q.max_waiting_threads {
                return Some(ThreadError::TooManyHeld {
                    held: format!("{} waiting threads of tenant `{tenant}`", t.threads),
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

    /// Logs `admission` for `listener` as `opening` says and makes its input's row: past
    /// the inbox's limits it is logged `failed` instead, and a thread that does not keep it
    /// (killed, over budget) logs it as it does; either is the answer (`Err`). Else the
    /// record, its payload and the row, its prompt filled from the payload.
    pub(super) fn log_input(
        &self,
        thread: &str,
        listener: &Listener,
        admission: Admission,
        opening: Opening<'_>,
    ) -> Result<Result<(MessageRecord, ValidatedPayload, InputRow), Admitted>, ThreadError> {
        if let Some(e) = self.gates_full(thread, listener, admission.valid.xml().len()) {
            return self.refuse_full(thread, listener, admission, e).map(Err);
        }
        let requested_by = self
            .threads
            .first_sender(thread)
            .unwrap_or_else(|| admission.from.clone());
        let (m, valid, _) = admission.into_message(listener, opening.status, None);
        let record = match self.log_kept(thread, m)? {
            Ok(record) => record,
            Err(record) => return Ok(Err(Admitted::NotQueued(record))),
        };
        let prompt = opening.prompt.map(|p| {
            let fields = valid.to_json();
            crate::listener::fill(
                p,
                |v: &str| v.to_string(),
                |name| crate::listener::field_text(&fields, name),
            )
            .unwrap_or_else(|_| p.to_string())
        });
        let now = self.inbox.clock.now();
        let row = InputRow {
            id: crate::threads::new_id(),
            kind: opening.kind,
            status: InputStatus::Open,
            thread_id: record.thread_id.clone(),
            message_id: record.id.clone(),
            listener: listener.config.name.arc(),
            tenant: listener.config.tenant.clone(),
            from: record.from.clone(),
            parent_id: record.parent_id.clone(),
            slot_index: record.slot_index,
            payload_type: valid.payload_type().written(),
            payload_xml: record.payload_xml.clone(),
            prompt,
            requested_by: Some(requested_by),
            created: now,
            expires: opening.timeout.map(|t| expires(now, t)),
            decided_by: None,
            decided: None,
            decision: None,
            reason: None,
            result: None,
        };
        Ok(Ok((record, valid, row)))
    }

    /// A payload `listener` accepts, from XML: normalized and validated as an inject is.
    pub(super) fn validate_for(
        &self,
        listener: &str,
        xml: &str,
    ) -> Result<ValidatedPayload, InjectError> {
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
    pub(super) fn close(
        self: &Arc<Self>,
        decided: InputRow,
        edited: Option<ValidatedPayload>,
    ) -> Result<Arc<InputRow>, DecideError> {
        if decided.kind == InputKind::Question {
            return self.close_question(decided, Vec::new());
        }
        let mut decided = Arc::new(decided);
        let Some(held) = self.take_open(&decided) else {
            // Another decider came first (the input was in scope when looked up).
            return Err(self.inbox.not_open(&decided.id, |_| true));
        };
        let record = held.record;
        let thread = record.thread_id.clone();
        let topo = self.topo();
        let listener = topo.listeners.get(&*decided.listener).cloned();
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
                id: None,
                origin: Some(crate::threads::Origin::edit(record.id.clone())),
            };
            if let Ok(Admitted::Queued(id)) = self.admit_now(&thread, l, admission) {
                Arc::make_mut(&mut decided).result = Some(id.to_string());
            }
        }
        let decided = self.resolved(decided);
        if status == MessageStatus::Undeliverable {
            self.count_failure(crate::pump::FailureKind::Undeliverable);
        }
        // A sender that takes `<huh>` hears of a decline; it is sent while the thread still
        // counts the held message, so the thread goes on until it is handled.
        if status == MessageStatus::Declined {
            if let Some(sender) = topo.listeners.get(&*record.from) {
                if Self::wants_huh(sender, &record) {
                    if let Some(change) = self.threads.wake(&thread) {
                        self.publish_thread(change);
                    }
                    self.send_huh_saying(sender, &record, "declined by a person");
                }
            }
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
            self.add_pending(record.payload_xml.len());
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
                    self.fail_message(&record, crate::pump::FailureKind::Invalid, e.to_string());
                    self.release(&record);
                }
            }
        }
        Ok(decided)
    }
}
