//! The tenant boundary as one rule, in one place: which listener a message from another may
//! reach, and the check that a tenant's listener names no peer outside its scope. Routing
//! (`pump::route`, every path: inject's continuations, handler outputs, workers' results,
//! test vectors' preview) asks [`ListenerConfig::may_reach`]; loading asks
//! [`check_peers_in_scope`].

use super::model::ListenerConfig;
use super::Collector;

impl ListenerConfig {
    /// Whether a message from `self` may reach `to` at all (its `peers` are checked apart).
    /// `named`: `self` names `to` itself, by `to` or in its `peers`, rather than offering it a
    /// broadcast.
    ///
    /// - A tenant's listener reaches its own tenant's listeners and `shared: true` ones,
    ///   whatever its `peers` say or omit.
    /// - So a tenant's listener receives from another tenant only if it is `shared`.
    /// - The organism's own listeners (no tenant) reach each other as their `peers` say, and a
    ///   tenant's listener only when they name it or it is `shared`: a broadcast of the
    ///   organism's is not offered to a tenant that merely declared the same payload type.
    ///
    /// A reply to the sender of the message being handled is not asked about: it answers
    /// one that crossed already.
    pub fn may_reach(&self, to: &ListenerConfig, named: bool) -> bool {
        match self.tenant.as_deref() {
            Some(t) => to.tenant.as_deref() == Some(t) || to.shared,
            None => to.tenant.is_none() || to.shared || named,
        }
    }

    /// Whether `self` names `peer` in its `peers`.
    pub fn names_peer(&self, peer: &str) -> bool {
        self.peers.iter().flatten().any(|p| p.as_str() == peer)
    }
}

/// What a tenant's listener is told of a peer it may not name, the same text whether the
/// name is another tenant's listener or no listener at all.
pub(super) fn out_of_scope_peer(peer: &str, tenant: &str) -> String {
    format!("`{peer}` is not a listener of tenant `{tenant}` nor one marked `shared: true`")
}

/// Every tenant's listener names only peers in its scope (its tenant's, or `shared`), file
/// and API alike. An unknown peer of a tenant's listener is reported here, with the same text
/// as one out of scope (`check_peers` leaves it alone), so the answer is no oracle for
/// another tenant's names.
pub(super) fn check_peers_in_scope(listeners: &[ListenerConfig], c: &mut Collector) {
    let mut problems = Vec::new();
    for me in listeners {
        let Some(tenant) = me.tenant.as_deref() else {
            continue;
        };
        for peer in me.peers.iter().flatten() {
            let reachable = listeners
                .iter()
                .find(|l| l.name == *peer)
                .is_some_and(|l| me.may_reach(l, true));
            if !reachable {
                problems.push((
                    me.name.to_string(),
                    out_of_scope_peer(peer.as_str(), tenant),
                ));
            }
        }
    }
    for (name, message) in problems {
        c.push(Some(&name), Some("peers"), message);
    }
}
