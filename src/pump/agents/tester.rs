//! Test vectors' runner: a version of an API agent built apart from the running organism
//! (its own sandboxes, the real schema gate, the running topology's routing), which runs
//! cases and says where each output would go. Nothing is delivered, logged or stored.

use super::{AgentError, NewVersion};
use crate::config::diff::ReloadProblem;
use crate::store::agents::{AgentRow, VersionRow};

/// Cases one test request may run.
pub const MAX_TEST_CASES: usize = 50;
/// How long one test request may run its cases; the rest are reported as not run.
pub const TEST_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// A version of an agent built to be tried, apart from the running organism: its own
/// sandboxes (their logs go nowhere), the real schema gate on what it receives and on what
/// it sends, and the running topology's routing to say where each output would go. Nothing
/// is delivered, logged or stored.
pub struct Tester {
    organism: crate::pump::Organism,
    name: String,
    listener: crate::config::ListenerConfig,
    config: std::sync::Arc<crate::config::OrganismConfig>,
    handler: Tried,
}

/// The handler a version is tried with.
enum Tried {
    Lua(crate::lua::LuaHandler),
    /// Its calls to the model are held against budgets and accounted like any (a test
    /// costs what it costs); its deltas are published as the listener's.
    Llm(crate::llm::LlmHandler),
}

impl Tried {
    async fn measured(
        &self,
        d: crate::listener::Delivery,
    ) -> (crate::listener::HandlerResult, Option<crate::lua::Cost>) {
        match self {
            Tried::Lua(h) => h.measured(d).await,
            Tried::Llm(h) => (crate::listener::Handler::handle(h, d).await, None),
        }
    }
}

/// What one case did.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    /// The handler's outputs as it returned them: [`Tester::output`] says where each would
    /// go, one at a time, so a caller holds one output's copies at once.
    pub outputs: Vec<crate::listener::Output>,
    /// Why the payload was refused, or the handler failed.
    pub error: Option<String>,
    /// Wall time of the handler call.
    pub elapsed_ms: f64,
    /// What the call cost in its sandbox (none if the handler did not run).
    pub cost: Option<crate::lua::Cost>,
}

/// One output of a case: where the organism would deliver it, its type, its text, and why
/// it would be refused, if it would.
#[derive(Debug, Clone)]
pub struct TestOutput {
    pub to: Vec<String>,
    pub payload_type: Option<String>,
    pub payload_xml: String,
    /// As JSON, typed by the first receiver's schema (untyped without one).
    pub payload: serde_json::Value,
    pub error: Option<String>,
}

impl super::Uploads<'_> {
    /// Builds version `version` of the API agent `name` to be tried (compiled, `init` run):
    /// blocking, as a reload's build is.
    pub fn prepare_test(&self, name: &str, version: u64) -> Result<Tester, AgentError> {
        let (agent, row) = self.api_agent_version(name, version)?;
        self.tester_for(&agent, &row)
    }

    /// A version about to be uploaded, checked (as an upload is) and built to be tried, but
    /// not kept (`?dry_run=true`); its texts' copies are removed once it is built.
    pub fn preview_version(
        &self,
        name: &str,
        new: NewVersion,
        author: Option<String>,
    ) -> Result<(VersionRow, Tester), AgentError> {
        let agents = self.api_agents();
        let agent = self.api_agent(name)?;
        let live = agents.table.version(name, agent.live_version)?;
        let version = agents.version_row(name, &new, live.as_ref(), &author)?;
        let tester = self.tester_for(&agent, &version);
        agents.forget_files(name, version.version);
        match tester {
            Ok(t) => Ok((version, t)),
            Err(AgentError::Invalid(p)) => Err(agents.refused(name, version.version, p)),
            Err(e) => Err(e),
        }
    }

    fn tester_for(&self, agent: &AgentRow, row: &VersionRow) -> Result<Tester, AgentError> {
        let agents = self.api_agents();
        let name = agent.name.as_str();
        let mut tried = agent.clone();
        tried.live_version = row.version;
        let layer = agents.layer(Some((name, Some((&tried, row)))))?;
        let path = self
            .organism
            .config()
            .source
            .clone()
            .ok_or(AgentError::NoSource)?;
        let config = crate::pump::load_config_layered(
            &path,
            &self.organism.shared.reloading.registry,
            &layer,
        )
        .map_err(|e| AgentError::Invalid(self.organism.shared.problems_of(e)))?;
        let listener = config
            .listener(name)
            .cloned()
            .ok_or_else(|| AgentError::NotFound(name.to_string()))?;
        let shared = &self.organism.shared;
        let max_bytes = shared.limits.max_message_bytes;
        let targets = crate::lua::OutputTargets::of(&config);
        let handler = if listener.llm.is_some() {
            crate::llm::LlmHandler::new(
                &listener,
                targets,
                max_bytes,
                shared.events.clone(),
                None,
                Some(shared.budgets.clone()),
            )
            .map(Tried::Llm)
        } else {
            let hub = std::sync::Arc::new(crate::events::EventHub::new(16));
            crate::lua::LuaHandler::build_with(&listener, max_bytes, targets, hub, None)
                .map(Tried::Lua)
        }
        .map_err(|message| {
            AgentError::Invalid(vec![ReloadProblem {
                line: None,
                listener: Some(name.to_string()),
                key: None,
                message: self.organism.shared.clip_error(message),
            }])
        })?;
        Ok(Tester {
            organism: self.organism.clone(),
            name: name.to_string(),
            listener,
            config: std::sync::Arc::new(config),
            handler,
        })
    }
}

impl Tester {
    /// Runs one case: `payload` is XML text, or a JSON object written as the payload type
    /// the agent accepts (`payload_type` when it accepts several).
    /// Every text it answers is bounded: errors by `limits.max_error_bytes`, an output
    /// that is not acceptable XML (too large, say) shown cut to the same bound.
    pub async fn run(
        &self,
        payload: &serde_json::Value,
        payload_type: Option<&str>,
    ) -> CaseOutcome {
        let mut outcome = self.run_unbounded(payload, payload_type).await;
        let shared = &self.organism.shared;
        outcome.error = outcome.error.map(|e| shared.clip_error(e));
        outcome
    }

    async fn run_unbounded(
        &self,
        payload: &serde_json::Value,
        payload_type: Option<&str>,
    ) -> CaseOutcome {
        let refused = |error: String| CaseOutcome {
            outputs: Vec::new(),
            error: Some(error),
            elapsed_ms: 0.0,
            cost: None,
        };
        let xml = match payload {
            serde_json::Value::String(xml) => xml.clone(),
            json => match crate::config::json_payload(&self.listener.accepts, payload_type, json) {
                Ok(xml) => xml,
                Err(crate::config::JsonPayloadError::Type(_)) => {
                    return refused(format!(
                        "`{}` does not accept payload type `{}` (say which with `payload_type`)",
                        self.name,
                        payload_type.unwrap_or("?")
                    ))
                }
                Err(crate::config::JsonPayloadError::Map(ty, e)) => {
                    return refused(format!(
                        "payload cannot be written as `{ty}` at {}: {}",
                        e.path, e.message
                    ))
                }
            },
        };
        let limits = &self.organism.shared.xml_limits;
        let normalized = match crate::xml::normalize_payload(&xml, limits) {
            Ok(p) => p,
            Err(e) => return refused(format!("payload: {e}")),
        };
        let ty = normalized.payload_type.clone();
        let Some(schema) = self.listener.schema_for(&ty) else {
            return refused(format!(
                "`{}` does not accept payload type `{ty}`",
                self.name
            ));
        };
        let payload = match schema.validate(normalized) {
            Ok(p) => p,
            Err(e) => return refused(format!("payload: {e}")),
        };
        let delivery = crate::listener::Delivery {
            meta: crate::listener::Meta {
                thread_id: std::sync::Arc::from("test"),
                message_id: std::sync::Arc::from("test-case"),
                from: std::sync::Arc::from(TEST_SENDER),
                own_name: self.listener.name.clone(),
                payload_type: ty,
                approval: None,
                settings: None,
            },
            payload,
        };
        let started = std::time::Instant::now();
        let (result, cost) = self.handler.measured(delivery).await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        match result {
            Err(e) => CaseOutcome {
                outputs: Vec::new(),
                error: Some(e.0),
                elapsed_ms,
                cost,
            },
            Ok(outputs) => CaseOutcome {
                outputs,
                error: None,
                elapsed_ms,
                cost,
            },
        }
    }

    /// Where an output would go and whether its receivers would take it: the organism's
    /// routing (as of now) and each receiver's schema in the tried config. Its error is cut
    /// at `limits.max_error_bytes`.
    pub fn output(&self, o: crate::listener::Output) -> TestOutput {
        let mut out = self.output_unbounded(o);
        out.error = out.error.map(|e| self.organism.shared.clip_error(e));
        out
    }

    fn output_unbounded(&self, o: crate::listener::Output) -> TestOutput {
        let limits = &self.organism.shared.xml_limits;
        let mut out = TestOutput {
            to: o.to.iter().cloned().collect(),
            payload_type: None,
            payload: serde_json::Value::Null,
            payload_xml: o.payload,
            error: None,
        };
        let normalized = match crate::xml::normalize_payload(&out.payload_xml, limits) {
            Ok(p) => p,
            Err(e) => {
                out.error = Some(format!("not acceptable XML: {e}"));
                let bound = self.organism.shared.limits.max_error_bytes;
                out.payload_xml = crate::clip::clip(std::mem::take(&mut out.payload_xml), bound);
                return out;
            }
        };
        let ty = normalized.payload_type.clone();
        out.payload_type = Some(ty.to_string());
        // Untyped until a receiver's schema types it, as the API would show it.
        out.payload = crate::schema::payload_json(None, &out.payload_xml);
        let receivers =
            match self
                .organism
                .route_preview(&self.name, TEST_SENDER, o.to.as_deref(), &ty)
            {
                Ok(r) => r,
                Err(reason) => {
                    out.error = Some(format!("undeliverable: {reason}"));
                    return out;
                }
            };
        out.to = receivers.iter().map(|r| r.to_string()).collect();
        for r in &receivers {
            let Some(schema) = self.config.listener(r).and_then(|l| l.schema_for(&ty)) else {
                continue; // a reply to the sender ends there
            };
            out.payload = crate::schema::payload_json(Some(schema), &out.payload_xml);
            if let Err(e) = schema.validate(normalized.clone()) {
                out.error = Some(format!("`{r}` would refuse it: {e}"));
                break;
            }
        }
        out
    }
}

/// The sender of every test case, and so the target of a reply.
pub const TEST_SENDER: &str = "test";
