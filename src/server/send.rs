//! `agentserver send`: a trial run in-process. The organism is built without its durable
//! store, one payload injected (from `cli`), its thread's messages printed as JSON lines as
//! the API shows them, and the organism stopped.

use std::time::Duration;

use crate::config::{self, OrganismConfig};
use crate::pump::{InjectRequest, Organism};
use crate::threads::ThreadStatus;

/// What to send.
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub to: String,
    /// XML, or a JSON object written as the XML of the type `to` accepts.
    pub payload: String,
    pub thread: Option<String>,
    /// How long the thread may stay active.
    pub timeout: Duration,
}

/// Why a send did not end in a completed thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The request itself is wrong (the CLI's exit status 2).
    Usage(String),
    /// The organism did not start, refused the payload, or the thread did not complete.
    Failed(String),
}

/// Runs the organism `config` describes just long enough to carry `request` through.
pub async fn send(mut config: OrganismConfig, request: SendRequest) -> Result<(), SendError> {
    // A trial run: it never writes the organism's durable store.
    config.store = None;
    let payload_xml =
        json_payload(&config, &request.to, &request.payload).map_err(SendError::Usage)?;
    let organism = Organism::builder()
        .build(config)
        .map_err(|e| SendError::Failed(e.to_string()))?;
    let receipt = organism
        .inject(InjectRequest {
            from: "cli".into(),
            to: request.to,
            payload_xml,
            thread_id: request.thread,
        })
        .map_err(|e| SendError::Failed(format!("inject refused: {e}")))?;
    let status = tokio::time::timeout(
        request.timeout,
        organism.history().wait_thread(&receipt.thread_id),
    )
    .await;
    let schemas = organism.schemas();
    for m in organism
        .history()
        .thread_messages(&receipt.thread_id)
        .unwrap_or_default()
    {
        match serde_json::to_string(&crate::api::view::Message::of(&m, &schemas)) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("agentserver: cannot print message {}: {e}", m.id),
        }
    }
    organism.stop().await;
    match status {
        Ok(Some(ThreadStatus::Completed)) => Ok(()),
        Ok(Some(other)) => {
            let error = organism
                .threads()
                .info(&receipt.thread_id)
                .and_then(|t| t.error)
                .unwrap_or_default();
            Err(SendError::Failed(format!(
                "thread {} ended {other:?}: {error}",
                receipt.thread_id
            )))
        }
        Ok(None) => Err(SendError::Failed(format!(
            "thread {} is gone",
            receipt.thread_id
        ))),
        Err(_) => Err(SendError::Failed(format!(
            "thread {} still active after {}s",
            receipt.thread_id,
            request.timeout.as_secs()
        ))),
    }
}

/// A JSON object payload written as the XML of the type `to` accepts (its only type, but
/// `huh`); any other text is taken as XML.
fn json_payload(config: &OrganismConfig, to: &str, text: &str) -> Result<String, String> {
    if !text.trim_start().starts_with('{') {
        return Ok(text.to_string());
    }
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("the payload starts like JSON but is not: {e}"))?;
    let listener = config
        .listener(to)
        .ok_or_else(|| format!("no listener named `{to}`"))?;
    config::json_payload(&listener.accepts, None, &value).map_err(|e| match e {
        config::JsonPayloadError::Type(_) => format!(
            "`{to}` accepts several payload types: give the payload as XML, whose root element names its type"
        ),
        config::JsonPayloadError::Map(ty, e) => format!(
            "the payload cannot be written as `{ty}` at {}: {}",
            e.path, e.message
        ),
    })
}
