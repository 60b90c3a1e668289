//! The schema model: what an XSD says about the shape of its payloads, read once at compile
//! time. It serves both directions of the JSON view (SPEC §9, §11.2):
//!
//! - **XML → JSON with typed leaves**: a leaf whose declared type is numeric becomes a JSON
//!   number, `xs:boolean` a JSON boolean; everything else stays a string.
//! - **JSON → XML in schema order**: child elements are written in the order the schema
//!   declares them (sequence, all, choice, complexContent extensions), whatever order the
//!   JSON object has. A key the schema does not declare is an error naming its path, unless
//!   the type has an `xs:any` wildcard.
//!
//! The model does not validate: libxml2 does, on the text this writes. Supported: global
//! elements and `ref`, named and anonymous complex and simple types, sequence/all/choice
//! (nested), min/maxOccurs (through arrays), attributes, simple content, mixed `#text`,
//! `elementFormDefault`. Unknown constructs fall back to untyped strings and JSON order.

use std::collections::HashMap;

use quick_xml::events::Event;
use quick_xml::Reader;
use serde_json::Value;

mod fields;
mod write;

pub use fields::{Field, MAX_FIELDS, MAX_FIELD_DEPTH};

const XSD_NS: &str = "http://www.w3.org/2001/XMLSchema";
/// Deep enough for any real schema; stops recursive types from looping.
const MAX_NESTING: usize = 64;

/// An element of the XSD document (local names only; annotations dropped).
#[derive(Debug)]
struct Node {
    name: String,
    attrs: Vec<(String, String)>,
    children: Vec<Node>,
}

impl Node {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A leaf's JSON kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    Text,
    Number,
    Boolean,
}

#[derive(Clone, Copy)]
enum Ty<'a> {
    Leaf(Leaf),
    Complex(&'a Node),
    Any,
}

/// Why a JSON payload could not be written as XML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{path}`: {message}")]
pub struct MapError {
    /// Where in the JSON payload, like `payload.items[2].name`.
    pub path: String,
    pub message: String,
}

/// The shape of one XSD's payloads.
#[derive(Debug)]
pub struct SchemaModel {
    target_ns: Option<String>,
    qualified: bool,
    /// Prefixes bound to the XSD namespace (`""` for the default namespace).
    xsd_prefixes: Vec<String>,
    elements: HashMap<String, Node>,
    complex: HashMap<String, Node>,
    simple: HashMap<String, Node>,
}

fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

fn parse_tree(xsd: &str) -> Option<Node> {
    let mut reader = Reader::from_str(xsd);
    let mut stack: Vec<Node> = Vec::new();
    let mut skip = 0usize;
    loop {
        let (e, empty) = match reader.read_event().ok()? {
            Event::Start(e) => (e, false),
            Event::Empty(e) => (e, true),
            Event::End(_) => {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                let done = stack.pop()?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(done),
                    None => return Some(done),
                }
                continue;
            }
            Event::Eof => return None,
            _ => continue,
        };
        let name = local(e.name().as_ref()).to_string();
        if skip > 0 || name == "annotation" {
            if !empty {
                skip += 1;
            }
            continue;
        }
        let mut attrs = Vec::new();
        for a in e.attributes() {
            let a = a.ok()?;
            let key = a.key.as_ref().to_string();
            let value = a
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .ok()?
                .into_owned();
            attrs.push((key, value));
        }
        let node = Node {
            name,
            attrs,
            children: Vec::new(),
        };
        if empty {
            match stack.last_mut() {
                Some(parent) => parent.children.push(node),
                None => return Some(node),
            }
        } else {
            stack.push(node);
        }
    }
}

fn builtin(local: &str) -> Leaf {
    match local {
        "boolean" => Leaf::Boolean,
        "decimal" | "float" | "double" | "integer" | "int" | "long" | "short" | "byte"
        | "nonNegativeInteger" | "positiveInteger" | "nonPositiveInteger" | "negativeInteger"
        | "unsignedLong" | "unsignedInt" | "unsignedShort" | "unsignedByte" => Leaf::Number,
        _ => Leaf::Text,
    }
}

impl SchemaModel {
    /// Reads the model out of an XSD. `None` if the text is not a schema document.
    pub fn read(xsd: &str) -> Option<SchemaModel> {
        let root = parse_tree(xsd)?;
        if root.name != "schema" {
            return None;
        }
        let xsd_prefixes = root
            .attrs
            .iter()
            .filter(|(_, v)| v == XSD_NS)
            .filter_map(|(k, _)| {
                if k == "xmlns" {
                    Some(String::new())
                } else {
                    k.strip_prefix("xmlns:").map(str::to_string)
                }
            })
            .collect();
        let mut model = SchemaModel {
            target_ns: root.attr("targetNamespace").map(str::to_string),
            qualified: root.attr("elementFormDefault") == Some("qualified"),
            xsd_prefixes,
            elements: HashMap::new(),
            complex: HashMap::new(),
            simple: HashMap::new(),
        };
        for child in root.children {
            let Some(name) = child.attr("name").map(str::to_string) else {
                continue;
            };
            match child.name.as_str() {
                "element" => {
                    model.elements.insert(name, child);
                }
                "complexType" => {
                    model.complex.insert(name, child);
                }
                "simpleType" => {
                    model.simple.insert(name, child);
                }
                _ => {}
            }
        }
        Some(model)
    }

    fn is_builtin(&self, qname: &str) -> bool {
        let prefix = qname.rsplit_once(':').map_or("", |(p, _)| p);
        self.xsd_prefixes.iter().any(|p| p == prefix)
    }

    fn named_type(&self, qname: &str, depth: usize) -> Ty<'_> {
        let name = local(qname);
        if self.is_builtin(qname) {
            return if name == "anyType" {
                Ty::Any
            } else {
                Ty::Leaf(builtin(name))
            };
        }
        if let Some(ct) = self.complex.get(name) {
            return Ty::Complex(ct);
        }
        if let Some(st) = self.simple.get(name) {
            return Ty::Leaf(self.simple_leaf(st, depth + 1));
        }
        Ty::Any
    }

    fn simple_leaf(&self, st: &Node, depth: usize) -> Leaf {
        if depth > MAX_NESTING {
            return Leaf::Text;
        }
        for c in &st.children {
            if c.name == "restriction" {
                if let Some(base) = c.attr("base") {
                    return match self.named_type(base, depth) {
                        Ty::Leaf(l) => l,
                        _ => Leaf::Text,
                    };
                }
                if let Some(inner) = c.children.iter().find(|n| n.name == "simpleType") {
                    return self.simple_leaf(inner, depth + 1);
                }
            }
        }
        Leaf::Text
    }

    /// The type of an `xs:element` declaration (global or local).
    fn element_type<'a>(&'a self, decl: &'a Node, depth: usize) -> Ty<'a> {
        if depth > MAX_NESTING {
            return Ty::Any;
        }
        if let Some(r) = decl.attr("ref") {
            return match self.elements.get(local(r)) {
                Some(g) => self.element_type(g, depth + 1),
                None => Ty::Any,
            };
        }
        if let Some(t) = decl.attr("type") {
            return self.named_type(t, depth);
        }
        for c in &decl.children {
            match c.name.as_str() {
                "complexType" => return Ty::Complex(c),
                "simpleType" => return Ty::Leaf(self.simple_leaf(c, depth + 1)),
                _ => {}
            }
        }
        Ty::Any
    }

    fn decl_name(decl: &Node) -> Option<&str> {
        decl.attr("name").or_else(|| decl.attr("ref").map(local))
    }

    /// A complex type's parts: child element declarations in schema order, attributes, the
    /// simple content's leaf (if any), and whether it has a wildcard.
    fn parts<'a>(&'a self, ct: &'a Node, depth: usize, out: &mut Parts<'a>) {
        if depth > MAX_NESTING {
            out.wildcard = true;
            return;
        }
        if ct.attr("mixed") == Some("true") {
            out.text = Some(Leaf::Text);
        }
        for c in &ct.children {
            match c.name.as_str() {
                "sequence" | "all" | "choice" => self.particles(c, depth + 1, out),
                "attribute" => {
                    if let Some(name) = Self::decl_name(c) {
                        let leaf = match c.attr("type") {
                            Some(t) => match self.named_type(t, depth) {
                                Ty::Leaf(l) => l,
                                _ => Leaf::Text,
                            },
                            None => c
                                .children
                                .iter()
                                .find(|n| n.name == "simpleType")
                                .map_or(Leaf::Text, |st| self.simple_leaf(st, depth + 1)),
                        };
                        out.attributes.push((name, leaf));
                    }
                }
                "anyAttribute" => out.any_attribute = true,
                "simpleContent" | "complexContent" => {
                    for d in &c.children {
                        if let Some(base) = d.attr("base") {
                            match self.named_type(base, depth) {
                                Ty::Complex(b) => self.parts(b, depth + 1, out),
                                Ty::Leaf(l) => out.text = Some(l),
                                Ty::Any => out.wildcard = true,
                            }
                        }
                        self.parts(d, depth + 1, out);
                    }
                }
                "group" | "attributeGroup" => out.wildcard = true,
                _ => {}
            }
        }
    }

    fn particles<'a>(&'a self, group: &'a Node, depth: usize, out: &mut Parts<'a>) {
        if depth > MAX_NESTING {
            return;
        }
        for p in &group.children {
            match p.name.as_str() {
                "element" => {
                    if let Some(name) = Self::decl_name(p) {
                        if !out.children.iter().any(|(n, _)| *n == name) {
                            out.children.push((name, p));
                        }
                    }
                }
                "sequence" | "all" | "choice" => self.particles(p, depth + 1, out),
                _ => out.wildcard = true,
            }
        }
    }

    /// The global element named `local_name` (a payload type).
    fn root(&self, local_name: &str) -> Option<&Node> {
        self.elements.get(local_name)
    }

    /// Types the leaves of `value` (the JSON view of a payload whose root element is
    /// `local_name`) as the schema declares them.
    pub fn type_json(&self, local_name: &str, value: &mut Value) {
        if let Some(decl) = self.root(local_name) {
            let ty = self.element_type(decl, 0);
            self.type_value(ty, value, 0);
        }
    }

    fn type_value(&self, ty: Ty<'_>, value: &mut Value, depth: usize) {
        if depth > MAX_NESTING {
            return;
        }
        if let Value::Array(items) = value {
            for item in items {
                self.type_value(ty, item, depth + 1);
            }
            return;
        }
        match ty {
            Ty::Any => {}
            Ty::Leaf(leaf) => convert_leaf(leaf, value),
            Ty::Complex(ct) => {
                let mut parts = Parts::default();
                self.parts(ct, depth, &mut parts);
                match value {
                    Value::Object(map) => {
                        for (key, v) in map.iter_mut() {
                            if let Some(attr) = key.strip_prefix('@') {
                                if let Some((_, leaf)) =
                                    parts.attributes.iter().find(|(n, _)| *n == attr)
                                {
                                    convert_leaf(*leaf, v);
                                }
                            } else if key == "#text" {
                                if let Some(leaf) = parts.text {
                                    convert_leaf(leaf, v);
                                }
                            } else if let Some((_, decl)) =
                                parts.children.iter().find(|(n, _)| *n == key)
                            {
                                // A repeatable element is always an array, even with one item.
                                let repeatable =
                                    decl.attr("maxOccurs").is_some_and(|m| m != "1" && m != "0");
                                if repeatable && !v.is_array() {
                                    *v = Value::Array(vec![v.take()]);
                                }
                                let child = self.element_type(decl, depth + 1);
                                self.type_value(child, v, depth + 1);
                            }
                        }
                    }
                    other => {
                        if let Some(leaf) = parts.text {
                            convert_leaf(leaf, other);
                        }
                    }
                }
            }
        }
    }
}

#[derive(Default)]
struct Parts<'a> {
    children: Vec<(&'a str, &'a Node)>,
    attributes: Vec<(&'a str, Leaf)>,
    text: Option<Leaf>,
    wildcard: bool,
    any_attribute: bool,
}

fn convert_leaf(leaf: Leaf, value: &mut Value) {
    let Value::String(s) = value else { return };
    let t = s.trim();
    let typed = match leaf {
        Leaf::Text => return,
        Leaf::Boolean => match t {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => return,
        },
        Leaf::Number => {
            if let Ok(i) = t.parse::<i64>() {
                Value::from(i)
            } else if let Some(n) = t.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                Value::Number(n)
            } else {
                return;
            }
        }
    };
    *value = typed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const XSD: &str = r#"<?xml version="1.0"?>
<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:t" elementFormDefault="qualified">
  <xs:annotation><xs:documentation>ignored <b>markup</b></xs:documentation></xs:annotation>
  <xs:simpleType name="Count"><xs:restriction base="xs:int"><xs:minInclusive value="0"/></xs:restriction></xs:simpleType>
  <xs:complexType name="Item">
    <xs:sequence>
      <xs:element name="label" type="xs:string"/>
      <xs:element name="qty" type="Count"/>
    </xs:sequence>
    <xs:attribute name="urgent" type="xs:boolean"/>
  </xs:complexType>
  <xs:element name="Order">
    <xs:complexType>
      <xs:sequence>
        <xs:element name="customer" type="xs:string"/>
        <xs:element name="item" type="Item" maxOccurs="unbounded"/>
        <xs:choice>
          <xs:element name="express" type="xs:boolean"/>
          <xs:element name="note" type="xs:string"/>
        </xs:choice>
        <xs:element name="price">
          <xs:complexType><xs:simpleContent><xs:extension base="xs:decimal">
            <xs:attribute name="currency" type="xs:string"/>
          </xs:extension></xs:simpleContent></xs:complexType>
        </xs:element>
      </xs:sequence>
    </xs:complexType>
  </xs:element>
</xs:schema>"#;

    #[test]
    fn json_is_written_in_schema_order_and_read_back_typed() {
        let m = SchemaModel::read(XSD).unwrap();
        let payload = json!({
            "price": {"@currency": "EUR", "#text": 9.5},
            "express": true,
            "item": [{"qty": 2, "label": "a & b", "@urgent": true}, {"label": "c", "qty": 1}],
            "customer": "Dan"
        });
        let xml = m.json_to_xml("Order", &payload).unwrap().unwrap();
        assert_eq!(
            xml,
            "<Order xmlns=\"urn:t\"><customer>Dan</customer>\
             <item urgent=\"true\"><label>a &amp; b</label><qty>2</qty></item>\
             <item><label>c</label><qty>1</qty></item>\
             <express>true</express><price currency=\"EUR\">9.5</price></Order>"
        );
        let mut back = crate::xml::xml_to_json(&xml);
        m.type_json("Order", &mut back);
        assert_eq!(back["item"][0]["qty"], json!(2));
        assert_eq!(back["item"][0]["@urgent"], json!(true));
        assert_eq!(back["express"], json!(true));
        assert_eq!(back["price"]["#text"], json!(9.5));
        assert_eq!(back["customer"], json!("Dan"));

        // A repeatable element is an array even when it occurs once.
        let one = m
            .json_to_xml("Order", &json!({"customer": "A", "item": {"label": "x", "qty": 1}, "note": "n", "price": 1}))
            .unwrap()
            .unwrap();
        let mut back = crate::xml::xml_to_json(&one);
        m.type_json("Order", &mut back);
        assert_eq!(back["item"], json!([{"label": "x", "qty": 1}]));
    }

    #[test]
    fn unknown_keys_and_wrong_shapes_name_their_path() {
        let m = SchemaModel::read(XSD).unwrap();
        let e = m
            .json_to_xml(
                "Order",
                &json!({"customer": "x", "item": [{"label": "a", "colour": 1}]}),
            )
            .unwrap()
            .unwrap_err();
        assert_eq!(e.path, "payload.item[0].colour");
        assert!(e.message.contains("expected one of: label, qty"), "{e}");
        let e = m
            .json_to_xml("Order", &json!({"customer": {"first": "x"}}))
            .unwrap()
            .unwrap_err();
        assert_eq!(e.path, "payload.customer");
        assert!(m.json_to_xml("Nope", &json!({})).is_none());
    }

    #[test]
    fn unqualified_local_elements_stay_out_of_the_namespace() {
        let xsd = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:u">
            <xs:element name="Ping"><xs:complexType><xs:sequence>
              <xs:element name="n" type="xs:integer"/></xs:sequence></xs:complexType></xs:element>
          </xs:schema>"#;
        let m = SchemaModel::read(xsd).unwrap();
        let xml = m.json_to_xml("Ping", &json!({"n": 3})).unwrap().unwrap();
        assert_eq!(xml, "<ns0:Ping xmlns:ns0=\"urn:u\"><n>3</n></ns0:Ping>");
    }
}
