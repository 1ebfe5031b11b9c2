//! Validation of objects Tessera writes against the official Kubernetes OpenAPI schemas,
//! with `kubernetes-validate` (PyPI). `.ci/run` installs it, and a missing tool fails a
//! test under `CI=true`; on a developer machine without it the check is reported as skipped
//! (`support::skip`), never passed silently.

#![allow(dead_code)]

/// `objects` written one per file in a temporary folder (kept while the handle lives).
fn json_files(objects: &[serde_json::Value]) -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let files = objects
        .iter()
        .enumerate()
        .map(|(i, object)| {
            let file = dir.path().join(format!("object-{i}.json"));
            std::fs::write(&file, serde_json::to_vec(object).unwrap()).unwrap();
            file
        })
        .collect();
    (dir, files)
}

/// Validate `object` (JSON with apiVersion/kind) strictly for each Kubernetes version.
pub fn validate(object: &serde_json::Value, versions: &[&str]) {
    validate_all(std::slice::from_ref(object), versions)
}

/// Validate several objects, one tool run per version.
pub fn validate_all(objects: &[serde_json::Value], versions: &[&str]) {
    let tool = std::process::Command::new("kubernetes-validate")
        .arg("--version")
        .output();
    if tool.is_err() {
        super::skip::tool_missing("kubernetes-validate", "pip install kubernetes-validate");
        return;
    }
    let (_dir, files) = json_files(objects);
    for version in versions {
        let out = std::process::Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "-k", version])
            .args(&files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "invalid for Kubernetes {version}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // kubernetes-validate exits 0 on some failures; read its report too.
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            !report.contains("ERROR"),
            "invalid for Kubernetes {version}: {report}"
        );
    }
}

/// Validate custom resources against their CRDs in `crds` (a path from the repository
/// root) with `tests/py/validate_cr.py`: each must match its schema and hold no field the
/// schema does not declare (the API server would prune it). A missing python jsonschema or
/// PyYAML is reported as skipped (`support::skip`), a failure in CI.
pub fn validate_custom(objects: &[serde_json::Value], crds: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (_dir, files) = json_files(objects);
    let out = std::process::Command::new("python3")
        .arg(root.join("tests/py/validate_cr.py"))
        .arg(root.join(crds))
        .args(&files)
        .output()
        .expect("python3");
    match out.status.code() {
        Some(0) => {}
        Some(3) => super::skip::tool_missing(
            "python3 jsonschema and PyYAML",
            "pip install jsonschema pyyaml",
        ),
        _ => panic!(
            "custom resources do not match their CRDs: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
