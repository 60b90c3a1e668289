//! The strict reader of one document: quick-xml's reader with namespaces resolved as its
//! `NsReader` resolves them (a scope pushed at each start tag, popped after its end), by a
//! resolver each OS thread keeps and resets between documents. (`NsReader` makes a new
//! resolver, with its two reserved bindings, for every document: two allocations a payload.)

use std::cell::RefCell;
use std::sync::LazyLock;

use quick_xml::events::Event;
use quick_xml::name::{NamespaceResolver, QName};
use quick_xml::Reader;

thread_local! {
    /// The resolver the next document on this thread uses, reset to its reserved bindings.
    static RESOLVER: RefCell<Option<NamespaceResolver>> = const { RefCell::new(None) };
}

/// Stands in for a reader's resolver that is gone (only while it is being dropped).
static NO_RESOLVER: LazyLock<NamespaceResolver> = LazyLock::new(NamespaceResolver::default);

pub(crate) struct StrictReader<'i> {
    reader: Reader<&'i [u8]>,
    resolver: Option<NamespaceResolver>,
    /// The last event closed a scope (an end tag, or an empty element's): popped before the
    /// next event is read, as `NsReader` does.
    pending_pop: bool,
}

impl<'i> StrictReader<'i> {
    /// A reader of `input` that checks end names and comments, keeps text as it is, reports
    /// `<a/>` as empty and refuses dangling `&` and unmatched end tags.
    pub(crate) fn new(input: &'i str) -> Self {
        let mut reader = Reader::from_str(input);
        let config = reader.config_mut();
        config.trim_text(false);
        config.check_end_names = true;
        config.check_comments = true;
        config.expand_empty_elements = false;
        config.allow_dangling_amp = false;
        config.allow_unmatched_ends = false;
        let kept = RESOLVER.with(|r| r.try_borrow_mut().ok().and_then(|mut r| r.take()));
        StrictReader {
            reader,
            resolver: Some(kept.unwrap_or_default()),
            pending_pop: false,
        }
    }

    /// The next event, the namespace scopes following it.
    pub(crate) fn read_event(&mut self) -> quick_xml::Result<Event<'i>> {
        let resolver = self.resolver.get_or_insert_with(NamespaceResolver::default);
        if std::mem::take(&mut self.pending_pop) {
            resolver.pop();
        }
        let event = self.reader.read_event()?;
        match &event {
            Event::Start(e) => resolver.push(e)?,
            Event::Empty(e) => {
                resolver.push(e)?;
                self.pending_pop = true;
            }
            Event::End(_) => self.pending_pop = true,
            _ => {}
        }
        Ok(event)
    }

    /// Skips to the end tag `end` of the element just started (its scope popped with it).
    pub(crate) fn read_to_end(&mut self, end: QName<'_>) -> quick_xml::Result<()> {
        self.reader.read_to_end(end)?;
        if let Some(resolver) = self.resolver.as_mut() {
            resolver.pop();
        }
        Ok(())
    }

    pub(crate) fn resolver(&self) -> &NamespaceResolver {
        self.resolver.as_ref().unwrap_or(&NO_RESOLVER)
    }

    pub(crate) fn buffer_position(&self) -> u64 {
        self.reader.buffer_position()
    }
}

impl Drop for StrictReader<'_> {
    fn drop(&mut self) {
        if let Some(mut resolver) = self.resolver.take() {
            resolver.set_level(0);
            RESOLVER.with(|r| {
                if let Ok(mut r) = r.try_borrow_mut() {
                    *r = Some(resolver);
                }
            });
        }
    }
}
