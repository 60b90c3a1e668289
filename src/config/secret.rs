//! Secrets never sit in the organism file (SPEC §4, §14): a key that names a secret holds
//! the name of an environment variable (`…_env`), never the value. The same rule tells the
//! API what to redact, so one list serves both.

use serde_json::Value as Json;
use yaml_serde::Value as Yaml;

/// Words that make a key a secret's: one word of the key, or two adjacent ones (`api_key`).
/// A key's words are split at `_`, `-`, `.` and camelCase humps, lowercased.
const SECRET_WORDS: [&str; 20] = [
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "api_key",
    "apikey",
    "access_key",
    "accesskey",
    "accesstoken",
    "credential",
    "credentials",
    "private_key",
    "privatekey",
    "authorization",
    "auth",
    "cookie",
    "bearer",
    "signature",
];

fn words(key: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    let mut prev_lower = false;
    for ch in key.chars() {
        if matches!(ch, '_' | '-' | '.' | ' ') {
            words.push(String::new());
            prev_lower = false;
            continue;
        }
        if ch.is_uppercase() && prev_lower {
            words.push(String::new());
        }
        prev_lower = ch.is_lowercase() || ch.is_ascii_digit();
        if let Some(w) = words.last_mut() {
            w.extend(ch.to_lowercase());
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// Whether a value under `key` is a secret (`db_password`, `X-Api-Key`, `accessToken`; not
/// `max_tokens`). Keys ending in `_env` name an environment variable, not its value, and
/// are not.
pub fn is_secret_key(key: &str) -> bool {
    let w = words(key);
    if w.last().is_some_and(|l| l == "env") {
        return false;
    }
    let single = w.iter().any(|x| SECRET_WORDS.contains(&x.as_str()));
    single
        || w.windows(2)
            .any(|p| SECRET_WORDS.contains(&format!("{}_{}", p[0], p[1]).as_str()))
}

/// Whether a string value is a credential whatever its key (`Bearer …`, `Basic …`).
pub fn is_credential_value(value: &str) -> bool {
    let v = value.trim_start();
    ["bearer ", "basic ", "token "]
        .iter()
        .any(|p| v.len() > p.len() && v.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// Every place in `root` (a listener's or the organism's section) that holds a secret as a
/// literal: `(key path, key)`. `fields` (the schema DSL: element names, not values) is not
/// searched.
pub(crate) fn literals(root: &Yaml) -> Vec<(String, String)> {
    let mut found = Vec::new();
    walk(root, "", &mut found);
    found
}

fn walk(v: &Yaml, path: &str, found: &mut Vec<(String, String)>) {
    match v {
        Yaml::Mapping(map) => {
            for (k, v) in map {
                let key = match k.as_str() {
                    Some(k) => k.to_string(),
                    None => continue,
                };
                if path.is_empty() && key == "fields" {
                    continue;
                }
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                // A literal of any type under a secret's key (`password: 86753091` too); a
                // mapping is a section (`auth:`) and is searched, an empty value holds nothing.
                let literal = !matches!(v, Yaml::Mapping(_) | Yaml::Null | Yaml::Tagged(_));
                let secret =
                    (literal && is_secret_key(&key)) || v.as_str().is_some_and(is_credential_value);
                if secret {
                    found.push((at, key));
                } else {
                    walk(v, &at, found);
                }
            }
        }
        Yaml::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{path}[{i}]"), found);
            }
        }
        Yaml::Tagged(t) => walk(&t.value, path, found),
        _ => {}
    }
}

/// Gives a handler's `config` the values its `…_env` keys name: `api_key_env: OPENAI_KEY`
/// adds `api_key` holding `$OPENAI_KEY`. Returns the variables that are not set.
pub(crate) fn resolve_env(config: &mut Json) -> Vec<(String, String)> {
    let mut missing = Vec::new();
    resolve(config, "", &mut missing);
    missing
}

fn resolve(v: &mut Json, path: &str, missing: &mut Vec<(String, String)>) {
    match v {
        Json::Object(map) => {
            let mut add = Vec::new();
            for (k, v) in map.iter_mut() {
                let at = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (k.strip_suffix("_env"), v.as_str()) {
                    (Some(name), Some(var)) if !name.is_empty() => match std::env::var(var) {
                        Ok(value) => add.push((name.to_string(), value)),
                        Err(_) => missing.push((at, var.to_string())),
                    },
                    _ => resolve(v, &at, missing),
                }
            }
            for (k, value) in add {
                map.insert(k, Json::String(value));
            }
        }
        Json::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                resolve(item, &format!("{path}[{i}]"), missing);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys_and_values_are_known_by_name_and_shape() {
        for k in [
            "token",
            "api-key",
            "X-Api-Key",
            "passphrase",
            "access_key",
            "pwd",
            "db_password",
            "Authorization",
            "auth",
            "session_cookie",
            "accessToken",
            "client.secret",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in [
            "token_env",
            "name",
            "style",
            "author",
            "to",
            "max_tokens",
            "key",
        ] {
            assert!(!is_secret_key(k), "{k}");
        }
        assert!(is_credential_value("Bearer abc"));
        assert!(is_credential_value("basic dXNlcjpwdw=="));
        assert!(!is_credential_value("Bearer"));
        assert!(!is_credential_value("plain"));
        assert!(
            !is_credential_value("béarer token"),
            "a character across the cut"
        );
    }

    #[test]
    fn literals_are_found_outside_fields_and_env_keys_resolve() {
        let y: Yaml = yaml_serde::from_str(
            "name: a\nfields: {Login: {password: string}}\nconfig:\n  pwd: x\n  headers: [{X-Auth: 'Bearer q'}]\n  token_env: T\n  password: 86753091\n  api_key: true\n  tokens_left: 3\n  secret: [a, b]\n  credentials: {user: u}\n  token:\n",
        )
        .unwrap();
        let found: Vec<String> = literals(&y).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            found,
            [
                "config.pwd",
                "config.headers[0].X-Auth",
                "config.password",
                "config.api_key",
                "config.secret"
            ]
        );

        std::env::set_var("AGENTSERVER_TEST_SECRET_X", "s3cret");
        let mut j = serde_json::json!({"key_env": "AGENTSERVER_TEST_SECRET_X", "n": [{"b_env": "AGENTSERVER_NOT_SET_Y"}]});
        let missing = resolve_env(&mut j);
        assert_eq!(j["key"], "s3cret");
        assert_eq!(
            missing,
            [(
                "n[0].b_env".to_string(),
                "AGENTSERVER_NOT_SET_Y".to_string()
            )]
        );
    }
}
