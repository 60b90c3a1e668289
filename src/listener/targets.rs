//! Where a handler's JSON outputs go: each listener's accepted types and schemas, so an
//! output (a Lua table, an LLM's tool call) is written as its receiver's XML in schema order.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value as Json;

use crate::config::{choose_type, NoType, OrganismConfig};
use crate::schema::Schema;
use crate::xml::PayloadType;

/// Where handlers' JSON outputs can go (Lua's, an LLM's tool calls), shared by every such
/// listener of an organism and replaced by a reload, so an unchanged listener resolves
/// outputs against the listeners now in service.
#[derive(Default)]
pub struct OutputTargets(RwLock<Arc<Targets>>);

impl OutputTargets {
    pub fn of(config: &OrganismConfig) -> Arc<OutputTargets> {
        Arc::new(OutputTargets(RwLock::new(Arc::new(Targets::of(config)))))
    }

    /// Points every listener using it at `config`'s listeners.
    pub fn set(&self, config: &OrganismConfig) {
        let next = Arc::new(Targets::of(config));
        *crate::sync::write(&self.0) = next;
    }

    fn current(&self) -> Arc<Targets> {
        crate::sync::read(&self.0).clone()
    }

    /// The listeners now in service, as configured (an LLM's tools are made from them).
    pub fn listeners(&self) -> Arc<Vec<crate::config::ListenerConfig>> {
        self.current().configs.clone()
    }

    /// A JSON output of type `ty` for `to` written as XML: by the receiver's schema, in its
    /// element order, or (a receiver that is not a listener, a type no listener accepts)
    /// untyped. Also the schema that will check it, when one is known. The pump validates
    /// it again whatever this says.
    pub fn write(
        &self,
        to: Option<&str>,
        ty: Option<&str>,
        payload: &Json,
    ) -> Result<(String, Option<Arc<Schema>>), String> {
        let (root, schema) = self.current().resolve(to, ty)?;
        let written = match &schema {
            Some(s) => s.json_to_payload(&root, payload),
            None => crate::schema::SchemaModel::untyped_json_to_xml(&root, payload),
        };
        written.map(|xml| (xml, schema)).map_err(|e| {
            format!(
                "cannot write `{root}`: {}",
                e.to_string().replacen("payload", "output", 1)
            )
        })
    }
}

/// Where outputs can go: every listener's accepted types and schemas.
#[derive(Clone, Default)]
struct Targets {
    listeners: HashMap<String, Vec<(PayloadType, Arc<Schema>)>>,
    configs: Arc<Vec<crate::config::ListenerConfig>>,
}

impl Targets {
    fn of(config: &OrganismConfig) -> Self {
        Targets {
            listeners: config
                .listeners
                .iter()
                .map(|l| (l.name.to_string(), l.accepts.clone()))
                .collect(),
            configs: Arc::new(config.listeners.clone()),
        }
    }

    /// The schema and payload type an output of `ty` to `to` is written with.
    fn resolve(
        &self,
        to: Option<&str>,
        ty: Option<&str>,
    ) -> Result<(String, Option<Arc<Schema>>), String> {
        if let Some(accepts) = to.and_then(|t| self.listeners.get(t)) {
            return match choose_type(accepts, ty) {
                Ok((t, s)) => Ok((t.local_name().to_string(), Some(s.clone()))),
                // Written as asked; the gate refuses it with the receiver's reason.
                Err(NoType::NotAccepted) => Ok((ty.unwrap_or_default().to_string(), None)),
                Err(NoType::Ambiguous) => {
                    let huh = PayloadType::huh();
                    Err(format!(
                        "say which payload `type` (`{}` accepts: {})",
                        to.unwrap_or_default(),
                        accepts
                            .iter()
                            .filter(|(t, _)| *t != huh)
                            .map(|(t, _)| t.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            };
        }
        let w = ty.ok_or("an output without a listener `to` needs a payload `type`")?;
        for accepts in self.listeners.values() {
            if let Some((t, s)) = accepts.iter().find(|(t, _)| t.is_named(w)) {
                return Ok((t.local_name().to_string(), Some(s.clone())));
            }
        }
        Ok((w.to_string(), None))
    }
}
