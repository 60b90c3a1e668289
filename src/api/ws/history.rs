//! `/ws` `subscribe` with `history: true`: each thread of the filter (at most
//! [`MAX_HISTORY_THREADS`]) is sent as `thread_snapshot` frames (its messages from the
//! history in parts of at most 1 MiB, its open inputs, `as_of_seq`) before the `ack`; its
//! live events follow, those after `as_of_seq`, and no message a snapshot held is sent
//! again. A client that does not read makes the session wait (snapshots are not dropped);
//! the live events it misses meanwhile are told as `dropped`, as ever.

use axum::extract::ws::Message;
use serde_json::{json, Map, Value};

use super::session::Session;
use super::{Endpoint, Pump, Source};
use crate::access::Scope;
use crate::api::auth::unknown_thread;
use crate::api::error::ApiError;

/// Threads one `subscribe` may ask the history of.
pub const MAX_HISTORY_THREADS: usize = 16;

impl Session<Pump> {
    /// `subscribe`, with each thread's history first when the spec asks for it.
    pub(super) async fn subscribe_with_history(
        &mut self,
        mut spec: Value,
        scope: &Scope,
    ) -> Result<Map<String, Value>, ApiError> {
        let history = match spec.as_object_mut().and_then(|m| m.remove("history")) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(_) => {
                return Err(ApiError::bad_request("`history` is true or false").at("history"))
            }
        };
        if !history {
            return self.subscribe(spec);
        }
        if self.ep != Endpoint::Events {
            return Err(ApiError::bad_request(
                "`history` is a /ws option: /ws/messages streams messages only",
            )
            .at("history"));
        }
        let mut out = self.subscribe(spec)?;
        let threads = self.filter.threads.clone();
        if threads.is_empty() || threads.len() > MAX_HISTORY_THREADS {
            return Err(ApiError::bad_request(format!(
                "`history` needs `threads`: 1 to {MAX_HISTORY_THREADS} thread ids"
            ))
            .at("threads"));
        }
        let organism = self.source.0.inner.organism.clone();
        // Live events after the last one this session looked at follow the snapshots.
        let as_of = self.seen;
        let tenant = self.principal.tenant.clone();
        let mut told = Map::new();
        for thread in &threads {
            if !self.source.sees_thread(scope, thread) {
                return Err(unknown_thread(thread).at("threads"));
            }
            let mut from = 0;
            loop {
                let who = (scope, tenant.as_deref());
                let part =
                    crate::api::stream::snapshot_part(&organism, who, thread, from, as_of).await?;
                self.snapshot_ids.extend(part.ids);
                if !self.queue_waiting(Message::Text(part.json.into())).await {
                    return Err(ApiError::bad_request("the connection is gone"));
                }
                if !part.more {
                    break;
                }
                from = part.next;
            }
            told.insert(thread.clone(), json!(as_of));
        }
        // Every message the snapshots hold was published by now.
        self.history_until = organism.events().last_seq();
        out.insert("history".into(), Value::Object(told));
        Ok(out)
    }
}
