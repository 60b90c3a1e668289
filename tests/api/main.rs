//! The API over real sockets: REST, WebSocket streams, connection limits, what a web page may
//! not do, the documents held still, and hostile input.
//! One test binary: these share their set-up, and one link serves them all.

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod conn;
mod hostile_input;
mod origins;
mod rest;
mod shapes;
mod ws;
