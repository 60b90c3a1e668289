//! What a `kind: llm` listener's calls cost: held against its tenant's windows and its
//! thread's budget before, accounted (a `usage` event, which the store keeps) and settled
//! after. A listener in this process meters each call it makes; the pump meters a listener
//! placed on workers around each delivery, from the calls the worker reports in its result,
//! so a worker needs no budgets and a result taken once is accounted once.

use std::sync::Arc;

use crate::config::llm::{LlmConfig, ModelConfig};
use crate::config::ListenerConfig;
use crate::events::{EventHub, EventKind, Usage};

use super::budget::{Budgets, Reservation, ThreadHold};

/// One listener's meter.
#[derive(Clone)]
pub struct Meter {
    listener: Arc<str>,
    tenant: Option<String>,
    tokens_per_thread: Option<u64>,
    budgets: Option<Arc<Budgets>>,
    events: Arc<EventHub>,
}

/// Tokens held for a call (or a delivery) until it ends.
#[must_use]
pub struct Held {
    tenant: Option<Reservation>,
    thread: Option<ThreadHold>,
}

/// One call as it is accounted.
pub struct Call<'a> {
    pub model: &'a ModelConfig,
    pub input: u64,
    pub output: u64,
    pub cached: u64,
    /// The server reported no usage: the tokens are estimated.
    pub estimated: bool,
    pub ms: u64,
}

impl Meter {
    pub fn new(
        me: &ListenerConfig,
        config: &LlmConfig,
        budgets: Option<Arc<Budgets>>,
        events: Arc<EventHub>,
    ) -> Meter {
        Meter {
            listener: me.name.arc(),
            tenant: me.tenant.clone(),
            tokens_per_thread: config.tokens_per_thread,
            budgets,
            events,
        }
    }

    /// Holds `tokens` against the thread's budget and the tenant's windows, or says which
    /// one they would pass (nothing held then).
    pub fn hold(&self, thread: &str, tokens: u64) -> Result<Held, String> {
        let Some(b) = &self.budgets else {
            return Ok(Held {
                tenant: None,
                thread: None,
            });
        };
        let in_thread = match self.tokens_per_thread {
            Some(limit) => Some(b.reserve_thread(&self.listener, thread, limit, tokens)?),
            None => None,
        };
        let tenant = match self.tenant.as_deref() {
            Some(t) => match b.reserve(t, tokens) {
                Ok(r) => Some(r),
                Err(e) => {
                    if let Some(h) = in_thread {
                        b.settle_thread(h, 0);
                    }
                    return Err(e.to_string());
                }
            },
            None => None,
        };
        Ok(Held {
            tenant,
            thread: in_thread,
        })
    }

    /// Lets `held` go: what it held becomes the `used` tokens.
    pub fn settle(&self, held: Held, used: u64) {
        let Some(b) = &self.budgets else { return };
        if let Some(r) = held.tenant {
            b.settle(r, used);
        }
        if let Some(h) = held.thread {
            b.settle_thread(h, used);
        }
    }

    /// Publishes `call` as a `usage` event of the message `message` of `thread`; the
    /// tokens it took.
    pub fn account(&self, thread: &Arc<str>, message: &Arc<str>, call: &Call<'_>) -> u64 {
        self.events.publish(EventKind::Usage(Box::new(Usage {
            tenant: self.tenant.clone(),
            listener: self.listener.clone(),
            thread_id: thread.clone(),
            message_id: message.clone(),
            model: call.model.name.clone(),
            input_tokens: call.input,
            output_tokens: call.output,
            cached_tokens: call.cached,
            cost_micros: call.model.price.micros(call.input, call.output),
            estimated: call.estimated,
            ms: call.ms,
        })));
        call.input.saturating_add(call.output)
    }
}
