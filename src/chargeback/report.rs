//! The chargeback report, pure: the window and grouping read from flags, the PromQL that
//! reads the counters back exactly, the rows assembled from the answers, and the three
//! output formats. `read.rs` runs the queries.
//!
//! ## Why not `increase()`
//! `increase(c[7d])` extrapolates to the window's edges and half a scrape interval past a
//! series' first and last samples, so a pod that comes and goes is charged time it never
//! held. The report sums per-step increments instead, at a step of `--step` (default
//! 60 s; at most the scrape interval for resets to be exact):
//!
//! ```text
//! sum by (GROUP, model, mode) (
//!   sum_over_time(( (c - c offset STEP) >= 0   # the counter went up by this much
//!                   or c * 1                   # new series or reset: it went up from 0
//!                 )[WINDOW-1s:STEP] ))
//! ```
//!
//! The increments telescope: over steps `from+STEP … to` they add up to `c(to) - c(from)`,
//! plus each reset's restart value. The window is rounded down to whole steps, and split
//! into day-long chunks queried concurrently (summed here, exactly).

use std::collections::BTreeMap;
use std::fmt::Write;

/// The bad input a report refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    #[error("{flag} {text:?}: {why}")]
    BadTime {
        flag: &'static str,
        text: String,
        why: String,
    },
    #[error("--by {0:?}: expected namespace, queue or label:KEY (KEY a Prometheus label name, e.g. label:team)")]
    BadBy(String),
    #[error("--step {0}: must be between 1 s and 1 day")]
    BadStep(i64),
    #[error(
        "the window {from}..{to} is shorter than one step ({step} s) once rounded to whole steps"
    )]
    EmptyWindow { from: i64, to: i64, step: i64 },
}

/// What rows are grouped by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    Namespace,
    Queue,
    /// Any label on the series: `team` (the configured pod label's value), `node`, `pod`,
    /// or one added by relabelling.
    Label(String),
}

impl GroupBy {
    pub fn parse(text: &str) -> Result<GroupBy, ReportError> {
        match text {
            "namespace" => Ok(GroupBy::Namespace),
            "queue" => Ok(GroupBy::Queue),
            _ => match text.strip_prefix("label:") {
                Some(key) if is_label_name(key) => Ok(GroupBy::Label(key.to_string())),
                _ => Err(ReportError::BadBy(text.to_string())),
            },
        }
    }

    /// The Prometheus label grouped by.
    pub fn label(&self) -> &str {
        match self {
            GroupBy::Namespace => "namespace",
            GroupBy::Queue => "queue",
            GroupBy::Label(key) => key,
        }
    }
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not `__`-reserved, and not one the rows already split by.
fn is_label_name(key: &str) -> bool {
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !key.starts_with("__")
        && key != "model"
        && key != "mode"
}

/// A time flag: RFC 3339 (`2026-11-30T00:00:00Z`), Unix seconds, `now`, or `now-<n><unit>`
/// with unit s, m, h, d or w.
pub fn parse_time(flag: &'static str, text: &str, now: i64) -> Result<i64, ReportError> {
    let bad = |why: &str| ReportError::BadTime {
        flag,
        text: text.to_string(),
        why: why.to_string(),
    };
    let text = text.trim();
    if text == "now" {
        return Ok(now);
    }
    if let Some(ago) = text.strip_prefix("now-") {
        let split = ago.len().saturating_sub(1);
        let (n, unit) = ago.split_at(split);
        let n: i64 = n
            .parse()
            .map_err(|_| bad("expected now-<number><s|m|h|d|w>, e.g. now-7d"))?;
        let unit = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 604_800,
            _ => return Err(bad("the unit must be s, m, h, d or w")),
        };
        return n
            .checked_mul(unit)
            .and_then(|ago| now.checked_sub(ago))
            .ok_or_else(|| bad("too far back"));
    }
    if let Ok(seconds) = text.parse::<i64>() {
        return Ok(seconds);
    }
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|e| {
            bad(&format!(
                "not RFC 3339, Unix seconds or now-<n><unit> ({e})"
            ))
        })
}

/// Unix seconds as RFC 3339 UTC.
pub fn format_time(at: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(at)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| at.to_string())
}

/// A report's window `(from, to]`, both on whole steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from: i64,
    pub to: i64,
    pub step: i64,
}

/// Chunks a window is split into for concurrent queries.
const CHUNK_SECONDS: i64 = 86_400;

impl Window {
    /// `from` and `to` rounded down to whole multiples of `step` (Prometheus aligns a
    /// subquery's steps to multiples of its step since the epoch).
    pub fn new(from: i64, to: i64, step: i64) -> Result<Window, ReportError> {
        if !(1..=86_400).contains(&step) {
            return Err(ReportError::BadStep(step));
        }
        let (from, to) = (from.div_euclid(step) * step, to.div_euclid(step) * step);
        if to - from < step {
            return Err(ReportError::EmptyWindow { from, to, step });
        }
        Ok(Window { from, to, step })
    }

    /// Consecutive sub-windows of at most about a day, on whole steps, covering this one.
    pub fn chunks(&self) -> Vec<Window> {
        let size = (CHUNK_SECONDS / self.step).max(1) * self.step;
        let mut chunks = Vec::new();
        let mut from = self.from;
        while from < self.to {
            let to = (from + size).min(self.to);
            chunks.push(Window {
                from,
                to,
                step: self.step,
            });
            from = to;
        }
        chunks
    }

    /// The increase of `counter` over this window from `source`, summed by `by`, model
    /// and mode, evaluated at `self.to`.
    pub fn query(&self, source: Source, counter: &str, by: &GroupBy) -> String {
        match source {
            Source::Raw => self.increase_query(counter, by),
            Source::Rules => format!(
                "sum by ({by}, model, mode) (sum_over_time({rule}[{range}s]))",
                by = by.label(),
                rule = rule_for(counter),
                range = self.to - self.from - 1
            ),
        }
    }

    /// The increase of counter `metric` over this window, summed by `by`, model and mode,
    /// evaluated at `self.to`.
    pub fn increase_query(&self, metric: &str, by: &GroupBy) -> String {
        let (step, range) = (self.step, self.to - self.from - 1);
        format!(
            "sum by ({by}, model, mode) (sum_over_time((({metric} - {metric} offset {step}s) >= 0 or {metric} * 1)[{range}s:{step}s]))",
            by = by.label()
        )
    }
}

/// Where the increments come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The raw counters, increments computed per step at query time (exact; costs the
    /// server per step and series).
    Raw,
    /// The recording rules of `daemonset/prometheus/tessera-chargeback.rules.yml`: each
    /// minute's increment stored as it happened; the report only sums the rule samples
    /// in the window, so its edges are the rule's evaluation times (within a minute of
    /// `from` and `to`). Needs the rules in force (or backfilled) over the whole window.
    Rules,
}

/// The recording rule holding `counter`'s per-minute increments.
pub fn rule_for(counter: &str) -> String {
    let base = counter
        .trim_start_matches("tessera_")
        .trim_end_matches("_total");
    format!("tessera:{base}:increase1m")
}

/// One series of an answer: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    /// The group's label value; empty when series lack the label.
    pub group: String,
    pub model: String,
    pub mode: String,
    pub allocated_gpu_seconds: f64,
    /// `None` where no used series matched this row's allocated ones (never a made-up 0).
    pub used_gpu_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub from: String,
    pub to: String,
    pub by: String,
    pub rows: Vec<Row>,
    /// Parts of the window without any allocated sample (Prometheus down, data expired):
    /// the rows do not include them.
    pub missing: Vec<Span>,
}

/// A part of the window, RFC 3339.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Span {
    pub from: String,
    pub to: String,
}

/// Consecutive chunks merged into spans.
pub fn spans(chunks: &[Window]) -> Vec<Span> {
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for c in chunks {
        match merged.last_mut() {
            Some(last) if last.1 == c.from => last.1 = c.to,
            _ => merged.push((c.from, c.to)),
        }
    }
    merged
        .into_iter()
        .map(|(from, to)| Span {
            from: format_time(from),
            to: format_time(to),
        })
        .collect()
}

type Key = (String, String, String);

fn key(labels: &BTreeMap<String, String>, by: &GroupBy) -> Key {
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    (get(by.label()), get("model"), get("mode"))
}

/// Adds the readings of one or more chunks per (group, model, mode).
pub fn totals(readings: impl IntoIterator<Item = Reading>, by: &GroupBy) -> BTreeMap<Key, f64> {
    let mut sums = BTreeMap::new();
    for r in readings {
        *sums.entry(key(&r.labels, by)).or_insert(0.0) += r.value;
    }
    sums
}

/// Rows in (group, model, mode) order from the allocated and used totals. A group whose
/// series were present but charged nothing in the window (a pod that ended just before
/// it, still within Prometheus's lookback) has no row.
pub fn assemble(
    window: &Window,
    by: &GroupBy,
    allocated: BTreeMap<Key, f64>,
    used: &BTreeMap<Key, f64>,
    missing: Vec<Span>,
) -> Report {
    let rows = allocated
        .into_iter()
        .filter(|(k, a)| *a != 0.0 || used.get(k).is_some_and(|u| *u != 0.0))
        .map(|(k, allocated_gpu_seconds)| Row {
            used_gpu_seconds: used.get(&k).copied(),
            group: k.0,
            model: k.1,
            mode: k.2,
            allocated_gpu_seconds,
        })
        .collect();
    Report {
        from: format_time(window.from),
        to: format_time(window.to),
        by: by.label().to_string(),
        rows,
        missing,
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

fn hours(seconds: f64) -> String {
    format!("{:.3}", seconds / 3600.0)
}

impl Report {
    /// Allocated and used GPU-seconds over every row (used over the rows that have it).
    pub fn total(&self) -> (f64, f64) {
        self.rows.iter().fold((0.0, 0.0), |(a, u), r| {
            (
                a + r.allocated_gpu_seconds,
                u + r.used_gpu_seconds.unwrap_or(0.0),
            )
        })
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Table => self.table(),
            Format::Csv => self.csv(),
            Format::Json => serde_json::to_string_pretty(self).unwrap_or_default() + "\n",
        }
    }

    fn table(&self) -> String {
        let mut lines = vec![[
            self.by.to_uppercase(),
            "MODEL".to_string(),
            "MODE".to_string(),
            "ALLOCATED GPU-H".to_string(),
            "USED GPU-H".to_string(),
            "USED %".to_string(),
        ]];
        let shown = |g: &str| {
            if g.is_empty() {
                "(none)".to_string()
            } else {
                g.to_string()
            }
        };
        for r in &self.rows {
            let (used, pct) = match r.used_gpu_seconds {
                Some(u) if r.allocated_gpu_seconds > 0.0 => (
                    hours(u),
                    format!("{:.1}", 100.0 * u / r.allocated_gpu_seconds),
                ),
                Some(u) => (hours(u), "-".to_string()),
                None => ("n/a".to_string(), "n/a".to_string()),
            };
            lines.push([
                shown(&r.group),
                r.model.clone(),
                r.mode.clone(),
                hours(r.allocated_gpu_seconds),
                used,
                pct,
            ]);
        }
        let (a, u) = self.total();
        lines.push([
            "TOTAL".to_string(),
            String::new(),
            String::new(),
            hours(a),
            hours(u),
            if a > 0.0 {
                format!("{:.1}", 100.0 * u / a)
            } else {
                "-".to_string()
            },
        ]);
        let mut widths = [0usize; 6];
        for line in &lines {
            for (w, cell) in widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = format!("GPU-hours {} .. {}\n", self.from, self.to);
        for gap in &self.missing {
            let _ = writeln!(
                out,
                "MISSING: no samples {} .. {}; the figures below leave it out",
                gap.from, gap.to
            );
        }
        for line in &lines {
            let mut text = String::new();
            for (i, (cell, w)) in line.iter().zip(widths).enumerate() {
                if i < 3 {
                    let _ = write!(text, "{cell:<w$}  ");
                } else {
                    let _ = write!(text, "{cell:>w$}  ");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }

    fn csv(&self) -> String {
        let field = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        let mut out = format!(
            "{},model,mode,allocated_gpu_seconds,used_gpu_seconds,from,to\n",
            field(&self.by)
        );
        for r in &self.rows {
            let used = r
                .used_gpu_seconds
                .map(|u| u.to_string())
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                field(&r.group),
                field(&r.model),
                field(&r.mode),
                r.allocated_gpu_seconds,
                used,
                self.from,
                self.to
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_000_000;

    #[test]
    fn times_parse_in_every_accepted_form_and_bad_ones_name_the_flag() {
        assert_eq!(parse_time("--to", "now", NOW), Ok(NOW));
        assert_eq!(parse_time("--from", "now-7d", NOW), Ok(NOW - 7 * 86_400));
        assert_eq!(parse_time("--from", "now-36h", NOW), Ok(NOW - 36 * 3600));
        assert_eq!(parse_time("--from", "now-2w", NOW), Ok(NOW - 2 * 604_800));
        assert_eq!(
            parse_time("--from", "2026-11-30T00:00:00Z", NOW),
            Ok(1_795_996_800)
        );
        assert_eq!(
            parse_time("--from", "2026-11-30T01:00:00+01:00", NOW),
            Ok(1_795_996_800)
        );
        assert_eq!(parse_time("--to", "1795996800", NOW), Ok(1_795_996_800));
        for bad in ["yesterday", "now-7", "now-7y", "now-d", "2026-11-30", ""] {
            match parse_time("--from", bad, NOW) {
                Err(ReportError::BadTime { flag, text, .. }) => {
                    assert_eq!((flag, text.as_str()), ("--from", bad.trim()))
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert_eq!(format_time(1_795_996_800), "2026-11-30T00:00:00Z");
    }

    #[test]
    fn group_by_accepts_the_documented_forms_only() {
        assert_eq!(GroupBy::parse("namespace"), Ok(GroupBy::Namespace));
        assert_eq!(GroupBy::parse("queue").unwrap().label(), "queue");
        assert_eq!(
            GroupBy::parse("label:team"),
            Ok(GroupBy::Label("team".into()))
        );
        for bad in [
            "team",
            "label:",
            "label:9x",
            "label:a-b",
            "label:__name__",
            "label:mode",
            "Namespace",
        ] {
            assert_eq!(GroupBy::parse(bad), Err(ReportError::BadBy(bad.into())));
        }
    }

    #[test]
    fn windows_round_to_steps_and_chunks_cover_them_exactly() {
        let w = Window::new(1_000_030, 1_000_000 + 3 * 86_400 + 45, 60).unwrap();
        assert_eq!((w.from % 60, w.to % 60), (0, 0));
        assert_eq!(w.from, 1_000_020);
        let chunks = w.chunks();
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].from, w.from);
        assert_eq!(chunks.last().unwrap().to, w.to);
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].to, pair[1].from);
            assert_eq!(pair[0].to % 60, 0);
        }
        assert_eq!(
            Window::new(100, 159, 60),
            Ok(Window {
                from: 60,
                to: 120,
                step: 60
            })
        );
        assert!(matches!(
            Window::new(120, 150, 60),
            Err(ReportError::EmptyWindow { .. })
        ));
        assert_eq!(Window::new(0, 100, 0), Err(ReportError::BadStep(0)));
        let q = Window::new(0, 3600, 60)
            .unwrap()
            .increase_query("c_total", &GroupBy::Queue);
        assert_eq!(
            q,
            "sum by (queue, model, mode) (sum_over_time(((c_total - c_total offset 60s) >= 0 or c_total * 1)[3599s:60s]))"
        );
        let w = Window::new(0, 3600, 60).unwrap();
        assert_eq!(
            w.query(
                Source::Rules,
                "tessera_chargeback_gpu_used_seconds_total",
                &GroupBy::Namespace
            ),
            "sum by (namespace, model, mode) (sum_over_time(tessera:chargeback_gpu_used_seconds:increase1m[3599s]))"
        );
    }

    #[test]
    fn rows_add_chunks_keep_missing_used_apart_and_render_in_three_formats() {
        let reading = |ns: &str, mode: &str, v: f64| Reading {
            labels: [("namespace", ns), ("model", "H100"), ("mode", mode)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value: v,
        };
        let by = GroupBy::Namespace;
        let allocated = totals(
            [
                reading("a", "whole", 3600.0),
                reading("a", "whole", 3600.0),
                reading("b,c", "mig", 1800.0),
            ],
            &by,
        );
        let used = totals([reading("a", "whole", 1800.0)], &by);
        let w = Window::new(0, 7200, 60).unwrap();
        let missing = spans(&[
            Window::new(0, 3600, 60).unwrap(),
            Window::new(3600, 7200, 60).unwrap(),
            Window::new(10_800, 14_400, 60).unwrap(),
        ]);
        assert_eq!(missing.len(), 2);
        assert_eq!(missing[0].to, "1970-01-01T02:00:00Z");
        let report = assemble(&w, &by, allocated, &used, missing);
        assert_eq!(report.rows.len(), 2);
        assert_eq!(report.rows[0].allocated_gpu_seconds, 7200.0);
        assert_eq!(report.rows[0].used_gpu_seconds, Some(1800.0));
        assert_eq!(report.rows[1].used_gpu_seconds, None);
        assert_eq!(report.total(), (9000.0, 1800.0));
        let table = report.render(Format::Table);
        assert!(table.contains("NAMESPACE"), "{table}");
        assert!(
            table.contains("MISSING: no samples 1970-01-01T00:00:00Z .. 1970-01-01T02:00:00Z"),
            "{table}"
        );
        assert!(table.lines().any(|l| l.starts_with("a ")
            && l.contains("2.000")
            && l.contains("0.500")
            && l.ends_with("25.0")));
        assert!(table.lines().any(|l| l.contains("n/a")), "{table}");
        let csv = report.render(Format::Csv);
        assert!(csv.contains("\n\"b,c\",H100,mig,1800,,"), "{csv}");
        let json: serde_json::Value = serde_json::from_str(&report.render(Format::Json)).unwrap();
        assert_eq!(json["rows"][0]["allocated_gpu_seconds"], 7200.0);
        assert!(json["rows"][1]["used_gpu_seconds"].is_null());
        assert_eq!(json["from"], "1970-01-01T00:00:00Z");
        assert_eq!(json["missing"][1]["from"], "1970-01-01T03:00:00Z");
    }
}
