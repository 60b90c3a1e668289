//! The pump's metering of a `kind: llm` listener placed on workers (`nats::Metering`): a
//! delivery's tokens (its payload, estimated at 4 bytes a token, and `max_tokens`) held
//! against the thread's budget and the tenant's windows before it is handed to a worker;
//! the calls the worker reports in the result the pump takes accounted as `usage`, priced
//! by the pump's own model table, once, however often NATS redelivered the work.

use std::sync::Arc;

use crate::config::llm::LlmConfig;
use crate::config::ListenerConfig;
use crate::llm::{Budgets, Call, Held, Meter};
use crate::nats::{Metered, Metering, WorkItem, WorkUsage};

#[derive(Clone)]
pub(super) struct PlacedLlm {
    meter: Meter,
    config: Arc<LlmConfig>,
}

impl PlacedLlm {
    /// The metering of `lc`, if it is a `kind: llm` listener.
    pub(super) fn of(
        lc: &ListenerConfig,
        budgets: &Arc<Budgets>,
        events: &Arc<crate::events::EventHub>,
    ) -> Option<Arc<dyn Metering>> {
        let config = lc.llm.clone()?;
        Some(Arc::new(PlacedLlm {
            meter: Meter::new(lc, &config, Some(budgets.clone()), events.clone()),
            config,
        }))
    }
}

impl Metering for PlacedLlm {
    fn hold(&self, item: &WorkItem) -> Result<Box<dyn Metered>, String> {
        let tokens = item.payload_xml.len().div_ceil(4) as u64 + u64::from(self.config.max_tokens);
        let held = self.meter.hold(&item.thread_id, tokens)?;
        Ok(Box::new(Delivery {
            // A delivery holds its listener's metering, so a reload meanwhile settles it.
            llm: self.clone(),
            held,
            thread: Arc::from(item.thread_id.as_str()),
            message: Arc::from(item.message_id.as_str()),
        }))
    }
}

struct Delivery {
    llm: PlacedLlm,
    held: Held,
    thread: Arc<str>,
    message: Arc<str>,
}

impl Metered for Delivery {
    fn settle(self: Box<Self>, usage: Vec<WorkUsage>) {
        let Delivery {
            llm,
            held,
            thread,
            message,
        } = *self;
        let mut used = 0u64;
        for u in &usage {
            // The worker names the model; the pump prices one the listener may use.
            let model = llm.config.choice(&u.model).unwrap_or(&llm.config.model);
            used = used.saturating_add(llm.meter.account(
                &thread,
                &message,
                &Call {
                    model,
                    input: u.input_tokens,
                    output: u.output_tokens,
                    cached: u.cached_tokens,
                    estimated: u.estimated,
                    ms: u.ms,
                },
            ));
        }
        llm.meter.settle(held, used);
    }
}
