//! The organism's background tasks: retention and the store's health watch.

use super::*;

impl Organism {
    /// Prunes the store every [`RETENTION_INTERVAL`] per `organism.store_retention` as the
    /// topology holds it now (a reload can add, change or remove it; it wakes this task),
    /// off the pump's threads. Ends when the organism stops.
    pub(super) fn start_retention(&self) {
        let Some(store) = self.shared.store.clone() else {
            return;
        };
        let organism = self.clone();
        self.spawn_background(|stopped| async move {
            let mut tick = tokio::time::interval(RETENTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                    _ = organism.shared.reloading.retention_changed.notified() => {}
                }
                let retention = organism.shared.topo().config.retention;
                if retention == config::Retention::default() {
                    continue;
                }
                let store = store.clone();
                let pruned = tokio::task::spawn_blocking(move || {
                    store.prune(retention.max_messages, retention.max_age)
                })
                .await;
                match pruned {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "store retention failed"),
                    Err(e) => tracing::error!(error = %e, "store retention task failed"),
                }
            }
        });
    }

    /// Runs a background task on the organism's runtime. It is given a token cancelled
    /// when the organism stops, and must then end at its next wait (work under way, a
    /// retention pass or a reload, finishes first); [`Organism::stop`] waits for it.
    pub(crate) fn spawn_background<F>(
        &self,
        task: impl FnOnce(tokio_util::sync::CancellationToken) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let handle = self
            .shared
            .life
            .runtime
            .spawn(task(self.shared.life.stopped.clone()));
        let mut background = crate::sync::lock(&self.shared.life.background);
        background.retain(|h| !h.is_finished());
        background.push(handle);
    }

    /// Publishes an `error` event when store writes start failing, and again when they
    /// recover, checking once a second. Ends when the organism stops.
    pub(super) fn watch_store_health(&self) {
        let Some(store) = self.shared.store.clone() else {
            return;
        };
        let organism = self.clone();
        self.spawn_background(|stopped| async move {
            let mut failing = false;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let failure = store.failure();
                if failure.is_some() != failing {
                    failing = failure.is_some();
                    organism.shared.events.publish(EventKind::Error {
                        thread_id: None,
                        agent: None,
                        error: match failure {
                            Some(e) => format!(
                                "store {}: writes fail, injects are refused: {e}",
                                store.path().display()
                            ),
                            None => {
                                format!("store {}: writes succeed again", store.path().display())
                            }
                        },
                    });
                }
            }
        });
    }
}
