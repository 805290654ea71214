//! The file-level import graph of `src/` (production code: test files, inline test modules
//! and the test-only `testing` and `fuzz_tests` modules are left out) and its circles.
//!
//! A file imports another when a `use` line or an inline `crate::…`/`super::…`/`self::…` path
//! in it resolves to that file: the longest prefix of the path that is a module, followed
//! through that module's re-exports (`pub use`) to the file that defines the item. A
//! re-export is a front door, not an import of its own, so it adds no arrow.

use std::collections::{BTreeMap, BTreeSet};

use super::{CodeLine, production_lines};

/// A module's path from the crate root (`["plan", "report"]`).
type Module = Vec<String>;

/// One module's file and what it names.
struct Source {
    file: String,
    /// Paths named by `use` lines and inline paths, as written.
    uses: Vec<String>,
    /// Paths re-exported by `pub use`.
    reexports: Vec<String>,
}

/// The module a file under `src/` defines: `src/plan/report.rs` and `src/plan/report/mod.rs`
/// are `plan::report`; `src/lib.rs` is the root.
fn module_of(file: &str) -> Module {
    let path = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Module = path.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`.
pub fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default().trim();
        return vec![path.to_string()];
    };
    let prefix = &tree[..open];
    let inner = tree[open + 1..].trim_end().trim_end_matches('}');
    let (mut parts, mut depth, mut current) = (Vec::new(), 0usize, String::new());
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut current)),
            '{' => {
                depth += 1;
                current.push(c);
            }
            '}' => {
                depth = depth.saturating_sub(1);
                current.push(c);
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
        .iter()
        .filter(|part| !part.trim().is_empty())
        .flat_map(|part| expand(part))
        .map(|path| {
            if path == "self" {
                prefix.trim_end_matches("::").to_string()
            } else {
                format!("{prefix}{path}")
            }
        })
        .collect()
}

/// What one file's production lines name.
fn source_of(file: &str, lines: &[&CodeLine]) -> Source {
    let text: String = lines
        .iter()
        .map(|line| line.code.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let (mut uses, mut reexports) = (Vec::new(), Vec::new());
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices("use ") {
        let boundary = at
            .checked_sub(1)
            .map(|i| bytes[i])
            .is_none_or(|b| b.is_ascii_whitespace() || b == b')');
        let Some(end) = text[at..].find(';') else {
            continue;
        };
        if !boundary {
            continue;
        }
        let before = text[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let tree = &text[at + 4..at + end];
        for path in expand(tree) {
            if public {
                reexports.push(path);
            } else {
                uses.push(path);
            }
        }
    }
    // Inline paths: `crate::a::b`, `super::a` outside `use` lines.
    for root in ["crate::", "super::"] {
        for (at, _) in text.match_indices(root) {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue;
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            uses.push(path.trim_end_matches(':').to_string());
        }
    }
    Source {
        file: file.to_string(),
        uses,
        reexports,
    }
}

/// `path` as written in `module`, from the crate root; `None` for paths into other crates.
fn absolute(module: &Module, path: &str) -> Option<Module> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut base = match segments.peek().copied() {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("super" | "self") => module.clone(),
        _ => return None,
    };
    while let Some(&segment) = segments.peek() {
        match segment {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    base.extend(segments.map(str::to_string));
    Some(base)
}

/// The import graph: file → the files it imports.
pub struct Graph {
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// Reads `src/`.
    pub fn of_src() -> Self {
        let lines = production_lines("src");
        let mut by_file: BTreeMap<&str, Vec<&CodeLine>> = BTreeMap::new();
        for line in &lines {
            by_file.entry(line.file.as_str()).or_default().push(line);
        }
        let sources: BTreeMap<Module, Source> = by_file
            .iter()
            .filter(|(file, _)| {
                !file.starts_with("src/testing")
                    && !file.starts_with("src/fuzz_tests")
                    && !file.starts_with("src/controller/fake_apiserver")
            })
            .map(|(file, lines)| (module_of(file), source_of(file, lines)))
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, source) in &sources {
            let targets = edges.entry(source.file.clone()).or_default();
            for path in &source.uses {
                let Some(target) = absolute(module, path)
                    .and_then(|segments| resolve(&sources, &segments, 0))
                    .filter(|target| target != module && !target.is_empty())
                else {
                    continue;
                };
                targets.insert(sources[&target].file.clone());
            }
        }
        Graph { edges }
    }

    /// The strongly connected components with more than one file (Tarjan's algorithm).
    pub fn circles(&self) -> Vec<BTreeSet<String>> {
        let mut tarjan = Tarjan {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for file in self.edges.keys() {
            if !tarjan.index.contains_key(file) {
                tarjan.visit(file);
            }
        }
        tarjan.found.retain(|component| component.len() > 1);
        tarjan.found
    }
}

/// The module `segments` names: the longest prefix that is a module, followed through its
/// re-exports when the rest names one of them.
fn resolve(sources: &BTreeMap<Module, Source>, segments: &[String], depth: u32) -> Option<Module> {
    let found = (0..=segments.len())
        .rev()
        .find(|&n| sources.contains_key(&segments[..n]))?;
    let module = segments[..found].to_vec();
    let rest = &segments[found..];
    if let (Some(first), true) = (rest.first(), depth < 8) {
        for reexport in &sources[&module].reexports {
            let Some(target) = absolute(&module, reexport) else {
                continue;
            };
            if target.last() == Some(first) {
                let mut through = target;
                through.extend(rest[1..].iter().cloned());
                return resolve(sources, &through, depth + 1);
            }
            if target.last().is_some_and(|s| s == "*") {
                let mut through = target[..target.len() - 1].to_vec();
                through.extend(rest.iter().cloned());
                if let Some(inner) = resolve(sources, &through, depth + 1)
                    && inner != module
                {
                    return Some(inner);
                }
            }
        }
    }
    Some(module)
}

struct Tarjan<'a> {
    graph: &'a Graph,
    next: usize,
    index: BTreeMap<String, usize>,
    low: BTreeMap<String, usize>,
    stack: Vec<String>,
    on_stack: BTreeSet<String>,
    found: Vec<BTreeSet<String>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, file: &str) {
        self.index.insert(file.to_string(), self.next);
        self.low.insert(file.to_string(), self.next);
        self.next += 1;
        self.stack.push(file.to_string());
        self.on_stack.insert(file.to_string());
        let targets: Vec<String> = self
            .graph
            .edges
            .get(file)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        for target in targets {
            if !self.index.contains_key(&target) {
                self.visit(&target);
                let low = self.low[file].min(self.low[&target]);
                self.low.insert(file.to_string(), low);
            } else if self.on_stack.contains(&target) {
                let low = self.low[file].min(self.index[&target]);
                self.low.insert(file.to_string(), low);
            }
        }
        if self.low[file] == self.index[file] {
            let mut component = BTreeSet::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack.remove(&top);
                let done = top == file;
                component.insert(top);
                if done {
                    break;
                }
            }
            self.found.push(component);
        }
    }
}
