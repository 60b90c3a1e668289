//! The layers of `src/`, checked: a module may use only modules of lower layers. The table is
//! the one in `ARCHITECTURE.md` ("Layers"), read from there, so the document and the code
//! cannot drift apart. A tidy test in the spirit of rust-analyzer's: it reads the source as
//! text, so it needs no build of its own.

use std::collections::BTreeMap;
use std::path::Path;

/// `module → layer`, from the table rows `| N | `a`, `b` |` under `## Layers`.
fn layers_from(architecture: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let Some(section) = architecture.split("\n## Layers").nth(1) else {
        return out;
    };
    let section = section.split("\n## ").next().unwrap_or("");
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(layer), Some(modules)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let Ok(layer) = layer.parse::<u32>() else {
            continue;
        };
        for m in modules.split(',') {
            out.insert(m.trim().trim_matches('`').to_string(), layer);
        }
    }
    out
}

/// The top-level modules `text` names through `crate::`: in paths (`crate::a::b`) and in
/// grouped imports (`use crate::{a::b, c}`, over several lines). Comment lines are skipped.
fn crate_modules_used(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Names at the group's first level, each before `::`, `,` or `}`.
            let mut depth = 1;
            let mut name = String::new();
            let mut expecting_name = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 1 => break,
                    '}' => depth -= 1,
                    ',' if depth == 1 => expecting_name = true,
                    c if depth == 1 && expecting_name && (c.is_alphanumeric() || c == '_') => {
                        name.push(c)
                    }
                    _ => {
                        if !name.is_empty() {
                            out.push(std::mem::take(&mut name));
                            expecting_name = false;
                        }
                    }
                }
            }
            if !name.is_empty() {
                out.push(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Every use of a module that the table forbids, as `file: a (layer 3) uses b (layer 5)`;
/// and every module the table does not place. `sources` are `(module, file, text)`.
fn violations(layers: &BTreeMap<String, u32>, sources: &[(String, String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (module, file, text) in sources {
        let Some(&own) = layers.get(module) else {
            out.push(format!(
                "{file}: module `{module}` is in no row of ARCHITECTURE.md's layer table"
            ));
            continue;
        };
        for used in crate_modules_used(text) {
            if &used == module {
                continue;
            }
            match layers.get(&used) {
                // Re-exports at the crate root (`crate::Organism`) are not modules.
                None if used.starts_with(char::is_uppercase) => {}
                None => out.push(format!(
                    "{file}: `{module}` uses `{used}`, which is in no row of the layer table"
                )),
                Some(&layer) if layer >= own => out.push(format!(
                    "{file}: `{module}` (layer {own}) uses `{used}` (layer {layer}); a module may \
                     use only lower layers"
                )),
                Some(_) => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `(module, file, text)` for every `.rs` file under `src/` except the crate roots.
fn sources(src: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if rel == "lib.rs" || rel == "main.rs" {
                continue;
            }
            let module = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((module, format!("src/{rel}"), text));
        }
    }
    out
}

#[test]
fn every_module_uses_only_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let layers = layers_from(&architecture);
    assert!(
        layers.len() >= 10,
        "ARCHITECTURE.md has no layer table under `## Layers`"
    );
    let found = violations(&layers, &sources(&root.join("src")));
    assert!(found.is_empty(), "layer violations:\n{}", found.join("\n"));
}

/// The check itself: a forbidden import, in any of the forms the source uses, is found.
#[test]
fn a_use_of_a_higher_or_equal_layer_is_reported() {
    let layers = layers_from(
        "# A\n\n## Layers\n\n| layer | modules |\n|---|---|\n| 2 | `pump` |\n| 1 | `config`, `lua` |\n| 0 | `xml` |\n\n## Next\n| 9 | `ignored` |\n",
    );
    assert_eq!(layers.len(), 4);
    let file = |module: &str, text: &str| (module.to_string(), format!("{module}.rs"), text.into());
    let found = violations(
        &layers,
        &[
            file(
                "config",
                "use crate::xml::Thing;\nfn f() { crate::lua::check(); }",
            ),
            file("xml", "use crate::{\n    config::{A, B},\n    xml::C,\n};"),
            file(
                "pump",
                "use crate::{config, lua::X, xml};\n// crate::pump is fine",
            ),
            file(
                "lua",
                "/// [`crate::pump::Shared`] in a doc line is not a use\nfn g() {}",
            ),
            file("stray", "fn h() {}"),
        ],
    );
    assert_eq!(
        found,
        vec![
            "config.rs: `config` (layer 1) uses `lua` (layer 1); a module may use only lower layers",
            "stray.rs: module `stray` is in no row of ARCHITECTURE.md's layer table",
            "xml.rs: `xml` (layer 0) uses `config` (layer 1); a module may use only lower layers",
        ]
    );
}

/// The crates of the HTTP edge stay at the edge: `axum` and `utoipa` only in `api`, a
/// WebSocket crate only in `api` and `outbound` (where every outgoing connection is made,
/// the CLI's WebSocket among them).
#[test]
fn http_crates_are_used_only_at_the_edge() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (module, file, text) in sources(&root.join("src")) {
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for (krate, allowed) in [
            ("axum", &["api"][..]),
            ("utoipa", &["api"][..]),
            ("tungstenite", &["api", "outbound"][..]),
        ] {
            if !allowed.contains(&module.as_str()) && code.contains(&format!("{krate}::")) {
                found.push(format!("{file}: `{module}` uses `{krate}`"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The API's client (the CLI's commands) speaks to a server over the wire and uses access
/// control's own module for keys: it never reaches into the HTTP server's code.
#[test]
fn the_client_does_not_use_the_api() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found: Vec<String> = sources(&root.join("src"))
        .into_iter()
        .filter(|(module, _, text)| {
            module == "client" && crate_modules_used(text).iter().any(|m| m == "api")
        })
        .map(|(_, file, _)| format!("{file}: `client` uses `api`"))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A file is read whole by the next developer: at most 700 lines. And `pump`'s files name
/// what they use from their module (no `use super::*`), so a method's types are found by
/// reading its file.
#[test]
fn files_stay_short_and_pump_imports_by_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (module, file, text) in sources(&root.join("src")) {
        let lines = text.lines().count();
        if lines > 700 {
            found.push(format!("{file}: {lines} lines (at most 700)"));
        }
        if module == "pump" && text.lines().any(|l| l.trim() == "use super::*;") {
            found.push(format!("{file}: `use super::*;` in pump"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The functions of `text` longer than `most` lines, as `(name, first line, lines)`. Reads
/// rustfmt's layout: a function's body ends at the first `}` alone on a line at the indent
/// of its `fn`; a signature that ends in `;` has no body.
fn long_functions(text: &str, most: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let mut words = code.split_whitespace().peekable();
        let mut name = None;
        while let Some(w) = words.next() {
            if w == "fn" {
                name = words.next().map(|n| {
                    n.chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect::<String>()
                });
                break;
            }
            if !(w.starts_with("pub") || ["async", "const", "unsafe", "extern"].contains(&w)) {
                break;
            }
        }
        let Some(name) = name else { continue };
        let Some(open) = lines[i..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        let opened = lines[i + open].trim_end();
        if !opened.ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + open..].iter().position(|l| l.trim_end() == close) {
            let length = open + end + 1;
            if length > most {
                out.push((name, i + 1, length));
            }
        }
    }
    out
}

/// A function is read whole too: at most 120 lines, tests included.
#[test]
fn functions_stay_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (_, file, text) in sources(&root.join("src")) {
        for (name, line, length) in long_functions(&text, 120) {
            found.push(format!(
                "{file}:{line}: `{name}` is {length} lines (at most 120)"
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The reading itself: a long function is found, a short one and a declaration are not.
    let long = format!(
        "fn a() {{\n{}}}\nfn b();\nfn c() {{ 1 }}\n",
        "    x;\n".repeat(130)
    );
    assert_eq!(long_functions(&long, 120), [("a".to_string(), 1, 132)]);
}

/// No two files of one module use each other (`super::a` in `b.rs` and `super::b` in
/// `a.rs`), nor any longer circle of sibling files; `mod.rs` (which declares them all) is
/// not counted.
#[test]
fn sibling_files_import_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, file, text) in sources(&root.join("src")) {
        let path = Path::new(&file);
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        if stem == "mod" {
            continue;
        }
        let dir = path.parent().unwrap().to_string_lossy().to_string();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut rest = code.as_str();
        while let Some(at) = rest.find("super::") {
            rest = &rest[at + "super::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let sibling = format!("{dir}/{name}.rs");
            if !name.is_empty() && name != stem && root.join(&sibling).exists() {
                edges
                    .entry(format!("{dir}/{stem}.rs"))
                    .or_default()
                    .push(sibling);
            }
        }
    }
    // A circle is a file that reaches itself.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![start.clone()];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(f) = stack.pop() {
            for next in edges.get(&f).into_iter().flatten() {
                if next == start {
                    circles.push(format!("{start} reaches itself through {f}"));
                } else if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
    }
    circles.sort();
    circles.dedup();
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

/// The dashboard's fields of `state`, each with the modules `state.js` names as its owners
/// (the `/// a.js, b.js: …` line above it).
fn dashboard_owners(state_js: &str) -> BTreeMap<String, Vec<String>> {
    let mut owners = BTreeMap::new();
    let body = state_js
        .split("export const state = {")
        .nth(1)
        .and_then(|b| b.split("\n};").next())
        .unwrap_or("");
    let mut current: Vec<String> = Vec::new();
    for line in body.lines().map(str::trim) {
        if let Some(comment) = line.strip_prefix("///") {
            let named: Vec<String> = comment
                .split(':')
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| m.ends_with(".js"))
                .map(str::to_string)
                .collect();
            // A comment's second line names no one: the first's owners hold.
            if !named.is_empty() {
                current = named;
            }
        } else if let Some((field, _)) = line.split_once(':') {
            if field.chars().all(|c| c.is_alphanumeric() || c == '_') && !field.is_empty() {
                owners.insert(field.to_string(), current.clone());
            }
        }
    }
    owners
}

/// Where `js` changes a field of `state`: `(field, line)` for an assignment to it or into
/// it, an increment, or a call that changes a collection in place.
fn state_writes(js: &str) -> Vec<(String, usize)> {
    const CHANGING: [&str; 9] = [
        ".set(",
        ".delete(",
        ".clear(",
        ".push(",
        ".pop(",
        ".shift(",
        ".unshift(",
        ".splice(",
        ".length =",
    ];
    let mut out = Vec::new();
    for (n, line) in js.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("state.") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "state.".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
                continue;
            }
            let field: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let after = rest[field.len()..].trim_start();
            // An assignment to the field, or to a part of it (`state.a.b = …`, `state.a[k] = …`).
            let target_end = after
                .find(|c: char| !(c.is_alphanumeric() || "_.[]'\"".contains(c)))
                .unwrap_or(after.len());
            let (path, op) = after.split_at(target_end);
            let op = op.trim_start();
            let assigns = (op.starts_with('=') && !op.starts_with("=="))
                || ["+=", "-=", "++", "--", "||=", "&&=", "??="]
                    .iter()
                    .any(|o| op.starts_with(o));
            let changes = CHANGING.iter().any(|c| after.starts_with(c));
            if (assigns && !path.contains('(')) || changes {
                out.push((field, n + 1));
            }
        }
    }
    out
}

/// The dashboard's state is changed only by the module `state.js` names beside each field
/// (and by `state.js`'s own `forgetAll`); every field written is declared there.
#[test]
fn dashboard_state_is_changed_only_by_its_owner() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard");
    let owners = dashboard_owners(&std::fs::read_to_string(dir.join("state.js")).unwrap());
    assert!(owners.len() > 20, "{owners:?}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".js") || name == "state.js" {
            continue;
        }
        for (field, line) in state_writes(&std::fs::read_to_string(&path).unwrap()) {
            match owners.get(&field) {
                None => found.push(format!("{name}:{line}: state.{field} is not in state.js")),
                Some(o) if !o.contains(&name) => found.push(format!(
                    "{name}:{line}: changes state.{field}, which {} owns",
                    o.join(", ")
                )),
                Some(_) => {}
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The reading itself.
    let writes = state_writes(
        "state.a = 1;\nif (state.b == 2) state.c.d = 3;\nstate.e.set(k, v); f(state.g);\nstate.h++;",
    );
    let fields: Vec<&str> = writes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["a", "c", "e", "h"]);
}
