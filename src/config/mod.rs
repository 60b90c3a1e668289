//! The organism YAML (SPEC §4): its typed model, loading, and validation.
//!
//! Pure data: nothing here starts a task or opens a socket. Loading checks everything that can
//! be checked before the organism runs (unknown keys, descriptions, references between
//! listeners, agents' unique payload types, XSDs that compile, paths that exist) and reports
//! every problem at once, each naming the file, the listener and the key.

pub mod diff;
mod model;
pub mod secret;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use model::{
    choose_type, display_url, names_type, ExternalConfig, Limits, ListenerConfig, ListenerKind,
    ListenerName, LuaLimits, NoType, OrganismConfig, Retention, Scheduling,
    DEFAULT_EXTERNAL_TIMEOUT_MS, DEFAULT_REPLY_TIMEOUT,
};
use model::{ListenerSection, OrganismSection};

use crate::schema::Schema;
use crate::xml::PayloadType;

/// Default API address: loopback only (SPEC §14).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";

/// The injector identities a message can name as its sender besides a listener (`from`):
/// no listener may take one of these names.
pub const INJECTOR_NAMES: [&str; 4] = ["api", "ws", "cli", "system"];

/// One problem in an organism file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// The line (from 1) the problem is on, when it could be found in the text.
    pub line: Option<usize>,
    pub listener: Option<String>,
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(n) = self.line {
            write!(f, ":{n}")?;
        }
        if let Some(l) = &self.listener {
            write!(f, ": listener `{l}`")?;
        }
        if let Some(k) = &self.key {
            write!(f, ": key `{k}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigError>);

struct Collector<'t> {
    file: String,
    text: &'t str,
    errors: Vec<ConfigError>,
}

impl Collector<'_> {
    fn push(&mut self, listener: Option<&str>, key: Option<&str>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: locate(self.text, listener, key),
            listener: listener.map(str::to_string),
            key: key.map(str::to_string),
            message: message.into(),
        });
    }
}

/// What loading checks a file against but `config` cannot know by itself, handed down by
/// the layers that do, so that `config` stays pure data and imports neither: the native
/// handler names available (the built-ins plus any an embedding program registered), and the
/// Lua compiler's syntax check (`lua::check_syntax`).
#[derive(Clone, Copy)]
pub struct Known<'a> {
    pub handlers: &'a [&'a str],
    /// `(file name, source)` → the compiler's message when the script does not compile.
    pub check_script: fn(&str, &str) -> Result<(), String>,
}

/// Loads and validates an organism file.
pub fn load_file(path: &Path, known: Known<'_>) -> Result<OrganismConfig, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: path.display().to_string(),
            line: None,
            listener: None,
            key: None,
            message: format!("cannot read: {e}"),
        }])
    })?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut config = load_str(&text, &path.display().to_string(), &base, known)?;
    config.source = Some(path.to_path_buf());
    Ok(config)
}

/// Loads and validates organism YAML given as text. `file` names it in errors; relative paths
/// resolve against `base`.
pub fn load_str(
    text: &str,
    file: &str,
    base: &Path,
    known: Known<'_>,
) -> Result<OrganismConfig, ConfigErrors> {
    let mut c = Collector {
        file: file.to_string(),
        text,
        errors: Vec::new(),
    };
    let root: yaml_serde::Value = match yaml_serde::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            c.push(None, None, format!("not valid YAML: {e}"));
            return Err(ConfigErrors(c.errors));
        }
    };
    let Some(map) = root.as_mapping() else {
        c.push(
            None,
            None,
            "the file must be a mapping with `organism` and `listeners`",
        );
        return Err(ConfigErrors(c.errors));
    };
    for key in map.keys() {
        let k = key.as_str().unwrap_or("");
        if !["organism", "limits", "listeners"].contains(&k) {
            c.push(
                None,
                Some(k),
                "unknown key (expected `organism`, `limits`, `listeners`)",
            );
        }
    }

    let organism: Option<OrganismSection> = match map.get("organism") {
        None => {
            c.push(None, Some("organism"), "missing");
            None
        }
        Some(v) => match yaml_serde::from_value(v.clone()) {
            Ok(o) => Some(o),
            Err(e) => {
                c.push(None, Some("organism"), e.to_string());
                None
            }
        },
    };
    let limits: Limits = match map.get("limits") {
        None => Limits::default(),
        Some(v) => yaml_serde::from_value(v.clone()).unwrap_or_else(|e| {
            c.push(None, Some("limits"), e.to_string());
            Limits::default()
        }),
    };
    check_limits(&limits, &mut c);

    let mut sections: Vec<ListenerSection> = Vec::new();
    // Every listener's name, its section readable or not: a mistake in one listener is
    // reported once, not again as "names no listener" in those that refer to it.
    let mut written_names: Vec<String> = Vec::new();
    match map.get("listeners").and_then(|v| v.as_sequence()) {
        None => c.push(None, Some("listeners"), "missing, or not a list"),
        Some(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(n) = item.get("name").and_then(|n| n.as_str()) {
                    written_names.push(n.to_string());
                }
                let label = item
                    .get("name")
                    .and_then(|n| n.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("#{}", i + 1));
                for (path, key) in secret::literals(item) {
                    c.push(
                        Some(&label),
                        Some(&path),
                        format!(
                            "holds a secret in the file; put it in an environment variable and \
                             name the variable instead (`{}_env: VARIABLE`)",
                            key
                        ),
                    );
                }
                match yaml_serde::from_value::<ListenerSection>(item.clone()) {
                    Ok(s) => sections.push(s),
                    Err(e) => {
                        let message = e.to_string();
                        let key = serde_key(&message).or_else(|| variant_key(item, &message));
                        c.push(Some(&label), key.as_deref(), message);
                    }
                }
            }
        }
    }

    let listeners = check_listeners(&sections, &written_names, base, known, &mut c);

    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    let Some(organism) = organism else {
        return Err(ConfigErrors(c.errors));
    };
    if organism.name.trim().is_empty() {
        c.push(None, Some("organism.name"), "must not be empty");
        return Err(ConfigErrors(c.errors));
    }
    if organism
        .store
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        c.push(
            None,
            Some("organism.store"),
            "must not be empty: a file path (such as data/organism.db) or memory",
        );
    }
    let store = match organism.store.as_deref() {
        Some("memory") => None,
        Some(p) => Some(base.join(p)),
        None => Some(PathBuf::from("data").join(format!("{}.db", organism.name))),
    };
    let mut retention = Retention::default();
    if let Some(r) = &organism.store_retention {
        retention.max_messages = r.max_messages;
        if let Some(age) = &r.max_age {
            match parse_age(age) {
                Some(d) => retention.max_age = Some(d),
                None => {
                    c.push(
                        None,
                        Some("organism.store_retention.max_age"),
                        format!("`{age}` is not a duration like 30d, 12h, 15m or 45s"),
                    );
                }
            }
        }
    }
    for origin in &organism.allowed_origins {
        if !valid_origin(origin) {
            c.push(
                None,
                Some("organism.allowed_origins"),
                format!("`{origin}` is not an origin like http://localhost:3000 (scheme, host and port; no path)"),
            );
        }
    }
    for host in &organism.allowed_hosts {
        if host.trim().is_empty() || host.contains(['/', ' ', '@']) {
            c.push(
                None,
                Some("organism.allowed_hosts"),
                format!(
                    "`{host}` is not a host name like dash.example.com or dash.example.com:8765"
                ),
            );
        }
    }
    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    Ok(OrganismConfig {
        allowed_origins: organism.allowed_origins,
        allowed_hosts: organism.allowed_hosts,
        retention,
        listen: organism
            .listen
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string()),
        name: organism.name,
        store,
        scheduling: organism.scheduling,
        limits,
        listeners,
        source: None,
        text: text.to_string(),
    })
}

/// The line (from 1) where `key` (a dotted path such as `config.to` or `organism.store`) of
/// `listener` (or of the file, without one) is written, found by reading the text: the
/// listener's `name:` line, then each segment of the key as a mapping key after it, within
/// the listener's item. `None` when it is not written there (a missing key).
fn locate(text: &str, listener: Option<&str>, key: Option<&str>) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let strip = |l: &str| {
        l.trim_start()
            .trim_start_matches('-')
            .trim_start()
            .trim_start_matches('{')
            .trim_start()
            .to_string()
    };
    let indent = |l: &str| l.len() - l.trim_start().len();
    let (mut from, to) = match listener {
        None => (0, lines.len()),
        Some(name) => {
            let start = lines.iter().position(|l| {
                let t = strip(l);
                let Some(v) = t.strip_prefix("name:") else {
                    return false;
                };
                let v = v.split([',', '}', '#']).next().unwrap_or("").trim();
                v.trim_matches(|c| c == '"' || c == '\'') == name
            })?;
            // The item starts at the `- ` at or before `name:`; it ends at the next `- ` at
            // that indentation or less.
            let item = (0..=start)
                .rev()
                .find(|i| lines[*i].trim_start().starts_with('-'))
                .unwrap_or(start);
            let depth = indent(lines[item]);
            let end = (start + 1..lines.len())
                .find(|i| {
                    let l = lines[*i];
                    !l.trim().is_empty()
                        && indent(l) <= depth
                        && (l.trim_start().starts_with('-') || indent(l) < depth)
                })
                .unwrap_or(lines.len());
            (item, end)
        }
    };
    let Some(key) = key else {
        return (listener.is_some()).then_some(from + 1);
    };
    let start = from;
    for segment in key.split('.') {
        let segment = segment.split('[').next().unwrap_or(segment);
        let found = (from..to).find(|i| {
            let l = lines[*i];
            [" ", "{", ",", "-"]
                .iter()
                .any(|p| l.contains(&format!("{p}{segment}:")))
                || l.trim_start().starts_with(&format!("{segment}:"))
        });
        match found {
            Some(i) => from = i,
            None => return (listener.is_some()).then_some(start + 1),
        }
    }
    Some(from + 1)
}

/// `http://host`, `https://host:port`: what a browser sends as `Origin`.
fn valid_origin(s: &str) -> bool {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"));
    rest.is_some_and(|r| {
        let r = r.trim_end_matches('/');
        !r.is_empty() && !r.contains(['/', '?', '#', '@', ' '])
    })
}

/// The host of `host:port`, `[v6]:port`, `host` or `[v6]` (brackets removed).
pub fn host_part(authority: &str) -> &str {
    let a = authority.trim();
    match a.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => a.rsplit_once(':').map_or(a, |(h, _)| h),
    }
}

/// Whether an API listen address keeps the API on this machine (`127.0.0.1:…`, `[::1]:…`,
/// `localhost:…`). Anything else (`0.0.0.0`, a LAN address, a name) exposes it.
pub fn listen_is_loopback(listen: &str) -> bool {
    let host = host_part(listen);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `30d`, `12h`, `15m`, `45s`, `500ms`.
fn parse_age(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(ms))
}

/// The `external` keys: `input_url` (http), `token_env` (a set variable),
/// `timeout_ms`, `reply_timeout` (seconds, or a duration like `300s`, `5m`).
fn check_external(
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
                Ok(url) if url.scheme() == "http" && url.has_host() => {}
                Ok(url) if url.scheme() == "https" => c.push(
                    l,
                    Some("input_url"),
                    "https is not supported by this build (no TLS stack); use http, e.g. through a local TLS-terminating proxy",
                ),
                Ok(_) => c.push(l, Some("input_url"), "must be an http:// URL"),
                Err(e) => c.push(l, Some("input_url"), format!("is not a URL: {e}")),
            }
            u.to_string()
        }
    };
    let token = match s.token_env.as_deref() {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Some(v),
            _ => {
                c.push(
                    l,
                    Some("token_env"),
                    format!(
                        "environment variable `{var}` is not set (it holds the callback token)"
                    ),
                );
                None
            }
        },
    };
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
fn variant_key(item: &yaml_serde::Value, message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown variant `")?;
    let variant = rest.split('`').next()?;
    item.as_mapping()?
        .iter()
        .find(|(_, v)| v.as_str() == Some(variant))
        .and_then(|(k, _)| k.as_str().map(str::to_string))
}

fn serde_key(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next().map(str::to_string)
}

fn check_limits(l: &Limits, c: &mut Collector) {
    // Each limit, its value and the least it may be.
    let checks: [(&str, u64, u64); 13] = [
        ("limits.max_message_bytes", l.max_message_bytes as u64, 1),
        ("limits.max_depth", l.max_depth as u64, 1),
        (
            "limits.max_pending_messages",
            l.max_pending_messages as u64,
            1,
        ),
        (
            "limits.max_messages_per_thread",
            l.max_messages_per_thread,
            1,
        ),
        (
            "limits.max_concurrent_handlers",
            l.max_concurrent_handlers as u64,
            1,
        ),
        ("limits.max_connections", l.max_connections as u64, 1),
        ("limits.header_timeout_ms", l.header_timeout_ms, 1),
        ("limits.idle_timeout_ms", l.idle_timeout_ms, 1),
        ("limits.max_error_bytes", l.max_error_bytes as u64, 64),
        ("limits.max_filter_entries", l.max_filter_entries as u64, 1),
        (
            "limits.max_filter_entry_bytes",
            l.max_filter_entry_bytes as u64,
            1,
        ),
        ("limits.max_attributes", l.max_attributes as u64, 1),
        (
            "limits.max_retained_bytes",
            l.max_retained_bytes as u64,
            1024 * 1024,
        ),
    ];
    for (key, value, least) in checks {
        if value < least {
            let message = match least {
                1 => "must be greater than 0".to_string(),
                n => format!("must be at least {n}"),
            };
            c.push(None, Some(key), message);
        }
    }
}

fn check_listeners(
    sections: &[ListenerSection],
    written_names: &[String],
    base: &Path,
    known: Known<'_>,
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
        }
        let external = (s.kind == ListenerKind::External).then(|| check_external(s, l, c));
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
        for (key, present, applies) in [
            ("script", s.script.is_some(), s.kind == ListenerKind::Lua),
            ("limits", s.limits.is_some(), s.kind == ListenerKind::Lua),
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
                s.kind == ListenerKind::External,
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
        if s.fields.is_some() && s.schema.is_some() {
            c.push(
                l,
                Some("fields"),
                "give `schema` (an XSD file) or `fields` (the DSL), not both",
            );
        }

        // Schema and accepted types.
        let mut accepts: Vec<(PayloadType, Arc<Schema>)> = Vec::new();
        let mut schema_origin = None;
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
                        Err(e) => c.push(l, Some("fields"), e),
                    }
                }
            }
            Some(rel) => {
                let path = base.join(rel);
                schema_origin = Some(path.clone());
                if !path.exists() {
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
                        Err(e) => c.push(l, Some("schema"), e.to_string()),
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
                let t = PayloadType::parse(w);
                let found = accepts
                    .iter()
                    .find(|(a, _)| *a == t || (t.namespace().is_none() && a.local_name() == w));
                match found {
                    Some(entry) => narrowed.push(entry.clone()),
                    None if s.schema.is_some() || s.fields.is_some() => c.push(
                        l,
                        Some("accepts"),
                        format!("`{w}` is not a global element of the listener's schema"),
                    ),
                    None => {}
                }
            }
            accepts = narrowed;
        }

        // Peers.
        let peers = s.peers.as_ref().map(|ps| {
            for p in ps {
                if !names.contains(p.as_str()) {
                    c.push(l, Some("peers"), format!("`{p}` names no listener"));
                }
            }
            ps.iter().map(|p| ListenerName::new(p)).collect::<Vec<_>>()
        });

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
                Some(t) => c.push(l, Some("config.to"), format!("`{t}` names no listener")),
                None => c.push(
                    l,
                    Some("config.to"),
                    "the forward handler needs `config.to`",
                ),
            }
        }

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
        });
    }

    // An agent's payload types are its own.
    let mut owners: HashMap<&PayloadType, Vec<&str>> = HashMap::new();
    for l in &built {
        for (t, _) in &l.accepts {
            owners.entry(t).or_default().push(l.name.as_str());
        }
    }
    for l in &built {
        if !l.agent {
            continue;
        }
        for (t, _) in &l.accepts {
            if *t == PayloadType::huh() {
                continue;
            }
            let others: Vec<&str> = owners[t]
                .iter()
                .copied()
                .filter(|o| *o != l.name.as_str())
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
    built
}

/// Listener names and thread ids share one alphabet: `[A-Za-z0-9_.-]{1,128}`.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}
