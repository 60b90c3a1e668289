//! The gate validates as it reads (`parse.rs`, libxml2's streaming validation); libxml2's
//! validation of a built document is the reference. Every payload here gets the same verdict
//! and the same messages, but for their lines, from both.

use libxml::parser::{ParseFormat, Parser, ParserOptions};
use libxml::schemas::{SchemaParserContext, SchemaValidationContext};

use super::Schema;

const XSD: &str = r###"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"
    xmlns:o="urn:orders" targetNamespace="urn:orders" elementFormDefault="qualified">
  <xs:simpleType name="Sku"><xs:restriction base="xs:token">
    <xs:pattern value="[A-Z]{3}-[0-9]{2,4}"/></xs:restriction></xs:simpleType>
  <xs:simpleType name="Colour"><xs:restriction base="xs:string">
    <xs:enumeration value="red"/><xs:enumeration value="blue"/></xs:restriction></xs:simpleType>
  <xs:simpleType name="Sizes"><xs:list itemType="xs:positiveInteger"/></xs:simpleType>
  <xs:complexType name="Party"><xs:sequence>
    <xs:element name="name" type="xs:string"/></xs:sequence></xs:complexType>
  <xs:complexType name="Company"><xs:complexContent><xs:extension base="o:Party">
    <xs:sequence><xs:element name="vat" type="xs:string"/></xs:sequence>
  </xs:extension></xs:complexContent></xs:complexType>
  <xs:element name="Order">
    <xs:complexType><xs:sequence>
      <xs:element name="buyer" type="o:Party"/>
      <xs:element name="line" maxOccurs="5"><xs:complexType><xs:sequence>
        <xs:element name="sku" type="o:Sku"/>
        <xs:element name="qty"><xs:simpleType><xs:restriction base="xs:int">
          <xs:minInclusive value="1"/><xs:maxInclusive value="99"/></xs:restriction></xs:simpleType></xs:element>
        <xs:choice minOccurs="0"><xs:element name="colour" type="o:Colour"/>
          <xs:element name="sizes" type="o:Sizes"/></xs:choice>
      </xs:sequence>
      <xs:attribute name="id" type="{ID}" use="required"/>
      <xs:attribute name="gift" type="xs:boolean" default="false"/>
      </xs:complexType></xs:element>
      <xs:element name="ref" minOccurs="0" maxOccurs="unbounded"><xs:complexType>
        <xs:attribute name="line" type="{IDREF}" use="required"/></xs:complexType></xs:element>
      <xs:element name="note" minOccurs="0" nillable="true"><xs:complexType mixed="true">
        <xs:sequence><xs:element name="b" type="xs:string" minOccurs="0" maxOccurs="unbounded"/>
        </xs:sequence></xs:complexType></xs:element>
      <xs:element name="extra" minOccurs="0"><xs:complexType><xs:sequence>
        <xs:any namespace="##other" processContents="lax" maxOccurs="unbounded"/>
      </xs:sequence></xs:complexType></xs:element>
    </xs:sequence>
    <xs:attribute name="version" type="xs:decimal" fixed="1.0"/>
    </xs:complexType>
    <xs:key name="skus"><xs:selector xpath="o:line"/><xs:field xpath="o:sku"/></xs:key>
  </xs:element>
  <xs:element name="Total" type="xs:decimal"/>
  <xs:element name="Any"/>
  <xs:element name="Tags"><xs:complexType><xs:all>
    <xs:element name="a" type="xs:string"/><xs:element name="b" type="xs:date" minOccurs="0"/>
  </xs:all></xs:complexType></xs:element>
</xs:schema>"###;

/// The namespaces an element needs to choose its own type.
const XSI: &str = "xmlns:xs=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"";

/// An order with `lines` in place of its lines and `rest` after them.
fn order(attrs: &str, buyer: &str, lines: &str, rest: &str) -> String {
    format!(
        "<o:Order xmlns:o=\"urn:orders\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"{attrs}>\
         <o:buyer{buyer}</o:buyer>{lines}{rest}</o:Order>"
    )
}

fn line(id: &str, sku: &str, qty: &str, more: &str) -> String {
    format!("<o:line id=\"{id}\"><o:sku>{sku}</o:sku><o:qty>{qty}</o:qty>{more}</o:line>")
}

fn payloads() -> Vec<String> {
    let one = line("l1", "ABC-12", "3", "");
    let mut p = vec![
        order("", "><o:name>Ann</o:name>", &one, ""),
        order(" version=\"1.0\"", "><o:name>Ann</o:name>", &one, ""),
        order(" version=\"2.0\"", "><o:name>Ann</o:name>", &one, ""),
        order("", "><o:name>Ann</o:name>", "", ""),
        order("", "><o:name>Ann</o:name><o:name>Bo</o:name>", &one, ""),
        order("", " xsi:type=\"o:Company\"><o:name>A</o:name><o:vat>X1</o:vat>", &one, ""),
        order("", " xsi:type=\"o:Company\"><o:name>A</o:name>", &one, ""),
        order("", " xsi:type=\"o:Nope\"><o:name>A</o:name>", &one, ""),
        order("", "><o:name>A</o:name>", &line("l1", " ABC-12 ", "3", ""), ""),
        order("", "><o:name>A</o:name>", &line("l1", "abc-12", "3", ""), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "0", ""), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "x", ""), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", " 7 ", ""), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "3", "<o:colour>red</o:colour>"), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "3", "<o:colour>green</o:colour>"), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "3", "<o:sizes>1 2  3</o:sizes>"), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "3", "<o:sizes>1 0</o:sizes>"), ""),
        order("", "><o:name>A</o:name>", &line("l1", "ABC-12", "3", "<o:colour>red</o:colour><o:sizes>1</o:sizes>"), ""),
        order("", "><o:name>A</o:name>", &line("1l", "ABC-12", "3", ""), ""),
        order("", "><o:name>A</o:name>", &(line("l1", "ABC-12", "3", "") + &line("l2", "ABC-13", "4", "")), "<o:ref line=\"l2\"/>"),
        order("", "><o:name>A</o:name>", &(line("l1", "ABC-12", "3", "") + &line("l2", "ABC-12", "4", "")), ""),
        order("", "><o:name>A</o:name>", &(line("l1", "ABC-12", "3", "") + &line("l1", "ABC-13", "4", "")), ""),
        order("", "><o:name>A</o:name>", &one, "<o:ref line=\"l9\"/>"),
        order("", "><o:name>A</o:name>", &one.repeat(6), ""),
        order("", "><o:name>A</o:name>", &one.replace("<o:line ", "<o:line gift=\"yes\" "), ""),
        order("", "><o:name>A</o:name>", &one.replace("<o:line ", "<o:line gift=\"true\" "), ""),
        order("", "><o:name>A</o:name>", &one.replace("<o:line ", "<o:line other=\"1\" "), ""),
        order("", "><o:name>A</o:name>", &one, "<o:note>some <o:b>bold</o:b> &amp; more &#233;</o:note>"),
        order("", "><o:name>A</o:name>", &one, "<o:note xsi:nil=\"true\"/>"),
        order("", "><o:name>A</o:name>", &one, "<o:note xsi:nil=\"true\">text</o:note>"),
        order("", "><o:name>A</o:name>", &one, "<o:note><![CDATA[<raw & text>]]><o:c/></o:note>"),
        order("", "><o:name>A</o:name>", &one, "<o:extra><x:y xmlns:x=\"urn:x\"><z/></x:y></o:extra>"),
        order("", "><o:name>A</o:name>", &one, "<o:extra><o:Total>1</o:Total></o:extra>"),
        order("", "><o:name>A</o:name>", &one, "<o:extra><o:Total>x</o:Total></o:extra>"),
        order("", "><o:name>A</o:name>", &one, "<o:unknown/>"),
        order("", "><o:name>A</o:name>", &format!("\n  {one}\n  "), "\n"),
        order("", "><o:name>A</o:name>", &format!("text{one}"), ""),
        order("", "><o:name>A</o:name>", &one, "<!-- c --><?pi x?>"),
        "<Order xmlns=\"urn:orders\"><buyer><name>A</name></buyer></Order>".into(),
        "<Order><buyer><name>A</name></buyer></Order>".into(),
        "<o:Total xmlns:o=\"urn:orders\"> 12.50 </o:Total>".into(),
        "<o:Total xmlns:o=\"urn:orders\">1e3</o:Total>".into(),
        "<o:Total xmlns:o=\"urn:orders\"><x/></o:Total>".into(),
        "<o:Total xmlns:o=\"urn:orders\" xsi:nil=\"true\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"/>".into(),
        "<o:Tags xmlns:o=\"urn:orders\"><o:b>2026-11-29</o:b><o:a>x</o:a></o:Tags>".into(),
        "<o:Tags xmlns:o=\"urn:orders\"><o:a>x</o:a><o:a>y</o:a></o:Tags>".into(),
        "<o:Tags xmlns:o=\"urn:orders\"><o:b>2026-13-01</o:b><o:a/></o:Tags>".into(),
        "<o:Tags xmlns:o=\"urn:orders\"><o:b>2026-01-01</o:b></o:Tags>".into(),
        "<o:Other xmlns:o=\"urn:orders\"/>".into(),
        // An element's type chosen by the payload: an identifier, twice.
        format!("<o:Any xmlns:o=\"urn:orders\" {XSI}><o:k {XSI} xsi:type=\"xs:ID\">a</o:k><o:k {XSI} xsi:type=\"xs:ID\">a</o:k></o:Any>"),
        format!("<o:Any xmlns:o=\"urn:orders\" {XSI}><o:k {XSI} xsi:type=\"xs:ID\">a</o:k><o:k {XSI} xsi:type=\"xs:ID\">b</o:k></o:Any>"),
    ];
    p.push(order(
        "",
        "><o:name>A</o:name>",
        &one,
        &format!("<o:note>{}</o:note>", "<o:b>x</o:b>".repeat(60)),
    ));
    p.extend(large());
    p
}

/// Payloads far past libxml2's 250-byte read-ahead, one of them invalid near its end.
fn large() -> Vec<String> {
    let one = line("l1", "ABC-12", "3", "");
    let note = |body: String| {
        order(
            "",
            "><o:name>A</o:name>",
            &one,
            &format!("<o:note>{body}</o:note>"),
        )
    };
    vec![
        note(format!(
            "{}<o:b>é€ &amp; &#x1F600;</o:b>",
            "text é€ <o:b>x</o:b>".repeat(8_000)
        )),
        note(format!("{}<o:c/>", "<o:b>x</o:b>".repeat(8_000))),
        order(
            &format!(" version=\"{}1.0\"", " ".repeat(70_000)),
            "><o:name>A</o:name>",
            &one,
            "",
        ),
    ]
}

/// A message without the line it names: a built document's lines are its elements', a
/// streaming validator's the parser's when it saw the fault.
fn unplaced(message: &str) -> String {
    match message
        .strip_prefix("line ")
        .and_then(|m| m.split_once(": "))
    {
        Some((_, rest)) => rest.to_string(),
        None => message.to_string(),
    }
}

/// libxml2's own read of `xml` (`xmlReadMemory`), recovery off, no network: the reference.
fn read_by_libxml2(xml: &str) -> Result<libxml::tree::Document, libxml::parser::XmlParseError> {
    let options = ParserOptions {
        recover: false,
        no_net: true,
        ..ParserOptions::default()
    };
    Parser {
        format: ParseFormat::XML,
    }
    .parse_string_with_options(xml, options)
}

/// The schema without identifier types: its payloads are validated as they are read.
fn streaming_xsd() -> String {
    XSD.replace("{ID}", "xs:NCName")
        .replace("{IDREF}", "xs:NCName")
}

/// Checks every payload against `xsd` both ways; `streams` is what the schema should say.
fn same_verdicts(xsd: &str, streams: bool) {
    assert_eq!(super::parse::scan(xsd).streams, streams);
    let schema = Schema::compile("orders.xsd", xsd).unwrap();
    let mut reference =
        SchemaValidationContext::from_parser(&mut SchemaParserContext::from_buffer(xsd)).unwrap();
    let (mut valid, mut invalid) = (0, 0);
    for xml in payloads() {
        let doc = read_by_libxml2(&xml).unwrap();
        let expected = reference.validate_document(&doc).map_err(|errors| {
            errors
                .iter()
                .map(|e| unplaced(&super::describe(e)))
                .collect::<Vec<_>>()
        });
        let got = schema
            .check(&xml)
            .map_err(|e| e.messages.iter().map(|m| unplaced(m)).collect::<Vec<_>>());
        assert_eq!(got, expected, "{xml}");
        if got.is_ok() {
            valid += 1
        } else {
            invalid += 1
        }
    }
    assert!(
        valid >= 10 && invalid >= 25,
        "{valid} valid, {invalid} invalid"
    );
}

#[test]
fn validating_as_it_reads_gives_libxml2s_verdict_on_a_built_document() {
    std::thread::spawn(|| same_verdicts(&streaming_xsd(), true))
        .join()
        .unwrap();
}

#[test]
fn a_payload_cut_anywhere_fails_as_libxml2s_own_read_does() {
    std::thread::spawn(|| {
        let schema = Schema::compile("orders.xsd", streaming_xsd()).unwrap();
        let whole = payloads();
        let mut cuts = 0;
        for xml in [&whole[0], &whole[27], &large()[0]] {
            let step = (xml.len() / 400).max(1);
            for end in (0..xml.len())
                .step_by(step)
                .filter(|e| xml.is_char_boundary(*e))
            {
                let cut = &xml[..end];
                assert!(read_by_libxml2(cut).is_err(), "{cut}");
                let err = schema.check(cut).unwrap_err();
                assert!(
                    err.messages[0].starts_with("line "),
                    "{cut}: {:?}",
                    err.messages
                );
                cuts += 1;
            }
        }
        assert!(cuts > 700, "{cuts}");
    })
    .join()
    .unwrap();
}

#[test]
fn identifiers_are_checked_on_a_built_document() {
    std::thread::spawn(|| {
        same_verdicts(
            &XSD.replace("{ID}", "xs:ID").replace("{IDREF}", "xs:IDREF"),
            false,
        );
        // However the schema names such a type, or takes declarations from elsewhere.
        same_verdicts(
            &XSD.replace("{ID}", "xs:&#73;D")
                .replace("{IDREF}", "xs:NCName"),
            false,
        );
        same_verdicts(
            &streaming_xsd().replace(
                "<xs:simpleType name=\"Sku\">",
                "<xs:simpleType name=\"Key\"><xs:restriction base=\"xs:ID\"/></xs:simpleType>\
                 <xs:simpleType name=\"Sku\">",
            ),
            false,
        );
        let import = "<xs:schema xmlns:xs=\"http://www.w3.org/2001/XMLSchema\">\
            <xs:import namespace=\"urn:x\"/><xs:element name=\"a\"/></xs:schema>";
        let scan = super::parse::scan(import);
        assert!(!scan.streams && !scan.self_contained, "{scan:?}");
        let list = "<xs:schema xmlns:xs=\"http://www.w3.org/2001/XMLSchema\">\
            <xs:simpleType name=\"t\"><xs:union memberTypes=\"xs:int xs:IDREFS\"/></xs:simpleType>\
            <xs:element name=\"a\" type=\"t\"/></xs:schema>";
        let scan = super::parse::scan(list);
        assert!(!scan.streams && scan.self_contained, "{scan:?}");
    })
    .join()
    .unwrap();
}
