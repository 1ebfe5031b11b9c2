//! The host's view of vGPU limits: what the driver says each process uses, against what the
//! agent gave each pod. The shim enforces limits inside the container, from books the
//! container can write and only in processes that load it; a tenant that rewrites its own
//! accounting file, or runs a static binary, gets past the shim but not past the driver's
//! per-process accounting. This module decides, from one sample of that accounting, which
//! pods use more of a GPU than their slices allow (pure: the agent's `vgpu_guard` task
//! samples NVML and `/proc`, and reports or kills).
//!
//! - A pod's allowance on a GPU is the sum of the memory limits of its slices there, plus
//!   a per-process tolerance for what the driver counts and the shim cannot see (each
//!   process's CUDA context, a few hundred MiB).
//! - A pod is over once its processes' sum exceeds the allowance in every sample for at
//!   least the grace period (a sample is a moment; one spike is not an attack).
//! - A process on a GPU that carries slices, which belongs to no pod holding a slice on
//!   that GPU (a host process, a pod given the device nodes some other way), is reported,
//!   never acted on.
//!
//! Pods are told apart by UID: two containers of one pod on one GPU share the pod's
//! allowance (the tenant is the same).

use std::collections::{BTreeMap, BTreeSet};

/// A pod's hold on part of one GPU (one slice, or the sum of several).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub pod_uid: String,
    /// The GPU's UUID.
    pub gpu: String,
    pub limit_bytes: u64,
}

/// One process the driver lists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu: String,
    /// The process ID in the agent's PID namespace (the host's, with `hostPID`).
    pub pid: u32,
    pub used_bytes: u64,
}

/// How strict the guard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Allowed above the limits, per process of the pod on the GPU.
    pub tolerance_per_process_bytes: u64,
    /// How long a pod must stay over before it is reported (ms).
    pub grace_ms: u64,
}

/// What one sample shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A pod's processes on `gpu` use more than its slices allow, and have since `since_ms`.
    OverLimit {
        pod_uid: String,
        gpu: String,
        used_bytes: u64,
        allowed_bytes: u64,
        limit_bytes: u64,
        /// Its processes on that GPU (the ones to stop), ascending.
        pids: Vec<u32>,
        since_ms: u64,
    },
    /// A process on a GPU with slices that no pod holding a slice there owns.
    Unattributed {
        gpu: String,
        pid: u32,
        /// The pod it runs in, when it runs in one.
        pod_uid: Option<String>,
        used_bytes: u64,
    },
}

/// Remembers since when each (pod, GPU) has been over, across samples.
#[derive(Debug, Default)]
pub struct Guard {
    over_since: BTreeMap<(String, String), u64>,
}

#[derive(Default)]
struct PodOnGpu {
    used: u64,
    pids: Vec<u32>,
}

impl Guard {
    pub fn new() -> Guard {
        Guard::default()
    }

    /// One sample at `now_ms`: the holdings in force, the driver's processes, and the pod
    /// each PID runs in (`None`: not in a pod, or gone).
    pub fn observe(
        &mut self,
        now_ms: u64,
        holdings: &[Holding],
        processes: &[GpuProcess],
        pod_of: &dyn Fn(u32) -> Option<String>,
        settings: Settings,
    ) -> Vec<Finding> {
        let mut limits: BTreeMap<(String, String), u64> = BTreeMap::new();
        for h in holdings {
            let e = limits
                .entry((h.pod_uid.clone(), h.gpu.clone()))
                .or_default();
            *e = e.saturating_add(h.limit_bytes);
        }
        let guarded: BTreeSet<&str> = holdings.iter().map(|h| h.gpu.as_str()).collect();
        let mut findings = Vec::new();
        let mut usage: BTreeMap<(String, String), PodOnGpu> = BTreeMap::new();
        for p in processes
            .iter()
            .filter(|p| guarded.contains(p.gpu.as_str()))
        {
            let pod = pod_of(p.pid);
            match pod {
                Some(uid) if limits.contains_key(&(uid.clone(), p.gpu.clone())) => {
                    let e = usage.entry((uid, p.gpu.clone())).or_default();
                    e.used = e.used.saturating_add(p.used_bytes);
                    e.pids.push(p.pid);
                }
                pod_uid => findings.push(Finding::Unattributed {
                    gpu: p.gpu.clone(),
                    pid: p.pid,
                    pod_uid,
                    used_bytes: p.used_bytes,
                }),
            }
        }
        let mut still_over = BTreeMap::new();
        for (key, mut on_gpu) in usage {
            let limit = limits.get(&key).copied().unwrap_or_default();
            let slack = settings
                .tolerance_per_process_bytes
                .saturating_mul(on_gpu.pids.len() as u64);
            let allowed = limit.saturating_add(slack);
            if on_gpu.used <= allowed {
                continue;
            }
            let since = self.over_since.get(&key).copied().unwrap_or(now_ms);
            still_over.insert(key.clone(), since);
            if now_ms.saturating_sub(since) < settings.grace_ms {
                continue;
            }
            on_gpu.pids.sort_unstable();
            on_gpu.pids.dedup();
            findings.push(Finding::OverLimit {
                pod_uid: key.0,
                gpu: key.1,
                used_bytes: on_gpu.used,
                allowed_bytes: allowed,
                limit_bytes: limit,
                pids: on_gpu.pids,
                since_ms: since,
            });
        }
        self.over_since = still_over;
        findings
    }
}

/// The UID of the pod a process runs in, from its `/proc/<pid>/cgroup`: the kubelet's
/// cgroup paths name it, with the systemd driver as
/// `kubepods-burstable-pod<uid with _>.slice` and with the cgroupfs driver as
/// `/kubepods/burstable/pod<uid>/`. Cgroup v1 and v2 alike; `None` for a process in no
/// pod or a text that names no well-formed UID.
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for line in text.lines() {
        // hierarchy-ID:controller-list:path; the path may itself contain ':'.
        let path = line.splitn(3, ':').nth(2).unwrap_or_default();
        if !path.contains("kubepods") {
            continue;
        }
        for segment in path.split('/') {
            if let Some(uid) = pod_segment_uid(segment) {
                return Some(uid);
            }
        }
    }
    None
}

fn pod_segment_uid(segment: &str) -> Option<String> {
    let at = segment.rfind("pod")?;
    let rest = &segment[at + 3..];
    let raw = rest.strip_suffix(".slice").unwrap_or(rest);
    let uid = raw.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UID as the API server writes it: 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const UID_A: &str = "0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6b";
    const UID_B: &str = "7d1e2f3a-4b5c-4d6e-9f0a-1b2c3d4e5f6a";

    fn hold(pod: &str, gpu: &str, gib: u64) -> Holding {
        Holding {
            pod_uid: pod.into(),
            gpu: gpu.into(),
            limit_bytes: gib * GIB,
        }
    }

    fn proc(gpu: &str, pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            gpu: gpu.into(),
            pid,
            used_bytes: used,
        }
    }

    fn pods(pid: u32) -> Option<String> {
        match pid {
            100..=199 => Some(UID_A.into()),
            200..=299 => Some(UID_B.into()),
            _ => None,
        }
    }

    const STRICT: Settings = Settings {
        tolerance_per_process_bytes: 512 * MIB,
        grace_ms: 0,
    };

    #[test]
    fn a_pod_within_its_slice_plus_context_tolerance_is_fine() {
        let mut g = Guard::new();
        let found = g.observe(
            0,
            &[hold(UID_A, "GPU-0", 16)],
            &[
                proc("GPU-0", 100, 8 * GIB),
                proc("GPU-0", 101, 8 * GIB + 500 * MIB),
            ],
            &pods,
            STRICT,
        );
        assert_eq!(found, vec![]);
    }

    #[test]
    fn an_undercounting_pod_is_found_with_all_its_processes_on_that_gpu() {
        // The attack of issue 17: two processes of a 16 GiB slice got 16 + 16 GiB.
        let mut g = Guard::new();
        let found = g.observe(
            0,
            &[hold(UID_A, "GPU-0", 16), hold(UID_B, "GPU-0", 16)],
            &[
                proc("GPU-0", 101, 16 * GIB),
                proc("GPU-0", 100, 16 * GIB),
                proc("GPU-0", 200, 4 * GIB),
            ],
            &pods,
            STRICT,
        );
        assert_eq!(
            found,
            vec![Finding::OverLimit {
                pod_uid: UID_A.into(),
                gpu: "GPU-0".into(),
                used_bytes: 32 * GIB,
                allowed_bytes: 17 * GIB,
                limit_bytes: 16 * GIB,
                pids: vec![100, 101],
                since_ms: 0,
            }]
        );
    }

    #[test]
    fn limits_are_per_gpu_and_slices_of_one_pod_add_up() {
        let mut g = Guard::new();
        let holdings = [
            hold(UID_A, "GPU-0", 8),
            hold(UID_A, "GPU-0", 8),
            hold(UID_A, "GPU-1", 4),
        ];
        let fine = g.observe(0, &holdings, &[proc("GPU-0", 100, 16 * GIB)], &pods, STRICT);
        assert_eq!(fine, vec![]);
        // 16 GiB on GPU-1, where the pod holds 4: over there, whatever it holds elsewhere.
        let over = g.observe(1, &holdings, &[proc("GPU-1", 100, 16 * GIB)], &pods, STRICT);
        assert!(matches!(&over[..], [Finding::OverLimit { gpu, .. }] if gpu == "GPU-1"));
    }

    #[test]
    fn the_grace_period_needs_every_sample_over() {
        let settings = Settings {
            grace_ms: 10_000,
            ..STRICT
        };
        let holdings = [hold(UID_A, "GPU-0", 1)];
        let over = [proc("GPU-0", 100, 4 * GIB)];
        let under = [proc("GPU-0", 100, GIB / 2)];
        let mut g = Guard::new();
        assert_eq!(g.observe(0, &holdings, &over, &pods, settings), vec![]);
        assert_eq!(g.observe(9_999, &holdings, &over, &pods, settings), vec![]);
        // Back under once: the clock starts again.
        assert_eq!(
            g.observe(10_000, &holdings, &under, &pods, settings),
            vec![]
        );
        assert_eq!(g.observe(15_000, &holdings, &over, &pods, settings), vec![]);
        let found = g.observe(25_000, &holdings, &over, &pods, settings);
        assert!(
            matches!(
                &found[..],
                [Finding::OverLimit {
                    since_ms: 15_000,
                    ..
                }]
            ),
            "{found:?}"
        );
    }

    #[test]
    fn processes_of_no_slice_holder_are_reported_not_charged() {
        let mut g = Guard::new();
        let found = g.observe(
            0,
            &[hold(UID_A, "GPU-0", 16)],
            &[
                proc("GPU-0", 7, GIB),        // a host process
                proc("GPU-0", 200, 2 * GIB),  // pod B holds nothing on GPU-0
                proc("GPU-9", 300, 80 * GIB), // a GPU without slices: not guarded
            ],
            &pods,
            STRICT,
        );
        assert_eq!(
            found,
            vec![
                Finding::Unattributed {
                    gpu: "GPU-0".into(),
                    pid: 7,
                    pod_uid: None,
                    used_bytes: GIB
                },
                Finding::Unattributed {
                    gpu: "GPU-0".into(),
                    pid: 200,
                    pod_uid: Some(UID_B.into()),
                    used_bytes: 2 * GIB
                },
            ]
        );
    }

    #[test]
    fn huge_numbers_saturate_instead_of_wrapping() {
        let mut g = Guard::new();
        let holdings = [Holding {
            pod_uid: UID_A.into(),
            gpu: "GPU-0".into(),
            limit_bytes: u64::MAX,
        }];
        let found = g.observe(
            0,
            &holdings,
            &[proc("GPU-0", 100, u64::MAX), proc("GPU-0", 101, u64::MAX)],
            &pods,
            STRICT,
        );
        assert_eq!(found, vec![]);
    }

    #[test]
    fn pod_uids_come_from_systemd_and_cgroupfs_paths() {
        let v2_systemd = "0::/kubepods.slice/kubepods-burstable.slice/\
            kubepods-burstable-pod0b8f6c1e_2a3d_4f5e_8a9b_1c2d3e4f5a6b.slice/\
            cri-containerd-4a5b6c.scope\n";
        assert_eq!(pod_uid_from_cgroup(v2_systemd).as_deref(), Some(UID_A));
        let guaranteed = "0::/kubepods.slice/kubepods-pod7d1e2f3a_4b5c_4d6e_9f0a_1b2c3d4e5f6a.slice/cri-containerd-x.scope";
        assert_eq!(pod_uid_from_cgroup(guaranteed).as_deref(), Some(UID_B));
        let v1_cgroupfs = "12:pids:/user.slice\n\
            11:memory:/kubepods/besteffort/pod7d1e2f3a-4b5c-4d6e-9f0a-1b2c3d4e5f6a/abcdef\n";
        assert_eq!(pod_uid_from_cgroup(v1_cgroupfs).as_deref(), Some(UID_B));
    }

    #[test]
    fn processes_outside_pods_and_malformed_text_have_no_pod() {
        for text in [
            "0::/system.slice/containerd.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope",
            "",
            "garbage",
            "0::/kubepods.slice/kubepods-burstable-podnot-a-uid.slice",
            "0::/kubepods/burstable/pod0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6/c", // 11 digits
            "0::/kubepods/burstable/pod0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6bb/c",
        ] {
            assert_eq!(pod_uid_from_cgroup(text), None, "{text:?}");
        }
    }
}
