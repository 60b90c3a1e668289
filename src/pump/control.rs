//! Control: pause, resume, reload one listener, kill a thread, and stop.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::events::{EventKind, OrganismStatus};
use crate::threads::MessageStatus;

use super::dispatch::Listener;
use super::{
    ControlError, FailureKind, IfBusy, InjectError, Organism, StopReport, Uncommitted,
    STATUS_RUNNING, STATUS_STOPPED, STATUS_STOPPING,
};
use crate::threads::ThreadStatus;

impl Organism {
    /// Control of what runs: pause, resume, reload a listener, kill a thread.
    pub fn control(&self) -> Control<'_> {
        Control { organism: self }
    }

    pub(super) fn listener(&self, name: &str) -> Result<Arc<Listener>, ControlError> {
        self.shared
            .topo()
            .listeners
            .get(name)
            .cloned()
            .ok_or_else(|| ControlError::UnknownListener(name.to_string()))
    }

    pub(super) fn after_organism_state_change(&self) {
        self.shared.events.publish(EventKind::OrganismState {
            status: self.status(),
        });
        for l in &self.shared.topo().order {
            self.shared.kick(l);
        }
    }

    /// Graceful stop: refuse new injects, let pending work finish within the grace period
    /// (`limits.stop_grace_ms`), then kill what remains, end the background tasks and
    /// flush the store. Once it has returned and every handle is dropped, the store's file
    /// is free for another organism. Idempotent.
    pub async fn stop(&self) -> StopReport {
        let s = &self.shared;
        if s.life
            .status
            .compare_exchange(
                STATUS_RUNNING,
                STATUS_STOPPING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            self.wait_idle(Duration::from_millis(s.limits.stop_grace_ms))
                .await;
            return StopReport {
                drained: self.metrics().pending() == 0,
                killed_threads: 0,
                uncommitted: None,
            };
        }
        s.events.publish(EventKind::OrganismState {
            status: OrganismStatus::Stopping,
        });
        let grace = Duration::from_millis(s.limits.stop_grace_ms);
        let held = self.control().paused_backlog();
        tracing::info!(pending = self.metrics().pending(), paused_backlog = ?held, grace_ms = s.limits.stop_grace_ms, "stopping: draining what can move");
        let drained = self.wait_drained(grace).await;
        let mut killed_threads = 0;
        if !drained {
            for id in s.threads.active_ids() {
                if self.control().kill_thread(&id).is_ok() {
                    killed_threads += 1;
                }
            }
            // Cancelled handlers return promptly; give them a moment to record it.
            self.wait_idle(Duration::from_secs(1)).await;
        }
        s.life.status.store(STATUS_STOPPED, Ordering::SeqCst);
        s.events.publish(EventKind::OrganismState {
            status: OrganismStatus::Stopped,
        });
        s.life.stopped.cancel();
        let background = std::mem::take(&mut *crate::sync::lock(&s.life.background));
        for task in background {
            let _ = task.await;
        }
        let maintenance = crate::sync::lock(&s.life.maintenance).take();
        if let Some(maintenance) = maintenance {
            maintenance.stop().await;
        }
        let mut uncommitted = None;
        if let Some(store) = s.store.clone() {
            let last = s.events.last_seq();
            let flushed = store.clone();
            let _ = tokio::task::spawn_blocking(move || flushed.flush(last)).await;
            uncommitted = store.failure().map(|error| Uncommitted {
                path: store.path().to_path_buf(),
                changes: store.queued(),
                error,
            });
        }
        StopReport {
            drained,
            killed_threads,
            uncommitted,
        }
    }

    /// Waits until nothing is pending but what paused queues hold, up to `limit`: messages
    /// that cannot start do not hold a stop for its grace period. Returns whether nothing at
    /// all is pending then.
    pub(super) async fn wait_drained(&self, limit: Duration) -> bool {
        let held = || {
            self.control()
                .paused_backlog()
                .iter()
                .map(|(_, n)| n)
                .sum::<usize>()
        };
        // Idle is announced at zero only: a paused backlog is looked at again often.
        self.wait_for(
            limit,
            || self.metrics().pending() <= held(),
            Some(Duration::from_millis(50)),
        )
        .await;
        self.metrics().pending() == 0
    }

    /// Waits until nothing is pending, up to `limit`. Returns whether it got there.
    pub(super) async fn wait_idle(&self, limit: Duration) -> bool {
        self.wait_for(limit, || self.metrics().pending() == 0, None)
            .await
    }

    /// Waits until `done` holds, up to `limit`, looking again whenever the organism goes
    /// idle (and every `every`, if given). Returns whether `done` held.
    pub(super) async fn wait_for(
        &self,
        limit: Duration,
        done: impl Fn() -> bool,
        every: Option<Duration>,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.shared.load.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done() {
                return true;
            }
            let look_again = every.map_or(deadline, |e| {
                (tokio::time::Instant::now() + e).min(deadline)
            });
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(look_again) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return done();
            }
        }
    }
}

/// Control of what runs ([`Organism::control`]): pausing and resuming the organism or one
/// listener, reloading a listener's script, killing a thread.
#[derive(Clone, Copy)]
pub struct Control<'a> {
    pub(super) organism: &'a Organism,
}

impl Control<'_> {
    /// Pauses one listener: its messages wait in its queue.
    pub fn pause_listener(self, name: &str) -> Result<(), ControlError> {
        let l = self.organism.listener(name)?;
        l.set_paused(true);
        self.organism.shared.kick(&l);
        Ok(())
    }

    /// Resumes one listener: its queue is delivered in order.
    pub fn resume_listener(self, name: &str) -> Result<(), ControlError> {
        let l = self.organism.listener(name)?;
        l.set_paused(false);
        self.organism.shared.kick(&l);
        Ok(())
    }

    /// Reloads one listener's code (a Lua script: new sandboxes are built and `init` run
    /// beside the old ones, then swapped in; calls in flight finish on the old ones). On any
    /// error the old code keeps running. Either way a `reload` event says what happened.
    pub fn reload_listener(self, name: &str) -> Result<(), ControlError> {
        let l = self.organism.listener(name)?;
        let result = match l.handler.reload() {
            None => return Err(ControlError::NotReloadable(name.to_string())),
            // A script's own error text is cut like every error kept or answered.
            Some(r) => r.map_err(|e| self.organism.shared.clip_error(e)),
        };
        if result.is_ok() {
            self.organism.shared.note_file_scripts(|n| n == name);
        }
        self.organism.shared.events.publish(EventKind::Reload {
            agent: Some(name.to_string()),
            ok: result.is_ok(),
            error: result.as_ref().err().cloned(),
            problems: Vec::new(),
            diff: None,
        });
        result.map_err(|message| ControlError::ReloadFailed {
            listener: name.to_string(),
            message,
        })
    }

    /// Pauses every listener.
    pub fn pause(self) {
        self.organism
            .shared
            .life
            .paused
            .store(true, Ordering::SeqCst);
        self.organism.after_organism_state_change();
    }

    /// Resumes the organism (listeners paused one by one stay paused).
    pub fn resume(self) {
        self.organism
            .shared
            .life
            .paused
            .store(false, Ordering::SeqCst);
        self.organism.after_organism_state_change();
    }

    /// Kills a thread: queued messages dropped (logged `killed`), running handlers cancelled,
    /// further injects refused. Killing a killed thread is a no-op.
    pub fn kill_thread(self, id: &str) -> Result<(), ControlError> {
        self.adopt_stored(id);
        let change = self
            .organism
            .shared
            .threads
            .kill(id)
            .map_err(|_| ControlError::UnknownThread(id.to_string()))?;
        if let Some(change) = change {
            self.wind_down(id, change, "thread killed", true);
        }
        Ok(())
    }

    /// Pauses a thread: its queued messages wait, other threads of the same listeners go
    /// on, and what is running finishes (its outputs wait too). Kept in memory only.
    pub fn pause_thread(self, id: &str) -> Result<(), ControlError> {
        self.set_thread_paused(id, true)
    }

    /// Resumes a thread: what waited is delivered, in order.
    pub fn resume_thread(self, id: &str) -> Result<(), ControlError> {
        self.set_thread_paused(id, false)
    }

    fn set_thread_paused(self, id: &str, paused: bool) -> Result<(), ControlError> {
        self.adopt_stored(id);
        let s = &self.organism.shared;
        let change = s
            .threads
            .set_paused(id, paused)
            .map_err(|_| ControlError::UnknownThread(id.to_string()))?;
        let Some(change) = change else {
            return Ok(());
        };
        s.publish_thread(change);
        if !paused {
            let thread: std::sync::Arc<str> = std::sync::Arc::from(id);
            for l in s.topo().listeners.values() {
                l.resume_thread(&thread);
                s.kick(l);
            }
        }
        Ok(())
    }

    /// A thread known only to the store (from before a restart, or evicted here) is
    /// loaded, so that it can be stopped.
    fn adopt_stored(self, id: &str) {
        self.organism.shared.adopt_stored(id);
    }

    /// What a kill and an abort do once the registry stopped the thread: its change told,
    /// its external waits ended, its inputs withdrawn, its queued messages `killed` with
    /// `why` (each a failure for a kill, not for an abort).
    fn wind_down(self, id: &str, change: crate::threads::StatusChange, why: &str, failures: bool) {
        let s = &self.organism.shared;
        s.publish_thread(change);
        s.drop_waits(id);
        s.cancel_inputs(id, why);
        for l in &s.topo().order {
            for job in l.drop_thread(id) {
                s.finish_message(&job.record, MessageStatus::Killed, Some(why.to_string()));
                if failures {
                    s.count_failure(FailureKind::Killed);
                }
                s.release(&job.record);
            }
            s.kick(l);
        }
    }

    /// Aborts a thread: running handlers cancelled, external waits ended, queued and held
    /// messages `killed` with `why`, open inputs cancelled. The thread is `aborted`, which is
    /// not final: the next inject to it revives it. Aborting an aborted thread changes
    /// nothing; a killed one cannot be aborted.
    pub fn abort_thread(self, id: &str, why: &str) -> Result<(), ControlError> {
        self.adopt_stored(id);
        let change = match self.organism.shared.threads.abort(id) {
            Ok(c) => c,
            Err(crate::threads::ThreadError::Killed(t)) => {
                return Err(ControlError::ThreadKilled(t))
            }
            Err(_) => return Err(ControlError::UnknownThread(id.to_string())),
        };
        if let Some(change) = change {
            self.wind_down(id, change, why, false);
        }
        Ok(())
    }

    /// Makes room in a busy thread (one with work queued or running) for an inject, as
    /// `mode` says: nothing (`Enqueue`), refuse (`Reject`: [`InjectError::ThreadBusy`]),
    /// supersede its queued messages (`Interrupt`: running handlers finish), or abort it
    /// (`Rollback`). A thread that is not busy is left as it is.
    pub fn steer(self, id: &str, mode: IfBusy, who: &str) -> Result<(), InjectError> {
        let s = &self.organism.shared;
        if mode == IfBusy::Enqueue || s.threads.status(id) != Some(ThreadStatus::Active) {
            return Ok(());
        }
        match mode {
            IfBusy::Enqueue => {}
            IfBusy::Reject => return Err(InjectError::ThreadBusy(id.to_string())),
            IfBusy::Interrupt => {
                let why = format!("superseded: {who} interrupted the thread with a new message");
                for l in &s.topo().order {
                    for job in l.drop_thread(id) {
                        s.finish_message(&job.record, MessageStatus::Superseded, Some(why.clone()));
                        s.release(&job.record);
                    }
                    s.kick(l);
                }
            }
            IfBusy::Rollback => {
                let why = format!("aborted by {who}: rolled back by a new message");
                // Only a killed thread cannot be aborted, and the inject says so next.
                let _ = self.abort_thread(id, &why);
            }
        }
        Ok(())
    }

    /// The listeners whose queues cannot drain because they (or the organism) are paused,
    /// with how many messages each holds.
    pub fn paused_backlog(self) -> Vec<(String, usize)> {
        let organism_paused = self.organism.shared.is_paused();
        self.organism
            .shared
            .topo()
            .order
            .iter()
            .map(|l| (l.name().to_string(), l.held_by_pause(organism_paused)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}
