//! Readers for the Alibaba GPU trace v2023 CSVs (node list and pod list).
//!
//! Both are plain comma-separated files with a header row and no quoting. Columns are
//! found by name, so extra columns are ignored; every malformed row is rejected with its
//! 1-based line number and the offending field.

use std::path::Path;

use super::error::{Error, Result};
use crate::placement::{GpuDemand, NodeSpec, Request, MILLI};

/// One pod of a pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub request: Request,
}

/// Reads a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn read_node_list(path: &Path) -> Result<Vec<NodeSpec>> {
    parse_node_list(&read(path)?, &path.display().to_string())
}

/// Reads a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`).
pub fn read_pod_list(path: &Path) -> Result<Vec<TracePod>> {
    parse_pod_list(&read(path)?, &path.display().to_string())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// A header-indexed CSV table over borrowed text.
pub(crate) struct Table<'a> {
    file: &'a str,
    header: Vec<&'a str>,
    pub(crate) rows: Vec<(usize, Vec<&'a str>)>,
}

impl<'a> Table<'a> {
    pub(crate) fn parse(text: &'a str, file: &'a str) -> Result<Self> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
        let (_, head) =
            lines
                .find(|(_, l)| !l.trim().is_empty())
                .ok_or_else(|| Error::Malformed {
                    file: file.into(),
                    line: 1,
                    reason: "missing header row".into(),
                })?;
        let header: Vec<&str> = head.split(',').map(str::trim).collect();
        let mut rows = Vec::new();
        for (n, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != header.len() {
                return Err(Error::Malformed {
                    file: file.into(),
                    line: n,
                    reason: format!("expected {} fields, found {}", header.len(), fields.len()),
                });
            }
            rows.push((n, fields));
        }
        if rows.is_empty() {
            return Err(Error::Empty(file.into()));
        }
        Ok(Self { file, header, rows })
    }

    pub(crate) fn column(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| Error::Malformed {
                file: self.file.into(),
                line: 1,
                reason: format!("header has no `{name}` column"),
            })
    }

    pub(crate) fn bad(&self, line: usize, reason: String) -> Error {
        Error::Malformed {
            file: self.file.into(),
            line,
            reason,
        }
    }

    pub(crate) fn num<T: std::str::FromStr>(
        &self,
        line: usize,
        row: &[&str],
        col: usize,
    ) -> Result<T> {
        let raw = row[col];
        raw.parse().map_err(|_| {
            self.bad(
                line,
                format!("`{}`: `{raw}` is not a valid number", self.header[col]),
            )
        })
    }
}

/// `nan`/empty mean "not set" in these traces.
pub(crate) fn unset(s: &str) -> bool {
    s.is_empty() || s.eq_ignore_ascii_case("nan")
}

/// Parses node-list text; `file` names it in errors.
pub fn parse_node_list(text: &str, file: &str) -> Result<Vec<NodeSpec>> {
    let t = Table::parse(text, file)?;
    let (sn, cpu, mem, gpu, model) = (
        t.column("sn")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("gpu")?,
        t.column("model")?,
    );
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let gpus: u8 = t.num(*line, row, gpu)?;
        let m = row[model];
        if gpus > 0 && unset(m) {
            return Err(t.bad(*line, format!("`model`: node has {gpus} GPUs but no model")));
        }
        if row[sn].is_empty() {
            return Err(t.bad(*line, "`sn`: empty node name".into()));
        }
        let m = if unset(m) { "" } else { m };
        out.push(NodeSpec::new(
            row[sn],
            t.num(*line, row, cpu)?,
            t.num(*line, row, mem)?,
            gpus,
            m,
        ));
    }
    Ok(out)
}

/// Parses pod-list text; `file` names it in errors.
pub fn parse_pod_list(text: &str, file: &str) -> Result<Vec<TracePod>> {
    let t = Table::parse(text, file)?;
    let cols = (
        t.column("name")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("num_gpu")?,
        t.column("gpu_milli")?,
        // Some pod lists (e.g. `multigpu*`) have no GPU-model column: no constraints.
        t.column("gpu_spec").ok(),
    );
    let (name, cpu, mem, num, milli, spec) = cols;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let line = *line;
        let n: u8 = t.num(line, row, num)?;
        let m: u16 = t.num(line, row, milli)?;
        let gpu = match (n, m) {
            (0, 0) => GpuDemand::None,
            (0, _) => return Err(t.bad(line, format!("`gpu_milli`: {m} but num_gpu is 0"))),
            (_, 0) => return Err(t.bad(line, format!("`gpu_milli`: 0 but num_gpu is {n}"))),
            (_, m) if m > MILLI => {
                return Err(t.bad(line, format!("`gpu_milli`: {m} is above 1000")))
            }
            (1, m) if m < MILLI => GpuDemand::Shared {
                milli: m,
                memory_mib: 0,
            },
            (n, MILLI) => GpuDemand::Whole { count: n },
            (n, m) => {
                return Err(t.bad(
                    line,
                    format!("`gpu_milli`: {m} with num_gpu {n} (multi-GPU pods take whole GPUs)"),
                ))
            }
        };
        let spec_field = spec.map_or("", |c| row[c]);
        let models = if unset(spec_field) || n == 0 {
            Vec::new()
        } else {
            spec_field
                .split('|')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        out.push(TracePod {
            name: row[name].to_string(),
            request: Request {
                cpu_milli: t.num(line, row, cpu)?,
                memory_mib: t.num(line, row, mem)?,
                gpu,
                gpu_models: models,
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str =
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,131072,0,nan\n";
    const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
        p0,12000,16384,1,1000,,LS\n\
        p1,6000,12288,1,460,V100M16|V100M32,LS\n\
        p2,88000,327680,8,1000,nan,BE\n\
        p3,4000,8000,0,0,,BE\n";

    #[test]
    fn reads_nodes_and_pods() {
        let nodes = parse_node_list(NODES, "nodes.csv").unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].gpu_model.as_deref(), Some("P100"));
        assert_eq!(nodes[1].gpu_model, None);
        let pods = parse_pod_list(PODS, "pods.csv").unwrap();
        let gpus: Vec<_> = pods.iter().map(|p| p.request.gpu.clone()).collect();
        assert_eq!(
            gpus,
            vec![
                GpuDemand::Whole { count: 1 },
                GpuDemand::Shared {
                    milli: 460,
                    memory_mib: 0
                },
                GpuDemand::Whole { count: 8 },
                GpuDemand::None
            ]
        );
        assert_eq!(
            pods[1].request.gpu_models,
            vec!["V100M16".to_string(), "V100M32".to_string()]
        );
        assert!(pods[2].request.gpu_models.is_empty());
    }

    #[test]
    fn malformed_rows_are_rejected_with_their_line_number() {
        let head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
        let cases = [
            ("p,1,1,1,500,\np,x,1,1,500,\n", 3, "cpu_milli"),
            ("p,1,1,1,500,\np,1,1,1\n", 3, "expected 6 fields"),
            ("p,1,1,0,500,\n", 2, "num_gpu is 0"),
            ("p,1,1,1,1500,\n", 2, "above 1000"),
            ("p,1,1,2,500,\n", 2, "multi-GPU"),
            ("p,1,1,1,0,\n", 2, "gpu_milli"),
            ("p,1,1,-1,0,\n", 2, "num_gpu"),
        ];
        for (rows, line, needle) in cases {
            let err = parse_pod_list(&format!("{head}{rows}"), "pods.csv").unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, Error::Malformed { line: l, .. } if l == line),
                "{msg}"
            );
            assert!(
                msg.contains(needle) && msg.starts_with(&format!("pods.csv:{line}:")),
                "{msg}"
            );
        }
        let err =
            parse_node_list("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n", "n.csv").unwrap_err();
        assert!(err.to_string().starts_with("n.csv:2:"), "{err}");
        let err =
            parse_node_list("sn,cpu,memory_mib,gpu,model\nn0,1,1,2,T4\n", "n.csv").unwrap_err();
        assert!(err.to_string().contains("no `cpu_milli` column"), "{err}");
        assert!(matches!(
            parse_node_list("sn,cpu_milli,memory_mib,gpu,model\n", "n.csv"),
            Err(Error::Empty(_))
        ));
        // The GPU-model column is optional (the multigpu lists have none).
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,1000\n";
        let pods = parse_pod_list(text, "p.csv").unwrap();
        assert_eq!(pods[0].request.gpu, GpuDemand::Whole { count: 2 });
        assert!(pods[0].request.gpu_models.is_empty());
    }
}
