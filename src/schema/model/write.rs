//! JSON → XML in schema order: the one way a JSON payload becomes XML, for a type the
//! schema declares (`json_to_xml`) or for none (`untyped_json_to_xml`, keys sorted).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{MapError, Parts, SchemaModel, Ty, MAX_NESTING};
use crate::xml::escape_text;

impl SchemaModel {
    /// Writes the JSON view of a payload as XML: root element `local_name`, children in schema
    /// order. `None` if the schema declares no such global element.
    pub fn json_to_xml(&self, local_name: &str, value: &Value) -> Option<Result<String, MapError>> {
        let decl = self.root(local_name)?;
        let ty = self.element_type(decl, 0);
        let mut w = Writer {
            model: self,
            out: String::new(),
        };
        let (open_ns, prefix) = match (&self.target_ns, self.qualified) {
            (None, _) => (String::new(), ""),
            (Some(ns), true) => (format!(" xmlns=\"{}\"", escape_attr(ns)), ""),
            (Some(ns), false) => (format!(" xmlns:ns0=\"{}\"", escape_attr(ns)), "ns0:"),
        };
        let name = format!("{prefix}{local_name}");
        Some(
            w.element(&name, &open_ns, ty, value, "payload", 0)
                .map(|()| w.out),
        )
    }
}

impl SchemaModel {
    /// Writes a JSON payload as `<root>` when no schema describes it: keys in sorted order
    /// (SPEC §11.2), `@name` attributes, `#text` text. Validation decides the rest.
    pub fn untyped_json_to_xml(root: &str, value: &Value) -> Result<String, MapError> {
        check_name(root, "type")?;
        let empty = SchemaModel {
            target_ns: None,
            qualified: false,
            xsd_prefixes: Vec::new(),
            elements: HashMap::new(),
            complex: HashMap::new(),
            simple: HashMap::new(),
        };
        let mut sorted = value.clone();
        sort_keys(&mut sorted);
        let mut w = Writer {
            model: &empty,
            out: String::new(),
        };
        w.element(root, "", Ty::Any, &sorted, "payload", 0)?;
        Ok(w.out)
    }
}

fn sort_keys(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

fn escape_attr(s: &str) -> String {
    escape_text(s).replace('"', "&quot;")
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `text` as XML may hold it, or why not, at `path`.
fn xml_text(text: String, path: &str) -> Result<String, MapError> {
    match crate::xml::disallowed_char(&text) {
        Some((_, c)) => Err(err(path, crate::xml::disallowed_char_message(c))),
        None => Ok(text),
    }
}

fn err(path: &str, message: impl Into<String>) -> MapError {
    MapError {
        path: path.to_string(),
        message: message.into(),
    }
}

struct Writer<'m> {
    model: &'m SchemaModel,
    out: String,
}

impl Writer<'_> {
    /// Writes `value` as one or more `<name>` elements (an array repeats the element).
    fn element(
        &mut self,
        name: &str,
        extra: &str,
        ty: Ty<'_>,
        value: &Value,
        path: &str,
        depth: usize,
    ) -> Result<(), MapError> {
        if depth > MAX_NESTING {
            return Err(err(path, "nested too deeply"));
        }
        match value {
            Value::Null => Ok(()),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if item.is_array() {
                        return Err(err(path, "an array may not directly hold an array"));
                    }
                    self.element(name, extra, ty, item, &format!("{path}[{i}]"), depth + 1)?;
                }
                Ok(())
            }
            Value::Object(map) => {
                let parts = match ty {
                    Ty::Complex(ct) => {
                        let mut parts = Parts::default();
                        self.model.parts(ct, depth, &mut parts);
                        Some(parts)
                    }
                    Ty::Leaf(_) => {
                        return Err(err(path, "expected a text, number or boolean value"))
                    }
                    Ty::Any => None,
                };
                self.object(name, extra, parts.as_ref(), map, path, depth)
            }
            scalar => {
                let text = xml_text(scalar_text(scalar).unwrap_or_default(), path)?;
                if let Ty::Complex(ct) = ty {
                    let mut parts = Parts::default();
                    self.model.parts(ct, depth, &mut parts);
                    if parts.text.is_none() && !text.is_empty() {
                        return Err(err(
                            path,
                            "expected an object: this element has child elements",
                        ));
                    }
                }
                self.out
                    .push_str(&format!("<{name}{extra}>{}</{name}>", escape_text(&text)));
                Ok(())
            }
        }
    }

    fn object(
        &mut self,
        name: &str,
        extra: &str,
        parts: Option<&Parts<'_>>,
        map: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<(), MapError> {
        self.out.push('<');
        self.out.push_str(name);
        self.out.push_str(extra);
        for (key, v) in map {
            let Some(attr) = key.strip_prefix('@') else {
                continue;
            };
            if let Some(p) = parts {
                if !p.any_attribute && !p.attributes.iter().any(|(n, _)| *n == attr) {
                    return Err(err(
                        &format!("{path}.{key}"),
                        format!("`{name}` declares no attribute `{attr}`"),
                    ));
                }
            }
            let at = format!("{path}.{key}");
            let text = scalar_text(v)
                .ok_or_else(|| err(&at, "an attribute value must be a text, number or boolean"))?;
            let text = xml_text(text, &at)?;
            self.out
                .push_str(&format!(" {attr}=\"{}\"", escape_attr(&text)));
        }
        self.out.push('>');
        if let Some(t) = map.get("#text") {
            let at = format!("{path}.#text");
            let text =
                scalar_text(t).ok_or_else(|| err(&at, "text must be a text, number or boolean"))?;
            let text = xml_text(text, &at)?;
            self.out.push_str(&escape_text(&text));
        }
        let child_prefix = match (&self.model.target_ns, self.model.qualified) {
            (Some(_), false) => "ns0:",
            _ => "",
        };
        match parts {
            Some(p) => {
                for (child, decl) in &p.children {
                    if let Some(v) = map.get(*child) {
                        let ty = self.model.element_type(decl, depth + 1);
                        let qualified_ref = decl.attr("ref").is_some();
                        let tag = if qualified_ref {
                            format!("{child_prefix}{child}")
                        } else {
                            child.to_string()
                        };
                        self.element(&tag, "", ty, v, &format!("{path}.{child}"), depth + 1)?;
                    }
                }
                for (key, v) in map {
                    if key.starts_with('@')
                        || key == "#text"
                        || p.children.iter().any(|(n, _)| n == key)
                    {
                        continue;
                    }
                    if !p.wildcard {
                        let expected: Vec<&str> = p.children.iter().map(|(n, _)| *n).collect();
                        return Err(err(
                            &format!("{path}.{key}"),
                            format!(
                                "`{name}` has no child element `{key}` (expected one of: {})",
                                expected.join(", ")
                            ),
                        ));
                    }
                    check_name(key, path)?;
                    self.element(key, "", Ty::Any, v, &format!("{path}.{key}"), depth + 1)?;
                }
            }
            None => {
                for (key, v) in map {
                    if key.starts_with('@') || key == "#text" {
                        continue;
                    }
                    check_name(key, path)?;
                    self.element(key, "", Ty::Any, v, &format!("{path}.{key}"), depth + 1)?;
                }
            }
        }
        self.out.push_str(&format!("</{name}>"));
        Ok(())
    }
}

/// A JSON key written as an element name must be a plain XML name.
fn check_name(key: &str, path: &str) -> Result<(), MapError> {
    let mut chars = key.chars();
    let ok = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(err(
            &format!("{path}.{key}"),
            format!("`{key}` is not a valid element name"),
        ))
    }
}
