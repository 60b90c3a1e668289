//! `/metrics`: the organism's counters and gauges in the Prometheus text format (0.0.4).
//! Everything is read from live state at scrape time; nothing here is global, so several
//! organisms in one process each report their own.

use std::fmt::Write;

use super::{ApiState, Endpoint};
use crate::pump::{AgentInfo, FailureKind, Organism, OrganismInfo};
use crate::stats::Histogram;
use crate::threads::MessageStatus;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn status_name(s: MessageStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, agent: &str, h: &Histogram) {
    let agent = label(agent);
    for (bound_us, count) in h.cumulative() {
        let le = bound_us as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_bucket{{agent=\"{agent}\",le=\"{le}\"}} {count}"
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{agent=\"{agent}\",le=\"+Inf\"}} {}",
        h.count()
    );
    let _ = writeln!(out, "{name}_sum{{agent=\"{agent}\"}} {}", h.sum_seconds());
    let _ = writeln!(out, "{name}_count{{agent=\"{agent}\"}} {}", h.count());
}

/// Renders every metric.
pub fn render(state: &ApiState) -> String {
    let organism = &state.inner.organism;
    let info = organism.info();
    let agents = organism.agents();
    let mut out = String::with_capacity(4096);

    organism_metrics(&mut out, organism, &info);
    handler_metrics(&mut out, organism, &agents);
    flow_metrics(&mut out, organism, &agents, &info);
    store_metrics(&mut out, organism);
    reload_metrics(&mut out, organism);
    input_metrics(&mut out, organism);
    budget_metrics(&mut out, organism);
    api_metrics(&mut out, state);
    out
}

/// Each tenant's token windows: what remains of each (read from the usage account the
/// first time a window is asked for: `render` runs off the async workers).
fn budget_metrics(out: &mut String, organism: &Organism) {
    header(
        out,
        "agentserver_budget_remaining",
        "gauge",
        "Tokens a tenant's LLM listeners may still take in the window (tokens_per_day, tokens_per_month), holds deducted.",
    );
    for tenant in organism.config().llm_tenants() {
        for w in organism.history().budgets(tenant) {
            let _ = writeln!(
                out,
                "agentserver_budget_remaining{{tenant=\"{}\",window=\"{}\"}} {}",
                label(&w.tenant),
                w.key,
                w.remaining
            );
        }
    }
}

/// What runs: the organism, its uptime and revision, messages and failures.
fn organism_metrics(out: &mut String, organism: &Organism, info: &OrganismInfo) {
    header(
        out,
        "agentserver_info",
        "gauge",
        "The organism this server runs.",
    );
    let _ = writeln!(
        out,
        "agentserver_info{{organism=\"{}\",version=\"{}\"}} 1",
        label(&info.name),
        env!("CARGO_PKG_VERSION")
    );
    header(
        out,
        "agentserver_uptime_seconds",
        "gauge",
        "Seconds since the organism started.",
    );
    let _ = writeln!(out, "agentserver_uptime_seconds {}", info.uptime_seconds);
    header(
        out,
        "agentserver_config_rev",
        "gauge",
        "Revision of the running configuration.",
    );
    let _ = writeln!(out, "agentserver_config_rev {}", info.config_rev);

    header(
        out,
        "agentserver_messages_logged_total",
        "counter",
        "Messages written to the log.",
    );
    let _ = writeln!(
        out,
        "agentserver_messages_logged_total {}",
        info.total_messages
    );
    header(
        out,
        "agentserver_messages_total",
        "counter",
        "Messages that reached a final status, by receiving agent and status.",
    );
    for (agent, status, n) in organism.threads().final_counts() {
        let _ = writeln!(
            out,
            "agentserver_messages_total{{agent=\"{}\",status=\"{}\"}} {n}",
            label(&agent),
            status_name(status)
        );
    }
    header(
        out,
        "agentserver_failures_total",
        "counter",
        "Failures by kind (SPEC section 8).",
    );
    for kind in FailureKind::ALL {
        let _ = writeln!(
            out,
            "agentserver_failures_total{{kind=\"{}\"}} {}",
            kind.as_str(),
            organism.metrics().failure_count(kind)
        );
    }
}

/// Time and errors per handler, and what each kind of handler adds (Lua's counters).
fn handler_metrics(out: &mut String, organism: &Organism, agents: &[AgentInfo]) {
    header(
        out,
        "agentserver_handler_seconds",
        "histogram",
        "Time spent in a listener's handler per call.",
    );
    for a in agents {
        if let Some(h) = organism.metrics().handler_time(&a.name) {
            histogram(out, "agentserver_handler_seconds", &a.name, &h);
        }
    }
    header(
        out,
        "agentserver_handler_errors_total",
        "counter",
        "Handler calls that failed or panicked, by agent.",
    );
    for a in agents {
        let _ = writeln!(
            out,
            "agentserver_handler_errors_total{{agent=\"{}\"}} {}",
            label(&a.name),
            a.errors
        );
    }
    // Handler-kind metrics (Lua), grouped by name so each has one HELP/TYPE header.
    let mut by_name: Vec<(&'static str, &'static str, &'static str, Vec<String>)> = Vec::new();
    let handler_metrics = organism.metrics().handler_metrics();
    for (agent, metrics) in &handler_metrics {
        for m in metrics {
            let mut labels = vec![format!("agent=\"{}\"", label(agent))];
            labels.extend(
                m.labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", label(v))),
            );
            let line = format!("{}{{{}}} {}", m.name, labels.join(","), m.value);
            match by_name.iter_mut().find(|(n, ..)| *n == m.name) {
                Some(entry) => entry.3.push(line),
                None => by_name.push((m.name, m.help, m.kind, vec![line])),
            }
        }
    }
    for (name, help, kind, lines) in by_name {
        header(out, name, kind, help);
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Work in flight: queues, pending messages, active threads, events published.
fn flow_metrics(out: &mut String, organism: &Organism, agents: &[AgentInfo], info: &OrganismInfo) {
    header(
        out,
        "agentserver_queue_depth",
        "gauge",
        "Messages waiting in a listener's queue.",
    );
    for a in agents {
        let _ = writeln!(
            out,
            "agentserver_queue_depth{{agent=\"{}\"}} {}",
            label(&a.name),
            a.queue_depth
        );
    }
    header(
        out,
        "agentserver_pending_messages",
        "gauge",
        "Messages queued or being handled, organism-wide.",
    );
    let _ = writeln!(
        out,
        "agentserver_pending_messages {}",
        info.pending_messages
    );
    header(
        out,
        "agentserver_pending_bytes",
        "gauge",
        "Bytes of the payloads of the messages queued or being handled, organism-wide.",
    );
    let _ = writeln!(
        out,
        "agentserver_pending_bytes {}",
        organism.metrics().pending_bytes()
    );
    header(
        out,
        "agentserver_active_threads",
        "gauge",
        "Threads that are active.",
    );
    let _ = writeln!(out, "agentserver_active_threads {}", info.active_threads);
    header(
        out,
        "agentserver_events_total",
        "counter",
        "Events published (the last seq).",
    );
    let _ = writeln!(out, "agentserver_events_total {}", info.last_seq);
}

/// The store's writer and retention, when there is a store.
fn store_metrics(out: &mut String, organism: &Organism) {
    if let Some(store) = organism.history().store() {
        header(
            out,
            "agentserver_store_queue",
            "gauge",
            "Writes waiting for the store's writer.",
        );
        let _ = writeln!(out, "agentserver_store_queue {}", store.queued());
        header(
            out,
            "agentserver_store_batches_total",
            "counter",
            "Store transactions committed.",
        );
        let _ = writeln!(
            out,
            "agentserver_store_batches_total {}",
            store.committed_batches()
        );
        header(
            out,
            "agentserver_store_failed",
            "gauge",
            "1 while the store cannot write.",
        );
        let _ = writeln!(
            out,
            "agentserver_store_failed {}",
            u8::from(store.failure().is_some())
        );
        header(
            out,
            "agentserver_store_pruned_messages_total",
            "counter",
            "Messages removed by retention.",
        );
        let _ = writeln!(
            out,
            "agentserver_store_pruned_messages_total {}",
            organism.history().pruned_messages()
        );
    }
}

/// Reloads and whether the file differs from what runs.
fn reload_metrics(out: &mut String, organism: &Organism) {
    header(
        out,
        "agentserver_config_stale",
        "gauge",
        "1 when the last reload was refused: the organism file differs from what runs.",
    );
    let _ = writeln!(
        out,
        "agentserver_config_stale {}",
        u8::from(organism.metrics().config_stale())
    );
    header(
        out,
        "agentserver_reloads_total",
        "counter",
        "Organism reloads, by result.",
    );
    let (ok, failed) = organism.metrics().reload_counts();
    let _ = writeln!(out, "agentserver_reloads_total{{result=\"ok\"}} {ok}");
    let _ = writeln!(
        out,
        "agentserver_reloads_total{{result=\"failed\"}} {failed}"
    );
    if let Some((up, _)) = organism.metrics().nats_link() {
        header(
            out,
            "agentserver_nats_connected",
            "gauge",
            "1 while the link to NATS (organism.nats: placed listeners, the event mirror) is up, else 0.",
        );
        let _ = writeln!(out, "agentserver_nats_connected {}", u8::from(up));
    }
}

/// The API's own: refused requests, WebSocket clients and what they missed.
fn api_metrics(out: &mut String, state: &ApiState) {
    header(
        out,
        "agentserver_http_refused_total",
        "counter",
        "API requests refused, by HTTP status.",
    );
    for (status, n) in state.refused() {
        let _ = writeln!(
            out,
            "agentserver_http_refused_total{{status=\"{status}\"}} {n}"
        );
    }
    header(
        out,
        "agentserver_ws_clients",
        "gauge",
        "Connected WebSocket clients, by endpoint.",
    );
    for ep in Endpoint::ALL {
        let _ = writeln!(
            out,
            "agentserver_ws_clients{{endpoint=\"{}\"}} {}",
            ep.path(),
            state.clients(ep)
        );
    }
    header(
        out,
        "agentserver_ws_dropped_events_total",
        "counter",
        "Events not sent to a slow WebSocket client, by endpoint.",
    );
    for ep in Endpoint::ALL {
        let _ = writeln!(
            out,
            "agentserver_ws_dropped_events_total{{endpoint=\"{}\"}} {}",
            ep.path(),
            state.dropped(ep)
        );
    }
}

/// The inbox: inputs open now, decisions taken and how long their inputs waited.
fn input_metrics(out: &mut String, organism: &Organism) {
    header(
        out,
        "agentserver_inputs_open",
        "gauge",
        "Inputs waiting for a person: held messages (approval) and questions, by listener.",
    );
    for (listener, kind, n) in organism.inputs().open_by_listener() {
        let kind = kind.as_str();
        let _ = writeln!(
            out,
            "agentserver_inputs_open{{listener=\"{}\",kind=\"{kind}\"}} {n}",
            label(&listener)
        );
    }
    let decisions = organism.inputs().decisions();
    header(
        out,
        "agentserver_input_decisions_total",
        "counter",
        "Inputs closed since start, by listener and decision (approve, edit, reject, answer, expired, cancelled).",
    );
    for (listener, decision, n, _) in &decisions {
        let _ = writeln!(
            out,
            "agentserver_input_decisions_total{{listener=\"{}\",decision=\"{}\"}} {n}",
            label(listener),
            label(decision)
        );
    }
    header(
        out,
        "agentserver_input_notify_failures_total",
        "counter",
        "Notification attempts of approval gates (approval.notify) that failed.",
    );
    let _ = writeln!(
        out,
        "agentserver_input_notify_failures_total {}",
        organism.inputs().notify_failures()
    );
    header(
        out,
        "agentserver_input_wait_seconds",
        "summary",
        "How long closed inputs waited for their decision, by listener.",
    );
    let mut waits: std::collections::BTreeMap<&str, (u64, f64)> = Default::default();
    for (listener, _, n, secs) in &decisions {
        let w = waits.entry(listener).or_default();
        w.0 += n;
        w.1 += secs;
    }
    for (listener, (n, secs)) in waits {
        let l = label(listener);
        let _ = writeln!(
            out,
            "agentserver_input_wait_seconds_sum{{listener=\"{l}\"}} {secs}"
        );
        let _ = writeln!(
            out,
            "agentserver_input_wait_seconds_count{{listener=\"{l}\"}} {n}"
        );
    }
}
