//! What the organism counts, for `/metrics`, `/readyz` and the CLI: pending work, failures
//! by kind, handler times and metrics, workers' results, reloads, the NATS link.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{FailureKind, Organism};

impl Organism {
    /// What the organism counts: pending work, failures, handler times, reloads, workers.
    pub fn metrics(&self) -> Metrics<'_> {
        Metrics { organism: self }
    }
}

/// The organism's counters ([`Organism::metrics`]).
#[derive(Clone, Copy)]
pub struct Metrics<'a> {
    organism: &'a Organism,
}

impl Metrics<'_> {
    /// Messages queued or being handled, organism-wide.
    pub fn pending(self) -> usize {
        self.organism.shared.load.pending.load(Ordering::SeqCst)
    }

    /// Bytes of the payloads of those messages (`limits.max_pending_bytes`).
    pub fn pending_bytes(self) -> usize {
        self.organism
            .shared
            .load
            .pending_bytes
            .load(Ordering::Relaxed)
    }

    /// How many failures of `kind` happened.
    pub fn failure_count(self, kind: FailureKind) -> u64 {
        self.organism.shared.load.failures[kind as usize].load(Ordering::Relaxed)
    }

    /// Every listener with its live state, in config order.
    /// The listeners placed on workers that no worker has announced itself for lately
    /// (empty without `organism.nats`).
    pub fn unserved_listeners(self) -> Vec<String> {
        let Some(placed) = &self.organism.shared.placed else {
            return Vec::new();
        };
        let topo = self.organism.shared.topo();
        placed.unserved(
            topo.order
                .iter()
                .filter(|l| l.config.placement == crate::config::Placement::Workers)
                .map(|l| l.name()),
        )
    }

    /// With listeners placed on workers: whether the link to NATS is up now, and its URL.
    pub fn nats_link(self) -> Option<(bool, String)> {
        let placed = self.organism.shared.placed.as_ref()?;
        let (up, url) = placed.link_state();
        Some((up, url.to_string()))
    }

    /// Workers' results refused (malformed, or a nonce that does not match: not from the
    /// worker the delivery went to) and results for no open delivery (duplicates, late).
    pub fn worker_results(self) -> (u64, u64) {
        self.organism
            .shared
            .placed
            .as_ref()
            .map_or((0, 0), |p| p.result_counts())
    }

    /// Each listener's handler-specific metrics (Lua calls, errors by kind, memory, …).
    pub fn handler_metrics(self) -> Vec<(String, Vec<crate::listener::HandlerMetric>)> {
        self.organism
            .shared
            .topo()
            .order
            .iter()
            .map(|l| (l.name().to_string(), l.handler.metrics()))
            .filter(|(_, m)| !m.is_empty())
            .collect()
    }

    /// The handler-time histogram of a listener.
    pub fn handler_time(self, name: &str) -> Option<Arc<crate::stats::Histogram>> {
        self.organism
            .shared
            .topo()
            .listeners
            .get(name)
            .map(|l| l.stats.handler_time.clone())
    }

    /// True when the last reload failed: the file describes something other than what runs.
    pub fn config_stale(self) -> bool {
        self.organism
            .shared
            .reloading
            .config_stale
            .load(Ordering::SeqCst)
    }

    /// Reloads that succeeded and failed since start.
    pub fn reload_counts(self) -> (u64, u64) {
        (
            self.organism
                .shared
                .reloading
                .reloads_ok
                .load(Ordering::Relaxed),
            self.organism
                .shared
                .reloading
                .reloads_failed
                .load(Ordering::Relaxed),
        )
    }
}
