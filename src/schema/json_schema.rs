//! A payload type as JSON Schema (2020-12): the JSON that inject, a Lua output or an LLM's
//! tool call writes as that type's XML ([`super::Schema::json_to_payload`]). Made from the
//! same field tree as the dashboard's form, so all three agree on the shape. What JSON Schema
//! cannot say (patterns, ranges, enumerations of the XSD) the XSD still checks: a payload
//! passes [`super::Schema::validate`] or is refused.

use serde_json::{json, Map, Value};

use super::{Field, Leaf};

/// XSD types whose values are whole numbers.
const INTEGERS: [&str; 13] = [
    "integer",
    "int",
    "long",
    "short",
    "byte",
    "nonNegativeInteger",
    "positiveInteger",
    "nonPositiveInteger",
    "negativeInteger",
    "unsignedInt",
    "unsignedLong",
    "unsignedShort",
    "unsignedByte",
];

/// The schema of a leaf of XSD type `type_name`.
pub fn leaf(l: Leaf, type_name: &str) -> Value {
    match l {
        Leaf::Boolean => json!({"type": "boolean"}),
        Leaf::Number if INTEGERS.contains(&type_name) => json!({"type": "integer"}),
        Leaf::Number => json!({"type": "number"}),
        Leaf::Text => json!({"type": "string"}),
    }
}

/// The schema of an object with `fields`, in their order, no other keys allowed.
pub fn object(fields: &[Field]) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for f in fields {
        let one = match (f.leaf, &f.children) {
            (Some(l), _) => leaf(l, &f.type_name),
            (None, Some(children)) => object(children),
            (None, None) => json!({"type": "object"}),
        };
        let value = if f.repeated {
            json!({"type": "array", "items": one})
        } else {
            one
        };
        if !f.optional {
            required.push(json!(f.name));
        }
        properties.insert(f.name.clone(), value);
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_repeats_and_nesting_become_their_json_schema() {
        let xsd = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Order">
    <xs:complexType><xs:sequence>
      <xs:element name="id" type="xs:int"/>
      <xs:element name="total" type="xs:decimal"/>
      <xs:element name="rush" type="xs:boolean" minOccurs="0"/>
      <xs:element name="line" maxOccurs="unbounded">
        <xs:complexType><xs:sequence>
          <xs:element name="sku" type="xs:string"/>
        </xs:sequence></xs:complexType>
      </xs:element>
    </xs:sequence></xs:complexType>
  </xs:element>
</xs:schema>"#;
        let schema = crate::schema::Schema::compile("t.xsd", xsd).unwrap();
        assert_eq!(
            schema.json_schema("Order").unwrap(),
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "total": {"type": "number"},
                    "rush": {"type": "boolean"},
                    "line": {"type": "array", "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}},
                        "required": ["sku"],
                        "additionalProperties": false,
                    }},
                },
                "required": ["id", "total", "line"],
                "additionalProperties": false,
            })
        );
        assert!(schema.json_schema("Nope").is_none());
    }
}
