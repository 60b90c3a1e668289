//! `agentserver tail --thread ID`: the thread's event stream (`GET
//! /api/v1/threads/{id}/events`), its history first, then live, as `tail` prints it.

use std::io::Write;

use serde_json::Value;

use super::{
    connect_failure, tail_line, ClientError, Remote, TailFilter, MAX_ANSWER_BYTES, REFUSAL_BYTES,
};

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
        let body = crate::outbound::body_start(response, REFUSAL_BYTES).await;
        return Err(ClientError::Refused { status, body });
    }
    // Bytes, not text, until an event is whole: a character may straddle two chunks.
    let mut buf: Vec<u8> = Vec::new();
    // How far `buf` has been looked through for an event's end, so that an event coming in
    // many chunks is looked through once.
    let mut looked = 0;
    loop {
        while let Some(end) = buf[looked..]
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|at| looked + at)
        {
            looked = 0;
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            for frame in frames(&String::from_utf8_lossy(&block)) {
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
        // The next look starts a byte early: an event's end may straddle two chunks.
        looked = buf.len().saturating_sub(1);
        match response.chunk().await {
            Ok(Some(chunk)) if buf.len() + chunk.len() > MAX_ANSWER_BYTES => {
                return Err(ClientError::Ended(format!(
                    " (an event over {MAX_ANSWER_BYTES} bytes; the rest was not read)"
                )))
            }
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
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
