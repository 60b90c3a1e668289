//! libxml2's parse and validation of a payload, with one parser context per OS thread, used
//! again for each parse instead of made and freed every time. A payload is validated as it is
//! read (libxml2's streaming validation), unless its schema needs a document ([`Scan::streams`]).
//!
//! A new context costs libxml2 a dictionary and its stacks: about a fifth of a payload's
//! parse and validation (callgrind). A context keeps its dictionary between parses, and the
//! dictionary keeps every element and attribute name it has seen, valid or not (a payload is
//! parsed before it is validated). So a context is replaced after [`PARSES_PER_CONTEXT`]
//! parses, once its dictionary holds more than [`DICT_ENTRIES_MAX`] names, and after any
//! parse that fails: what one payload put there cannot grow without bound or reach the next
//! context.

use std::cell::RefCell;
use std::ptr::{self, NonNull};

use std::os::raw::{c_char, c_int, c_ulong, c_void};

use libxml::bindings::{
    inputPop, inputPush, xmlCharEncoding_XML_CHAR_ENCODING_NONE, xmlCtxtGetLastError, xmlCtxtReset,
    xmlCtxtUseOptions, xmlDictSize, xmlFreeDoc, xmlFreeInputStream, xmlFreeParserCtxt,
    xmlFreeParserInputBuffer, xmlNewIOInputStream, xmlNewParserCtxt, xmlParseDocument,
    xmlParserCtxt, xmlParserInputBufferCreateMem, xmlParserInputBufferCreateStatic,
    xmlParserOption_XML_PARSE_NOERROR, xmlParserOption_XML_PARSE_NONET,
    xmlParserOption_XML_PARSE_NOWARNING, xmlSAX2GetLineNumber, xmlSchemaIsValid, xmlSchemaSAXPlug,
    xmlSchemaSAXUnplug, xmlSchemaValidCtxt, xmlSchemaValidateDoc, xmlSchemaValidateSetLocator,
};
use libxml::error::StructuredError;
use libxml::schemas::SchemaValidationContext;

use super::ValidationError;

/// Parses before a thread's context is replaced.
pub const PARSES_PER_CONTEXT: u32 = 1024;
/// Names a context's dictionary may hold before the context is replaced.
pub const DICT_ENTRIES_MAX: i32 = 4096;

/// Payloads up to this many bytes are read in place ([`read_validating`]); larger ones from a
/// copy libxml2 makes. libxml2 2.9 shrinks an input once it has read more than twice its
/// 250-byte read-ahead, and a static input shrunk that way ends early (measured: "Premature
/// end of data" from 847 bytes of elements); up to 500 bytes it is never shrunk.
pub const STATIC_MAX: usize = 500;

/// Recovery off (the libxml2 default), no network, errors kept on the context rather than
/// printed. A document built (for a schema whose payloads do not stream, [`Scan::streams`]) keeps its names in the
/// context's dictionary: without one (`NODICT`), libxml2 2.9's validator cannot resolve an
/// `xsi:type`'s prefix (tested in `verdicts.rs`).
const OPTIONS: i32 = (xmlParserOption_XML_PARSE_NONET
    | xmlParserOption_XML_PARSE_NOERROR
    | xmlParserOption_XML_PARSE_NOWARNING) as i32;

struct Context {
    ptr: NonNull<xmlParserCtxt>,
    parses: u32,
    /// The payload being parsed, with the NUL libxml2 reads as its end (a static input is
    /// read to its terminator, not to its length); kept from parse to parse.
    text: Vec<u8>,
}

impl Context {
    fn new() -> Option<Context> {
        // SAFETY: a fresh context, owned here until `drop` frees it.
        let ptr = NonNull::new(unsafe { xmlNewParserCtxt() })?;
        Some(Context {
            ptr,
            parses: 0,
            text: Vec::new(),
        })
    }

    fn worn(&self) -> bool {
        // SAFETY: the context is live; its dictionary (possibly null) is only read.
        let dict = unsafe { (*self.ptr.as_ptr()).dict };
        self.parses >= PARSES_PER_CONTEXT
            || (!dict.is_null() && unsafe { xmlDictSize(dict) } > DICT_ENTRIES_MAX)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: owned, and no document borrows the context (documents hold their own
        // reference to the dictionary).
        unsafe { xmlFreeParserCtxt(self.ptr.as_ptr()) }
    }
}

thread_local! {
    static PARSER: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// Parses `xml` with this thread's context and validates it against the schema of
/// `validator`. With `streaming` (the schema's [`Scan::streams`]), libxml2 validates as it reads
/// (`xmlSchemaSAXPlug` in place of the parser's tree builder), so no document is made,
/// walked or freed; otherwise it validates the document it built. A payload that is not
/// well-formed gives libxml2's parse error, with its line; one that is gives the
/// validator's messages, each with a line.
pub fn validate(
    xml: &[u8],
    validator: &mut SchemaValidationContext,
    streaming: bool,
) -> Result<(), ValidationError> {
    let how = if streaming {
        How::Streaming
    } else {
        How::Document
    };
    validate_in(xml, xml.len() <= STATIC_MAX, validator, how)
}

/// What the compiler needs to know of an XSD's text before validating with it ([`scan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// It takes no declaration from another document (no `include`, `import`, `redefine` or
    /// `override`): its text alone says what it accepts.
    pub self_contained: bool,
    /// It names another document to take declarations from (which libxml2 would read,
    /// from a file or the network, when it compiles).
    pub names_elsewhere: bool,
    /// Whether its payloads may be validated as they are read. libxml2's streaming
    /// validator has no document to keep identifiers in, so it does not check that an
    /// `xs:ID` is unique or that an `xs:IDREF` names one (tested in `verdicts.rs`); a schema
    /// that uses those types (or `ENTITY`, `ENTITIES`, `NOTATION`, which need a document
    /// too), or is not self-contained, has its payloads validated as built documents.
    pub streams: bool,
}

/// Reads `xsd` for [`Scan`]'s facts. A text it cannot read says neither.
pub fn scan(xsd: &str) -> Scan {
    const NEEDS_A_DOCUMENT: [&str; 6] = ["ID", "IDREF", "IDREFS", "ENTITY", "ENTITIES", "NOTATION"];
    const UNREAD: Scan = Scan {
        self_contained: false,
        names_elsewhere: false,
        streams: false,
    };
    let mut needs_a_document = false;
    let mut reader = quick_xml::Reader::from_str(xsd);
    loop {
        let element = match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e)) => e,
            Ok(quick_xml::events::Event::Eof) => {
                return Scan {
                    self_contained: true,
                    names_elsewhere: false,
                    streams: !needs_a_document,
                }
            }
            Ok(_) => continue,
            Err(_) => return UNREAD,
        };
        let name = element.local_name();
        let name: &str = name.into_inner();
        if matches!(name, "include" | "import" | "redefine" | "override") {
            return Scan {
                names_elsewhere: true,
                ..UNREAD
            };
        }
        for attribute in element.attributes() {
            let Ok(attribute) = attribute else {
                return UNREAD;
            };
            let key = attribute.key.local_name();
            let key: &str = key.into_inner();
            if !matches!(key, "type" | "base" | "itemType" | "memberTypes") {
                continue;
            }
            // Unescaped as libxml2 reads it: `xs:&#73;D` is `xs:ID`.
            let Ok(value) = attribute.normalized_value(quick_xml::XmlVersion::Implicit1_0) else {
                return UNREAD;
            };
            needs_a_document |= value.split_ascii_whitespace().any(|name| {
                let local = name.rsplit(':').next().unwrap_or(name);
                NEEDS_A_DOCUMENT.contains(&local)
            });
        }
    }
}

/// How a payload is validated: as it is read, or as the document read from it.
#[derive(Clone, Copy)]
enum How {
    Streaming,
    Document,
}

/// [`validate`], read in place or from libxml2's copy of `xml` as `in_place` says.
fn validate_in(
    xml: &[u8],
    in_place: bool,
    validator: &mut SchemaValidationContext,
    how: How,
) -> Result<(), ValidationError> {
    let one = |message: String| ValidationError {
        messages: vec![message],
    };
    let size = i32::try_from(xml.len()).map_err(|_| one("payload too large to parse".into()))?;
    let outcome = PARSER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_some_and(Context::worn) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Context::new();
        }
        let Some(context) = slot.as_mut() else {
            return Read::Failed("libxml2 could not allocate a parser context".into());
        };
        context.parses += 1;
        let ctxt = context.ptr.as_ptr();
        let text = if in_place {
            context.text.clear();
            context.text.extend_from_slice(xml);
            context.text.push(0);
            Text::InPlace(&context.text)
        } else {
            Text::Copied(xml)
        };
        // SAFETY: the context is live and used by this thread only; the text outlives the
        // parse and its input is popped and freed before this returns; the validation
        // context is ours for the call.
        let outcome = unsafe { read_validating(ctxt, text, size, validator.as_ptr(), how) };
        if matches!(outcome, Read::Failed(_)) {
            *slot = None;
        }
        outcome
    });
    // Whatever the validator reported is taken, so nothing reaches the next payload's answer.
    let errors = validator.drain_errors();
    match outcome {
        Read::Valid => Ok(()),
        Read::Failed(message) => Err(one(message)),
        Read::Invalid if errors.is_empty() => Err(one("payload is not valid".into())),
        Read::Invalid => Err(ValidationError::of(
            errors.iter().map(super::describe),
            errors.len(),
        )),
    }
}

/// What a validating read found.
enum Read {
    Valid,
    /// Well-formed, not valid: the validator's messages say why.
    Invalid,
    /// Not well-formed, or libxml2 could not run: the message says why.
    Failed(String),
}

/// The payload as libxml2 reads it: in place, NUL-terminated ([`read_validating`]), or from
/// a copy libxml2 makes.
enum Text<'a> {
    InPlace(&'a [u8]),
    Copied(&'a [u8]),
}

/// The parser's line, for the validator's messages (a streaming validator has no node to
/// take a line from).
unsafe extern "C" fn locate(
    parser: *mut c_void,
    file: *mut *const c_char,
    line: *mut c_ulong,
) -> c_int {
    // SAFETY: libxml2 passes the context given to `xmlSchemaValidateSetLocator` (the live
    // parser context) and pointers to its own locals.
    unsafe {
        if !file.is_null() {
            *file = ptr::null();
        }
        if !line.is_null() {
            *line = c_ulong::try_from(xmlSAX2GetLineNumber(parser)).unwrap_or(0);
        }
    }
    0
}

/// Reads `text` with `ctxt` and validates it with `validator` as `how` says. A static input
/// (`Text::InPlace`) has no read callback, where libxml2 2.9 gives a memory input one that
/// reads nothing and calls it wherever it finds the input's end.
///
/// # Safety
///
/// `ctxt` is live and this thread's; an in-place text is the payload's `size` bytes and a NUL
/// after them, a copied one `size` bytes, alive and unchanged for the call; `validator` is a
/// live validation context no one else is using.
unsafe fn read_validating(
    ctxt: *mut xmlParserCtxt,
    text: Text<'_>,
    size: i32,
    validator: *mut xmlSchemaValidCtxt,
    how: How,
) -> Read {
    let failed = |what: &str| Read::Failed(format!("libxml2 could not {what}"));
    unsafe {
        xmlCtxtReset(ctxt);
        let input = match text {
            Text::InPlace(t) => xmlParserInputBufferCreateStatic(
                t.as_ptr().cast(),
                size,
                xmlCharEncoding_XML_CHAR_ENCODING_NONE,
            ),
            Text::Copied(t) => xmlParserInputBufferCreateMem(
                t.as_ptr().cast(),
                size,
                xmlCharEncoding_XML_CHAR_ENCODING_NONE,
            ),
        };
        if input.is_null() {
            return failed("make an input");
        }
        let stream = xmlNewIOInputStream(ctxt, input, xmlCharEncoding_XML_CHAR_ENCODING_NONE);
        if stream.is_null() {
            xmlFreeParserInputBuffer(input);
            return failed("make an input");
        }
        inputPush(ctxt, stream);
        // Options first: they are written into the context's own handler.
        xmlCtxtUseOptions(ctxt, OPTIONS);
        // The whole payload is in the input from the start: marked as libxml2's push parser
        // marks its context, the parser does not look for more to read (`GROW`: some 30 calls
        // into `xmlParserInputGrow` for a small payload, 8 % of a hop's instructions) nor
        // shrink the input. `verdicts.rs` holds every verdict, and every prefix's failure, to
        // libxml2's own read.
        (*ctxt).progressive = 1;
        let read = match how {
            How::Streaming => read_streaming(ctxt, validator),
            How::Document => {
                xmlParseDocument(ctxt);
                match well_formed(ctxt) {
                    Err(failed) => failed,
                    Ok(()) => match xmlSchemaValidateDoc(validator, (*ctxt).myDoc) {
                        0 => Read::Valid,
                        rc if rc > 0 => Read::Invalid,
                        _ => failed("validate"),
                    },
                }
            }
        };
        if !(*ctxt).myDoc.is_null() {
            xmlFreeDoc((*ctxt).myDoc);
            (*ctxt).myDoc = ptr::null_mut();
        }
        // The input may read `text` in place: it goes now, not at the next parse.
        loop {
            let input = inputPop(ctxt);
            if input.is_null() {
                break;
            }
            xmlFreeInputStream(input);
        }
        read
    }
}

/// The read of [`read_validating`] with the validator in place of the parser's tree builder.
///
/// # Safety
///
/// As [`read_validating`], with the input pushed and the options set.
unsafe fn read_streaming(ctxt: *mut xmlParserCtxt, validator: *mut xmlSchemaValidCtxt) -> Read {
    unsafe {
        let (handler, user_data) = ((*ctxt).sax, (*ctxt).userData);
        // No handler of the parser's own under the validator's: nothing builds a tree.
        (*ctxt).sax = ptr::null_mut();
        let plug = xmlSchemaSAXPlug(validator, &mut (*ctxt).sax, &mut (*ctxt).userData);
        let read = if plug.is_null() {
            Read::Failed("libxml2 could not start validating".into())
        } else {
            xmlSchemaValidateSetLocator(validator, Some(locate), ctxt.cast());
            xmlParseDocument(ctxt);
            let read = match well_formed(ctxt) {
                Err(failed) => failed,
                Ok(()) if xmlSchemaIsValid(validator) == 1 => Read::Valid,
                Ok(()) => Read::Invalid,
            };
            xmlSchemaSAXUnplug(plug);
            xmlSchemaValidateSetLocator(validator, None, ptr::null_mut());
            read
        };
        (*ctxt).sax = handler;
        (*ctxt).userData = user_data;
        read
    }
}

/// Whether the parse `ctxt` just ran found the payload well-formed; if not, libxml2's message.
///
/// # Safety
///
/// `ctxt` is live.
unsafe fn well_formed(ctxt: *mut xmlParserCtxt) -> Result<(), Read> {
    unsafe {
        if (*ctxt).wellFormed != 0 {
            return Ok(());
        }
        // The context's last error lives as long as the context; it is copied out here.
        let error = xmlCtxtGetLastError(ctxt.cast());
        Err(Read::Failed(if error.is_null() {
            "payload could not be parsed".to_string()
        } else {
            super::describe(&StructuredError::from_raw(error))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libxml::schemas::SchemaParserContext;

    /// `a` with any content and attributes; `n`, an int.
    const ANY: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
      <xs:element name="a"><xs:complexType mixed="true"><xs:sequence>
        <xs:any processContents="skip" minOccurs="0" maxOccurs="unbounded"/>
      </xs:sequence><xs:anyAttribute processContents="skip"/></xs:complexType></xs:element>
      <xs:element name="n" type="xs:int"/>
    </xs:schema>"#;

    fn validator(xsd: &str) -> SchemaValidationContext {
        SchemaValidationContext::from_parser(&mut SchemaParserContext::from_buffer(xsd)).unwrap()
    }

    fn uses() -> u32 {
        PARSER.with(|cell| cell.borrow().as_ref().map_or(0, |c| c.parses))
    }

    #[test]
    fn reading_in_place_validates_as_reading_a_copy_does_either_way() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            let shapes: [fn(usize) -> String; 7] = [
                |n| format!("<a>{}</a>", "<b>x</b>".repeat(n / 8)),
                |n| format!("<a>{}</a>", "é€x".repeat(n / 6)),
                |n| format!("<a k=\"{}\"><b/></a>", "v&amp;".repeat(n / 6)),
                |n| {
                    format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><p:a xmlns:p=\"urn:x\"><!-- c -->{}<![CDATA[<&>]]><?pi x?></p:a>",
                        "<p:b>t</p:b>".repeat(n / 12)
                    )
                },
                |n| format!("<n>{}</n>", "1".repeat(n.min(9))),
                // Malformed: cut short, and a closing tag that does not match.
                |n| format!("<a>{}", "<b>x</b>".repeat(n / 8)),
                |n| format!("<a>{}</c>", "<b>x</b>".repeat(n / 8)),
            ];
            let mut outcomes = [0usize; 2];
            for shape in shapes {
                for n in (0..=STATIC_MAX + 16).step_by(3) {
                    let xml = shape(n);
                    if xml.len() > STATIC_MAX {
                        continue;
                    }
                    for how in [How::Streaming, How::Document] {
                        let mut read = |in_place| {
                            validate_in(xml.as_bytes(), in_place, &mut v, how).map_err(|e| e.messages)
                        };
                        let in_place = read(true);
                        assert_eq!(in_place, read(false), "{xml}");
                        outcomes[usize::from(in_place.is_ok())] += 1;
                    }
                }
            }
            assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
            // Every read above left the contexts in a state the next one could use.
            assert!(validate(b"<a/>", &mut v, true).is_ok());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_payload_cut_short_mid_validation_leaves_nothing_for_the_next() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            for (cut, streaming) in ["<a><b><c>", "<n>1", "<n>x</n", "<a><b></a>"]
                .into_iter()
                .flat_map(|cut| [(cut, true), (cut, false)])
            {
                let err = validate(cut.as_bytes(), &mut v, streaming).unwrap_err();
                assert_eq!(err.messages.len(), 1, "{cut}: {:?}", err.messages);
                assert!(validate(b"<n>7</n>", &mut v, true).is_ok(), "after {cut}");
                assert!(validate(b"<n>7</n>", &mut v, false).is_ok(), "after {cut}");
                let err = validate(b"<n>seven</n>", &mut v, !streaming).unwrap_err();
                assert_eq!(err.messages.len(), 1, "after {cut}: {:?}", err.messages);
                assert!(err.messages[0].contains("'seven'"), "{:?}", err.messages);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_validators_messages_carry_the_line_the_parser_reached() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            let err = validate(b"\n\n<n>x</n>", &mut v, true).unwrap_err();
            assert!(err.messages[0].starts_with("line 3:"), "{:?}", err.messages);
            let err = validate(b"<m/>", &mut v, true).unwrap_err();
            assert!(
                err.messages[0].contains("No matching global declaration"),
                "{:?}",
                err.messages
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_context_is_used_again_then_replaced_after_its_share_of_parses() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            for i in 1..=PARSES_PER_CONTEXT {
                validate(b"<a><b>x</b></a>", &mut v, true).unwrap();
                assert_eq!(uses(), i);
            }
            validate(b"<a/>", &mut v, true).unwrap();
            assert_eq!(uses(), 1, "a worn context is replaced");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_context_is_replaced_once_its_dictionary_is_full_of_names() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            let names: String = (0..DICT_ENTRIES_MAX + 10)
                .map(|i| format!("<n{i}/>"))
                .collect();
            validate(format!("<a>{names}</a>").as_bytes(), &mut v, true).unwrap();
            assert_eq!(uses(), 1);
            validate(b"<a/>", &mut v, true).unwrap();
            assert_eq!(
                uses(),
                1,
                "the context with the full dictionary was replaced"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_failed_parse_gives_the_line_and_a_fresh_context_reads_the_next() {
        std::thread::spawn(|| {
            let mut v = validator(ANY);
            validate(b"<a/>", &mut v, true).unwrap();
            let err = validate(b"<a>\n<b></a>", &mut v, true).unwrap_err();
            assert!(err.messages[0].starts_with("line 2:"), "{:?}", err.messages);
            assert_eq!(uses(), 0, "the context that failed is gone");
            validate(b"<n>5</n>", &mut v, true).unwrap();
            assert_eq!(uses(), 1);
        })
        .join()
        .unwrap();
    }
}
