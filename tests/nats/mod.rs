//! A real `nats-server -js` for tests (Debian's package; `scripts/test` installs it): on a
//! loopback port, its store in a temp dir, stopped with the test, restartable on the same
//! port and store.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::child::Running;
use crate::common::wait_until;

/// A `nats-server -js` on a loopback port, with its store in a temp dir; restartable on the
/// same port and store.
pub struct Nats {
    pub port: u16,
    dir: tempfile::TempDir,
    process: Option<Running>,
}

fn nats_binary() -> PathBuf {
    [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .unwrap_or_else(|| PathBuf::from("nats-server"))
}

impl Nats {
    pub fn start() -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut nats = Nats {
            port,
            dir: tempfile::tempdir().unwrap(),
            process: None,
        };
        nats.up();
        nats
    }

    pub fn up(&mut self) {
        let process = Running::spawn(
            Command::new(nats_binary())
                .args([
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-sd",
                ])
                .arg(self.dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        self.process = Some(process);
        let port = self.port;
        wait_until("nats-server to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    pub fn down(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A stream prefix of this server's own.
    pub fn prefix(&self) -> String {
        format!("t{}", self.port)
    }
}

impl Drop for Nats {
    /// Stops the server before its store is removed (fields drop in order, the store's
    /// directory first: a server still running wrote its `jetstream` directory again, left
    /// in the system's temp dir).
    fn drop(&mut self) {
        self.down();
    }
}
