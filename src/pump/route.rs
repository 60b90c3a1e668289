//! Ingress of handler outputs, routing (SPEC §6), and the failure path (SPEC §8).
//!
//! Every output re-enters here as untrusted text: read strictly, routed, validated against
//! each receiver's schema, logged, queued. There is no fast path for trusted handlers.

use std::sync::Arc;

use super::admit::{Admission, Admitted};
use super::dispatch::Listener;
use super::{FailureKind, Shared};
use crate::events::EventKind;
use crate::events::StatusAbout;
use crate::listener::Output;
use crate::schema::ValidatedPayload;
use crate::threads::{MessageCore, MessageRecord, MessageStatus, NewMessage, Origin};
use crate::xml::{
    escape_text, normalize_payload, NormalizedPayload, PayloadType, SharedXml, SYSTEM_NS,
};

/// The identity the pump uses for the notices it sends itself (`<huh>`).
pub const SYSTEM_IDENTITY: &str = crate::threads::SYSTEM_SENDER;

/// Where an output goes: mostly one place, kept without allocating.
pub(crate) type Targets = smallvec::SmallVec<[Target; 1]>;

/// Where a routed message goes.
pub(crate) enum Target {
    Listener(Arc<Listener>),
    /// A non-listener identity (`api`, `cli`, …): logged and streamed, then it ends.
    Terminal(Arc<str>),
}

impl super::Organism {
    /// Where an output of listener `from` would go under the current topology, without
    /// sending anything: the receivers' names (listeners, or the non-listener identity a
    /// reply ends at), or why it would be undeliverable. `handling` is the sender of the
    /// message `from` is handling (a reply to it is always allowed); `to` is the output's
    /// explicit target, if any (SPEC §6). This is the routing step of every hop.
    pub fn route_preview(
        &self,
        from: &str,
        handling: &str,
        to: Option<&str>,
        payload_type: &PayloadType,
    ) -> Result<Vec<Arc<str>>, String> {
        let sender = self
            .shared
            .topo()
            .listeners
            .get(from)
            .cloned()
            .ok_or_else(|| format!("`{from}` is not a listener"))?;
        let targets = self.shared.route(&sender, handling, to, payload_type)?;
        Ok(targets
            .into_iter()
            .map(|t| match t {
                Target::Listener(l) => l.config.name.arc(),
                Target::Terminal(name) => name,
            })
            .collect())
    }
}

/// What a handler may learn of a failure: the same text whatever the precise reason, so
/// handlers cannot probe the topology (SPEC §6 rule 5).
const GENERIC_UNDELIVERABLE: &str = "undeliverable";

/// An output of a listener that the pump refused: what [`Shared::log_refused`] logs.
struct Refusal {
    from: Arc<str>,
    to: Option<Arc<str>>,
    payload_type: Option<Arc<str>>,
    payload_xml: SharedXml,
    status: MessageStatus,
    error: String,
}

/// An output that is the payload its listener was given, byte for byte: that payload's
/// normalized form and type as they are (normalizing normalized XML gives it back), with no
/// second read. Still within the limits as they are now. Validated for its receiver like any
/// output, except by a schema of the same text as the one it passed (`Schema::validate`:
/// the same bytes and the same XSD, the same verdict).
fn echoed(
    handled: Option<&ValidatedPayload>,
    output: &str,
    limits: &crate::xml::XmlLimits,
) -> Option<NormalizedPayload> {
    let given = handled?;
    (given.xml() == output && output.len() <= limits.max_bytes).then(|| given.again())
}

impl Shared {
    /// Routes one output of `listener`, produced while handling `parent` (whose payload,
    /// `handled`, the listener was given, if it was).
    pub(crate) fn route_output(
        self: &Arc<Self>,
        listener: &Arc<Listener>,
        parent: &MessageRecord,
        handled: Option<&ValidatedPayload>,
        output: Output,
    ) {
        let from = listener.config.name.arc();
        let payload = match echoed(handled, &output.payload, &self.xml_limits)
            .map_or_else(|| normalize_payload(&output.payload, &self.xml_limits), Ok)
        {
            Ok(p) => p,
            Err(e) => {
                let refusal = Refusal {
                    from,
                    to: self.shown_target(listener, output.to.as_deref()),
                    payload_type: None,
                    payload_xml: SharedXml::new(output.payload),
                    status: MessageStatus::Rejected,
                    error: format!("output of `{}` is not acceptable XML: {e}", listener.name()),
                };
                let record = self.log_refused(parent, refusal);
                self.report(&record, FailureKind::Malformed, Some(listener));
                return;
            }
        };
        match self.route(
            listener,
            &parent.from,
            output.to.as_deref(),
            &payload.payload_type,
        ) {
            Err(reason) => {
                let refusal = Refusal {
                    from,
                    to: self.shown_target(listener, output.to.as_deref()),
                    payload_type: Some(payload.payload_type.written()),
                    payload_xml: payload.xml,
                    status: MessageStatus::Undeliverable,
                    error: reason,
                };
                let record = self.log_refused(parent, refusal);
                self.report(&record, FailureKind::Undeliverable, Some(listener));
            }
            Ok(targets) => {
                for target in targets {
                    self.deliver(
                        &parent.thread_id,
                        Some(parent.id.clone()),
                        from.clone(),
                        target,
                        payload.clone(),
                        Some(listener),
                    );
                }
            }
        }
    }

    /// The `to` an output of `sender` that is refused is logged with: as written, unless
    /// `sender` is a tenant's and the name is not a listener it may reach. The record is
    /// shown to whoever sees its `to`, so another tenant must not see (nor be handed a
    /// payload by way of) a refusal, malformed or undeliverable alike.
    fn shown_target(&self, sender: &Listener, to: Option<&str>) -> Option<Arc<str>> {
        let to = to?;
        let shown = sender.config.tenant.is_none()
            || self
                .topo()
                .listeners
                .get(to)
                .is_some_and(|l| sender.config.may_reach(&l.config, true));
        shown.then(|| Arc::from(to))
    }

    /// SPEC §6: `to` first, else broadcast by payload type; replies to the sender always
    /// allowed; peers enforced (deny-by-default for agents); the tenant boundary
    /// ([`crate::config::ListenerConfig::may_reach`]) enforced on every path, whatever the
    /// peers say. A tenant's listener is told the same of a listener out of its scope as of
    /// one that does not exist, and its errors name only listeners in its scope.
    pub(crate) fn route(
        &self,
        sender: &Listener,
        handled_from: &str,
        to: Option<&str>,
        payload_type: &PayloadType,
    ) -> Result<Targets, String> {
        let name = sender.name();
        let me = &sender.config;
        let tenant = me.tenant.as_deref();
        let topo = self.topo();
        match to {
            Some(target) => {
                let is_reply = target == handled_from;
                let found = topo.listeners.get(target);
                let reachable = found.filter(|t| is_reply || me.may_reach(&t.config, true));
                match (found, reachable) {
                    (None, _) if is_reply => {
                        Ok(smallvec::smallvec![Target::Terminal(Arc::from(target))])
                    }
                    (_, None) if tenant.is_some() => Err(format!(
                        "`{name}` sent to `{target}`: no listener in its scope has that name"
                    )),
                    (None, _) => Err(format!(
                        "`{name}` sent to `{target}`, which is not a listener"
                    )),
                    (Some(_), None) => Err(format!(
                        "`{name}` may not send to `{target}`: it belongs to a tenant"
                    )),
                    (_, Some(_)) if !is_reply && !sender.allows(target) => Err(format!(
                        "`{name}` may not send to `{target}`: not in its peers"
                    )),
                    (_, Some(t)) if !t.config.accepts_type(payload_type) => Err(format!(
                        "`{target}` does not accept payload type `{payload_type}`"
                    )),
                    (_, Some(t)) => Ok(smallvec::smallvec![Target::Listener(t.clone())]),
                }
            }
            None => {
                let accepting: Vec<&Arc<Listener>> = topo
                    .order
                    .iter()
                    .filter(|l| l.config.accepts_type(payload_type))
                    .filter(|l| {
                        l.name() == handled_from || me.may_reach(&l.config, me.names_peer(l.name()))
                    })
                    .collect();
                if accepting.is_empty() {
                    return Err(match tenant {
                        Some(_) => format!(
                            "no listener in the scope of `{name}` accepts payload type `{payload_type}`"
                        ),
                        None if topo.order.iter().any(|l| l.config.accepts_type(payload_type)) => {
                            format!(
                                "only tenants' listeners accept payload type `{payload_type}`, none \
                                 of them `shared` or in the peers of `{name}`"
                            )
                        }
                        None => format!("no listener accepts payload type `{payload_type}`"),
                    });
                }
                let allowed: Targets = accepting
                    .iter()
                    .filter(|l| l.name() == handled_from || sender.allows(l.name()))
                    .map(|l| Target::Listener((*l).clone()))
                    .collect();
                if allowed.is_empty() {
                    let names: Vec<&str> = accepting.iter().map(|l| l.name()).collect();
                    return Err(format!(
                        "payload type `{payload_type}` is accepted only by {}, not peers of `{name}`",
                        names.join(", ")
                    ));
                }
                Ok(allowed)
            }
        }
    }

    /// Validates against the target's schema, logs, and queues (or ends, for a terminal).
    pub(crate) fn deliver(
        self: &Arc<Self>,
        thread: &Arc<str>,
        parent_id: Option<Arc<str>>,
        from: Arc<str>,
        target: Target,
        payload: NormalizedPayload,
        sender: Option<&Arc<Listener>>,
    ) {
        let listener = match target {
            Target::Terminal(to) => {
                let m = NewMessage {
                    origin: Origin::implied(parent_id.as_ref(), &from),
                    id: crate::threads::new_id(),
                    parent_id,
                    from,
                    to: Some(to),
                    payload_type: Some(payload.payload_type.written()),
                    payload_xml: payload.xml,
                    status: MessageStatus::Terminal,
                    error: None,
                };
                if let Some(record) = self.append(thread, m) {
                    self.after_append(&record, sender);
                }
                return;
            }
            Target::Listener(l) => l,
        };
        let checked = match listener.config.schema_for(&payload.payload_type) {
            Some(schema) => schema.validate(payload.clone()).map_err(|e| e.to_string()),
            None => Err(format!(
                "`{}` does not accept `{}`",
                listener.name(),
                payload.payload_type
            )),
        };
        // The payload type's text is made where a record needs it: `admit` makes it for an
        // accepted payload, so the hot path formats it once.
        match checked {
            Ok(valid) => {
                let admission = Admission {
                    parent_id,
                    from,
                    valid,
                    approval: None,
                    id: None,
                    origin: None,
                };
                match self.admit(thread, &listener, admission) {
                    Ok(Admitted::NotQueued(record) | Admitted::Refused(record, _)) => {
                        self.after_append(&record, sender)
                    }
                    Ok(Admitted::Queued(_)) | Err(_) => {}
                }
            }
            Err(reason) => {
                let payload_type = payload.payload_type.written();
                let m = NewMessage {
                    origin: Origin::implied(parent_id.as_ref(), &from),
                    id: crate::threads::new_id(),
                    parent_id,
                    from,
                    to: Some(listener.config.name.arc()),
                    payload_type: Some(payload_type.clone()),
                    payload_xml: payload.xml,
                    status: MessageStatus::Rejected,
                    error: Some(format!(
                        "payload `{payload_type}` is invalid for `{}`: {reason}",
                        listener.name()
                    )),
                };
                if let Some(record) = self.append(thread, m) {
                    self.after_append(&record, sender);
                }
            }
        }
    }

    /// Publishes a just-logged message that is not queued, and reports it if it failed.
    fn after_append(self: &Arc<Self>, record: &MessageRecord, sender: Option<&Arc<Listener>>) {
        let kind = match record.status {
            MessageStatus::Rejected => Some(FailureKind::Invalid),
            MessageStatus::Failed => Some(FailureKind::Budget),
            MessageStatus::Killed => Some(FailureKind::Killed),
            _ => None,
        };
        match kind {
            Some(kind) => self.report(record, kind, sender),
            None => {
                self.events.publish(EventKind::Message {
                    message: record.clone(),
                });
            }
        }
    }

    /// Logs a refused output of a listener in `parent`'s thread (or, when the thread is
    /// gone, makes a record of it for the report alone).
    fn log_refused(&self, parent: &MessageRecord, refusal: Refusal) -> MessageRecord {
        let Refusal {
            from,
            to,
            payload_type,
            payload_xml,
            status,
            error,
        } = refusal;
        let error = self.clip_error(error);
        let m = NewMessage {
            origin: Origin::implied(Some(&parent.id), &from),
            id: crate::threads::new_id(),
            parent_id: Some(parent.id.clone()),
            from,
            to,
            payload_type,
            payload_xml,
            status,
            error: Some(error.clone()),
        };
        self.append(&parent.thread_id, m).unwrap_or_else(|| {
            MessageRecord::new(
                MessageCore {
                    id: crate::threads::new_id(),
                    thread_id: parent.thread_id.clone(),
                    parent_id: Some(parent.id.clone()),
                    slot_index: 0,
                    from: Arc::from(SYSTEM_IDENTITY),
                    to: None,
                    payload_type: None,
                    payload_xml: SharedXml::default(),
                    timestamp: crate::time::Timestamp::now(),
                    origin: Origin::implied(Some(&parent.id), SYSTEM_IDENTITY),
                },
                status,
                Some(error),
            )
        })
    }

    fn append(&self, thread: &str, m: NewMessage) -> Option<MessageRecord> {
        self.threads.append(thread, m).ok()
    }

    /// The failure path for a message already in the log: counter, `message` event, `error`
    /// event, and a `<huh>` to the sending listener if it accepts one.
    pub(crate) fn report(
        self: &Arc<Self>,
        record: &MessageRecord,
        kind: FailureKind,
        sender: Option<&Arc<Listener>>,
    ) {
        self.count_failure(kind);
        self.events.publish(EventKind::Message {
            message: record.clone(),
        });
        let error = record
            .error
            .clone()
            .unwrap_or_else(|| kind.as_str().to_string());
        self.say_error(Some(&record.thread_id), sender.map(|s| s.name()), error);
        if kind != FailureKind::Killed {
            if let Some(sender) = sender {
                self.send_huh(sender, record, kind);
            }
        }
    }

    /// Tells a sending listener that accepts `huh` that its message failed.
    fn send_huh(self: &Arc<Self>, to: &Arc<Listener>, about: &MessageRecord, kind: FailureKind) {
        let generic = match kind {
            FailureKind::Undeliverable => GENERIC_UNDELIVERABLE,
            FailureKind::Invalid | FailureKind::Malformed => "rejected: invalid payload",
            FailureKind::Budget => "thread budget exceeded",
            _ => "handler failed",
        };
        self.send_huh_saying(to, about, generic);
    }

    /// Whether `to` takes a `<huh>` about `about` (it lists `huh`, and `about` is not one).
    pub(crate) fn wants_huh(to: &Listener, about: &MessageRecord) -> bool {
        let huh = PayloadType::huh();
        about.payload_type.as_deref() != Some(huh.to_string().as_str())
            && to.config.accepts_type(&huh)
    }

    /// Sends `to` a `<huh>` about `about` with the text `generic` (never the error itself,
    /// which may name what `to` may not see), if it takes one.
    pub(crate) fn send_huh_saying(
        self: &Arc<Self>,
        to: &Arc<Listener>,
        about: &MessageRecord,
        generic: &str,
    ) {
        if !Self::wants_huh(to, about) {
            return;
        }
        let xml = format!(
            "<huh xmlns=\"{SYSTEM_NS}\"><error>{}</error><payload_type>{}</payload_type><message_id>{}</message_id></huh>",
            escape_text(generic),
            escape_text(about.payload_type.as_deref().unwrap_or("")),
            escape_text(&about.id),
        );
        if let Ok(payload) = normalize_payload(&xml, &self.xml_limits) {
            self.deliver(
                &about.thread_id,
                Some(about.id.clone()),
                Arc::from(SYSTEM_IDENTITY),
                Target::Listener(to.clone()),
                payload,
                None,
            );
        }
    }

    /// Sets a handled message's final status and publishes it.
    pub(crate) fn finish_message(
        &self,
        record: &MessageRecord,
        status: MessageStatus,
        error: Option<String>,
    ) {
        let error = error.map(|e| self.clip_error(e));
        self.threads.set_message_status(
            &record.thread_id,
            record.slot_index,
            status,
            error.clone(),
        );
        self.events.publish(EventKind::MessageStatus {
            id: record.id.clone(),
            thread_id: record.thread_id.clone(),
            status,
            error,
            about: Some(StatusAbout::of(record)),
        });
    }

    /// A handler failed on `record`: status, counter, events, and `<huh>` to its sender.
    pub(crate) fn fail_message(
        self: &Arc<Self>,
        record: &MessageRecord,
        kind: FailureKind,
        error: String,
    ) {
        let error = self.clip_error(error);
        self.finish_message(record, MessageStatus::Failed, Some(error.clone()));
        self.count_failure(kind);
        self.say_error(Some(&record.thread_id), record.to.as_deref(), error);
        if let Some(sender) = self.topo().listeners.get(&*record.from).cloned() {
            let mut failed = record.clone();
            failed.status = MessageStatus::Failed;
            self.send_huh(&sender, &failed, kind);
        }
    }
}
