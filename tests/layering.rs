//! The library's modules import only down their layer order, and no two
//! top-level modules import each other, directly or through others.
//!
//! The order is written once, in the `layers` block of
//! docs/ARCHITECTURE.md ("Layers"), which this test reads. Every library
//! file under `src/` (the CLI in `src/bin/` is a client of the library
//! and is left out) maps to its top-level module; each `crate::…` path
//! outside comments, string literals and `#[cfg(test)]` items, and each
//! `super::…` path that climbs to the crate root, is an edge to the
//! module it names. A path to an item the crate root re-exports (such as
//! `crate::Cut`) is an edge to the module `lib.rs` re-exports it from.
//!
//! Edges between modules of one layer are allowed, cycles are not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Edges allowed to break the order, each with the change that removes it
/// (none today: keep it that way). An entry whose edge no longer exists
/// fails the test, so the list only shrinks.
const KNOWN_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// One library source file: its path under the crate (`src/…`) and text.
struct Source {
    path: String,
    text: String,
}

/// An edge found in a file: the module it points to and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Edge {
    from: String,
    to: String,
    file: String,
    line: usize,
}

fn read_sources(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("under the crate")
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if rel != "src/bin" {
                    dirs.push(path);
                }
            } else if rel.ends_with(".rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
                out.push(Source { path: rel, text });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The layer block of the architecture document: one line per layer,
/// bottom first, `name: module, module, …`.
fn parse_layers(doc: &str) -> Vec<(String, Vec<String>)> {
    let start = doc
        .find("```layers\n")
        .expect("docs/ARCHITECTURE.md has a ```layers block");
    let body = &doc[start + "```layers\n".len()..];
    let end = body.find("```").expect("the layers block is closed");
    body[..end]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, mods) = l.split_once(':').expect("a layer line is `name: modules`");
            let mods = mods
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect();
            (name.trim().to_string(), mods)
        })
        .collect()
}

/// The text with comments and the contents of string and char literals
/// replaced by spaces (newlines kept, so line numbers hold).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let at = |j: usize| c.get(j).copied();
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && at(i + 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && at(i + 1) == Some('r')))
            && !prev_is_ident(&c, i)
            && raw_string_start(&c, i + usize::from(c[i] == 'b') + 1).is_some()
        {
            let open = i + usize::from(c[i] == 'b') + 1;
            let hashes = raw_string_start(&c, open).expect("checked");
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body_start = open + hashes + 1;
            let mut j = body_start;
            while j < c.len() && !c[j..].iter().collect::<String>().starts_with(&close) {
                j += 1;
            }
            for &ch in &c[i..body_start] {
                out.push(ch);
            }
            for &ch in &c[body_start..j.min(c.len())] {
                out.push(blank(ch));
            }
            let end = (j + close.len()).min(c.len());
            for &ch in &c[j.min(c.len())..end] {
                out.push(ch);
            }
            i = end;
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' && i + 1 < c.len() {
                    out.push(' ');
                    out.push(blank(c[i + 1]));
                    i += 2;
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == Some('\\') {
                out.push('\'');
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push('\'');
                    i += 1;
                }
            } else if at(i + 2) == Some('\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn prev_is_ident(c: &[char], i: usize) -> bool {
    i > 0 && is_ident(c[i - 1])
}

/// At `c[i]`: `#…#"` opening a raw string; returns the number of `#`.
fn raw_string_start(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    while c.get(j) == Some(&'#') {
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some(j - i)
}

/// Blanks every item marked `#[cfg(test)]` (from the attribute to the end
/// of the item: its `;` or its closing brace). Takes stripped text.
fn remove_test_items(s: &str) -> String {
    let mut c: Vec<char> = s.chars().collect();
    let pat: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + pat.len() <= c.len() {
        if c[i..i + pat.len()] != pat[..] {
            i += 1;
            continue;
        }
        let mut j = i + pat.len();
        let mut depth = 0i32;
        // Up to the item's first `{` or `;` outside brackets.
        while j < c.len() {
            match c[j] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if j < c.len() && c[j] == '{' {
            let mut braces = 0i32;
            while j < c.len() {
                match c[j] {
                    '{' => braces += 1,
                    '}' => {
                        braces -= 1;
                        if braces == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        let end = (j + 1).min(c.len());
        for ch in &mut c[i..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = end;
    }
    c.into_iter().collect()
}

/// The top-level module of a file (`src/log/open.rs` → `log`; `src/lib.rs`
/// → `lib`, the crate root) and how deep its own module sits (`super`s to
/// the root).
fn module_of(path: &str) -> (String, usize) {
    let rel = path.strip_prefix("src/").expect("a file under src/");
    let parts: Vec<&str> = rel.split('/').collect();
    let top = parts[0].trim_end_matches(".rs").to_string();
    let last = parts[parts.len() - 1];
    let depth = if rel == "lib.rs" {
        0
    } else if last == "mod.rs" {
        parts.len() - 1
    } else {
        parts.len()
    };
    (top, depth)
}

/// The first path segments after `crate::` (or after enough `super::` to
/// reach the root), with their lines. A group `crate::{a::x, b}` gives
/// `a` and `b`.
fn root_paths(s: &str, depth: usize) -> Vec<(String, usize)> {
    let c: Vec<char> = s.chars().collect();
    let line_at = |i: usize| c[..i].iter().filter(|&&ch| ch == '\n').count() + 1;
    let starts_with = |i: usize, p: &str| {
        let p: Vec<char> = p.chars().collect();
        c.len() >= i + p.len() && c[i..i + p.len()] == p[..]
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let boundary = i == 0 || !(is_ident(c[i - 1]) || c[i - 1] == '$' || c[i - 1] == ':');
        let after = if boundary && starts_with(i, "crate::") {
            Some(i + "crate::".len())
        } else if boundary && depth > 0 && starts_with(i, "super::") {
            let mut j = i;
            let mut supers = 0;
            while starts_with(j, "super::") {
                j += "super::".len();
                supers += 1;
            }
            (supers == depth).then_some(j)
        } else {
            None
        };
        let Some(mut j) = after else {
            i += 1;
            continue;
        };
        while j < c.len() && c[j].is_whitespace() {
            j += 1;
        }
        if j < c.len() && c[j] == '{' {
            // Each entry of the group, at its own depth.
            let mut k = j + 1;
            let mut braces = 1;
            let mut expect_name = true;
            while k < c.len() && braces > 0 {
                match c[k] {
                    '{' => braces += 1,
                    '}' => braces -= 1,
                    ',' if braces == 1 => expect_name = true,
                    ch if expect_name && braces == 1 && is_ident(ch) => {
                        let start = k;
                        while k < c.len() && is_ident(c[k]) {
                            k += 1;
                        }
                        let name: String = c[start..k].iter().collect();
                        if name != "self" {
                            out.push((name, line_at(start)));
                        }
                        expect_name = false;
                        continue;
                    }
                    _ => {}
                }
                k += 1;
            }
            i = k;
        } else {
            let start = j;
            while j < c.len() && is_ident(c[j]) {
                j += 1;
            }
            if j > start {
                out.push((c[start..j].iter().collect(), line_at(i)));
            }
            i = j.max(i + 1);
        }
    }
    out
}

/// What the crate root re-exports: item name → the module it comes from.
/// Takes stripped text.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let body = stmt[at + "pub use ".len()..].trim_start();
        let body = body.strip_prefix("crate::").unwrap_or(body);
        let module: String = body.chars().take_while(|&c| is_ident(c)).collect();
        // Identifiers and group punctuation; an identifier followed by `,`
        // or `}` (or ending the statement) is an exported name, so
        // `A as B` exports `B` and `a::C` exports `C`.
        let mut tokens: Vec<String> = Vec::new();
        let mut cur = String::new();
        for ch in body.chars().chain(std::iter::once(',')) {
            if is_ident(ch) {
                cur.push(ch);
                continue;
            }
            if !cur.is_empty() {
                tokens.push(std::mem::take(&mut cur));
            }
            if matches!(ch, ',' | '{' | '}') {
                tokens.push(ch.to_string());
            }
        }
        for w in tokens.windows(2) {
            let name_like = w[0].chars().next().is_some_and(is_ident) && w[0] != "self";
            if name_like && matches!(w[1].as_str(), "," | "}") {
                out.insert(w[0].clone(), module.clone());
            }
        }
    }
    out
}

/// Every edge between top-level modules, and the paths that name no
/// module or re-exported item.
fn edges(sources: &[Source]) -> (Vec<Edge>, Vec<String>) {
    let modules: BTreeSet<String> = sources.iter().map(|s| module_of(&s.path).0).collect();
    let lib = sources
        .iter()
        .find(|s| s.path == "src/lib.rs")
        .map(|s| remove_test_items(&strip(&s.text)))
        .unwrap_or_default();
    let reexports = root_reexports(&lib);
    let mut out = Vec::new();
    let mut unresolved = Vec::new();
    for s in sources {
        let (from, depth) = module_of(&s.path);
        let code = remove_test_items(&strip(&s.text));
        for (name, line) in root_paths(&code, depth) {
            let to = if modules.contains(&name) {
                name
            } else if let Some(m) = reexports.get(&name) {
                m.clone()
            } else {
                unresolved.push(format!(
                    "{}:{line}: `{name}` is neither a top-level module nor re-exported by lib.rs",
                    s.path
                ));
                continue;
            };
            if to != from {
                out.push(Edge {
                    from: from.clone(),
                    to,
                    file: s.path.clone(),
                    line,
                });
            }
        }
    }
    (out, unresolved)
}

/// Strongly connected components with more than one module.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reach[n].contains(*n) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|m| reach[n].contains(**m) && reach[*m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        done.extend(scc.iter().cloned());
        out.push(scc);
    }
    out
}

/// Every breach of the layer order, every cycle, every module the table
/// lacks and every stale exception, one sentence each.
fn check(
    sources: &[Source],
    layers: &[(String, Vec<String>)],
    exceptions: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut problems = Vec::new();
    let rank: BTreeMap<&str, (usize, &str)> = layers
        .iter()
        .enumerate()
        .flat_map(|(r, (name, mods))| mods.iter().map(move |m| (m.as_str(), (r, name.as_str()))))
        .collect();
    let modules: BTreeSet<String> = sources.iter().map(|s| module_of(&s.path).0).collect();
    for m in &modules {
        if !rank.contains_key(m.as_str()) {
            problems.push(format!("module `{m}` is in no layer of the layer table"));
        }
    }
    for m in rank.keys() {
        if !modules.contains(*m) {
            problems.push(format!("the layer table names `{m}`, which is no module"));
        }
    }
    let (edges, unresolved) = edges(sources);
    problems.extend(unresolved);
    let excepted = |e: &Edge| {
        exceptions
            .iter()
            .any(|(f, t, _)| *f == e.from && *t == e.to)
    };
    for (f, t, _) in exceptions {
        if !edges.iter().any(|e| e.from == *f && e.to == *t) {
            problems.push(format!(
                "the known exception {f} -> {t} no longer exists: remove it from KNOWN_EXCEPTIONS"
            ));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in &edges {
        if excepted(e) {
            continue;
        }
        graph
            .entry(e.from.clone())
            .or_default()
            .insert(e.to.clone());
        if let (Some(&(rf, lf)), Some(&(rt, lt))) =
            (rank.get(e.from.as_str()), rank.get(e.to.as_str()))
        {
            if rt > rf {
                problems.push(format!(
                    "{}:{}: `{}` (layer {lf}) imports `{}` (layer {lt}, above it)",
                    e.file, e.line, e.from, e.to
                ));
            }
        }
    }
    for scc in cycles(&graph) {
        let inside: Vec<String> = edges
            .iter()
            .filter(|e| !excepted(e) && scc.contains(&e.from) && scc.contains(&e.to))
            .map(|e| format!("{}:{} ({} -> {})", e.file, e.line, e.from, e.to))
            .collect();
        problems.push(format!(
            "cycle between {}: {}",
            scc.join(", "),
            inside.join("; ")
        ));
    }
    problems
}

fn src(path: &str, text: &str) -> Source {
    Source {
        path: path.into(),
        text: text.into(),
    }
}

fn layers(spec: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
    spec.iter()
        .map(|(n, m)| (n.to_string(), m.iter().map(|s| s.to_string()).collect()))
        .collect()
}

#[test]
fn the_library_imports_only_down_its_layer_order_and_has_no_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md"))
        .expect("docs/ARCHITECTURE.md is readable");
    let problems = check(&read_sources(root), &parse_layers(&doc), KNOWN_EXCEPTIONS);
    assert!(problems.is_empty(), "layering:\n{}", problems.join("\n"));
}

#[test]
fn an_import_up_the_order_is_reported_with_its_file_and_line() {
    let files = [
        src("src/lib.rs", "mod format;\nmod log;\n"),
        src(
            "src/format/manifest.rs",
            "//! Pure.\n\nuse crate::log::Log;\n",
        ),
        src("src/log.rs", "use crate::format::manifest;\n"),
    ];
    let table = layers(&[("pure", &["format"]), ("log", &["log"]), ("top", &["lib"])]);
    let problems = check(&files, &table, &[]);
    // The upward import, and the cycle it closes with the import below.
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("src/format/manifest.rs:3: `format` (layer pure) imports `log`"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("cycle between format, log:"),
        "{problems:?}"
    );
    // Excepted, the same import is neither.
    let excepted = check(&files, &table, &[("format", "log", "a known exception")]);
    assert_eq!(excepted, Vec::<String>::new());
}

#[test]
fn a_cycle_inside_one_layer_is_reported_with_its_edges() {
    let files = [
        src("src/lib.rs", ""),
        src("src/a.rs", "fn f() { crate::b::g() }\n"),
        src("src/b.rs", "use super::{a::f};\n"),
    ];
    let table = layers(&[("one", &["a", "b"]), ("top", &["lib"])]);
    let problems = check(&files, &table, &[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("cycle between a, b:"),
        "{problems:?}"
    );
    assert!(problems[0].contains("src/a.rs:1 (a -> b)"), "{problems:?}");
    assert!(problems[0].contains("src/b.rs:1 (b -> a)"), "{problems:?}");
}

#[test]
fn comments_strings_and_test_items_are_not_imports() {
    let text = r##"
//! See [`crate::log::Log`].
/* crate::log::x /* nested crate::log */ */
const S: &str = "crate::log::Log";
const R: &str = r#"crate::log"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { x }
#[cfg(test)]
mod tests {
    use crate::log::Log;
    fn g() { let _ = '{'; }
}
#[cfg(test)]
use crate::log::Other;
"##;
    let files = [
        src("src/lib.rs", ""),
        src("src/format.rs", text),
        src("src/log.rs", ""),
    ];
    let table = layers(&[("pure", &["format"]), ("log", &["log"]), ("top", &["lib"])]);
    assert_eq!(check(&files, &table, &[]), Vec::<String>::new());
}

#[test]
fn grouped_paths_and_root_reexports_resolve_to_their_modules() {
    let files = [
        src(
            "src/lib.rs",
            "mod reader;\npub use reader::{Cut, Reader as R};\npub use crate::reader::StartAt;\n",
        ),
        src("src/reader.rs", ""),
        src(
            "src/storage/mod.rs",
            "use crate::{reader::Cut, self};\nfn f(_: crate::R) {}\nfn g(_: crate::StartAt) {}\n",
        ),
    ];
    let (edges, unresolved) = edges(&files);
    assert!(unresolved.is_empty(), "{unresolved:?}");
    let from_storage: Vec<(String, usize)> = edges
        .iter()
        .filter(|e| e.from == "storage")
        .map(|e| (e.to.clone(), e.line))
        .collect();
    assert_eq!(
        from_storage,
        vec![
            ("reader".to_string(), 1),
            ("reader".to_string(), 2),
            ("reader".to_string(), 3)
        ]
    );
}

#[test]
fn a_module_outside_the_table_and_a_stale_exception_are_reported() {
    let files = [src("src/lib.rs", ""), src("src/extra.rs", "")];
    let table = layers(&[("top", &["lib"])]);
    let problems = check(&files, &table, &[("extra", "lib", "gone")]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("module `extra` is in no layer"));
    assert!(problems[1].contains("known exception extra -> lib no longer exists"));
}
