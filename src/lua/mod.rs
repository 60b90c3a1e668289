//! `kind: lua` listeners (SPEC §11.1–§11.2): Luau sandboxes on their own OS threads, fed
//! through one queue per pool, with the XML ↔ table bridge and script reload.
//!
//! A [`LuaHandler`] owns a pool of `concurrency` sandboxes, each a Lua state on its own thread;
//! tenants never share a state. A call sends the payload's JSON view (typed by the listener's
//! schema model) to whichever sandbox is free, and awaits the result with a wall-clock
//! watchdog for what the VM interrupt cannot stop (a C-level string pattern, say): on expiry
//! the message fails and that sandbox is replaced. Outputs become XML through the target
//! schema's model (`schema::SchemaModel`, the same one the API uses), in schema order, and go
//! back to the pump as plain text: they are validated like any other output.
//!
//! Reload builds a whole new pool beside the old one (compile, `init`), then swaps it in; calls
//! already running finish on the old pool, which ends when its last call returns.
//!
//! ## Inside
//!
//! `kind: lua` listeners. `sandbox.rs`: one Luau state (allowed globals only, read-only
//! built-ins, text chunks, CPU budget by VM interrupt checked every 64 interrupts, memory cap,
//! `log`/`json`; the compiler's fast path for the removed builtins is off), the call, and the
//! `_attr`/`_text` table shape. The call converts the payload and meta into Lua with the memory
//! cap lifted (`Sandbox::unlimited`: host code on input bounded by `max_message_bytes`; under a
//! cap mlua wraps every string and table it makes in a protected call). What the conversion
//! added still counts: a state over its cap afterwards (after one full collection) fails the
//! call as `lua memory`. The return value, and what `json.encode` is given, are written
//! straight to JSON text (`encode_bounded`) that stops at the memory cap: one string referenced
//! many times is copied on the host side as often, so the host's copies count too. `mod.rs`:
//! `LuaHandler`, a pool of sandboxes each on its own OS thread fed by one queue (a mutex and
//! condvar: a call wakes at most one sleeping sandbox thread; dropping the pool closes the
//! queue, and its threads end once it is drained); the wall-clock watchdog; outputs resolved
//! against the organism's schemas and written through `SchemaModel`; script reload (new pool
//! beside the old, swapped on success).

mod pool;
mod sandbox;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use serde_json::{json, Value as Json};

use crate::config::{ListenerConfig, OrganismConfig};
use crate::events::{EventHub, EventKind};
use crate::listener::{Delivery, Handler, HandlerError, HandlerFuture, Output};
use crate::schema::Schema;
use crate::stats::Histogram;
use crate::xml::PayloadType;

use pool::{Job, Pool, Spec};
use sandbox::LogLine;
pub use sandbox::{check_syntax, json_shape, lua_shape, Cost, FailKind};

pub use crate::config::LuaLimits;
pub use crate::listener::OutputTargets;

/// Outputs one call may return.
const MAX_OUTPUTS: usize = 64;

/// Counters of one Lua listener.
#[derive(Default)]
pub struct LuaStats {
    pub calls: AtomicU64,
    errors: [AtomicU64; 6],
    pub call_time: Histogram,
    /// Memory of the most recently used state, bytes.
    pub memory: AtomicUsize,
    pub reloads: AtomicU64,
    /// The CPU time its sandbox threads spent, in microseconds.
    pub cpu_us: Arc<AtomicU64>,
}

impl LuaStats {
    pub fn errors(&self, kind: FailKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }
}

/// The handler of a `kind: lua` listener. Cheap to share: the state lives in `Inner`.
pub struct LuaHandler(Arc<Inner>);

struct Inner {
    name: String,
    script: PathBuf,
    config: Json,
    limits: LuaLimits,
    concurrency: usize,
    max_output: usize,
    pool: RwLock<Arc<Pool>>,
    targets: Arc<OutputTargets>,
    /// Its own accepted types: the schemas that type the payload's JSON view.
    accepts: Vec<(PayloadType, Arc<Schema>)>,
    events: Arc<EventHub>,
    stats: Arc<LuaStats>,
}

impl LuaHandler {
    /// Reads the script and starts `concurrency` sandboxes (each runs `init`).
    pub fn build(
        listener: &ListenerConfig,
        organism: &OrganismConfig,
        events: Arc<EventHub>,
    ) -> Result<LuaHandler, String> {
        LuaHandler::build_with(
            listener,
            organism.limits.max_message_bytes,
            OutputTargets::of(organism),
            events,
            None,
        )
    }

    /// [`LuaHandler::build`] with the organism's shared output targets (what a reload
    /// updates) and output size limit.
    /// `carried`: the counters of the handler this one succeeds (an organism reload that
    /// changed the listener), which count it as a reload.
    pub fn build_with(
        listener: &ListenerConfig,
        max_output: usize,
        targets: Arc<OutputTargets>,
        events: Arc<EventHub>,
        carried: Option<Arc<LuaStats>>,
    ) -> Result<LuaHandler, String> {
        let script = listener
            .script
            .clone()
            .ok_or("a lua listener needs a `script`")?;
        let limits = listener.lua_limits;
        let source = read_script(&script)?;
        let stats = carried.clone().unwrap_or_default();
        let spec = Spec {
            name: listener.name.to_string(),
            source,
            config: listener.config.clone(),
            limits,
            cpu_us: stats.cpu_us.clone(),
        };
        let pool = Pool::start(spec, listener.concurrency)?;
        if carried.is_some() {
            stats.reloads.fetch_add(1, Ordering::Relaxed);
        }
        Ok(LuaHandler(Arc::new(Inner {
            name: listener.name.to_string(),
            script,
            config: listener.config.clone(),
            limits,
            concurrency: listener.concurrency,
            max_output,
            accepts: listener.accepts.clone(),
            pool: RwLock::new(Arc::new(pool)),
            targets,
            events,
            stats,
        })))
    }

    pub fn stats(&self) -> &LuaStats {
        &self.0.stats
    }

    /// Re-reads the script and swaps in a new pool once every new sandbox compiled and ran
    /// `init`; on any error the old pool keeps running and the error is returned.
    pub fn reload_script(&self) -> Result<(), String> {
        self.0.reload_script()
    }
}

impl Inner {
    fn current(&self) -> Arc<Pool> {
        crate::sync::read(&self.pool).clone()
    }

    fn reload_script(&self) -> Result<(), String> {
        let source = read_script(&self.script)?;
        let spec = Spec {
            name: self.name.clone(),
            source,
            config: self.config.clone(),
            limits: self.limits,
            cpu_us: self.stats.cpu_us.clone(),
        };
        let pool = Pool::start(spec, self.concurrency)?;
        *crate::sync::write(&self.pool) = Arc::new(pool);
        self.stats.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn publish_logs(&self, thread: &str, logs: Vec<LogLine>) {
        for line in logs {
            match line.level {
                "error" => tracing::error!(listener = %self.name, thread, "{}", line.message),
                "warn" => tracing::warn!(listener = %self.name, thread, "{}", line.message),
                _ => tracing::info!(listener = %self.name, thread, "{}", line.message),
            }
            self.events.publish(EventKind::Log {
                agent: self.name.clone(),
                thread_id: Some(thread.to_string()),
                level: line.level.to_string(),
                message: line.message,
            });
        }
    }

    /// Turns `handle`'s return value into outputs.
    fn outputs(&self, value: Json, sender: &str) -> Result<Vec<Output>, String> {
        let items: Vec<Json> = match value {
            Json::Null => return Ok(Vec::new()),
            Json::Array(items) => items,
            Json::Object(map) if map.is_empty() => return Ok(Vec::new()),
            obj @ Json::Object(_) => vec![obj],
            other => return Err(format!("handle returned {other}; expected a table or nil")),
        };
        if items.len() > MAX_OUTPUTS {
            return Err(format!(
                "{} outputs; at most {MAX_OUTPUTS} per call",
                items.len()
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let n = i + 1;
            let Json::Object(mut map) = item else {
                return Err(format!("output #{n} is not a table"));
            };
            let to = match map.remove("to") {
                None | Some(Json::Null) => None,
                Some(Json::String(t)) => Some(t),
                Some(other) => {
                    return Err(format!("output #{n}: `to` must be a name, not {other}"))
                }
            };
            let ty = match map.remove("type") {
                None | Some(Json::Null) => None,
                Some(Json::String(t)) => Some(t),
                Some(other) => {
                    return Err(format!("output #{n}: `type` must be a name, not {other}"))
                }
            };
            let xml = match (map.remove("xml"), map.remove("payload")) {
                (Some(Json::String(x)), None) => x,
                (Some(_), None) => return Err(format!("output #{n}: `xml` must be a string")),
                (None, Some(payload)) => {
                    // Without `to` or `type`, the schema is looked up as for a reply.
                    let target = to.as_deref().or(ty.is_none().then_some(sender));
                    self.targets
                        .write(target, ty.as_deref(), &json_shape(payload))
                        .map_err(|e| format!("output #{n}: {e}"))?
                        .0
                }
                (Some(_), Some(_)) => {
                    return Err(format!("output #{n}: give `payload` or `xml`, not both"))
                }
                (None, None) => {
                    return Err(format!(
                        "output #{n}: needs `payload` (a table) or `xml` (a string)"
                    ))
                }
            };
            if let Some(extra) = map.keys().next() {
                return Err(format!(
                    "output #{n}: unknown key `{extra}` (expected to, type, payload, xml)"
                ));
            }
            if xml.len() > self.max_output {
                return Err(format!(
                    "output #{n} is {} bytes, over the limit of {} bytes",
                    xml.len(),
                    self.max_output
                ));
            }
            out.push(Output { payload: xml, to });
        }
        Ok(out)
    }
}

fn read_script(path: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Sets `cancel` when the pump drops the call (a kill).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl LuaHandler {
    /// One call, as [`Handler::handle`], with what it cost, CPU time included (none if no
    /// sandbox answered): for trying a handler, not for traffic.
    pub fn measured(
        &self,
        delivery: Delivery,
    ) -> impl std::future::Future<Output = (crate::listener::HandlerResult, Option<Cost>)> + Send + 'static
    {
        self.call(delivery, true)
    }

    fn call(
        &self,
        delivery: Delivery,
        clock: bool,
    ) -> impl std::future::Future<Output = (crate::listener::HandlerResult, Option<Cost>)> + Send + 'static
    {
        // The JSON view, typed by the schema that validated the payload.
        let schema = self
            .0
            .accepts
            .iter()
            .find(|(t, _)| t == delivery.payload.payload_type())
            .map(|(_, s)| &**s);
        let payload = crate::schema::payload_json(schema, delivery.payload.xml());
        let mut meta = json!({
            "thread_id": &*delivery.meta.thread_id,
            "message_id": &*delivery.meta.message_id,
            "from": &*delivery.meta.from,
            "own_name": delivery.meta.own_name.as_str(),
            "payload_type": delivery.meta.payload_type.local_name(),
        });
        if let Some(a) = &delivery.meta.approval {
            meta["approval"] = json!({"by": a.by, "at": a.at, "reason": a.reason});
        }
        let thread = delivery.meta.thread_id.to_string();
        let sender = delivery.meta.from.to_string();
        let h = self.0.clone();
        let pool = h.current();
        let cancel = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicBool::new(false));
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            payload,
            meta,
            cancel: cancel.clone(),
            abandoned: abandoned.clone(),
            clock,
            reply,
        };
        let sent = pool.push(job);
        async move {
            let _cancel_on_drop = CancelOnDrop(cancel);
            if !sent {
                let e = "lua: no sandbox is running for this listener";
                return (Err(HandlerError(e.into())), None);
            }
            let started = Instant::now();
            h.stats.calls.fetch_add(1, Ordering::Relaxed);
            let outcome = tokio::time::timeout(h.limits.watchdog(), answer).await;
            h.stats.call_time.record(started.elapsed());
            let fail = |kind: FailKind, message: String| {
                h.stats.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
                Err(HandlerError(format!("lua {}: {message}", kind.as_str())))
            };
            let result = match outcome {
                Err(_) => {
                    abandoned.store(true, Ordering::Relaxed);
                    if let Err(e) = pool.spawn_sandbox() {
                        tracing::error!(listener = %h.name, error = %e, "cannot replace a stuck Lua sandbox");
                    }
                    fail(
                        FailKind::Timeout,
                        format!(
                            "the call ran past the {} ms watchdog; its sandbox was replaced",
                            h.limits.watchdog().as_millis()
                        ),
                    )
                }
                Ok(Err(_)) => fail(
                    FailKind::Runtime,
                    "the sandbox ended during the call".into(),
                ),
                Ok(Ok(answer)) => {
                    h.stats.memory.store(answer.memory, Ordering::Relaxed);
                    h.publish_logs(&thread, answer.logs);
                    let result = match answer.result {
                        Err(e) => fail(e.kind, e.message),
                        Ok(value) => match h.outputs(value, &sender) {
                            Ok(outputs) => Ok(outputs),
                            Err(e) => fail(FailKind::Output, e),
                        },
                    };
                    return (result, Some(answer.cost));
                }
            };
            (result, None)
        }
    }
}

impl Handler for LuaHandler {
    fn handle(&self, delivery: Delivery) -> HandlerFuture {
        let call = self.call(delivery, false);
        Box::pin(async move { call.await.0 })
    }

    fn reload(&self) -> Option<Result<(), String>> {
        Some(self.0.reload_script())
    }

    fn script(&self) -> Option<String> {
        Some(self.0.current().source().to_string())
    }

    fn carried_stats(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self.0.stats.clone())
    }

    fn cpu_micros(&self) -> Option<u64> {
        Some(self.0.stats.cpu_us.load(Ordering::Relaxed))
    }

    fn metrics(&self) -> Vec<crate::listener::HandlerMetric> {
        use crate::listener::HandlerMetric as M;
        let s = &self.0.stats;
        let mut v = vec![
            M::counter(
                "agentserver_lua_calls_total",
                "Lua handle calls.",
                vec![],
                s.calls.load(Ordering::Relaxed) as f64,
            ),
            M::gauge(
                "agentserver_lua_memory_bytes",
                "Memory of the listener's most recently used Lua state.",
                vec![],
                s.memory.load(Ordering::Relaxed) as f64,
            ),
            M::counter(
                "agentserver_lua_reloads_total",
                "Successful script reloads.",
                vec![],
                s.reloads.load(Ordering::Relaxed) as f64,
            ),
            M::counter(
                "agentserver_lua_call_seconds_sum",
                "Total time of Lua calls.",
                vec![],
                s.call_time.sum_seconds(),
            ),
        ];
        for kind in FailKind::ALL {
            v.push(M::counter(
                "agentserver_lua_errors_total",
                "Failed Lua calls by kind (runtime, cpu, memory, output, timeout, cancelled).",
                vec![("kind".into(), kind.as_str().into())],
                s.errors(kind) as f64,
            ));
        }
        v
    }
}
