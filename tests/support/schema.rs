//! Validation of objects Tessera writes against the official Kubernetes OpenAPI schemas,
//! with `kubernetes-validate` (PyPI). `.ci/run` installs it, and a missing tool fails a
//! test under `CI=true`; on a developer machine without it the check is reported as skipped
//! (`support::skip`), never passed silently.

#![allow(dead_code)]

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
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        let file = dir.path().join(format!("object-{i}.json"));
        std::fs::write(&file, serde_json::to_vec(object).unwrap()).unwrap();
        files.push(file);
    }
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
