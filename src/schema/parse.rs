//! libxml2's parse of a payload, with one parser context per OS thread, used again for each
//! parse instead of made and freed every time.
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

use libxml::bindings::{
    inputPop, inputPush, xmlCharEncoding_XML_CHAR_ENCODING_NONE, xmlCtxtGetLastError,
    xmlCtxtReadMemory, xmlCtxtReset, xmlCtxtUseOptions, xmlDictSize, xmlFreeDoc,
    xmlFreeInputStream, xmlFreeParserCtxt, xmlFreeParserInputBuffer, xmlNewIOInputStream,
    xmlNewParserCtxt, xmlParseDocument, xmlParserCtxt, xmlParserInputBufferCreateStatic,
    xmlParserOption_XML_PARSE_NODICT, xmlParserOption_XML_PARSE_NOERROR,
    xmlParserOption_XML_PARSE_NONET, xmlParserOption_XML_PARSE_NOWARNING,
};
use libxml::error::StructuredError;
use libxml::tree::Document;

/// Parses before a thread's context is replaced.
pub const PARSES_PER_CONTEXT: u32 = 1024;
/// Names a context's dictionary may hold before the context is replaced.
pub const DICT_ENTRIES_MAX: i32 = 4096;

/// Payloads up to this many bytes are read in place ([`read_static`]); larger ones through
/// `xmlCtxtReadMemory`. libxml2 2.9 shrinks an input once it has read more than twice its
/// 250-byte read-ahead, and a static input shrunk that way ends early (measured: "Premature
/// end of data" from 847 bytes of elements); up to 500 bytes it is never shrunk. Larger
/// payloads pay the empty reads only in their last 250 bytes.
pub const STATIC_MAX: usize = 500;

/// Recovery off (the libxml2 default), no network, errors kept on the context rather than
/// printed, and documents without a dictionary of their own (`NODICT`): a document that
/// shares its context's dictionary takes a reference to it, and libxml2 2.9 counts those
/// references under one process-wide mutex, twice per payload (when the document is made
/// and when it is freed). Names copied into the document instead cost fewer instructions
/// (callgrind, `loadgen chain-memory 3000`: −2.5 % per hop).
const OPTIONS: i32 = (xmlParserOption_XML_PARSE_NONET
    | xmlParserOption_XML_PARSE_NODICT
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

/// Parses `xml` into a libxml2 document with this thread's context. On failure, libxml2's
/// message, with its line.
pub fn parse(xml: &[u8]) -> Result<Document, String> {
    parse_in(xml, xml.len() <= STATIC_MAX)
}

/// [`parse`], read in place or through `xmlCtxtReadMemory` as `in_place` says.
fn parse_in(xml: &[u8], in_place: bool) -> Result<Document, String> {
    let size = i32::try_from(xml.len()).map_err(|_| "payload too large to parse".to_string())?;
    PARSER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_some_and(Context::worn) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Context::new();
        }
        let Some(context) = slot.as_mut() else {
            return Err("libxml2 could not allocate a parser context".to_string());
        };
        context.parses += 1;
        let ctxt = context.ptr.as_ptr();
        let doc = if in_place {
            context.text.clear();
            context.text.extend_from_slice(xml);
            context.text.push(0);
            // SAFETY: the context is live and used by this thread only; the text,
            // NUL-terminated, outlives the parse, and its input is popped and freed before
            // this returns (libxml2 copies what the document keeps); the document returned
            // is ours to free.
            unsafe { read_static(ctxt, &context.text, size) }
        } else {
            // SAFETY: as above; libxml2 copies `xml` into an input of its own.
            unsafe {
                xmlCtxtReadMemory(
                    ctxt,
                    xml.as_ptr().cast(),
                    size,
                    ptr::null(),
                    ptr::null(),
                    OPTIONS,
                )
            }
        };
        if doc.is_null() {
            // SAFETY: the context's last error lives as long as the context; it is copied out
            // before the context is dropped.
            let error = unsafe { xmlCtxtGetLastError(ctxt.cast()) };
            let message = if error.is_null() {
                "payload could not be parsed".to_string()
            } else {
                super::describe(&unsafe { StructuredError::from_raw(error) })
            };
            *slot = None;
            return Err(message);
        }
        Ok(Document::new_ptr(doc))
    })
}

/// `xmlCtxtReadMemory`, with the payload read in place. libxml2 2.9 gives a memory input a
/// read callback that reads nothing, and a document under its 250-byte read-ahead calls it at
/// every token, growing the input buffer each time: half of a small payload's parse
/// (callgrind). A static input has no callback, so those calls end at once.
///
/// # Safety
///
/// `ctxt` is live and this thread's; `text` is the payload's `size` bytes and a NUL after
/// them, alive and unchanged for the call.
unsafe fn read_static(
    ctxt: *mut xmlParserCtxt,
    text: &[u8],
    size: i32,
) -> *mut libxml::bindings::xmlDoc {
    unsafe {
        xmlCtxtReset(ctxt);
        let input = xmlParserInputBufferCreateStatic(
            text.as_ptr().cast(),
            size,
            xmlCharEncoding_XML_CHAR_ENCODING_NONE,
        );
        if input.is_null() {
            return ptr::null_mut();
        }
        let stream = xmlNewIOInputStream(ctxt, input, xmlCharEncoding_XML_CHAR_ENCODING_NONE);
        if stream.is_null() {
            xmlFreeParserInputBuffer(input);
            return ptr::null_mut();
        }
        inputPush(ctxt, stream);
        xmlCtxtUseOptions(ctxt, OPTIONS);
        xmlParseDocument(ctxt);
        let mut doc = (*ctxt).myDoc;
        (*ctxt).myDoc = ptr::null_mut();
        if (*ctxt).wellFormed == 0 && !doc.is_null() {
            xmlFreeDoc(doc);
            doc = ptr::null_mut();
        }
        // The input reads `text` in place: it goes now, not at the next parse.
        loop {
            let input = inputPop(ctxt);
            if input.is_null() {
                break;
            }
            xmlFreeInputStream(input);
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses() -> u32 {
        PARSER.with(|cell| cell.borrow().as_ref().map_or(0, |c| c.parses))
    }

    /// What libxml2 made of a document: its serialization, or that it failed.
    fn outcome(xml: &[u8], in_place: bool) -> Result<String, ()> {
        parse_in(xml, in_place)
            .map(|d| d.to_string())
            .map_err(|_| ())
    }

    #[test]
    fn reading_in_place_parses_as_xml_ctxt_read_memory_does() {
        std::thread::spawn(|| {
            let shapes: [fn(usize) -> String; 6] = [
                |n| format!("<a>{}</a>", "<b>x</b>".repeat(n / 8)),
                |n| format!("<a>{}</a>", "é€x".repeat(n / 6)),
                |n| format!("<a k=\"{}\"><b/></a>", "v&amp;".repeat(n / 6)),
                |n| {
                    format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><p:a xmlns:p=\"urn:x\"><!-- c -->{}<![CDATA[<&>]]><?pi x?></p:a>",
                        "<p:b>t</p:b>".repeat(n / 12)
                    )
                },
                // Malformed: cut short, and a closing tag that does not match.
                |n| format!("<a>{}", "<b>x</b>".repeat(n / 8)),
                |n| format!("<a>{}</c>", "<b>x</b>".repeat(n / 8)),
            ];
            for shape in shapes {
                for n in (0..=STATIC_MAX + 16).step_by(3) {
                    let xml = shape(n);
                    if xml.len() > STATIC_MAX {
                        continue;
                    }
                    assert_eq!(
                        outcome(xml.as_bytes(), true),
                        outcome(xml.as_bytes(), false),
                        "{xml}"
                    );
                }
            }
            // Every parse above left its context in a state the next one could use.
            assert!(outcome(b"<ok/>", true).is_ok());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_context_is_used_again_then_replaced_after_its_share_of_parses() {
        std::thread::spawn(|| {
            for i in 1..=PARSES_PER_CONTEXT {
                parse(b"<a><b>x</b></a>").unwrap();
                assert_eq!(uses(), i);
            }
            parse(b"<a/>").unwrap();
            assert_eq!(uses(), 1, "a worn context is replaced");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_context_is_replaced_once_its_dictionary_is_full_of_names() {
        std::thread::spawn(|| {
            let names: String = (0..DICT_ENTRIES_MAX + 10)
                .map(|i| format!("<n{i}/>"))
                .collect();
            parse(format!("<a>{names}</a>").as_bytes()).unwrap();
            assert_eq!(uses(), 1);
            parse(b"<a/>").unwrap();
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
    fn a_failed_parse_gives_the_line_and_a_fresh_context_parses_the_next() {
        std::thread::spawn(|| {
            parse(b"<a/>").unwrap();
            let Err(err) = parse(b"<a>\n<b></a>") else {
                panic!("a malformed payload parsed");
            };
            assert!(err.starts_with("line 2:"), "{err}");
            assert_eq!(uses(), 0, "the context that failed is gone");
            let doc = parse(b"<c>ok</c>").unwrap();
            let root = doc.get_root_element().unwrap();
            assert_eq!(
                (root.get_name(), root.get_content()),
                ("c".into(), "ok".into())
            );
        })
        .join()
        .unwrap();
    }
}
