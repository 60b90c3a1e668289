//! A spawned `agentserver` process that cannot outlive its test: if the test ends before the
//! process does (a failed assertion, a panic), dropping it kills the process and reaps it.
//! Not every test file uses every helper.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::ops::{Deref, DerefMut};
use std::process::{Command, Output, Stdio};

#[path = "../../src/testing.rs"]
pub mod testing;
#[allow(unused_imports)]
pub use testing::{wait_until, WAIT};

/// The `agentserver` binary built for these tests, ready for its arguments.
pub fn agentserver() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentserver"))
}

/// Runs `agentserver ARGS` to its end: its exit status, stdout and stderr.
pub fn run_to_exit<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    agentserver().args(args).output().expect("the binary runs")
}

/// Waits (at most [`WAIT`]) for `child` to exit; its exit code.
pub fn wait_exit(child: &mut std::process::Child) -> Option<i32> {
    let mut code = None;
    wait_until("the process to exit", || {
        match child.try_wait().expect("the process can be waited on") {
            Some(status) => {
                code = status.code();
                true
            }
            None => false,
        }
    });
    code
}

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

/// Spawns `cmd` (an `agentserver run …`, perhaps through a shell) and waits, up to 20 s, for
/// the URL it prints once it listens. Its stdout is read to the end meanwhile, so it stays
/// open.
pub fn serve(mut cmd: Command, stderr: Stdio) -> (Running, String) {
    let mut child = Running::spawn(cmd.stdout(Stdio::piped()).stderr(stderr));
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // Read on after the URL, with no one listening: the pipe stays open.
            let _ = tx.send(line);
        }
    });
    let url = loop {
        let line = lines.recv_timeout(WAIT).expect("a ready line in time");
        if let Some(u) = line.strip_prefix("agentserver listening on ") {
            break u.to_string();
        }
    };
    (child, url)
}
