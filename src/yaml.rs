//! Reading YAML that comes from outside the process (the layout config, plan files) with
//! bounds, and errors that never quote the input.
//!
//! The parser is `serde-saphyr` (pure Rust, maintained, no `unsafe-libyaml`). Before a
//! document is deserialized:
//! - its size is checked by the caller ([`check_size`], [`read_bounded`]): larger input is
//!   refused unread;
//! - the parser's budget is checked over the event stream first: nesting deeper than
//!   [`MAX_DEPTH`], more than [`MAX_NODES`] nodes, alias storms ("billion laughs") are
//!   refused before any value is built, in time linear in the input.
//!
//! Errors name the line, the column and the field, never the text there: parser snippets
//! are off, scalar values are not quoted, and a key is named only when it looks like a
//! field name (a file that is not a config at all, e.g. a symlink to `/etc/shadow`, is
//! reported without any of its content).

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;

/// Largest YAML input accepted from one file or ConfigMap key, in bytes.
pub const MAX_BYTES: u64 = 1 << 20;
/// Deepest nesting accepted (a layout config needs 6, a Kubernetes object about 12).
pub const MAX_DEPTH: usize = 64;
/// Most YAML nodes (scalars, sequences, mappings) in one input of [`MAX_BYTES`]; larger
/// limits scale it (one node per 4 bytes).
pub const MAX_NODES: usize = (MAX_BYTES / 4) as usize;
/// Most aliases (`*name`) in one input, and events replayed through them.
pub const MAX_ALIASES: usize = 1_000;
const MAX_REPLAYED_EVENTS: usize = 100_000;

/// Why YAML input was refused; `Display` never quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct YamlError {
    /// The field path (`tessera.gpus[0].vgpu`, `.` for the document), when known.
    pub path: String,
    /// The line (1-based), when known.
    pub line: Option<usize>,
    /// What is wrong, with line and column when known.
    pub reason: String,
}

impl YamlError {
    fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            line: None,
            reason: reason.into(),
        }
    }

    fn from_parser(path: impl Into<String>, e: &serde_saphyr::Error) -> Self {
        Self {
            path: path.into(),
            line: e.location().map(|l| l.line() as usize).filter(|&l| l > 0),
            reason: safe_message(e),
        }
    }
}

/// Parser options: the budget above, no source snippets in errors.
pub fn options() -> serde_saphyr::Options {
    options_for(MAX_BYTES)
}

/// [`options`] for input of up to `limit` bytes.
pub fn options_for(limit: u64) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_nodes = usize::try_from(limit / 4)
        .unwrap_or(usize::MAX)
        .max(MAX_NODES);
    budget.max_aliases = MAX_ALIASES;
    budget.max_total_scalar_bytes = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    // YAML 1.2 Core scalars, as `serde_yaml` read them into untyped values: `y`, `no`,
    // `on` stay strings, `0755` and `1_000` too.
    options.strict_booleans = true;
    options.leading_zero_numbers_as_strings = true;
    options.underscored_numbers_as_strings = true;
    options.alias_limits.max_total_replayed_events = MAX_REPLAYED_EVENTS;
    options
}

/// Refuse input over `limit` bytes.
pub fn check_size(len: usize, limit: u64) -> Result<(), YamlError> {
    if len as u64 > limit {
        return Err(YamlError::new(
            ".",
            format!("{len} bytes is more than the {limit}-byte limit"),
        ));
    }
    Ok(())
}

/// Read a file of at most `limit` bytes as UTF-8 (a larger file is refused after reading
/// `limit + 1` bytes; its content is never quoted).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the {limit}-byte limit"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Deserialize one document of `text` (at most [`MAX_BYTES`]) into `T`, with the field
/// path of an error.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    from_str_limited(text, MAX_BYTES)
}

/// [`from_str`] with another size limit.
pub fn from_str_limited<T: DeserializeOwned>(text: &str, limit: u64) -> Result<T, YamlError> {
    check_size(text.len(), limit)?;
    let mut track = serde_path_to_error::Track::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options_for(limit), |de| {
        T::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    })
    .map_err(|e| YamlError::from_parser(safe_path(&track.path().to_string()), &e))
}

/// Every document of `text` (at most `limit` bytes) as a JSON value, empty ones included as
/// `null`.
pub fn documents(text: &str, limit: u64) -> Result<Vec<serde_json::Value>, YamlError> {
    check_size(text.len(), limit)?;
    serde_saphyr::from_multiple_with_options(text, options_for(limit))
        .map_err(|e| YamlError::from_parser(".", &e))
}

/// A field name worth printing: letters, digits and `_-./`, at most 64 characters.
pub fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

/// A `serde_path_to_error` path with every segment that is not a plain name (a key taken
/// from the input) replaced by `?`.
pub fn safe_path(path: &str) -> String {
    if path == "." {
        return path.to_string();
    }
    // Segments are `a.b[0].c`; a key holding `.` or `[` cannot be told apart, so each
    // piece between separators is checked on its own.
    let mut out = String::new();
    for (i, part) in path.split('.').enumerate() {
        if i > 0 {
            out.push('.');
        }
        let (name, index) = match part.find('[') {
            Some(at) => part.split_at(at),
            None => (part, ""),
        };
        let index_ok = index.is_empty()
            || index.split_inclusive(']').all(|ix| {
                ix.starts_with('[')
                    && ix.ends_with(']')
                    && ix[1..ix.len() - 1].chars().all(|c| c.is_ascii_digit())
            });
        if (name.is_empty() || is_plain_name(name)) && index_ok {
            out.push_str(part);
        } else {
            out.push('?');
        }
    }
    out
}

/// The parser's error without any of the input: unknown keys are named only when they are
/// plain names, scalar values never; line and column kept.
pub fn safe_message(e: &serde_saphyr::Error) -> String {
    let at = e
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
        .unwrap_or_default();
    match e {
        serde_saphyr::Error::SerdeUnknownField {
            field, expected, ..
        } => {
            let field = if is_plain_name(field) {
                format!("`{field}`")
            } else {
                "(a key that is not a field name; not shown)".to_string()
            };
            format!(
                "unknown field {field}, expected one of {}{at}",
                expected.join(", ")
            )
        }
        serde_saphyr::Error::SerdeInvalidType { expected, .. } => {
            format!("wrong type, expected {expected}{at}")
        }
        serde_saphyr::Error::SerdeInvalidValue { expected, .. } => {
            format!("invalid value, expected {expected}{at}")
        }
        serde_saphyr::Error::SerdeUnknownVariant { expected, .. } => {
            format!(
                "unknown variant, expected one of {}{at}",
                expected.join(", ")
            )
        }
        other => {
            // Parser and budget errors describe the structure, not the text; keep only
            // the first line (no snippet) and drop anything quoted, to be sure.
            let text = other.to_string();
            let first = text.lines().next().unwrap_or_default();
            strip_quoted(first)
        }
    }
}

/// `text` with every quoted or back-quoted part that is not a plain name replaced by `…`.
fn strip_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('"');
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find(quote) {
            Some(end) if is_plain_name(&after[..end]) => {
                out.push_str(&rest[start..start + end + 2]);
                rest = &after[end + 1..];
            }
            Some(end) => {
                out.push(quote);
                out.push('…');
                out.push(quote);
                rest = &after[end + 1..];
            }
            None => {
                out.push('…');
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        version: Option<String>,
        inner: Option<Inner>,
        list: Option<Vec<u32>>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        cores: Option<i64>,
    }

    const SECRET: &str = "root:$6$Zq9sEcReT$hAsHhAsHhAsH:19000:0:99999:7:::";

    /// Parse on another thread (into a value that takes any YAML) and give it at most
    /// `limit` to answer.
    fn parse_within(text: String, limit: Duration) -> Result<serde_json::Value, YamlError> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(from_str::<serde_json::Value>(&text));
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("no answer within {limit:?}"))
    }

    #[test]
    fn adversarial_input_is_refused_quickly() {
        let deep_flow = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
        let mut deep_block = String::new();
        for i in 0..1000 {
            deep_block.push_str(&" ".repeat(i));
            deep_block.push_str("a:\n");
        }
        let mut laughs = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            let p = format!("*{prev}");
            laughs.push_str(&format!("{name}: &{name} [{}]\n", vec![p; 9].join(", ")));
        }
        let huge = format!("version: \"{}\"\n", "x".repeat(2 << 20));
        for (what, text, want) in [
            ("deep flow nesting", deep_flow, "recursion limit"),
            ("deep block nesting", deep_block, "budget"),
            ("billion laughs", laughs, "budget|limit"),
            ("huge input", huge, "limit"),
        ] {
            let t0 = Instant::now();
            let e = parse_within(text, Duration::from_secs(10)).expect_err(what);
            assert!(want.split('|').any(|w| e.reason.contains(w)), "{what}: {e}");
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{what}: {:?}",
                t0.elapsed()
            );
        }
    }

    #[test]
    fn errors_never_quote_the_input() {
        for text in [
            format!("{SECRET}\n"),
            format!("{SECRET}\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n"),
            format!("\"{SECRET}\": 1\n"),
            format!("version: [\"{SECRET}\"]\n"),
            format!("inner: {{ cores: \"{SECRET}\" }}\n"),
            format!("list: [1, \"{SECRET}\"]\n"),
            format!("version: \"{SECRET}\n"),
            format!("version: v1\n  x: [\n{SECRET}\n"),
            format!("- {SECRET}\n"),
        ] {
            let e = from_str::<Doc>(&text).expect_err(&text);
            let shown = format!("{}: {}", e.path, e.reason);
            assert!(!shown.contains("Zq9sEcReT"), "{text:?} -> {shown}");
            assert!(!shown.contains("root:"), "{text:?} -> {shown}");
            assert!(shown.contains("line "), "{text:?} -> {shown}");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_place() {
        let e = from_str::<Doc>("version: v1\ninner:\n  bogus: 1\n").unwrap_err();
        assert_eq!(e.path, "inner.bogus");
        assert!(e.reason.contains("unknown field `bogus`"), "{e}");
        assert!(e.reason.contains("line 3"), "{e}");
        let e = from_str::<Doc>("list: [1, two]\n").unwrap_err();
        assert_eq!(e.path, "list[1]");
        assert!(e.reason.contains("line 1, column 11"), "{e}");
    }

    #[test]
    fn safe_path_hides_keys_that_are_not_names() {
        assert_eq!(safe_path("tessera.gpus[0].vgpu"), "tessera.gpus[0].vgpu");
        assert_eq!(safe_path("."), ".");
        assert_eq!(safe_path("spec.root:$6$x"), "spec.?");
    }

    #[test]
    fn files_over_the_limit_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.yaml");
        std::fs::write(&path, vec![b'#'; 2048]).unwrap();
        let e = read_bounded(&path, 1024).unwrap_err();
        assert!(e.to_string().contains("1024-byte limit"), "{e}");
        std::fs::write(&path, [b'a', 0xff, b'\n']).unwrap();
        let e = read_bounded(&path, 1024).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        std::fs::write(&path, "version: v1\n").unwrap();
        assert_eq!(read_bounded(&path, 1024).unwrap(), "version: v1\n");
    }
}
