//! What ends or re-arms an input apart from a person's decision: the gate's timer
//! (`on_timeout`, on the organism's clock), a kill or an abort (cancelled), and a start
//! (the store's open inputs held again).

use std::sync::Arc;

use super::{Held, InputRow, InputStatus, Shared};
use crate::config::approval::OnTimeout;
use crate::sync::lock;
use crate::threads::{
    InputKind, MessageCore, MessageRecord, MessageStatus, ThreadInfo, ThreadStatus,
};

impl Shared {
    /// Applies `on_timeout` to the open inputs whose time has passed. Returns how many.
    pub(crate) fn expire_due(self: &Arc<Self>) -> usize {
        let now = self.inbox.clock.now();
        let due: Vec<(InputRow, OnTimeout)> = lock(&self.inbox.open)
            .values()
            .filter(|h| h.row.expires.is_some_and(|t| t <= now))
            .map(|h| {
                let on = h
                    .approval
                    .as_ref()
                    .map_or(OnTimeout::Reject, |a| a.on_timeout);
                ((*h.row).clone(), on)
            })
            .collect();
        let mut n = 0;
        for (row, on) in due {
            let decision = match (row.kind, on) {
                (InputKind::Question, _) => "no answer",
                (_, OnTimeout::Escalate) => {
                    n += usize::from(self.escalate(row, now));
                    continue;
                }
                (_, OnTimeout::Approve) => "approve",
                (_, OnTimeout::Reject | OnTimeout::Keep) => "reject",
            };
            let decided = InputRow {
                status: InputStatus::Expired,
                decided_by: Some("timeout".to_string()),
                decided: Some(now),
                decision: Some(decision.to_string()),
                reason: Some("nobody decided before the gate's timeout".to_string()),
                ..row
            };
            if self.close(decided, None).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// `on_timeout: escalate`: the input closes `escalated` and a new one holds the same
    /// message for `escalate_to`'s approvers, expiring after its `reply_timeout` (then
    /// declined). False if the input was decided meanwhile.
    fn escalate(self: &Arc<Self>, row: InputRow, now: crate::time::Timestamp) -> bool {
        // The gate it was held by, looked at first: the escalation is the decision kept as
        // the input is taken (a person deciding at that instant is told of it).
        let Some(gate) = lock(&self.inbox.open)
            .get(&*row.id)
            .map(|h| h.approval.clone())
        else {
            return false;
        };
        let to = gate.as_ref().and_then(|a| a.escalate_to.clone());
        let topo = self.topo();
        let human = to
            .as_deref()
            .and_then(|t| topo.listeners.get(t))
            .and_then(|l| l.config.human.clone());
        let decided = InputRow {
            status: InputStatus::Escalated,
            decided_by: Some("timeout".to_string()),
            decided: Some(now),
            decision: Some(format!("escalate to {}", to.as_deref().unwrap_or("?"))),
            reason: Some("nobody decided before the gate's timeout".to_string()),
            ..row.clone()
        };
        let decided = Arc::new(decided);
        let Some(mut held) = self.take_open(&decided) else {
            return false;
        };
        self.resolved(decided);
        let timeout = human
            .as_ref()
            .map_or(crate::config::approval::DEFAULT_APPROVAL_TIMEOUT, |h| {
                h.reply_timeout
            });
        let mut escalated = gate
            .as_deref()
            .cloned()
            .unwrap_or_else(crate::config::approval::Approval::default_gate);
        if let Some(h) = &human {
            escalated.approvers = h.approvers.clone();
        }
        escalated.timeout = Some(timeout);
        escalated.on_timeout = OnTimeout::Reject;
        escalated.escalate_to = None;
        escalated.notify = None;

        held.row = Arc::new(InputRow {
            id: crate::threads::new_id(),
            status: InputStatus::Open,
            created: now,
            expires: Some(super::expires(now, timeout)),
            decided_by: None,
            decided: None,
            decision: None,
            reason: None,
            result: None,
            ..row
        });
        held.approval = Some(Arc::new(escalated));
        self.open_input(held);
        true
    }

    /// Withdraws every open input of `thread` (killed or aborted): its held messages are
    /// `killed` with `why`.
    pub(crate) fn cancel_inputs(self: &Arc<Self>, thread: &str, why: &str) {
        self.withdraw(|h| &*h.row.thread_id == thread, why);
    }

    /// Withdraws every open input of `listener`, removed by a reload: its held messages are
    /// `undeliverable`.
    pub(crate) fn withdraw_inputs_of(self: &Arc<Self>, listener: &str) {
        let why =
            format!("`{listener}` was removed by a reload before its held message was let through");
        self.withdraw(|h| &*h.row.listener == listener, &why);
    }

    fn withdraw(self: &Arc<Self>, which: impl Fn(&Held) -> bool, why: &str) {
        let ids: Vec<InputRow> = lock(&self.inbox.open)
            .values()
            .filter(|h| which(h))
            .map(|h| (*h.row).clone())
            .collect();
        for row in ids {
            let decided = InputRow {
                status: InputStatus::Cancelled,
                decided_by: Some(crate::pump::SYSTEM_IDENTITY.to_string()),
                decided: Some(self.inbox.clock.now()),
                decision: Some(why.to_string()),
                ..row
            };
            let _ = self.close(decided, None);
        }
    }

    /// Opens again, after a restart, the inputs the store holds open: each held message is
    /// held again in its thread (which waits), its timer counted from its `expires`.
    pub(crate) fn restore_inputs(&self) {
        let Some(table) = &self.inbox.table else {
            return;
        };
        let rows = match table.open_inputs() {
            Ok(rows) => rows,
            Err(e) => {
                self.say_error(None, None, format!("the inbox could not be read back: {e}"));
                return;
            }
        };
        let store = self.store.as_ref();
        for row in rows {
            if !self.threads.contains(&row.thread_id) {
                let stored = match store.map(|s| s.thread(&row.thread_id)).transpose() {
                    Ok(stored) => stored.flatten(),
                    Err(e) => {
                        // Said, and the input held again with what its own row holds.
                        self.say_error(
                            Some(&row.thread_id),
                            Some(&row.listener),
                            format!("the thread of an open input could not be read back: {e}"),
                        );
                        None
                    }
                };
                let info = stored.unwrap_or_else(|| ThreadInfo {
                    id: row.thread_id.to_string(),
                    status: ThreadStatus::Waiting,
                    participants: vec![row.from.to_string(), row.listener.to_string()],
                    message_count: row.slot_index + 1,
                    created_at: row.created,
                    last_activity: row.created,
                    error: None,
                    settings: None,
                    labels: None,
                    paused: false,
                    owner: None,
                });
                self.threads.adopt(&info);
            }
            self.threads.open_input(&row.thread_id);
            let record = MessageRecord::new(
                MessageCore {
                    id: row.message_id.clone(),
                    thread_id: row.thread_id.clone(),
                    parent_id: row.parent_id.clone(),
                    slot_index: row.slot_index,
                    from: row.from.clone(),
                    to: Some(row.listener.clone()),
                    payload_type: Some(row.payload_type.clone()),
                    payload_xml: row.payload_xml.clone(),
                    timestamp: row.created,
                    // A held message is never an edit (an edit is let through at once).
                    origin: crate::threads::Origin::implied(
                        row.parent_id.as_deref().map(Arc::from).as_ref(),
                        &row.from,
                    ),
                },
                match row.kind {
                    InputKind::Approval => MessageStatus::Held,
                    InputKind::Question => MessageStatus::Delivered,
                },
                None,
            );
            let topo = self.topo();
            let listener = topo.listeners.get(&*row.listener);
            let approval = listener.and_then(|l| l.config.approval.clone());
            let human = listener.and_then(|l| l.config.human.clone());
            self.keep_open(Held {
                row: Arc::new(row),
                record,
                valid: None,
                approval,
                human,
            });
        }
    }
}

/// How often open inputs are looked at for a timeout that passed.
pub(crate) const EXPIRY_TICK: std::time::Duration = std::time::Duration::from_millis(250);
