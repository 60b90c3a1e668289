//! Lenient extraction of payloads from raw handler output (a Lua `xml` string, an external
//! agent's reply): the text may hold several sibling payloads and be dirty. Each top-level
//! element is cut out as its own candidate; each is then read strictly and validated like any
//! other message, so leniency here never lets an invalid payload through.

use quick_xml::events::Event;
use quick_xml::Reader;

use super::{guard, XmlError, XmlLimits};

/// Returns the source text of each top-level element, in order. Stray text between elements
/// and an XML declaration are ignored; an element left unclosed at the end is returned as it
/// stands (the strict read then reports it). No element at all is an error.
pub fn extract_payloads(input: &str, limits: &XmlLimits) -> Result<Vec<String>, XmlError> {
    guard(input, limits)?;
    let mut reader = Reader::from_str(input);
    let config = reader.config_mut();
    config.check_end_names = false;
    config.allow_unmatched_ends = true;
    config.allow_dangling_amp = true;
    config.trim_text(false);

    let mut payloads = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    loop {
        let before = reader.buffer_position() as usize;
        let event = match reader.read_event() {
            Ok(event) => event,
            Err(_) => {
                // Dirty beyond recovery from here on: keep what was found so far.
                if depth > 0 {
                    payloads.push(input[start..].to_string());
                }
                break;
            }
        };
        let after = reader.buffer_position() as usize;
        match event {
            Event::Start(_) => {
                if depth == 0 {
                    start = before;
                }
                depth += 1;
            }
            Event::End(_) if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    payloads.push(input[start..after].to_string());
                }
            }
            Event::Empty(_) if depth == 0 => payloads.push(input[before..after].to_string()),
            Event::DocType(_) => return Err(XmlError::DoctypeRefused),
            Event::Eof => {
                if depth > 0 {
                    payloads.push(input[start..].to_string());
                }
                break;
            }
            _ => {}
        }
    }
    if payloads.is_empty() {
        return Err(XmlError::NoRootElement);
    }
    Ok(payloads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sibling_payloads_in_dirty_text_are_each_extracted() {
        let got = extract_payloads(
            "<?xml version=\"1.0\"?>noise <A><b>1</b></A> & more <B/>\n<C x='1'>t</C>",
            &XmlLimits::default(),
        )
        .unwrap();
        assert_eq!(got, vec!["<A><b>1</b></A>", "<B/>", "<C x='1'>t</C>"]);
    }

    #[test]
    fn text_without_elements_is_an_error() {
        assert_eq!(
            extract_payloads("just words", &XmlLimits::default()),
            Err(XmlError::NoRootElement)
        );
    }
}
