//! A payload type's fields as a tree, for a form that builds the payload (the dashboard's
//! inject form): each element in schema order with its type, how often it may occur and its
//! own elements. Read from the same model that writes JSON as XML, so a form and the server
//! agree on the shape.

use super::{local, Leaf, Node, Parts, SchemaModel, Ty};

/// Fields in one tree, at most: a schema whose types nest wide and deep stops here.
pub const MAX_FIELDS: usize = 1_000;
/// Levels of nested elements in one tree, at most.
pub const MAX_FIELD_DEPTH: usize = 8;

/// One element of a payload type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The XSD type's local name (`int`, `string`, or a named type); `string` when the
    /// schema names none for a leaf, empty for an element with elements of its own.
    pub type_name: String,
    /// A leaf's JSON kind; `None` for an element with elements of its own.
    pub leaf: Option<Leaf>,
    /// `minOccurs="0"`.
    pub optional: bool,
    /// `maxOccurs` above 1 or `unbounded`.
    pub repeated: bool,
    /// Its own elements, when it has some (cut at [`MAX_FIELD_DEPTH`]).
    pub children: Option<Vec<Field>>,
}

impl SchemaModel {
    /// The fields of the payload type whose root element is `local_name`; `None` if the
    /// schema declares no such global element.
    pub fn fields(&self, local_name: &str) -> Option<Vec<Field>> {
        let decl = self.root(local_name)?;
        let mut budget = MAX_FIELDS;
        Some(match self.element_type(decl, 0) {
            Ty::Complex(ct) => self.fields_of(self.parts_of(ct, 0), 0, &mut budget),
            _ => Vec::new(),
        })
    }

    /// The JSON kind of the payload type `local_name` when its root element is a leaf (text
    /// content only, as `<Note>hi</Note>`): its JSON is a plain value, not an object.
    pub fn root_leaf(&self, local_name: &str) -> Option<Leaf> {
        let decl = self.root(local_name)?;
        match self.element_type(decl, 0) {
            Ty::Leaf(l) => Some(l),
            Ty::Any => None,
            Ty::Complex(ct) => {
                let parts = self.parts_of(ct, 0);
                parts.text.filter(|_| parts.children.is_empty())
            }
        }
    }

    /// A complex type's parts, read once: the caller decides from them whether it is a
    /// leaf to a form, and its fields are made from the same parts.
    fn parts_of<'a>(&'a self, ct: &'a Node, depth: usize) -> Parts<'a> {
        let mut parts = Parts::default();
        self.parts(ct, depth, &mut parts);
        parts
    }

    fn fields_of(&self, parts: Parts<'_>, depth: usize, budget: &mut usize) -> Vec<Field> {
        let mut out = Vec::new();
        for (name, decl) in parts.children {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            let (leaf, children) = match self.element_type(decl, depth) {
                Ty::Leaf(l) => (Some(l), None),
                Ty::Any => (Some(Leaf::Text), None),
                Ty::Complex(c) => {
                    let inner = self.parts_of(c, depth + 1);
                    match (inner.children.is_empty(), inner.text) {
                        // Simple content (text, with attributes): a leaf to a form.
                        (true, Some(l)) => (Some(l), None),
                        _ if depth + 1 >= MAX_FIELD_DEPTH => (None, Some(Vec::new())),
                        _ => (None, Some(self.fields_of(inner, depth + 1, budget))),
                    }
                }
            };
            let type_name = match (self.type_name(decl, 0), leaf) {
                (Some(t), _) => t.to_string(),
                (None, Some(_)) => "string".to_string(),
                (None, None) => String::new(),
            };
            out.push(Field {
                name: name.to_string(),
                type_name,
                leaf,
                optional: decl.attr("minOccurs") == Some("0"),
                repeated: decl
                    .attr("maxOccurs")
                    .is_some_and(|m| m == "unbounded" || m.parse::<u64>().is_ok_and(|n| n > 1)),
                children,
            });
        }
        out
    }

    /// The local name of the type a declaration names: its own `type`, its global
    /// element's (for a `ref`), or its inline simple type's base.
    fn type_name<'a>(&'a self, decl: &'a Node, depth: usize) -> Option<&'a str> {
        if depth > 4 {
            return None;
        }
        if let Some(t) = decl.attr("type") {
            return Some(local(t));
        }
        if let Some(r) = decl.attr("ref") {
            return self
                .elements
                .get(local(r))
                .and_then(|g| self.type_name(g, depth + 1));
        }
        decl.children
            .iter()
            .find(|n| n.name == "simpleType")
            .and_then(|st| st.children.iter().find(|n| n.name == "restriction"))
            .and_then(|r| r.attr("base"))
            .map(local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Order">
    <xs:complexType><xs:sequence>
      <xs:element name="id" type="xs:int"/>
      <xs:element name="note" type="xs:string" minOccurs="0"/>
      <xs:element name="line" type="Line" maxOccurs="unbounded"/>
      <xs:element name="price"><xs:simpleType><xs:restriction base="xs:decimal"/></xs:simpleType></xs:element>
    </xs:sequence></xs:complexType>
  </xs:element>
  <xs:complexType name="Line"><xs:sequence>
    <xs:element name="sku"/>
    <xs:element name="qty" type="xs:positiveInteger"/>
  </xs:sequence></xs:complexType>
  <xs:complexType name="Tree"><xs:sequence>
    <xs:element name="a" type="Tree" minOccurs="0"/><xs:element name="b" type="Tree" minOccurs="0"/>
  </xs:sequence></xs:complexType>
  <xs:element name="Root" type="Tree"/>
</xs:schema>"#;

    #[test]
    fn fields_follow_the_schema_in_order_with_types_and_occurrence() {
        let m = SchemaModel::read(XSD).unwrap();
        let f = m.fields("Order").unwrap();
        let names: Vec<_> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["id", "note", "line", "price"]);
        assert_eq!(
            (f[0].type_name.as_str(), f[0].leaf),
            ("int", Some(Leaf::Number))
        );
        assert!(f[1].optional && !f[1].repeated);
        assert!(f[2].repeated && f[2].leaf.is_none());
        let line = f[2].children.as_ref().unwrap();
        assert_eq!(line[0].type_name, "string");
        assert_eq!(line[1].leaf, Some(Leaf::Number));
        assert_eq!(
            (f[3].type_name.as_str(), f[3].leaf),
            ("decimal", Some(Leaf::Number))
        );
        assert_eq!(m.fields("Nope"), None);
    }

    /// A type made of itself, twice over, stops at the depth and the count.
    #[test]
    fn a_recursive_type_is_cut_by_depth_and_count() {
        let m = SchemaModel::read(XSD).unwrap();
        fn count(f: &[Field], depth: usize, deepest: &mut usize) -> usize {
            if !f.is_empty() {
                *deepest = (*deepest).max(depth);
            }
            f.iter()
                .map(|x| {
                    1 + x
                        .children
                        .as_deref()
                        .map_or(0, |c| count(c, depth + 1, deepest))
                })
                .sum()
        }
        let mut deepest = 0;
        let n = count(&m.fields("Root").unwrap(), 1, &mut deepest);
        assert!(n <= MAX_FIELDS, "{n}");
        assert!(deepest <= MAX_FIELD_DEPTH, "{deepest}");
    }
}
