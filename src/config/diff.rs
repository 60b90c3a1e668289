//! What a reload changes: the report of it, the reasons to refuse it, and the comparisons it
//! is decided on. Pure data, as the rest of `config`: the pump's reload (`pump/reload.rs`)
//! builds, swaps and hands over.

use super::{ListenerConfig, OrganismConfig};

/// What a reload changed. Also the body of the `reload` event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// The config revision now running.
    pub rev: u64,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
}

/// One reason a reload was refused: the listener and key it is about, when it is about one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadProblem {
    /// The line of the organism file it is at, when it is in the file.
    pub line: Option<usize>,
    pub listener: Option<String>,
    pub key: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ReloadProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(n) = self.line {
            write!(f, "line {n}: ")?;
        }
        if let Some(l) = &self.listener {
            write!(f, "listener `{l}`: ")?;
        }
        if let Some(k) = &self.key {
            write!(f, "key `{k}`: ")?;
        }
        f.write_str(&self.message)
    }
}

/// What a listener is built from, as text: equal fingerprints, equal listeners.
pub fn fingerprint(l: &ListenerConfig) -> String {
    let schemas: Vec<String> = l
        .accepts
        .iter()
        .map(|(t, s)| format!("{t}={}", s.xsd()))
        .collect();
    let script = l
        .script
        .as_ref()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default());
    let external = l.external.as_ref().map(|e| {
        (
            e.input_url.clone(),
            e.token.clone(),
            e.timeout,
            e.reply_timeout,
        )
    });
    format!(
        "{:?}",
        (
            (
                &l.description,
                l.kind.to_string(),
                &l.handler,
                l.agent,
                &l.tenant,
                l.shared,
                l.placement
            ),
            (&l.peers, l.concurrency, l.config.to_string()),
            (
                &l.script,
                script,
                l.lua_limits.cpu_ms,
                l.lua_limits.memory_mb
            ),
            schemas,
            external,
            &l.approval,
            &l.human,
            &l.llm,
        )
    )
}

/// Settings read once at start: a change to any of them is refused.
pub fn needs_restart(old: &OrganismConfig, new: &OrganismConfig) -> Vec<ReloadProblem> {
    let mut out = Vec::new();
    let mut check = |key: &str, same: bool| {
        if !same {
            out.push(ReloadProblem {
                line: None,
                listener: None,
                key: Some(key.to_string()),
                message: "changing it needs a restart".to_string(),
            });
        }
    };
    check("organism.name", old.name == new.name);
    check("organism.listen", old.listen == new.listen);
    check("organism.store", old.store == new.store);
    check("organism.scheduling", old.scheduling == new.scheduling);
    check("limits", old.limits == new.limits);
    check("auth", old.auth == new.auth);
    check("organism.tls", old.tls == new.tls);
    check("organism.nats", old.nats == new.nats);
    out
}

/// Whether two configs whose listeners are all unchanged describe the same organism: the
/// settings a reload may change (the rest need a restart) and the listeners' order.
pub fn same_settings(old: &OrganismConfig, new: &OrganismConfig) -> bool {
    old.retention == new.retention
        && old.tenants == new.tenants
        && old.allowed_origins == new.allowed_origins
        && old.allowed_hosts == new.allowed_hosts
        && old
            .listeners
            .iter()
            .map(|l| &l.name)
            .eq(new.listeners.iter().map(|l| &l.name))
}
