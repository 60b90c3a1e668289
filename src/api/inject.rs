//! Inject from the API (REST and `/ws`): a JSON `payload` written as XML in schema order, or
//! raw `payload_xml`; then the pump's own inject, which validates before answering.

use std::sync::Arc;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::{chosen_id, may_name_thread, Seen};
use super::error::ApiError;
use crate::config::{json_payload, JsonPayloadError, NoType};
use crate::pump::{InjectReceipt, InjectRequest, Organism};
use crate::schema::Schema;
use crate::xml::{root_local_name, PayloadType};

/// `POST /api/v1/inject` and the `/ws` `inject` command.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InjectBody {
    /// The listener that receives the payload.
    pub to: String,
    /// The payload as JSON (keys are child elements, `@name` attributes, `#text` text),
    /// written as XML in the order the listener's schema declares. Give this or `payload_xml`.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Value>,
    /// The payload as XML. Give this or `payload`.
    pub payload_xml: Option<String>,
    /// Which accepted payload type `payload` is (`Local` or `{namespace}Local`); needed only
    /// when the listener accepts more than one.
    pub payload_type: Option<String>,
    /// Continue this thread (or open it with this id): `[A-Za-z0-9_-]{1,128}` but not
    /// `batch`, `count` or `retry` (routes beside `/threads/{id}`). A tenant's credential
    /// opens a thread only with an id that begins with its tenant's name and `-`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub thread_id: Option<String>,
    /// The id of the message this inject makes, chosen by the client so it knows it before
    /// the answer: `[A-Za-z0-9_-]{1,128}` but not `batch`, `count` or `retry`, unused in
    /// the organism (else 409
    /// `message_id_taken`); a tenant's credential's begins with its tenant's name and `-`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub message_id: Option<String>,
    /// When `thread_id` names a thread with work queued or running: `enqueue` (default)
    /// after it; `reject` (409 `thread_busy`); `interrupt` its queued messages
    /// (`superseded`), then deliver; `rollback`: abort the thread first.
    pub if_busy: Option<IfBusy>,
    /// Labels added to its thread's (`{"customer": "acme-42"}`): at most 16 in all, keys
    /// `[a-z0-9_.-]{1,64}`, values at most 256 bytes (else 422 `invalid_label`).
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

/// What an inject does to a busy thread (`if_busy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IfBusy {
    Enqueue,
    Reject,
    Interrupt,
    Rollback,
}

/// Why a JSON payload's type was not found among what `to` accepts, as an answer.
fn no_type(
    accepts: &[(PayloadType, Arc<Schema>)],
    to: &str,
    wanted: Option<&str>,
    why: NoType,
) -> ApiError {
    let listed = accepts
        .iter()
        .map(|(t, _)| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match why {
        NoType::NotAccepted => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_accepted",
            format!(
                "`{to}` does not accept payload type `{}` (it accepts: {listed})",
                wanted.unwrap_or_default(),
            ),
        )
        .at("payload_type"),
        NoType::Ambiguous => ApiError::bad_request(format!(
            "`{to}` accepts several payload types ({listed}); say which with `payload_type`"
        ))
        .at("payload_type"),
    }
}

/// A JSON payload for `listener` written as the XML of the type it means (`wanted`, or the
/// one type it accepts): what an inject and an approval's edit send as JSON.
pub(super) fn json_to_xml(
    listener: &crate::config::ListenerConfig,
    wanted: Option<&str>,
    json: &serde_json::Value,
) -> Result<String, ApiError> {
    let to = listener.name.as_str();
    json_payload(&listener.accepts, wanted, json).map_err(|e| match e {
        JsonPayloadError::Type(why) => no_type(&listener.accepts, to, wanted, why),
        JsonPayloadError::Map(ty, e) => {
            // An XML text sent as `payload` (a string) instead of `payload_xml`.
            let hint = match json.as_str() {
                Some(s) if s.trim_start().starts_with('<') => {
                    " (an XML payload goes in `payload_xml`, as a string)"
                }
                _ => "",
            };
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_payload",
                format!("payload cannot be written as `{ty}`: {}{hint}", e.message),
            )
            .at(e.path)
        }
    })
}

/// Turns an inject body into the pump's request and injects it as the principal of `seen`
/// (its name, or `default`): to a listener it sees, and into a thread it sees (or a new one).
pub fn inject(
    organism: &Organism,
    seen: &Seen,
    default: &str,
    body: InjectBody,
) -> Result<InjectReceipt, ApiError> {
    if let Some(t) = &body.thread_id {
        // An id; whose it may be (a tenant may continue a thread it sees) is asked below.
        chosen_id(None, t, "thread")?;
    }
    if let Some(m) = body.message_id.as_deref() {
        // A tenant's chosen ids begin with its name, as its threads' (it takes none of
        // another tenant's).
        chosen_id(seen.principal.tenant.as_deref(), m, "message")?;
    }
    let config = organism.config();
    if let Some(t) = body.thread_id.as_deref() {
        may_name_thread(organism, &seen.scope, seen.principal.tenant.as_deref(), t)?;
    }
    let listener = config
        .listener(&body.to)
        .filter(|_| seen.scope.sees(&body.to))
        .ok_or_else(|| {
            // Only a name the credential sees is suggested.
            let seen_names = config.listeners.iter().map(|l| l.name.as_str());
            let hint =
                crate::config::did_you_mean(&body.to, seen_names.filter(|n| seen.scope.sees(n)));
            ApiError::not_found(
                "unknown_listener",
                format!("no listener named `{}`{hint}", body.to),
            )
            .at("to")
        })?;
    // Refused for want of room before the payload is read or made.
    organism.room()?;
    let payload_xml = match (body.payload, body.payload_xml) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::bad_request(
                "give exactly one of `payload` (JSON) or `payload_xml` (XML)",
            ))
        }
        (None, Some(xml)) => {
            if let Some(wanted) = &body.payload_type {
                let root = root_local_name(&xml);
                let local = crate::xml::local_of(wanted);
                if root.as_deref().is_some_and(|r| r != local) {
                    return Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "payload_type_mismatch",
                        format!(
                            "payload_type is `{wanted}` but the XML's root element is `{}`",
                            root.unwrap_or_default()
                        ),
                    )
                    .at("payload_type"));
                }
            }
            xml
        }
        (Some(json), None) => json_to_xml(listener, body.payload_type.as_deref(), &json)?,
    };
    if let (Some(t), Some(mode)) = (&body.thread_id, body.if_busy) {
        let who = seen.principal.identity(default);
        let mode = match mode {
            IfBusy::Enqueue => crate::pump::IfBusy::Enqueue,
            IfBusy::Reject => crate::pump::IfBusy::Reject,
            IfBusy::Interrupt => crate::pump::IfBusy::Interrupt,
            IfBusy::Rollback => crate::pump::IfBusy::Rollback,
        };
        organism.control().steer(t, mode, who)?;
    }
    let request = InjectRequest {
        from: seen.principal.identity(default).to_string(),
        to: body.to,
        payload_xml,
        thread_id: body.thread_id,
    };
    Ok(organism.inject_labelled(request, body.message_id.as_deref(), body.labels.as_ref())?)
}
