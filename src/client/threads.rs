//! `agentserver threads …`: a thread's time travel and batch actions from the command line
//! (README "Forking", "Labels: finding threads"): fork, rewind, pause, resume, a message's
//! retry, and one action on every thread a filter finds. Each is one request; a line for
//! people, or the server's answer with `--json`.

use serde_json::{json, Value};

use super::agents::{path_part, Failed};
use super::inputs::payload_fields;
use super::Remote;

#[derive(clap::Subcommand, Debug)]
pub enum ThreadsCommand {
    /// A new thread that starts as THREAD did up to message `--at`, then runs it again
    /// (edited with `--payload`, or to `--to`).
    Fork {
        thread: String,
        #[arg(long)]
        at: String,
        /// The edited payload: XML, a JSON value (written as the receiver's type), or @FILE.
        #[arg(long)]
        payload: Option<String>,
        /// Another receiver.
        #[arg(long)]
        to: Option<String>,
        /// Copy every earlier message (`prefix`) rather than its causal path (`path`).
        #[arg(long, default_value = "path")]
        copy: String,
        /// The new thread's id.
        #[arg(long)]
        new_id: Option<String>,
        /// A label for the new thread, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Say what would run; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Take THREAD back to message `--to`: what followed is superseded, it runs again.
    Rewind {
        thread: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        payload: Option<String>,
        /// Abort the thread first if it has work under way (else that is refused).
        #[arg(long)]
        abort: bool,
        #[arg(long)]
        dry_run: bool,
    },
    /// Retry a message that failed, was rejected, undeliverable or killed.
    Retry {
        message: String,
        #[arg(long)]
        dry_run: bool,
    },
    /// Pause a thread: its queued messages wait.
    Pause { thread: String },
    /// Resume a paused thread.
    Resume { thread: String },
    /// One action on every thread the filter (and the ids given) finds: `kill`, `abort`,
    /// `pause`, `resume`, `retry_failed`. Say `--dry-run` first; then `--expected N`, the
    /// count it said (another count changes nothing).
    Batch {
        action: String,
        /// Only these threads (within the filter).
        ids: Vec<String>,
        /// `KEY:VALUE` (`KEY:V1,V2` for either); repeatable, all must hold.
        #[arg(long = "label", value_name = "KEY:VALUE")]
        labels: Vec<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        agent: Option<String>,
        /// In the thread's id, a label or its error (or its payloads, with search on).
        #[arg(long)]
        q: Option<String>,
        #[arg(long)]
        expected: Option<u64>,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs one `threads` command; what to print.
pub async fn threads(remote: &Remote, cmd: ThreadsCommand, json: bool) -> Result<String, Failed> {
    let post =
        |path: String, body: Value| async move { remote.call("POST", &path, Some(body)).await };
    let (answer, line): (Value, fn(&Value) -> String) = match cmd {
        ThreadsCommand::Fork {
            thread,
            at,
            payload,
            to,
            copy,
            new_id,
            labels,
            dry_run,
        } => {
            let mut body = edited(payload)?;
            body["at"] = json!(at);
            body["to"] = json!(to);
            body["copy"] = json!(copy);
            body["thread_id"] = json!(new_id);
            let labels = super::label_args(&labels).map_err(|message| Failed {
                code: 2,
                message,
                report: None,
            })?;
            body["labels"] = json!((!labels.is_empty()).then_some(labels));
            body["dry_run"] = json!(dry_run);
            let path = format!("/api/v1/threads/{}/fork", path_part(&thread));
            (post(path, body).await?, forked)
        }
        ThreadsCommand::Rewind {
            thread,
            to,
            payload,
            abort,
            dry_run,
        } => {
            let mut body = edited(payload)?;
            body["to"] = json!(to);
            body["if_active"] = json!(if abort { "abort" } else { "reject" });
            body["dry_run"] = json!(dry_run);
            let path = format!("/api/v1/threads/{}/rewind", path_part(&thread));
            (post(path, body).await?, rewound)
        }
        ThreadsCommand::Retry { message, dry_run } => {
            let path = format!("/api/v1/messages/{}/retry", path_part(&message));
            (post(path, json!({ "dry_run": dry_run })).await?, retried)
        }
        ThreadsCommand::Pause { thread } => {
            let path = format!("/api/v1/threads/{}/pause", path_part(&thread));
            (post(path, json!({})).await?, thread_line)
        }
        ThreadsCommand::Resume { thread } => {
            let path = format!("/api/v1/threads/{}/resume", path_part(&thread));
            (post(path, json!({})).await?, thread_line)
        }
        ThreadsCommand::Batch {
            action,
            ids,
            labels,
            status,
            agent,
            q,
            expected,
            reason,
            dry_run,
        } => {
            if !dry_run && expected.is_none() {
                return Err(Failed {
                    code: 2,
                    message: "say --dry-run first, then --expected N with the count it gave".into(),
                    report: None,
                });
            }
            let mut filter = json!({ "label": labels });
            for (k, v) in [("status", status), ("agent", agent), ("q", q)] {
                if let Some(v) = v {
                    filter[k] = json!(v);
                }
            }
            let mut body = json!({"action": action, "filter": filter, "dry_run": dry_run});
            if !ids.is_empty() {
                body["ids"] = json!(ids);
            }
            body["expected_count"] = json!(expected);
            body["reason"] = json!(reason);
            (post("/api/v1/threads/batch".into(), body).await?, batched)
        }
    };
    Ok(if json {
        answer.to_string()
    } else {
        line(&answer)
    })
}

/// A `--payload` as the body's `payload` or `payload_xml`; none given, an empty body.
fn edited(payload: Option<String>) -> Result<Value, Failed> {
    match payload {
        Some(p) => payload_fields(&p),
        None => Ok(json!({})),
    }
}

fn s<'v>(v: &'v Value, k: &str) -> &'v str {
    v[k].as_str().unwrap_or("-")
}

fn thread_line(t: &Value) -> String {
    let paused = if t["paused"] == true { " (paused)" } else { "" };
    format!("thread {} {}{paused}", s(t, "id"), s(t, "status"))
}

fn forked(v: &Value) -> String {
    format!(
        "fork {} of thread {} at {}: {} copied, {} runs again{}",
        s(v, "thread_id"),
        s(&v["forked_from"], "thread"),
        s(&v["forked_from"], "message"),
        v["copied"],
        s(v, "to"),
        if v["thread_id"].is_null() {
            " (dry run)"
        } else {
            ""
        }
    )
}

fn rewound(v: &Value) -> String {
    format!(
        "thread {} back to {}: {} superseded, {} runs again{}",
        s(v, "thread_id"),
        s(v, "to_message"),
        v["superseded"],
        s(v, "to"),
        if v["message_id"].is_null() {
            " (dry run)"
        } else {
            ""
        }
    )
}

fn retried(v: &Value) -> String {
    format!(
        "message {} retried as {} to {} (retry {} of at most 5)",
        s(v, "retried"),
        s(v, "message_id"),
        s(v, "to"),
        v["depth"]
    )
}

fn batched(v: &Value) -> String {
    let mut text = format!(
        "matched {}, applied {}, skipped {}{}",
        v["matched"],
        v["applied"],
        v["skipped"].as_array().map_or(0, Vec::len),
        if v["dry_run"] == true {
            " (dry run)"
        } else {
            ""
        }
    );
    for skip in v["skipped"].as_array().into_iter().flatten() {
        text.push_str(&format!("\n  {}: {}", s(skip, "id"), s(skip, "why")));
    }
    text
}
