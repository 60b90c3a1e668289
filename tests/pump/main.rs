//! The pump against real organisms: routing, scheduling and control, hot reload.
//! One test binary: these share their set-up, and one link serves them all.

#[path = "../common/mod.rs"]
mod common;

mod reload;
mod routing;
mod scheduling;
