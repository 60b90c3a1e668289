//! `agentserver run`: an organism, its API on `organism.listen`, its event mirror (with
//! `organism.nats`), file watching and SIGHUP reloads, until Ctrl-C, SIGTERM or a client's
//! stop; then a drain within `limits.stop_grace_ms`.

use std::path::PathBuf;
use std::time::Duration;

use super::ShutdownSignal;
use crate::api::{ApiOptions, ApiServer};
use crate::config::OrganismConfig;
use crate::pump::{Organism, Overrides};

/// What the command line changes of the file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `--listen`: serve here instead of `organism.listen`.
    pub listen: Option<String>,
    /// `--store`: a file (`Some(Some)`), or memory (`Some(None)`).
    pub store: Option<Option<PathBuf>>,
    /// `--insecure-no-auth`: serve beyond loopback without authentication.
    pub insecure_no_auth: bool,
}

/// Runs the organism `config` describes until it is stopped. `Err` when it could not start,
/// or when its store could not commit everything before stopping (never a silent loss).
pub async fn run(config: OrganismConfig, options: RunOptions) -> Result<(), String> {
    for w in crate::config::slow_pattern_warnings(&config) {
        eprintln!("agentserver: WARNING: {w}");
    }
    let overrides = Overrides {
        listen: options.listen,
        store: options.store,
    };
    let organism = Organism::builder()
        .overrides(overrides)
        .build(config)
        .map_err(|e| e.to_string())?;
    organism.watch_files(Duration::from_secs(1));
    let shutdown = ShutdownSignal::install();
    reload_on_sighup(&organism);
    match &organism.config().store {
        Some(path) => eprintln!("agentserver: store {}", path.display()),
        None => eprintln!("agentserver: store memory (nothing is kept after the process)"),
    }
    let listen = organism.config().listen.clone();
    let api_options = ApiOptions {
        insecure_no_auth: options.insecure_no_auth,
        ..ApiOptions::default()
    };
    let server = match ApiServer::bind(organism.clone(), &listen, api_options).await {
        Ok(s) => s,
        Err(e) => {
            organism.stop().await;
            return Err(format!("cannot serve the API on {listen}: {e}"));
        }
    };
    let mirror_stop = tokio_util::sync::CancellationToken::new();
    let mirror = tokio::spawn(crate::api::mirror_events(
        organism.clone(),
        mirror_stop.clone(),
    ));
    println!(
        "agentserver running organism {} ({} listeners); Ctrl-C stops it",
        organism.config().name,
        organism.config().listeners.len()
    );
    println!("agentserver listening on {}", server.url());
    tokio::select! {
        _ = shutdown.wait() => {}
        _ = server.stop_requested() => {}
    }
    eprintln!("agentserver: stopping: {}", stop_outlook(&organism));
    let report = organism.stop().await;
    if !report.drained {
        eprintln!(
            "agentserver: grace period over; killed {} thread(s)",
            report.killed_threads
        );
    }
    server.shutdown().await;
    mirror_stop.cancel();
    if let Ok(Err(e)) = mirror.await {
        eprintln!("agentserver: events were not mirrored: {e}");
    }
    match report.uncommitted {
        None => Ok(()),
        Some(u) => Err(format!(
            "the store {} could not commit {} change(s) before stopping: {}; they are not in the file",
            u.path.display(),
            u.changes,
            u.error
        )),
    }
}

/// What a stop will wait for, in one line.
fn stop_outlook(organism: &Organism) -> String {
    let pending = organism.metrics().pending();
    let held = organism.control().paused_backlog();
    let held_count: usize = held.iter().map(|(_, n)| n).sum();
    let grace = organism.config().limits.stop_grace_ms as f64 / 1000.0;
    let mut line = if pending > held_count {
        format!(
            "draining {} pending message(s), up to {grace}s (limits.stop_grace_ms)",
            pending - held_count
        )
    } else {
        "nothing to drain".to_string()
    };
    if !held.is_empty() {
        let who: Vec<String> = held.iter().map(|(l, n)| format!("{l} ({n})")).collect();
        line.push_str(&format!(
            "; {held_count} message(s) queued at paused listeners ({}) cannot move and do not hold the stop: their threads are killed",
            who.join(", ")
        ));
    }
    line
}

/// SIGHUP reloads the organism from its file (SPEC §12), as `POST /api/v1/organism/reload`.
fn reload_on_sighup(organism: &Organism) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            eprintln!("agentserver: cannot watch SIGHUP; reload with POST /api/v1/organism/reload");
            return;
        };
        let organism = organism.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let o = organism.clone();
                match tokio::task::spawn_blocking(move || o.reload(None)).await {
                    Ok(Ok(r)) => eprintln!(
                        "agentserver: reloaded (rev {}): added {:?}, removed {:?}, changed {:?}",
                        r.rev, r.added, r.removed, r.changed
                    ),
                    Ok(Err(e)) => eprintln!("agentserver: {e}"),
                    Err(e) => eprintln!("agentserver: reload failed: {e}"),
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = organism;
}
