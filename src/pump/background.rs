//! The organism's background tasks (the file watch, the placed listeners' state): spawned
//! with the stop token, awaited by `stop`. The store's own tasks are the store's
//! (`store::Maintenance`).

use crate::config;

use super::Organism;

impl Organism {
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
}

impl Organism {
    /// Every [`crate::nats::ALIVE_EVERY`], looks again at the state of each listener placed
    /// on workers, so that it turns `waiting` when its last worker goes away and back to
    /// `processing` when one comes (a change no delivery makes), with its `agent_state`
    /// event.
    pub(crate) fn watch_placed(&self) {
        let shared = self.shared.clone();
        self.spawn_background(|stopped| async move {
            let mut every = tokio::time::interval(crate::nats::ALIVE_EVERY);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = every.tick() => {}
                }
                let topo = shared.topo();
                for l in topo.order.iter() {
                    if l.config.placement == config::Placement::Workers {
                        shared.refresh_state(l);
                    }
                }
            }
        });
    }
}

impl Organism {
    /// Every [`super::inputs::EXPIRY_TICK`], applies the approval gates' `on_timeout` to the
    /// inputs whose time passed on the organism's clock.
    pub(crate) fn expire_inputs(&self) {
        let shared = self.shared.clone();
        self.spawn_background(|stopped| async move {
            let mut every = tokio::time::interval(super::inputs::EXPIRY_TICK);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = every.tick() => {}
                }
                shared.expire_due();
            }
        });
    }
}
