//! DRA driver benchmarks: the `tessera node --dra` binary (release under `cargo bench`) on
//! fake GPUs, the DRA kubelet emulator over real unix sockets (socket-path `:authority`),
//! the API-server double on loopback.
//!
//! Run: `cargo bench --bench dra_node` (`BENCH_ROUNDS=N` scales the sample, default 5).
//! Prints one table, each figure beside a baseline measured in the same run:
//! - NodePrepareResources round trip for one claim (whole GPU; MIG instance created on
//!   demand), with 50 other claims in the checkpoint, vs. an empty NodePrepareResources
//!   (the transport floor) and the claim GET alone (which the 5 ms budget excludes);
//! - 100 claims in flight at once (one request per pod) vs. the same 100 one after another;
//! - slices deleted → the whole pool published again, vs. the 2 s target;
//! - SIGKILL → restarted agent answering NodePrepareResources (recovery included), vs. the
//!   same binary's bare start-up (`tessera node --help`).
//!
//! `DRA_BENCH_DIR=/dev/shm` puts the agent's state on tmpfs (fsync becomes free), which
//! separates the driver's own cost from the disk's. `DRA_BENCH_CDI_DIR=/dev/shm` puts only
//! the CDI specs there, as a real node does (`/var/run/cdi` is tmpfs);
//! `DRA_BENCH_LOG_DIR=/dev/shm` the agent's log file.
//!
//! `cargo test --all-targets` runs it once with a small sample, as a smoke test.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[path = "../tests/support/dra_agent.rs"]
mod dra_agent;
#[path = "../tests/support/dra_kubelet.rs"]
mod dra_kubelet;
#[path = "support/stats.rs"]
mod stats;

use stats::{pct, stats};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use dra_agent::{spawn_binary, NodeDirs, NODE};
use dra_kubelet::{Claim, DraKubelet};
use k8s_openapi::api::resource::v1::ResourceClaim;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tessera::dra::checkpoint::{Phase, Store};
use tessera::proto::dra::v1;

const DRIVER: &str = "gpu.tessera.io";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";
/// GPUs 0–2 whole, 3–17 MIG (15 × 7 one-slice placements = 105 MIG devices).
const GPUS: &str = "18xA100-80GB";
const CONFIG: &str =
    "tessera: { gpus: [ { match: { index: [3,4,5,6,7,8,9,10,11,12,13,14,15,16,17] }, \
    mode: mig, mig: { layout: balanced } } ] }";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn allocate(api: &ApiServer, name: &str, device: &str) -> Claim {
    let uid = format!("uid-{name}");
    api.put_object(
        CLAIMS,
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]}}}
        }),
    );
    Claim::new("ml", name, &uid)
}

fn complete_pool(api: &ApiServer) -> bool {
    let ours: Vec<Value> = api
        .objects(SLICES)
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .collect();
    let gens: BTreeSet<i64> = ours
        .iter()
        .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
        .collect();
    let count = ours
        .first()
        .and_then(|s| s["spec"]["pool"]["resourceSliceCount"].as_i64());
    gens.len() == 1 && Some(ours.len() as i64) == count
}

async fn wait(what: &str, timeout: Duration, cond: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    start.elapsed()
}

async fn prepare_ok(kubelet: &DraKubelet, claims: &[Claim]) {
    let out = kubelet.prepare(DRIVER, claims).await.unwrap();
    for c in claims {
        if let Err(e) = &out[&c.uid] {
            panic!("{}: {e}", c.name);
        }
    }
}

async fn unprepare_ok(kubelet: &DraKubelet, claims: &[Claim]) {
    let out = kubelet.unprepare(DRIVER, claims).await.unwrap();
    assert!(out.values().all(|r| r.is_ok()), "{out:?}");
}

/// Dial dra.sock (socket-path authority) and prepare `claim`, until it answers.
async fn serving(socket: &std::path::Path, claim: &Claim, timeout: Duration) -> Duration {
    let start = Instant::now();
    let authority = socket.display().to_string();
    loop {
        assert!(
            start.elapsed() < timeout,
            "agent not serving after {timeout:?}"
        );
        if let Ok(ch) = tessera::grpc::connect_unix_with_authority(
            socket,
            &authority,
            Duration::from_millis(100),
        )
        .await
        {
            let req = v1::NodePrepareResourcesRequest {
                claims: vec![v1::Claim {
                    namespace: claim.namespace.clone(),
                    uid: claim.uid.clone(),
                    name: claim.name.clone(),
                }],
            };
            let mut client = v1::dra_plugin_client::DraPluginClient::new(ch);
            if let Ok(r) = client.node_prepare_resources(req).await {
                let r = r.into_inner();
                assert!(r.claims[&claim.uid].error.is_empty(), "{r:?}");
                return start.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// What the disk alone costs: atomic writes of a checkpoint-sized file in `dir` (write,
/// optional fsync, rename, optional directory fsync), one per `(fsync, dir fsync)` entry.
/// The old two-phase record was `[(true, false), (true, true)]` (3 fsyncs); one durable
/// write is `[(true, false)]`.
fn atomic_writes(dir: &std::path::Path, bytes: usize, writes: &[(bool, bool)]) -> Duration {
    use std::io::Write;
    let t = Instant::now();
    for &(sync, sync_dir) in writes {
        let tmp = dir.join("floor.tmp");
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(&vec![b'x'; bytes]).unwrap();
        if sync {
            f.sync_all().unwrap();
        }
        drop(f);
        std::fs::rename(&tmp, dir.join("floor.json")).unwrap();
        if sync_dir {
            std::fs::File::open(dir).unwrap().sync_all().unwrap();
        }
    }
    t.elapsed()
}

/// What the disk alone costs for one durable checkpoint-log record: a `pwrite` of `bytes`
/// into `file` (preallocated, zero-filled) at `at`, then `fdatasync`.
fn log_record_write(file: &std::fs::File, at: u64, bytes: usize) -> Duration {
    use std::os::unix::fs::FileExt;
    let t = Instant::now();
    file.write_all_at(&vec![b'x'; bytes], at).unwrap();
    file.sync_data().unwrap();
    t.elapsed()
}

/// A preallocated file for [`log_record_write`] in `dir` (as the agent's log is).
fn log_floor_file(dir: &std::path::Path) -> std::fs::File {
    use std::io::Write;
    let mut f = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("floor.log"))
        .unwrap();
    f.write_all(&vec![0u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    f
}

/// The agent's `tessera::dra::timing` debug lines whose message is `what`, as
/// `(claim name, value of field key)` (ANSI colours stripped).
fn timing_fields<'a>(
    log: &'a str,
    what: &'a str,
    key: &'a str,
) -> impl Iterator<Item = (String, String)> + 'a {
    log.lines()
        .filter(move |l| l.contains(what))
        .filter_map(move |line| {
            // Strip ANSI colour sequences (ESC [ … m).
            let mut plain = String::with_capacity(line.len());
            let mut chars = line.chars();
            while let Some(ch) = chars.next() {
                if ch == '\u{1b}' {
                    for c in chars.by_ref() {
                        if c == 'm' {
                            break;
                        }
                    }
                } else {
                    plain.push(ch);
                }
            }
            let field = |k: &str| {
                plain
                    .split_whitespace()
                    .find_map(|t| t.strip_prefix(k).map(str::to_string))
            };
            Some((field("claim=ml/")?, field(key)?))
        })
}

/// The agent's own claim GET times (µs) by claim name, from its `tessera::dra::timing`
/// debug lines (`claim GET claim=ml/NAME get_us=N`).
fn agent_get_times(log: &str) -> std::collections::BTreeMap<String, u64> {
    timing_fields(log, "claim GET", "get_us=")
        .filter_map(|(claim, us)| Some((claim, us.parse().ok()?)))
        .collect()
}

/// Per-step times of the prepares of claims named `<prefix><number>`, from the agent's
/// `prepare steps … steps=a=12,b=40` lines: each step's samples, in first-seen order.
fn agent_steps(log: &str, prefix: &str) -> Vec<(String, Vec<Duration>)> {
    let mut out: Vec<(String, Vec<Duration>)> = Vec::new();
    for (claim, steps) in timing_fields(log, "prepare steps", "steps=") {
        let Some(n) = claim.strip_prefix(prefix) else {
            continue;
        };
        if n.parse::<u32>().is_err() {
            continue;
        }
        for (step, us) in steps.split(',').filter_map(|kv| kv.split_once('=')) {
            let Ok(us) = us.parse::<u64>() else { continue };
            let d = Duration::from_micros(us);
            match out.iter_mut().find(|(s, _)| s == step) {
                Some((_, v)) => v.push(d),
                None => out.push((step.to_string(), vec![d])),
            }
        }
    }
    out
}

/// A restarted agent's milestones from its log (`log` holds only its lines): exec → its
/// first line, → "DRA checkpoint recovered", → the first "NodePrepareResources" it
/// logged, → `total` (the bench's answer). `spawned` is the wall clock at exec.
fn restart_phases(
    log: &str,
    spawned: std::time::SystemTime,
    total: Duration,
) -> Option<[Duration; 4]> {
    let at = |what: &str| -> Option<Duration> {
        let line = log.lines().find(|l| l.contains(what))?;
        // Strip ANSI colour sequences (ESC [ … m).
        let mut parts = line.split('\u{1b}');
        let mut plain = parts.next().unwrap_or_default().to_string();
        for part in parts {
            plain.push_str(part.split_once('m').map_or(part, |(_, rest)| rest));
        }
        let stamp = plain.split_whitespace().next()?;
        let t: k8s_openapi::jiff::Timestamp = stamp.parse().ok()?;
        let t = std::time::SystemTime::from(t);
        t.duration_since(spawned).ok()
    };
    let started = at("starting node agent")?;
    let recovered = at("DRA checkpoint recovered")?;
    let request = at("NodePrepareResources")?;
    Some([
        started,
        recovered.saturating_sub(started),
        request.saturating_sub(recovered),
        total.saturating_sub(request),
    ])
}

/// Round trips minus the agent's own GET of that claim.
fn excluding_get(
    rtt: &[(String, Duration)],
    gets: &std::collections::BTreeMap<String, u64>,
) -> Vec<Duration> {
    rtt.iter()
        .map(|(name, d)| {
            let get = gets
                .get(name)
                .copied()
                .unwrap_or_else(|| panic!("no GET timing for {name}"));
            d.saturating_sub(Duration::from_micros(get))
        })
        .collect()
}

/// A process's time on a CPU and waiting in the run queue so far, summed over its threads
/// (`/proc/<pid>/task/*/schedstat`): separates the agent's own work from CPU contention on
/// a shared machine.
fn cpu_and_wait(pid: u32) -> (Duration, Duration) {
    let (mut run, mut wait) = (0u64, 0u64);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            let mut f = stat
                .split_whitespace()
                .map(|v| v.parse::<u64>().unwrap_or(0));
            run += f.next().unwrap_or(0);
            wait += f.next().unwrap_or(0);
        }
    }
    (Duration::from_nanos(run), Duration::from_nanos(wait))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 5 } else { 1 });
    let samples = if full { 100 * rounds } else { 10 };
    // Republish and restart repetitions.
    let reps = if full { 5 * rounds } else { 2 };
    let bin = env!("CARGO_BIN_EXE_tessera");
    // The agent logs its own claim GET times (to subtract them: the 5 ms budget excludes
    // the GET).
    if std::env::var_os("TESSERA_TEST_LOG").is_none() {
        std::env::set_var("TESSERA_TEST_LOG", "warn,tessera::dra::timing=debug");
    }
    let mut rows: Vec<(String, String, String, String)> = Vec::new();

    let api = ApiServer::start(NODE).await;
    // DRA_BENCH_DIR=/dev/shm puts the agent's files (checkpoint, CDI specs) on tmpfs:
    // the same run without the disk's fsync latency.
    let tmp = match std::env::var_os("DRA_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let mut dirs = NodeDirs::under(tmp.path());
    // DRA_BENCH_CDI_DIR=/dev/shm puts only the CDI specs on tmpfs, as on a real node
    // (`/var/run/cdi`), and leaves the checkpoint where DRA_BENCH_DIR says.
    let cdi_tmp = std::env::var_os("DRA_BENCH_CDI_DIR").map(|d| tempfile::tempdir_in(d).unwrap());
    if let Some(d) = &cdi_tmp {
        dirs.cdi_root = d.path().join("cdi");
    }
    // DRA_BENCH_LOG_DIR=/dev/shm keeps the agent's debug log (a dozen timing lines per
    // prepare) off the disk: on a node its stderr is a pipe to the container runtime,
    // not a file it writes itself.
    let log_tmp = std::env::var_os("DRA_BENCH_LOG_DIR").map(|d| tempfile::tempdir_in(d).unwrap());
    if let Some(d) = &log_tmp {
        dirs.agent_log = d.path().join("agent.log");
    }
    std::fs::create_dir_all(&dirs.config).unwrap();
    std::fs::write(dirs.config.join("default"), CONFIG).unwrap();
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let mut agent = spawn_binary(bin, &dirs, &api, GPUS, "boot-1");
    kubelet
        .wait_registered(DRIVER, 1, Duration::from_secs(10))
        .await;
    wait("slices", Duration::from_secs(10), || complete_pool(&api)).await;

    // A busy node: 50 claims prepared and kept.
    let background: Vec<Claim> = (0..50)
        .map(|i| allocate(&api, &format!("bg{i}"), &format!("gpu-{}", i % 3)))
        .collect();
    prepare_ok(&kubelet, &background).await;

    // --- one claim per request -----------------------------------------------------
    let socket = dirs.kubelet_dir.join("plugins/gpu.tessera.io/dra.sock");
    let authority = socket.display().to_string();
    let ch =
        tessera::grpc::connect_unix_with_authority(&socket, &authority, Duration::from_secs(2))
            .await
            .unwrap();
    let mut raw = v1::dra_plugin_client::DraPluginClient::new(ch);
    let claims_api: kube::Api<ResourceClaim> = kube::Api::namespaced(api.client(), "ml");
    let (mut empty, mut get, mut whole, mut mig) = (vec![], vec![], vec![], vec![]);
    let (mut floor, mut floor1, mut floor_log) = (vec![], vec![], vec![]);
    let floor_file = log_floor_file(&dirs.state_dir);
    let checkpoint_bytes = std::fs::metadata(dirs.checkpoint_dir().join("checkpoint.json"))
        .map(|m| m.len() as usize)
        .unwrap_or(16 * 1024);
    for i in 0..samples {
        floor.push(atomic_writes(
            &dirs.state_dir,
            checkpoint_bytes,
            &[(true, false), (true, true)],
        ));
        floor1.push(atomic_writes(
            &dirs.state_dir,
            checkpoint_bytes,
            &[(true, false)],
        ));
        floor_log.push(log_record_write(&floor_file, (i as u64 % 1000) * 1024, 600));
        let t = Instant::now();
        raw.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
            .await
            .unwrap();
        empty.push(t.elapsed());
        let w = allocate(&api, &format!("w{i}"), &format!("gpu-{}", i % 3));
        let t = Instant::now();
        claims_api.get(&w.name).await.unwrap();
        get.push(t.elapsed());
        let t = Instant::now();
        prepare_ok(&kubelet, std::slice::from_ref(&w)).await;
        whole.push((w.name.clone(), t.elapsed()));
        let m = allocate(
            &api,
            &format!("m{i}"),
            &format!("gpu-3-mig-1g-10gb-{}", i % 7),
        );
        let t = Instant::now();
        prepare_ok(&kubelet, std::slice::from_ref(&m)).await;
        mig.push((m.name.clone(), t.elapsed()));
        unprepare_ok(&kubelet, &[w, m]).await;
    }
    let log = dra_agent::binary_log(&dirs);
    let agent_gets = agent_get_times(&log);
    let step_tables = [
        ("whole GPU", agent_steps(&log, "w")),
        ("MIG", agent_steps(&log, "m")),
    ];
    let (e50, e99) = stats(empty);
    let (g50, g99) = stats(get);
    let (a50, a99) = stats(
        whole
            .iter()
            .chain(&mig)
            .map(|(n, _)| Duration::from_micros(agent_gets.get(n).copied().unwrap_or(0)))
            .collect(),
    );
    let (wx50, wx99) = stats(excluding_get(&whole, &agent_gets));
    let (mx50, mx99) = stats(excluding_get(&mig, &agent_gets));
    let (w50, w99) = stats(whole.into_iter().map(|(_, d)| d).collect());
    let (m50, m99) = stats(mig.into_iter().map(|(_, d)| d).collect());
    let (f50, f99) = stats(floor);
    let (o50, o99) = stats(floor1);
    let (l50, l99) = stats(floor_log);
    rows.push((
        "NodePrepareResources, whole GPU (p50 / p99)".into(),
        format!("{:.2} / {:.2} ms", ms(w50), ms(w99)),
        format!("empty RPC {:.2} / {:.2} ms", ms(e50), ms(e99)),
        format!("{:.1}x (p99)", ms(w99) / ms(e99)),
    ));
    rows.push((
        "  excluding the agent's claim GET (p50 / p99)".into(),
        format!("{:.2} / {:.2} ms", ms(wx50), ms(wx99)),
        format!("agent's GET {:.2} / {:.2} ms", ms(a50), ms(a99)),
        format!("{:.2}x of 5 ms (p99)", ms(wx99) / 5.0),
    ));
    rows.push((
        "  disk floor: 2 checkpoint writes, 3 fsyncs (p50/p99)".into(),
        format!("{:.2} / {:.2} ms", ms(f50), ms(f99)),
        "same directory, same size".into(),
        format!("prepare p50 = {:.2}x floor", ms(w50) / ms(f50)),
    ));
    rows.push((
        "  disk floor: 1 checkpoint write, 1 fsync (p50/p99)".into(),
        format!("{:.2} / {:.2} ms", ms(o50), ms(o99)),
        "same directory, same size".into(),
        format!("prepare p50 = {:.2}x floor", ms(w50) / ms(o50)),
    ));
    rows.push((
        "  disk floor: 1 log record, pwrite + fdatasync (p50/p99)".into(),
        format!("{:.2} / {:.2} ms", ms(l50), ms(l99)),
        "600 bytes, preallocated file".into(),
        format!("prepare p50 = {:.2}x floor", ms(w50) / ms(l50)),
    ));
    rows.push((
        "NodePrepareResources, MIG on demand (p50 / p99)".into(),
        format!("{:.2} / {:.2} ms", ms(m50), ms(m99)),
        format!("claim GET {:.2} / {:.2} ms", ms(g50), ms(g99)),
        format!("{:.2}x of 5 ms (p99, GET incl.)", ms(m99) / 5.0),
    ));
    rows.push((
        "  excluding the agent's claim GET (p50 / p99)".into(),
        format!("{:.2} / {:.2} ms", ms(mx50), ms(mx99)),
        "target p99 5 ms".into(),
        format!("{:.2}x of 5 ms (p99)", ms(mx99) / 5.0),
    ));

    // --- 100 claims at once vs. one after another -----------------------------------
    let hundred: Vec<Claim> = (0..100)
        .map(|i| {
            allocate(
                &api,
                &format!("h{i}"),
                &format!("gpu-{}-mig-1g-10gb-{}", 3 + i / 7, i % 7),
            )
        })
        .collect();
    let (mut par, mut seq, mut per_claim) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        for c in &hundred {
            prepare_ok(&kubelet, std::slice::from_ref(c)).await;
        }
        seq.push(t.elapsed());
        unprepare_ok(&kubelet, &hundred).await;

        let t = Instant::now();
        let calls = hundred.iter().map(|c| {
            let k = &kubelet;
            async move {
                let t = Instant::now();
                prepare_ok(k, std::slice::from_ref(c)).await;
                t.elapsed()
            }
        });
        per_claim.extend(futures::future::join_all(calls).await);
        par.push(t.elapsed());
        let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
        let done = hundred
            .iter()
            .filter(|c| {
                cp.claims
                    .get(&c.uid)
                    .is_some_and(|p| p.phase == Phase::Completed)
            })
            .count();
        assert_eq!(done, 100, "lost checkpoint entries");
        let devices: BTreeSet<String> = hundred
            .iter()
            .map(|c| {
                let spec: Value =
                    serde_json::from_slice(&std::fs::read(dirs.claim_spec(&c.uid)).unwrap())
                        .unwrap();
                spec["containerEdits"]["env"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|e| e.as_str()?.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        assert_eq!(devices.len(), 100, "a device was handed out twice");
        unprepare_ok(&kubelet, &hundred).await;
    }
    let (p50, _) = stats(par);
    let (s50, _) = stats(seq);
    let (c50, c99) = stats(per_claim);
    rows.push((
        "100 concurrent claims, all prepared (median)".into(),
        format!(
            "{:.0} ms (claim p50/p99 {:.0}/{:.0} ms)",
            ms(p50),
            ms(c50),
            ms(c99)
        ),
        format!("100 sequential {:.0} ms", ms(s50)),
        format!("{:.2}x", ms(p50) / ms(s50)),
    ));

    // --- slices deleted → republished -------------------------------------------------
    let mut republish = vec![];
    for _ in 0..reps {
        for s in api.objects(SLICES) {
            if s["spec"]["nodeName"] == NODE {
                api.delete_object(SLICES, s["metadata"]["name"].as_str().unwrap());
            }
        }
        republish.push(wait("republish", Duration::from_secs(5), || complete_pool(&api)).await);
    }
    republish.sort();
    let (r50, rmax) = (pct(&republish, 0.5), *republish.last().unwrap());
    rows.push((
        "slices deleted → pool republished (p50 / max)".into(),
        format!("{:.0} / {:.0} ms", ms(r50), ms(rmax)),
        "target 2 s".into(),
        format!("{:.3}x (max)", ms(rmax) / 2000.0),
    ));

    // --- SIGKILL → restarted agent serving --------------------------------------------
    let (mut restart, mut bare) = (vec![], vec![]);
    let (mut on_cpu, mut queued) = (vec![], vec![]);
    let mut phases: Vec<[Duration; 4]> = vec![];
    let probe = background[0].clone();
    // The restarted agents also log their start-up milestones (info), for the breakdown.
    std::env::set_var(
        "TESSERA_TEST_LOG",
        format!(
            "{},tessera::cmd::node=info,tessera::agent::dra=info,tessera::dra::plugin=info",
            std::env::var("TESSERA_TEST_LOG").unwrap_or_default()
        ),
    );
    for _ in 0..reps {
        let t = Instant::now();
        let out = std::process::Command::new(bin)
            .args(["node", "--help"])
            .output()
            .unwrap();
        assert!(out.status.success());
        bare.push(t.elapsed());
        kill(Pid::from_raw(agent.id() as i32), Signal::SIGKILL).unwrap();
        agent.wait().unwrap();
        let log_len = dra_agent::binary_log(&dirs).len();
        let start = Instant::now();
        let wall = std::time::SystemTime::now();
        agent = spawn_binary(bin, &dirs, &api, GPUS, "boot-1");
        // The prober stands for the kubelet, a process of its own: it gets a thread and a
        // runtime of its own, so it does not queue behind the API double (same process,
        // busy answering the restarted agent's ResourceSlice LIST and WATCH).
        let (sock, claim) = (socket.clone(), probe.clone());
        tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(serving(&sock, &claim, Duration::from_secs(10)))
        })
        .await
        .unwrap();
        restart.push(start.elapsed());
        let log = dra_agent::binary_log(&dirs);
        if let Some(p) = restart_phases(&log[log_len..], wall, start.elapsed()) {
            phases.push(p);
        }
        let (run, wait) = cpu_and_wait(agent.id());
        on_cpu.push(run);
        queued.push(wait);
    }
    restart.sort();
    bare.sort();
    let (x50, xmax) = (pct(&restart, 0.5), *restart.last().unwrap());
    let b50 = pct(&bare, 0.5);
    rows.push((
        "SIGKILL → restarted, NodePrepare answered (p50 / max)".into(),
        format!("{:.0} / {:.0} ms", ms(x50), ms(xmax)),
        format!("bare process start {:.0} ms", ms(b50)),
        format!("{:.2}x of 300 ms (max)", ms(xmax) / 300.0),
    ));
    let (c50, cmax) = {
        on_cpu.sort();
        (pct(&on_cpu, 0.5), *on_cpu.last().unwrap())
    };
    let (q50, _) = stats(queued);
    rows.push((
        "  of which the agent on a CPU (p50 / max)".into(),
        format!("{:.0} / {:.0} ms", ms(c50), ms(cmax)),
        format!("waiting for a CPU p50 {:.0} ms", ms(q50)),
        format!("{:.2}x of 300 ms (max)", ms(cmax) / 300.0),
    ));

    // Where the restart goes (agent log timestamps against the bench's clock), p50 each.
    let phase_names = [
        "exec → first log line (process start, flags, fake GPUs)",
        "→ checkpoint recovered (API client, first config, recovery)",
        "→ the probe's NodePrepareResources arrives (serve, dial, HTTP/2)",
        "→ answer received by the bench",
    ];
    let restart_breakdown: Vec<String> = phase_names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (p50, _) = stats(phases.iter().map(|p| p[i]).collect());
            format!("  {name:<66} {:>6.1} ms", ms(p50))
        })
        .collect();

    kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM).unwrap();
    agent.wait().unwrap();
    if std::env::var_os("DRA_BENCH_LOG").is_some() {
        eprintln!("{}", dra_agent::binary_log(&dirs));
    }

    println!(
        "\n{:<54} {:<36} {:<28} RATIO",
        "MEASURE", "TESSERA", "BASELINE"
    );
    for (a, b, c, d) in rows {
        println!("{a:<54} {b:<36} {c:<28} {d}");
    }
    println!(
        "\nrestart phases (p50 of {} restarts; sums need not match the p50 total):",
        phases.len()
    );
    for line in restart_breakdown {
        println!("{line}");
    }
    // Where a single claim's prepare goes, step by step (the agent's own clock).
    for (kind, steps) in step_tables {
        println!(
            "\nprepare steps, {kind} (µs, p50 / p99, {} claims):",
            steps.first().map_or(0, |s| s.1.len())
        );
        for (step, samples) in steps {
            let (p50, p99) = stats(samples);
            println!(
                "  {step:<12} {:>7} / {:>7}",
                p50.as_micros(),
                p99.as_micros()
            );
        }
    }
}
