//! The layers of the crate point one way: each top-level module of `src/` imports only modules
//! below it in [`LAYERS`] (tests, doc comments and comments aside). The README's layer diagram
//! names the same order; this test keeps both honest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules, lowest first. A module may import any module before it.
const LAYERS: &[&str] = &[
    "dtype",
    "error",
    "cache_dir",
    "memory",
    "quant",
    "sampler",
    "kernels",
    "graph",
    "backend",
    "ops",
    "config",
    "session",
    "executable",
    "trace",
    "block_timeline",
    "model",
    "sanitize",
    "serve",
];

/// What the crate root re-exports, and the module each name comes from.
const ROOT_REEXPORTS: &[(&str, &str)] = &[
    ("Buffer", "memory"),
    ("DType", "dtype"),
    ("Device", "backend"),
    ("Error", "error"),
    ("Result", "error"),
    ("RuntimeConfig", "config"),
    ("Executor", "session"),
    ("FinishReport", "session"),
    ("Mode", "config"),
    ("Plan", "config"),
    ("Session", "session"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its test modules and comments: a file of tests is skipped whole,
/// and an inline `#[cfg(test)]` item ends the file's code (test modules come last).
fn code_of(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(path).expect("read source");
    let mut code = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The top-level modules a piece of code names through `crate::`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| item.trim().split("::").next().unwrap_or("").to_string())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![rest[..end].to_string()]
        };
        for name in names {
            if let Some((_, module)) = ROOT_REEXPORTS.iter().find(|(n, _)| *n == name) {
                found.insert(module.to_string());
            } else if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// The top-level module a file of `src/` belongs to (`None` for the crate root).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let module = first.trim_end_matches(".rs");
    (module != "lib" && module != "main" && module != "cli").then(|| module.to_string())
}

#[test]
fn every_top_level_module_imports_only_the_layers_below_it() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for path in &files {
        let Some(module) = module_of(path) else {
            continue;
        };
        let rank = LAYERS
            .iter()
            .position(|m| *m == module)
            .unwrap_or_else(|| panic!("top-level module `{module}` is missing from LAYERS"));
        seen.insert(module.clone());
        for import in imports(&code_of(path)) {
            if import == module || import == "testutil" {
                continue;
            }
            match LAYERS.iter().position(|m| *m == import) {
                Some(r) if r < rank => {}
                _ => wrong.push(format!(
                    "{} (layer `{module}`) imports `{import}`",
                    path.strip_prefix(src()).unwrap_or(path).display()
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
    let listed: BTreeSet<String> = LAYERS.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        seen, listed,
        "LAYERS should list exactly the top-level modules"
    );
}

#[test]
fn the_import_scan_reads_paths_and_groups() {
    let code = "use crate::graph::{Arg, Dispatch};\nuse crate::{Device, Session};\nlet x = crate::memory::Buffer::whole;";
    let got: Vec<String> = imports(code).into_iter().collect();
    assert_eq!(got, ["backend", "graph", "memory", "session"]);
}

/// The README's text between `<!-- name -->` and `<!-- /name -->`.
fn readme_section(name: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    let open = format!("<!-- {name} -->");
    let start = readme
        .find(&open)
        .unwrap_or_else(|| panic!("README.md marks a section with {open}"));
    let rest = &readme[start..];
    let end = rest
        .find(&format!("<!-- /{name} -->"))
        .unwrap_or_else(|| panic!("README.md ends the section {open}"));
    rest[..end].to_string()
}

#[test]
fn the_readme_names_the_layers_in_order() {
    let section = readme_section("layers");
    let mut last = 0;
    for module in LAYERS.iter().rev() {
        let needle = format!("`{module}`");
        let at = section[last..].find(&needle).unwrap_or_else(|| {
            panic!("the README's layer list should name {needle} after the layers above it")
        });
        last += at + needle.len();
    }
}

#[test]
fn the_readme_names_every_source_file_and_no_other() {
    let section = readme_section("files");
    let named: BTreeSet<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs"))
        .map(str::to_string)
        .collect();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let actual: BTreeSet<String> = files
        .iter()
        .map(|p| {
            p.strip_prefix(src())
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    let missing: Vec<_> = actual.difference(&named).collect();
    let stale: Vec<_> = named.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "README file map: missing {missing:?}, naming files that do not exist {stale:?}"
    );
}
