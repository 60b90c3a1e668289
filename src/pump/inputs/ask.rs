//! Questions to a person (`kind: human`): a message to a human listener is delivered to the
//! inbox instead of a handler, as an open question; its thread waits. The answer is one or
//! more payloads, every one checked (acceptable XML, a route, valid for each receiver)
//! before any is routed, as the listener's outputs, children of the question's message: the
//! same path an external agent's callback takes. No answer within `reply_timeout` fails the
//! message (`reply timeout`).

use std::sync::Arc;

use super::{
    DecideError, Decider, Held, InputKind, InputRow, InputStatus, Inputs, Opening, Shared,
};
use crate::listener::Output;
use crate::threads::{MessageStatus, ThreadError};

use super::super::admit::{Admission, Admitted};
use super::super::dispatch::Listener;
use super::super::FailureKind;

/// One payload of an answer: XML, and where it goes (`None`: routed as an output is, by
/// type, or back to the asker).
#[derive(Debug, Clone)]
pub struct Answer {
    pub payload_xml: String,
    pub to: Option<String>,
}

impl Shared {
    /// Delivers `admission` to the person behind `listener`: logged `delivered`, its
    /// question opened, the thread waiting once quiet. Past the inbox's limits it is logged
    /// `failed` instead ([`Admitted::Refused`]).
    pub(crate) fn ask(
        self: &Arc<Self>,
        thread: &str,
        listener: &Arc<Listener>,
        admission: Admission,
    ) -> Result<Admitted, ThreadError> {
        let human = listener.config.human.clone();
        let timeout = human
            .as_ref()
            .map_or(crate::config::approval::DEFAULT_HUMAN_REPLY_TIMEOUT, |h| {
                h.reply_timeout
            });
        let opening = Opening {
            status: MessageStatus::Delivered,
            kind: InputKind::Question,
            prompt: None,
            timeout: Some(timeout),
        };
        let (record, _, row) = match self.log_input(thread, listener, admission, opening)? {
            Ok(logged) => logged,
            Err(answered) => return Ok(answered),
        };
        let message_id = record.id.clone();
        // Counted by the thread before anyone can answer it.
        if let Some(change) = self.threads.open_input(thread) {
            self.publish_thread(change);
        }
        self.open_input(Held {
            row: std::sync::Arc::new(row),
            record,
            valid: None,
            approval: None,
            human,
        });
        Ok(Admitted::Queued(message_id))
    }

    /// Takes the open question `decided.id` (whoever takes it decides) and applies
    /// `decided`: answered (its payloads routed as the listener's outputs), expired (the
    /// message fails: no reply in time) or cancelled.
    pub(super) fn close_question(
        self: &Arc<Self>,
        mut decided: InputRow,
        answers: Vec<Answer>,
    ) -> Result<Arc<InputRow>, DecideError> {
        decided.result = None;
        let decided = Arc::new(decided);
        let Some(held) = self.take_open(&decided) else {
            // Another decider came first (the input was in scope when looked up).
            return Err(self.inbox.not_open(&decided.id, |_| true));
        };
        let record = held.record;
        let thread = record.thread_id.clone();
        let listener = self.topo().listeners.get(&*decided.listener).cloned();
        let decided = self.resolved(decided);
        match (decided.status, &listener) {
            (InputStatus::Answered, Some(l)) => {
                if let Some(change) = self.threads.wake(&thread) {
                    self.publish_thread(change);
                }
                for a in answers {
                    self.route_output(
                        l,
                        &record,
                        None,
                        Output {
                            payload: a.payload_xml,
                            to: a.to,
                        },
                    );
                }
            }
            (InputStatus::Expired, _) => {
                let timeout = held.human.as_ref().map(|h| h.reply_timeout.as_secs());
                self.fail_message(
                    &record,
                    FailureKind::ReplyTimeout,
                    format!(
                        "reply timeout: nobody answered `{}` within {} s",
                        decided.listener,
                        timeout.unwrap_or(0)
                    ),
                );
            }
            _ => {}
        }
        if let Some(change) = self.threads.close_input(&thread, None) {
            self.publish_thread(change);
        }
        Ok(decided)
    }
}

impl Inputs<'_> {
    /// Answers an open question: every payload is checked before any is routed (all or
    /// none), then each goes out as the human listener's output, a child of the question's
    /// message. Exactly one answer of a question is taken.
    pub fn answer(
        self,
        id: &str,
        who: &Decider,
        answers: Vec<Answer>,
        reason: Option<String>,
    ) -> Result<Arc<InputRow>, DecideError> {
        let s = self.shared();
        let (row, _) = self.look(id, who)?;
        if row.kind != InputKind::Question {
            return Err(DecideError::NotAllowed {
                decision: "answer",
                allowed: self.allowed(id).join(", "),
            });
        }
        if answers.is_empty() {
            return Err(DecideError::InvalidAnswer(vec![
                "an answer holds at least one payload".to_string(),
            ]));
        }
        let topo = s.topo();
        let listener = topo
            .listeners
            .get(&*row.listener)
            .cloned()
            .ok_or_else(|| DecideError::NotFound(id.to_string()))?;
        let asker: Arc<str> = row.from.clone();
        let mut problems = Vec::new();
        for (i, a) in answers.iter().enumerate() {
            if let Err(crate::pump::ReplyError::Invalid(found)) = s.check_reply(
                &listener,
                &asker,
                a.to.as_deref(),
                std::slice::from_ref(&a.payload_xml),
            ) {
                problems.extend(
                    found
                        .into_iter()
                        .map(|p| p.replacen("payload 1", &format!("payload {}", i + 1), 1)),
                );
            }
        }
        if !problems.is_empty() {
            return Err(DecideError::InvalidAnswer(problems));
        }
        let decided = InputRow {
            status: InputStatus::Answered,
            decided_by: Some(who.shown()),
            decided: Some(s.inbox.clock.now()),
            decision: Some("answer".to_string()),
            reason: reason.map(|r| s.clip_error(r)),
            ..row
        };
        s.close_question(decided, answers)
    }
}
