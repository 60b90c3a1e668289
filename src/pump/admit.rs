//! The one front door: a payload that passed the gate for a listener becomes a pending
//! message (logged, published, counted, queued), whether it came from outside (inject) or
//! from a listener's output (`route::deliver`).

use std::sync::Arc;

use crate::events::EventKind;
use crate::schema::ValidatedPayload;
use crate::threads::{MessageRecord, MessageStatus, NewMessage, Origin, ThreadError};

use super::dispatch::{Job, Listener};
use super::Shared;

/// A validated payload on its way into a thread.
pub(crate) struct Admission {
    pub parent_id: Option<Arc<str>>,
    pub from: Arc<str>,
    pub valid: ValidatedPayload,
    /// Let through an approval gate (an edit): shown to the handler.
    pub approval: Option<Arc<crate::listener::Approved>>,
    /// The id a client chose for it (`message_id` on inject); else a new one.
    pub id: Option<Arc<str>>,
    /// Why it exists, when its sender and parent do not say (an edit).
    pub origin: Option<crate::threads::Origin>,
}

/// What the log made of an admission.
pub(crate) enum Admitted {
    /// Pending: published, counted and queued for the listener. Its message id.
    Queued(Arc<str>),
    /// Logged but not queued: the thread was killed or is over its message budget (the
    /// record's status and error say which). Not published: the caller answers for it.
    NotQueued(MessageRecord),
    /// Logged `failed`, not queued: the approval gates hold as much as they may. Not
    /// published: the caller answers for it.
    Refused(MessageRecord, ThreadError),
}

impl Admission {
    /// The message it is logged as for `listener`, with `status` (and `error`); its payload
    /// and approval.
    pub(crate) fn into_message(
        self,
        listener: &Listener,
        status: MessageStatus,
        error: Option<String>,
    ) -> (
        NewMessage,
        ValidatedPayload,
        Option<Arc<crate::listener::Approved>>,
    ) {
        let origin = self
            .origin
            .unwrap_or_else(|| Origin::implied(self.parent_id.as_ref(), &self.from));
        let m = NewMessage {
            origin,
            id: self.id.unwrap_or_else(crate::threads::new_id),
            parent_id: self.parent_id,
            from: self.from,
            to: Some(listener.config.name.arc()),
            payload_type: Some(self.valid.payload_type().written()),
            payload_xml: self.valid.xml_arc(),
            status,
            error,
        };
        (m, self.valid, self.approval)
    }
}

impl Shared {
    /// Logs `m` in `thread`; if the log keeps its status (the thread is not killed nor over
    /// its budget), publishes it: `Ok` with its `seq`, else `Err` with the record as logged
    /// (not published: the caller answers for it).
    pub(crate) fn log_kept(
        &self,
        thread: &str,
        m: NewMessage,
    ) -> Result<Result<MessageRecord, MessageRecord>, ThreadError> {
        let status = m.status;
        let mut record = self.threads.append(thread, m)?;
        if record.status != status {
            return Ok(Err(record));
        }
        record.seq = self.events.publish(EventKind::Message {
            message: record.clone(),
        });
        Ok(Ok(record))
    }

    /// Logs `admission` as a pending message for `listener` in `thread` and, if the log keeps
    /// it pending, publishes it, counts it and queues it; or, if the listener's approval gate
    /// holds it, logs it `held` and opens its input (`inputs.rs`). Fails when the thread is
    /// not in the registry, or the gates hold as much as they may.
    pub(crate) fn admit(
        self: &Arc<Self>,
        thread: &str,
        listener: &Arc<Listener>,
        admission: Admission,
    ) -> Result<Admitted, ThreadError> {
        if let Some(gate) = listener
            .config
            .approval
            .as_ref()
            .filter(|g| g.holds(admission.valid.payload_type(), &admission.from))
        {
            return self.hold(thread, listener, admission, gate.clone());
        }
        self.admit_now(thread, listener, admission)
    }

    /// [`Shared::admit`] past the gate: what an approved edit is admitted by.
    pub(crate) fn admit_now(
        self: &Arc<Self>,
        thread: &str,
        listener: &Arc<Listener>,
        admission: Admission,
    ) -> Result<Admitted, ThreadError> {
        if listener.config.kind == crate::config::ListenerKind::Human {
            return self.ask(thread, listener, admission);
        }
        let (m, valid, approval) = admission.into_message(listener, MessageStatus::Pending, None);
        let record = match self.log_kept(thread, m)? {
            Ok(record) => record,
            Err(record) => return Ok(Admitted::NotQueued(record)),
        };
        let id = record.id.clone();
        self.add_pending(record.payload_xml.len());
        self.enqueue(
            listener,
            Job {
                record,
                payload: valid,
                approval,
            },
        );
        Ok(Admitted::Queued(id))
    }
}
