//! Lua listeners: the bridge end to end, and the hostile-script suite.
//! One test binary: these share their set-up, and one link serves them all.

#[path = "../common/mod.rs"]
mod common;

mod listeners;
mod retry;
mod sandbox;
