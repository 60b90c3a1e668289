//! The organism's background tasks (the file watch): spawned with the stop token, awaited
//! by `stop`. The store's own tasks are the store's (`store::Maintenance`).

use super::*;

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
