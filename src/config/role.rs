//! What a principal may do: the roles an API key, a JWT's claim or (later) an approval gate
//! names. Plain data, here so the store and the access layer share one type.

use serde::{Deserialize, Serialize};

/// What a principal may do, each role including the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every read: GETs, `/ws` without commands, `/ws/messages`.
    Viewer,
    /// Adds inject, pause and resume of agents, kill, agent reload.
    Operator,
    /// Adds organism pause, resume, reload and stop, keys.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
