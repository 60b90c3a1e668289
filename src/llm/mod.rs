//! `kind: llm` listeners: a language model is the handler, and everything it sends is a
//! payload the schema accepts, routed by the pump like any other handler's output.
//!
//! A delivery becomes a conversation: the listener's system prompt, then the message as
//! JSON (`{from, type, payload}`, the payload typed as the API shows it). The listener's
//! `outputs` are the model's tools (`tools.rs`), each writing one payload type for one
//! receiver. A tool call's arguments become that receiver's XML in schema order (the same
//! code as a Lua output, `listener::OutputTargets`), checked here against the receiver's
//! schema; a refused call goes back to the model as the call's result, with the
//! validator's words, for another round, up to `limits.max_rounds` calls in all; past that
//! the message fails with the last refusals. The pump checks every output again: nothing
//! here is trusted. An answer with no tool call is a `reply` (a payload type and the field
//! the text goes in) to the sender, or nothing.
//!
//! The model is called over OpenAI's chat-completions protocol (`chat.rs`), or is a
//! scripted list of answers for demos and tests. It implements `listener::Handler`, so it
//! runs on workers too.

mod budget;
mod chat;
mod context;
mod meter;
mod tools;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use crate::config::llm::{read_system, LlmConfig, Overridable, SystemPrompt};
use crate::config::ListenerConfig;
use crate::events::{Delta, DeltaKind, EventHub, EventKind};
use crate::listener::OutputTargets;
use crate::listener::{Delivery, Handler, HandlerError, HandlerFuture, HandlerResult, Output};
use crate::schema::Schema;
use crate::threads::ThreadSettings;
use crate::xml::{normalize_payload, XmlLimits};

pub use budget::{
    Budgets, Exhausted, Reservation, ThreadHold, UsageSource, WindowState, MAX_THREAD_ACCOUNTS,
};
pub use chat::MAX_ANSWER_BYTES;
pub use context::{ThreadHistory, MAX_CONTEXT_BYTES};
pub use meter::{Call, Held, Meter};

/// Outputs one message may have, at most.
const MAX_OUTPUTS: usize = 64;

/// The handler of a `kind: llm` listener.
pub struct LlmHandler(Arc<Inner>);

struct Inner {
    me: ListenerConfig,
    config: Arc<LlmConfig>,
    system: RwLock<Arc<str>>,
    model: Arc<chat::Model>,
    /// The other models a thread's settings chose for it, each made on first use.
    chosen: std::sync::Mutex<Vec<Arc<chat::Model>>>,
    targets: Arc<OutputTargets>,
    /// An output's bytes at most (`limits.max_message_bytes`).
    max_output: usize,
    /// Where streamed pieces are published.
    events: Arc<EventHub>,
    /// The threads' messages, for `context: {history: thread}`.
    history: Option<Arc<dyn ThreadHistory>>,
    /// Its calls held against budgets, and accounted.
    meter: Meter,
    stats: Stats,
}

/// What a listener's calls to its model came to, for `/metrics`.
#[derive(Default)]
struct Stats {
    ok: AtomicU64,
    failed: AtomicU64,
    tokens: [AtomicU64; 3],
    time: crate::stats::Histogram,
}

impl LlmHandler {
    pub fn new(
        me: &ListenerConfig,
        targets: Arc<OutputTargets>,
        max_output: usize,
        events: Arc<EventHub>,
        history: Option<Arc<dyn ThreadHistory>>,
        budgets: Option<Arc<Budgets>>,
    ) -> Result<LlmHandler, String> {
        let config = me
            .llm
            .clone()
            .ok_or_else(|| format!("`{}` is not a `kind: llm` listener", me.name))?;
        let system = prompt(&config.system)?;
        Ok(LlmHandler(Arc::new(Inner {
            model: Arc::new(chat::Model::new(config.model.clone())?),
            chosen: std::sync::Mutex::new(Vec::new()),
            meter: Meter::new(me, &config, budgets, events.clone()),
            me: me.clone(),
            config,
            system: RwLock::new(system),
            targets,
            max_output,
            events,
            history,
            stats: Stats::default(),
        })))
    }
}

fn prompt(p: &SystemPrompt) -> Result<Arc<str>, String> {
    match p {
        SystemPrompt::Inline(t) => Ok(Arc::from(t.as_str())),
        SystemPrompt::File(path) => read_system(path).map(Arc::from),
    }
}

impl Handler for LlmHandler {
    fn handle(&self, delivery: Delivery) -> HandlerFuture {
        let inner = self.0.clone();
        Box::pin(async move { inner.handle(delivery).await })
    }

    /// Reads a system prompt file again (an inline prompt has nothing to reload).
    fn metrics(&self) -> Vec<crate::listener::HandlerMetric> {
        use crate::listener::HandlerMetric as M;
        let s = &self.0.stats;
        let model = || ("model".to_string(), self.0.model.name().to_string());
        let mut v = Vec::new();
        for (status, n) in [("ok", &s.ok), ("error", &s.failed)] {
            v.push(M::counter(
                "agentserver_llm_requests_total",
                "Calls to the listener's model, by how they ended.",
                vec![model(), ("status".into(), status.into())],
                n.load(Ordering::Relaxed) as f64,
            ));
        }
        for (kind, n) in ["input", "output", "cached"].into_iter().zip(&s.tokens) {
            v.push(M::counter(
                "agentserver_llm_tokens_total",
                "Tokens of the listener's calls as its model's server reported them.",
                vec![model(), ("kind".into(), kind.into())],
                n.load(Ordering::Relaxed) as f64,
            ));
        }
        v.push(M::counter(
            "agentserver_llm_seconds_sum",
            "Total time of the listener's calls to its model.",
            vec![model()],
            s.time.sum_seconds(),
        ));
        v.push(M::counter(
            "agentserver_llm_seconds_count",
            "Calls to the listener's model, timed.",
            vec![model()],
            s.time.count() as f64,
        ));
        v
    }

    fn reload(&self) -> Option<Result<(), String>> {
        match &self.0.config.system {
            SystemPrompt::Inline(_) => None,
            p @ SystemPrompt::File(_) => Some(prompt(p).map(|text| {
                *crate::sync::write(&self.0.system) = text;
            })),
        }
    }
}

impl Inner {
    async fn handle(&self, d: Delivery) -> HandlerResult {
        let system = crate::sync::read(&self.system).clone();
        let sender = d.meta.from.to_string();
        let tools = tools::tools(&self.me, &self.config.outputs, &self.targets.listeners());
        let specs: Vec<Value> = tools.iter().map(|t| t.spec.clone()).collect();
        let indexes = [AtomicU64::new(0), AtomicU64::new(0)];
        let publish = |kind: DeltaKind, piece: &str| {
            let index = indexes[kind as usize].fetch_add(1, Ordering::Relaxed);
            self.events.publish(EventKind::Delta(Delta {
                thread_id: d.meta.thread_id.clone(),
                agent: self.me.name.arc(),
                in_reply_to: d.meta.message_id.clone(),
                kind,
                index,
                delta: piece.to_string(),
            }));
        };
        let (model, temperature) = self.settings(d.meta.settings.as_deref())?;
        let ask = chat::Ask {
            tools: &specs,
            max_tokens: self.config.max_tokens,
            temperature,
            stream: self.config.stream.then_some(&publish as chat::OnDelta<'_>),
        };
        let mut messages = vec![json!({"role": "system", "content": &*system})];
        if let (Some(max), Some(history)) = (self.config.history, &self.history) {
            messages.extend(context::turns(
                &**history,
                &self.me,
                &d.meta.thread_id,
                &d.meta.message_id,
                max,
            ));
        }
        messages.push(context::user_turn(
            &self.me,
            &d.meta.from,
            d.payload.payload_type(),
            d.payload.xml(),
        ));
        let mut outputs = Vec::new();
        let mut refused: Vec<String> = Vec::new();
        for _ in 0..self.config.max_rounds {
            let answer = self.call(&d, &model, &messages, &ask).await?;
            if answer.tool_calls.is_empty() {
                if !refused.is_empty() {
                    break;
                }
                if let (Some(text), Some(reply)) = (&answer.text, &self.config.reply) {
                    let payload = json!({ reply.text_field.as_str(): text });
                    let (xml, _) = self
                        .targets
                        .write(Some(&sender), Some(&reply.payload_type), &payload)
                        .map_err(|e| HandlerError(format!("the model's reply: {e}")))?;
                    outputs.push(Output::to(sender, xml));
                }
                return Ok(outputs);
            }
            messages.push(chat::ToolCall::turn(
                &answer.tool_calls,
                answer.text.as_deref(),
            ));
            refused.clear();
            for call in &answer.tool_calls {
                let result = match self.output(call, &tools, &sender) {
                    Ok(o) if outputs.len() < MAX_OUTPUTS => {
                        outputs.push(o);
                        "sent".to_string()
                    }
                    Ok(_) => {
                        let e = format!("not sent: at most {MAX_OUTPUTS} outputs a message");
                        refused.push(format!("{}: {e}", call.name));
                        e
                    }
                    Err(e) => {
                        refused.push(format!("{}: {e}", call.name));
                        format!("refused, nothing was sent: {e}. Call it again, corrected.")
                    }
                };
                messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
            }
            if refused.is_empty() {
                return Ok(outputs);
            }
        }
        Err(HandlerError(format!(
            "model `{}`: its outputs were still refused after {} rounds: {}",
            model.name(),
            self.config.max_rounds,
            refused.join("; ")
        )))
    }

    /// The model and temperature of a call in a thread with `settings`: what the
    /// listener's `overridable` lets them change, the listener's own otherwise.
    fn settings(
        &self,
        settings: Option<&ThreadSettings>,
    ) -> Result<(Arc<chat::Model>, Option<f64>), HandlerError> {
        let c = &self.config;
        let temperature = settings
            .and_then(|s| s.temperature)
            .filter(|_| c.may_override(Overridable::Temperature))
            .or(c.temperature);
        let choice = settings
            .and_then(|s| s.model.as_deref())
            .filter(|m| *m != c.model.name && c.may_override(Overridable::Model))
            .and_then(|m| c.choice(m));
        let Some(choice) = choice else {
            return Ok((self.model.clone(), temperature));
        };
        let mut chosen = crate::sync::lock(&self.chosen);
        if let Some(m) = chosen.iter().find(|m| m.name() == choice.name) {
            return Ok((m.clone(), temperature));
        }
        let m = Arc::new(chat::Model::new(choice.clone()).map_err(HandlerError)?);
        chosen.push(m.clone());
        Ok((m, temperature))
    }

    /// One call, counted.
    async fn call(
        &self,
        d: &Delivery,
        model: &chat::Model,
        messages: &[Value],
        ask: &chat::Ask<'_>,
    ) -> Result<chat::Answer, HandlerError> {
        // What the call may take, held against the thread's and the tenant's budgets before
        // it is made.
        let prompt = tokens_in(messages.iter().map(|m| m.to_string().len()).sum());
        let may_take = prompt + u64::from(ask.max_tokens);
        let held = self
            .meter
            .hold(&d.meta.thread_id, may_take)
            .map_err(HandlerError)?;
        let started = std::time::Instant::now();
        let answer = model.call(messages, ask).await;
        let took = started.elapsed();
        self.stats.time.record(took);
        let s = &self.stats;
        match &answer {
            Ok(a) => {
                s.ok.fetch_add(1, Ordering::Relaxed);
                let u = a.usage.unwrap_or_default();
                for (n, t) in [u.input, u.output, u.cached].into_iter().zip(&s.tokens) {
                    t.fetch_add(n, Ordering::Relaxed);
                }
                let used = self.account(d, model.config(), prompt, a, took);
                self.meter.settle(held, used);
            }
            Err(_) => {
                s.failed.fetch_add(1, Ordering::Relaxed);
                self.meter.settle(held, 0);
            }
        }
        answer.map_err(HandlerError)
    }

    /// Publishes what a call took (`usage`): as the server reported it, or estimated at
    /// about 4 bytes a token from what was sent and answered.
    fn account(
        &self,
        d: &Delivery,
        model: &crate::config::llm::ModelConfig,
        prompt: u64,
        a: &chat::Answer,
        took: std::time::Duration,
    ) -> u64 {
        let (input, output, cached, estimated) = match a.usage {
            Some(u) => (u.input, u.output, u.cached, false),
            None => {
                let answered = a.text.as_deref().map_or(0, str::len)
                    + a.tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>();
                (prompt, tokens_in(answered), 0, true)
            }
        };
        let call = meter::Call {
            model,
            input,
            output,
            cached,
            estimated,
            ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        };
        self.meter
            .account(&d.meta.thread_id, &d.meta.message_id, &call)
    }

    /// One tool call as an output, written and checked as its receiver's schema says.
    fn output(
        &self,
        call: &chat::ToolCall,
        tools: &[tools::Tool],
        sender: &str,
    ) -> Result<Output, String> {
        let tool = tools.iter().find(|t| t.name == call.name).ok_or_else(|| {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            format!(
                "no tool named `{}` (tools: {})",
                call.name,
                names.join(", ")
            )
        })?;
        let args: Value = serde_json::from_str(&call.arguments)
            .map_err(|e| format!("the arguments are not JSON: {e}"))?;
        let to = tool.to.as_deref().unwrap_or(sender);
        let (xml, schema) = self
            .targets
            .write(Some(to), Some(&tool.payload_type), &args)?;
        if xml.len() > self.max_output {
            return Err(format!(
                "the payload is {} bytes, over the limit of {} bytes",
                xml.len(),
                self.max_output
            ));
        }
        if let Some(schema) = schema {
            check(&schema, &xml, self.max_output)?;
        }
        Ok(Output::to(to, xml))
    }
}

/// The receiver's schema's verdict on `xml`, in the validator's words.
fn check(schema: &Schema, xml: &str, max_bytes: usize) -> Result<(), String> {
    let limits = XmlLimits {
        max_bytes,
        ..XmlLimits::default()
    };
    let payload = normalize_payload(xml, &limits).map_err(|e| e.to_string())?;
    schema
        .validate(payload)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The tokens `bytes` of text are estimated at (about 4 bytes a token), where a server
/// reports none, and for what a call may take before it is made.
fn tokens_in(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}
