//! What a gateway's session shows: the `connected` frame of the mirrored snapshot and the
//! events, as much of them as its principal's scope sees, which follows the snapshot.

use axum::extract::ws::Message;
use serde_json::json;

use super::{Gate, Stream};
use crate::api::auth::{Principal, Scope};
use crate::api::filter::Filter;
use crate::api::ws::text;
use crate::events::Event;
use crate::nats::mirror::Snapshot;
use crate::time::Timestamp;

/// The `connected` frame a session of `stream` starts with: the mirrored snapshot, as
/// much of it as `who` sees.
pub(super) fn connected(
    snapshot: &Snapshot,
    stream: Stream,
    who: Option<&(Principal, Scope)>,
    filter: &Filter,
) -> Message {
    let mut frame = json!({
        "event": "connected",
        "seq": snapshot.seq,
        "timestamp": Timestamp::now(),
        "organism": snapshot.organism,
    });
    if stream == Stream::Events {
        let scope = who.map(|(_, s)| s);
        let agents: Vec<&serde_json::Value> = snapshot
            .agents
            .iter()
            .filter(|a| scope.is_none_or(|s| a["name"].as_str().is_some_and(|n| s.sees(n))))
            .collect();
        let threads: Vec<&serde_json::Value> = snapshot
            .threads
            .iter()
            .filter(|t| {
                scope.is_none_or(|s| {
                    let participants: Vec<String> = t["participants"]
                        .as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    s.sees_thread(&participants)
                })
            })
            .collect();
        frame["agents"] = json!(agents);
        frame["threads"] = json!(threads);
    }
    frame["filter"] = json!(filter);
    text(&frame)
}

impl Gate {
    /// What `p` sees now: its tenant's listeners as the latest mirrored snapshot lists them
    /// (the file's and the API's agents, as of the last reload or agent change), or as the
    /// `--auth-from` file does until a snapshot comes.
    pub(super) fn scope(&self, p: &Principal) -> Scope {
        let latest = self.snapshot.borrow().clone();
        match (
            latest.as_ref().and_then(|s| s.tenants.as_ref()),
            &self.access,
        ) {
            (Some(tenants), _) => {
                p.scope_in(tenants.iter().map(|(l, t)| (l.as_str(), Some(t.as_str()))))
            }
            (None, Some(a)) => p.scope(&a.config),
            (None, None) => Scope::default(),
        }
    }
}

/// Whether a principal of `scope` sees `ev` (a tenant's: messages from or to its agents).
pub(super) fn sees(scope: &Scope, ev: &Event) -> bool {
    match &ev.kind {
        crate::events::EventKind::Message { message } => {
            scope.sees_message(&message.from, message.to.as_deref())
        }
        crate::events::EventKind::MessageStatus {
            about: Some(about), ..
        } => scope.sees_message(&about.from, about.to.as_deref()),
        _ => scope.everything(),
    }
}
