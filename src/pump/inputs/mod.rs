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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::config::approval::{Approval, Approvers, Decision, Human};
use crate::config::Role;
use crate::hash::SeededMap;
use crate::schema::ValidatedPayload;
use crate::store::inputs::InputsTable;
use crate::sync::lock;
use crate::threads::{InputFilter, InputKind, InputRow, InputStatus, MessageRecord, Page, Paged};
use crate::time::Clock;

mod ask;
mod gate;
mod kept;
mod notify;
mod restore;
pub use ask::Answer;
pub use notify::signature as notify_signature;
pub(crate) use restore::EXPIRY_TICK;

use super::{InjectError, Organism, Shared};

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
    /// The store could not be read (whether the input was decided).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// What an input is opened with: the status its message is logged with, its kind, its
/// prompt (a template over the payload's fields) and how long it waits.
pub(super) struct Opening<'a> {
    pub status: crate::threads::MessageStatus,
    pub kind: InputKind,
    pub prompt: Option<&'a str>,
    pub timeout: Option<std::time::Duration>,
}

/// When an input opened `now` that waits `timeout` expires.
fn expires(now: crate::time::Timestamp, timeout: std::time::Duration) -> crate::time::Timestamp {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    crate::time::Timestamp(now.0.saturating_add(ms))
}

/// One open input.
struct Held {
    /// Shared with the `input_requested` event that told of it.
    row: Arc<InputRow>,
    record: MessageRecord,
    /// `None` for an input restored after a restart: validated again when let through.
    valid: Option<ValidatedPayload>,
    /// The gate as it was when the message was held (a reload applies to new messages).
    approval: Option<Arc<Approval>>,
    /// For a question: the human listener's settings when it was asked.
    human: Option<Arc<Human>>,
}

/// Decisions of one kind (`approve`, `expired`, …) of a listener: how many, and the seconds
/// their inputs waited in all.
type Decided = (String, u64, f64);

/// A tenant's open inputs: how many, their payloads' bytes, and how many in each thread.
#[derive(Default)]
struct TenantOpen {
    inputs: usize,
    bytes: usize,
    threads: std::collections::HashMap<Arc<str>, usize>,
}

/// What a tenant's open inputs hold: inputs, their payloads' bytes, threads waiting on
/// them, and whether the thread asked about is one.
#[derive(Default)]
struct TenantTotals {
    inputs: usize,
    bytes: usize,
    threads: usize,
    this_waits: bool,
}

/// The open inputs, the recently decided ones, and the table that keeps them.
pub(crate) struct Inbox {
    open: Mutex<SeededMap<Arc<str>, Held>>,
    /// The newest decided inputs, each tenant's apart (`kept.rs`), by id (so a decision and
    /// a look-up are found, not searched for).
    recent: Mutex<kept::Kept>,
    /// Decisions since start by listener, then by decision (a listener's few are found by
    /// a look along them: nothing is allocated for a decision but its first of a kind).
    decisions: Mutex<SeededMap<Arc<str>, Vec<Decided>>>,
    /// Notification attempts that failed (`approval.notify`).
    notify_failures: std::sync::atomic::AtomicU64,
    /// Bytes of the open inputs' payloads, changed with the open map.
    held_bytes: std::sync::atomic::AtomicUsize,
    /// Open inputs of each tenant's listeners: how many, and how many in each thread;
    /// changed with the open map (so a tenant's quotas are looked up, not counted).
    tenants: Mutex<SeededMap<String, TenantOpen>>,
    table: Option<InputsTable>,
    pub(crate) clock: Clock,
}

impl Inbox {
    pub(crate) fn new(table: Option<InputsTable>, clock: Clock) -> Self {
        Inbox {
            open: Mutex::default(),
            recent: Mutex::default(),
            decisions: Mutex::default(),
            notify_failures: Default::default(),
            held_bytes: Default::default(),
            tenants: Default::default(),
            table,
            clock,
        }
    }

    fn remember(&self, row: std::sync::Arc<InputRow>) {
        let decision = match row.status {
            InputStatus::Expired => "expired",
            InputStatus::Cancelled => "cancelled",
            _ => row.decision.as_deref().unwrap_or_default(),
        };
        let waited = row
            .decided
            .map_or(0.0, |d| d.0.saturating_sub(row.created.0) as f64 / 1000.0);
        let mut decisions = lock(&self.decisions);
        let kinds = decisions.entry(row.listener.clone()).or_default();
        match kinds.iter_mut().find(|k| k.0 == decision) {
            Some(k) => (k.1, k.2) = (k.1 + 1, k.2 + waited),
            None => kinds.push((decision.to_string(), 1, waited)),
        }
        drop(decisions);
        // In the place of the same input's decision if one is kept (the decision as first
        // known, [`Shared::take_open`], made final), else as the newest.
        lock(&self.recent).replace(row);
    }

    /// A decided input: among the recent ones, else in the table (a read that fails says so).
    fn decided(&self, id: &str) -> Result<Option<InputRow>, crate::store::StoreError> {
        if let Some(r) = lock(&self.recent).get(id) {
            return Ok(Some(InputRow::clone(r)));
        }
        match &self.table {
            Some(table) => table.get(id),
            None => Ok(None),
        }
    }

    /// Why input `id` is not open: decided already (the first decision, if `sees` it), else
    /// not found; or the store could not say.
    fn not_open(&self, id: &str, sees: impl FnOnce(&InputRow) -> bool) -> DecideError {
        match self.decided(id) {
            Ok(Some(r)) if sees(&r) => DecideError::AlreadyDecided(Box::new(r)),
            Ok(_) => DecideError::NotFound(id.to_string()),
            Err(e) => e.into(),
        }
    }

    /// A tenant's open inputs, the threads they are in, and whether `thread` is one.
    fn tenant_totals(&self, tenant: &str, thread: &str) -> TenantTotals {
        match lock(&self.tenants).get(tenant) {
            Some(t) => TenantTotals {
                inputs: t.inputs,
                bytes: t.bytes,
                threads: t.threads.len(),
                this_waits: t.threads.contains_key(thread),
            },
            None => TenantTotals::default(),
        }
    }

    /// Counts `row` among its tenant's open inputs (`up`), or no longer.
    fn count_tenant(&self, row: &InputRow, up: bool) {
        let Some(tenant) = &row.tenant else { return };
        let mut tenants = lock(&self.tenants);
        let t = tenants.entry(tenant.clone()).or_default();
        let in_thread = t.threads.entry(row.thread_id.clone()).or_default();
        let bytes = row.payload_xml.len();
        if up {
            t.inputs += 1;
            t.bytes += bytes;
            *in_thread += 1;
            return;
        }
        t.bytes = t.bytes.saturating_sub(bytes);
        *in_thread = in_thread.saturating_sub(1);
        if *in_thread == 0 {
            t.threads.remove(&*row.thread_id);
        }
        t.inputs = t.inputs.saturating_sub(1);
        if t.inputs == 0 {
            tenants.remove(tenant);
        }
    }

    fn held_totals(&self) -> (usize, usize) {
        (
            lock(&self.open).len(),
            self.held_bytes.load(Ordering::Relaxed),
        )
    }
}

impl Shared {
    /// Keeps `held` open; its payload's bytes count against what history keeps in memory
    /// (`limits.max_retained_bytes`).
    fn keep_open(&self, held: Held) {
        let bytes = held.row.payload_xml.len();
        self.inbox.count_tenant(&held.row, true);
        lock(&self.inbox.open).insert(held.row.id.clone(), held);
        let total = self.inbox.held_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.threads.reserve_bytes(total);
    }

    /// Takes the open input `decided.id` (whoever takes it decides it). `decided`, its
    /// decision as known now, is among the recent decisions before the input is gone from the
    /// open ones (under their lock): a second decider finds it open or decided, never neither
    /// (a 409 with the first decision, not a 404).
    fn take_open(&self, decided: &Arc<InputRow>) -> Option<Held> {
        let held = {
            let mut open = lock(&self.inbox.open);
            let held = open.remove(&*decided.id)?;
            lock(&self.inbox.recent).replace(decided.clone());
            held
        };
        self.inbox.count_tenant(&held.row, false);
        let bytes = held.row.payload_xml.len();
        let total = self
            .inbox
            .held_bytes
            .fetch_sub(bytes, Ordering::Relaxed)
            .saturating_sub(bytes);
        self.threads.reserve_bytes(total);
        Some(held)
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

    /// One page of inputs, newest first: from the store when there is one (after it has
    /// committed what was published before the call, [`super::READ_CATCH_UP`] at most),
    /// else from memory (the open ones and the last decided).
    pub fn list(
        self,
        filter: &InputFilter,
        page: Page,
    ) -> Result<Paged<InputRow>, crate::store::StoreError> {
        let s = self.shared();
        if let (Some(table), Some(store)) = (&s.inbox.table, &s.store) {
            store.catch_up(super::READ_CATCH_UP);
            return table.page(filter, page);
        }
        let inbox = &s.inbox;
        let mut all: Vec<InputRow> = lock(&inbox.recent)
            .of(filter.tenant.as_deref())
            .map(|r| InputRow::clone(r))
            .collect();
        all.extend(lock(&inbox.open).values().map(|h| (*h.row).clone()));
        all.retain(|r| filter.matches(r));
        all.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
        Ok(page.cut(all))
    }

    /// One input, open or decided.
    pub fn get(self, id: &str) -> Result<Option<InputRow>, crate::store::StoreError> {
        let inbox = &self.shared().inbox;
        if let Some(h) = lock(&inbox.open).get(id) {
            return Ok(Some((*h.row).clone()));
        }
        inbox.decided(id)
    }

    /// Inputs open now.
    pub fn open_count(self) -> usize {
        lock(&self.shared().inbox.open).len()
    }

    /// Notification attempts that failed since start (`approval.notify`).
    pub fn notify_failures(self) -> u64 {
        self.shared()
            .inbox
            .notify_failures
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Inputs open now by (listener, kind), sorted.
    pub fn open_by_listener(self) -> Vec<(String, InputKind, u64)> {
        let mut counts: std::collections::BTreeMap<(String, &'static str), (InputKind, u64)> =
            Default::default();
        for h in lock(&self.shared().inbox.open).values() {
            counts
                .entry((h.row.listener.to_string(), h.row.kind.as_str()))
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
            .flat_map(|(l, kinds)| {
                kinds
                    .iter()
                    .map(|(d, n, s)| (l.to_string(), d.clone(), *n, *s))
            })
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
            return Err(s.inbox.not_open(id, |r| in_scope(r, who)));
        };
        if !in_scope(&row, who) {
            return Err(DecideError::NotFound(id.to_string()));
        }
        // Restored after a restart: the listener's settings now.
        let topo = s.topo();
        let now = topo.listeners.get(&*row.listener);
        let approval = approval.or_else(|| now.and_then(|l| l.config.approval.clone()));
        let human = human.or_else(|| now.and_then(|l| l.config.human.clone()));
        let approvers = match row.kind {
            InputKind::Approval => approval.as_ref().map(|a| &a.approvers),
            InputKind::Question => human.as_ref().map(|h| &h.approvers),
        };
        may_decide(approvers, &row, who)?;
        Ok(((*row).clone(), approval))
    }

    /// Decides an open input. Exactly one decision of an input is taken; a later one is
    /// answered [`DecideError::AlreadyDecided`] with the first.
    pub fn decide(
        self,
        id: &str,
        who: &Decider,
        verdict: Verdict,
    ) -> Result<Arc<InputRow>, DecideError> {
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
