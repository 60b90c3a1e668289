//! Replies owed by external agents (SPEC §11.4).
//!
//! A delivery to a listener whose handler [`awaits_reply`](crate::listener::Handler::awaits_reply)
//! opens a [`Wait`] *before* the handler runs (an agent may call back before its POST is
//! answered). The wait holds the thread active and the agent `waiting`. It ends exactly once,
//! by whichever comes first:
//! - the handler fails (the POST was refused): the wait is withdrawn;
//! - a callback arrives: its payloads enter the pump as the agent's output, with the awaited
//!   message as parent;
//! - `reply_timeout` passes: the awaited message fails with `reply timeout`;
//! - the thread is killed.
//!
//! Whoever removes the wait from [`Waits`] under its lock does the ending, so no path can
//! end it twice.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::dispatch::Listener;
use super::{FailureKind, Organism, Shared};
use crate::listener::Output;
use crate::threads::{MessageRecord, ThreadStatus};
use crate::xml::{extract_payloads, normalize_payload, XmlError};

/// One reply owed.
pub(crate) struct Wait {
    id: u64,
    /// The delivered message the reply answers (its `parent_id`).
    record: MessageRecord,
}

/// Open waits by (agent, thread), oldest first.
type OpenWaits = crate::hash::SeededMap<(Arc<str>, Arc<str>), VecDeque<Wait>>;

#[derive(Default)]
pub(crate) struct Waits {
    open: Mutex<OpenWaits>,
    next: AtomicU64,
}

impl Waits {
    fn lock(&self) -> MutexGuard<'_, OpenWaits> {
        crate::sync::lock(&self.open)
    }

    /// Removes one wait: the one with `id`, or (with `None`) the one answering `message`
    /// or else the oldest.
    fn take(
        &self,
        agent: &str,
        thread: &str,
        pick: impl Fn(&Wait) -> bool,
    ) -> Option<MessageRecord> {
        let mut open = self.lock();
        let key = (Arc::from(agent), Arc::from(thread));
        let queue = open.get_mut(&key)?;
        let at = queue.iter().position(pick)?;
        let wait = queue.remove(at);
        if queue.is_empty() {
            open.remove(&key);
        }
        wait.map(|w| w.record)
    }

    fn is_waiting(&self, agent: &str, thread: &str) -> bool {
        self.lock()
            .contains_key(&(Arc::from(agent), Arc::from(thread)))
    }

    /// Removes every wait whose (agent, thread) is `which`: each with its agent and the
    /// message it awaited.
    fn take_all(&self, which: impl Fn(&str, &str) -> bool) -> Vec<(Arc<str>, MessageRecord)> {
        self.lock()
            .extract_if(|(agent, thread), _| which(agent, thread))
            .flat_map(|((agent, _), waits)| {
                waits.into_iter().map(move |w| (agent.clone(), w.record))
            })
            .collect()
    }
}

/// A callback from an external agent.
#[derive(Debug, Clone, Copy)]
pub struct ExternalReply<'a> {
    pub agent: &'a str,
    pub thread_id: &'a str,
    /// The `Authorization: Bearer` token presented, if any.
    pub token: Option<&'a str>,
    /// The XML body: one or several payloads.
    pub body: &'a str,
    /// Send every payload to this listener (or back to the awaited message's sender);
    /// `None`: routed by payload type.
    pub to: Option<&'a str>,
    /// Answer this delivered message; `None`: the oldest one awaiting this agent's reply.
    pub message_id: Option<&'a str>,
}

/// What an accepted callback did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyReceipt {
    pub thread_id: String,
    /// The delivered message this reply answers (the parent of its payloads).
    pub in_reply_to: String,
    /// The payload types accepted, in order.
    pub payload_types: Vec<String>,
}

/// Why a callback was refused. Each maps to one HTTP status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReplyError {
    #[error("no external agent named `{0}`")]
    UnknownAgent(String),
    #[error("a valid bearer token for `{0}` is required")]
    Unauthorized(String),
    #[error("no thread `{0}`")]
    UnknownThread(String),
    #[error("thread `{0}` was killed; its replies are refused")]
    Killed(String),
    #[error("`{agent}` owes no reply in thread `{thread}` (never asked, already answered, or timed out)")]
    NotWaiting { agent: String, thread: String },
    #[error("the reply is {size} bytes; the limit is {max}")]
    TooLarge { size: usize, max: usize },
    #[error("the reply holds no payload: {0}")]
    Malformed(XmlError),
    #[error("{} of the reply's payloads cannot be accepted; nothing was", .0.len())]
    Invalid(Vec<String>),
    #[error("the organism is stopping")]
    Stopping,
    /// The thread is not held in memory and the store could not be asked about it.
    #[error(transparent)]
    Store(crate::store::StoreError),
}

/// Constant-time equality (`subtle`), so a wrong token of the right length takes as long
/// to refuse as any other.
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    given.ct_eq(expected).into()
}

impl Shared {
    /// Opens a wait for the reply to `record`, before the handler runs. `None` if the thread
    /// cannot hold it (killed meanwhile).
    pub(crate) fn begin_wait(
        self: &Arc<Self>,
        listener: &Arc<Listener>,
        record: &MessageRecord,
    ) -> Option<u64> {
        let agent = listener.config.name.arc();
        let thread = record.thread_id.clone();
        if !self.threads.hold(&thread) {
            return None;
        }
        let id = self.external.waits.next.fetch_add(1, Ordering::Relaxed);
        self.external
            .waits
            .lock()
            .entry((agent.clone(), thread.clone()))
            .or_default()
            .push_back(Wait {
                id,
                record: record.clone(),
            });
        self.add_waiting(listener, 1);
        let timeout = listener
            .config
            .external
            .as_ref()
            .map(|e| e.reply_timeout)
            .unwrap_or(crate::config::DEFAULT_REPLY_TIMEOUT);
        let shared = self.clone();
        self.life.runtime.spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(record) = shared.external.waits.take(&agent, &thread, |w| w.id == id) {
                shared.fail_message(
                    &record,
                    FailureKind::ReplyTimeout,
                    format!(
                        "reply timeout: `{agent}` did not reply within {} ms",
                        timeout.as_millis()
                    ),
                );
                shared.end_wait(&agent, &thread);
            }
        });
        Some(id)
    }

    /// Withdraws a wait whose request failed. Does nothing if a reply already ended it.
    pub(crate) fn cancel_wait(&self, listener: &Arc<Listener>, record: &MessageRecord, id: u64) {
        let agent = listener.config.name.arc();
        if self
            .external
            .waits
            .take(&agent, &record.thread_id, |w| w.id == id)
            .is_some()
        {
            self.end_wait(&agent, &record.thread_id);
        }
    }

    /// The bookkeeping of a wait that ended: the agent owes one reply less, the thread one
    /// piece of work less.
    fn end_wait(&self, agent: &str, thread: &str) {
        // By name: a reload may have handed the agent's waits to a successor.
        if let Some(l) = self.topo().listeners.get(agent) {
            self.add_waiting(l, -1);
        }
        if let Some(change) = self.threads.finish_one(thread) {
            self.publish_thread(change);
        }
    }

    /// A killed thread owes no replies any more.
    pub(crate) fn drop_waits(&self, thread: &str) {
        for (agent, _) in self.external.waits.take_all(|_, t| t == thread) {
            self.end_wait(&agent, thread);
        }
    }

    /// An agent removed by a reload owes no replies any more: each awaited message fails.
    pub(crate) fn drop_agent_waits(self: &Arc<Self>, agent: &str) {
        for (_, record) in self.external.waits.take_all(|a, _| a == agent) {
            self.fail_message(
                &record,
                FailureKind::Undeliverable,
                format!("`{agent}` was removed by a reload before it replied"),
            );
            if let Some(change) = self.threads.finish_one(&record.thread_id) {
                self.publish_thread(change);
            }
        }
    }
}

impl Organism {
    /// Accepts an external agent's reply (SPEC §11.4): checks the agent, its token, the
    /// size, the thread and that a reply is owed; reads the body leniently into payloads and
    /// validates each strictly against where it would go. All accepted or none: then they
    /// enter the pump as the agent's output, children of the awaited message.
    pub fn external_reply(&self, reply: ExternalReply<'_>) -> Result<ReplyReceipt, ReplyError> {
        let result = self.accept_reply(reply);
        if let Err(e) = &result {
            let s = &self.shared;
            s.count_failure(FailureKind::ReplyRefused);
            s.say_error(
                Some(reply.thread_id),
                Some(reply.agent),
                format!("reply refused: {e}"),
            );
        }
        result
    }

    fn accept_reply(&self, reply: ExternalReply<'_>) -> Result<ReplyReceipt, ReplyError> {
        let s = &self.shared;
        let agent = reply.agent;
        let listener = s
            .topo()
            .listeners
            .get(agent)
            .filter(|l| l.handler.awaits_reply())
            .cloned()
            .ok_or_else(|| ReplyError::UnknownAgent(agent.to_string()))?;
        if let Some(expected) = listener
            .config
            .external
            .as_ref()
            .and_then(|e| e.token.as_ref())
        {
            let given = reply.token.unwrap_or_default();
            if !same_token(given.as_bytes(), expected.as_bytes()) {
                return Err(ReplyError::Unauthorized(agent.to_string()));
            }
        }
        if s.life.status.load(Ordering::SeqCst) != super::STATUS_RUNNING {
            return Err(ReplyError::Stopping);
        }
        let max = s.limits.max_message_bytes;
        if reply.body.len() > max {
            return Err(ReplyError::TooLarge {
                size: reply.body.len(),
                max,
            });
        }
        let thread = reply.thread_id;
        match s.threads.status(thread) {
            Some(ThreadStatus::Killed) => return Err(ReplyError::Killed(thread.to_string())),
            Some(_) => {}
            None => {
                let stored = s
                    .store
                    .as_ref()
                    .map(|st| st.thread(thread))
                    .transpose()
                    .map_err(ReplyError::Store)?
                    .flatten();
                return Err(match stored {
                    Some(t) if t.status == ThreadStatus::Killed => {
                        ReplyError::Killed(thread.to_string())
                    }
                    // Known from before a restart: nothing there waits any more.
                    Some(_) => ReplyError::NotWaiting {
                        agent: agent.to_string(),
                        thread: thread.to_string(),
                    },
                    None => ReplyError::UnknownThread(thread.to_string()),
                });
            }
        }
        let not_waiting = || ReplyError::NotWaiting {
            agent: agent.to_string(),
            thread: thread.to_string(),
        };
        if !s.external.waits.is_waiting(agent, thread) {
            return Err(not_waiting());
        }
        // Read and check every payload before anything enters the pump.
        let texts = extract_payloads(reply.body, &s.xml_limits).map_err(ReplyError::Malformed)?;
        let awaited = s
            .external
            .waits
            .lock()
            .get(&(Arc::from(agent), Arc::from(thread)))
            .and_then(|q| match reply.message_id {
                Some(id) => q.iter().find(|w| &*w.record.id == id),
                None => q.front(),
            })
            .map(|w| w.record.clone())
            .ok_or_else(not_waiting)?;
        let payload_types = s.check_reply(&listener, &awaited.from, reply.to, &texts)?;
        // Claim the wait; a timeout or a second callback racing this one finds it gone.
        let record = s
            .external
            .waits
            .take(agent, thread, |w| w.record.id == awaited.id)
            .ok_or_else(not_waiting)?;
        for text in texts {
            s.route_output(
                &listener,
                &record,
                None,
                Output {
                    payload: text,
                    to: reply.to.map(str::to_string),
                },
            );
        }
        s.end_wait(agent, thread);
        Ok(ReplyReceipt {
            thread_id: thread.to_string(),
            in_reply_to: record.id.to_string(),
            payload_types,
        })
    }
}

impl Shared {
    /// Reads and checks each payload of a reply from `listener` to `from` (or `to`) as the
    /// pump will carry it: acceptable XML, a route, valid for every receiver. The payload
    /// types, or every problem found.
    pub(crate) fn check_reply(
        &self,
        listener: &Arc<Listener>,
        from: &Arc<str>,
        to: Option<&str>,
        texts: &[String],
    ) -> Result<Vec<String>, ReplyError> {
        let s = self;
        let mut problems = Vec::new();
        let mut payload_types = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let n = i + 1;
            let payload = match normalize_payload(text, &s.xml_limits) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(format!("payload {n}: not acceptable XML: {e}"));
                    continue;
                }
            };
            let targets = match s.route(listener, from, to, &payload.payload_type) {
                Ok(t) => t,
                Err(reason) => {
                    problems.push(format!("payload {n} ({}): {reason}", payload.payload_type));
                    continue;
                }
            };
            for target in targets {
                if let super::route::Target::Listener(l) = target {
                    let checked = l
                        .config
                        .schema_for(&payload.payload_type)
                        .map(|schema| schema.validate(payload.clone()));
                    if let Some(Err(e)) = checked {
                        problems.push(format!(
                            "payload {n} ({}) is invalid for `{}`: {e}",
                            payload.payload_type,
                            l.name()
                        ));
                    }
                }
            }
            payload_types.push(payload.payload_type.to_string());
        }
        if !problems.is_empty() {
            return Err(ReplyError::Invalid(problems));
        }
        Ok(payload_types)
    }
}

#[cfg(test)]
mod tests {
    use super::same_token;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"secret", b"secret"));
        assert!(!same_token(b"secre", b"secret"));
        assert!(!same_token(b"secret!", b"secret"));
        assert!(!same_token(b"", b"secret"));
        assert!(!same_token(b"Secret", b"secret"));
    }
}
