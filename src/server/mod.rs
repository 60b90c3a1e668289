//! The server's processes, each a function the binary's `main` calls with its parsed
//! arguments: [`run`] (an organism and its API), [`send`] (a trial run in-process),
//! [`worker`] (placed listeners' handlers, over NATS), [`gateway`] (read-only `/ws` from
//! the mirrored stream) and [`restore`] (a store file from it). Each installs the shutdown signals before it says it is ready, prints its
//! ready line to stdout and its notices to stderr, and answers an error as text for `main`
//! to print.

mod restore;
mod run;
mod send;

pub use restore::{restore, Restored, RESTORE_CONNECT_WAIT};
pub use run::{run, RunOptions};
pub use send::{send, SendError, SendRequest};

use crate::config::{NatsConfig, OrganismConfig};

/// `agentserver gateway`: serves `/ws` and `/ws/messages`, read-only, from the stream
/// `nats` names, until Ctrl-C or SIGTERM.
pub async fn gateway(
    nats: NatsConfig,
    listen: &str,
    retain: usize,
    auth_from: Option<OrganismConfig>,
    insecure: bool,
) -> Result<(), String> {
    let signal = ShutdownSignal::install();
    let gateway = crate::api::gateway::Gateway::bind(nats, listen, retain, auth_from, insecure)
        .await
        .map_err(|e| e.to_string())?;
    println!("agentserver listening on http://{}", gateway.local_addr());
    signal.wait().await;
    gateway.shutdown().await;
    Ok(())
}

/// `agentserver worker`: answers the deliveries of the listeners placed on it until Ctrl-C
/// or SIGTERM; how many it answered.
pub async fn worker(options: crate::pump::worker::WorkerOptions) -> Result<u64, String> {
    let stop = tokio_util::sync::CancellationToken::new();
    let signal = ShutdownSignal::install();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        signal.wait().await;
        on_signal.cancel();
    });
    let registry = crate::listener::HandlerRegistry::default();
    crate::pump::worker::run_worker(options, registry, stop)
        .await
        .map_err(|e| e.to_string())
}

/// Ctrl-C (SIGINT) or SIGTERM. Installed before the ready lines are printed, so a signal sent
/// as soon as a supervisor sees them is never missed.
pub struct ShutdownSignal {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl ShutdownSignal {
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let signals = signal(SignalKind::interrupt())
                .and_then(|int| Ok((int, signal(SignalKind::terminate())?)))
                .ok();
            ShutdownSignal { signals }
        }
        #[cfg(not(unix))]
        ShutdownSignal {}
    }

    pub async fn wait(self) {
        #[cfg(unix)]
        if let Some((mut int, mut term)) = self.signals {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
