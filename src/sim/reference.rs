//! The FGD authors' published results (`fgd_expected_results/` of the trace bundle), to
//! print beside ours.
//!
//! Two formats are read: the per-seed curves `analysis_allo_discrete.csv` /
//! `analysis_frag_discrete.csv` (`workload,sc_policy,tune,seed,[total_gpus,]0,1,...,130`)
//! for any trace, and the compact `headline_default_trace.csv` for the default trace.

use std::collections::HashMap;
use std::path::Path;

use super::error::{Error, Result};

/// Means over seeds per (paper policy label, arrived percent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaperResults {
    alloc: HashMap<(String, u32), f64>,
    frag: HashMap<(String, u32), f64>,
}

impl PaperResults {
    /// Mean allocation percent for a policy label (`06-FGD`) at `arrived_pct`.
    pub fn alloc(&self, label: &str, arrived_pct: u32) -> Option<f64> {
        self.alloc.get(&(label.to_string(), arrived_pct)).copied()
    }

    /// Mean fragmentation percent of capacity at `arrived_pct`.
    pub fn frag(&self, label: &str, arrived_pct: u32) -> Option<f64> {
        self.frag.get(&(label.to_string(), arrived_pct)).copied()
    }

    /// True when nothing was found for the workload.
    pub fn is_empty(&self) -> bool {
        self.alloc.is_empty()
    }

    /// Parses `headline_default_trace.csv` rows of `workload`.
    pub fn from_headline(text: &str, file: &str, workload: &str) -> Result<Self> {
        let mut out = Self::default();
        let mut lines = text.lines().enumerate();
        let Some((_, head)) = lines.next() else {
            return Ok(out);
        };
        let head: Vec<&str> = head.split(',').collect();
        let col = |name: &str| {
            head.iter()
                .position(|h| *h == name)
                .ok_or_else(|| Error::Malformed {
                    file: file.into(),
                    line: 1,
                    reason: format!("header has no `{name}` column"),
                })
        };
        let (w, p, a, am, fm) = (
            col("workload")?,
            col("policy")?,
            col("arrived_pct_of_gpu_capacity")?,
            col("gpu_alloc_pct_mean")?,
            col("frag_gpu_pct_of_total_mean")?,
        );
        for (i, line) in lines {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != head.len() {
                continue;
            }
            if f[w] != workload {
                continue;
            }
            let bad = |what: &str| Error::Malformed {
                file: file.into(),
                line: i + 1,
                reason: format!("bad `{what}`"),
            };
            let pct: u32 = f[a]
                .parse()
                .map_err(|_| bad("arrived_pct_of_gpu_capacity"))?;
            let alloc: f64 = f[am].parse().map_err(|_| bad("gpu_alloc_pct_mean"))?;
            let frag: f64 = f[fm]
                .parse()
                .map_err(|_| bad("frag_gpu_pct_of_total_mean"))?;
            out.alloc.insert((f[p].to_string(), pct), alloc);
            out.frag.insert((f[p].to_string(), pct), frag);
        }
        Ok(out)
    }

    /// Loads the authors' results for `workload` from `dir` (the per-seed curves if
    /// present, else the headline file). `Ok(None)` when the folder has neither.
    pub fn load(dir: &Path, workload: &str) -> Result<Option<Self>> {
        let allo = dir.join("analysis_allo_discrete.csv");
        if allo.exists() {
            let alloc = mean_curves(&read(&allo)?, &allo.display().to_string(), workload)?;
            let frag_path = dir.join("analysis_frag_discrete.csv");
            let frag = if frag_path.exists() {
                mean_curves(
                    &read(&frag_path)?,
                    &frag_path.display().to_string(),
                    workload,
                )?
            } else {
                HashMap::new()
            };
            let out = Self { alloc, frag };
            return Ok((!out.is_empty()).then_some(out));
        }
        let head = dir.join("headline_default_trace.csv");
        if head.exists() {
            let out = Self::from_headline(&read(&head)?, &head.display().to_string(), workload)?;
            return Ok((!out.is_empty()).then_some(out));
        }
        Ok(None)
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Mean over seeds of the per-percent columns, for rows of `workload`.
fn mean_curves(text: &str, file: &str, workload: &str) -> Result<HashMap<(String, u32), f64>> {
    let mut lines = text.lines().enumerate();
    let Some((_, head)) = lines.next() else {
        return Ok(HashMap::new());
    };
    let head: Vec<&str> = head.split(',').collect();
    let pct_cols: Vec<(usize, u32)> = head
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.parse::<u32>().ok().map(|p| (i, p)))
        .collect();
    let mut sums: HashMap<(String, u32), (f64, u32)> = HashMap::new();
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.first() != Some(&workload) {
            continue;
        }
        if f.len() != head.len() || f.len() < 2 {
            return Err(Error::Malformed {
                file: file.into(),
                line: i + 1,
                reason: "field count differs from header".into(),
            });
        }
        for &(c, pct) in &pct_cols {
            let v: f64 = f[c].parse().map_err(|_| Error::Malformed {
                file: file.into(),
                line: i + 1,
                reason: format!("column `{pct}`: `{}` is not a number", f[c]),
            })?;
            let e = sums.entry((f[1].to_string(), pct)).or_insert((0.0, 0));
            e.0 += v;
            e.1 += 1;
        }
    }
    Ok(sums
        .into_iter()
        .map(|(k, (s, n))| (k, s / f64::from(n)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_and_curves_parse_to_means() {
        let head = "workload,policy,arrived_pct_of_gpu_capacity,n_seeds,gpu_alloc_pct_mean,gpu_alloc_pct_sd,frag_gpu_pct_of_total_mean\n\
            w,06-FGD,100,10,95.23,0.1,4.73\nother,06-FGD,100,10,1.0,0.1,1.0\n";
        let r = PaperResults::from_headline(head, "h.csv", "w").unwrap();
        assert_eq!(r.alloc("06-FGD", 100), Some(95.23));
        assert_eq!(r.frag("06-FGD", 100), Some(4.73));
        assert_eq!(r.alloc("05-BestFit", 100), None);

        let curves = "workload,sc_policy,tune,seed,total_gpus,0,1\nw,06-FGD,1.3,42,6212,1.0,3.0\nw,06-FGD,1.3,43,6212,2.0,5.0\n";
        let m = mean_curves(curves, "a.csv", "w").unwrap();
        assert_eq!(m.get(&("06-FGD".to_string(), 1)), Some(&4.0));
        assert_eq!(m.len(), 2, "only the percent columns are curves");
        let bad = "workload,sc_policy,tune,seed,0\nw,06-FGD,1.3,42,x\n";
        assert!(mean_curves(bad, "a.csv", "w")
            .unwrap_err()
            .to_string()
            .starts_with("a.csv:2:"));
    }
}
