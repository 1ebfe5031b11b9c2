//! The module rules ARCHITECTURE.md states, checked on the source itself:
//!
//! 1. Pure decision modules (admission, placement, scaling, layouts, vGPU books, the
//!    simulators, diagnose, the controller's pass modules) never call an API: no `kube`,
//!    `tonic`, `hyper`, `tokio` or `reqwest` path in their code (k8s-openapi's types are
//!    data and allowed, and so are kube-core's, named `kube_core::`: kube's crate of
//!    plain types, no client; `kube::core::` is refused like the rest of `kube::`), and
//!    every module of this crate they import is pure too.
//! 2. The modules of one folder import each other without a circle (`super::x` edges),
//!    so each folder reads bottom-up from its leaves.
//!
//! What is read: each file up to its `#[cfg(test)]` module, without `//` comment lines;
//! a path `super::a::b` or `crate::a::b` is resolved to the longest existing file
//! (`a/b.rs`, `a/b/mod.rs`, `a.rs`). A folder's `mod.rs` holds its shared names and may be
//! imported by a pure module (its own code is checked when the folder is pure).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Folders whose every module is pure.
const PURE_DIRS: [&str; 7] = [
    "src/quota",
    "src/placement",
    "src/autoscale",
    "src/partition",
    "src/vgpu",
    "src/sim",
    "src/diagnose",
];

/// Pure modules in folders that also hold API-calling ones.
const PURE_FILES: [&str; 30] = [
    "src/agent/handover.rs",
    "src/agent/ownership.rs",
    "src/chargeback/rule.rs",
    "src/chargeback/ledger.rs",
    "src/chargeback/report.rs",
    "src/controller/asked_places.rs",
    "src/controller/claims.rs",
    "src/controller/config.rs",
    "src/controller/decide.rs",
    "src/controller/evictions.rs",
    "src/controller/finished.rs",
    "src/controller/holds.rs",
    "src/controller/model.rs",
    "src/controller/pass_metrics.rs",
    "src/controller/pods_ready.rs",
    "src/controller/readiness.rs",
    "src/controller/record_updates.rs",
    "src/controller/requeue_book.rs",
    "src/controller/serving.rs",
    "src/controller/time.rs",
    "src/controller/vgpu_webhook.rs",
    "src/controller/webhook.rs",
    "src/controller/workload_record.rs",
    "src/controller/workloads.rs",
    "src/controller/extender/engine.rs",
    "src/controller/extender/records.rs",
    "src/controller/extender/replay.rs",
    "src/controller/extender/state.rs",
    "src/controller/extender/wire.rs",
    "src/metrics/usage.rs",
];

/// Pure helpers outside those folders that pure modules may use.
const PURE_LEAVES: [&str; 4] = [
    "src/yaml.rs",
    "src/gpu/health.rs",
    "src/gpu/models.rs",
    "src/retry.rs",
];

/// Folders whose modules import each other in a circle today (issue 19 left them for
/// later); every other folder must stay free of circles.
const KNOWN_CIRCLES: [&str; 1] = ["src/quota"];

const API_CRATES: [&str; 7] = [
    "kube",
    "tonic",
    "hyper",
    "hyper_util",
    "tokio",
    "tokio_util",
    "reqwest",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file's code: up to its test module, without comment lines.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join(dir)).unwrap() {
        let entry = entry.unwrap();
        let rel = dir.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            out.extend(rust_files(&rel));
        } else if rel.extension().is_some_and(|e| e == "rs") {
            out.push(rel);
        }
    }
    out.sort();
    out
}

/// Paths starting at `super` or `crate` in `code`, as their segments.
fn module_paths(code: &str) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for start in ["super::", "crate::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            rest = &rest[i + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let mut segments = Vec::new();
            for s in tail.split("::") {
                let name: String = s
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let whole = name.len() == s.len();
                if !name.is_empty() {
                    segments.push(name);
                }
                if !whole || segments.is_empty() {
                    break;
                }
            }
            out.insert(segments);
        }
    }
    out
}

/// The file a path names: the longest prefix that is a module file.
fn resolve(from: &Path, segments: &[String]) -> Option<PathBuf> {
    let (mut dir, names) = match segments.first().map(String::as_str) {
        Some("super") => {
            let parent = from.parent()?;
            let dir = if from.file_name()? == "mod.rs" {
                parent.parent()?
            } else {
                parent
            };
            (dir.to_path_buf(), &segments[1..])
        }
        Some("crate") => (PathBuf::from("src"), &segments[1..]),
        _ => return None,
    };
    let mut found = None;
    for name in names {
        let file = dir.join(format!("{name}.rs"));
        let module = dir.join(name).join("mod.rs");
        if root().join(&file).is_file() {
            found = Some(file);
        } else if root().join(&module).is_file() {
            found = Some(module);
        } else {
            break;
        }
        dir = dir.join(name);
    }
    found
}

fn pure_files() -> BTreeSet<PathBuf> {
    let mut files: BTreeSet<PathBuf> = PURE_FILES.iter().map(PathBuf::from).collect();
    for dir in PURE_DIRS {
        files.extend(rust_files(Path::new(dir)));
    }
    files
}

#[test]
fn pure_modules_call_no_api_and_import_only_pure_modules() {
    let pure = pure_files();
    let leaves: BTreeSet<PathBuf> = PURE_LEAVES.iter().map(PathBuf::from).collect();
    let mut problems = Vec::new();
    for file in &pure {
        let code = code(file);
        for krate in API_CRATES {
            let needle = format!("{krate}::");
            let found = code.match_indices(&needle).any(|(i, _)| {
                !code[..i]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if found {
                problems.push(format!("{}: uses {krate}", file.display()));
            }
        }
        for path in module_paths(&code) {
            let Some(target) = resolve(file, &path) else {
                continue;
            };
            let shared_names = target.file_name().is_some_and(|n| n == "mod.rs");
            if !pure.contains(&target) && !leaves.contains(&target) && !shared_names {
                problems.push(format!(
                    "{}: imports {} ({})",
                    file.display(),
                    path.join("::"),
                    target.display()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The `super::` edges between the modules of `dir` (files directly in it).
fn sibling_edges(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| dir.join(e.file_name()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter(|p| {
            let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            name != "mod" && !name.ends_with("_tests")
        })
        .collect();
    let stem = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string()
    };
    let names: BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        let from = stem(file);
        let to: BTreeSet<String> = module_paths(&code(file))
            .into_iter()
            .filter(|p| p.first().is_some_and(|s| s == "super"))
            .filter_map(|p| p.get(1).cloned())
            .filter(|m| names.contains(m) && *m != from)
            .collect();
        edges.insert(from, to);
    }
    edges
}

/// A circle in `edges`, if any (depth-first search).
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut c = path[at..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

fn folders(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(root().join(dir)).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            out.extend(folders(&dir.join(entry.file_name())));
        }
    }
    out
}

#[test]
fn no_folder_has_an_import_circle() {
    let mut problems = Vec::new();
    for dir in folders(Path::new("src")) {
        if KNOWN_CIRCLES.iter().any(|k| Path::new(k) == dir) {
            continue;
        }
        if let Some(c) = circle(&sibling_edges(&dir)) {
            problems.push(format!("{}: {}", dir.display(), c.join(" -> ")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_known_circles_are_still_there() {
    // When one is broken, take it off KNOWN_CIRCLES so it stays broken.
    for dir in KNOWN_CIRCLES {
        assert!(
            circle(&sibling_edges(Path::new(dir))).is_some(),
            "{dir} has no import circle any more: remove it from KNOWN_CIRCLES"
        );
    }
}

#[test]
fn the_checks_see_a_circle_and_an_api_call() {
    let code = "use super::b::X;\nuse crate::quota::Engine;\nfn f() { tokio::spawn(g()); }";
    let paths = module_paths(code);
    let path = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(paths.contains(&path(&["super", "b"])), "{paths:?}");
    assert!(paths.contains(&path(&["crate", "quota"])), "{paths:?}");
    assert_eq!(
        resolve(Path::new("src/quota/engine.rs"), &path(&["super", "model"])),
        Some(PathBuf::from("src/quota/model.rs"))
    );
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(circle(&edges).map(|c| c.len()), Some(4));
    let mut acyclic = edges.clone();
    acyclic.insert("c".into(), BTreeSet::new());
    assert_eq!(circle(&acyclic), None);
}
