//! The store's own background tasks: retention (pruning per `organism.store_retention`) and
//! the health watch (an `error` event when writes start failing, and again when they
//! recover). The store starts them ([`Store::start_maintenance`]); whoever runs the store
//! holds the one [`Maintenance`] handle, tells it when the retention settings change, and
//! stops it.

use super::*;
use crate::config::Retention;
use crate::events::EventHub;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often retention runs (and at once after the settings change). A pass with nothing
/// to prune costs one small read.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(1);

/// How often the health watch looks at the writer.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The handle on a store's background tasks.
pub struct Maintenance {
    retention: watch::Sender<Retention>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Maintenance {
    /// New retention settings (a reload changed them): the next pass, at once, uses them.
    pub fn set_retention(&self, retention: Retention) {
        self.retention.send_replace(retention);
    }

    /// Ends both tasks and waits for them: a retention pass under way finishes first.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for Maintenance {
    /// A handle dropped without [`Maintenance::stop`] (an organism dropped without stopping)
    /// still ends the tasks, at their next wait, so they do not hold the store.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Store {
    /// Starts retention and the health watch on `runtime`. They hold the store until
    /// [`Maintenance::stop`] returns.
    pub fn start_maintenance(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        events: Arc<EventHub>,
        retention: Retention,
    ) -> Maintenance {
        let (sender, settings) = watch::channel(retention);
        let stop = CancellationToken::new();
        let tasks = vec![
            runtime.spawn(retain(self.clone(), settings, stop.clone())),
            runtime.spawn(watch_health(self.clone(), events, stop.clone())),
        ];
        Maintenance {
            retention: sender,
            stop,
            tasks,
        }
    }
}

/// Prunes every [`RETENTION_INTERVAL`], and at once when the settings change, off the
/// runtime's workers.
async fn retain(
    store: Arc<Store>,
    mut settings: watch::Receiver<Retention>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(RETENTION_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            changed = settings.changed() => if changed.is_err() { return },
        }
        let retention = *settings.borrow_and_update();
        if retention == Retention::default() {
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
}

/// Publishes an `error` event when writes start failing, and again when they recover.
async fn watch_health(store: Arc<Store>, events: Arc<EventHub>, stop: CancellationToken) {
    let mut failing = false;
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let failure = store.failure();
        if failure.is_some() != failing {
            failing = failure.is_some();
            events.publish(EventKind::Error {
                thread_id: None,
                agent: None,
                error: match failure {
                    Some(e) => format!(
                        "store {}: writes fail, injects are refused: {e}",
                        store.path().display()
                    ),
                    None => format!("store {}: writes succeed again", store.path().display()),
                },
            });
        }
    }
}
