//! What a listener runs: the [`Handler`] trait, the factory registry an embedding program adds
//! to, and the native built-ins (`sink`, `echo`, `forward`, `template`, `delay`).
//!
//! Handlers are untrusted: they receive a [`ValidatedPayload`] and return [`Output`]s as plain
//! XML text, which the pump reads and validates again like any input. A handler cannot name its
//! own identity or thread; the pump supplies both.

mod builtin;
mod external;
mod targets;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::config::{ListenerConfig, ListenerName};
use crate::schema::ValidatedPayload;
use crate::xml::PayloadType;

pub use builtin::{
    field_text, fill, Delay, Echo, Forward, Sink, Template, Unanswerable, MAX_DELAY_MS,
};
pub use external::{CallbackUrl, ExternalHandler};
pub use targets::OutputTargets;

/// What a handler knows about the message it handles.
#[derive(Debug, Clone)]
pub struct Meta {
    pub thread_id: Arc<str>,
    pub message_id: Arc<str>,
    /// The sender: a listener name, or an injector identity (`api`, `ws`, `cli`).
    pub from: Arc<str>,
    pub own_name: ListenerName,
    pub payload_type: PayloadType,
    /// For a message a person let through an approval gate: who, when, why.
    pub approval: Option<Arc<Approved>>,
    /// The thread's `settings` when it was handed over (a `kind: llm` listener applies
    /// what its `overridable` names).
    pub settings: Option<Arc<crate::config::llm::ThreadSettings>>,
}

/// A person's approval of a held message, as its handler sees it (Lua `meta.approval`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Approved {
    /// `key:NAME`, a token's subject, or `timeout` (`on_timeout: approve`).
    pub by: String,
    /// RFC 3339.
    pub at: crate::time::Timestamp,
    pub reason: Option<String>,
}

/// One message handed to a handler.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub payload: ValidatedPayload,
    pub meta: Meta,
}

/// One output of a handler: payload XML and an optional target (SPEC §6 routing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub payload: String,
    pub to: Option<String>,
}

impl Output {
    /// An output routed by payload type (broadcast to every allowed listener that accepts it).
    pub fn broadcast(payload: impl Into<String>) -> Self {
        Output {
            payload: payload.into(),
            to: None,
        }
    }

    /// An output for one named target (a listener, or the sender for a reply).
    pub fn to(target: impl Into<String>, payload: impl Into<String>) -> Self {
        Output {
            payload: payload.into(),
            to: Some(target.into()),
        }
    }
}

/// A handler's failure, recorded on the message (SPEC §8).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct HandlerError(pub String);

pub type HandlerResult = Result<Vec<Output>, HandlerError>;
pub type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;

/// The one interface every listener kind implements.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, delivery: Delivery) -> HandlerFuture;

    /// Reloads the handler's code (a Lua script) without a restart. `None`: this kind has
    /// nothing to reload. `Some(Err)`: the reload failed and the old code keeps running.
    fn reload(&self) -> Option<Result<(), String>> {
        None
    }

    /// The text of the code it runs now (a Lua script), kept as a version of a file
    /// listener's history. `None`: this kind has no such text.
    fn script(&self) -> Option<String> {
        None
    }

    /// True for handlers whose answer comes later, by callback (external agents): after a
    /// successful call the pump records a wait for the reply instead of finishing.
    fn awaits_reply(&self) -> bool {
        false
    }

    /// True while its deliveries cannot run (a listener placed on workers with none
    /// running): the agent shows `waiting` rather than `processing`.
    fn unavailable(&self) -> bool {
        false
    }

    /// Metrics of this handler kind, rendered by `/metrics` with an `agent` label added.
    fn metrics(&self) -> Vec<HandlerMetric> {
        Vec::new()
    }

    /// The counters a successor of this handler (the same listener rebuilt by an organism
    /// reload) carries on with; the successor's kind knows their type.
    fn carried_stats(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        None
    }

    /// The CPU time its calls spent so far (a Lua listener's sandbox threads), in
    /// microseconds, carried across reloads; `None`: this kind does not measure it.
    fn cpu_micros(&self) -> Option<u64> {
        None
    }
}

/// One sample a handler reports for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerMetric {
    pub name: &'static str,
    pub help: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl HandlerMetric {
    pub fn counter(
        name: &'static str,
        help: &'static str,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> Self {
        HandlerMetric {
            name,
            help,
            kind: "counter",
            labels,
            value,
        }
    }

    pub fn gauge(
        name: &'static str,
        help: &'static str,
        labels: Vec<(String, String)>,
        value: f64,
    ) -> Self {
        HandlerMetric {
            name,
            help,
            kind: "gauge",
            labels,
            value,
        }
    }
}

/// A handler made from an async closure.
pub struct FnHandler<F>(pub F);

impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn handle(&self, delivery: Delivery) -> HandlerFuture {
        Box::pin((self.0)(delivery))
    }
}

/// Builds a listener's handler from its validated config.
pub type HandlerFactory =
    Arc<dyn Fn(&ListenerConfig) -> Result<Arc<dyn Handler>, String> + Send + Sync>;

/// Native handlers by name: the built-ins plus whatever an embedding program registers.
#[derive(Clone)]
pub struct HandlerRegistry {
    factories: HashMap<String, HandlerFactory>,
}

impl Default for HandlerRegistry {
    fn default() -> Self {
        let mut r = HandlerRegistry {
            factories: HashMap::new(),
        };
        r.register("sink", |_| Ok(Arc::new(Sink) as Arc<dyn Handler>));
        r.register("echo", |_| Ok(Arc::new(Echo) as Arc<dyn Handler>));
        r.register("forward", |c| {
            Forward::from_config(&c.config).map(|f| Arc::new(f) as Arc<dyn Handler>)
        });
        r.register("delay", |c| {
            Delay::from_config(&c.config).map(|d| Arc::new(d) as Arc<dyn Handler>)
        });
        r.register("template", |c| {
            Template::from_config(&c.config).map(|t| Arc::new(t) as Arc<dyn Handler>)
        });
        r
    }
}

impl HandlerRegistry {
    /// Registers (or replaces) a factory under `name`.
    pub fn register<F>(&mut self, name: &str, factory: F)
    where
        F: Fn(&ListenerConfig) -> Result<Arc<dyn Handler>, String> + Send + Sync + 'static,
    {
        self.factories.insert(name.to_string(), Arc::new(factory));
    }

    pub fn names(&self) -> Vec<&str> {
        let mut n: Vec<&str> = self.factories.keys().map(String::as_str).collect();
        n.sort_unstable();
        n
    }

    pub fn build(&self, config: &ListenerConfig) -> Result<Arc<dyn Handler>, String> {
        let name = config.handler.as_deref().unwrap_or_default();
        match self.factories.get(name) {
            Some(f) => f(config),
            None => Err(format!("no native handler named `{name}`")),
        }
    }
}
