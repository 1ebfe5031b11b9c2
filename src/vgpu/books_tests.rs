use super::*;
use crate::vgpu::request::test_requests::{container, pod};
use crate::vgpu::request::MemoryRequest;
use proptest::prelude::*;

const A100_40: u64 = 40_960;
const H100_80: u64 = 81_920;

fn one(count: u32, memory: MemoryRequest, cores: u32) -> PodRequest {
    pod(vec![container("main", count, memory, cores)])
}

fn mib(n: u64) -> MemoryRequest {
    MemoryRequest::Mib(n)
}

/// `n` 40 GiB A100s named `gpu0..`.
fn a100s(n: usize) -> Vec<GpuRecord> {
    (0..n)
        .map(|i| GpuRecord::new(&format!("gpu{i}"), "NVIDIA A100-PCIE-40GB", A100_40))
        .collect()
}

/// Fits and reserves; panics if either fails.
fn place(books: &mut NodeBooks, uid: &str, request: &PodRequest) -> Assignment {
    let assignment = books.fit(uid, request).expect("fits");
    books
        .reserve(books.version(), assignment.clone())
        .expect("reserves");
    assignment
}

fn uuids(assignment: &Assignment) -> Vec<Vec<&str>> {
    assignment
        .containers
        .iter()
        .map(|c| c.grants.iter().map(|g| g.uuid.as_str()).collect())
        .collect()
}

#[test]
fn hami_examples_fit_as_in_hami() {
    // (case, GPUs, pods placed before, the pod, its GPUs per container or the reason)
    type Case = (
        &'static str,
        Vec<GpuRecord>,
        Vec<PodRequest>,
        PodRequest,
        Result<Vec<Vec<&'static str>>, &'static str>,
    );
    let mixed = vec![
        GpuRecord::new("a0", "NVIDIA A100-PCIE-40GB", A100_40),
        GpuRecord::new("h0", "NVIDIA H100 80GB HBM3", H100_80),
    ];
    let mut h100_only = one(1, mib(1_024), 0);
    h100_only.selectors.use_types = vec!["h100".into()];
    let mut no_h100 = one(1, mib(1_024), 0);
    no_h100.selectors.nouse_types = vec!["H100".into()];
    let mut by_uuid = one(1, mib(1_024), 0);
    by_uuid.selectors.use_uuids = vec!["gpu2".into()];
    let mut no_l4 = one(1, mib(1_024), 0);
    no_l4.selectors.use_types = vec!["L4".into()];
    let cases: Vec<Case> = vec![
        (
            "the issue's pod",
            a100s(2),
            vec![],
            one(1, mib(10_240), 30),
            Ok(vec![vec!["gpu0"]]),
        ),
        (
            "only nvidia.com/gpu takes the whole memory",
            a100s(1),
            vec![one(1, MemoryRequest::Percent(100), 0)],
            one(1, mib(1), 0),
            Err("no GPU with 1 MiB free among 1 NVIDIA A100-PCIE-40GB; largest free 0 MiB on n"),
        ),
        (
            "gpumem-percentage of the GPU it lands on",
            a100s(1),
            vec![one(1, MemoryRequest::Percent(75), 0)],
            one(1, MemoryRequest::Percent(30), 0),
            Err("no GPU with 30% of the memory free among 1 NVIDIA A100-PCIE-40GB; largest free 10240 MiB on n"),
        ),
        (
            "gpucores 100 wants an idle GPU",
            a100s(2),
            vec![one(1, mib(1_024), 10)],
            one(1, mib(1_024), 100),
            Ok(vec![vec!["gpu1"]]),
        ),
        (
            "gpucores 100 with no idle GPU",
            a100s(1),
            vec![one(1, mib(1_024), 10)],
            one(1, mib(1_024), 100),
            Err("no idle GPU for exclusive use (gpucores 100) among 1 NVIDIA A100-PCIE-40GB on n"),
        ),
        (
            "an exclusive GPU takes nothing else",
            a100s(1),
            vec![one(1, mib(1_024), 100)],
            one(1, mib(1_024), 0),
            Err("1 NVIDIA A100-PCIE-40GB on n held exclusively or with all cores booked"),
        ),
        (
            "cores booked in full refuse a request without cores",
            a100s(1),
            vec![one(1, mib(1_024), 60), one(1, mib(1_024), 40)],
            one(1, mib(1_024), 0),
            Err("1 NVIDIA A100-PCIE-40GB on n held exclusively or with all cores booked"),
        ),
        (
            "cores short",
            a100s(2),
            vec![one(2, mib(1_024), 80)],
            one(1, mib(1_024), 30),
            Err("no GPU with 30% cores free among 2 NVIDIA A100-PCIE-40GBs; most free 20% on n"),
        ),
        (
            "use-gputype",
            mixed.clone(),
            vec![],
            h100_only,
            Ok(vec![vec!["h0"]]),
        ),
        ("nouse-gputype", mixed.clone(), vec![], no_h100, Ok(vec![vec!["a0"]])),
        ("use-gpuuuid", a100s(4), vec![], by_uuid, Ok(vec![vec!["gpu2"]])),
        (
            "no GPU of the asked type",
            mixed,
            vec![],
            no_l4,
            Err("n: none of its 2 GPUs is allowed by the pod's GPU annotations"),
        ),
        (
            "vGPUs of one container on distinct GPUs",
            a100s(3),
            vec![],
            one(3, mib(1_024), 0),
            Ok(vec![vec!["gpu0", "gpu1", "gpu2"]]),
        ),
        (
            "more vGPUs than GPUs that fit",
            a100s(2),
            vec![],
            one(3, mib(1_024), 0),
            Err("container \"main\" needs 3 GPUs with 1024 MiB and 0% cores free; 2 of 2 NVIDIA A100-PCIE-40GBs on n have it"),
        ),
        (
            "two containers may share a GPU",
            a100s(1),
            vec![],
            pod(vec![
                container("a", 1, mib(1_024), 10),
                container("b", 1, mib(1_024), 10),
            ]),
            Ok(vec![vec!["gpu0"], vec!["gpu0"]]),
        ),
        (
            "unhealthy GPUs are skipped",
            vec![
                GpuRecord::new("sick", "A100", A100_40).unhealthy(),
                GpuRecord::new("well", "A100", A100_40),
            ],
            vec![],
            one(1, mib(1_024), 0),
            Ok(vec![vec!["well"]]),
        ),
        (
            "all unhealthy",
            vec![GpuRecord::new("sick", "A100", A100_40).unhealthy()],
            vec![],
            one(1, mib(1_024), 0),
            Err("n: all 1 GPUs unhealthy"),
        ),
        (
            "slots are the split count",
            vec![GpuRecord::new("g", "A100", A100_40).with_slots(2)],
            vec![one(1, mib(1), 0), one(1, mib(1), 0)],
            one(1, mib(1), 0),
            Err("every vGPU slot booked on 1 A100 on n"),
        ),
        (
            "no GPUs",
            vec![],
            vec![],
            one(1, mib(1), 0),
            Err("n: no GPUs for vGPUs"),
        ),
    ];
    for (name, gpus, before, request, want) in cases {
        let mut books = NodeBooks::new("n", gpus);
        for (i, earlier) in before.iter().enumerate() {
            place(&mut books, &format!("before-{i}"), earlier);
        }
        let got = books.fit("pod", &request);
        match (&got, want) {
            (Ok(assignment), Ok(want)) => {
                assert_eq!(uuids(assignment), want, "{name}");
                assert_eq!(assignment.pod_uid, "pod");
            }
            (Err(shortfall), Err(want)) => assert_eq!(shortfall.to_string(), want, "{name}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn grants_carry_the_memory_on_the_chosen_gpu() {
    let books = NodeBooks::new("n", vec![GpuRecord::new("h0", "H100", H100_80)]);
    let got = books
        .fit("pod", &one(1, MemoryRequest::Percent(25), 30))
        .unwrap();
    assert_eq!(
        got.containers[0].grants,
        [Grant {
            uuid: "h0".into(),
            memory_mib: 20_480,
            cores: 30
        }]
    );
}

#[test]
fn preferred_gpus_are_taken_first_when_they_fit() {
    let mut books = NodeBooks::new("n", a100s(3));
    let mut on_gpu1 = one(1, mib(30_000), 0);
    on_gpu1.selectors.use_uuids = vec!["gpu1".into()];
    place(&mut books, "filler", &on_gpu1);
    // (preferred GPUs, vGPUs asked, where they go)
    let cases: [(&[usize], u32, &[&str]); 5] = [
        (&[], 1, &["gpu0"]),
        (&[2], 1, &["gpu2"]),
        (&[2, 1], 2, &["gpu2", "gpu0"]), // gpu1 has too little left
        (&[1, 0], 1, &["gpu0"]),
        (&[7, 2], 1, &["gpu2"]), // an index the node lacks is passed over
    ];
    for (prefer, count, want) in cases {
        let request = one(count, mib(20_000), 0);
        let got = books.fit_preferring("pod", &request, prefer).unwrap();
        assert_eq!(uuids(&got), [want], "{prefer:?}");
    }
}

#[test]
fn a_stale_reserve_is_a_conflict_and_books_nothing() {
    let mut books = NodeBooks::new("n", a100s(1));
    let request = one(1, mib(30_000), 0);
    let first = books.fit("a", &request).unwrap();
    let second = books.fit("b", &request).unwrap();
    let v0 = books.version();
    assert_eq!(books.reserve(v0, first), Ok(v0 + 1));
    assert_eq!(
        books.reserve(v0, second),
        Err(BooksError::Conflict {
            node: "n".into(),
            expected: v0,
            current: v0 + 1
        })
    );
    assert!(books.assignment("b").is_none());
    // Fitting again against the new version tells the truth.
    let short = books.fit("b", &request).unwrap_err();
    assert_eq!(short.largest_free_mib, A100_40 - 30_000);
}

#[test]
fn reserve_rechecks_capacity_even_at_the_right_version() {
    let mut books = NodeBooks::new("n", a100s(1));
    let grant = |memory_mib| Grant {
        uuid: "gpu0".into(),
        memory_mib,
        cores: 0,
    };
    let assignment = |uid: &str, grants: Vec<Grant>| Assignment {
        pod_uid: uid.into(),
        node: "n".into(),
        containers: vec![ContainerAssignment {
            container: "main".into(),
            grants,
        }],
    };
    let v = books.version();
    let too_big = books.reserve(v, assignment("a", vec![grant(A100_40 + 1)]));
    assert!(
        matches!(
            too_big,
            Err(BooksError::Overcommit {
                refusal: Refusal::Memory,
                ..
            })
        ),
        "{too_big:?}"
    );
    let twice = books.reserve(v, assignment("a", vec![grant(1), grant(1)]));
    assert!(
        matches!(twice, Err(BooksError::SameGpuTwice { .. })),
        "{twice:?}"
    );
    let mut elsewhere = assignment("a", vec![grant(1)]);
    elsewhere.node = "other".into();
    assert!(matches!(
        books.reserve(v, elsewhere),
        Err(BooksError::WrongNode { .. })
    ));
    assert_eq!(books.version(), v, "failed reserves change nothing");
    assert_eq!(books.reserve(v, assignment("a", vec![grant(1)])), Ok(v + 1));
    assert!(matches!(
        books.reserve(v + 1, assignment("a", vec![grant(1)])),
        Err(BooksError::AlreadyBooked { .. })
    ));
}

#[test]
fn release_frees_what_the_pod_held() {
    let mut books = NodeBooks::new("n", a100s(2));
    let empty = books.clone();
    let held = place(&mut books, "a", &one(2, mib(10_240), 100));
    let v = books.version();
    assert_eq!(books.release("a"), Some(held));
    assert_eq!(books.version(), v + 1);
    assert_eq!(books.release("a"), None);
    let usage: Vec<GpuUsage> = books.gpus().map(|(_, u)| *u).collect();
    let fresh: Vec<GpuUsage> = empty.gpus().map(|(_, u)| *u).collect();
    assert_eq!(usage, fresh);
}

#[test]
fn rebuild_books_each_assignment_once_and_reports_the_rest() {
    let mut live = NodeBooks::new("n", a100s(2));
    let a = place(&mut live, "a", &one(1, mib(30_000), 0));
    let b = place(&mut live, "b", &one(1, mib(30_000), 0));
    // A pod recorded as on gpu0 with more memory than is left there.
    let mut greedy = a.clone();
    greedy.pod_uid = "c".into();
    let mut ghost = a.clone();
    ghost.pod_uid = "d".into();
    ghost.containers[0].grants[0].uuid = "gpu9".into();
    let (rebuilt, problems) = NodeBooks::rebuild("n", a100s(2), [a.clone(), b, a, greedy, ghost]);
    assert_eq!(
        problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        [
            "n: pod a already has an assignment; not booked twice",
            "n: pod c container \"main\": GPU gpu0: too little free memory",
            "n: pod d container \"main\": no GPU gpu9 on this node",
        ]
    );
    let usage = |books: &NodeBooks| books.gpus().map(|(_, u)| *u).collect::<Vec<_>>();
    assert_eq!(usage(&rebuilt), usage(&live));
    assert_eq!(rebuilt.assignments().count(), 2);
}

#[test]
fn a_gpu_that_turns_unhealthy_keeps_its_pods_and_takes_no_more() {
    let mut books = NodeBooks::new("n", a100s(2));
    let held = place(&mut books, "a", &one(1, mib(1_024), 0));
    assert_eq!(uuids(&held), [["gpu0"]]);
    let stale = books.fit("b", &one(1, mib(1_024), 0)).unwrap();
    let before = books.version();
    let mut gpus = a100s(2);
    gpus[0].healthy = false;
    gpus[1].healthy = false;
    let (updated, problems) = books.with_gpus(gpus);
    assert_eq!(problems, []);
    assert_eq!(updated.version(), before + 1);
    assert_eq!(updated.assignment("a"), Some(&held));
    let short = updated.fit("b", &one(1, mib(1_024), 0)).unwrap_err();
    assert_eq!(short.to_string(), "n: all 2 GPUs unhealthy");
    let mut updated = updated;
    assert!(matches!(
        updated.reserve(before, stale),
        Err(BooksError::Conflict { .. })
    ));
    // A GPU gone with a pod on it: the pod's assignment is reported, not kept.
    let (shrunk, problems) = books.with_gpus(a100s(2).split_off(1));
    assert_eq!(
        problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["n: pod a container \"main\": no GPU gpu0 on this node"]
    );
    assert_eq!(shrunk.assignments().count(), 0);
}

/// The burst: 50 pods of mixed sizes bound at once to one 8-GPU node by 8
/// schedulers that fit on a copy with no lock held and reserve with the version they
/// fitted against, fitting again on a conflict.
#[test]
fn concurrent_binds_with_optimistic_reserves_never_overcommit() {
    use std::sync::{Barrier, Mutex};
    // 16 slots per GPU so that every order of binds has room: the 50 pods take 75 of the
    // 128 slots, 370 of the 800 cores and 197 of the 640 GiB, so however they are packed
    // at least two GPUs have a slot, 10 cores and 4 GiB free for the last two-GPU pod
    // (with 10 slots, 75 of 80, an order that fills seven GPUs leaves a two-GPU pod
    // without room).
    let gpus = (0..8)
        .map(|i| GpuRecord::new(&format!("gpu{i}"), "H100", H100_80).with_slots(16))
        .collect();
    let shared = Mutex::new(NodeBooks::new("n", gpus));
    let conflicts = Mutex::new(0u32);
    // Every worker's first fit is made on the same books, so 7 of 8 first reserves
    // must conflict.
    let start = Barrier::new(8);
    let bind = |uid: String, request: PodRequest, mut first: bool| loop {
        let snapshot = shared.lock().expect("books").clone();
        let assignment = snapshot.fit(&uid, &request).expect("room for every pod");
        if std::mem::take(&mut first) {
            start.wait();
        }
        let result = shared
            .lock()
            .expect("books")
            .reserve(snapshot.version(), assignment);
        match result {
            Ok(_) => return,
            Err(BooksError::Conflict { .. }) => *conflicts.lock().expect("count") += 1,
            Err(other) => panic!("{uid}: {other}"),
        }
    };
    std::thread::scope(|scope| {
        for worker in 0..8u32 {
            let bind = &bind;
            scope.spawn(move || {
                for k in 0..50u32 {
                    if k % 8 != worker {
                        continue;
                    }
                    let memory = mib(1_024 * u64::from(1 + k % 4));
                    let request = one(1 + k % 2, memory, (k % 3) * 5);
                    bind(format!("pod-{k}"), request, k == worker);
                }
            });
        }
    });
    let books = shared.into_inner().expect("books");
    assert_eq!(books.assignments().count(), 50);
    check_invariants(&books).expect("within every GPU's capacity");
    // Every bind moved the version once; conflicts moved nothing.
    assert_eq!(books.version(), 50);
    let conflicts = conflicts.into_inner().expect("count");
    assert!(conflicts >= 7, "{conflicts} conflicts");
}

// --- property: the books never overcommit ------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// Fit a pod and reserve it, maybe against a stale version.
    Place {
        count: u32,
        memory: MemoryRequest,
        cores: u32,
        stale: bool,
    },
    /// Reserve a hand-made assignment that skips `fit` (a buggy or racing caller).
    Raw {
        gpu: usize,
        memory_mib: u64,
        cores: u32,
    },
    /// Release the n-th booked pod.
    Release(usize),
    /// Rebuild from the recorded assignments, some listed twice.
    Rebuild { duplicate: usize },
    /// Mark one GPU healthy or not.
    Health { gpu: usize, healthy: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let memory = prop_oneof![
        (1u64..50_000).prop_map(MemoryRequest::Mib),
        (1u32..=100).prop_map(MemoryRequest::Percent),
    ];
    prop_oneof![
        4 => (1u32..4, memory, prop_oneof![Just(0u32), 1u32..=100, Just(100u32)], any::<bool>())
            .prop_map(|(count, memory, cores, stale)| Op::Place { count, memory, cores, stale }),
        2 => (0usize..4, 0u64..50_000, 0u32..=100)
            .prop_map(|(gpu, memory_mib, cores)| Op::Raw { gpu, memory_mib, cores }),
        2 => (0usize..16).prop_map(Op::Release),
        1 => (0usize..16).prop_map(|duplicate| Op::Rebuild { duplicate }),
        1 => (0usize..4, any::<bool>()).prop_map(|(gpu, healthy)| Op::Health { gpu, healthy }),
    ]
}

fn node_gpus() -> Vec<GpuRecord> {
    vec![
        GpuRecord::new("g0", "A100", A100_40).with_slots(3),
        GpuRecord::new("g1", "A100", A100_40),
        GpuRecord::new("g2", "H100", H100_80).with_slots(2),
        GpuRecord::new("g3", "H100", H100_80).with_slots(4),
    ]
}

/// Every GPU within memory, cores and slots; exclusive GPUs hold one vGPU; the usage is
/// the sum of the assignments.
fn check_invariants(books: &NodeBooks) -> Result<(), TestCaseError> {
    for (gpu, used) in books.gpus() {
        prop_assert!(used.memory_mib <= gpu.memory_mib, "{}: {used:?}", gpu.uuid);
        prop_assert!(used.cores <= WHOLE_GPU_CORES, "{}: {used:?}", gpu.uuid);
        prop_assert!(used.vgpus <= gpu.slots, "{}: {used:?}", gpu.uuid);
        prop_assert!(!used.exclusive || used.vgpus == 1, "{}: {used:?}", gpu.uuid);
        let grants: Vec<&Grant> = books
            .assignments()
            .flat_map(|a| a.grants().map(|(_, g)| g))
            .filter(|g| g.uuid == gpu.uuid)
            .collect();
        let sum = GpuUsage {
            memory_mib: grants.iter().map(|g| g.memory_mib).sum(),
            cores: grants.iter().map(|g| g.cores).sum(),
            vgpus: grants.len() as u32,
            exclusive: grants.iter().any(|g| g.exclusive()),
        };
        prop_assert_eq!(*used, sum, "{}", gpu.uuid);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn books_never_overcommit(ops in proptest::collection::vec(op(), 1..40)) {
        let mut books = NodeBooks::new("n", node_gpus());
        for (step, op) in ops.into_iter().enumerate() {
            let uid = format!("pod-{step}");
            match op {
                Op::Place { count, memory, cores, stale } => {
                    let version = books.version();
                    let request = one(count, memory, cores);
                    if let Ok(assignment) = books.fit(&uid, &request) {
                        if stale {
                            // Another bind lands first; ours must conflict.
                            let other = books.fit("racer", &one(1, mib(1), 0));
                            if let Ok(other) = other {
                                let racer = format!("racer-{step}");
                                let other = Assignment { pod_uid: racer, ..other };
                                books.reserve(version, other).expect("fresh version");
                                let late = books.reserve(version, assignment);
                                let is_conflict = matches!(late, Err(BooksError::Conflict { .. }));
                                prop_assert!(is_conflict, "{:?}", late);
                            }
                        } else {
                            prop_assert_eq!(books.reserve(version, assignment), Ok(version + 1));
                        }
                    }
                }
                Op::Raw { gpu, memory_mib, cores } => {
                    let assignment = Assignment {
                        pod_uid: uid,
                        node: "n".into(),
                        containers: vec![ContainerAssignment {
                            container: "main".into(),
                            grants: vec![Grant { uuid: format!("g{gpu}"), memory_mib, cores }],
                        }],
                    };
                    let _ = books.reserve(books.version(), assignment);
                }
                Op::Release(n) => {
                    let uid = books.assignments().nth(n).map(|a| a.pod_uid.clone());
                    if let Some(uid) = uid {
                        prop_assert!(books.release(&uid).is_some());
                    }
                }
                Op::Rebuild { duplicate } => {
                    let mut recorded: Vec<Assignment> = books.assignments().cloned().collect();
                    let count = recorded.len();
                    if let Some(again) = recorded.get(duplicate).cloned() {
                        recorded.push(again);
                    }
                    let (rebuilt, problems) = NodeBooks::rebuild("n", node_gpus(), recorded);
                    prop_assert_eq!(rebuilt.assignments().count(), count);
                    prop_assert_eq!(problems.len(), usize::from(duplicate < count));
                    books = rebuilt;
                }
                Op::Health { gpu, healthy } => {
                    let mut gpus: Vec<GpuRecord> = books.gpus().map(|(g, _)| g.clone()).collect();
                    gpus[gpu].healthy = healthy;
                    let count = books.assignments().count();
                    let (updated, problems) = books.with_gpus(gpus);
                    prop_assert_eq!(problems, vec![]);
                    prop_assert_eq!(updated.assignments().count(), count);
                    prop_assert!(updated.version() > books.version());
                    books = updated;
                }
            }
            check_invariants(&books)?;
        }
    }
}

#[test]
fn replaced_books_are_newer_so_old_fits_conflict() {
    let mut books = NodeBooks::new("n", a100s(2));
    let held = place(&mut books, "held", &one(1, mib(10_240), 0));
    let stale_fit = books.fit("late", &one(1, mib(1_024), 0)).expect("fits");
    let before = books.version();
    let (mut replaced, problems) = books.replaced(a100s(2), [held.clone()]);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(replaced.version() > before);
    assert_eq!(replaced.assignment("held"), Some(&held));
    assert!(matches!(
        replaced.reserve(before, stale_fit),
        Err(BooksError::Conflict { .. })
    ));
}
