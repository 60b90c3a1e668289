//! The work account: every [`WORK_EVERY`], and once more when the organism stops, each
//! listener's work since the last account (messages it handled, the time its handler took, a
//! Lua listener's CPU time) is added to the store's `usage_work` by day, so `/usage` shows
//! what every listener cost, not only models' tokens. Read from counters the pump keeps
//! anyway (they carry across reloads), so a hop pays nothing for it.

use std::collections::HashMap;
use std::time::Duration;

use crate::store::usage::WorkRow;

use super::{Organism, Shared};

/// How often the work is accounted.
pub const WORK_EVERY: Duration = Duration::from_secs(10);

/// A listener's counters as last accounted: messages, handler µs, CPU µs.
type Counters = (u64, u64, u64);

impl Organism {
    /// Starts the account (with a store only).
    pub(crate) fn account_work(&self) {
        if self.shared.store.is_none() {
            return;
        }
        let shared = self.shared.clone();
        self.spawn_background(|stopped| async move {
            let mut last: HashMap<String, Counters> = HashMap::new();
            let mut every = tokio::time::interval(WORK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = stopped.cancelled() => true,
                    _ = every.tick() => false,
                };
                account(&shared, &mut last);
                if stopping {
                    return;
                }
            }
        });
    }
}

/// Sends each listener's work since `last` to the store.
fn account(shared: &Shared, last: &mut HashMap<String, Counters>) {
    let Some(store) = &shared.store else { return };
    let mut rows = Vec::new();
    for l in shared.topo().order.iter() {
        let s = &l.stats;
        // Every call is counted in `handled`, a failed one too (`errors` counts those again).
        let now: Counters = (
            s.handled.load(std::sync::atomic::Ordering::Relaxed),
            s.handler_time.sum_us(),
            l.handler.cpu_micros().unwrap_or(0),
        );
        let before = last
            .insert(l.config.name.to_string(), now)
            .unwrap_or_default();
        // A counter below what was seen is a new one (the listener removed and added again).
        let since = |n: u64, b: u64| if n >= b { n - b } else { n };
        let row = WorkRow {
            tenant: l.config.tenant.clone(),
            listener: l.config.name.to_string(),
            messages: since(now.0, before.0),
            handler_us: since(now.1, before.1),
            cpu_us: since(now.2, before.2),
        };
        if row.messages > 0 || row.handler_us > 0 || row.cpu_us > 0 {
            rows.push(row);
        }
    }
    store.record_work(rows);
}
