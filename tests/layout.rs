//! The house rules the layout keeps, checked on the sources themselves: no
//! crate has an import cycle between its files, and no production file
//! holds more than 900 lines before its test module.
//!
//! A file's imports are the `crate::`, `super::` and `self::` paths it
//! names (in `use` trees, braces included, and inline in code), resolved to
//! the file that defines the module they reach. A file may use what its
//! ancestors define (a module's parts build on it); any other pair of files
//! that reach each other, directly or around a longer loop, is a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates: each member's `src` folder.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line");
    members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| {
            root.join(m.trim_start_matches("./").trim_start_matches('.'))
                .join("src")
        })
        .filter(|p| p.is_dir())
        .collect()
}

/// Every `.rs` file under `dir`, by module path (`a::b` for `a/b.rs` or
/// `a/b/mod.rs`; the crate root is the empty path).
fn modules(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("a readable folder")
            .map(|e| e.expect("an entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).expect("under the root");
                let mut parts: Vec<String> = rel
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&p).expect("a readable file");
                out.insert(parts.join("::"), text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    // A binary's other roots (`src/bin/x.rs`) are crates of their own.
    out.retain(|m, _| !m.starts_with("bin::") && m != "bin");
    out
}

/// Source text without comments, strings and character literals (they may
/// mention paths that are not imports).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            b'r' if matches!(b.get(i + 1), Some(b'#' | b'"'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == b'"' && b[j + 1..].iter().take(hashes).all(|c| *c == b'#') {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                i = j;
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..]
                        .iter()
                        .position(|c| *c == b'\'')
                        .map(|p| i + 3 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    Some(i + 3)
                } else {
                    None
                };
                match end {
                    Some(e) => {
                        out.push_str("' '");
                        i = e;
                    }
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// The words and punctuation of `code`.
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if d.is_alphanumeric() || d == '_' {
                    end = j + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(code[i..end].to_owned());
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            out.push("::".to_owned());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// Parses a path or use tree at `toks[i..]` (its first segment already
/// taken as `prefix`): every path it names, and where it ends.
fn paths_at(
    toks: &[String],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    while toks.get(i).is_some_and(|t| t == "::") {
        match toks.get(i + 1).map(String::as_str) {
            Some("{") => {
                i += 2;
                loop {
                    match toks.get(i).map(String::as_str) {
                        None => return i,
                        Some("}") => return i + 1,
                        Some(",") => i += 1,
                        Some(t) => {
                            let first = t.to_owned();
                            let mut p = path.clone();
                            if first != "self" {
                                p.push(first);
                            }
                            i = paths_at(toks, i + 1, p, out);
                            // `as name` renames: skip it.
                            if toks.get(i).is_some_and(|t| t == "as") {
                                i += 2;
                            }
                        }
                    }
                }
            }
            Some(t) if t.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                path.push(t.to_owned());
                i += 2;
            }
            _ => break,
        }
    }
    out.push(path);
    i
}

/// The modules (files) a file's code reaches, resolved against `known`.
fn imports(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let toks = tokens(&code_only(text));
    let here: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    // Inline modules (`mod tests { .. }`) shift what `self` and `super`
    // mean inside them: a stack of (name, brace depth at its opening).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((toks[i + 1].clone(), depth));
            }
            "crate" | "super" | "self" if toks.get(i + 1).is_some_and(|t| t == "::") => {
                // `x.self::` cannot occur; `$crate` in macros is left out.
                if i > 0 && toks[i - 1] == "$" {
                    i += 1;
                    continue;
                }
                let mut base: Vec<String> = if t == "crate" {
                    Vec::new()
                } else {
                    here.iter()
                        .cloned()
                        .chain(inline.iter().map(|(n, _)| n.clone()))
                        .collect()
                };
                if t == "super" {
                    base.pop();
                }
                let mut j = i + 1;
                // Further `super::` segments climb on.
                while toks.get(j + 1).is_some_and(|t| t == "super") {
                    base.pop();
                    j += 2;
                }
                let mut paths = Vec::new();
                i = paths_at(&toks, j, base, &mut paths);
                found.extend(paths);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
        .into_iter()
        .filter_map(|p| {
            (0..=p.len())
                .rev()
                .map(|n| p[..n].join("::"))
                .find(|m| known.contains(m))
        })
        .filter(|target| {
            let ancestor =
                target.is_empty() || module == target || module.starts_with(&format!("{target}::"));
            !ancestor
        })
        .collect()
}

/// The import graph of one crate: module → modules it reaches.
fn graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, text)| (m.clone(), imports(m, text, &known)))
        .collect()
}

/// The graph's cycles: its strongly connected components of two or more
/// files (Tarjan's algorithm).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let mut found = Vec::new();
    let sources = crate_sources();
    assert!(sources.len() >= 10, "the workspace's crates: {sources:?}");
    for src in sources {
        let g = graph(&modules(&src));
        for cycle in cycles(&g) {
            // The edges inside the cycle: what to cut.
            let edges: Vec<String> = cycle
                .iter()
                .flat_map(|a| {
                    g[a].iter()
                        .filter(|b| cycle.contains(b))
                        .map(move |b| format!("{a} → {b}"))
                })
                .collect();
            found.push(format!(
                "{}: {} ({})",
                src.display(),
                cycle.join(" ↔ "),
                edges.join(", ")
            ));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn no_production_file_holds_more_than_900_lines_before_its_tests() {
    let mut long = Vec::new();
    for src in crate_sources() {
        for (m, text) in modules(&src) {
            let lines = text
                .lines()
                .take_while(|l| !l.starts_with("#[cfg(test)]"))
                .count();
            if lines > 900 {
                long.push(format!("{} {m}: {lines} lines", src.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over 900 lines:\n{}",
        long.join("\n")
    );
}

/// A made-up crate, as (module path, text) pairs, and the cycles it has.
type Case = (
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

/// The scanner itself, on files made for it: each case is a crate (file
/// path, text) and the cycles it must report.
#[test]
fn the_scanner_finds_the_cycles_it_is_given_and_no_others() {
    let cases: &[Case] = &[
        // Siblings that import each other, through a brace tree.
        (
            &[
                ("", "mod a; mod b;"),
                ("a", "use crate::{b::{self, B}, x};"),
                ("b", "pub struct B; fn f() { crate::a::g(); }"),
            ],
            &["a ↔ b"],
        ),
        // A child may use its parent; the parent its child: no cycle.
        (
            &[
                ("", "mod a;"),
                ("a", "mod c; use self::c::C; pub struct A;"),
                ("a::c", "use super::A; pub struct C;"),
            ],
            &[],
        ),
        // A longer loop, through `super::` from a folder's part.
        (
            &[
                ("", "mod a; mod b; mod d;"),
                ("a", "mod c;"),
                ("a::c", "use super::super::b::B;"),
                ("b", "use crate::d::D; pub struct B;"),
                ("d", "fn f() { let _ = crate::a::c::X; }"),
            ],
            &["a::c ↔ b ↔ d"],
        ),
        // Paths in comments and strings are not imports; a test module's
        // `super` is its own file.
        (
            &[
                ("", "mod a; mod b;"),
                (
                    "a",
                    "// crate::b::B\nconst S: &str = \"crate::b\";\n#[cfg(test)] mod tests { use super::*; }",
                ),
                ("b", "use crate::a::S;"),
            ],
            &[],
        ),
    ];
    for (files, want) in cases {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(m, t)| ((*m).to_owned(), (*t).to_owned()))
            .collect();
        let got: Vec<String> = cycles(&graph(&files))
            .into_iter()
            .map(|c| c.join(" ↔ "))
            .collect();
        assert_eq!(got, *want, "{files:?}");
    }
}

/// The binary reads its environment in one place: `src/config.rs` (and
/// through its flags' `env = ...` fallbacks, which the argument parser
/// reads). Library crates may not read it at all (`clippy.toml`).
#[test]
fn the_binary_reads_its_environment_only_in_its_configuration() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let readers: Vec<String> = modules(&src)
        .into_iter()
        .filter(|(m, text)| {
            m != "config" && {
                let code = code_only(text);
                ["env::var(", "env::var_os(", "env::vars("]
                    .iter()
                    .any(|call| code.contains(call))
            }
        })
        .map(|(m, _)| m)
        .collect();
    assert!(
        readers.is_empty(),
        "files of src/ that read the environment: {readers:?}"
    );
}

/// Prints each crate's file graph (`cargo test --test layout -- --ignored
/// --nocapture`): what a newcomer reads to see which file builds on which.
#[test]
#[ignore = "prints the graphs; checks nothing"]
fn print_the_file_graphs() {
    for src in crate_sources() {
        println!("{}", src.display());
        for (m, to) in graph(&modules(&src)) {
            if !to.is_empty() {
                let to: Vec<&str> = to.iter().map(String::as_str).collect();
                let m = if m.is_empty() { "(root)" } else { m.as_str() };
                println!("  {m} → {}", to.join(", "));
            }
        }
    }
}
