//! The agent's `/metrics` with allocated-vs-used gauges and chargeback counters for a
//! busy node (issue 21: ≤ 5 ms per scrape), and the pure part of one sampling tick
//! (`tessera::metrics::usage::tick`) plus publishing it into the registry.
//!
//! A node of 8 H100s in vGPU mode, `CONTAINERS` containers (default 48, spread over the
//! GPUs), each holding one slice, with usage, shim accounting and queue/team labels; HAMi's
//! names on. Run: `cargo bench --bench usage_render -- --warm-up-time 1
//! --measurement-time 3` (`USAGE_CONTAINERS` changes the container count).

use std::collections::BTreeMap;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::{GpuBackend, GpuUsage, Inventory};
use tessera::metrics::sampler::{publish, Published};
use tessera::metrics::usage::{tick, PodLabels, Sample, UnitLimits, VgpuAccounting};
use tessera::metrics::NodeMetrics;
use tessera::partition::layout::{Advertisement, Device, Resource, Share, Target};
use tessera::vgpu::slots::Holder;

struct Node {
    inventory: Inventory,
    ad: Advertisement,
    holders: Vec<Holder>,
    usage: Vec<GpuUsage>,
    vgpu: Vec<VgpuAccounting>,
    pods: BTreeMap<(String, String), PodLabels>,
}

fn node(containers: usize) -> Node {
    let inventory = FakeBackend::from_arg("8xH100-80GB")
        .expect("a fake spec")
        .inventory()
        .expect("an inventory");
    let per_gpu = containers.div_ceil(8);
    let mut devices = Vec::new();
    let mut holders = Vec::new();
    let mut vgpu = Vec::new();
    let mut pods = BTreeMap::new();
    for (g, gpu) in inventory.gpus.iter().enumerate() {
        for n in 0..per_gpu {
            if holders.len() == containers {
                break;
            }
            let id = format!("{}::v{n}", gpu.uuid);
            devices.push(Device {
                id: id.clone(),
                gpu_uuid: gpu.uuid.clone(),
                gpu_index: gpu.index,
                numa_node: None,
                target: Target::Gpu,
                share: Share::Vgpu {
                    index: n as u32,
                    memory_mib: 4_096,
                    cores: 10,
                },
            });
            let pod = format!("inference-{g}-{n}");
            holders.push(Holder {
                namespace: format!("team-{}", n % 6),
                pod: pod.clone(),
                container: "server".into(),
                resource: "nvidia.com/vgpu".into(),
                device_ids: vec![id.clone()],
            });
            vgpu.push(VgpuAccounting {
                device_ids: vec![id],
                used_bytes: Some(vec![(n as u64 + 1) << 28]),
                limits: vec![UnitLimits {
                    index: 0,
                    memory_mib: 4_096,
                    cores: 10,
                }],
            });
            pods.insert(
                (format!("team-{}", n % 6), pod),
                PodLabels {
                    queue: format!("queue-{}", n % 3),
                    team: format!("team-{}", n % 6),
                },
            );
        }
    }
    let usage = inventory
        .gpus
        .iter()
        .map(|g| GpuUsage {
            uuid: g.uuid.clone(),
            memory_used_bytes: 30 << 30,
            memory_total_bytes: g.memory_mib << 20,
            utilization_percent: Some(42),
            ..GpuUsage::default()
        })
        .collect();
    Node {
        inventory,
        ad: Advertisement {
            resources: vec![Resource {
                name: "nvidia.com/vgpu".into(),
                fail_requests_greater_than_one: false,
                devices,
            }],
        },
        holders,
        usage,
        vgpu,
        pods,
    }
}

fn bench(c: &mut Criterion) {
    let containers = std::env::var("USAGE_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let n = node(containers);
    let sample = Sample {
        node: "gpu-node-1",
        inventory: &n.inventory,
        advertisement: &n.ad,
        holders: &n.holders,
        usage: &n.usage,
        vgpu: &n.vgpu,
        claim_holders: &[],
        claims: &[],
        pods: &n.pods,
        process_pods: &Default::default(),
        pod_uids: &Default::default(),
    };
    let metrics = NodeMetrics::with_hami(true);
    let mut published = Published::default();
    let one = tick(&sample, 15.0);
    assert_eq!(one.containers.len(), containers, "{:?}", one.skipped);
    publish(
        &metrics,
        &one,
        &mut published,
        Duration::ZERO,
        Duration::from_secs(120),
    );
    let page = metrics.encode();
    eprintln!(
        "/metrics: {} bytes, {} lines, {containers} containers on 8 GPUs",
        page.len(),
        page.lines().count()
    );
    let mut group = c.benchmark_group(format!("usage_{containers}"));
    group.bench_function("render_metrics", |b| b.iter(|| black_box(metrics.encode())));
    group.bench_function("tick_pure", |b| b.iter(|| black_box(tick(&sample, 15.0))));
    let mut at = Duration::ZERO;
    group.bench_function("tick_and_publish", |b| {
        b.iter(|| {
            at += Duration::from_secs(15);
            let t = tick(&sample, 15.0);
            publish(&metrics, &t, &mut published, at, Duration::from_secs(120));
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
