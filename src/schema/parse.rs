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
    xmlCtxtGetLastError, xmlCtxtReadMemory, xmlDictSize, xmlFreeParserCtxt, xmlNewParserCtxt,
    xmlParserCtxt, xmlParserOption_XML_PARSE_NOERROR, xmlParserOption_XML_PARSE_NONET,
    xmlParserOption_XML_PARSE_NOWARNING,
};
use libxml::error::StructuredError;
use libxml::tree::Document;

/// Parses before a thread's context is replaced.
pub const PARSES_PER_CONTEXT: u32 = 1024;
/// Names a context's dictionary may hold before the context is replaced.
pub const DICT_ENTRIES_MAX: i32 = 4096;

/// Recovery off (the libxml2 default), no network, errors kept on the context rather than
/// printed.
const OPTIONS: i32 = (xmlParserOption_XML_PARSE_NONET
    | xmlParserOption_XML_PARSE_NOERROR
    | xmlParserOption_XML_PARSE_NOWARNING) as i32;

struct Context {
    ptr: NonNull<xmlParserCtxt>,
    parses: u32,
}

impl Context {
    fn new() -> Option<Context> {
        // SAFETY: a fresh context, owned here until `drop` frees it.
        let ptr = NonNull::new(unsafe { xmlNewParserCtxt() })?;
        Some(Context { ptr, parses: 0 })
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
        // SAFETY: the context is live and used by this thread only; `xml` outlives the call
        // (libxml2 copies what it keeps); the document returned is ours to free.
        let doc = unsafe {
            xmlCtxtReadMemory(
                ctxt,
                xml.as_ptr().cast(),
                size,
                ptr::null(),
                ptr::null(),
                OPTIONS,
            )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn uses() -> u32 {
        PARSER.with(|cell| cell.borrow().as_ref().map_or(0, |c| c.parses))
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
