//! Peak resident memory of the node agent under kubelet load (issue 17: ≤ 12 MiB).
//!
//! Run: `hack/agent-rss.sh`, which measures `tessera-node` as the image ships it (the
//! `node` profile, built for size), or `cargo bench --bench agent_rss` for the bench
//! profile's build. The agent's own binary on the fake backend (`8xH100-80GB`) is driven by the kubelet emulator of
//! `tests/support/kubelet.rs` over real unix sockets: registration, `RSS_ALLOCATES`
//! (default 1,000) Allocates over the kubelet's connection, a kubelet restart (every
//! resource re-registered and listed again), and as many Allocates again. The figure is
//! the agent's `VmHWM` (peak RSS) from `/proc/<pid>/status` at the end, for two layouts: all
//! GPUs whole (the DaemonSet's default config) and 8 GPUs in four modes. Also printed: the
//! current RSS split into anonymous and file-backed pages, and the agent's thread count.
//!
//! `RSS_LIMIT_MIB=12` makes the run fail when a peak is above it; `TESSERA_BIN=<path>`
//! measures another build of the agent with the same driver. `cargo test
//! --all-targets` runs it once with 20 Allocates as a smoke test (no figure worth quoting:
//! that is the debug binary).

#[path = "../tests/support/kubelet.rs"]
mod kubelet;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kubelet::Kubelet;
use tessera::proto::deviceplugin as pb;

/// The DaemonSet's default config: every GPU whole.
const WHOLE: &str = "version: v1\nflags: { migStrategy: none }\n";

/// 8 GPUs in four modes: MIG, time-sliced (renamed), vGPU slices, whole.
const MIXED_8: &str = r#"
version: v1
flags: { migStrategy: mixed }
tessera:
  gpus:
  - match: { index: [0, 1] }
    mode: mig
    mig: { layout: all-1g.10gb }
  - match: { index: [2, 3] }
    mode: timeslice
    timeslice: { replicas: 48, rename: nvidia.com/gpu.shared }
  - match: { index: [4, 5] }
    mode: vgpu
    vgpu: { count: 4, memory: 16g, cores: 25 }
  - match: { index: [6, 7] }
    mode: whole
"#;

fn spawn_agent(dir: &Path, config: &str) -> Child {
    let cfg = dir.join("config.yaml");
    std::fs::write(&cfg, config).unwrap();
    // vGPU Allocates need the shim installed; the agent copies whatever file it is given.
    let shim = dir.join("libtessera_cuda.so");
    std::fs::write(&shim, b"stand-in for libtessera_cuda.so").unwrap();
    // `TESSERA_BIN`: measure another build (e.g. before a change) with the same driver;
    // a `tessera` binary runs its `node` subcommand, `tessera-node` needs none.
    let bin = std::env::var_os("TESSERA_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tessera-node").into());
    let mut cmd = Command::new(&bin);
    if bin.file_name().is_some_and(|n| n != "tessera-node") {
        cmd.arg("node");
    }
    cmd.args(["--gpu-backend", "fake", "--fake-gpus", "8xH100-80GB"])
        .arg("--kubelet-dir")
        .arg(dir.join("kubelet"))
        .arg("--cdi-root")
        .arg(dir.join("cdi"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--config")
        .arg(&cfg)
        .arg("--shim-source")
        .arg(&shim)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A `kB` field of `/proc/<pid>/<file>`, in KiB.
fn proc_kib(pid: u32, file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn registered(k: &Kubelet, n: usize) {
    k.wait_until(Duration::from_secs(20), "registration", |m| {
        m.len() == n && m.values().all(|s| !s.lists.is_empty())
    })
    .await;
}

/// `n` Allocates spread over every resource, one device each, on the kubelet's
/// connection of each resource (as the kubelet keeps one per plugin). MIG resources are
/// listed but not allocated: their Allocate reads the driver's capability table
/// (`/proc/driver/nvidia-caps`), which a machine without the NVIDIA driver lacks.
async fn allocate(k: &Kubelet, n: usize) -> Vec<Duration> {
    let mut clients = Vec::new();
    for resource in k.resources().into_iter().filter(|r| !r.contains("/mig-")) {
        let devices = k.devices(&resource).await;
        clients.push((k.client(&resource).await, devices));
    }
    let count = clients.len();
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let (client, devices) = &mut clients[i % count];
        let id = devices[(i / 4) % devices.len()].id.clone();
        let t = std::time::Instant::now();
        client
            .allocate(pb::AllocateRequest {
                container_requests: vec![pb::ContainerAllocateRequest {
                    devices_ids: vec![id],
                }],
            })
            .await
            .unwrap();
        times.push(t.elapsed());
    }
    times
}

struct Figures {
    hwm: u64,
    rss: u64,
    anon: u64,
    file: u64,
    threads: u64,
    /// Median Allocate round trip (a cross-check that a memory change costs no speed).
    allocate_p50: Duration,
}

async fn measure(config: &str, resources: usize, allocates: usize) -> Figures {
    let tmp = tempfile::tempdir().unwrap();
    let mut kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let mut agent = spawn_agent(tmp.path(), config);
    registered(&kubelet, resources).await;
    let mut times = allocate(&kubelet, allocates).await;
    kubelet.restart().await;
    registered(&kubelet, resources).await;
    times.extend(allocate(&kubelet, allocates).await);
    times.sort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = agent.id();
    let figures = Figures {
        hwm: proc_kib(pid, "status", "VmHWM:"),
        rss: proc_kib(pid, "status", "VmRSS:"),
        anon: proc_kib(pid, "status", "RssAnon:"),
        file: proc_kib(pid, "status", "RssFile:"),
        threads: proc_kib(pid, "status", "Threads:"),
        allocate_p50: times[times.len() / 2],
    };
    let _ = agent.kill();
    let _ = agent.wait();
    figures
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let allocates: usize = std::env::var("RSS_ALLOCATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 1000 } else { 20 });
    let limit: Option<f64> = std::env::var("RSS_LIMIT_MIB")
        .ok()
        .and_then(|v| v.parse().ok());
    println!(
        "\n{:<34} {:>10} {:>10} {:>10} {:>10} {:>8} {:>12}",
        "LAYOUT (2 x allocates, 1 restart)",
        "PEAK",
        "RSS NOW",
        "ANON",
        "FILE",
        "THREADS",
        "ALLOCATE p50"
    );
    let mut over = Vec::new();
    for (name, config, resources) in [("8 GPUs whole", WHOLE, 1), ("8 GPUs, 4 modes", MIXED_8, 4)] {
        let f = measure(config, resources, allocates).await;
        println!(
            "{:<34} {:>6.1} MiB {:>6.1} MiB {:>6.1} MiB {:>6.1} MiB {:>8} {:>9.0} µs",
            format!("{name} ({allocates})"),
            mib(f.hwm),
            mib(f.rss),
            mib(f.anon),
            mib(f.file),
            f.threads,
            f.allocate_p50.as_secs_f64() * 1e6
        );
        if limit.is_some_and(|l| mib(f.hwm) > l) {
            over.push(name);
        }
    }
    if !over.is_empty() {
        eprintln!("peak RSS above RSS_LIMIT_MIB for: {}", over.join(", "));
        std::process::exit(1);
    }
}
