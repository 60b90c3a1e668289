//! libxml2 on mimalloc, as the `agentserver` binary runs it: the one test in its own process,
//! so the allocator is switched before libxml2 has allocated anything.

use agentserver::schema::Schema;
use agentserver::xml::{normalize_payload, NormalizedPayload, PayloadType, XmlLimits};

const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="Order"><xs:complexType><xs:sequence>
    <xs:element name="item" type="xs:string" maxOccurs="unbounded"/>
    <xs:element name="qty" type="xs:int"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"#;

#[test]
fn schemas_compile_and_payloads_validate_with_libxml2_on_mimalloc() {
    // SAFETY: the first thing this process does with libxml2.
    assert!(unsafe { agentserver::schema::use_mimalloc_for_libxml2() });
    let schema = Schema::compile("order.xsd", XSD).unwrap();
    let limits = XmlLimits::default();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let schema = schema.clone();
            std::thread::spawn(move || {
                // More parses than one parser context serves, valid and invalid in turn.
                for i in 0..2_500 {
                    let good = format!("<Order><item>{w}-{i}</item><qty>{i}</qty></Order>");
                    let bad = format!("<Order><qty>{i}</qty><item>x</item></Order>");
                    let ok = schema.validate(normalize_payload(&good, &limits).unwrap());
                    assert_eq!(ok.unwrap().payload_type().to_string(), "Order");
                    let err = schema
                        .validate(normalize_payload(&bad, &limits).unwrap())
                        .unwrap_err();
                    assert!(err.to_string().contains("qty"), "{err}");
                }
                // Text libxml2 itself refuses: its message, and the next parse still works.
                let broken = NormalizedPayload::new(
                    PayloadType::new(None, "Order"),
                    std::sync::Arc::new("<Order><item>x</Order>".to_string()),
                );
                let err = schema.validate(broken).unwrap_err();
                assert!(err.to_string().starts_with("line 1:"), "{err}");
                let again = "<Order><item>y</item><qty>1</qty></Order>";
                assert!(schema
                    .validate(normalize_payload(again, &limits).unwrap())
                    .is_ok());
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}
