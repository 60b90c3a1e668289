//! `agentserver tail --thread ID`: the thread's event stream (`GET
//! /api/v1/threads/{id}/events`), its history first, then live, as `tail` prints it.

use std::io::Write;

use serde_json::Value;

use super::{connect_failure, tail_line, ClientError, Remote, TailFilter};

/// The thread's messages so far, then its messages and status changes as they come, to
/// `out` (one line each, or the JSON of each message and status with `json`). Ends with
/// [`ClientError::Ended`] when the server ends the stream.
pub(super) async fn follow(
    remote: &Remote,
    thread: &str,
    filter: &TailFilter,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), ClientError> {
    let url = format!("{}/api/v1/threads/{thread}/events", remote.url());
    let mut response = remote
        .authorized(remote.http.get(&url))
        .send()
        .await
        .map_err(|e| ClientError::Connect {
            url: url.clone(),
            message: connect_failure(&e),
        })?;
    let status = response.status().as_u16();
    if status != 200 {
        let body = response.text().await.unwrap_or_default();
        return Err(ClientError::Refused { status, body });
    }
    let mut buf = String::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            for frame in frames(&block) {
                if !shown(&frame, filter) {
                    continue;
                }
                match json {
                    true => writeln!(out, "{frame}")?,
                    false => match tail_line(&frame) {
                        Some(line) => writeln!(out, "{line}")?,
                        None => continue,
                    },
                }
                out.flush()?;
            }
        }
        match response.chunk().await {
            Ok(Some(chunk)) => buf.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => return Err(ClientError::Ended(String::new())),
            Err(e) => return Err(ClientError::Ended(format!(" ({e})"))),
        }
    }
}

/// The messages and status changes of one server-sent event, in `/ws/messages`'s shape: a
/// snapshot's messages, a message's, or a status change.
fn frames(block: &str) -> Vec<Value> {
    let data: String = block
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    let Ok(v) = serde_json::from_str::<Value>(&data) else {
        return Vec::new();
    };
    let as_message = |mut m: Value| {
        if let Some(fields) = m.as_object_mut() {
            fields.insert("event".into(), "message".into());
        }
        m
    };
    match v.get("event").and_then(Value::as_str) {
        Some("thread_snapshot") => v["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .cloned()
            .map(as_message)
            .collect(),
        Some("message") => vec![as_message(v["message"].clone())],
        Some("message_status") => vec![v],
        _ => Vec::new(),
    }
}

/// Whether `--agent` and `--type` let `frame` through.
fn shown(frame: &Value, filter: &TailFilter) -> bool {
    let s = |k: &str| frame.get(k).and_then(Value::as_str).unwrap_or("");
    let agent_ok = filter.agent.as_deref().is_none_or(|globs| {
        globs.split(',').map(str::trim).any(|g| {
            crate::threads::glob_match(g, s("from")) || crate::threads::glob_match(g, s("to"))
        })
    });
    let type_ok = filter
        .payload_type
        .as_deref()
        .is_none_or(|t| s("payload_type") == t || crate::xml::local_of(s("payload_type")) == t);
    agent_ok && type_ok
}
