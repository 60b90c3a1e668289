//! What a tenant's credential is told of, and may name, among the agents: the reload
//! report and the problems of a change (its own tenant's listeners only), and the names it
//! may give new agents (its tenant's name and `-` first).

use super::auth::visible::Seen;
use super::view::ReloadReport;
use crate::pump::agents::{AgentChange, AgentError};

/// Keeps only the problems about `agent` for a tenant's credential: the rest are about the
/// operator's file, which a tenant may not read.
pub(super) fn for_caller(e: AgentError, seen: &Seen, agent: &str) -> AgentError {
    match e {
        AgentError::Invalid(problems) if !seen.scope.everything() => {
            let (mine, others): (Vec<_>, Vec<_>) = problems
                .into_iter()
                .partition(|p| p.listener.as_deref() == Some(agent));
            let mut shown = mine;
            if !others.is_empty() {
                shown.push(crate::config::diff::ReloadProblem {
                    line: None,
                    listener: None,
                    key: None,
                    message: "the organism's own configuration does not load at the moment; \
                              an operator must fix it"
                        .into(),
                });
            }
            AgentError::Invalid(shown)
        }
        other => other,
    }
}

/// The reload report of a change of agent `name`, its lists holding only the listeners the
/// caller sees (a tenant's credential is not told other listeners' names).
pub(super) fn report_for(name: &str, c: &AgentChange, seen: &Seen) -> ReloadReport {
    let mut reload = ReloadReport::from(&c.report);
    if !seen.scope.everything() {
        for list in [
            &mut reload.added,
            &mut reload.removed,
            &mut reload.changed,
            &mut reload.unchanged,
        ] {
            list.retain(|l| l == name || seen.scope.sees(l));
        }
    }
    reload
}

/// Names are the organism's: a tenant's begin with its name, so that no tenant takes a name
/// another would choose, nor learns that one is taken (told before it is looked up). The
/// refusal of `name` for `seen`'s tenant, if it is one.
pub(super) fn foreign_name(seen: &Seen, name: &str) -> Option<AgentError> {
    let mine = seen.principal.tenant.as_deref()?;
    let prefix = format!("{mine}-");
    (!name.starts_with(&prefix)).then(|| {
        AgentError::Invalid(vec![crate::config::diff::ReloadProblem {
            line: None,
            listener: Some(name.to_string()),
            key: Some("name".into()),
            message: format!(
                "an agent a credential of tenant `{mine}` creates has a name that begins with \
                 `{prefix}`"
            ),
        }])
    })
}
