//! The schema gate: XSDs compiled once, validation from any worker thread, and
//! [`ValidatedPayload`], which only this module can construct.
//!
//! libxml2 schema and validation contexts are neither `Send` nor `Sync`, so a [`Schema`] holds
//! only the XSD text and its facts; each OS thread compiles its own validation context on first
//! use and keeps it in a thread-local cache keyed by the schema's process-unique id. No libxml
//! object ever crosses a thread or an `.await`. Payloads are re-parsed by libxml2 from their
//! normalized form with recovery off and network access off, with a parser context kept per
//! thread (`parse.rs`); the normalized form can hold no DOCTYPE, so nothing is loaded or
//! expanded.
//!
//! ## Inside
//!
//! The schema gate: `Schema` (XSD text + declared payload types, shareable) and
//! `ValidatedPayload`, which only `Schema::validate` constructs. libxml2 contexts live in a
//! thread-local cache per OS thread (a dropped schema's are freed on each thread at its next
//! validation: `LIVE` holds the ids of schemas alive, `RETIRED` counts drops, a thread sweeps
//! when the count moved), and so does libxml2's parser context (`parse.rs`: used again for each
//! parse, replaced after 1,024 parses, once its dictionary holds 4,096 names, or after a failed
//! parse; a payload up to 500 bytes is read in place from a NUL-terminated copy the context
//! keeps, larger ones from libxml2's copy). A payload is validated as libxml2 reads it, with
//! no document built (`xmlSchemaSAXPlug`), unless its schema uses a type whose check needs
//! the document (`xs:ID`, `xs:IDREF`, …) or takes declarations from elsewhere
//! (`parse::scan`); `verdicts.rs` holds both reads to libxml2's verdict on a built
//! document. `model.rs`:
//! `SchemaModel`, read from the XSD once at compile: the one place that knows element order and
//! leaf types. It types the JSON view of payloads and writes JSON payloads as XML in schema
//! order (API inject today; the Lua bridge must use it too, not a second copy). It never
//! validates: libxml2 does.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libxml::schemas::{SchemaParserContext, SchemaValidationContext};
use quick_xml::events::Event;
use quick_xml::Reader;

use crate::xml::{NormalizedPayload, PayloadType, SharedXml, Verdicts, VerdictsOf};

mod dsl;
pub mod json_schema;
mod model;
mod parse;
mod patterns;
#[cfg(test)]
mod reuse;
#[cfg(test)]
mod verdicts;
pub use dsl::fields_to_xsd;
pub use model::{Field, Leaf, MapError, SchemaModel, MAX_FIELDS, MAX_FIELD_DEPTH};
pub use patterns::slow_pattern;

static NEXT_SCHEMA_ID: AtomicU64 = AtomicU64::new(1);

/// The built-in `huh` schema (system namespace).
pub const HUH_XSD: &str = include_str!("../../schemas/huh.xsd");
/// Our description of the envelope.
pub const ENVELOPE_XSD: &str = include_str!("../../schemas/envelope.xsd");

thread_local! {
    static CONTEXTS: RefCell<crate::hash::SeededMap<u64, SchemaValidationContext>> = RefCell::new(Default::default());
    /// The [`RETIRED`] generation this thread's contexts were last swept at.
    static SWEPT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The ids of the schemas alive in the process. A thread's cached contexts of any other id
/// belong to schemas dropped (a reload retired them) and are freed at its next validation.
static LIVE: std::sync::Mutex<Option<std::collections::HashSet<u64>>> = std::sync::Mutex::new(None);

/// Bumped when a schema is dropped: threads compare it with [`SWEPT`] (one atomic load per
/// validation) and sweep their caches when it moved.
static RETIRED: AtomicU64 = AtomicU64::new(0);

impl Drop for Schema {
    fn drop(&mut self) {
        if let Some(live) = crate::sync::lock(&LIVE).as_mut() {
            live.remove(&self.id);
        }
        RETIRED.fetch_add(1, Ordering::Release);
    }
}

/// Frees this thread's contexts of schemas no longer alive, if any was dropped since the
/// last sweep.
fn sweep(contexts: &mut crate::hash::SeededMap<u64, SchemaValidationContext>) {
    let generation = RETIRED.load(Ordering::Acquire);
    if SWEPT.with(|s| s.get()) == generation {
        return;
    }
    if let Some(live) = crate::sync::lock(&LIVE).as_ref() {
        contexts.retain(|id, _| live.contains(id));
    }
    SWEPT.with(|s| s.set(generation));
}

/// The one way a payload is shown as JSON (the API's messages, a Lua handler's and an
/// external agent's input, a test vector's outputs): typed by the schema its receiver
/// accepts it with, or with every leaf a string when there is none.
pub fn payload_json(schema: Option<&Schema>, xml: &str) -> serde_json::Value {
    match schema {
        Some(schema) => schema.payload_to_json(xml),
        None => crate::xml::xml_to_json(xml),
    }
}

#[cfg(test)]
thread_local! {
    /// Payloads this thread's libxml2 has read (tests: a verdict reused is not read).
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether `xsd` names another document to take declarations from (`include`, `import`,
/// `redefine`, `override`): an uploaded agent's XSD may not, since libxml2 reads what it
/// names (any file the server can read, or a URL) when it compiles.
pub fn names_other_documents(xsd: &str) -> bool {
    parse::scan(xsd).names_elsewhere
}

/// Validation contexts cached on this thread (tests: retired ones are freed).
#[doc(hidden)]
pub fn cached_contexts() -> usize {
    CONTEXTS.with(|c| c.borrow().len())
}

/// A compiled XSD: its text, where it came from, and the payload types it declares.
/// Cheap to share (`Arc`); holds no libxml2 object.
#[derive(Debug)]
pub struct Schema {
    id: u64,
    origin: String,
    xsd: String,
    types: Vec<PayloadType>,
    model: Option<SchemaModel>,
    /// Whether payloads are validated as they are read ([`parse::Scan::streams`]).
    streams: bool,
    verdicts: Verdicts,
}

/// Why an XSD could not be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{origin}: {message}")]
pub struct SchemaError {
    pub origin: String,
    pub message: String,
}

/// Why a payload failed validation: the validator's messages, each with its line in the
/// normalized payload.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{}", .messages.join("; "))]
pub struct ValidationError {
    pub messages: Vec<String>,
}

/// Validator messages kept per refused payload: one per bad attribute or element could
/// otherwise make an answer (and every event and row that carries it) larger than the payload.
pub const MAX_VALIDATION_MESSAGES: usize = 20;

/// Bytes of one validator message, at most.
pub const MAX_VALIDATION_MESSAGE_BYTES: usize = 512;

impl ValidationError {
    /// The first [`MAX_VALIDATION_MESSAGES`] of `total` messages, each cut to
    /// [`MAX_VALIDATION_MESSAGE_BYTES`], and a count of the rest.
    fn of(messages: impl Iterator<Item = String>, total: usize) -> Self {
        let mut kept: Vec<String> = messages
            .take(MAX_VALIDATION_MESSAGES)
            .map(|m| crate::clip::clip(m, MAX_VALIDATION_MESSAGE_BYTES))
            .collect();
        if total > kept.len() {
            kept.push(format!(
                "… and {} more validator messages",
                total - kept.len()
            ));
        }
        ValidationError { messages: kept }
    }
}

impl Schema {
    /// Compiles `xsd` (checking it on this thread) and reads its global elements.
    /// `origin` names the file or generator, for error messages.
    pub fn compile(
        origin: impl Into<String>,
        xsd: impl Into<String>,
    ) -> Result<Arc<Schema>, SchemaError> {
        let origin = origin.into();
        let xsd = xsd.into();
        let types = global_elements(&xsd).map_err(|message| SchemaError {
            origin: origin.clone(),
            message,
        })?;
        if types.is_empty() {
            return Err(SchemaError {
                origin,
                message: "the schema declares no global element, so it accepts no payload".into(),
            });
        }
        let id = NEXT_SCHEMA_ID.fetch_add(1, Ordering::Relaxed);
        let scan = parse::scan(&xsd);
        let verdicts = Verdicts(if scan.self_contained {
            use sha2::Digest;
            VerdictsOf::Text(sha2::Sha256::digest(xsd.as_bytes()).into())
        } else {
            VerdictsOf::Compile(id)
        });
        let schema = Schema {
            id,
            origin,
            model: SchemaModel::read(&xsd),
            streams: scan.streams,
            verdicts,
            xsd,
            types,
        };
        let context = schema.build_context()?;
        crate::sync::lock(&LIVE)
            .get_or_insert_with(Default::default)
            .insert(schema.id);
        CONTEXTS.with(|c| {
            let mut contexts = c.borrow_mut();
            sweep(&mut contexts);
            contexts.insert(schema.id, context)
        });
        Ok(Arc::new(schema))
    }

    /// Reads and compiles an XSD file.
    pub fn from_file(path: &std::path::Path) -> Result<Arc<Schema>, SchemaError> {
        let origin = path.display().to_string();
        let xsd = std::fs::read_to_string(path).map_err(|e| SchemaError {
            origin: origin.clone(),
            message: format!("cannot read: {e}"),
        })?;
        Schema::compile(origin, xsd)
    }

    /// The built-in `huh` schema.
    pub fn huh() -> Result<Arc<Schema>, SchemaError> {
        Schema::compile("schemas/huh.xsd (built in)", HUH_XSD)
    }

    /// Payload types (global elements) this schema declares.
    pub fn payload_types(&self) -> &[PayloadType] {
        &self.types
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The XSD text.
    pub fn xsd(&self) -> &str {
        &self.xsd
    }

    /// The JSON view of a payload of this schema, leaves typed as the schema declares
    /// (see [`payload_json`] for a payload whose receiver may have none).
    pub fn payload_to_json(&self, xml: &str) -> serde_json::Value {
        let mut value = crate::xml::xml_to_json(xml);
        if let (Some(model), Some(root)) = (&self.model, crate::xml::root_local_name(xml)) {
            model.type_json(&root, &mut value);
        }
        value
    }

    /// The fields of the payload type `local_name` of this schema, as a tree (empty when
    /// the schema is not one the model reads).
    pub fn fields(&self, local_name: &str) -> Vec<Field> {
        self.model
            .as_ref()
            .and_then(|m| m.fields(local_name))
            .unwrap_or_default()
    }

    /// The JSON Schema of the payload type `local_name` ([`json_schema`]): `None` when the
    /// schema declares no such element, or is not one the model reads.
    pub fn json_schema(&self, local_name: &str) -> Option<serde_json::Value> {
        let model = self.model.as_ref()?;
        if let Some(leaf) = model.root_leaf(local_name) {
            return Some(json_schema::leaf(leaf, ""));
        }
        Some(json_schema::object(&model.fields(local_name)?))
    }

    /// Writes a JSON payload as XML for the payload type `local_name` of this schema, children
    /// in schema order. The result still has to pass [`Schema::validate`].
    pub fn json_to_payload(
        &self,
        local_name: &str,
        value: &serde_json::Value,
    ) -> Result<String, MapError> {
        let unknown = || MapError {
            path: "payload_type".into(),
            message: format!("{} declares no element `{local_name}`", self.origin),
        };
        self.model
            .as_ref()
            .ok_or_else(unknown)?
            .json_to_xml(local_name, value)
            .ok_or_else(unknown)?
    }

    fn build_context(&self) -> Result<SchemaValidationContext, SchemaError> {
        let mut parser = SchemaParserContext::from_buffer(self.xsd.as_bytes());
        SchemaValidationContext::from_parser(&mut parser).map_err(|errors| SchemaError {
            origin: self.origin.clone(),
            message: format!(
                "does not compile: {}",
                errors.iter().map(describe).collect::<Vec<_>>().join("; ")
            ),
        })
    }

    /// Validates a normalized payload against this schema. The payload's type must be one of
    /// the schema's global elements; the caller (routing) has already chosen this schema for it.
    /// A payload known valid for a schema of the same [`Verdicts`]
    /// ([`NormalizedPayload::valid_for`]: a handler's output that is the payload it was
    /// given) has this schema's verdict already, and is not read again.
    pub fn validate(
        &self,
        payload: NormalizedPayload,
    ) -> Result<ValidatedPayload, ValidationError> {
        if payload.valid_for != Some(self.verdicts) {
            self.check(&payload.xml)?;
        }
        Ok(ValidatedPayload {
            payload_type: payload.payload_type,
            xml: payload.xml,
            verdicts: self.verdicts,
        })
    }

    /// libxml2's part of [`Schema::validate`] alone: parse `xml` and validate it against
    /// this schema, keeping nothing. What the load generator's libxml2 ceiling times.
    pub fn check(&self, xml: &str) -> Result<(), ValidationError> {
        #[cfg(test)]
        READS.with(|r| r.set(r.get() + 1));
        let checked = CONTEXTS.with(|cell| {
            let mut contexts = cell.borrow_mut();
            sweep(&mut contexts);
            let context = match contexts.entry(self.id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(self.build_context().map_err(|e| ValidationError {
                        messages: vec![e.to_string()],
                    })?)
                }
            };
            parse::validate(xml.as_bytes(), context, self.streams)
        });
        // A character XML does not allow: libxml2's words are about what follows it.
        checked.map_err(|refused| match crate::xml::disallowed_char(xml) {
            Some((at, c)) => ValidationError {
                messages: vec![format!(
                    "line {}: {}",
                    crate::xml::line_of(xml, at as u64),
                    crate::xml::disallowed_char_message(c)
                )],
            },
            None => refused,
        })
    }
}

/// Routes libxml2's own allocations (its parser, documents and validation state) to
/// mimalloc, the allocator the `agentserver` binary gives Rust. glibc's `malloc` and `free`
/// cost libxml2 about a tenth of a payload's parse and validation in instructions, and its
/// arena locks more between threads (BENCHMARKS.md). Returns whether libxml2 accepted.
///
/// # Safety
///
/// Call it before libxml2 has allocated anything in this process (first thing in `main`):
/// memory libxml2 took from one allocator must never be freed by the other. Embedders that
/// use libxml2 themselves before starting an organism must not call it.
pub unsafe fn use_mimalloc_for_libxml2() -> bool {
    // SAFETY: the caller's contract.
    unsafe { libxml2_to_mimalloc::<false>() }
}

/// Allocations libxml2 made through [`count_libxml2_allocations`]' hooks.
static LIBXML2_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// [`use_mimalloc_for_libxml2`], also counting every allocation libxml2 makes (read with
/// [`libxml2_allocations`]): for a benchmark of allocations (`benches/allocs.rs`), not for
/// serving (every thread's allocations touch one counter).
///
/// # Safety
///
/// As [`use_mimalloc_for_libxml2`].
pub unsafe fn count_libxml2_allocations() -> bool {
    // SAFETY: the caller's contract.
    unsafe { libxml2_to_mimalloc::<true>() }
}

/// libxml2's allocations (and reallocations) since [`count_libxml2_allocations`]; 0 without it.
pub fn libxml2_allocations() -> u64 {
    LIBXML2_ALLOCATIONS.load(Ordering::Relaxed)
}

/// Sets libxml2's allocator to mimalloc, counting its allocations if `COUNT`.
///
/// # Safety
///
/// As [`use_mimalloc_for_libxml2`].
unsafe fn libxml2_to_mimalloc<const COUNT: bool>() -> bool {
    use std::os::raw::{c_char, c_void};

    fn tally<const COUNT: bool>() {
        if COUNT {
            LIBXML2_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
    unsafe extern "C" fn free(p: *mut c_void) {
        // SAFETY: libxml2 frees only what its allocator (mimalloc, from here on) gave it.
        unsafe { libmimalloc_sys::mi_free(p) }
    }
    unsafe extern "C" fn malloc<const COUNT: bool>(size: usize) -> *mut c_void {
        tally::<COUNT>();
        // SAFETY: plain allocation.
        unsafe { libmimalloc_sys::mi_malloc(size) }
    }
    unsafe extern "C" fn realloc<const COUNT: bool>(p: *mut c_void, size: usize) -> *mut c_void {
        tally::<COUNT>();
        // SAFETY: as `free`.
        unsafe { libmimalloc_sys::mi_realloc(p, size) }
    }
    unsafe extern "C" fn strdup<const COUNT: bool>(s: *const c_char) -> *mut c_char {
        tally::<COUNT>();
        // SAFETY: libxml2 passes a NUL-terminated string; the copy includes the NUL.
        unsafe {
            let len = std::ffi::CStr::from_ptr(s).to_bytes_with_nul().len();
            let copy = libmimalloc_sys::mi_malloc(len).cast::<c_char>();
            if !copy.is_null() {
                std::ptr::copy_nonoverlapping(s, copy, len);
            }
            copy
        }
    }
    // SAFETY: the caller guarantees libxml2 holds no memory yet.
    unsafe {
        libxml::bindings::xmlMemSetup(
            Some(free),
            Some(malloc::<COUNT>),
            Some(realloc::<COUNT>),
            Some(strdup::<COUNT>),
        ) == 0
    }
}

fn describe(e: &libxml::error::StructuredError) -> String {
    let message = e.message.as_deref().unwrap_or("unknown error").trim();
    match e.line {
        Some(line) => format!("line {line}: {message}"),
        None => message.to_string(),
    }
}

/// Reads `targetNamespace` and the names of the top-level `xs:element` declarations.
fn global_elements(xsd: &str) -> Result<Vec<PayloadType>, String> {
    let mut reader = Reader::from_str(xsd);
    let mut depth = 0usize;
    let mut target_ns: Option<String> = None;
    let mut names: Vec<String> = Vec::new();
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("not well-formed XML: {e}"))?;
        let (e, is_start) = match event {
            Event::Start(e) => (e, true),
            Event::Empty(e) => (e, false),
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                continue;
            }
            Event::Eof => break,
            Event::DocType(_) => {
                return Err(
                    "it holds a DOCTYPE: an XSD may declare no DTD or entity (libxml2 \
                            would load what they name), as a payload may not"
                        .into(),
                )
            }
            _ => continue,
        };
        let local = e.local_name().as_ref().to_owned();
        if depth == 0 {
            if local != "schema" {
                return Err("root element is not xs:schema".into());
            }
            target_ns = attr(&e, "targetNamespace");
        } else if depth == 1 && local == "element" {
            if let Some(name) = attr(&e, "name") {
                names.push(name);
            }
        }
        if is_start {
            depth += 1;
        }
    }
    Ok(names
        .iter()
        .map(|n| PayloadType::new(target_ns.as_deref(), n))
        .collect())
}

fn attr(e: &quick_xml::events::BytesStart<'_>, name: &str) -> Option<String> {
    e.attributes().flatten().find_map(|a| {
        (a.key.as_ref() == name).then(|| {
            a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map(|v| v.into_owned())
                .unwrap_or_default()
        })
    })
}

/// A payload that passed strict parsing and XSD validation against the receiving listener's
/// schema. Only the gate constructs one, so a handler cannot receive anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPayload {
    payload_type: PayloadType,
    xml: SharedXml,
    /// The schema it passed.
    verdicts: Verdicts,
}

impl ValidatedPayload {
    pub fn payload_type(&self) -> &PayloadType {
        &self.payload_type
    }

    /// The normalized XML of the payload.
    pub fn xml(&self) -> &str {
        &self.xml
    }

    /// A shared handle on the normalized XML.
    pub fn xml_arc(&self) -> SharedXml {
        self.xml.clone()
    }

    /// This payload again, as a handler's output that is the payload it was given: the same
    /// text and type, known valid for every schema of the verdicts it passed.
    pub fn again(&self) -> NormalizedPayload {
        NormalizedPayload {
            payload_type: self.payload_type.clone(),
            xml: self.xml.clone(),
            valid_for: Some(self.verdicts),
        }
    }

    /// The JSON view of the payload (SPEC §9).
    pub fn to_json(&self) -> serde_json::Value {
        crate::xml::xml_to_json(&self.xml)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xml::{normalize_payload, XmlLimits};

    /// Also `reuse.rs`'s.
    pub(super) const XSD: &str = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
      <xs:element name="Greeting"><xs:complexType><xs:sequence>
        <xs:element name="name" type="xs:string"/></xs:sequence></xs:complexType></xs:element>
      <xs:element name="Other" type="xs:int"/>
    </xs:schema>"#;

    pub(super) fn norm(s: &str) -> NormalizedPayload {
        normalize_payload(s, &XmlLimits::default()).unwrap()
    }

    #[test]
    fn global_elements_are_the_payload_types() {
        let s = Schema::compile("t.xsd", XSD).unwrap();
        let names: Vec<String> = s.payload_types().iter().map(|t| t.to_string()).collect();
        assert_eq!(names, vec!["Greeting", "Other"]);
        let huh = Schema::huh().unwrap();
        assert_eq!(huh.payload_types(), &[PayloadType::huh()]);
    }

    #[test]
    fn invalid_payload_carries_the_validators_line_and_message() {
        let s = Schema::compile("t.xsd", XSD).unwrap();
        assert!(s
            .validate(norm("<Greeting><name>Dan</name></Greeting>"))
            .is_ok());
        let err = s
            .validate(norm("<Greeting><nom>Dan</nom></Greeting>"))
            .unwrap_err();
        assert!(err.messages[0].starts_with("line 1:"), "{err}");
        assert!(err.to_string().contains("nom"), "{err}");
    }

    #[test]
    fn a_schema_that_does_not_compile_is_an_error() {
        let bad = r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:element name="A" type="nope"/></xs:schema>"#;
        let err = Schema::compile("bad.xsd", bad).unwrap_err();
        assert!(
            err.to_string().starts_with("bad.xsd: does not compile"),
            "{err}"
        );
    }

    #[test]
    fn validation_works_from_another_os_thread() {
        let s = Schema::compile("t.xsd", XSD).unwrap();
        let s2 = s.clone();
        let ok = std::thread::spawn(move || s2.validate(norm("<Other>5</Other>")).is_ok())
            .join()
            .unwrap();
        assert!(ok);
        assert!(s.validate(norm("<Other>x</Other>")).is_err());
    }

    #[test]
    fn a_dropped_schemas_contexts_are_freed_on_every_thread_that_used_it() {
        let kept = Schema::compile("t.xsd", XSD).unwrap();
        let mut retired = Vec::new();
        for _ in 0..3 {
            retired.push(Schema::compile("t.xsd", XSD).unwrap());
        }
        let (kept2, retired2) = (kept.clone(), retired.clone());
        // A worker thread that validates with all of them, then (once they are dropped)
        // with the one that is kept.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            for s in retired2.iter().chain([&kept2]) {
                assert!(s.validate(norm("<Other>5</Other>")).is_ok());
            }
            let before = cached_contexts();
            drop(retired2);
            wait.recv().unwrap();
            assert!(kept2.validate(norm("<Other>6</Other>")).is_ok());
            (before, cached_contexts())
        });
        drop(retired);
        go.send(()).unwrap();
        let (before, after) = worker.join().unwrap();
        assert_eq!((before, after), (4, 1));
        // And on the thread that compiled them.
        assert!(kept.validate(norm("<Other>7</Other>")).is_ok());
        assert_eq!(
            cached_contexts(),
            1,
            "each test runs on a thread of its own"
        );
    }

    #[test]
    fn built_envelopes_validate_against_envelope_xsd() {
        let s = Schema::compile("envelope.xsd", ENVELOPE_XSD).unwrap();
        let xml = crate::xml::build_envelope("a", Some("b"), "t1", "<G><n>x</n></G>");
        let doc = normalize_payload(&xml, &XmlLimits::default()).unwrap();
        assert!(s.validate(doc).is_ok());
    }
}
