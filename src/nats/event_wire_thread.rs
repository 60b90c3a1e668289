//! A thread (`threads::ThreadInfo`) as the event mirror carries it (`event_wire`, version
//! 1): its settings and labels only when it has them.

use serde::{Deserialize, Serialize};

use crate::threads::{ThreadInfo, ThreadSettings, ThreadStatus};
use crate::time::Timestamp;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireThread {
    id: String,
    status: ThreadStatus,
    participants: Vec<String>,
    message_count: u64,
    created_at: Timestamp,
    last_activity: Timestamp,
    error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settings: Option<ThreadSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<crate::threads::Labels>,
    /// Its tenant (none: the organism's), so a store restored from the mirror prunes it
    /// as the pump's does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

impl From<&ThreadInfo> for WireThread {
    fn from(t: &ThreadInfo) -> Self {
        WireThread {
            id: t.id.clone(),
            status: t.status,
            participants: t.participants.clone(),
            message_count: t.message_count,
            created_at: t.created_at,
            last_activity: t.last_activity,
            error: t.error.clone(),
            settings: t.settings.as_deref().cloned(),
            labels: t.labels.as_deref().cloned(),
            owner: t.owner.as_deref().map(str::to_string),
        }
    }
}

impl From<WireThread> for ThreadInfo {
    fn from(t: WireThread) -> Self {
        ThreadInfo {
            id: t.id,
            status: t.status,
            participants: t.participants,
            message_count: t.message_count,
            created_at: t.created_at,
            last_activity: t.last_activity,
            error: t.error,
            settings: t.settings.and_then(ThreadSettings::kept),
            labels: t.labels.filter(|l| !l.is_empty()).map(std::sync::Arc::new),
            paused: false,
            owner: t.owner.map(std::sync::Arc::from),
        }
    }
}
