//! The `<message>` envelope (SPEC §3): `meta` with `from`, optional `to`, optional `thread`, in
//! that order, then extension elements in other namespaces, then exactly one payload element.
//!
//! Parsing yields what the envelope *claims*; the pump decides identity and thread itself.

use super::reader::StrictReader;
use quick_xml::events::Event;
use quick_xml::name::ResolveResult;

use super::normalize::{expect_only_misc_until_eof, next, normalize_element, resolve_reference};
use super::{escape_text, guard, NormalizedPayload, XmlError, XmlLimits};

/// The envelope namespace, shared with the Python xml-pipeline.
pub const ENVELOPE_NS: &str = "https://xml-pipeline.org/ns/envelope/v1";

/// A parsed envelope: the claimed routing fields and the normalized payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub from: Option<String>,
    pub to: Option<String>,
    pub thread: Option<String>,
    pub payload: NormalizedPayload,
}

fn env_err(msg: impl Into<String>) -> XmlError {
    XmlError::Envelope(msg.into())
}

/// Which envelope element an event names, if it is in the envelope namespace.
fn envelope_name(reader: &StrictReader<'_>, name: quick_xml::name::QName<'_>) -> Option<String> {
    let (resolved, local) = reader.resolver().resolve_element(name);
    match resolved {
        ResolveResult::Bound(ns) if ns.as_ref() == ENVELOPE_NS => Some(local.as_ref().to_owned()),
        _ => None,
    }
}

/// Parses a whole envelope strictly. The payload is normalized (not schema-validated).
pub fn parse_envelope(input: &str, limits: &XmlLimits) -> Result<Envelope, XmlError> {
    guard(input, limits)?;
    let mut reader = StrictReader::new(input);

    // <message>
    loop {
        let pos = reader.buffer_position();
        match next(&mut reader, input)? {
            Event::Start(e) => {
                if envelope_name(&reader, e.name()).as_deref() != Some("message") {
                    return Err(env_err(format!(
                        "root must be <message xmlns=\"{ENVELOPE_NS}\">"
                    )));
                }
                break;
            }
            Event::Decl(_) if !super::declaration_allowed_at(input, pos) => {
                return Err(super::normalize::misplaced_declaration(input, pos))
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) => {}
            Event::Text(t) if t.xml10_content().trim().is_empty() => {}
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            Event::Eof => return Err(XmlError::NoRootElement),
            _ => return Err(env_err("root must be <message>")),
        }
    }

    // <meta>
    match next_element(&mut reader, input)? {
        Some((Event::Start(e), _))
            if envelope_name(&reader, e.name()).as_deref() == Some("meta") => {}
        _ => return Err(env_err("<message> must begin with <meta>")),
    }
    let mut fields: [Option<String>; 3] = [None, None, None];
    let mut last_index: Option<usize> = None;
    // Until </meta>.
    while let Some((event, empty)) = next_element(&mut reader, input)? {
        let (Event::Start(e) | Event::Empty(e)) = event else {
            return Err(env_err("unexpected content in <meta>"));
        };
        match envelope_name(&reader, e.name()) {
            Some(name) => {
                let index = match name.as_str() {
                    "from" => 0,
                    "to" => 1,
                    "thread" => 2,
                    other => return Err(env_err(format!("unknown <meta> field <{other}>"))),
                };
                if last_index.is_some_and(|l| l >= index) {
                    return Err(env_err(
                        "<meta> fields must be from, to, thread in that order",
                    ));
                }
                last_index = Some(index);
                fields[index] = Some(if empty {
                    String::new()
                } else {
                    read_text(&mut reader, input)?
                });
            }
            None => {
                // Extension element in another namespace: allowed, skipped.
                if !empty {
                    let end = e.to_end().into_owned();
                    reader
                        .read_to_end(end.name())
                        .map_err(|err| XmlError::Malformed {
                            line: super::line_of(input, reader.buffer_position()),
                            message: err.to_string(),
                        })?;
                }
            }
        }
    }
    if fields[0].is_none() {
        return Err(env_err("<meta> must contain <from>"));
    }

    // The payload.
    let payload = match next_element(&mut reader, input)? {
        Some((Event::Start(e), false)) => {
            normalize_element(&mut reader, input, e, false, limits, 1)?
        }
        Some((Event::Empty(e), true)) => normalize_element(&mut reader, input, e, true, limits, 1)?,
        _ => {
            return Err(env_err(
                "<message> must hold exactly one payload element after <meta>",
            ))
        }
    };
    match next_element(&mut reader, input)? {
        None => {}
        Some(_) => return Err(env_err("<message> must hold exactly one payload element")),
    }
    expect_only_misc_until_eof(&mut reader, input)?;
    let [from, to, thread] = fields;
    Ok(Envelope {
        from,
        to,
        thread,
        payload,
    })
}

/// Skips whitespace and comments; returns the next element start (with whether it is empty),
/// or `None` at an end tag.
fn next_element<'i>(
    reader: &mut StrictReader<'i>,
    input: &str,
) -> Result<Option<(Event<'i>, bool)>, XmlError> {
    loop {
        match next(reader, input)? {
            e @ Event::Start(_) => return Ok(Some((e, false))),
            e @ Event::Empty(_) => return Ok(Some((e, true))),
            Event::End(_) => return Ok(None),
            Event::Text(t) if t.xml10_content().trim().is_empty() => {}
            Event::Comment(_) | Event::PI(_) => {}
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            Event::Eof => return Err(env_err("document ends inside the envelope")),
            _ => return Err(env_err("text where an element was expected")),
        }
    }
}

fn read_text(reader: &mut StrictReader<'_>, input: &str) -> Result<String, XmlError> {
    let mut text = String::new();
    loop {
        match next(reader, input)? {
            Event::Text(t) => text.push_str(&t.xml10_content()),
            Event::CData(c) => text.push_str(&c.xml10_content()),
            Event::GeneralRef(r) => {
                let line = || super::line_of(input, reader.buffer_position());
                text.push_str(&resolve_reference(&r, line)?)
            }
            Event::End(_) => return Ok(text.trim().to_string()),
            Event::Comment(_) => {}
            _ => return Err(env_err("<meta> fields hold text only")),
        }
    }
}

/// Builds an envelope around a normalized payload. The payload's root gets `xmlns=""` unless it
/// declares a default namespace, so unqualified payloads stay out of the envelope namespace.
pub fn build_envelope(from: &str, to: Option<&str>, thread: &str, payload_xml: &str) -> String {
    let mut out = String::with_capacity(payload_xml.len() + 200);
    out.push_str("<message xmlns=\"");
    out.push_str(ENVELOPE_NS);
    out.push_str("\"><meta><from>");
    out.push_str(&escape_text(from));
    out.push_str("</from>");
    if let Some(to) = to {
        out.push_str("<to>");
        out.push_str(&escape_text(to));
        out.push_str("</to>");
    }
    out.push_str("<thread>");
    out.push_str(&escape_text(thread));
    out.push_str("</thread></meta>");
    let name_end = payload_xml
        .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
        .unwrap_or(payload_xml.len());
    let tag_end = payload_xml.find('>').unwrap_or(payload_xml.len());
    let declares_default = payload_xml[..tag_end].contains(" xmlns=\"");
    if declares_default {
        out.push_str(payload_xml);
    } else {
        out.push_str(&payload_xml[..name_end]);
        out.push_str(" xmlns=\"\"");
        out.push_str(&payload_xml[name_end..]);
    }
    out.push_str("</message>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_through_build_and_parse() {
        let xml = build_envelope("greeter", Some("shouter"), "t-1", "<G><n>a&amp;b</n></G>");
        let env = parse_envelope(&xml, &XmlLimits::default()).unwrap();
        assert_eq!(env.from.as_deref(), Some("greeter"));
        assert_eq!(env.to.as_deref(), Some("shouter"));
        assert_eq!(env.thread.as_deref(), Some("t-1"));
        assert_eq!(env.payload.payload_type.to_string(), "G");
        assert_eq!(*env.payload.xml, "<G><n>a&amp;b</n></G>");
    }

    #[test]
    fn payload_without_xmlns_reset_is_in_the_envelope_namespace() {
        let xml =
            format!("<message xmlns=\"{ENVELOPE_NS}\"><meta><from>x</from></meta><G/></message>");
        let env = parse_envelope(&xml, &XmlLimits::default()).unwrap();
        assert_eq!(env.payload.payload_type.namespace(), Some(ENVELOPE_NS));
        assert_eq!(*env.payload.xml, format!("<G xmlns=\"{ENVELOPE_NS}\"/>"));
    }

    #[test]
    fn bad_envelopes_are_refused() {
        let l = XmlLimits::default();
        let ns = ENVELOPE_NS;
        for bad in [
            "<message><meta><from>x</from></meta><G/></message>".to_string(),
            format!("<message xmlns=\"{ns}\"><meta><thread>t</thread><from>x</from></meta><G xmlns=\"\"/></message>"),
            format!("<message xmlns=\"{ns}\"><meta><from>x</from></meta></message>"),
            format!("<message xmlns=\"{ns}\"><meta><from>x</from></meta><G xmlns=\"\"/><H xmlns=\"\"/></message>"),
            format!("<message xmlns=\"{ns}\"><meta><to>x</to></meta><G xmlns=\"\"/></message>"),
        ] {
            assert!(matches!(parse_envelope(&bad, &l), Err(XmlError::Envelope(_))), "{bad}");
        }
    }
}
