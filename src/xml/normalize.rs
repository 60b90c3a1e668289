//! Strict reading of one payload into its normalized serialization.
//!
//! The normalized form has no XML declaration, comments or processing instructions; entity
//! and character references are resolved and re-escaped; attributes are sorted by name;
//! `<a></a>` becomes `<a/>`; the namespace bindings in scope at the payload root are declared
//! on it explicitly, so the payload stands alone once taken out of its envelope. Equal payloads
//! therefore serialize equally, and this form is what is validated, stored and handed on.

use std::borrow::Cow;

use quick_xml::events::{BytesRef, BytesStart, Event};
use quick_xml::name::{PrefixDeclaration, ResolveResult};
use quick_xml::XmlVersion;

use super::reader::StrictReader;

use super::{
    declaration_allowed_at, escape_attribute, escape_text, guard, line_of, PayloadType, XmlError,
    XmlLimits,
};

/// A payload that passed the input guards and was read strictly, in normalized form.
/// Not yet validated against its receiver's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedPayload {
    pub payload_type: PayloadType,
    /// Shared from here on: the log, the queues and the event ring hold this one text.
    pub xml: super::SharedXml,
    /// The schemas it is known to be valid for, if any: those with these verdicts. Only the
    /// schema gate sets it (`ValidatedPayload::again`); crate-private, so no embedder can.
    pub(crate) valid_for: Option<Verdicts>,
}

/// What a schema's verdicts depend on: its text, when the text names no other document
/// (two schemas of one such text accept exactly the same payloads, whichever listener or
/// tenant compiled them), else that compile alone (what an `include` brings may change).
/// A payload valid for one schema is valid for any with the same `Verdicts`. Made by the
/// schema gate only (`schema::Schema::compile`); here so that a payload can carry one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdicts(pub(crate) VerdictsOf);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VerdictsOf {
    /// SHA-256 of the XSD's text.
    Text([u8; 32]),
    /// The schema's process-unique id.
    Compile(u64),
}

impl NormalizedPayload {
    /// `xml` as a payload of `payload_type`, known valid for no schema. The caller vouches
    /// that it is normalized ([`normalize_payload`] makes one that is).
    pub fn new(payload_type: PayloadType, xml: super::SharedXml) -> Self {
        NormalizedPayload {
            payload_type,
            xml,
            valid_for: None,
        }
    }
}

/// Reads a standalone payload document strictly and normalizes it.
pub fn normalize_payload(input: &str, limits: &XmlLimits) -> Result<NormalizedPayload, XmlError> {
    guard(input, limits)?;
    let mut reader = StrictReader::new(input);
    loop {
        let pos = reader.buffer_position();
        match next(&mut reader, input)? {
            Event::Start(e) => {
                let payload = normalize_element(&mut reader, input, e, false, limits, 0)?;
                expect_only_misc_until_eof(&mut reader, input)?;
                return Ok(payload);
            }
            Event::Empty(e) => {
                let payload = normalize_element(&mut reader, input, e, true, limits, 0)?;
                expect_only_misc_until_eof(&mut reader, input)?;
                return Ok(payload);
            }
            Event::Text(t) if t.xml10_content().trim().is_empty() => {}
            Event::Decl(_) if !declaration_allowed_at(input, pos) => {
                return Err(misplaced_declaration(input, pos))
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) => {}
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            Event::Eof => return Err(XmlError::NoRootElement),
            _ => {
                return Err(XmlError::Malformed {
                    line: line_of(input, pos),
                    message: "content before the root element".into(),
                })
            }
        }
    }
}

pub(crate) fn misplaced_declaration(input: &str, pos: u64) -> XmlError {
    XmlError::Malformed {
        line: line_of(input, pos),
        message: "an XML declaration is allowed only at the very start of the document".into(),
    }
}

/// Reads the next event, turning a reader error into [`XmlError::Malformed`] with its line.
pub(crate) fn next<'i>(reader: &mut StrictReader<'i>, input: &str) -> Result<Event<'i>, XmlError> {
    reader.read_event().map_err(|e| XmlError::Malformed {
        line: line_of(input, reader.buffer_position()),
        message: e.to_string(),
    })
}

pub(crate) fn expect_only_misc_until_eof(
    reader: &mut StrictReader<'_>,
    input: &str,
) -> Result<(), XmlError> {
    loop {
        let pos = reader.buffer_position();
        match next(reader, input)? {
            Event::Eof => return Ok(()),
            Event::Text(t) if t.xml10_content().trim().is_empty() => {}
            Event::Comment(_) | Event::PI(_) => {}
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            _ => {
                return Err(XmlError::TrailingContent {
                    line: line_of(input, pos),
                })
            }
        }
    }
}

/// Normalizes the element whose start tag `root` was just read, through its end tag.
/// `outer_depth` is how many elements enclose it (1 inside an envelope).
pub(crate) fn normalize_element(
    reader: &mut StrictReader<'_>,
    input: &str,
    root: BytesStart<'_>,
    is_empty: bool,
    limits: &XmlLimits,
    outer_depth: usize,
) -> Result<NormalizedPayload, XmlError> {
    let payload_type = {
        let (resolved, local) = reader.resolver().resolve_element(root.name());
        let local = local.into_inner();
        match resolved {
            ResolveResult::Bound(ns) => PayloadType::new(Some(ns.as_ref()), local),
            ResolveResult::Unbound => PayloadType::new(None, local),
            ResolveResult::Unknown(prefix) => return Err(XmlError::UnknownPrefix(prefix.clone())),
        }
    };

    // Every binding in scope at the root, innermost winning, declared explicitly on it.
    let mut bindings: Vec<(String, String)> = Vec::new();
    for (prefix, ns) in reader.resolver().bindings() {
        let name = match prefix {
            PrefixDeclaration::Default => "xmlns".to_string(),
            PrefixDeclaration::Named(p) => format!("xmlns:{}", p),
        };
        let value = ns.as_ref().to_owned();
        bindings.retain(|(n, _)| *n != name);
        if !value.is_empty() {
            bindings.push((name, value));
        }
    }

    let mut out = String::with_capacity(input.len().min(limits.max_bytes));
    write_start(&mut out, &root, Some(bindings), input, reader, limits)?;
    if is_empty {
        out.push_str("/>");
        return Ok(NormalizedPayload {
            payload_type,
            xml: super::SharedXml::new(out),
            valid_for: None,
        });
    }
    check_depth(outer_depth + 1, limits)?;

    let mut depth = 1usize;
    let mut open_pending = true;
    loop {
        let pos = reader.buffer_position();
        let event = next(reader, input)?;
        let closes_pending_as_empty = matches!(event, Event::End(_)) && open_pending;
        if open_pending && !closes_pending_as_empty && !is_skipped(&event) {
            out.push('>');
            open_pending = false;
        }
        match event {
            Event::Start(e) => {
                depth += 1;
                check_depth(outer_depth + depth, limits)?;
                write_start(&mut out, &e, None, input, reader, limits)?;
                open_pending = true;
            }
            Event::Empty(e) => {
                check_depth(outer_depth + depth + 1, limits)?;
                write_start(&mut out, &e, None, input, reader, limits)?;
                out.push_str("/>");
            }
            Event::End(e) => {
                if closes_pending_as_empty {
                    out.push_str("/>");
                    open_pending = false;
                } else {
                    out.push_str("</");
                    out.push_str(e.name().as_ref());
                    out.push('>');
                }
                depth -= 1;
                if depth == 0 {
                    return Ok(NormalizedPayload {
                        payload_type,
                        xml: super::SharedXml::new(out),
                        valid_for: None,
                    });
                }
            }
            Event::Text(t) => out.push_str(&escape_text(&t.xml10_content())),
            Event::CData(c) => out.push_str(&escape_text(&c.xml10_content())),
            Event::GeneralRef(r) => {
                let text = resolve_reference(&r, || line_of(input, pos))?;
                out.push_str(&escape_text(&text))
            }
            Event::Comment(_) | Event::PI(_) => {}
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            Event::Decl(_) => {
                return Err(XmlError::Malformed {
                    line: line_of(input, pos),
                    message: "XML declaration inside an element".into(),
                })
            }
            Event::Eof => {
                return Err(XmlError::Malformed {
                    line: line_of(input, pos),
                    message: "document ends inside an element".into(),
                })
            }
        }
    }
}

fn is_skipped(event: &Event<'_>) -> bool {
    matches!(event, Event::Comment(_) | Event::PI(_))
}

fn check_depth(depth: usize, limits: &XmlLimits) -> Result<(), XmlError> {
    if depth > limits.max_depth {
        Err(XmlError::TooDeep {
            max: limits.max_depth,
        })
    } else {
        Ok(())
    }
}

/// Resolves a character reference or one of the five predefined entities; anything else is
/// refused, since no DTD can declare more.
pub(crate) fn resolve_reference(
    r: &BytesRef<'_>,
    line: impl FnOnce() -> usize,
) -> Result<String, XmlError> {
    let name = r.xml10_content();
    match r.resolve_char_ref() {
        Ok(Some(ch)) if super::is_disallowed(ch) => {
            return Err(XmlError::Malformed {
                line: line(),
                message: format!("&{name}; names a {}", super::disallowed_char_message(ch)),
            })
        }
        Ok(Some(ch)) => return Ok(ch.to_string()),
        Ok(None) => {}
        Err(_) => return Err(XmlError::UndefinedEntity(name.into_owned())),
    }
    let text = match name.as_ref() {
        "lt" => "<",
        "gt" => ">",
        "amp" => "&",
        "apos" => "'",
        "quot" => "\"",
        other => return Err(XmlError::UndefinedEntity(other.to_string())),
    };
    Ok(text.to_string())
}

/// Writes `<name attr="v" ...` (without closing the tag), attributes sorted by name.
/// For the root, `bindings` replaces its own namespace declarations.
fn write_start(
    out: &mut String,
    e: &BytesStart<'_>,
    bindings: Option<Vec<(String, String)>>,
    input: &str,
    reader: &StrictReader<'_>,
    limits: &XmlLimits,
) -> Result<(), XmlError> {
    // Counted without the duplicate check (linear) before anything else reads them.
    if e.attributes().with_checks(false).count() > limits.max_attributes {
        return Err(XmlError::TooManyAttributes {
            line: line_of(input, reader.buffer_position()),
            max: limits.max_attributes,
        });
    }
    let is_root = bindings.is_some();
    let mut attrs: Vec<(String, Cow<'_, str>)> = Vec::new();
    for attr in e.attributes() {
        let attr = attr.map_err(|err| XmlError::Malformed {
            line: line_of(input, reader.buffer_position()),
            message: err.to_string(),
        })?;
        let key = attr.key.as_ref().to_owned();
        if is_root && attr.key.as_namespace_binding().is_some() {
            continue;
        }
        let value = attr
            .normalized_value(XmlVersion::Implicit1_0)
            .map_err(|err| XmlError::Malformed {
                line: line_of(input, reader.buffer_position()),
                message: err.to_string(),
            })?
            .into_owned();
        attrs.push((key, Cow::Owned(value)));
    }
    if let Some(bindings) = bindings {
        attrs.extend(bindings.into_iter().map(|(k, v)| (k, Cow::Owned(v))));
    }
    attrs.sort_by(|a, b| a.0.cmp(&b.0));
    out.push('<');
    out.push_str(e.name().as_ref());
    for (key, value) in attrs {
        out.push(' ');
        out.push_str(&key);
        out.push_str("=\"");
        out.push_str(&escape_attribute(&value));
        out.push('"');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namespace resolver a thread keeps between documents carries nothing from one to
    /// the next: a prefix bound in one (even one that failed halfway) is unknown in the next.
    #[test]
    fn a_documents_bindings_do_not_reach_the_next() {
        let limits = XmlLimits::default();
        let bound = normalize_payload(r#"<p:A xmlns:p="urn:x"><p:b/></p:A>"#, &limits).unwrap();
        assert_eq!(bound.payload_type.to_string(), "{urn:x}A");
        let unbound = normalize_payload("<p:A/>", &limits);
        assert!(
            matches!(unbound, Err(XmlError::UnknownPrefix(_))),
            "{unbound:?}"
        );
        let broken = normalize_payload(r#"<q:A xmlns:q="urn:y"><q:b xmlns:r="urn:z">"#, &limits);
        assert!(broken.is_err());
        for doc in ["<q:A/>", "<r:A/>"] {
            let r = normalize_payload(doc, &limits);
            assert!(matches!(r, Err(XmlError::UnknownPrefix(_))), "{doc}: {r:?}");
        }
        let plain = normalize_payload("<A><b>1</b></A>", &limits).unwrap();
        assert_eq!(plain.xml.as_str(), "<A><b>1</b></A>");
    }

    fn norm(s: &str) -> Result<NormalizedPayload, XmlError> {
        normalize_payload(s, &XmlLimits::default())
    }

    #[test]
    fn equal_payloads_normalize_equally() {
        let a = norm("<?xml version=\"1.0\"?><A b=\"2\" a=\"1\"><!-- c --><x></x>t&amp;&#65;</A>")
            .unwrap();
        let b = norm("<A a='1' b='2'><x/>t&amp;A</A>").unwrap();
        assert_eq!(a, b);
        assert_eq!(*a.xml, "<A a=\"1\" b=\"2\"><x/>t&amp;A</A>");
        assert_eq!(a.payload_type.to_string(), "A");
    }

    /// What the pump relies on to route an output that repeats its input without reading it
    /// again (`pump::route::echoed`): normalized XML normalizes to itself, with its type.
    #[test]
    fn normalized_xml_normalizes_to_itself() {
        for doc in [
            "<?xml version=\"1.0\"?><A b=\"2\" a=\"1\"><!-- c --><x></x>t&amp;&#65;</A>",
            "<p:A xmlns:p=\"urn:p\" xmlns:q=\"urn:q\"><q:b q:c=\"&lt;&quot;'\"/></p:A>",
            "<A xmlns=\"urn:d\"><b>  spaced\n text\t</b><![CDATA[<raw> & ]]></A>",
            "<A><?pi data?><b/>\u{e9}t\u{e9} &#x1F600; &gt;</A>",
            "<A a=\"&#10;&#9;x&#13;\" b=\"\n\tspaced\"/>",
            "<A>line&#13;\nend&#13;</A>",
        ] {
            let once = norm(doc).unwrap();
            let twice = norm(&once.xml).unwrap();
            assert_eq!(once, twice, "{doc}");
        }
        // A line end or tab given by reference stays one (written as itself, it would be
        // read back as a space, or a carriage return as a line feed).
        let kept = norm("<A a=\"&#10;&#9;&#13;\">&#13;</A>").unwrap();
        assert_eq!(*kept.xml, "<A a=\"&#10;&#9;&#13;\">&#13;</A>");
    }

    #[test]
    fn namespaced_root_keeps_its_binding() {
        let p = norm("<p:A xmlns:p=\"urn:p\"><p:b/></p:A>").unwrap();
        assert_eq!(p.payload_type.to_string(), "{urn:p}A");
        assert_eq!(*p.xml, "<p:A xmlns:p=\"urn:p\"><p:b/></p:A>");
    }

    #[test]
    fn malformed_input_is_refused_with_a_line() {
        assert!(matches!(
            norm("<A>\n<b></A>"),
            Err(XmlError::Malformed { line: 2, .. })
        ));
        assert!(matches!(norm("<A>"), Err(XmlError::Malformed { .. })));
        assert!(matches!(
            norm("<A/><B/>"),
            Err(XmlError::TrailingContent { .. })
        ));
        assert_eq!(norm("  "), Err(XmlError::NoRootElement));
        assert!(matches!(
            norm("<A>&foo;</A>"),
            Err(XmlError::UndefinedEntity(_))
        ));
        assert!(matches!(norm("<x:A/>"), Err(XmlError::UnknownPrefix(_))));
    }

    #[test]
    fn depth_cap_counts_the_root() {
        let limits = XmlLimits {
            max_depth: 3,
            ..XmlLimits::default()
        };
        assert!(normalize_payload("<a><b><c/></b></a>", &limits).is_ok());
        assert_eq!(
            normalize_payload("<a><b><c><d/></c></b></a>", &limits),
            Err(XmlError::TooDeep { max: 3 })
        );
    }
}
