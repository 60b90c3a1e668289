//! A verdict reused (`Schema::validate` on a payload given again), and the XSDs that would
//! have libxml2 read another document when it compiles.

use super::tests::{norm, XSD};
use super::{names_other_documents, Schema, READS};

#[test]
fn a_payload_given_again_is_read_again_only_by_a_schema_of_another_text() {
    let reads = || READS.with(|r| r.get());
    let first = Schema::compile("a.xsd", XSD).unwrap();
    let twin = Schema::compile("twin.xsd", XSD).unwrap();
    let other = Schema::compile("other.xsd", XSD.replace("xs:string", "xs:int")).unwrap();
    assert_eq!(first.verdicts, twin.verdicts);
    assert_ne!(first.verdicts, other.verdicts);
    let greeting = "<Greeting><name>x</name></Greeting>";
    let valid = first.validate(norm(greeting)).unwrap();
    let before = reads();
    assert_eq!(twin.validate(valid.again()).unwrap(), valid);
    assert!(first.validate(valid.again()).is_ok());
    assert_eq!(reads(), before, "the verdict is reused");
    let err = other.validate(valid.again()).unwrap_err();
    assert!(
        err.to_string().contains("'x' is not a valid value"),
        "{err}"
    );
    // The same text read by the normalizer carries no verdict: it is read.
    assert!(twin.validate(norm(greeting)).is_ok());
    assert_eq!(reads(), before + 2);
    // A schema that takes declarations from elsewhere has verdicts of its own compile.
    let import = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
      <xs:import namespace="urn:x"/><xs:element name="a" type="xs:string"/></xs:schema>"#;
    let one = Schema::compile("i.xsd", import).unwrap();
    let two = Schema::compile("i.xsd", import).unwrap();
    assert_ne!(one.verdicts, two.verdicts);
    let a = one.validate(norm("<a>y</a>")).unwrap();
    let before = reads();
    assert!(two.validate(a.again()).is_ok());
    assert!(one.validate(a.again()).is_ok());
    assert_eq!(reads(), before + 1);
}

#[test]
fn an_xsd_with_a_doctype_is_refused_before_libxml2_reads_it() {
    // libxml2 compiles a schema with its entities substituted: an external one would
    // be read from the file it names (an internal one is refused the same way).
    let fragment = std::env::temp_dir().join(format!("frag-{}.xsd", std::process::id()));
    std::fs::write(&fragment, r#"<xs:element name="B" type="xs:string"/>"#).unwrap();
    for entity in [
        format!(r#"SYSTEM "file://{}""#, fragment.display()),
        r#""<xs:element name='B'/>""#.to_string(),
    ] {
        let xsd = format!(
            r#"<!DOCTYPE xs:schema [<!ENTITY x {entity}>]><xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="A"><xs:complexType><xs:sequence>&x;</xs:sequence></xs:complexType></xs:element></xs:schema>"#
        );
        let e = Schema::compile("d.xsd", xsd).unwrap_err();
        assert_eq!(e.origin, "d.xsd");
        assert!(e.message.contains("it holds a DOCTYPE"), "{e}");
    }
    std::fs::remove_file(fragment).unwrap();
    assert!(!names_other_documents(XSD));
    assert!(names_other_documents(
        r#"<s:schema xmlns:s="http://www.w3.org/2001/XMLSchema"><s:include schemaLocation="x"/></s:schema>"#
    ));
}
