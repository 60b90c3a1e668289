//! The command line as a user types it: real processes, real files and sockets.
//! One test binary: these share their set-up, and one link serves them all.

#[path = "../child/mod.rs"]
mod child;

mod hostile;
mod local;
mod remote;
mod threads;
