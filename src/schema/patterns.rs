//! `xs:pattern`s whose refusal costs libxml2 up to a second or more a value: a repetition
//! of something that repeats, where either has a range of counts (`((a|b)+){1,100}`,
//! `(\w+\s?){1,100}`). libxml2's matcher tries the ways to split the text between the two
//! counters until its own step limit. Measured: 0.4–1.5 s for one value of 1,000 characters
//! that does not match (a value that matches takes microseconds), against microseconds for
//! `(a*)*b`, `(a|b){1,10000}` or `([0-9]{3}-){2}`. An uploaded agent's XSD may hold none
//! (`pump::agents::check`): a tenant could otherwise hold a pump thread that long with each
//! payload it sends. The patterns are read with `regex-syntax`, after XML Schema's own
//! escapes are put in its terms.

use regex_syntax::hir::{Hir, HirKind, Repetition};

/// The first `xs:pattern` value in `xsd` that repeats a repetition with a range of counts,
/// or that this check cannot read.
pub fn slow_pattern(xsd: &str) -> Option<String> {
    let mut reader = quick_xml::Reader::from_str(xsd);
    loop {
        let element = match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e)) => e,
            Ok(quick_xml::events::Event::Eof) | Err(_) => return None,
            Ok(_) => continue,
        };
        if element.local_name().into_inner() != "pattern" {
            continue;
        }
        for attribute in element.attributes().flatten() {
            if attribute.key.local_name().into_inner() != "value" {
                continue;
            }
            let value = attribute
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map(|v| v.into_owned())
                .unwrap_or_default();
            if is_slow(&value) {
                return Some(value);
            }
        }
    }
}

/// Whether libxml2 may take long to refuse a value by `pattern` (or the pattern cannot be
/// read here).
fn is_slow(pattern: &str) -> bool {
    let parsed = regex_syntax::ParserBuilder::new()
        .nest_limit(100)
        .build()
        .parse(&in_rust_terms(pattern));
    match parsed {
        Ok(hir) => nested(&hir, None),
        Err(_) => true,
    }
}

/// XML Schema's regular expression in `regex-syntax`'s terms, as far as their cost goes:
/// its name escapes as classes, its class subtraction as `--`, its block escapes as any
/// character.
fn in_rust_terms(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('i') => out.push_str("[_:A-Za-z]"),
                Some('I') => out.push_str("[^_:A-Za-z]"),
                Some('c') => out.push_str("[-._:A-Za-z0-9]"),
                Some('C') => out.push_str("[^-._:A-Za-z0-9]"),
                Some(p @ ('p' | 'P')) if chars.peek() == Some(&'{') => {
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    if name.starts_with("{Is") {
                        out.push_str("[a-z]");
                    } else {
                        out.push('\\');
                        out.push(p);
                        out.push_str(&name);
                        out.push('}');
                    }
                }
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            '-' if chars.peek() == Some(&'[') => out.push_str("--"),
            _ => out.push(c),
        }
    }
    out
}

/// A repetition that repeats (more than once at most, or without bound).
fn repeats(r: &Repetition) -> bool {
    r.max != Some(1)
}

/// A repetition with a range of counts (`{1,100}`, `{2,}`), which libxml2 keeps a counter
/// for; `*`, `+` and an exact `{3}` are not.
fn ranged(r: &Repetition) -> bool {
    match r.max {
        Some(max) => max > r.min,
        None => r.min > 1,
    }
}

/// Whether `hir`, inside the repetition `outer` if any, holds a repetition of a repetition
/// with a range of counts at either level (but for an exact count inside a range).
fn nested(hir: &Hir, outer: Option<&Repetition>) -> bool {
    match hir.kind() {
        HirKind::Repetition(r) if repeats(r) => {
            // An exact count inside a range is a sequence (`((a|b){2}){1,500}` is quick).
            if outer.is_some_and(|o| {
                (ranged(o) && (r.max.is_none() || ranged(r))) || (ranged(r) && repeats(o))
            }) {
                return true;
            }
            // The outermost repetition that repeats is what an inner one is measured
            // against, unless this one has a range and the outer does not.
            let next = match outer {
                Some(o) if ranged(o) || !ranged(r) => o,
                _ => r,
            };
            nested(&r.sub, Some(next))
        }
        HirKind::Repetition(r) => nested(&r.sub, outer),
        HirKind::Capture(c) => nested(&c.sub, outer),
        HirKind::Concat(hs) | HirKind::Alternation(hs) => hs.iter().any(|h| nested(h, outer)),
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repetition_of_a_repetition_with_a_range_is_slow_and_the_rest_is_not() {
        for slow in [
            "((a|b)+){1,100}c",
            "((a|b){1,100})+c",
            r"(\w+\s?){1,100}c",
            "([a-z]+[0-9]*){1,64}!",
            "((a){1,1000}){1,1000}",
            "(x(a|b){2,}y)*",
            r"(\i\c*){1,9}",
            "[a-z-[aeiou]]+(b+){2,3}",
            "(unclosed",
            "((a+){2}){1,100}",
            "((a|b){1,100}){2}c",
        ] {
            assert!(is_slow(slow), "{slow}");
        }
        for quick in [
            "(a*)*b",
            "(a|b){1,10000}c",
            "((a|b){2}){1,500}c",
            "([0-9]{3}-){2}[0-9]{4}",
            r"\i\c*",
            "[a-z-[aeiou]]+",
            r"\p{IsBasicLatin}+",
            r"\p{Lu}\p{Ll}*",
            "[A-Z]{3}-[0-9]{2,4}",
            "a?b?c?",
            "^literal$",
            r"(\w+ ){2}",
        ] {
            assert!(!is_slow(quick), "{quick}");
        }
    }

    #[test]
    fn the_first_slow_pattern_of_a_schema_is_named() {
        let xsd = |p: &str| {
            format!(
                r#"<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"><xs:simpleType name="t"><xs:restriction base="xs:string"><xs:pattern value="[a-z]+"/><xs:pattern value="{p}"/></xs:restriction></xs:simpleType></xs:schema>"#
            )
        };
        assert_eq!(
            slow_pattern(&xsd("(a+){1,9}")).as_deref(),
            Some("(a+){1,9}")
        );
        assert_eq!(slow_pattern(&xsd("a{1,9}")), None);
        // Escaped as XML: `&#123;` is `{`.
        assert_eq!(
            slow_pattern(&xsd("(a+)&#123;1,9}")).as_deref(),
            Some("(a+){1,9}")
        );
    }
}
