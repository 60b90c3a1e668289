//! A spawned `agentserver` process that cannot outlive its test: if the test ends before the
//! process does (a failed assertion, a panic), dropping it kills the process and reaps it.

use std::ops::{Deref, DerefMut};
use std::process::Command;

pub struct Running(std::process::Child);

impl Running {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut Command) -> Running {
        Running(cmd.spawn().expect("the command starts"))
    }
}

impl Deref for Running {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl DerefMut for Running {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
