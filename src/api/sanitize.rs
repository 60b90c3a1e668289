//! Config as the API shows it: secret values never appear (SPEC §14).
//!
//! A value is secret when its key names a secret (`config::secret::is_secret_key`, the rule
//! the config check uses) or it looks like a credential (`Bearer …`), anywhere in the tree.
//! Keys ending in `_env` name an environment variable, not its value, and are shown. Values
//! of keys ending in `url` are shown without user, password, query or fragment.

use serde::Serialize;
use serde_json::Value;

use crate::config::layer::LayerListener;
use crate::config::secret::{is_credential_value, is_secret_key};
use crate::config::OrganismConfig;

/// What replaces a secret value.
pub const REDACTED: &str = "[redacted]";

/// Replaces every secret value in `value` (recursively).
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let credential = v.as_str().is_some_and(is_credential_value);
                if (is_secret_key(k) && !v.is_null()) || credential {
                    *v = Value::String(REDACTED.into());
                } else if let (true, Value::String(url)) =
                    (k.to_ascii_lowercase().ends_with("url"), &*v)
                {
                    // A URL may carry a user, a password or a key in its query.
                    *v = Value::String(crate::config::display_url(url));
                } else {
                    redact(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// A config section as served: the sanitized tree and the same as YAML text.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConfigView {
    /// The sanitized YAML (comments and formatting are not kept).
    pub yaml: String,
    /// The same, as JSON.
    #[schema(value_type = Object)]
    pub config: Value,
}

impl ConfigView {
    fn of(mut config: Value) -> ConfigView {
        redact(&mut config);
        let yaml = yaml_serde::to_string(&config).unwrap_or_default();
        ConfigView { yaml, config }
    }
}

fn parse(text: &str) -> Value {
    yaml_serde::from_str(text).unwrap_or(Value::Null)
}

/// The effective organism, sanitized: the file, with the agents created through the API
/// among its listeners, each listener with its `origin` (`file`, or `{api: {version}}`; an
/// API agent's script is at `/api/v1/agents/{name}/scripts/{version}`).
pub fn organism_view(config: &OrganismConfig) -> ConfigView {
    ConfigView::of(effective(&config.text, &config.layer))
}

/// One listener's section of the effective organism, sanitized.
pub fn listener_view(config: &OrganismConfig, name: &str) -> Option<ConfigView> {
    section(effective(&config.text, &config.layer), name)
}

fn section(all: Value, name: &str) -> Option<ConfigView> {
    let section = all
        .get("listeners")?
        .as_array()?
        .iter()
        .find(|l| l.get("name").and_then(Value::as_str) == Some(name))?
        .clone();
    Some(ConfigView::of(section))
}

fn effective(text: &str, layer: &[LayerListener]) -> Value {
    let mut all = parse(text);
    if let Some(listeners) = all.get_mut("listeners").and_then(Value::as_array_mut) {
        for l in listeners.iter_mut().filter_map(Value::as_object_mut) {
            l.insert("origin".into(), "file".into());
        }
        for a in layer {
            let mut item = a.item.clone();
            if let Some(m) = item.as_object_mut() {
                // Paths of this server's own copies of the version's texts.
                m.remove("script");
                if m.contains_key("fields") {
                    m.remove("schema");
                }
                if m.contains_key("schema") {
                    m.insert("schema".into(), "(the version's xsd)".into());
                }
                m.insert(
                    "origin".into(),
                    serde_json::json!({"api": {"version": a.version}}),
                );
            }
            listeners.push(item);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_wherever_they_are_and_env_names_are_kept() {
        let yaml = "organism: {name: x}\nlisteners:\n  - name: a\n    token_env: A_TOKEN\n    input_url: http://me:pw123@h:1/in?key=k-456\n    config:\n      api_key: sk-123\n      nested: [{password: hunter2, user: bob}]\n      Authorization: Bearer abc\n      passphrase: pp-1\n      access_key: ak-2\n      pwd: pw-3\n      header: Bearer tok-4\n";
        let view = ConfigView::of(effective(yaml, &[]));
        let text = view.yaml.clone();
        for secret in [
            "sk-123",
            "hunter2",
            "Bearer abc",
            "pw123",
            "k-456",
            "pp-1",
            "ak-2",
            "pw-3",
            "tok-4",
        ] {
            assert!(!text.contains(secret), "{text}");
            assert!(!view.config.to_string().contains(secret));
        }
        assert!(text.contains("A_TOKEN") && text.contains("bob"), "{text}");
        let one = section(effective(yaml, &[]), "a").unwrap();
        assert_eq!(one.config["config"]["api_key"], REDACTED);
        assert!(section(effective(yaml, &[]), "nope").is_none());
    }
}
