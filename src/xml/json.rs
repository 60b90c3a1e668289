//! The JSON view of a payload (SPEC §9): child elements become keys, repeated elements arrays,
//! attributes `@name`, text beside children or attributes `#text`. Leaves are strings here;
//! schema-typed leaves come with the schema model.

use quick_xml::events::Event;
use quick_xml::Reader;
use serde_json::{Map, Value};

struct Frame {
    name: String,
    map: Map<String, Value>,
    text: String,
}

/// Converts a normalized payload to JSON: the root element's content. Returns `Value::Null`
/// if the text is not well-formed (normalized payloads always are).
pub fn xml_to_json(xml: &str) -> Value {
    convert(xml).unwrap_or(Value::Null)
}

/// The local name of the root element of well-formed XML.
pub fn root_local_name(xml: &str) -> Option<String> {
    let mut reader = Reader::from_str(xml);
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) | Event::Empty(e) => return Some(local(e.name().as_ref())),
            Event::Eof => return None,
            _ => {}
        }
    }
}

fn local(name: &str) -> String {
    let name = std::borrow::Cow::Borrowed(name);
    match name.rsplit_once(':') {
        Some((_, l)) => l.to_string(),
        None => name.into_owned(),
    }
}

fn open(e: &quick_xml::events::BytesStart<'_>) -> Option<Frame> {
    let mut map = Map::new();
    for attr in e.attributes() {
        let attr = attr.ok()?;
        if attr.key.as_namespace_binding().is_some() {
            continue;
        }
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .ok()?
            .into_owned();
        map.insert(
            format!("@{}", local(attr.key.as_ref())),
            Value::String(value),
        );
    }
    Some(Frame {
        name: local(e.name().as_ref()),
        map,
        text: String::new(),
    })
}

fn close(frame: Frame) -> Value {
    if frame.map.is_empty() {
        return Value::String(frame.text);
    }
    let mut map = frame.map;
    if !frame.text.trim().is_empty() {
        map.insert("#text".into(), Value::String(frame.text));
    }
    Value::Object(map)
}

fn attach(parent: &mut Frame, name: String, value: Value) {
    match parent.map.get_mut(&name) {
        Some(Value::Array(items)) => items.push(value),
        Some(existing) => {
            let first = existing.take();
            *existing = Value::Array(vec![first, value]);
        }
        None => {
            parent.map.insert(name, value);
        }
    }
}

fn convert(xml: &str) -> Option<Value> {
    let mut reader = Reader::from_str(xml);
    let mut stack: Vec<Frame> = Vec::new();
    loop {
        match reader.read_event().ok()? {
            Event::Start(e) => stack.push(open(&e)?),
            Event::Empty(e) => {
                if let Some(root) = close_into(&mut stack, open(&e)?) {
                    return Some(root);
                }
            }
            Event::End(_) => {
                let frame = stack.pop()?;
                if let Some(root) = close_into(&mut stack, frame) {
                    return Some(root);
                }
            }
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(c) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&c.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                if let Some(top) = stack.last_mut() {
                    top.text
                        .push_str(&super::normalize::resolve_reference(&r, || 0).ok()?);
                }
            }
            Event::Eof => return None,
            _ => {}
        }
    }
}

/// Closes `frame` into its parent; returns the finished root's value when it has none.
fn close_into(stack: &mut [Frame], frame: Frame) -> Option<Value> {
    let name = frame.name.clone();
    let value = close(frame);
    match stack.last_mut() {
        Some(parent) => {
            attach(parent, name, value);
            None
        }
        None => Some(root_value(value)),
    }
}

/// An empty root is `{}` rather than `""`, so a payload is always an object or text.
fn root_value(value: Value) -> Value {
    match value {
        Value::String(s) if s.trim().is_empty() => Value::Object(Map::new()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn children_repeats_attributes_and_text_map_to_json() {
        let v = xml_to_json(
            "<A id=\"7\"><name>Dan</name><tag>a</tag><tag>b</tag><n u=\"kg\">3</n><e/></A>",
        );
        assert_eq!(
            v,
            json!({"@id": "7", "name": "Dan", "tag": ["a", "b"], "n": {"@u": "kg", "#text": "3"}, "e": ""})
        );
        assert_eq!(xml_to_json("<A/>"), json!({}));
    }
}
