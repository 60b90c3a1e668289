//! Embedding agentserver: register a native handler by name, build an organism from YAML,
//! inject a message and print the thread.
//!
//! Run: `cargo run --example embed`

use std::time::Duration;

use agentserver::listener::{Delivery, FnHandler, HandlerError, Output};
use agentserver::{InjectRequest, Organism};

const ORGANISM: &str = r#"
organism: { name: embedded, store: memory }
listeners:
  - name: counter
    description: Counts the characters of a note and reports back to the sender
    kind: native
    handler: count-chars
    schema: ../schemas/note.xsd
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    agentserver::log_to_stderr();
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let config = agentserver::config::load_str(
        ORGANISM,
        "embedded organism",
        &base,
        agentserver::config::Known {
            handlers: &["count-chars"],
            check_script: agentserver::lua::check_syntax,
        },
    )?;

    let organism = Organism::builder()
        .handler(
            "count-chars",
            FnHandler(|d: Delivery| async move {
                let text = d.payload.to_json();
                let text = text
                    .as_str()
                    .ok_or_else(|| HandlerError("expected text".into()))?;
                let answer = format!("<Note>{} characters</Note>", text.chars().count());
                // Reply to whoever sent the note; the pump validates this output too.
                Ok(vec![Output::to(d.meta.from.to_string(), answer)])
            }),
        )
        .build(config)?;

    let receipt = organism.inject(InjectRequest {
        from: "api".into(),
        to: "counter".into(),
        payload_xml: "<Note>hello, organism</Note>".into(),
        thread_id: None,
    })?;
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        organism.history().wait_thread(&receipt.thread_id),
    )
    .await?;
    println!("thread {} ended {:?}", receipt.thread_id, status);
    for m in organism
        .history()
        .thread_messages(&receipt.thread_id)
        .unwrap_or_default()
    {
        println!(
            "{} -> {}: {}",
            m.from,
            m.to.as_deref().unwrap_or("-"),
            m.payload_xml
        );
    }
    organism.stop().await;
    Ok(())
}
