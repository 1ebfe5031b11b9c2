//! SVG chart of GPU allocation vs arrived GPU request, one line per policy.
//!
//! Two panels: the whole run (0–130% arrived) and a zoom on the saturated end (80–130%)
//! where the policies differ. Dashed grey lines mark the paper's FGD curve when known.

use std::fmt::Write as _;

use super::reference::PaperResults;
use super::runner::PolicySummary;
use crate::placement::PolicyKind;

const W: f64 = 1180.0;
const H: f64 = 480.0;

fn color(k: PolicyKind) -> &'static str {
    match k {
        PolicyKind::Random => "#9e9e9e",
        PolicyKind::DotProduct => "#8d6e63",
        PolicyKind::GpuClustering => "#26a69a",
        PolicyKind::GpuPacking => "#5c6bc0",
        PolicyKind::BestFit => "#ffa726",
        PolicyKind::Fgd => "#1e88e5",
        PolicyKind::Tessera => "#d81b60",
        PolicyKind::Binpack => "#7cb342",
        PolicyKind::Spread => "#8e24aa",
    }
}

pub(crate) struct Panel {
    pub(crate) x0: f64,
    pub(crate) y0: f64,
    pub(crate) w: f64,
    pub(crate) h: f64,
    pub(crate) xr: (f64, f64),
    pub(crate) yr: (f64, f64),
}

impl Panel {
    fn px(&self, x: f64) -> f64 {
        self.x0 + (x - self.xr.0) / (self.xr.1 - self.xr.0) * self.w
    }
    fn py(&self, y: f64) -> f64 {
        self.y0 + self.h - (y - self.yr.0) / (self.yr.1 - self.yr.0) * self.h
    }
}

/// The opening of a `w` × `h` SVG document on white with `title` centred on top (the
/// caller closes it with `</svg>`).
pub(crate) fn header(w: f64, h: f64, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    s
}

/// The chart as an SVG document.
pub fn svg(title: &str, summaries: &[PolicySummary], paper: Option<&PaperResults>) -> String {
    let mut s = header(W, H, title);
    // Zoom range: from the lowest value any policy reaches at 80% arrived, to 100.
    let low = summaries
        .iter()
        .filter_map(|p| p.at(80).map(|x| x.alloc_pct_mean))
        .fold(100.0f64, f64::min);
    let zoom_lo = ((low - 1.0) / 2.0).floor() * 2.0;
    let panels = [
        (
            Panel {
                x0: 60.0,
                y0: 50.0,
                w: 400.0,
                h: 360.0,
                xr: (0.0, 130.0),
                yr: (0.0, 100.0),
            },
            10.0,
            10.0,
        ),
        (
            Panel {
                x0: 540.0,
                y0: 50.0,
                w: 400.0,
                h: 360.0,
                xr: (80.0, 130.0),
                yr: (zoom_lo.max(0.0), 100.0),
            },
            10.0,
            2.0,
        ),
    ];
    for (p, xstep, ystep) in &panels {
        axes(&mut s, p, *xstep, *ystep);
        if let Some(r) = paper {
            let pts: Vec<(f64, f64)> = (0..=130)
                .filter_map(|x| r.alloc("06-FGD", x).map(|y| (f64::from(x), y)))
                .collect();
            line(&mut s, p, &pts, "#777", "5,4", 1.2);
        }
        for sum in summaries {
            let pts: Vec<(f64, f64)> = sum
                .curve
                .iter()
                .map(|c| (f64::from(c.arrived_pct), c.alloc_pct_mean))
                .collect();
            let width = if sum.policy == PolicyKind::Tessera {
                2.4
            } else {
                1.6
            };
            line(&mut s, p, &pts, color(sum.policy), "", width);
        }
    }
    // Legend.
    let mut y = 60.0;
    for sum in summaries {
        let _ = writeln!(
            s,
            r#"<line x1="960" y1="{y}" x2="985" y2="{y}" stroke="{}" stroke-width="3"/>"#,
            color(sum.policy)
        );
        let v = sum
            .at(100)
            .map_or(String::new(), |x| format!(" {:.2}%", x.alloc_pct_mean));
        let _ = writeln!(
            s,
            r#"<text x="990" y="{}">{}{}</text>"#,
            y + 4.0,
            sum.policy.name(),
            v
        );
        y += 20.0;
    }
    if paper.is_some() {
        let _ = writeln!(
            s,
            r##"<line x1="960" y1="{y}" x2="985" y2="{y}" stroke="#777" stroke-dasharray="5,4"/>"##
        );
        let _ = writeln!(s, r#"<text x="990" y="{}">fgd (paper)</text>"#, y + 4.0);
        y += 20.0;
    }
    let _ = writeln!(
        s,
        r##"<text x="960" y="{}" fill="#555">value at 100%</text>"##,
        y + 4.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">arrived GPU request (% of capacity)</text>"#,
        W / 2.0 - 60.0,
        H - 25.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">GPU allocated (% of capacity)</text>"#,
        H / 2.0,
        H / 2.0
    );
    s.push_str("</svg>\n");
    s
}

pub(crate) fn axes(s: &mut String, p: &Panel, xstep: f64, ystep: f64) {
    let _ = writeln!(
        s,
        r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        p.x0, p.y0, p.w, p.h
    );
    let mut x = p.xr.0;
    while x <= p.xr.1 + 1e-9 {
        let px = p.px(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px}" y1="{}" x2="{px}" y2="{}" stroke="#eee"/>"##,
            p.y0,
            p.y0 + p.h
        );
        let _ = writeln!(
            s,
            r#"<text x="{px}" y="{}" text-anchor="middle">{x}</text>"#,
            p.y0 + p.h + 16.0
        );
        x += xstep;
    }
    let mut y = p.yr.0;
    while y <= p.yr.1 + 1e-9 {
        let py = p.py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{py}" x2="{}" y2="{py}" stroke="#eee"/>"##,
            p.x0,
            p.x0 + p.w
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{y}</text>"#,
            p.x0 - 6.0,
            py + 4.0
        );
        y += ystep;
    }
}

pub(crate) fn line(
    s: &mut String,
    p: &Panel,
    pts: &[(f64, f64)],
    color: &str,
    dash: &str,
    width: f64,
) {
    let inside: Vec<String> = pts
        .iter()
        .filter(|(x, _)| *x >= p.xr.0 && *x <= p.xr.1)
        .map(|&(x, y)| format!("{:.1},{:.1}", p.px(x), p.py(y.clamp(p.yr.0, p.yr.1))))
        .collect();
    if inside.is_empty() {
        return;
    }
    let dash = if dash.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{dash}""#)
    };
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{color}" stroke-width="{width}"{dash} points="{}"/>"#,
        inside.join(" ")
    );
}

pub(crate) fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
