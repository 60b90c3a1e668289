//! agentserver runs an *organism*: named listeners, declared in one YAML file, that exchange
//! XML messages through a stream pump. Every payload, from outside or from a handler, passes
//! the same gate before any handler sees it.
//!
//! ```text
//!  inject (api/cli/ws) ─┐                          ┌──────────── handler outputs (untrusted text)
//!                       ▼                          │
//!   xml::guard ── xml::normalize ── pump::route ── schema::validate ── ValidatedPayload
//!   (size, DOCTYPE,  (strict read,   (`to`, type,   (libxml2, the        │
//!    depth)          payload type)    peers)         receiver's XSD)     ▼
//!                                                        per-(listener, thread) FIFO queue
//!                                                        round robin across threads
//!                                                        organism-wide handler gate
//!                                                                        │
//!   threads::ThreadRegistry (log, status) ◄── every step ──► events::EventHub (seq, observers)
//! ```
//!
//! Embedding: register native handlers by name, build from YAML, inject, watch.
//!
//! ```
//! use agentserver::listener::{Delivery, FnHandler, Output};
//! use agentserver::{InjectRequest, Organism};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
//! let yaml = r#"
//! organism: { name: doc, store: memory }
//! listeners:
//!   - { name: shout, description: Upper-cases a note, kind: native, handler: shout, schema: note.xsd }
//! "#;
//! let known = agentserver::config::Known {
//!     handlers: &["shout"],
//!     check_script: agentserver::lua::check_syntax,
//! };
//! let config = agentserver::config::load_str(yaml, "doc.yaml", &dir, known)?;
//! let organism = Organism::builder()
//!     .handler("shout", FnHandler(|d: Delivery| async move {
//!         let loud = d.payload.xml().to_uppercase().replace("NOTE>", "Note>");
//!         Ok(vec![Output::to(d.meta.from.to_string(), loud)])
//!     }))
//!     .build(config)?;
//! let receipt = organism.inject(InjectRequest {
//!     from: "api".into(),
//!     to: "shout".into(),
//!     payload_xml: "<Note>hi</Note>".into(),
//!     thread_id: None,
//! })?;
//! organism.history().wait_thread(&receipt.thread_id).await;
//! let log = organism.history().thread_messages(&receipt.thread_id).unwrap_or_default();
//! assert_eq!(&*log[1].payload_xml, "<Note>HI</Note>");
//! assert_eq!(log[1].to.as_deref(), Some("api")); // a terminal output: the caller's answer
//! # Ok(())
//! # }
//! ```

pub mod access;
pub mod api;
pub mod client;
pub mod clip;
pub mod config;
pub mod events;
pub(crate) mod hash;
pub mod listener;
pub mod llm;
pub mod lua;
pub mod nats;
pub mod outbound;
pub mod pump;
pub(crate) mod recent;
pub mod schema;
pub mod server;
pub mod stats;
pub mod store;
mod sync;
#[cfg(test)]
mod testing;
pub mod threads;
pub mod time;
pub mod xml;

pub use pump::{
    InjectError, InjectReceipt, InjectRequest, Organism, OrganismBuilder, ReloadError, ReloadReport,
};

/// Sends the organism's log (its warnings and errors: a failing store, a refused reload) to
/// stderr, filtered by `RUST_LOG` (default `warn`). What the `agentserver` binary does at
/// start; for programs that embed an organism. Call it once, before anything logs.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The TLS verifier logs each refused certificate itself; the caller's error says it.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,rustls_platform_verifier=off")
                }),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or a supervisor's journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Turns transparent huge pages off for this process (Linux; elsewhere it does nothing).
/// With them on, memory the allocator gives back and takes again is faulted in 2 MiB at a
/// time, each zeroed by the kernel: with 100 kB payloads that was about a third of a hop's
/// CPU (docs/benchmarks-log.md, "The cost per byte"). The binary calls it first thing in `main`, as
/// do the load generator and the pump bench; the library never does (it is the process's
/// choice).
pub fn disable_transparent_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with PR_SET_THP_DISABLE takes plain integers and touches no memory
        // of ours; it only sets a flag on this process.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}
