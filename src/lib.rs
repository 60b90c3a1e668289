pub mod config;
pub mod events;
pub mod schema;
pub mod threads;
pub mod time;
pub mod xml;
