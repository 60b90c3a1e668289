//! Agents created through the API: a layer of Lua and LLM listeners over the organism
//! file's, kept in the store (`store::agents`), each change made live by the reload
//! machinery. A version's text is a Lua agent's script or an LLM agent's system prompt.
//!
//! - **One code path.** An agent is a listener item of the file's shape; its live version's
//!   script (and XSD, if it has one) is written to a file under the organism's agents
//!   directory (`<store>.agents/`, or a temporary one with `store: memory`) and the item
//!   names it, so config loading checks it exactly as a file listener, and a reload builds
//!   it beside the running organism and swaps (SPEC §12): in-flight calls finish on the old
//!   version, queued messages go to the new one.
//! - **Under the reload lock.** A change (create, deploy, delete) is prepared with the new
//!   layer, kept in the store, then applied, all under the lock every reload takes; a change
//!   that does not load, or cannot be kept, changes nothing.
//! - **Uploads are checked by building.** A new version is prepared beside the running
//!   organism (its script compiled, `init` run, its schema compiled) and thrown away.

use std::path::{Path, PathBuf};

use crate::config::diff::ReloadProblem;
use crate::config::layer::LayerListener;
use crate::store::agents::{AgentRow, AgentTable, DeploymentRow, VersionRow};
use crate::store::StoreError;
use crate::time::Timestamp;

mod check;
mod tester;
pub use tester::{CaseOutcome, TestOutput, Tester, MAX_TEST_CASES, TEST_BUDGET, TEST_SENDER};

/// The longest script an agent's version may have.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;
/// The longest XSD text a version may carry.
pub const MAX_XSD_BYTES: usize = 256 * 1024;
pub use crate::store::agents::MAX_VERSIONS;

/// The API's agents of one organism: their table, and where their live texts are written.
pub(crate) struct ApiAgents {
    table: AgentTable,
    dir: PathBuf,
    /// Removed with the organism: a temporary directory (`store: memory`).
    temporary: bool,
}

impl Drop for ApiAgents {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Why an agent change was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error("no agent `{0}` created through the API")]
    NotFound(String),
    #[error("`{0}` is defined in the organism file; only agents created through the API can be changed here")]
    FileListener(String),
    #[error("a listener named `{0}` exists already")]
    Exists(String),
    #[error("agent `{agent}` has no version {version}")]
    NoVersion { agent: String, version: u64 },
    #[error("{0}")]
    Bad(String),
    #[error("refused, the running organism is unchanged: {}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<ReloadProblem>),
    #[error("the running config is revision {actual}, not {expected}")]
    RevMismatch { expected: u64, actual: u64 },
    #[error("the organism was not loaded from a file, so agents cannot be added to it")]
    NoSource,
    #[error("the organism is stopping")]
    Stopping,
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl From<super::ReloadError> for AgentError {
    fn from(e: super::ReloadError) -> Self {
        match e {
            super::ReloadError::RevMismatch { expected, actual } => {
                AgentError::RevMismatch { expected, actual }
            }
            super::ReloadError::NoSource => AgentError::NoSource,
            super::ReloadError::Stopping => AgentError::Stopping,
            super::ReloadError::Refused(problems) => AgentError::Invalid(problems),
        }
    }
}

/// A new agent: its listener fields (as the file would hold them, without `script`,
/// `fields`, `schema` and `config`) and its first version.
#[derive(Debug, Clone)]
pub struct NewAgent {
    pub name: String,
    pub tenant: Option<String>,
    pub definition: serde_json::Value,
    pub version: NewVersion,
}

/// A script version to keep.
#[derive(Debug, Clone, Default)]
pub struct NewVersion {
    pub script: String,
    pub message: Option<String>,
    /// New `fields`, XSD or config; absent ones are the live version's.
    pub fields: Option<serde_json::Value>,
    pub xsd: Option<String>,
    pub config: Option<serde_json::Value>,
    /// Test cases to keep with it (JSON, as the test route takes them).
    pub cases: Option<serde_json::Value>,
}

/// What a change did: the reload's report, and the versions involved.
#[derive(Debug, Clone)]
pub struct AgentChange {
    pub report: crate::config::diff::ReloadReport,
    pub version: Option<u64>,
    pub from_version: Option<u64>,
}

/// Whether `agent` is a `kind: llm` agent (its definition says so; else it is Lua).
pub fn is_llm(agent: &AgentRow) -> bool {
    agent
        .definition
        .get("kind")
        .and_then(serde_json::Value::as_str)
        == Some("llm")
}

impl ApiAgents {
    /// The agents of the organism `config` describes: its store file's, or (with `store:
    /// memory`) an empty set for this process.
    pub(crate) fn for_config(config: &crate::config::OrganismConfig) -> Result<Self, StoreError> {
        match &config.store {
            Some(path) => Ok(ApiAgents {
                table: AgentTable::open(path)?,
                dir: agents_dir(path),
                temporary: false,
            }),
            None => Ok(ApiAgents {
                table: AgentTable::memory()?,
                dir: std::env::temp_dir().join(format!(
                    "agentserver-agents-{}-{}",
                    std::process::id(),
                    Timestamp::now().0
                )),
                temporary: true,
            }),
        }
    }

    /// Where version `version`'s text of kind `ext` (`lua`, `md` for an LLM's system prompt,
    /// `xsd`) of `agent` is written.
    fn file(&self, agent: &str, version: u64, ext: &str) -> PathBuf {
        let key = crate::hash::sha256_hex(agent.as_bytes());
        self.dir.join(format!("{}-v{version}.{ext}", &key[..16]))
    }

    /// Problems of a version that did not load, in the words of its author: `script v3`
    /// where the loader named this server's copy; and the copies of a version that is not
    /// kept, removed.
    fn refused(&self, agent: &str, version: u64, problems: Vec<ReloadProblem>) -> AgentError {
        let mut shown = problems;
        for ext in ["lua", "md", "xsd"] {
            let path = self.file(agent, version, ext);
            let label = match ext {
                "lua" => format!("script v{version}"),
                "md" => format!("system prompt v{version}"),
                _ => format!("xsd v{version}"),
            };
            for p in &mut shown {
                p.message = p.message.replace(&path.display().to_string(), &label);
            }
        }
        AgentError::Invalid(shown)
    }

    fn forget_files(&self, agent: &str, version: u64) {
        for ext in ["lua", "md", "xsd"] {
            let _ = std::fs::remove_file(self.file(agent, version, ext));
        }
    }

    /// Writes `text` under the agents directory as `<agent>-v<version>.<ext>` (once: versions
    /// never change) and returns its path. Agent names may contain dots, so the file is
    /// named by a hash of the name.
    fn materialize(
        &self,
        agent: &str,
        version: u64,
        ext: &str,
        text: &str,
    ) -> Result<PathBuf, StoreError> {
        let fail = |e: std::io::Error| StoreError {
            path: self.dir.display().to_string(),
            message: format!("cannot write an agent's {ext}: {e}"),
            timed_out: false,
        };
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let path = self.file(agent, version, ext);
        let same = std::fs::read_to_string(&path).is_ok_and(|t| t == text);
        if !same {
            let tmp = path.with_extension(format!("{ext}.tmp"));
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(fail)?;
        }
        Ok(path)
    }

    /// The listener item of `agent` running `version`.
    fn item(&self, agent: &AgentRow, version: &VersionRow) -> Result<LayerListener, StoreError> {
        let mut item = match &agent.definition {
            serde_json::Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        item.insert("name".into(), agent.name.clone().into());
        if let Some(t) = &agent.tenant {
            item.insert("tenant".into(), t.clone().into());
        }
        // A version's text is a Lua agent's script, or an LLM agent's system prompt.
        if is_llm(agent) {
            let text = self.materialize(&agent.name, version.version, "md", &version.script)?;
            let file = serde_json::json!({"file": text.display().to_string()});
            item.insert("system".into(), file);
        } else {
            item.insert("kind".into(), "lua".into());
            let text = self.materialize(&agent.name, version.version, "lua", &version.script)?;
            item.insert("script".into(), text.display().to_string().into());
        }
        if let Some(f) = &version.fields {
            item.insert("fields".into(), f.clone());
        }
        if let Some(x) = &version.xsd {
            let schema = self.materialize(&agent.name, version.version, "xsd", x)?;
            item.insert("schema".into(), schema.display().to_string().into());
        }
        if let Some(c) = &version.config {
            item.insert("config".into(), c.clone());
        }
        Ok(LayerListener {
            item: serde_json::Value::Object(item),
            version: version.version,
        })
    }

    /// The layer as kept, with `change` made to it: `(name, Some((agent, version)))` puts
    /// that agent at that version, `(name, None)` takes it out.
    pub(crate) fn layer(
        &self,
        change: Option<(&str, Option<(&AgentRow, &VersionRow)>)>,
    ) -> Result<Vec<LayerListener>, StoreError> {
        let mut out = Vec::new();
        let mut changed = false;
        for a in self.table.agents()? {
            if let Some((name, to)) = change {
                if name == a.name {
                    changed = true;
                    if let Some((agent, version)) = to {
                        out.push(self.item(agent, version)?);
                    }
                    continue;
                }
            }
            let Some(v) = self.table.version(&a.name, a.live_version)? else {
                tracing::warn!(agent = %a.name, version = a.live_version, "an API agent's live version is missing; it is left out");
                continue;
            };
            out.push(self.item(&a, &v)?);
        }
        if let (false, Some((_, Some((agent, version))))) = (changed, change) {
            out.push(self.item(agent, version)?);
        }
        Ok(out)
    }

    /// A new version row of `agent`, checked for size and form, numbered next.
    fn version_row(
        &self,
        agent: &str,
        v: &NewVersion,
        base: Option<&VersionRow>,
        author: &Option<String>,
    ) -> Result<VersionRow, AgentError> {
        check::check_version(v)?;
        let (fields, xsd) = match (&v.fields, &v.xsd) {
            (None, None) => (
                base.and_then(|b| b.fields.clone()),
                base.and_then(|b| b.xsd.clone()),
            ),
            (f, x) => (f.clone(), x.clone()),
        };
        Ok(VersionRow {
            agent: agent.to_string(),
            version: self.table.next_version(agent)?,
            sha256: crate::hash::sha256_hex(v.script.as_bytes()),
            author: author.clone(),
            created: Timestamp::now(),
            message: v.message.clone(),
            script: v.script.clone(),
            fields,
            xsd,
            config: v
                .config
                .clone()
                .or_else(|| base.and_then(|b| b.config.clone())),
            cases: v.cases.clone(),
        })
    }
}

impl super::Shared {
    /// Keeps the script each Lua listener of the file that `built` names (every one at
    /// start; those a reload added or changed) runs now as its newest version when it is not
    /// that already. Each new one is a `deployment` event (`file`). A store that cannot keep
    /// it is logged; the listener runs either way.
    pub(super) fn note_file_scripts(&self, built: impl Fn(&str) -> bool) {
        let topo = self.topo();
        let file_lua = topo.order.iter().filter(|l| {
            l.config.origin == crate::config::ListenerOrigin::File
                && l.config.kind == crate::config::ListenerKind::Lua
                && built(l.config.name.as_str())
        });
        for l in file_lua {
            let Some(script) = l.handler.script() else {
                continue;
            };
            let name = l.config.name.as_str();
            let path = l.config.script.as_ref().map(|p| p.display().to_string());
            let message = format!("loaded from {}", path.as_deref().unwrap_or("?"));
            let table = &self.reloading.agents.table;
            match table.note_file_script(name, &script, &message, Timestamp::now()) {
                Ok(Some((version, from_version))) => {
                    self.events.publish(crate::events::EventKind::Deployment {
                        agent: name.to_string(),
                        tenant: l.config.tenant.clone(),
                        action: "file".into(),
                        version: Some(version),
                        from_version,
                        author: None,
                        ok: true,
                        error: None,
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(listener = name, error = %e, "cannot keep the script's version")
                }
            }
        }
    }
}

impl super::Organism {
    /// The agents created through the API: listing, creating, uploading versions,
    /// deploying, deleting, and testing a version apart.
    pub fn uploads(&self) -> Uploads<'_> {
        Uploads { organism: self }
    }
}

/// The agents created through the API ([`Organism::uploads`](super::Organism::uploads)).
#[derive(Clone, Copy)]
pub struct Uploads<'a> {
    pub(super) organism: &'a super::Organism,
}

impl<'a> Uploads<'a> {
    fn api_agents(&self) -> &'a ApiAgents {
        &self.organism.shared.reloading.agents
    }

    /// The agents created through the API, oldest first.
    pub fn created_agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        self.api_agents().table.agents()
    }

    /// One agent created through the API.
    pub fn created_agent(&self, name: &str) -> Result<Option<AgentRow>, StoreError> {
        self.api_agents().table.agent(name)
    }

    /// An API agent's versions, newest first.
    pub fn agent_versions(&self, name: &str) -> Result<Vec<VersionRow>, StoreError> {
        self.api_agents().table.versions(name)
    }

    pub fn agent_version(
        &self,
        name: &str,
        version: u64,
    ) -> Result<Option<VersionRow>, StoreError> {
        self.api_agents().table.version(name, version)
    }

    /// An API agent's deployment history, newest first.
    pub fn agent_deployments(&self, name: &str) -> Result<Vec<DeploymentRow>, StoreError> {
        self.api_agents().table.deployments(name)
    }

    /// Publishes the `deployment` event of a change (done or refused) and passes its result on.
    fn announce<T>(
        &self,
        c: Announced<'_>,
        result: Result<T, AgentError>,
    ) -> Result<T, AgentError> {
        self.organism
            .shared
            .events
            .publish(crate::events::EventKind::Deployment {
                agent: c.agent.to_string(),
                tenant: c.tenant.clone(),
                action: c.action.to_string(),
                version: c.version,
                from_version: c.from_version,
                author: c.author.clone(),
                ok: result.is_ok(),
                error: result
                    .as_ref()
                    .err()
                    .map(|e| self.organism.shared.clip_error(e.to_string())),
            });
        result
    }

    /// The API agent `name` and its version `version`.
    fn api_agent_version(
        &self,
        name: &str,
        version: u64,
    ) -> Result<(AgentRow, VersionRow), AgentError> {
        let agent = self.api_agent(name)?;
        let row = self
            .api_agents()
            .table
            .version(name, version)?
            .ok_or_else(|| AgentError::NoVersion {
                agent: name.to_string(),
                version,
            })?;
        Ok((agent, row))
    }

    /// The agent `name` as the API created it; a file listener, or nothing, is an error.
    fn api_agent(&self, name: &str) -> Result<AgentRow, AgentError> {
        match self.api_agents().table.agent(name)? {
            Some(a) => Ok(a),
            None if self.organism.config().listener(name).is_some() => {
                Err(AgentError::FileListener(name.to_string()))
            }
            None => Err(AgentError::NotFound(name.to_string())),
        }
    }

    /// Creates an agent (SPEC: agents created by API): checked as a file listener would be,
    /// built beside the running organism, kept, and swapped in. Version 1 is live.
    pub fn create_agent(
        &self,
        new: NewAgent,
        author: Option<String>,
    ) -> Result<AgentChange, AgentError> {
        let agents = self.api_agents();
        let row = AgentRow {
            name: new.name.clone(),
            tenant: new.tenant.clone(),
            definition: new.definition.clone(),
            live_version: 1,
            author: author.clone(),
            created: Timestamp::now(),
        };
        let done = self
            .change_layer(None, |current| {
                if current.listener(&new.name).is_some() || agents.table.agent(&new.name)?.is_some()
                {
                    return Err(AgentError::Exists(new.name.clone()));
                }
                let mut version = agents.version_row(&new.name, &new.version, None, &author)?;
                version.version = 1;
                let layer = agents.layer(Some((&new.name, Some((&row, &version)))))?;
                let keep = move || agents.table.create(&row, &version);
                Ok((layer, Box::new(keep) as Keep<'_>, Some(1), None))
            })
            .map_err(|e| match e {
                AgentError::Invalid(p) => {
                    agents.forget_files(&new.name, 1);
                    agents.refused(&new.name, 1, p)
                }
                other => other,
            });
        let announced = Announced {
            agent: &new.name,
            tenant: &new.tenant,
            action: "create",
            version: Some(1),
            from_version: None,
            author: &author,
        };
        self.announce(announced, done)
    }

    /// Keeps a new version of an API agent after building it beside the running organism
    /// (compiled, `init` run, schema compiled) and throwing that away. Not live until
    /// deployed.
    pub fn upload_version(
        &self,
        name: &str,
        new: NewVersion,
        author: Option<String>,
    ) -> Result<VersionRow, AgentError> {
        let agents = self.api_agents();
        let agent = self.api_agent(name)?;
        let live = agents.table.version(name, agent.live_version)?;
        let mut announced = Announced {
            agent: name,
            tenant: &agent.tenant,
            action: "upload",
            version: None,
            from_version: None,
            author: &author,
        };
        let version = match agents.version_row(name, &new, live.as_ref(), &author) {
            Ok(v) => v,
            Err(e) => return self.announce(announced, Err(e)),
        };
        announced.version = Some(version.version);
        let checked = agents
            .layer(Some((name, Some((&agent, &version)))))
            .map_err(AgentError::from)
            .and_then(|layer| self.check_layer(&layer))
            .and_then(|()| Ok(agents.table.add_version(&version)?));
        if let Err(e) = checked {
            agents.forget_files(name, version.version);
            let e = match e {
                AgentError::Invalid(p) => agents.refused(name, version.version, p),
                other => other,
            };
            return self.announce(announced, Err(e));
        }
        let keep = agent.tenant.as_deref().map_or(MAX_VERSIONS, |t| {
            self.organism
                .config()
                .tenants
                .of(t)
                .0
                .max_versions
                .clamp(1, MAX_VERSIONS)
        });
        if let Err(e) = agents.table.prune_versions(name, keep, agent.live_version) {
            tracing::warn!(agent = name, error = %e, "cannot forget old versions");
        }
        self.announce(announced, Ok(version))
    }

    /// Makes `version` of an API agent live: new messages go to it at once, calls in flight
    /// finish on the old one (a reload's guarantees). Deploying an older version is a
    /// rollback.
    pub fn deploy_version(
        &self,
        name: &str,
        version: u64,
        if_rev: Option<u64>,
        author: Option<String>,
    ) -> Result<AgentChange, AgentError> {
        let agents = self.api_agents();
        let (agent, row) = self.api_agent_version(name, version)?;
        let action = if version < agent.live_version {
            "rollback"
        } else {
            "deploy"
        };
        let from = agent.live_version;
        let done = self.change_layer(if_rev, |_| {
            let mut live = agent.clone();
            live.live_version = version;
            let layer = agents.layer(Some((name, Some((&live, &row)))))?;
            let keep = || {
                agents
                    .table
                    .deploy(name, version, action, &author, Timestamp::now())
                    .map(|_| ())
            };
            Ok((layer, Box::new(keep) as Keep<'_>, Some(version), Some(from)))
        });
        let announced = Announced {
            agent: name,
            tenant: &agent.tenant,
            action,
            version: Some(version),
            from_version: Some(from),
            author: &author,
        };
        self.announce(announced, done)
    }

    /// Removes an API agent as a reload removes a listener: calls in flight finish, queued
    /// messages become undeliverable.
    pub fn delete_agent(
        &self,
        name: &str,
        author: Option<String>,
    ) -> Result<AgentChange, AgentError> {
        let agents = self.api_agents();
        let agent = self.api_agent(name)?;
        let done = self.change_layer(None, |_| {
            let layer = agents.layer(Some((name, None)))?;
            let keep = || agents.table.delete(name, &author, Timestamp::now());
            Ok((
                layer,
                Box::new(keep) as Keep<'_>,
                None,
                Some(agent.live_version),
            ))
        });
        let announced = Announced {
            agent: name,
            tenant: &agent.tenant,
            action: "delete",
            version: None,
            from_version: Some(agent.live_version),
            author: &author,
        };
        self.announce(announced, done)
    }

    /// Prepares the organism with `layer` beside the running one and throws it away.
    fn check_layer(&self, layer: &[LayerListener]) -> Result<(), AgentError> {
        let s = &self.organism.shared;
        let turn = s.turn(None)?;
        s.prepare(&turn.current, &turn.path, layer)
            .map(drop)
            .map_err(AgentError::Invalid)
    }

    /// One change of the layer, under the reload lock: `plan` (given the running config)
    /// returns the new layer and how to keep it; the organism is prepared with it, the
    /// change kept, then applied.
    fn change_layer<'p>(
        &self,
        if_rev: Option<u64>,
        plan: impl FnOnce(&crate::config::OrganismConfig) -> Result<Plan<'p>, AgentError>,
    ) -> Result<AgentChange, AgentError> {
        let s = &self.organism.shared;
        let turn = s.turn(if_rev)?;
        let (layer, keep, version, from_version) = plan(&turn.current.config)?;
        let prepared = s
            .prepare(&turn.current, &turn.path, &layer)
            .map_err(AgentError::Invalid)?;
        keep()?;
        let report = s.apply(&turn.current, prepared);
        s.reloaded(&report);
        Ok(AgentChange {
            report,
            version,
            from_version,
        })
    }
}

/// What a `deployment` event says a change was.
struct Announced<'a> {
    agent: &'a str,
    tenant: &'a Option<String>,
    action: &'a str,
    version: Option<u64>,
    from_version: Option<u64>,
    author: &'a Option<String>,
}

/// How a planned change is kept in the store, once it has been prepared.
type Keep<'a> = Box<dyn FnOnce() -> Result<(), StoreError> + 'a>;
/// A planned change: the new layer, how to keep it, the version made live, the one before.
type Plan<'a> = (Vec<LayerListener>, Keep<'a>, Option<u64>, Option<u64>);

/// Where the live texts of a store file's API agents are written: `<store>.agents/`.
pub fn agents_dir(store: &Path) -> PathBuf {
    crate::store::beside(store, ".agents")
}
