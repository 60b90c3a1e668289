//! The checks of each section that loading runs: listeners (kinds, handlers, scripts,
//! schemas and their types, peers), external listeners, and the limits. Each problem is
//! collected, none stops the others.

use super::check_sections::env_secret;
use super::*;

/// The `external` keys: `input_url` (http or https, trusting the system's roots), `token_env` (a set variable),
/// `timeout_ms`, `reply_timeout` (seconds, or a duration like `300s`, `5m`).
pub(super) fn check_external(
    s: &ListenerSection,
    l: Option<&str>,
    c: &mut Collector,
) -> Option<ExternalConfig> {
    let before = c.errors.len();
    let input_url = match s.input_url.as_deref() {
        None => {
            c.push(
                l,
                Some("input_url"),
                "required: where this agent's deliveries are POSTed",
            );
            String::new()
        }
        Some(u) => {
            match reqwest::Url::parse(u) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
                Ok(_) => c.push(l, Some("input_url"), "must be an http:// or https:// URL"),
                Err(e) => c.push(l, Some("input_url"), format!("is not a URL: {e}")),
            }
            u.to_string()
        }
    };
    let token = s
        .token_env
        .as_deref()
        .and_then(|var| env_secret(var, l, "token_env", "the callback token", c));
    let timeout_ms = s.timeout_ms.unwrap_or(DEFAULT_EXTERNAL_TIMEOUT_MS);
    if timeout_ms == 0 {
        c.push(l, Some("timeout_ms"), "must be at least 1");
    }
    let reply_timeout = match &s.reply_timeout {
        None => Some(DEFAULT_REPLY_TIMEOUT),
        Some(yaml_serde::Value::Number(n)) => n.as_u64().map(std::time::Duration::from_secs),
        Some(yaml_serde::Value::String(t)) => parse_age(t),
        Some(_) => None,
    }
    .filter(|d| !d.is_zero());
    if reply_timeout.is_none() {
        c.push(
            l,
            Some("reply_timeout"),
            "must be seconds (300) or a duration like 300s, 5m, 500ms, greater than 0",
        );
    }
    (c.errors.len() == before).then(|| ExternalConfig {
        input_url,
        token_env: s.token_env.clone(),
        token,
        timeout: std::time::Duration::from_millis(timeout_ms),
        reply_timeout: reply_timeout.unwrap_or(DEFAULT_REPLY_TIMEOUT),
    })
}

/// The field a serde error is about (`unknown field `x``, `missing field `x``), if it says.
/// For serde's "unknown variant `x`": the key of `item` whose value is `x`.
pub(super) fn variant_key(item: &yaml_serde::Value, message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown variant `")?;
    let variant = rest.split('`').next()?;
    item.as_mapping()?
        .iter()
        .find(|(_, v)| v.as_str() == Some(variant))
        .and_then(|(k, _)| k.as_str().map(str::to_string))
}

pub(super) fn check_listeners(
    sections: &[ListenerSection],
    written_names: &[String],
    base: &Path,
    known: Known<'_>,
    models: &std::collections::BTreeMap<String, Arc<super::llm::ModelConfig>>,
    c: &mut Collector,
) -> Vec<ListenerConfig> {
    let names: HashSet<&str> = written_names.iter().map(String::as_str).collect();
    let mut seen = HashSet::new();
    let mut built = Vec::new();
    for s in sections {
        let name = s.name.as_str();
        let l = Some(name);
        if !seen.insert(name) {
            c.push(l, Some("name"), "another listener has the same name");
        }
        let description = check_identity(s, c);
        check_kind(s, known, c);
        let external = (s.kind == ListenerKind::External).then(|| check_external(s, l, c));
        let (script, lua_limits) = check_lua(s, base, known, c);
        check_keys_apply(s, c);
        let (accepts, schema_origin) = check_schema(s, base, c);
        let approval = super::approval::check_approval(s, &accepts, c);
        let human = super::approval::check_human(s, c);
        let llm = super::llm::check_llm(s, base, models, c);
        let peers = check_peers(s, &names, c);
        let (concurrency, config) = check_handler_config(s, &names, c);
        built.push(ListenerConfig {
            name: ListenerName::new(name),
            description,
            kind: s.kind,
            handler: s.handler.clone(),
            accepts,
            agent: s.agent,
            peers,
            concurrency: concurrency.max(1),
            config,
            schema_origin,
            script,
            lua_limits,
            external: external.flatten(),
            placement: check_placement(s, c),
            tenant: check_tenant(s, c),
            shared: s.shared,
            origin: ListenerOrigin::File,
            approval,
            human,
            llm,
        });
    }

    check_agent_types(&built, c);
    super::approval::check_escalations(&built, c);
    built
}

/// Whether `s` is a tenant's name: 1-64 letters, digits, `.`, `_` or `-` (the rule keys'
/// names follow too).
pub fn valid_tenant(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn check_tenant(s: &ListenerSection, c: &mut Collector) -> Option<String> {
    let t = s.tenant.as_deref()?;
    if !valid_tenant(t) {
        c.push(
            Some(s.name.as_str()),
            Some("tenant"),
            "must be 1-64 letters, digits, `.`, `_` or `-`",
        );
    }
    Some(t.to_string())
}

/// `placement: workers` is for handlers the worker binary can run (Lua and native); an
/// external agent is already remote.
fn check_placement(s: &ListenerSection, c: &mut Collector) -> Placement {
    if s.placement == Placement::Workers && s.kind == ListenerKind::External {
        c.push(
            Some(s.name.as_str()),
            Some("placement"),
            "an external agent already runs elsewhere: `placement: workers` is for `lua` and \
             `native` listeners",
        );
    }
    s.placement
}

/// The listener's name (form, not reserved) and its description, which it returns.
fn check_identity(s: &ListenerSection, c: &mut Collector) -> String {
    let name = s.name.as_str();
    let l = Some(name);
    if !valid_name(name) {
        c.push(
            l,
            Some("name"),
            "must be 1-128 characters of A-Z a-z 0-9 _ - .",
        );
    }
    if INJECTOR_NAMES.contains(&name) {
        c.push(l, Some("name"), "is reserved for an injector identity");
    }
    let description = s.description.clone().unwrap_or_default();
    if description.trim().is_empty() {
        c.push(
            l,
            Some("description"),
            "is required (tools and visualizers show it)",
        );
    }
    description
}

/// What its `kind` asks of `handler`.
fn check_kind(s: &ListenerSection, known: Known<'_>, c: &mut Collector) {
    let l = Some(s.name.as_str());
    match s.kind {
        ListenerKind::Native => match s.handler.as_deref() {
            None => c.push(l, Some("handler"), "a native listener needs a handler name"),
            Some(h) if !known.handlers.contains(&h) => c.push(
                l,
                Some("handler"),
                format!(
                    "no native handler named `{h}` (available: {})",
                    known.handlers.join(", ")
                ),
            ),
            Some(_) => {}
        },
        ListenerKind::Lua => {
            if s.handler.is_some() {
                c.push(
                    l,
                    Some("handler"),
                    "a lua listener runs its `script`, not a native handler",
                );
            }
        }
        ListenerKind::External => {
            if s.handler.is_some() {
                c.push(
                    l,
                    Some("handler"),
                    "an external listener forwards to its `input_url`, not a native handler",
                );
            }
        }
        ListenerKind::Llm => {
            if s.handler.is_some() {
                c.push(
                    l,
                    Some("handler"),
                    "an llm listener calls its `model`, not a native handler",
                );
            }
        }
        ListenerKind::Human => {
            if s.handler.is_some() {
                c.push(
                    l,
                    Some("handler"),
                    "a human listener is answered by a person through the inbox, not a native handler",
                );
            }
        }
    }
}

/// A Lua listener's script (read and compiled) and its limits.
fn check_lua(
    s: &ListenerSection,
    base: &Path,
    known: Known<'_>,
    c: &mut Collector,
) -> (Option<PathBuf>, LuaLimits) {
    let l = Some(s.name.as_str());
    let mut script = None;
    let mut lua_limits = LuaLimits::default();
    if s.kind == ListenerKind::Lua {
        match &s.script {
            None => c.push(
                l,
                Some("script"),
                "required: the Lua file this listener runs",
            ),
            Some(rel) => {
                let path = base.join(rel);
                match std::fs::read_to_string(&path) {
                    Err(e) => c.push(
                        l,
                        Some("script"),
                        format!("cannot read {}: {e}", path.display()),
                    ),
                    Ok(text) => {
                        if let Err(e) = (known.check_script)(rel, &text) {
                            c.push(l, Some("script"), format!("does not compile: {e}"));
                        }
                    }
                }
                script = Some(path);
            }
        }
        if let Some(v) = &s.limits {
            match yaml_serde::from_value::<LuaLimits>(v.clone()) {
                Ok(lim) => {
                    if lim.cpu_ms == 0 || lim.memory_mb == 0 {
                        c.push(l, Some("limits"), "cpu_ms and memory_mb must be at least 1");
                    }
                    lua_limits = lim;
                }
                Err(e) => c.push(l, Some("limits"), e.to_string()),
            }
        }
    }
    (script, lua_limits)
}

/// Keys that only some kinds take, given to another kind.
fn check_keys_apply(s: &ListenerSection, c: &mut Collector) {
    let l = Some(s.name.as_str());
    for (key, present, applies) in [
        ("script", s.script.is_some(), s.kind == ListenerKind::Lua),
        (
            "limits",
            s.limits.is_some(),
            matches!(s.kind, ListenerKind::Lua | ListenerKind::Llm),
        ),
        ("model", s.model.is_some(), s.kind == ListenerKind::Llm),
        ("system", s.system.is_some(), s.kind == ListenerKind::Llm),
        ("outputs", s.outputs.is_some(), s.kind == ListenerKind::Llm),
        ("reply", s.reply.is_some(), s.kind == ListenerKind::Llm),
        ("stream", s.stream.is_some(), s.kind == ListenerKind::Llm),
        ("context", s.context.is_some(), s.kind == ListenerKind::Llm),
        ("budget", s.budget.is_some(), s.kind == ListenerKind::Llm),
        (
            "overridable",
            s.overridable.is_some(),
            s.kind == ListenerKind::Llm,
        ),
        (
            "input_url",
            s.input_url.is_some(),
            s.kind == ListenerKind::External,
        ),
        (
            "token_env",
            s.token_env.is_some(),
            s.kind == ListenerKind::External,
        ),
        (
            "timeout_ms",
            s.timeout_ms.is_some(),
            s.kind == ListenerKind::External,
        ),
        (
            "reply_timeout",
            s.reply_timeout.is_some(),
            matches!(s.kind, ListenerKind::External | ListenerKind::Human),
        ),
    ] {
        if present && !applies {
            c.push(
                l,
                Some(key),
                format!("does not apply to a {} listener", s.kind),
            );
        }
    }
}

/// The schema (an XSD file or the `fields` DSL) and the payload types accepted from it
/// (all its global elements, or those `accepts` names), with the file it came from.
fn check_schema(
    s: &ListenerSection,
    base: &Path,
    c: &mut Collector,
) -> (Vec<(PayloadType, Arc<Schema>)>, Option<PathBuf>) {
    let name = s.name.as_str();
    let l = Some(name);
    if s.fields.is_some() && s.schema.is_some() {
        c.push(
            l,
            Some("fields"),
            "give `schema` (an XSD file) or `fields` (the DSL), not both",
        );
    }

    let mut accepts: Vec<(PayloadType, Arc<Schema>)> = Vec::new();
    let mut schema_origin = None;
    let mut unreadable = false;
    match &s.schema {
        None if s.fields.is_none() => c.push(
            l,
            Some("schema"),
            "required: the XSD of the payloads it accepts",
        ),
        None => {
            if let Some(fields) = &s.fields {
                match crate::schema::fields_to_xsd(fields).and_then(|xsd| {
                    Schema::compile(format!("fields of `{name}` (generated)"), xsd)
                        .map_err(|e| e.message)
                }) {
                    Ok(schema) => {
                        for t in schema.payload_types() {
                            accepts.push((t.clone(), schema.clone()));
                        }
                    }
                    Err(e) => {
                        unreadable = true;
                        c.push(l, Some("fields"), e)
                    }
                }
            }
        }
        Some(rel) => {
            let path = base.join(rel);
            schema_origin = Some(path.clone());
            if !path.exists() {
                unreadable = true;
                c.push(
                    l,
                    Some("schema"),
                    format!("file not found: {}", path.display()),
                );
            } else {
                match Schema::from_file(&path) {
                    Ok(schema) => {
                        for t in schema.payload_types() {
                            accepts.push((t.clone(), schema.clone()));
                        }
                    }
                    Err(e) => {
                        unreadable = true;
                        c.push(l, Some("schema"), e.to_string())
                    }
                }
            }
        }
    }
    if let Some(wanted) = &s.accepts {
        let mut narrowed = Vec::new();
        for w in wanted {
            if w == "huh" || *w == PayloadType::huh().to_string() {
                match Schema::huh() {
                    Ok(h) => narrowed.push((PayloadType::huh(), h)),
                    Err(e) => c.push(l, Some("accepts"), e.to_string()),
                }
                continue;
            }
            let found = accepts.iter().find(|(a, _)| a.is_named(w));
            match found {
                Some(entry) => narrowed.push(entry.clone()),
                // A schema that did not load was reported once; its types are not.
                None if !unreadable && (s.schema.is_some() || s.fields.is_some()) => c.push(
                    l,
                    Some("accepts"),
                    format!("`{w}` is not a global element of the listener's schema"),
                ),
                None => {}
            }
        }
        accepts = narrowed;
    }

    (accepts, schema_origin)
}

/// ` (did you mean `x`?)` for the one of `names` most like `name`, if one is as alike as a
/// typo makes it (Jaro-Winkler 0.8 or more; the first by name of those alike); else nothing.
/// A `name` that could not be a listener's (too long, other characters) is compared with
/// none: the comparison costs its length times theirs.
pub fn did_you_mean<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> String {
    if !valid_name(name) {
        return String::new();
    }
    names
        .map(|n| (strsim::jaro_winkler(name, n), n))
        .filter(|(alike, _)| *alike >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, n)| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default()
}

/// Every peer names a listener in the file.
fn check_peers(
    s: &ListenerSection,
    names: &HashSet<&str>,
    c: &mut Collector,
) -> Option<Vec<ListenerName>> {
    let l = Some(s.name.as_str());
    s.peers.as_ref().map(|ps| {
        for p in ps {
            // A tenant's unknown peer is told as one out of its scope (`tenant.rs`).
            if !names.contains(p.as_str()) && s.tenant.is_none() {
                let hint = did_you_mean(p, names.iter().copied());
                c.push(l, Some("peers"), format!("`{p}` names no listener{hint}"));
            }
        }
        ps.iter().map(|p| ListenerName::new(p)).collect::<Vec<_>>()
    })
}

/// `concurrency`, and the handler's `config` (its `…_env` keys resolved; `forward`'s
/// `to` naming a listener).
fn check_handler_config(
    s: &ListenerSection,
    names: &HashSet<&str>,
    c: &mut Collector,
) -> (usize, serde_json::Value) {
    let l = Some(s.name.as_str());
    let concurrency = s.concurrency.unwrap_or(1);
    if concurrency == 0 {
        c.push(l, Some("concurrency"), "must be at least 1");
    }
    let mut config = match &s.config {
        None => serde_json::Value::Object(Default::default()),
        Some(v) => serde_json::to_value(v).unwrap_or_else(|e| {
            c.push(
                l,
                Some("config"),
                format!("cannot be represented as JSON: {e}"),
            );
            serde_json::Value::Null
        }),
    };
    for (path, var) in secret::resolve_env(&mut config) {
        c.push(
            l,
            Some(&format!("config.{path}")),
            format!("environment variable `{var}` is not set"),
        );
    }
    if s.handler.as_deref() == Some("forward") {
        match config.get("to").and_then(|t| t.as_str()) {
            Some(t) if names.contains(t) => {}
            Some(t) => {
                let hint = did_you_mean(t, names.iter().copied());
                c.push(
                    l,
                    Some("config.to"),
                    format!("`{t}` names no listener{hint}"),
                )
            }
            None => c.push(
                l,
                Some("config.to"),
                "the forward handler needs `config.to`",
            ),
        }
    }

    (concurrency, config)
}

/// An agent's payload types are its own: no other listener accepts them.
fn check_agent_types(built: &[ListenerConfig], c: &mut Collector) {
    let mut owners: HashMap<&PayloadType, Vec<&ListenerConfig>> = HashMap::new();
    for l in built {
        for (t, _) in &l.accepts {
            owners.entry(t).or_default().push(l);
        }
    }
    for l in built {
        if !l.agent {
            continue;
        }
        for (t, _) in &l.accepts {
            if *t == PayloadType::huh() {
                continue;
            }
            // Only listeners on its side of the tenant boundary compete for its types (a
            // broadcast never crosses to the others), and only they are named.
            let others: Vec<&str> = owners[t]
                .iter()
                .filter(|o| o.name != l.name)
                .filter(|o| o.tenant == l.tenant || o.shared || l.shared)
                .map(|o| o.name.as_str())
                .collect();
            if !others.is_empty() {
                c.push(
                    Some(l.name.as_str()),
                    Some("accepts"),
                    format!(
                        "agent payload type `{t}` is also accepted by {}; an agent's types must be unique",
                        others.join(", ")
                    ),
                );
            }
        }
    }
}

/// Listener names and thread ids share one alphabet: `[A-Za-z0-9_.-]{1,128}`.
pub(super) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}
