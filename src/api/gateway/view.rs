//! What a gateway's session shows: the `connected` frame of the mirrored snapshot, as much
//! of it as its principal's scope sees, which follows the snapshot.

use axum::extract::ws::Message;
use serde_json::json;

use super::Gate;
use crate::api::auth::{Principal, Scope};
use crate::api::filter::Filter;
use crate::api::ws::text;
use crate::api::Endpoint;
use crate::nats::mirror::Snapshot;
use crate::time::Timestamp;

/// The `connected` frame a session of `stream` starts with: the mirrored snapshot, as
/// much of it as `who` sees.
pub(super) fn connected(
    snapshot: &Snapshot,
    ep: Endpoint,
    scope: &Scope,
    filter: &Filter,
) -> Message {
    let mut frame = json!({
        "event": "connected",
        "seq": snapshot.seq,
        "timestamp": Timestamp::now(),
        "organism": snapshot.organism,
    });
    if ep == Endpoint::Events {
        let agents: Vec<&serde_json::Value> = snapshot
            .agents
            .iter()
            .filter(|a| scope.everything() || a["name"].as_str().is_some_and(|n| scope.sees(n)))
            .collect();
        let threads: Vec<&serde_json::Value> = snapshot
            .threads
            .iter()
            .filter(|t| {
                scope.everything() || {
                    let participants: Vec<String> = t["participants"]
                        .as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    scope.sees_thread(&participants)
                }
            })
            .collect();
        let inputs: Vec<&serde_json::Value> = snapshot
            .inputs
            .iter()
            .filter(|i| scope.everything() || i["listener"].as_str().is_some_and(|l| scope.sees(l)))
            .collect();
        frame["agents"] = json!(agents);
        frame["threads"] = json!(threads);
        frame["inputs_total"] = json!(inputs.len());
        frame["inputs"] = json!(inputs);
    }
    frame["filter"] = json!(filter);
    text(&frame)
}

impl Gate {
    /// What `p` sees by `latest`: its tenant's listeners as the latest mirrored snapshot
    /// lists them (the file's and the API's agents, as of the last reload or agent change),
    /// or as the `--auth-from` file does until a snapshot comes.
    pub(super) fn scope_in(&self, p: &Principal, latest: Option<&Snapshot>) -> Scope {
        match (latest.and_then(|s| s.tenants.as_ref()), &self.access) {
            (Some(tenants), _) => {
                p.scope_in(tenants.iter().map(|(l, t)| (l.as_str(), Some(t.as_str()))))
            }
            (None, Some(a)) => p.scope(&a.config),
            (None, None) => Scope::default(),
        }
    }
}
