//! One pod against many nodes: which nodes fit (with the assignment), one reason for
//! each node that does not, and a summary reason when none fits (the pod's pending
//! message). Ranking the nodes that fit is the placement engine's
//! (`controller::extender::engine`).

use super::books::{describe_models, Assignment, NodeBooks, Refusal, ShortKind, Shortfall};
use super::request::PodRequest;
use std::collections::BTreeMap;

/// A node the pod fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFit {
    /// The node.
    pub node: String,
    /// The books' version the assignment was fitted against (for `reserve`).
    pub version: u64,
    /// Where the pod's vGPUs would go.
    pub assignment: Assignment,
}

/// The answer for one pod over many nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterOutcome {
    /// Nodes that fit, in the order given.
    pub fits: Vec<NodeFit>,
    /// Nodes that do not, with why.
    pub rejected: BTreeMap<String, Shortfall>,
}

/// Fits the pod on every node.
pub fn filter<'a>(
    nodes: impl IntoIterator<Item = &'a NodeBooks>,
    pod_uid: &str,
    request: &PodRequest,
) -> FilterOutcome {
    let mut outcome = FilterOutcome::default();
    for books in nodes {
        match books.fit(pod_uid, request) {
            Ok(assignment) => outcome.fits.push(NodeFit {
                node: books.node().to_string(),
                version: books.version(),
                assignment,
            }),
            Err(shortfall) => {
                outcome
                    .rejected
                    .insert(books.node().to_string(), *shortfall);
            }
        }
    }
    outcome
}

impl FilterOutcome {
    /// Each rejected node's reason, as text.
    pub fn reasons(&self) -> BTreeMap<String, String> {
        self.rejected
            .iter()
            .map(|(node, s)| (node.clone(), s.to_string()))
            .collect()
    }

    /// Why the pod fits nowhere; `None` when some node fits.
    pub fn summary(&self, request: &PodRequest) -> Option<String> {
        if !self.fits.is_empty() {
            return None;
        }
        if self.rejected.is_empty() {
            return Some("no node has GPUs for vGPUs".to_string());
        }
        let most_gpus = self.rejected.values().map(|s| s.total_gpus).max();
        let widest = request.containers.iter().max_by_key(|c| c.count);
        if let (Some(most), Some(c)) = (most_gpus, widest) {
            if c.count > most {
                return Some(format!(
                    "container {:?} asks for {} vGPUs, each on its own GPU, \
                     and no node has more than {most} GPUs",
                    c.name, c.count
                ));
            }
        }
        let mut groups: BTreeMap<(ShortKind, &str), Vec<&Shortfall>> = BTreeMap::new();
        for s in self.rejected.values() {
            groups
                .entry((s.kind, s.container.name.as_str()))
                .or_default()
                .push(s);
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|((kind, _), shortfalls)| group_reason(kind, &shortfalls))
            .collect();
        Some(format!(
            "no node of {} fits: {}",
            self.rejected.len(),
            parts.join("; ")
        ))
    }
}

/// One sentence for nodes short of the same thing for the same container.
fn group_reason(kind: ShortKind, shortfalls: &[&Shortfall]) -> String {
    let first = shortfalls[0];
    let mut models = BTreeMap::new();
    for s in shortfalls {
        for (model, n) in &s.models {
            *models.entry(model.clone()).or_insert(0) += n;
        }
    }
    let gpus = describe_models(&models);
    match kind {
        ShortKind::Refused(Refusal::Memory) => {
            let best = shortfalls
                .iter()
                .max_by_key(|s| (s.largest_free_mib, std::cmp::Reverse(&s.node)))
                .unwrap_or(&first);
            format!(
                "no GPU with {} free among {gpus}; largest free {} MiB on {}",
                first.container.memory, best.largest_free_mib, best.node
            )
        }
        ShortKind::Refused(Refusal::Cores) => {
            let best = shortfalls
                .iter()
                .max_by_key(|s| (s.most_free_cores, std::cmp::Reverse(&s.node)))
                .unwrap_or(&first);
            format!(
                "no GPU with {}% cores free among {gpus}; most free {}% on {}",
                first.container.cores, best.most_free_cores, best.node
            )
        }
        _ if shortfalls.len() == 1 => first.to_string(),
        _ => format!("{first} (and {} more nodes alike)", shortfalls.len() - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::books::GpuRecord;
    use crate::vgpu::request::{ContainerKind, ContainerRequest, MemoryRequest, Selectors};

    fn request(count: u32, memory_mib: u64, cores: u32) -> PodRequest {
        PodRequest {
            containers: vec![ContainerRequest {
                name: "main".into(),
                kind: ContainerKind::App,
                count,
                memory: MemoryRequest::Mib(memory_mib),
                cores,
            }],
            selectors: Selectors::default(),
            gpu_policy: None,
            node_policy: None,
        }
    }

    /// A node of `n` 40 GiB A100s, each with `used_mib` already booked.
    fn node(name: &str, n: usize, used_mib: u64) -> NodeBooks {
        let gpus = (0..n)
            .map(|i| GpuRecord::new(&format!("{name}-gpu{i}"), "A100", 40_960))
            .collect();
        let mut books = NodeBooks::new(name, gpus);
        if used_mib > 0 {
            for i in 0..n {
                let filler = request(1, used_mib, 0);
                let uid = format!("filler-{i}");
                let assignment = books.fit(&uid, &filler).expect("filler fits");
                books.reserve(books.version(), assignment).expect("reserve");
            }
        }
        books
    }

    #[test]
    fn the_pending_reason_names_what_was_short_and_where_the_most_is() {
        let nodes = [
            node("node-1", 4, 36_000),
            node("node-2", 4, 39_000),
            node("node-3", 4, 32_768),
        ];
        let want = request(1, 10_240, 30);
        let outcome = filter(&nodes, "pod", &want);
        assert!(outcome.fits.is_empty());
        assert_eq!(outcome.rejected.len(), 3);
        assert_eq!(
            outcome.summary(&want).as_deref(),
            Some(
                "no node of 3 fits: no GPU with 10240 MiB free among 12 A100s; \
                 largest free 8192 MiB on node-3"
            )
        );
    }

    #[test]
    fn the_issue_pod_from_spec_to_booking() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "infer", "uid": "uid-1", "annotations": {
                "nvidia.com/use-gputype": "A100,H100",
                "hami.io/gpu-scheduler-policy": "binpack"}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                "nvidia.com/gpucores": "30"}}}]}
        }))
        .expect("a Pod");
        let request = crate::vgpu::pod_request(&pod, &Default::default())
            .expect("valid")
            .expect("asks for vGPUs");
        let l4 = NodeBooks::new("l4-node", vec![GpuRecord::new("l4", "NVIDIA L4", 23_034)]);
        let h100 = NodeBooks::new(
            "h100-node",
            vec![GpuRecord::new("h0", "NVIDIA H100 80GB HBM3", 81_559)],
        );
        let mut nodes = [l4, h100];
        let outcome = filter(&nodes, "uid-1", &request);
        assert_eq!(
            outcome.reasons()["l4-node"],
            "l4-node: none of its 1 GPUs is allowed by the pod's GPU annotations"
        );
        let [fit] = outcome.fits.as_slice() else {
            panic!("one node fits: {outcome:?}");
        };
        assert_eq!(fit.node, "h100-node");
        let grant = &fit.assignment.containers[0].grants[0];
        assert_eq!(
            (grant.uuid.as_str(), grant.memory_mib, grant.cores),
            ("h0", 10_240, 30)
        );
        let books = &mut nodes[1];
        assert_eq!(
            books.reserve(fit.version, fit.assignment.clone()),
            Ok(fit.version + 1)
        );
        let (_, used) = books.gpus().next().expect("one GPU");
        assert_eq!((used.memory_mib, used.cores, used.vgpus), (10_240, 30, 1));
    }

    #[test]
    fn more_vgpus_than_any_node_has_gpus_is_said_plainly() {
        let nodes = [node("a", 4, 0), node("b", 8, 0)];
        let want = request(9, 1_024, 0);
        let summary = filter(&nodes, "pod", &want)
            .summary(&want)
            .expect("none fit");
        assert_eq!(
            summary,
            "container \"main\" asks for 9 vGPUs, each on its own GPU, \
             and no node has more than 8 GPUs"
        );
    }

    #[test]
    fn mixed_reasons_are_listed_per_kind() {
        let sick = NodeBooks::new(
            "sick",
            vec![GpuRecord::new("s0", "A100", 40_960).unhealthy()],
        );
        let nodes = [sick, node("full", 1, 40_000)];
        let want = request(1, 10_240, 0);
        let outcome = filter(&nodes, "pod", &want);
        assert_eq!(outcome.reasons()["sick"], "sick: all 1 GPUs unhealthy");
        let summary = outcome.summary(&want).expect("none fit");
        assert!(summary.contains("sick: all 1 GPUs unhealthy"), "{summary}");
        assert!(
            summary
                .contains("no GPU with 10240 MiB free among 1 A100; largest free 960 MiB on full"),
            "{summary}"
        );
    }
}
