//! A check that cannot run because a tool it needs is missing is never a silent pass.
//!
//! With `CI=true` (`.ci/run` installs every tool) the test fails. Elsewhere the test goes on
//! without that check and prints one marker line straight to the process's stderr (not
//! through `eprintln!`, which the test harness captures for passing tests), so it shows in
//! `cargo test` output; `hack/test.sh` counts the markers and names them in its summary.

#![allow(dead_code)]

use std::io::Write;

/// The marker `hack/test.sh` counts; keep the two in step.
pub const MARKER: &str = "SKIPPED-CHECK:";

/// Whether this run is CI (`CI=true`, as `.ci/run` is started; `1` too).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Report that the current test's check needing `tool` did not run; `install` says how to
/// get it. Panics in CI; otherwise prints `SKIPPED-CHECK: <test>: <tool> not installed`.
pub fn tool_missing(tool: &str, install: &str) {
    let test = match std::thread::current().name() {
        Some(name) if name != "main" => format!("{}::{name}", env!("CARGO_CRATE_NAME")),
        _ => env!("CARGO_CRATE_NAME").to_owned(),
    };
    assert!(
        !in_ci(),
        "{test}: {tool} is missing in CI, where every check must run ({install})"
    );
    let line = format!("{MARKER} {test}: {tool} not installed ({install})\n");
    // One write of the whole line, so parallel tests' output does not split it.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
