//! `agentserver inputs …` and `agentserver abort`: the inbox and a thread's abort from the
//! command line (README "Humans in the loop"). Each command is one request and prints a
//! line per input for people; `--json` prints the server's answer instead.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::agents::{path_part, read, Failed};
use super::Remote;

#[derive(clap::Subcommand, Debug)]
pub enum InputsCommand {
    /// List inputs, newest first (open ones by default).
    List {
        /// `open`, `approved`, `declined`, `answered`, `expired`, `cancelled`, or `all`.
        #[arg(long, default_value = "open")]
        status: String,
        /// Only this listener's.
        #[arg(long)]
        listener: Option<String>,
        /// Only this thread's.
        #[arg(long)]
        thread: Option<String>,
        /// At most this many (the server caps a page at 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print one input: its held message (or question) and its decision.
    Show { id: String },
    /// Let a held message through; with `--payload`, an edited one instead.
    Approve {
        id: String,
        #[arg(long)]
        reason: Option<String>,
        /// The edited payload: XML, a JSON value (written as the held type), or @FILE.
        #[arg(long)]
        payload: Option<String>,
    },
    /// Decline a held message.
    Reject {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Answer a question: one payload (XML, a JSON value, or @FILE), sent to `--to` or
    /// routed as the human listener's output.
    Answer {
        id: String,
        payload: String,
        #[arg(long)]
        to: Option<String>,
        /// The payload type of a JSON payload, when its receiver accepts several.
        #[arg(long = "type")]
        payload_type: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
}

/// A payload argument as the API takes it: `payload_xml` for XML, `payload` for JSON;
/// `@FILE` reads a file.
pub(super) fn payload_fields(arg: &str) -> Result<Value, Failed> {
    let text = match arg.strip_prefix('@') {
        Some(path) => read(&PathBuf::from(path))?,
        None => arg.to_string(),
    };
    Ok(if text.trim_start().starts_with('<') {
        json!({"payload_xml": text})
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => json!({"payload": v}),
            // Plain text: a payload whose type is simple (a string).
            Err(_) => json!({"payload": text}),
        }
    })
}

/// One input as a line: id, status, listener, thread, and its prompt or payload.
fn line(i: &Value) -> String {
    let shown = i["prompt"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| i["payload_xml"].as_str().unwrap_or_default().to_string());
    let mut text = format!(
        "{} {} {} {} thread {}: {}",
        i["id"].as_str().unwrap_or("?"),
        i["status"].as_str().unwrap_or("?"),
        i["kind"].as_str().unwrap_or("?"),
        i["listener"].as_str().unwrap_or("?"),
        i["thread_id"].as_str().unwrap_or("?"),
        shown
    );
    if let Some(by) = i["decided_by"].as_str() {
        text.push_str(&format!(
            " [{} by {by}]",
            i["decision"].as_str().unwrap_or("decided")
        ));
    }
    text
}

/// Runs one `inputs` command; what to print.
pub async fn inputs(remote: &Remote, cmd: InputsCommand, json: bool) -> Result<String, Failed> {
    let decided =
        |path: String, body: Value| async move { remote.call("POST", &path, Some(body)).await };
    let answer = match cmd {
        InputsCommand::List {
            status,
            listener,
            thread,
            limit,
        } => {
            let mut query = vec![format!("limit={limit}")];
            if status != "all" {
                query.push(format!("status={}", path_part(&status)));
            }
            if let Some(l) = listener {
                query.push(format!("listener={}", path_part(&l)));
            }
            if let Some(t) = thread {
                query.push(format!("thread={}", path_part(&t)));
            }
            let page = remote
                .call("GET", &format!("/api/v1/inputs?{}", query.join("&")), None)
                .await?;
            if json {
                return Ok(page.to_string());
            }
            let items = page["items"].as_array().cloned().unwrap_or_default();
            let mut lines: Vec<String> = items.iter().map(line).collect();
            lines.push(format!("{} of {}", items.len(), page["total"]));
            return Ok(lines.join("\n"));
        }
        InputsCommand::Show { id } => {
            let one = remote
                .call("GET", &format!("/api/v1/inputs/{}", path_part(&id)), None)
                .await?;
            return Ok(if json {
                one.to_string()
            } else {
                serde_json::to_string_pretty(&one).unwrap_or_default()
            });
        }
        InputsCommand::Approve {
            id,
            reason,
            payload,
        } => {
            let mut body = match payload {
                Some(p) => payload_fields(&p)?,
                None => json!({}),
            };
            body["reason"] = json!(reason);
            decided(format!("/api/v1/inputs/{}/approve", path_part(&id)), body).await?
        }
        InputsCommand::Reject { id, reason } => {
            decided(
                format!("/api/v1/inputs/{}/reject", path_part(&id)),
                json!({ "reason": reason }),
            )
            .await?
        }
        InputsCommand::Answer {
            id,
            payload,
            to,
            payload_type,
            reason,
        } => {
            let mut body = payload_fields(&payload)?;
            body["to"] = json!(to);
            body["payload_type"] = json!(payload_type);
            body["reason"] = json!(reason);
            decided(format!("/api/v1/inputs/{}/answer", path_part(&id)), body).await?
        }
    };
    Ok(if json {
        answer.to_string()
    } else {
        line(&answer)
    })
}

/// `agentserver abort THREAD`: stops the thread's work and keeps it usable.
pub async fn abort(
    remote: &Remote,
    thread: &str,
    reason: Option<String>,
    json: bool,
) -> Result<String, Failed> {
    let t = remote
        .call(
            "POST",
            &format!("/api/v1/threads/{}/abort", path_part(thread)),
            Some(json!({ "reason": reason })),
        )
        .await?;
    Ok(if json {
        t.to_string()
    } else {
        format!(
            "thread {} {}",
            t["id"].as_str().unwrap_or(thread),
            t["status"].as_str().unwrap_or("?")
        )
    })
}
