//! XML handling that needs no schema: input guards, payload normalization, the envelope,
//! lenient extraction of payloads from dirty handler output, and the XML → JSON view.
//!
//! Owns no state. Everything here treats its input as hostile: sizes are capped before any
//! parse, a DOCTYPE is refused (so no entity can be declared, expanded or loaded), nesting depth
//! is capped, and no function here reads a file or the network.
//!
//! ## Inside
//!
//! Schema-free XML: `guard` (size, DOCTYPE by a `memchr` search for `<!`), `normalize.rs`
//! (strict read into the normalized form; finds the payload type; depth and
//! attributes-per-element caps, the count taken before any attribute is read; an XML
//! declaration only at the very start; its output `String` becomes the payload's one
//! `SharedXml` (`Arc<String>`), which validation, the log, the queues and the event ring share
//! without copying the text), `envelope.rs` (parse/build `<message>`), `extract.rs` (lenient
//! cutting of several payloads out of dirty handler text), `json.rs` (the JSON view of a
//! payload).

mod envelope;
mod extract;
mod json;
mod normalize;
mod reader;

use std::fmt;
use std::sync::Arc;

pub use envelope::{build_envelope, parse_envelope, Envelope, ENVELOPE_NS};
pub use extract::extract_payloads;
pub use json::{root_local_name, xml_to_json};
pub(crate) use normalize::VerdictsOf;
pub use normalize::{normalize_payload, NormalizedPayload, Verdicts};

/// A payload's normalized XML, shared by the message log, the event ring and the queues.
/// An `Arc<String>` rather than an `Arc<str>`: it is made from the normalizer's `String`
/// without copying the text (an `Arc<str>` needs a copy behind its counters, and at 100 kB
/// that copy was a quarter of a hop's CPU; BENCHMARKS.md).
pub type SharedXml = Arc<String>;

/// The namespace of system payloads such as `<huh>`.
pub const SYSTEM_NS: &str = "https://xml-pipeline.org/ns/system/v1";

/// Caps applied to every untrusted document before and while it is parsed.
#[derive(Debug, Clone, Copy)]
pub struct XmlLimits {
    /// Largest accepted document, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted element nesting (the root is depth 1).
    pub max_depth: usize,
    /// Most attributes on one element (namespace declarations included).
    pub max_attributes: usize,
}

impl Default for XmlLimits {
    fn default() -> Self {
        XmlLimits {
            max_bytes: 1024 * 1024,
            max_depth: 64,
            max_attributes: 256,
        }
    }
}

/// The type of a payload: its root element's namespace and local name.
///
/// Shown in the API as the local name, or `{namespace}local` when namespaced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PayloadType {
    ns: Option<Arc<str>>,
    local: Arc<str>,
    /// The display form, written once: every message of this type shares it.
    written: Arc<str>,
}

/// The local name of a payload type's display form (`Local` or `{namespace}Local`).
pub fn local_of(written: &str) -> &str {
    written.rsplit_once('}').map_or(written, |(_, local)| local)
}

/// The one rule for whether a name a client gives (`wanted`: `Local` or `{namespace}Local`)
/// names the type displayed as `written`: the whole display form, or its local name. Every
/// lookup and filter by payload type (inject, the schema and fields routes, Lua outputs,
/// `/messages?payload_type=`, stream filters, test vectors, `accepts:`) follows it.
pub fn type_named(written: &str, wanted: &str) -> bool {
    written == wanted || local_of(written) == wanted
}

/// Payload types a thread remembers having made (most recent last), so that the types of the
/// payloads it reads share their strings instead of allocating them again.
const REMEMBERED_TYPES: usize = 32;

thread_local! {
    static RECENT_TYPES: std::cell::RefCell<Vec<PayloadType>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl PayloadType {
    /// The type of namespace `ns` (none if empty) and local name `local`: one this thread
    /// made lately, shared, or a new one.
    pub fn new(ns: Option<&str>, local: &str) -> Self {
        let ns = ns.filter(|n| !n.is_empty());
        RECENT_TYPES.with(|recent| {
            let Ok(mut recent) = recent.try_borrow_mut() else {
                return PayloadType::make(ns, local);
            };
            let known = recent
                .iter()
                .rposition(|t| &*t.local == local && t.ns.as_deref() == ns);
            if let Some(i) = known {
                return recent[i].clone();
            }
            let made = PayloadType::make(ns, local);
            if recent.len() == REMEMBERED_TYPES {
                recent.remove(0);
            }
            recent.push(made.clone());
            made
        })
    }

    fn make(ns: Option<&str>, local: &str) -> Self {
        let ns: Option<Arc<str>> = ns.map(Arc::from);
        let local: Arc<str> = Arc::from(local);
        let written = match &ns {
            None => local.clone(),
            Some(ns) => Arc::from(format!("{{{ns}}}{local}")),
        };
        PayloadType { ns, local, written }
    }

    /// The display form (`Local` or `{namespace}Local`), shared.
    pub fn written(&self) -> Arc<str> {
        self.written.clone()
    }

    /// Parses the display form: `local` or `{namespace}local`.
    pub fn parse(s: &str) -> Self {
        if let Some(rest) = s.strip_prefix('{') {
            if let Some((ns, local)) = rest.split_once('}') {
                return PayloadType::new(Some(ns), local);
            }
        }
        PayloadType::new(None, s)
    }

    pub fn namespace(&self) -> Option<&str> {
        self.ns.as_deref()
    }

    /// Whether `s` is this type's display form (`local` or `{namespace}local`), compared
    /// without writing it.
    pub fn is_written_as(&self, s: &str) -> bool {
        match &self.ns {
            None => s == &*self.local,
            Some(ns) => {
                s.strip_prefix('{')
                    .and_then(|r| r.strip_prefix(&**ns))
                    .and_then(|r| r.strip_prefix('}'))
                    == Some(&*self.local)
            }
        }
    }

    pub fn local_name(&self) -> &str {
        &self.local
    }

    /// Whether `wanted` names this type: its display form (`{namespace}Local`) or its local
    /// name ([`type_named`] on the display form, without writing it).
    pub fn is_named(&self, wanted: &str) -> bool {
        self.is_written_as(wanted) || *self.local == *wanted
    }

    /// The system `huh` type that carries error notices back to a sending listener.
    pub fn huh() -> Self {
        PayloadType::new(Some(SYSTEM_NS), "huh")
    }
}

impl fmt::Display for PayloadType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

/// Why a document was refused before schema validation.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum XmlError {
    #[error("document is {size} bytes, over the limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("DOCTYPE declarations are refused")]
    DoctypeRefused,
    #[error("element nesting deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("an element at line {line} has more than {max} attributes (limits.max_attributes)")]
    TooManyAttributes { line: usize, max: usize },
    #[error("malformed XML at line {line}: {message}")]
    Malformed { line: usize, message: String },
    #[error("undefined entity reference &{0};")]
    UndefinedEntity(String),
    #[error("no root element")]
    NoRootElement,
    #[error("content after the root element at line {line}")]
    TrailingContent { line: usize },
    #[error("undeclared namespace prefix `{0}`")]
    UnknownPrefix(String),
    #[error("invalid envelope: {0}")]
    Envelope(String),
}

/// The cheap checks made before any parse: size, and a refusal of any DOCTYPE.
pub fn guard(input: &str, limits: &XmlLimits) -> Result<(), XmlError> {
    if input.len() > limits.max_bytes {
        return Err(XmlError::TooLarge {
            size: input.len(),
            max: limits.max_bytes,
        });
    }
    if contains_doctype(input.as_bytes()) {
        return Err(XmlError::DoctypeRefused);
    }
    Ok(())
}

/// The first character of `text` that XML 1.0 does not allow in a document (a C0 control
/// other than tab, line feed and carriage return, or U+FFFE, U+FFFF), with its byte offset.
/// (A `str` holds no surrogate.) libxml2 refuses such a payload, in words about what follows
/// (a NUL ends its input: "Premature end of data in tag"); the schema gate then says which
/// character, and where (`Schema::check`), so a valid payload pays nothing for the search.
pub fn disallowed_char(text: &str) -> Option<(usize, char)> {
    text.char_indices().find(|&(_, c)| is_disallowed(c))
}

/// Whether XML 1.0 does not allow `c` in a document (see [`disallowed_char`]).
pub(crate) fn is_disallowed(c: char) -> bool {
    matches!(c, '\0'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}')
}

/// Why a character [`disallowed_char`] found is refused.
pub fn disallowed_char_message(c: char) -> String {
    format!("character U+{:04X} is not allowed in XML 1.0", c as u32)
}

/// Whether `<!DOCTYPE` (any case) occurs: a vectorized search for `<!`, then seven bytes.
fn contains_doctype(bytes: &[u8]) -> bool {
    memchr::memmem::find_iter(bytes, b"<!").any(|at| {
        bytes
            .get(at + 2..at + 9)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"DOCTYPE"))
    })
}

/// Whether an XML declaration read at byte `pos` is where XML 1.0 allows it: the very start
/// of the document (after a byte order mark, if any).
pub(crate) fn declaration_allowed_at(input: &str, pos: u64) -> bool {
    pos == 0 || (pos == 3 && input.starts_with('\u{feff}'))
}

/// 1-based line of a byte offset, for error messages.
pub(crate) fn line_of(input: &str, offset: u64) -> usize {
    let end = (offset as usize).min(input.len());
    input.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Escapes text for use in element content or a double-quoted attribute (`<>&'"`).
/// Text with none of them (most of a large payload) is found so by a vectorized search and
/// borrowed as it is; quick-xml's escape, which looks at one byte at a time, runs only on
/// text that needs it.
pub fn escape_text(s: &str) -> std::borrow::Cow<'_, str> {
    let b = s.as_bytes();
    let plain = memchr::memchr3(b'<', b'>', b'&', b).is_none()
        && memchr::memchr3(b'\'', b'"', b'\r', b).is_none();
    if plain {
        return std::borrow::Cow::Borrowed(s);
    }
    // A carriage return written as itself would be read back as a line feed.
    let escaped = quick_xml::escape::escape(s);
    match escaped.contains('\r') {
        true => std::borrow::Cow::Owned(escaped.replace('\r', "&#13;")),
        false => escaped,
    }
}

/// [`escape_text`] for an attribute's value: tabs and line ends too, which a reader would
/// turn into spaces (XML 1.0 §3.3.3).
pub fn escape_attribute(s: &str) -> std::borrow::Cow<'_, str> {
    let text = escape_text(s);
    if memchr::memchr2(b'\t', b'\n', text.as_bytes()).is_none() {
        return text;
    }
    std::borrow::Cow::Owned(text.replace('\t', "&#9;").replace('\n', "&#10;"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first character XML 1.0 refuses is found wherever it stands (after multi-byte
    /// characters, a control before a noncharacter and the other way round); tab, line feed,
    /// carriage return and U+FFFD are allowed.
    #[test]
    fn the_first_character_xml_refuses_is_found() {
        assert_eq!(disallowed_char("a\tb\r\nc \u{FFFD} é"), None);
        for at in [0, 1, 62, 63, 64, 65, 127, 128, 200] {
            let text = format!("{}\u{1}{}", "x".repeat(at), "y".repeat(70));
            assert_eq!(disallowed_char(&text), Some((at, '\u{1}')), "at {at}");
        }
        assert_eq!(disallowed_char("éé\u{0}"), Some((4, '\u{0}')));
        assert_eq!(disallowed_char("a\u{FFFE}b\u{1f}"), Some((1, '\u{FFFE}')));
        assert_eq!(disallowed_char("a\u{1f}b\u{FFFF}"), Some((1, '\u{1f}')));
        let far = format!("{}\u{FFFF}{}\u{2}", "é".repeat(40), "z".repeat(100));
        assert_eq!(disallowed_char(&far), Some((80, '\u{FFFF}')));
    }

    /// A type made again on the same thread shares the first one's strings; another
    /// namespace or name is another type; the memory of types is bounded.
    #[test]
    fn payload_types_made_again_share_their_strings() {
        let a = PayloadType::new(Some("urn:a"), "Note");
        let b = PayloadType::new(Some("urn:a"), "Note");
        assert!(Arc::ptr_eq(&a.written(), &b.written()));
        assert_eq!(&*b.written(), "{urn:a}Note");
        let c = PayloadType::new(None, "Note");
        assert_eq!(&*c.written(), "Note");
        assert_ne!(a, c);
        for i in 0..3 * REMEMBERED_TYPES {
            PayloadType::new(None, &format!("T{i}"));
        }
        RECENT_TYPES.with(|r| assert_eq!(r.borrow().len(), REMEMBERED_TYPES));
        assert_eq!(PayloadType::new(Some("urn:a"), "Note"), a);
    }

    /// One rule, on a type and on its display form alike: the whole name or the local one.
    #[test]
    fn a_type_is_named_by_its_whole_name_or_its_local_one() {
        let t = PayloadType::parse("{urn:x}Order");
        for (wanted, named) in [
            ("{urn:x}Order", true),
            ("Order", true),
            ("{urn:y}Order", false),
            ("order", false),
            ("{urn:x}", false),
        ] {
            assert_eq!(t.is_named(wanted), named, "{wanted}");
            assert_eq!(type_named("{urn:x}Order", wanted), named, "{wanted}");
        }
        assert!(PayloadType::parse("Note").is_named("Note"));
        assert!(!PayloadType::parse("Note").is_named("{urn:x}Note"));
        assert_eq!(local_of("{urn:x}Order"), "Order");
        assert_eq!(local_of("Note"), "Note");
    }

    #[test]
    fn payload_type_display_round_trips() {
        let t = PayloadType::parse("{urn:x}Foo");
        assert_eq!(t.namespace(), Some("urn:x"));
        assert_eq!(t.to_string(), "{urn:x}Foo");
        assert_eq!(PayloadType::parse("Foo").to_string(), "Foo");
    }

    #[test]
    fn escaping_borrows_plain_text_and_escapes_the_five() {
        assert!(matches!(
            escape_text("plain text"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape_text("a<b>&'\"c"), "a&lt;b&gt;&amp;&apos;&quot;c");
    }

    #[test]
    fn guard_refuses_doctype_in_any_case_and_oversize() {
        let l = XmlLimits::default();
        assert_eq!(guard("<!doctype x><x/>", &l), Err(XmlError::DoctypeRefused));
        assert_eq!(guard("<x/><!DocType", &l), Err(XmlError::DoctypeRefused));
        assert_eq!(guard("<x><!-- <!DOC --></x><!", &l), Ok(()));
        let small = XmlLimits {
            max_bytes: 4,
            ..XmlLimits::default()
        };
        assert!(matches!(
            guard("<abc/>", &small),
            Err(XmlError::TooLarge { .. })
        ));
    }
}
