//! SVG of each fleet over time: GPUs allocated and used (left), inference headroom,
//! replicas serving minus demand in GPUs (right). One row per fleet.

use std::fmt::Write as _;

use super::run::FleetResult;
use crate::sim::plot::{axes, escape, header, line, Panel};

const W: f64 = 1100.0;
const ROW: f64 = 230.0;

/// The chart as an SVG document.
pub fn svg(title: &str, fleets: &[FleetResult]) -> String {
    let h = 60.0 + ROW * fleets.len() as f64 + 30.0;
    let mut s = header(W, h, title);
    let hours = fleets
        .iter()
        .flat_map(|f| f.series.last())
        .map(|p| p.hour)
        .fold(1.0f64, f64::max);
    let xstep = nice_step(hours);
    let (lo, hi) = fleets
        .iter()
        .flat_map(|f| f.series.iter())
        .map(|p| p.inference_headroom_gpus)
        .fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = (lo.floor().min(-1.0), hi.ceil().max(1.0));
    let ystep = nice_step(hi - lo);
    let (lo, hi) = ((lo / ystep).floor() * ystep, (hi / ystep).ceil() * ystep);
    for (r, f) in fleets.iter().enumerate() {
        let y0 = 50.0 + ROW * r as f64;
        let left = Panel {
            x0: 70.0,
            y0: y0 + 20.0,
            w: 440.0,
            h: ROW - 60.0,
            xr: (0.0, hours),
            yr: (0.0, 100.0),
        };
        let right = Panel {
            x0: 620.0,
            y0: y0 + 20.0,
            w: 440.0,
            h: ROW - 60.0,
            xr: (0.0, hours),
            yr: (lo, hi),
        };
        let _ = writeln!(
            s,
            r#"<text x="70" y="{}" font-size="13" font-weight="bold">{} — allocated {:.1} %, used {:.1} % (after warm-up)</text>"#,
            y0 + 12.0,
            escape(f.label),
            f.allocated_pct,
            f.used_pct
        );
        let _ = writeln!(
            s,
            r#"<text x="620" y="{}" font-size="13">inference headroom (GPUs serving − demand), under-provisioned {:.2} % of service-time</text>"#,
            y0 + 12.0,
            f.inference.under_provisioned_pct
        );
        axes(&mut s, &left, xstep, 20.0);
        axes(&mut s, &right, xstep, ystep);
        let pts = |g: fn(&super::run::SeriesPoint) -> f64| -> Vec<(f64, f64)> {
            f.series.iter().map(|p| (p.hour, g(p))).collect()
        };
        line(&mut s, &left, &pts(|p| p.allocated_pct), "#1e88e5", "", 1.6);
        line(&mut s, &left, &pts(|p| p.used_pct), "#43a047", "", 1.6);
        line(
            &mut s,
            &right,
            &[(0.0, 0.0), (hours, 0.0)],
            "#999",
            "4,3",
            1.0,
        );
        line(
            &mut s,
            &right,
            &pts(|p| p.inference_headroom_gpus),
            "#d81b60",
            "",
            1.4,
        );
    }
    let y = h - 14.0;
    let _ = writeln!(
        s,
        r##"<line x1="70" y1="{y}" x2="95" y2="{y}" stroke="#1e88e5" stroke-width="3"/><text x="100" y="{}">GPUs allocated %</text><line x1="230" y1="{y}" x2="255" y2="{y}" stroke="#43a047" stroke-width="3"/><text x="260" y="{}">GPUs used %</text><text x="620" y="{}">x: hours of simulated time</text>"##,
        y + 4.0,
        y + 4.0,
        y + 4.0
    );
    s.push_str("</svg>\n");
    s
}

/// A round step giving 4 to 10 ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = (span / 6.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 10.0)
        .unwrap_or(10.0 * mag)
}

#[cfg(test)]
mod tests {
    #[test]
    fn nice_steps() {
        assert_eq!(super::nice_step(48.0), 5.0);
        assert_eq!(super::nice_step(168.0), 20.0);
        assert_eq!(super::nice_step(100.0), 10.0);
        assert_eq!(super::nice_step(7.0), 1.0);
    }
}
