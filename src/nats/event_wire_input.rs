//! An input (`threads::InputRow`) as the event mirror carries it (`event_wire`, version 1).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::threads::{InputKind, InputRow, InputStatus};
use crate::time::Timestamp;

/// An input (`threads::InputRow`) on the stream.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireInput {
    id: Arc<str>,
    kind: InputKind,
    status: InputStatus,
    thread_id: Arc<str>,
    message_id: Arc<str>,
    listener: Arc<str>,
    tenant: Option<String>,
    from: Arc<str>,
    parent_id: Option<Arc<str>>,
    slot_index: u64,
    payload_type: Arc<str>,
    payload_xml: crate::xml::SharedXml,
    prompt: Option<String>,
    requested_by: Option<Arc<str>>,
    created: Timestamp,
    expires: Option<Timestamp>,
    decided_by: Option<String>,
    decided: Option<Timestamp>,
    decision: Option<String>,
    reason: Option<String>,
    result: Option<String>,
}

impl From<&InputRow> for WireInput {
    fn from(r: &InputRow) -> Self {
        let r = r.clone();
        WireInput {
            id: r.id,
            kind: r.kind,
            status: r.status,
            thread_id: r.thread_id,
            message_id: r.message_id,
            listener: r.listener,
            tenant: r.tenant,
            from: r.from,
            parent_id: r.parent_id,
            slot_index: r.slot_index,
            payload_type: r.payload_type,
            payload_xml: r.payload_xml,
            prompt: r.prompt,
            requested_by: r.requested_by,
            created: r.created,
            expires: r.expires,
            decided_by: r.decided_by,
            decided: r.decided,
            decision: r.decision,
            reason: r.reason,
            result: r.result,
        }
    }
}

impl From<WireInput> for std::sync::Arc<InputRow> {
    fn from(r: WireInput) -> Self {
        std::sync::Arc::new(InputRow {
            id: r.id,
            kind: r.kind,
            status: r.status,
            thread_id: r.thread_id,
            message_id: r.message_id,
            listener: r.listener,
            tenant: r.tenant,
            from: r.from,
            parent_id: r.parent_id,
            slot_index: r.slot_index,
            payload_type: r.payload_type,
            payload_xml: r.payload_xml,
            prompt: r.prompt,
            requested_by: r.requested_by,
            created: r.created,
            expires: r.expires,
            decided_by: r.decided_by,
            decided: r.decided,
            decision: r.decision,
            reason: r.reason,
            result: r.result,
        })
    }
}
