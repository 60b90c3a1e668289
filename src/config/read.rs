//! Reading a section of the file into its serde model, with what is wrong said the way a user
//! writes the file: the key the problem is at (so its line is found), and the value it holds
//! against what it should hold ("a whole number", not "usize").

use serde::de::DeserializeOwned;

/// A section that did not read: the key path within it (`concurrency`, `nats.url`; none for
/// the section itself) and the message.
pub(super) struct Unread {
    pub key: Option<String>,
    pub message: String,
}

/// The most bytes an organism file may hold (read no further).
pub(super) const MAX_FILE_BYTES: u64 = 4 << 20;

/// The text of the organism file at `path`, at most [`MAX_FILE_BYTES`], or why not.
pub(super) fn file_text(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "cannot read: over {} MiB, the most an organism file may hold",
            MAX_FILE_BYTES >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|e| format!("cannot read: not UTF-8 text ({e})"))
}

/// How deep `[` and `{` may nest in an organism file, counted over `]` and `}` as bytes
/// (in quotes and comments too): twice what a file can nest and still be read (serde's
/// recursion limit, 128), so a file that reads is refused only if its strings or comments
/// hold over a hundred `[` or `{` left open. The YAML reader's time grows with the square of
/// that depth (yaml/yaml-serde#1: 100,000 `[` took minutes); bounded so, a file costs it time
/// in proportion to its size.
pub(super) const MAX_FLOW_DEPTH: usize = 256;

/// The line where `text`'s `[` and `{` first nest deeper than [`MAX_FLOW_DEPTH`], if they do.
pub(super) fn too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut line = 1;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => line += 1,
            _ => {}
        }
    }
    None
}

/// Reads `v` as a `T`.
pub(super) fn read<T: DeserializeOwned>(v: &yaml_serde::Value) -> Result<T, Unread> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        // An unknown or missing field is named by the message, at the path of its parent.
        let field = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| message.strip_prefix(p))
            .and_then(|rest| rest.split('`').next());
        let key = match (path.as_str(), field) {
            (".", Some(f)) => Some(f.to_string()),
            (".", None) => None,
            (p, Some(f)) if message.starts_with("missing") => Some(format!("{p}.{f}")),
            (p, _) => Some(p.to_string()),
        };
        Unread {
            message: in_words(&message, key.as_deref()),
            key,
        }
    })
}

/// serde's "invalid type: integer `8765`, expected a string" as "is the number 8765; it
/// must be a string", its Rust type names as what a user writes.
pub(super) fn in_words(message: &str, key: Option<&str>) -> String {
    let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
    else {
        return message.to_string();
    };
    let Some((got, expected)) = rest.split_once(", expected ") else {
        return message.to_string();
    };
    let got = match (got, got.split_once(' ')) {
        ("map", _) => "a mapping".to_string(),
        ("sequence", _) => "a list".to_string(),
        (_, Some(("integer" | "floating", n))) => format!("the number {}", n.trim_matches('`')),
        (_, Some(("string", s))) => format!("the text {s}"),
        (_, Some(("boolean", b))) => b.trim_matches('`').to_string(),
        _ => got.to_string(),
    };
    let expected = match expected.trim() {
        "usize" | "u64" | "u32" | "u16" | "u8" | "i64" | "i32" => "a whole number".to_string(),
        "f64" | "f32" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" if key.is_some_and(|k| k.ends_with("listen")) => {
            "a string such as 127.0.0.1:8765 (quote it)".to_string()
        }
        "a string" => "a string (quote it)".to_string(),
        "a sequence" => "a list".to_string(),
        e if e.starts_with("struct ") || e == "a map" => "a mapping (key: value lines)".to_string(),
        e => e.to_string(),
    };
    format!("is {got}; it must be {expected}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        name: String,
        concurrency: Option<usize>,
        nested: Option<Nested>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        listen: String,
    }

    fn unread(yaml: &str) -> (Option<String>, String) {
        let v: yaml_serde::Value = yaml_serde::from_str(yaml).unwrap();
        let e = read::<Item>(&v).unwrap_err();
        (e.key, e.message)
    }

    #[test]
    fn a_wrong_value_is_named_by_its_key_in_a_users_words() {
        assert_eq!(
            unread("name: a\nconcurrency: two\n"),
            (
                Some("concurrency".into()),
                "is the text \"two\"; it must be a whole number".into()
            )
        );
        assert_eq!(
            unread("name: a\nnested: {listen: 8765}\n"),
            (
                Some("nested.listen".into()),
                "is the number 8765; it must be a string such as 127.0.0.1:8765 (quote it)".into()
            )
        );
        let (key, message) = unread("name: a\nconcurency: 2\n");
        assert_eq!(key.as_deref(), Some("concurency"));
        assert!(
            message.starts_with("unknown field `concurency`"),
            "{message}"
        );
        assert_eq!(
            unread("name: a\nconcurrency: [1]\n").1,
            "is a list; it must be a whole number"
        );
        let (key, _) = unread("concurrency: 2\n");
        assert_eq!(key.as_deref(), Some("name"));
    }
}
