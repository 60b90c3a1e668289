//! The schema DSL (SPEC §11.3): `fields:` in YAML declares payload types without writing XSD.
//!
//! ```yaml
//! fields:
//!   Order:
//!     customer: string
//!     quantity: integer
//!     price: number          # xs:decimal
//!     express: boolean?      # `?`: optional
//!     tags: [string]         # a list: the element repeats, zero or more times
//!     address:               # a nested map: a complex element
//!       street: string
//!       zip: string?
//!     items: [{sku: string, n: integer}]   # a list of complex elements
//!     note?: {text: string}                # `?` on the key: an optional nested element
//! ```
//!
//! Each top-level key is a payload type (a global element); child elements appear in the order
//! written. The generated XSD is what validates, and what `/agents/{name}/schema` serves.

use yaml_serde::Value;

use crate::xml::escape_text;

fn ncname(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn builtin(t: &str) -> Option<&'static str> {
    Some(match t {
        "string" => "xs:string",
        "integer" => "xs:integer",
        "number" => "xs:decimal",
        "boolean" => "xs:boolean",
        _ => return None,
    })
}

/// Generates the XSD for a `fields:` mapping. Errors name the path (`Order.address.zip`).
pub fn fields_to_xsd(fields: &Value) -> Result<String, String> {
    let map = fields
        .as_mapping()
        .filter(|m| !m.is_empty())
        .ok_or("must map payload type names to their fields")?;
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- Generated from the listener's `fields:`. -->\n<xs:schema xmlns:xs=\"http://www.w3.org/2001/XMLSchema\">\n",
    );
    for (k, v) in map {
        let name = k.as_str().ok_or("payload type names must be strings")?;
        if !ncname(name) {
            return Err(format!("`{name}` is not a valid element name"));
        }
        out.push_str(&format!("  <xs:element name=\"{name}\">\n"));
        complex(v, name, 2, &mut out)?;
        out.push_str("  </xs:element>\n");
    }
    out.push_str("</xs:schema>\n");
    Ok(out)
}

fn pad(depth: usize) -> String {
    "  ".repeat(depth)
}

/// The complex type of a nested map.
fn complex(v: &Value, path: &str, depth: usize, out: &mut String) -> Result<(), String> {
    let map = v
        .as_mapping()
        .ok_or_else(|| format!("`{path}`: expected a map of fields"))?;
    let p = pad(depth);
    out.push_str(&format!("{p}<xs:complexType>\n{p}  <xs:sequence>\n"));
    for (k, fv) in map {
        let key = k
            .as_str()
            .ok_or_else(|| format!("`{path}`: field names must be strings"))?;
        let (name, key_optional) = match key.strip_suffix('?') {
            Some(n) => (n, true),
            None => (key, false),
        };
        let here = format!("{path}.{name}");
        if !ncname(name) {
            return Err(format!("`{here}`: `{name}` is not a valid element name"));
        }
        field(name, key_optional, fv, &here, depth + 2, out)?;
    }
    out.push_str(&format!("{p}  </xs:sequence>\n{p}</xs:complexType>\n"));
    Ok(())
}

fn field(
    name: &str,
    optional: bool,
    v: &Value,
    path: &str,
    depth: usize,
    out: &mut String,
) -> Result<(), String> {
    let p = pad(depth);
    let occurs = |min0: bool, many: bool| {
        let mut s = String::new();
        if min0 {
            s.push_str(" minOccurs=\"0\"");
        }
        if many {
            s.push_str(" maxOccurs=\"unbounded\"");
        }
        s
    };
    match v {
        Value::String(t) => {
            let (t, opt) = match t.strip_suffix('?') {
                Some(t) => (t.trim(), true),
                None => (t.trim(), false),
            };
            let (inner, many) = match t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
                Some(i) => (i.trim(), true),
                None => (t, false),
            };
            let xs = builtin(inner).ok_or_else(|| {
                format!(
                    "`{path}`: unknown type `{}` (use string, integer, number, boolean, [type], a `?` suffix, or a nested map)",
                    escape_text(t)
                )
            })?;
            out.push_str(&format!(
                "{p}<xs:element name=\"{name}\" type=\"{xs}\"{}/>\n",
                occurs(optional || opt || many, many)
            ));
        }
        Value::Mapping(_) => {
            out.push_str(&format!(
                "{p}<xs:element name=\"{name}\"{}>\n",
                occurs(optional, false)
            ));
            complex(v, path, depth + 1, out)?;
            out.push_str(&format!("{p}</xs:element>\n"));
        }
        Value::Sequence(items) => match items.as_slice() {
            [Value::String(_)] => {
                let inner = items[0].as_str().unwrap_or_default();
                field(
                    name,
                    true,
                    &Value::String(format!("[{inner}]")),
                    path,
                    depth,
                    out,
                )?;
            }
            [m @ Value::Mapping(_)] => {
                out.push_str(&format!(
                    "{p}<xs:element name=\"{name}\"{}>\n",
                    occurs(true, true)
                ));
                complex(m, path, depth + 1, out)?;
                out.push_str(&format!("{p}</xs:element>\n"));
            }
            _ => {
                return Err(format!(
                "`{path}`: a list gives exactly one item type, like [string] or [{{name: string}}]"
            ))
            }
        },
        _ => {
            return Err(format!(
                "`{path}`: expected a type name, a list [type] or a nested map"
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;
    use crate::xml::{normalize_payload, XmlLimits};

    fn schema(yaml: &str) -> std::sync::Arc<Schema> {
        let v: Value = yaml_serde::from_str(yaml).unwrap();
        let xsd = fields_to_xsd(&v).unwrap();
        Schema::compile("dsl", xsd).unwrap()
    }

    fn valid(s: &Schema, xml: &str) -> bool {
        s.validate(normalize_payload(xml, &XmlLimits::default()).unwrap())
            .is_ok()
    }

    #[test]
    fn generated_xsd_accepts_and_rejects_the_right_documents() {
        let s = schema(
            "Order:\n  customer: string\n  qty: integer\n  price: number\n  express: boolean?\n  tags: [string]\n  address:\n    street: string\n    zip: string?\n  items: [{sku: string}]\n  note?: {text: string}\n",
        );
        assert!(valid(&s, "<Order><customer>A</customer><qty>2</qty><price>9.5</price><address><street>S</street></address></Order>"));
        assert!(valid(&s, "<Order><customer>A</customer><qty>2</qty><price>1</price><express>true</express><tags>x</tags><tags>y</tags><address><street>S</street><zip>1</zip></address><items><sku>k</sku></items><items><sku>j</sku></items><note><text>t</text></note></Order>"));
        // Missing required, wrong type, wrong order, unknown field.
        assert!(!valid(
            &s,
            "<Order><qty>2</qty><price>1</price><address><street>S</street></address></Order>"
        ));
        assert!(!valid(&s, "<Order><customer>A</customer><qty>two</qty><price>1</price><address><street>S</street></address></Order>"));
        assert!(!valid(&s, "<Order><qty>2</qty><customer>A</customer><price>1</price><address><street>S</street></address></Order>"));
        assert!(!valid(&s, "<Order><customer>A</customer><qty>2</qty><price>1</price><address><street>S</street></address><extra/></Order>"));
        assert!(!valid(&s, "<Order><customer>A</customer><qty>2</qty><price>1</price><express>maybe</express><address><street>S</street></address></Order>"));
    }

    #[test]
    fn mistakes_name_their_path() {
        let v: Value = yaml_serde::from_str("Order:\n  address:\n    zip: strng\n").unwrap();
        let e = fields_to_xsd(&v).unwrap_err();
        assert!(
            e.contains("`Order.address.zip`") && e.contains("strng"),
            "{e}"
        );
        let v: Value = yaml_serde::from_str("Order:\n  bad name: string\n").unwrap();
        assert!(fields_to_xsd(&v)
            .unwrap_err()
            .contains("not a valid element name"));
        let v: Value = yaml_serde::from_str("[1, 2]").unwrap();
        assert!(fields_to_xsd(&v).is_err());
    }
}
