//! The organism YAML (SPEC §4): its typed model, loading, and validation.
//!
//! Pure data: nothing here starts a task or opens a socket. Loading checks everything that can
//! be checked before the organism runs (unknown keys, descriptions, references between
//! listeners, agents' unique payload types, XSDs that compile, paths that exist) and reports
//! every problem at once, each naming the file, the listener and the key.
//!
//! ## Inside
//!
//! The organism YAML: `model.rs` is the serde model (unknown keys refused) and the validated
//! `OrganismConfig`; `mod.rs` loads and `check.rs` checks everything before anything runs (what
//! config cannot know, the native handler names and the Lua syntax check, comes in `Known`),
//! collecting every problem as a `ConfigError {file, line, listener, key, message}` (the line
//! found by reading the text for the listener's item and the key); a listener whose section
//! does not read still counts as a name, so one mistake is reported once. `secret.rs`: the one
//! rule for what is a secret (words of a key, `Bearer …` values), used to refuse a secret
//! written in the file, to resolve `…_env` keys of a handler's `config`, and by the API to
//! redact. Pure data. `diff.rs`: what a reload changes (`ReloadReport`, `ReloadProblem`, the
//! fingerprint a listener is compared by, the settings that need a restart).

pub mod approval;
mod check;
mod check_sections;
pub mod diff;
pub mod layer;
mod limits;
pub mod llm;
mod model;
mod nats;
mod read;
mod role;
pub mod secret;
mod tenant;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use check::{check_listeners, variant_key};
pub use check::{did_you_mean, valid_tenant};
use check_sections::{check_auth, check_external_callbacks, check_nats};
pub use check_sections::{
    DEFAULT_EVENTS_MAX_AGE, DEFAULT_EVENTS_MAX_BYTES, DEFAULT_NATS_ACK_WAIT_MS,
    DEFAULT_NATS_DELIVER_TIMEOUT_MS, DEFAULT_NATS_MAX_DELIVER,
};
use limits::check_limits;
pub use limits::Limits;
pub use model::{
    choose_type, display_url, json_payload, AuthConfig, AuthMethod, ExternalConfig,
    JsonPayloadError, JwtConfig, ListenerConfig, ListenerKind, ListenerName, ListenerOrigin,
    LuaLimits, NoType, OrganismConfig, Placement, Retention, Scheduling, TenantQuotas, Tenants,
    TlsFiles, DEFAULT_EXTERNAL_TIMEOUT_MS, DEFAULT_REPLY_TIMEOUT,
};
use model::{AuthSection, ListenerSection, OrganismSection};
pub use nats::NatsConfig;
use nats::NatsSection;
pub use role::Role;

use crate::schema::Schema;
use crate::xml::PayloadType;

/// Default API address: loopback only (SPEC §14).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";

/// The injector identities a message can name as its sender besides a listener (`from`):
/// no listener may take one of these names (`test`: the sender of test vectors' cases).
pub const INJECTOR_NAMES: [&str; 5] = ["api", "ws", "cli", "system", "test"];

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

impl ConfigError {
    /// A problem found after loading (by a layer that builds what the file describes), placed
    /// in `config`'s file as a loading problem would be: its line, listener and key.
    pub fn about(
        config: &OrganismConfig,
        listener: Option<&str>,
        key: Option<&str>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: config
                .source
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
            line: locate(&config.text, listener, key),
            listener: listener.map(str::to_string),
            key: key.map(str::to_string),
            message: message.into(),
        }
    }
}

/// `section.key`, or the section alone.
fn within(section: &str, key: Option<String>) -> String {
    match key {
        Some(k) => format!("{section}.{k}"),
        None => section.to_string(),
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

/// `tenants:`: a map of tenant name → quotas, `default` for every tenant not named.
fn tenants(v: Option<&yaml_serde::Value>, c: &mut Collector) -> Tenants {
    let Some(v) = v else {
        return Tenants::default();
    };
    let entries: std::collections::BTreeMap<String, model::TenantSection> = match read::read(v) {
        Ok(e) => e,
        Err(e) => {
            c.push(None, Some(&within("tenants", e.key)), e.message);
            return Tenants::default();
        }
    };
    let default = entries.get("default").map_or(TenantQuotas::default(), |d| {
        d.clone().over(TenantQuotas::default())
    });
    let default_llm = entries
        .get("default")
        .map_or(model::TenantLlm::default(), |d| {
            d.llm_over(&model::TenantLlm::default())
        });
    let mut each = std::collections::BTreeMap::new();
    let mut llm = std::collections::BTreeMap::new();
    llm.insert("default".to_string(), default_llm.clone());
    for (name, section) in entries {
        if section.inject_per_s == Some(0) {
            c.push(
                None,
                Some(&format!("tenants.{name}.inject_per_s")),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        for (key, value) in [
            ("max_active_threads", section.max_active_threads),
            ("max_pending_messages", section.max_pending_messages),
            ("max_pending_bytes", section.max_pending_bytes),
            ("max_open_inputs", section.max_open_inputs),
            ("max_held_bytes", section.max_held_bytes),
            ("max_waiting_threads", section.max_waiting_threads),
            ("max_streams", section.max_streams),
        ] {
            if value == Some(0) {
                c.push(
                    None,
                    Some(&format!("tenants.{name}.{key}")),
                    "must be at least 1",
                );
            }
        }
        if name == "default" {
            continue;
        }
        if !valid_tenant(&name) {
            c.push(
                None,
                Some(&format!("tenants.{name}")),
                "a tenant is 1-64 letters, digits, `.`, `_` or `-`",
            );
        }
        llm.insert(name.clone(), section.llm_over(&default_llm));
        each.insert(name, section.over(default));
    }
    Tenants { default, each, llm }
}

/// Loads and validates an organism file.
pub fn load_file(path: &Path, known: Known<'_>) -> Result<OrganismConfig, ConfigErrors> {
    load_file_layered(path, known, &[])
}

/// Loads and validates an organism file with the listeners the API created laid over the
/// file's (`layer`), each checked exactly as a listener of the file is.
pub fn load_file_layered(
    path: &Path,
    known: Known<'_>,
    layer: &[layer::LayerListener],
) -> Result<OrganismConfig, ConfigErrors> {
    let text = read::file_text(path).map_err(|message| {
        ConfigErrors(vec![ConfigError {
            file: path.display().to_string(),
            line: None,
            listener: None,
            key: None,
            message,
        }])
    })?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut config = load_str_layered(&text, &path.display().to_string(), &base, known, layer)?;
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
    load_str_layered(text, file, base, known, &[])
}

/// [`load_str`] with the API's listeners laid over the file's ([`load_file_layered`]).
pub fn load_str_layered(
    text: &str,
    file: &str,
    base: &Path,
    known: Known<'_>,
    layer: &[layer::LayerListener],
) -> Result<OrganismConfig, ConfigErrors> {
    let mut c = Collector {
        file: file.to_string(),
        text,
        errors: Vec::new(),
    };
    if let Some(line) = read::too_deep(text) {
        let max = read::MAX_FLOW_DEPTH;
        c.push(
            None,
            None,
            format!("not valid YAML: `[` and `{{` nest deeper than {max} levels at line {line} (counted in strings and comments too)"),
        );
        return Err(ConfigErrors(c.errors));
    }
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
    let (organism, limits, auth_section) = top_sections(map, &mut c);

    let (mut sections, mut written_names) = listener_items(map.get("listeners"), &mut c);

    let tenants = tenants(map.get("tenants"), &mut c);
    let models = llm::models(map.get("models"), &mut c);
    layer::lay_over(layer, &mut sections, &mut written_names, &mut c);
    let mut listeners = check_listeners(&sections, &written_names, base, known, &models, &mut c);
    llm::check_tenants(&mut listeners, &tenants, &models, &mut c);
    layer::mark_and_check(layer, &mut listeners, &tenants, &mut c);
    tenant::check_peers_in_scope(&listeners, &mut c);
    let auth = auth_section.map_or_else(AuthConfig::default, |a| check_auth(a, base, &mut c));
    check_external_callbacks(&auth, &listeners, &mut c);

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
    let (store, retention) = check_organism(&organism, base, &auth, &mut c);
    let nats = check_nats(organism.nats, &organism.name, &listeners, &mut c);
    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    Ok(OrganismConfig {
        nats,
        tls: organism.tls.map(|t| TlsFiles {
            cert: base.join(t.cert),
            key: base.join(t.key),
        }),
        allowed_origins: organism.allowed_origins,
        allowed_hosts: organism.allowed_hosts,
        dashboard: organism.dashboard.unwrap_or(true),
        payload_search: organism.search.as_ref().is_some_and(|s| s.payload_text),
        retention,
        listen: organism
            .listen
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string()),
        name: organism.name,
        store,
        scheduling: organism.scheduling,
        limits,
        auth,
        models,
        listeners,
        source: None,
        text: text.to_string(),
        layer: layer.to_vec(),
        tenants,
    })
}

/// The file's top-level keys checked, and `organism:`, `limits:` (checked) and `auth:` read.
fn top_sections(
    map: &yaml_serde::Mapping,
    c: &mut Collector,
) -> (Option<OrganismSection>, Limits, Option<model::AuthSection>) {
    for key in map.keys() {
        let k = key.as_str().unwrap_or("");
        if ![
            "organism",
            "limits",
            "auth",
            "tenants",
            "models",
            "listeners",
        ]
        .contains(&k)
        {
            c.push(
                None,
                Some(k),
                "unknown key (expected `organism`, `limits`, `auth`, `tenants`, `models`, \
                 `listeners`)",
            );
        }
    }

    let organism: Option<OrganismSection> = match map.get("organism") {
        None => {
            c.push(None, Some("organism"), "missing");
            None
        }
        Some(v) => match read::read(v) {
            Ok(o) => Some(o),
            Err(e) => {
                c.push(None, Some(&within("organism", e.key)), e.message);
                None
            }
        },
    };
    let limits: Limits = match map.get("limits") {
        None => Limits::default(),
        Some(v) => read::read(v).unwrap_or_else(|e| {
            c.push(None, Some(&within("limits", e.key)), e.message);
            Limits::default()
        }),
    };
    check_limits(&limits, c);
    let auth_section: Option<model::AuthSection> = match map.get("auth") {
        None => None,
        Some(v) => read::read(v).map_or_else(
            |e| {
                c.push(None, Some(&within("auth", e.key)), e.message);
                None
            },
            Some,
        ),
    };

    (organism, limits, auth_section)
}

/// The `listeners:` items, each read into its section (a problem in one is reported, the
/// others still read), with every name written, readable section or not: a mistake in one
/// listener is reported once, not again as "names no listener" in those that refer to it.
fn listener_items(
    listeners: Option<&yaml_serde::Value>,
    c: &mut Collector,
) -> (Vec<ListenerSection>, Vec<String>) {
    let mut sections: Vec<ListenerSection> = Vec::new();
    let mut written_names: Vec<String> = Vec::new();
    match listeners.and_then(|v| v.as_sequence()) {
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
                match read::read::<ListenerSection>(item) {
                    Ok(s) => sections.push(s),
                    Err(e) => {
                        let key = e.key.or_else(|| variant_key(item, &e.message));
                        c.push(Some(&label), key.as_deref(), e.message);
                    }
                }
            }
        }
    }
    (sections, written_names)
}

/// `organism:`'s own keys: the store (absolute, beside the file by default; `memory` needs
/// a keys file when keys are on), retention, and the origins and hosts browsers may use.
fn check_organism(
    organism: &OrganismSection,
    base: &Path,
    auth: &AuthConfig,
    c: &mut Collector,
) -> (Option<PathBuf>, Retention) {
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
    // Absolute, so what is written beside it (the API agents' scripts, which the file's
    // listeners' paths are read relative to the file) is found from anywhere.
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let store = match organism.store.as_deref() {
        Some("memory") => None,
        Some(p) => Some(absolute(base.join(p))),
        // Beside the organism file, as every path it names: a run from another directory
        // finds the same store, and so do `agentserver keys` and `restore`.
        None => Some(absolute(
            base.join("data").join(format!("{}.db", organism.name)),
        )),
    };
    if store.is_none() && auth.uses(AuthMethod::Keys) && auth.keys_file.is_none() {
        c.push(
            None,
            Some("auth.keys_file"),
            "missing: with `store: memory` and `keys` in auth.methods, the keys live in a file \
             (agentserver keys create writes it)",
        );
    }
    if store.is_none() && organism.search.as_ref().is_some_and(|s| s.payload_text) {
        c.push(
            None,
            Some("organism.search.payload_text"),
            "needs a store file: the index of payloads' words is kept in it (not with `store: memory`)",
        );
    }
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
    (store, retention)
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

/// A warning for each XSD of the organism's file that holds a slow pattern
/// (`schema::slow_pattern`: an uploaded agent's XSD may hold none): a value it refuses can
/// keep a pump thread for up to a second. One per schema, naming its listeners.
pub fn slow_pattern_warnings(c: &OrganismConfig) -> Vec<String> {
    // Each schema's origin (its file), its slow pattern and the listeners it serves.
    let mut found: Vec<(&str, Option<String>, Vec<&str>)> = Vec::new();
    for l in c
        .listeners
        .iter()
        .filter(|l| matches!(l.origin, ListenerOrigin::File))
    {
        for (_, schema) in &l.accepts {
            let at = match found.iter().position(|f| f.0 == schema.origin()) {
                Some(at) => at,
                None => {
                    let slow = crate::schema::slow_pattern(schema.xsd());
                    found.push((schema.origin(), slow, Vec::new()));
                    found.len() - 1
                }
            };
            let names = &mut found[at].2;
            if !names.contains(&l.name.as_str()) {
                names.push(l.name.as_str());
            }
        }
    }
    found
        .into_iter()
        .filter_map(|(origin, slow, names)| {
            Some(format!(
                "{origin} holds the pattern `{}` (listeners {}): it repeats a repetition with a \
                 range of counts, and libxml2 can take up to a second of a pump thread to \
                 refuse a value by it",
                slow?,
                names.join(", ")
            ))
        })
        .collect()
}

/// `30d`, `12h`, `15m`, `45s`, `500ms`.
pub fn parse_age(s: &str) -> Option<std::time::Duration> {
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
