//! What the config cannot check of an uploaded version: sizes, that a script is source
//! text, that an XSD names no other document and holds no pattern slow to refuse a value.

use super::{AgentError, NewVersion, MAX_SCRIPT_BYTES, MAX_XSD_BYTES};

/// Checks what the config cannot: sizes, that a script is source text, that an XSD names
/// no other document and holds no slow pattern (`schema::slow_pattern`).
pub(super) fn check_version(v: &NewVersion) -> Result<(), AgentError> {
    if v.script.len() > MAX_SCRIPT_BYTES {
        return Err(AgentError::Bad(format!(
            "the script is {} bytes; at most {MAX_SCRIPT_BYTES}",
            v.script.len()
        )));
    }
    if v.script.contains('\0') || v.script.starts_with('\u{1b}') {
        return Err(AgentError::Bad(
            "the script is not source text (no NUL; Lua bytecode is not accepted)".into(),
        ));
    }
    if let Some(xsd) = v.xsd.as_deref() {
        if xsd.len() > MAX_XSD_BYTES {
            return Err(AgentError::Bad(format!(
                "the XSD is larger than {MAX_XSD_BYTES} bytes"
            )));
        }
        if crate::schema::names_other_documents(xsd) {
            return Err(AgentError::Bad(
                "an uploaded XSD may not take declarations from another document (include, \
                 import, redefine, override): write them in it"
                    .into(),
            ));
        }
        if let Some(p) = crate::schema::slow_pattern(xsd) {
            return Err(AgentError::Bad(format!(
                "the XSD's pattern `{}` repeats a repetition with a range of counts (or cannot \
                 be read): libxml2 may take a second to refuse one value by it. Write it with \
                 one level of repetition",
                crate::clip::clip(p, 200)
            )));
        }
    }
    if v.fields.is_some() && v.xsd.is_some() {
        return Err(AgentError::Bad("give `fields` or `xsd`, not both".into()));
    }
    Ok(())
}
