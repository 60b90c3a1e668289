//! The listeners created through the API (`POST /api/v1/agents`), laid over the organism
//! file's: each is a listener item as the file would hold it (its `script` the path of its
//! live version's text), checked by the same code as the file's, plus the rules that hold
//! only for them: no name the file defines too, and each tenant's quotas. (The tenant
//! boundary itself holds for every listener: `tenant.rs`.)

pub use super::model::LayerListener;
use super::model::{ListenerConfig, ListenerOrigin, ListenerSection, Tenants};
use super::Collector;

/// Each tenant's agents against its quotas (`tenants:`): their number, their scripts' size,
/// their per-call limits and concurrency. Each breach names the quota and its value.
fn check_quotas(
    layer: &[LayerListener],
    listeners: &[ListenerConfig],
    tenants: &Tenants,
    c: &mut Collector,
) {
    let mut counts: std::collections::HashMap<&str, usize> = Default::default();
    for l in layer {
        let Some(me) = listeners.iter().find(|x| x.name.as_str() == l.name()) else {
            continue;
        };
        let Some(tenant) = me.tenant.as_deref() else {
            continue;
        };
        let (q, key) = tenants.of(tenant);
        let name = l.name();
        let n = counts.entry(tenant).or_default();
        *n += 1;
        if *n > q.max_agents {
            c.push(
                Some(name),
                None,
                format!(
                    "tenant `{tenant}` may have {} agents ({key}.max_agents)",
                    q.max_agents
                ),
            );
        }
        // A Lua agent's script, or an LLM agent's system prompt.
        let prompt = me.llm.as_ref().and_then(|l| match &l.system {
            super::llm::SystemPrompt::File(p) => Some(p),
            super::llm::SystemPrompt::Inline(_) => None,
        });
        let bytes = me
            .script
            .as_ref()
            .or(prompt)
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len() as usize);
        if bytes > q.max_script_bytes {
            c.push(
                Some(name),
                Some("script"),
                format!(
                    "is {bytes} bytes; {key}.max_script_bytes is {}",
                    q.max_script_bytes
                ),
            );
        }
        if me.lua_limits.cpu_ms > q.cpu_ms_max {
            c.push(
                Some(name),
                Some("limits"),
                format!(
                    "cpu_ms {} is over {key}.cpu_ms_max ({})",
                    me.lua_limits.cpu_ms, q.cpu_ms_max
                ),
            );
        }
        if me.lua_limits.memory_mb > q.memory_mb_max {
            c.push(
                Some(name),
                Some("limits"),
                format!(
                    "memory_mb {} is over {key}.memory_mb_max ({})",
                    me.lua_limits.memory_mb, q.memory_mb_max
                ),
            );
        }
        if me.concurrency > q.max_concurrency {
            c.push(
                Some(name),
                Some("concurrency"),
                format!(
                    "{} is over {key}.max_concurrency ({})",
                    me.concurrency, q.max_concurrency
                ),
            );
        }
    }
}

/// Appends the layer's items to the file's listener sections; a name the file defines too
/// is an error naming both.
pub(super) fn lay_over(
    layer: &[LayerListener],
    sections: &mut Vec<ListenerSection>,
    written_names: &mut Vec<String>,
    c: &mut Collector,
) {
    for l in layer {
        let name = l.name().to_string();
        if written_names.contains(&name) {
            c.push(
                Some(&name),
                Some("name"),
                format!(
                    "is defined in the organism file and was created through the API (version {}); \
                     rename the file's listener, or delete the API's (DELETE /api/v1/agents/{name})",
                    l.version
                ),
            );
            continue;
        }
        written_names.push(name.clone());
        let item = match yaml_serde::to_value(&l.item) {
            Ok(v) => v,
            Err(e) => {
                c.push(Some(&name), None, format!("not a listener definition: {e}"));
                continue;
            }
        };
        for (path, key) in super::secret::literals(&item) {
            c.push(
                Some(&name),
                Some(&path),
                format!("holds a secret; an agent created through the API may not (`{key}`)"),
            );
        }
        match super::read::read::<ListenerSection>(&item) {
            Ok(s) => sections.push(s),
            Err(e) => c.push(Some(&name), e.key.as_deref(), e.message),
        }
    }
}

/// Marks the layer's listeners with their origin and checks what holds only for them.
pub(super) fn mark_and_check(
    layer: &[LayerListener],
    listeners: &mut [ListenerConfig],
    tenants: &Tenants,
    c: &mut Collector,
) {
    check_quotas(layer, listeners, tenants, c);
    for l in layer {
        if let Some(x) = listeners.iter_mut().find(|x| x.name.as_str() == l.name()) {
            x.origin = ListenerOrigin::Api { version: l.version };
        }
    }
}
