//! Per-node books of vGPU use: each GPU's record (what it is) and usage (what is booked
//! on it), and the assignments (pod UID → container → grants) that make up the usage.
//!
//! There is no node lock. Each node's books carry a version that every change bumps. A
//! scheduler takes a copy, runs [`NodeBooks::fit`] on it with no lock held, then calls
//! [`NodeBooks::reserve`] on the shared books with the version it fitted against; if
//! another bind changed the node meanwhile the reserve fails with
//! [`BooksError::Conflict`] and the caller fits again. `reserve` also re-checks every
//! grant against the capacity, so even a caller that ignores versions cannot overcommit.
//!
//! ```text
//! scheduler A            books(node, v7)            scheduler B
//!   copy (v7) ------------->|<------------- copy (v7)
//!   fit                     |               fit
//!   reserve(v7) ----------->| v8
//!                           |<------------- reserve(v7): Conflict(v8) → fit again
//! ```

use super::request::{ContainerRequest, PodRequest, Selectors};
use std::collections::BTreeMap;
use std::fmt;

/// One GPU as the node describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuRecord {
    /// The GPU's UUID.
    pub uuid: String,
    /// Model name (`NVIDIA A100-SXM4-80GB`); `use-gputype` matches substrings of it.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors, when known (cores are booked in % of them).
    pub sm_count: Option<u32>,
    /// vGPUs the GPU may hold at once (the layout's split count).
    pub slots: u32,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// Whether the GPU may take new vGPUs.
    pub healthy: bool,
}

impl GpuRecord {
    /// A healthy GPU with HAMi's default split of 10.
    pub fn new(uuid: &str, model: &str, memory_mib: u64) -> Self {
        GpuRecord {
            uuid: uuid.to_string(),
            model: model.to_string(),
            memory_mib,
            sm_count: None,
            slots: 10,
            numa: None,
            healthy: true,
        }
    }

    /// The same GPU split `slots` ways.
    pub fn with_slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// The same GPU, unhealthy.
    pub fn unhealthy(mut self) -> Self {
        self.healthy = false;
        self
    }
}

/// Cores of a whole GPU, in %.
pub const WHOLE_GPU_CORES: u32 = 100;

/// What is booked on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Memory booked, MiB.
    pub memory_mib: u64,
    /// Cores booked, % of the SMs.
    pub cores: u32,
    /// vGPUs booked (slots used).
    pub vgpus: u32,
    /// Held by one exclusive vGPU (`gpucores: 100`).
    pub exclusive: bool,
}

/// One vGPU given to a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The GPU it lives on.
    pub uuid: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Cores, % of the SMs.
    pub cores: u32,
}

impl Grant {
    /// `gpucores: 100`: the GPU holds nothing else.
    pub fn exclusive(&self) -> bool {
        self.cores == WHOLE_GPU_CORES
    }
}

/// One container's vGPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerAssignment {
    /// The container's name.
    pub container: String,
    /// Its vGPUs, on distinct GPUs.
    pub grants: Vec<Grant>,
}

/// Everything a pod holds on one node: the record written on the pod at bind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The pod's UID.
    pub pod_uid: String,
    /// The node.
    pub node: String,
    /// Per container, in the pod request's order.
    pub containers: Vec<ContainerAssignment>,
}

impl Assignment {
    fn grants(&self) -> impl Iterator<Item = (&str, &Grant)> {
        self.containers
            .iter()
            .flat_map(|c| c.grants.iter().map(move |g| (c.container.as_str(), g)))
    }
}

/// Why a GPU cannot take one more vGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// The GPU is unhealthy.
    Unhealthy,
    /// The pod's annotations exclude it.
    NotAllowed,
    /// All its slots are booked.
    SlotsFull,
    /// An exclusive vGPU holds it, or its cores are all booked and the request has none.
    Taken,
    /// The request is exclusive and the GPU already holds a vGPU.
    NotIdle,
    /// Too little free memory.
    Memory,
    /// Too few free cores.
    Cores,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Unhealthy => "unhealthy",
            Refusal::NotAllowed => "not allowed by the pod's annotations",
            Refusal::SlotsFull => "all vGPU slots booked",
            Refusal::Taken => "held exclusively or all cores booked",
            Refusal::NotIdle => "not idle, and the request is exclusive",
            Refusal::Memory => "too little free memory",
            Refusal::Cores => "too few free cores",
        })
    }
}

/// An error changing the books.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BooksError {
    /// The books changed since the caller fitted: fit again.
    #[error("{node}: books changed (fitted against version {expected}, now {current}); fit again")]
    Conflict {
        node: String,
        expected: u64,
        current: u64,
    },
    /// The assignment is for another node.
    #[error("{node}: assignment of pod {pod_uid} is for node {assigned}")]
    WrongNode {
        node: String,
        pod_uid: String,
        assigned: String,
    },
    /// The pod already holds an assignment here.
    #[error("{node}: pod {pod_uid} already has an assignment; not booked twice")]
    AlreadyBooked { node: String, pod_uid: String },
    /// A grant names a GPU the node does not have.
    #[error("{node}: pod {pod_uid} container {container:?}: no GPU {uuid} on this node")]
    UnknownGpu {
        node: String,
        pod_uid: String,
        container: String,
        uuid: String,
    },
    /// Two of a container's vGPUs on one GPU.
    #[error("{node}: pod {pod_uid} container {container:?}: two vGPUs on GPU {uuid}")]
    SameGpuTwice {
        node: String,
        pod_uid: String,
        container: String,
        uuid: String,
    },
    /// The grant does not fit what is left on the GPU.
    #[error("{node}: pod {pod_uid} container {container:?}: GPU {uuid}: {refusal}")]
    Overcommit {
        node: String,
        pod_uid: String,
        container: String,
        uuid: String,
        refusal: Refusal,
    },
}

/// One node's GPUs, their usage and the assignments behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeBooks {
    node: String,
    version: u64,
    gpus: Vec<GpuRecord>,
    usage: Vec<GpuUsage>,
    assignments: BTreeMap<String, Assignment>,
}

impl NodeBooks {
    /// Empty books for `node`'s GPUs.
    pub fn new(node: &str, gpus: Vec<GpuRecord>) -> Self {
        let usage = vec![GpuUsage::default(); gpus.len()];
        NodeBooks {
            node: node.to_string(),
            version: 0,
            gpus,
            usage,
            assignments: BTreeMap::new(),
        }
    }

    /// Books rebuilt from the pods' recorded assignments (after a controller restart),
    /// in the order given (pass the oldest first). An assignment that is a duplicate,
    /// names an unknown GPU or would overcommit is reported and left out, never booked.
    pub fn rebuild(
        node: &str,
        gpus: Vec<GpuRecord>,
        assignments: impl IntoIterator<Item = Assignment>,
    ) -> (Self, Vec<BooksError>) {
        let mut books = NodeBooks::new(node, gpus);
        let mut problems = Vec::new();
        for assignment in assignments {
            if let Err(e) = books.book(assignment) {
                problems.push(e);
            }
        }
        (books, problems)
    }

    /// The books with the node's GPUs described anew (a health change, a GPU gone):
    /// the same assignments rebooked as [`NodeBooks::rebuild`] does, at a newer version,
    /// so a fit made against the old description fails to reserve. Assignments that no
    /// longer fit (their GPU is gone, or smaller) are reported and left out.
    pub fn with_gpus(&self, gpus: Vec<GpuRecord>) -> (Self, Vec<BooksError>) {
        let (mut books, problems) =
            NodeBooks::rebuild(&self.node, gpus, self.assignments.values().cloned());
        books.version = self.version + 1;
        (books, problems)
    }

    /// These books replaced by ones rebuilt from `gpus` and `assignments` (as
    /// [`NodeBooks::rebuild`]), at a newer version than these, so a fit made against
    /// these fails to reserve on the new ones.
    pub fn replaced(
        &self,
        gpus: Vec<GpuRecord>,
        assignments: impl IntoIterator<Item = Assignment>,
    ) -> (Self, Vec<BooksError>) {
        let (mut books, problems) = NodeBooks::rebuild(&self.node, gpus, assignments);
        books.version = self.version.max(books.version) + 1;
        (books, problems)
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The version: bumped by every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Each GPU with its usage.
    pub fn gpus(&self) -> impl Iterator<Item = (&GpuRecord, &GpuUsage)> {
        self.gpus.iter().zip(&self.usage)
    }

    /// The assignment a pod holds here.
    pub fn assignment(&self, pod_uid: &str) -> Option<&Assignment> {
        self.assignments.get(pod_uid)
    }

    /// All assignments, by pod UID.
    pub fn assignments(&self) -> impl Iterator<Item = &Assignment> {
        self.assignments.values()
    }

    /// Where the pod's vGPUs would go: every vGPU of a container on a distinct healthy
    /// GPU the annotations allow, containers placed in order on the usage the earlier
    /// ones leave (so two containers may share a GPU, as in HAMi). GPUs are taken in
    /// index order; [`NodeBooks::fit_preferring`] takes the placement engine's first.
    pub fn fit(&self, pod_uid: &str, request: &PodRequest) -> Result<Assignment, Box<Shortfall>> {
        self.fit_preferring(pod_uid, request, &[])
    }

    /// [`NodeBooks::fit`], taking the GPUs of `prefer` (indices into [`NodeBooks::gpus`],
    /// as the placement engine chose them) first, in that order, then the others by
    /// index. The books decide only what fits; which GPUs is the engine's choice.
    pub fn fit_preferring(
        &self,
        pod_uid: &str,
        request: &PodRequest,
        prefer: &[usize],
    ) -> Result<Assignment, Box<Shortfall>> {
        let order: Vec<usize> = prefer
            .iter()
            .copied()
            .filter(|&i| i < self.gpus.len())
            .chain((0..self.gpus.len()).filter(|i| !prefer.contains(i)))
            .collect();
        let mut usage = self.usage.clone();
        let mut containers = Vec::new();
        for container in &request.containers {
            let chosen = self.fit_container(&usage, container, request, &order)?;
            let mut grants = Vec::new();
            for index in chosen {
                let grant = Grant {
                    uuid: self.gpus[index].uuid.clone(),
                    memory_mib: container.memory.mib_on(self.gpus[index].memory_mib),
                    cores: container.cores,
                };
                add(&mut usage[index], &grant);
                grants.push(grant);
            }
            containers.push(ContainerAssignment {
                container: container.name.clone(),
                grants,
            });
        }
        Ok(Assignment {
            pod_uid: pod_uid.to_string(),
            node: self.node.clone(),
            containers,
        })
    }

    /// Books `assignment` if the books are still at `expected_version`; returns the new
    /// version.
    pub fn reserve(
        &mut self,
        expected_version: u64,
        assignment: Assignment,
    ) -> Result<u64, BooksError> {
        if expected_version != self.version {
            return Err(BooksError::Conflict {
                node: self.node.clone(),
                expected: expected_version,
                current: self.version,
            });
        }
        self.book(assignment)?;
        Ok(self.version)
    }

    /// Frees what the pod holds here; `None` when it holds nothing.
    pub fn release(&mut self, pod_uid: &str) -> Option<Assignment> {
        let assignment = self.assignments.remove(pod_uid)?;
        for (_, grant) in assignment.grants() {
            if let Some(index) = self.index_of(&grant.uuid) {
                remove(&mut self.usage[index], grant);
            }
        }
        self.version += 1;
        Some(assignment)
    }

    /// Checks `assignment` against the capacity and books it, all or nothing.
    fn book(&mut self, assignment: Assignment) -> Result<(), BooksError> {
        let pod_uid = assignment.pod_uid.clone();
        if assignment.node != self.node {
            return Err(BooksError::WrongNode {
                node: self.node.clone(),
                pod_uid,
                assigned: assignment.node,
            });
        }
        if self.assignments.contains_key(&pod_uid) {
            return Err(BooksError::AlreadyBooked {
                node: self.node.clone(),
                pod_uid,
            });
        }
        let mut usage = self.usage.clone();
        for container in &assignment.containers {
            let mut seen: Vec<&str> = Vec::new();
            for grant in &container.grants {
                let (node, uuid) = (self.node.clone(), grant.uuid.clone());
                let name = container.container.clone();
                if seen.contains(&grant.uuid.as_str()) {
                    return Err(BooksError::SameGpuTwice {
                        node,
                        pod_uid,
                        container: name,
                        uuid,
                    });
                }
                seen.push(&grant.uuid);
                let Some(index) = self.index_of(&grant.uuid) else {
                    return Err(BooksError::UnknownGpu {
                        node,
                        pod_uid,
                        container: name,
                        uuid,
                    });
                };
                let (memory_mib, cores) = (grant.memory_mib, grant.cores);
                if let Err(refusal) = room_for(&self.gpus[index], &usage[index], memory_mib, cores)
                {
                    return Err(BooksError::Overcommit {
                        node,
                        pod_uid,
                        container: name,
                        uuid,
                        refusal,
                    });
                }
                add(&mut usage[index], grant);
            }
        }
        self.usage = usage;
        self.assignments.insert(pod_uid, assignment);
        self.version += 1;
        Ok(())
    }

    fn index_of(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    /// The GPUs one container's vGPUs go to: the first of `order` that take one.
    fn fit_container(
        &self,
        usage: &[GpuUsage],
        container: &ContainerRequest,
        request: &PodRequest,
        order: &[usize],
    ) -> Result<Vec<usize>, Box<Shortfall>> {
        let mut fitting = Vec::new();
        let mut refusals = Vec::new();
        for &index in order {
            match admits(
                &self.gpus[index],
                &usage[index],
                container,
                &request.selectors,
            ) {
                Ok(()) => fitting.push(index),
                Err(refusal) => refusals.push((index, refusal)),
            }
        }
        let want = container.count as usize;
        if fitting.len() < want {
            return Err(Box::new(
                self.shortfall(usage, container, &fitting, &refusals),
            ));
        }
        fitting.truncate(want);
        Ok(fitting)
    }

    fn shortfall(
        &self,
        usage: &[GpuUsage],
        container: &ContainerRequest,
        fitting: &[usize],
        refusals: &[(usize, Refusal)],
    ) -> Shortfall {
        // The GPUs the pod could use at all: healthy and allowed.
        let usable = |r: &Refusal| !matches!(r, Refusal::Unhealthy | Refusal::NotAllowed);
        let considered: Vec<usize> = refusals
            .iter()
            .filter(|(_, r)| usable(r))
            .map(|(i, _)| *i)
            .chain(fitting.iter().copied())
            .collect();
        let found = fitting.len();
        let kind = if found > 0 {
            ShortKind::TooFew
        } else if self.gpus.is_empty() {
            ShortKind::NoGpus
        } else if refusals.iter().all(|(_, r)| *r == Refusal::Unhealthy) {
            ShortKind::Refused(Refusal::Unhealthy)
        } else if considered.is_empty() {
            ShortKind::Refused(Refusal::NotAllowed)
        } else {
            ShortKind::Refused(most_common(refusals.iter().map(|(_, r)| *r).filter(usable)))
        };
        let mut models = BTreeMap::new();
        for &i in &considered {
            *models.entry(self.gpus[i].model.clone()).or_insert(0u32) += 1;
        }
        Shortfall {
            node: self.node.clone(),
            container: container.clone(),
            found: found as u32,
            kind,
            models,
            largest_free_mib: considered
                .iter()
                .map(|&i| self.gpus[i].memory_mib.saturating_sub(usage[i].memory_mib))
                .max()
                .unwrap_or(0),
            most_free_cores: considered
                .iter()
                .map(|&i| WHOLE_GPU_CORES.saturating_sub(usage[i].cores))
                .max()
                .unwrap_or(0),
            total_gpus: self.gpus.len() as u32,
        }
    }
}

/// The refusal seen most often (the first in [`Refusal`]'s order among equals).
fn most_common(refusals: impl Iterator<Item = Refusal>) -> Refusal {
    let mut counts: BTreeMap<Refusal, usize> = BTreeMap::new();
    for r in refusals {
        *counts.entry(r).or_default() += 1;
    }
    let mut best = (Refusal::Memory, 0);
    for (refusal, count) in counts {
        if count > best.1 {
            best = (refusal, count);
        }
    }
    best.0
}

/// Whether `gpu`, with `used` booked, takes one vGPU of `container` for a pod with
/// `selectors` (HAMi's checks, in HAMi's order where it matters for the reason).
fn admits(
    gpu: &GpuRecord,
    used: &GpuUsage,
    container: &ContainerRequest,
    selectors: &Selectors,
) -> Result<(), Refusal> {
    if !gpu.healthy {
        return Err(Refusal::Unhealthy);
    }
    if !selectors.allows(&gpu.uuid, &gpu.model) {
        return Err(Refusal::NotAllowed);
    }
    if container.cores == 0 && used.cores >= WHOLE_GPU_CORES {
        return Err(Refusal::Taken);
    }
    room_for(
        gpu,
        used,
        container.memory.mib_on(gpu.memory_mib),
        container.cores,
    )
}

/// Whether a vGPU of `memory_mib` and `cores` fits what is left on `gpu`: the capacity
/// check every booking passes.
fn room_for(gpu: &GpuRecord, used: &GpuUsage, memory_mib: u64, cores: u32) -> Result<(), Refusal> {
    if used.vgpus >= gpu.slots {
        Err(Refusal::SlotsFull)
    } else if used.exclusive {
        Err(Refusal::Taken)
    } else if cores == WHOLE_GPU_CORES && used.vgpus > 0 {
        Err(Refusal::NotIdle)
    } else if gpu.memory_mib.saturating_sub(used.memory_mib) < memory_mib {
        Err(Refusal::Memory)
    } else if WHOLE_GPU_CORES.saturating_sub(used.cores) < cores {
        Err(Refusal::Cores)
    } else {
        Ok(())
    }
}

fn add(used: &mut GpuUsage, grant: &Grant) {
    used.memory_mib += grant.memory_mib;
    used.cores += grant.cores;
    used.vgpus += 1;
    used.exclusive |= grant.exclusive();
}

fn remove(used: &mut GpuUsage, grant: &Grant) {
    used.memory_mib = used.memory_mib.saturating_sub(grant.memory_mib);
    used.cores = used.cores.saturating_sub(grant.cores);
    used.vgpus = used.vgpus.saturating_sub(1);
    if grant.exclusive() {
        used.exclusive = false;
    }
}

/// What kind of shortage kept a container off a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ShortKind {
    /// The node has no GPUs for vGPUs.
    NoGpus,
    /// Every usable GPU refused for this reason (the most common one).
    Refused(Refusal),
    /// Some GPUs fit, fewer than the container's vGPU count.
    TooFew,
}

/// Why a pod does not fit a node, in words a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// The node.
    pub node: String,
    /// The first container that did not fit.
    pub container: ContainerRequest,
    /// GPUs that would take one of its vGPUs.
    pub found: u32,
    /// What was short.
    pub kind: ShortKind,
    /// The GPUs the pod could use at all (healthy, allowed), by model.
    pub models: BTreeMap<String, u32>,
    /// Largest free memory among those GPUs, MiB.
    pub largest_free_mib: u64,
    /// Most free cores among those GPUs, %.
    pub most_free_cores: u32,
    /// All GPUs of the node.
    pub total_gpus: u32,
}

/// `12 A100s`, `4 A100s and 1 H100`.
pub fn describe_models(models: &BTreeMap<String, u32>) -> String {
    let parts: Vec<String> = models
        .iter()
        .map(|(model, n)| match n {
            1 => format!("1 {model}"),
            n => format!("{n} {model}s"),
        })
        .collect();
    match parts.len() {
        0 => "no GPUs".to_string(),
        1 => parts[0].clone(),
        n => format!("{} and {}", parts[..n - 1].join(", "), parts[n - 1]),
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.container;
        let gpus = describe_models(&self.models);
        let node = &self.node;
        match self.kind {
            ShortKind::NoGpus => write!(f, "{node}: no GPUs for vGPUs"),
            ShortKind::Refused(Refusal::Unhealthy) => {
                write!(f, "{node}: all {} GPUs unhealthy", self.total_gpus)
            }
            ShortKind::Refused(Refusal::NotAllowed) => write!(
                f,
                "{node}: none of its {} GPUs is allowed by the pod's GPU annotations",
                self.total_gpus
            ),
            ShortKind::Refused(Refusal::Memory) => write!(
                f,
                "no GPU with {} free among {gpus}; largest free {} MiB on {node}",
                c.memory, self.largest_free_mib
            ),
            ShortKind::Refused(Refusal::Cores) => write!(
                f,
                "no GPU with {}% cores free among {gpus}; most free {}% on {node}",
                c.cores, self.most_free_cores
            ),
            ShortKind::Refused(Refusal::SlotsFull) => {
                write!(f, "every vGPU slot booked on {gpus} on {node}")
            }
            ShortKind::Refused(Refusal::Taken) => write!(
                f,
                "{gpus} on {node} held exclusively or with all cores booked"
            ),
            ShortKind::Refused(Refusal::NotIdle) => write!(
                f,
                "no idle GPU for exclusive use (gpucores 100) among {gpus} on {node}"
            ),
            ShortKind::TooFew => write!(
                f,
                "container {:?} needs {} GPUs with {} and {}% cores free; \
                 {} of {gpus} on {node} have it",
                c.name, c.count, c.memory, c.cores, self.found
            ),
        }
    }
}

#[cfg(test)]
#[path = "books_tests.rs"]
mod tests;
