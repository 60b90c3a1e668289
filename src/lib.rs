pub mod config;
pub mod events;
pub mod listener;
pub mod pump;
pub mod schema;
pub mod threads;
pub mod time;
pub mod xml;

pub use pump::{InjectReceipt, InjectRequest, Organism, OrganismBuilder};
