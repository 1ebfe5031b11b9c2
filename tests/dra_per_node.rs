//! The DRA path per node, and GPUs leaving it, end to end: the agent runs both paths
//! (`agent::run_with`, the code behind `tessera node`), the node's `tessera.io/config`
//! label picks a named config, with the device-plugin and DRA kubelet emulators over real
//! sockets and the API-server double.
//!
//! - `--dra=auto`: the DRA driver registers and publishes only while the node config
//!   gives it a GPU (or a claim still holds one), and withdraws (slices deleted, sockets
//!   removed, the kubelet unregisters) when a reload takes the last one away.
//! - A claim the scheduler allocates on a GPU between the agent's LIST of claims and the
//!   slices without that GPU (made deterministic with the double's
//!   [`ApiServer::after_next_list`]) rolls the move back: the GPU is republished to the
//!   DRA driver, never listed by the device plugin, a `GpuMoveBlocked` Event names the
//!   claim, and the claim prepares.
//! - The `tessera` binary with `TESSERA_DRA=auto`, as the DaemonSet runs it, following its
//!   config file.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::dra_agent::{allocated_claim, DraAgent, DraAgentBuilder, NODE};
use support::dra_kubelet::{Claim, DraKubelet};
use support::dra_pool::{
    blocked_events, dp_ever_listed, dra_devices, node, our_slices, wait_blocked, wait_dp, wait_dra,
    Node, Slices, DRIVER, GPU, SLICES, WAIT,
};
use tessera::agent::ownership::DraMode;

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";
/// The cluster-wide LIST the agent makes before a GPU leaves the driver.
const ALL_CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A claim the scheduler allocated `devices` of this node's DRA pool.
fn claim_object(name: &str, devices: &[&str]) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d}))
        .collect();
    allocated_claim(name, &format!("uid-{name}"), DRIVER, json!(results))
}

fn put_claim(api: &ApiServer, name: &str, devices: &[&str]) -> Claim {
    api.put_object(CLAIMS, claim_object(name, devices));
    Claim::new("ml", name, &format!("uid-{name}"))
}

/// Arrange for claim `name` on `devices` to be allocated right after the agent's next
/// cluster-wide LIST of claims has been read; the flag says it happened.
fn allocate_after_next_list(api: &ApiServer, name: &str, devices: &[&str]) -> Arc<AtomicBool> {
    let fired = Arc::new(AtomicBool::new(false));
    let (object, flag) = (claim_object(name, devices), fired.clone());
    api.after_next_list(ALL_CLAIMS, move |api| {
        api.put_object(CLAIMS, object);
        flag.store(true, Ordering::SeqCst);
    });
    fired
}

/// The claim is deallocated (gone from the API server) and unprepared by the kubelet.
async fn release(api: &ApiServer, kubelet: &DraKubelet, claim: &Claim) {
    assert!(api.delete_object(CLAIMS, &claim.name));
    let un = kubelet
        .unprepare(DRIVER, std::slice::from_ref(claim))
        .await
        .unwrap();
    assert!(un.values().all(|r| r.is_ok()), "{un:?}");
}

/// Three GPUs, both paths, Events on the Node: labelled `split`, GPUs 1 and 2 are the
/// DRA driver's and GPU 0 the device plugin's; the `moved` config takes GPU 1 off the
/// driver.
async fn split_node() -> (Node, DraAgent) {
    let (n, backend) = node("3xL4").await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);
    let agent = DraAgentBuilder::new(&n.dirs, backend)
        .configs(&[
            ("default", "version: v1\n"),
            ("split", "tessera: { dra: { gpus: { index: [1, 2] } } }\n"),
            ("moved", "tessera: { dra: { gpus: { index: [2] } } }\n"),
        ])
        .both_paths()
        .events_on_node(api)
        .start(api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    api.set_label("tessera.io/config", Some("split"));
    wait_dra(api, &["gpu-1", "gpu-2"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0]).await;
    (n, agent)
}

/// `--dra=auto`: no registration and no pool while the config gives DRA nothing; a label
/// that gives it a GPU registers and publishes; a label that takes it away keeps the
/// driver serving while a claim holds the GPU and withdraws it once the claim is gone; a
/// claim allocated on the GPU while it leaves (after the LIST) keeps the driver serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_dra_serves_only_while_the_node_config_gives_it_gpus() {
    let (n, backend) = node("3xL4").await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);
    let reg_socket = n
        .dirs
        .kubelet_dir
        .join("plugins_registry/gpu.tessera.io-reg.sock");
    let dra_socket = n.dirs.kubelet_dir.join("plugins/gpu.tessera.io/dra.sock");
    // A stale pool left by an earlier agent on this node is withdrawn too.
    let stale = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.tessera.io-old"},
        "spec": {"driver": DRIVER, "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-2"}]}});
    api.put_object(SLICES, stale);
    let agent = DraAgentBuilder::new(&n.dirs, backend.clone())
        .configs(&[
            ("default", "version: v1\n"),
            ("one", "tessera: { dra: { gpus: { index: [1] } } }\n"),
        ])
        .both_paths()
        .dra_mode(DraMode::Auto)
        .events_on_node(api)
        .start(api);

    // The default config gives DRA nothing: no registration, no pool, every GPU on the
    // device plugin.
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    wait_for("the stale pool deleted", || our_slices(api).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(kubelet.plugin(DRIVER).is_none(), "registered without GPUs");
    assert!(!reg_socket.exists() && !dra_socket.exists());
    assert!(our_slices(api).is_empty(), "{:?}", our_slices(api));

    // The label gives it GPU 1: registered, published; the device plugin drops GPU 1.
    api.set_label("tessera.io/config", Some("one"));
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_dra(api, &["gpu-1"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0, 2]).await;
    support::schema::validate_all(&our_slices(api), &["1.34.0", "1.35.0"]);

    // A prepared claim on GPU 1: the label goes, the driver keeps serving it.
    let train = put_claim(api, "train", &["gpu-1"]);
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&train))
        .await
        .unwrap();
    assert!(out[&train.uid].is_ok(), "{out:?}");
    api.set_label("tessera.io/config", None);
    wait_blocked(api, 1, "claim ml/train (uid uid-train)").await;
    wait_dra(api, &["gpu-1"], Slices::Published).await;
    assert!(kubelet.plugin(DRIVER).is_some());
    wait_dp(plugins, uuids, &[0, 2]).await;

    // The claim is deallocated and unprepared: GPU 1 goes to the device plugin and the
    // driver withdraws (no slice, no socket, the kubelet unregisters it).
    release(api, kubelet, &train).await;
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    kubelet.wait_unregistered(DRIVER, WAIT).await;
    wait_for("no DRA slices", || our_slices(api).is_empty()).await;
    wait_for("sockets removed", || {
        !reg_socket.exists() && !dra_socket.exists()
    })
    .await;

    // Given GPU 1 again: registered again and published.
    api.set_label("tessera.io/config", Some("one"));
    kubelet.wait_registered(DRIVER, 2, WAIT).await;
    wait_dra(api, &["gpu-1"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0, 2]).await;

    // The scheduler allocates GPU 1 right after the agent's LIST of claims when the label
    // goes: the driver does not withdraw, GPU 1 stays its own, the claim prepares.
    let lists_before = plugins.state(GPU).unwrap().lists.len();
    let fired = allocate_after_next_list(api, "late", &["gpu-1"]);
    api.set_label("tessera.io/config", None);
    let event = wait_blocked(api, 1, "claim ml/late (uid uid-late, allocated)").await;
    assert!(fired.load(Ordering::SeqCst));
    assert!(event.contains("stays with the DRA driver"), "{event}");
    wait_dra(api, &["gpu-1"], Slices::Published).await;
    let late = Claim::new("ml", "late", "uid-late");
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&late))
        .await
        .unwrap();
    assert!(out[&late.uid].is_ok(), "{out:?}");
    assert_eq!(
        kubelet.plugin(DRIVER).map(|p| p.registrations),
        Some(2),
        "never unregistered"
    );
    assert!(
        !dp_ever_listed(plugins, lists_before, &uuids[1]),
        "the device plugin listed GPU 1"
    );

    // Gone: the driver withdraws.
    release(api, kubelet, &late).await;
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    kubelet.wait_unregistered(DRIVER, WAIT).await;
    wait_for("no DRA slices", || our_slices(api).is_empty()).await;
    agent.shutdown().await;
}

/// The GPU-move race: a claim allocated on GPU 1 after the agent's LIST of claims and
/// before the slices without GPU 1 are published. After publishing them the agent lists
/// the claims again, finds it, and moves GPU 1 back: republished, never listed by the
/// device plugin, an Event names the claim, and the claim prepares. GPU 1 moves once the
/// claim is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_allocated_between_the_list_and_the_new_slices_moves_the_gpu_back() {
    let (n, agent) = split_node().await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);

    let lists_before = plugins.state(GPU).unwrap().lists.len();
    let requests_before = api.requests().len();
    let fired = allocate_after_next_list(api, "late", &["gpu-1"]);
    api.set_label("tessera.io/config", Some("moved"));
    let event = wait_blocked(api, 1, "claim ml/late (uid uid-late, allocated)").await;
    assert!(fired.load(Ordering::SeqCst), "the claim was not allocated");
    assert!(
        event.contains(&uuids[1]) && event.contains("stays with the DRA driver"),
        "{event}"
    );
    wait_dra(api, &["gpu-1", "gpu-2"], Slices::Published).await;

    // The interleaving, from the API server's log: the LIST the claim slipped past, the
    // slices without GPU 1, the second LIST that found the claim, GPU 1 republished.
    let log: Vec<String> = api.requests()[requests_before..].to_vec();
    let first = |from: usize, pred: &dyn Fn(&str) -> bool| -> usize {
        from + log[from..]
            .iter()
            .position(|r| pred(r))
            .unwrap_or_else(|| panic!("not in the log after {from}: {log:#?}"))
    };
    let is_claims_list = |r: &str| r.starts_with(&format!("GET {ALL_CLAIMS}?"));
    let is_slice_write = |r: &str| {
        (r.starts_with("PUT ") || r.starts_with("POST ") || r.starts_with("DELETE "))
            && r.contains("/resourceslices")
    };
    let list1 = first(0, &is_claims_list);
    let without = first(list1 + 1, &is_slice_write);
    let list2 = first(without + 1, &is_claims_list);
    let _republished = first(list2 + 1, &is_slice_write);

    // The claim prepares on GPU 1; the device plugin never listed GPU 1.
    let late = Claim::new("ml", "late", "uid-late");
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&late))
        .await
        .unwrap();
    assert!(out[&late.uid].is_ok(), "{out:?}");
    assert!(n.dirs.claim_spec(&late.uid).exists());
    assert!(
        !dp_ever_listed(plugins, lists_before - 1, &uuids[1]),
        "the device plugin listed GPU 1"
    );
    assert_eq!(
        blocked_events(api)
            .iter()
            .filter(|e| e.contains("GPU 1 "))
            .count(),
        1,
        "reported once"
    );

    // The claim is deallocated and unprepared: GPU 1 moves (without a reload by hand).
    release(api, kubelet, &late).await;
    wait_dra(api, &["gpu-2"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0, 1]).await;
    support::schema::validate_all(&our_slices(api), &["1.34.0", "1.35.0"]);
    agent.shutdown().await;
}

/// The binary as the DaemonSet runs it (`TESSERA_DRA=auto`, both paths, no
/// `--dra-gpus`): no DRA registration while the config gives DRA nothing; the config file
/// changed to give it GPU 0 registers and publishes; changed back, the driver withdraws
/// (after the move's settle time) and the device plugin gets GPU 0 again. SIGTERM exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_with_tessera_dra_auto_follows_the_config_file() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let (n, _) = node("2xL4").await;
    let (api, kubelet, plugins) = (&n.api, &n.kubelet, &n.plugins);
    let layouts = &n.dirs.config;
    std::fs::create_dir_all(layouts).unwrap();
    std::fs::write(layouts.join("default"), "version: v1\n").unwrap();
    let boot = n.dirs.root.join("boot_id");
    std::fs::write(&boot, "boot-1\n").unwrap();
    let log_path = n.dirs.agent_log.clone();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--gpu-backend", "fake", "--fake-gpus", "2xL4"])
        .args(["--node-name", NODE])
        .arg("--kubelet-dir")
        .arg(&n.dirs.kubelet_dir)
        .arg("--cdi-root")
        .arg(&n.dirs.cdi_root)
        .arg("--state-dir")
        .arg(&n.dirs.state_dir)
        .arg("--config")
        .arg(layouts)
        .arg("--boot-id-file")
        .arg(&boot)
        .env("TESSERA_DRA", "auto")
        .env(
            "KUBECONFIG",
            support::dra_agent::kubeconfig(&n.dirs.root, &api.url),
        )
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let reg_socket = n
        .dirs
        .kubelet_dir
        .join("plugins_registry/gpu.tessera.io-reg.sock");
    wait_dp(plugins, &n.uuids, &[0, 1]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(kubelet.plugin(DRIVER).is_none(), "{}", log());
    assert!(!reg_socket.exists());
    assert!(our_slices(api).is_empty());
    assert!(log().contains("DRA path mode"), "{}", log());

    std::fs::write(
        layouts.join("default"),
        "tessera: { dra: { gpus: { index: [0] } } }\n",
    )
    .unwrap();
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_dra(api, &["gpu-0"], Slices::Published).await;
    wait_dp(plugins, &n.uuids, &[1]).await;

    std::fs::write(layouts.join("default"), "version: v1\n").unwrap();
    wait_dp(plugins, &n.uuids, &[0, 1]).await;
    kubelet.wait_unregistered(DRIVER, WAIT).await;
    wait_for("no DRA slices", || our_slices(api).is_empty()).await;
    assert!(!reg_socket.exists());

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "{}", log());
}

fn stalled_events(api: &ApiServer) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == "GpuMoveStalled")
        .filter_map(|e| e["note"].as_str().map(String::from))
        .collect()
}

async fn wait_stalled(api: &ApiServer, gpu: usize, reason: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(e) = stalled_events(api)
            .into_iter()
            .find(|e| e.starts_with(&format!("GPU {gpu} ")) && e.contains(reason))
        {
            return e;
        }
        assert!(start.elapsed() < WAIT, "events: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The config changes while the agent is down: GPUs 1–3 were the DRA driver's, now none
/// is. At start the agent reads what survives of the old split: GPU 1 has a prepared
/// claim (checkpoint), GPU 2 a claim allocated but never prepared (API server), GPU 3
/// only the old slices. GPUs 1 and 2 stay with the driver (one Event each naming the
/// claim; the device plugin never lists them) until their claims are gone; GPU 3 moves
/// in two phases; GPU 0, never the driver's, is in the device plugin's first list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_changed_while_the_agent_was_down_does_not_take_claimed_gpus_from_the_driver() {
    let (n, backend) = node("4xL4").await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);
    let start = || {
        DraAgentBuilder::new(&n.dirs, backend.clone())
            .configs(&[
                ("default", "version: v1\n"),
                (
                    "split",
                    "tessera: { dra: { gpus: { index: [1, 2, 3] } } }\n",
                ),
            ])
            .both_paths()
            .dra_mode(DraMode::Auto)
            .events_on_node(api)
            .start(api)
    };
    api.set_label("tessera.io/config", Some("split"));
    let agent = start();
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_dra(api, &["gpu-1", "gpu-2", "gpu-3"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0]).await;
    let train = put_claim(api, "train", &["gpu-1"]);
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&train))
        .await
        .unwrap();
    assert!(out[&train.uid].is_ok(), "{out:?}");
    agent.shutdown().await;

    // While the agent is down: the scheduler allocates GPU 2 (from the slices still on
    // the API server), and the node's config is changed to give DRA nothing.
    let serve = put_claim(api, "serve", &["gpu-2"]);
    api.set_label("tessera.io/config", None);
    let agent = start();
    kubelet.wait_registered(DRIVER, 2, WAIT).await;
    wait_blocked(api, 1, "claim ml/train (uid uid-train)").await;
    wait_blocked(api, 2, "claim ml/serve (uid uid-serve, allocated)").await;
    wait_dp(plugins, uuids, &[0, 3]).await;
    wait_dra(api, &["gpu-1", "gpu-2"], Slices::Published).await;
    let first = plugins.state(GPU).unwrap().lists[0].clone();
    assert!(
        first.iter().any(|d| d.id == uuids[0]),
        "GPU 0 not in the first list: {first:?}"
    );
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&serve))
        .await
        .unwrap();
    assert!(out[&serve.uid].is_ok(), "{out:?}");
    for (i, uuid) in uuids.iter().enumerate().take(3).skip(1) {
        assert!(
            !dp_ever_listed(plugins, 0, uuid),
            "the device plugin listed GPU {i}"
        );
    }

    // The claims are gone: both GPUs move, the driver withdraws.
    for claim in [&train, &serve] {
        release(api, kubelet, claim).await;
    }
    wait_dp(plugins, uuids, &[0, 1, 2, 3]).await;
    kubelet.wait_unregistered(DRIVER, WAIT).await;
    wait_for("no DRA slices", || our_slices(api).is_empty()).await;
    assert!(stalled_events(api).is_empty(), "{:?}", stalled_events(api));
    agent.shutdown().await;
}

/// Without the API server at start the agent cannot tell which GPUs the driver had: the
/// GPUs the config gives to the device plugin wait (on neither path, a `GpuMoveStalled`
/// Event each) until it answers, then go to the device plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_start_without_the_api_server_gpus_wait_until_it_answers() {
    let (n, backend) = node("2xL4").await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);
    api.fail_requests(&["GET"], ALL_CLAIMS);
    let agent = DraAgentBuilder::new(&n.dirs, backend.clone())
        .both_paths()
        .dra_mode(DraMode::Auto)
        .events_on_node(api)
        .start(api);
    let event = wait_stalled(api, 0, "the API server does not answer").await;
    assert!(event.contains(&uuids[0]), "{event}");
    wait_stalled(api, 1, "the API server does not answer").await;
    assert!(!dp_ever_listed(plugins, 0, &uuids[0]) && !dp_ever_listed(plugins, 0, &uuids[1]));
    assert!(kubelet.plugin(DRIVER).is_none(), "the driver registered");
    api.stop_failing();
    wait_dp(plugins, uuids, &[0, 1]).await;
    assert!(kubelet.plugin(DRIVER).is_none(), "the driver registered");
    agent.shutdown().await;
}

/// Phase 2 that cannot finish is reported, not silent: while the driver cannot write its
/// slices, GPU 1 (leaving it) stays on neither path and one `GpuMoveStalled` Event names
/// it and the reason; once writes work, it moves. The same when the claims LIST of phase 2
/// fails (GPU 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_move_off_the_driver_is_reported_and_retried() {
    let (n, agent) = split_node().await;
    let (api, plugins, uuids) = (&n.api, &n.plugins, &n.uuids);

    // The driver's slice writes fail: the slices keep naming GPU 1.
    let lists_before = plugins.state(GPU).unwrap().lists.len();
    api.fail_requests(&["POST", "PUT", "DELETE"], SLICES);
    api.set_label("tessera.io/config", Some("moved"));
    let event = wait_stalled(api, 1, "ResourceSlices on the API server still name it").await;
    assert!(
        event.contains(&uuids[1]) && event.contains("neither kubelet path"),
        "{event}"
    );
    // Retried, still reported once, never on the device plugin meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stalled_events(api).len(), 1, "{:?}", stalled_events(api));
    assert!(!dp_ever_listed(plugins, lists_before - 1, &uuids[1]));
    assert_eq!(
        dra_devices(api),
        Some(["gpu-1", "gpu-2"].map(String::from).into())
    );
    api.stop_failing();
    wait_dra(api, &["gpu-2"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0, 1]).await;

    // The claims LIST of phase 2 fails (it answers the reload's LIST, then fails).
    let lists_before = plugins.state(GPU).unwrap().lists.len();
    api.after_next_list(ALL_CLAIMS, |api| api.fail_requests(&["GET"], ALL_CLAIMS));
    api.set_label("tessera.io/config", None);
    let event = wait_stalled(api, 2, "the API server does not answer").await;
    assert!(event.contains("ResourceClaims"), "{event}");
    wait_dra(api, &[], Slices::Published).await;
    assert!(!dp_ever_listed(plugins, lists_before, &uuids[2]));
    api.stop_failing();
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    assert_eq!(stalled_events(api).len(), 2, "{:?}", stalled_events(api));
    agent.shutdown().await;
}

fn split_record(n: &Node) -> std::path::PathBuf {
    tessera::agent::split_record::path_in(&n.dirs.checkpoint_dir())
}

fn recorded_dra(n: &Node) -> Option<std::collections::BTreeSet<String>> {
    tessera::agent::split_record::read(&split_record(n))
        .ok()
        .map(|r| r.dra)
}

/// The split the agent put in force is recorded (`<state-dir>/dra/split.json`) and read
/// at the next start, so the config changing while the agent is down moves exactly the
/// GPUs the driver had. GPU 1 left the driver earlier (its move confirmed); a claim the
/// scheduler then allocated on it from stale slices stays refused. With the record the
/// next start gives GPU 1 to the device plugin at once (in its first list, no Event) and
/// moves only GPU 2, the driver's, in two phases. Without the record, the kubelet's
/// checkpoint (`RegisteredDevices`, rewritten after each device list) still shows GPU 1
/// as the device plugin's: it stays there, no Event. Without either record, or with a
/// corrupt split record, the start infers the split: the allocated claim makes GPU 1 look
/// like the driver's, so it stays with the driver (the limit the records remove), and the
/// agent writes a valid record again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_split_decides_the_start_and_inference_is_the_fallback() {
    let (n, backend) = node("3xL4").await;
    let (api, kubelet, plugins, uuids) = (&n.api, &n.kubelet, &n.plugins, &n.uuids);
    let start = || {
        DraAgentBuilder::new(&n.dirs, backend.clone())
            .configs(&[
                ("default", "version: v1\n"),
                ("split", "tessera: { dra: { gpus: { index: [1, 2] } } }\n"),
                ("moved", "tessera: { dra: { gpus: { index: [2] } } }\n"),
            ])
            .both_paths()
            .dra_mode(DraMode::Auto)
            .events_on_node(api)
            .start(api)
    };
    api.set_label("tessera.io/config", Some("split"));
    let agent = start();
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_dra(api, &["gpu-1", "gpu-2"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0]).await;
    let want: std::collections::BTreeSet<String> = [uuids[1].clone(), uuids[2].clone()].into();
    wait_for("the split recorded", || {
        recorded_dra(&n) == Some(want.clone())
    })
    .await;
    api.set_label("tessera.io/config", Some("moved"));
    wait_dra(api, &["gpu-2"], Slices::Published).await;
    wait_dp(plugins, uuids, &[0, 1]).await;
    let want: std::collections::BTreeSet<String> = [uuids[2].clone()].into();
    wait_for("the move recorded", || {
        recorded_dra(&n) == Some(want.clone())
    })
    .await;
    // Allocated from slices the scheduler had not seen change: refused, GPU 1 stays.
    let late = put_claim(api, "late", &["gpu-1"]);
    let out = kubelet
        .prepare(DRIVER, std::slice::from_ref(&late))
        .await
        .unwrap();
    assert!(out[&late.uid].is_err(), "{out:?}");
    agent.shutdown().await;
    assert_eq!(recorded_dra(&n), Some(want), "the record after SIGTERM");

    // Down: the config gives DRA nothing. Record present: GPU 1 was the device plugin's.
    api.set_label("tessera.io/config", None);
    let agent = start();
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    // The device plugin registers anew: its lists start over.
    let first = plugins.state(GPU).unwrap().lists[0].clone();
    assert!(
        first.iter().any(|d| d.id == uuids[1]) && !first.iter().any(|d| d.id == uuids[2]),
        "the first list after the start: GPU 1 at once, GPU 2 after its two phases: {first:?}"
    );
    assert!(blocked_events(api).is_empty(), "{:?}", blocked_events(api));
    wait_for("no DRA slices", || our_slices(api).is_empty()).await;
    agent.shutdown().await;
    assert_eq!(recorded_dra(&n), Some(Default::default()));

    // Record absent, the kubelet's checkpoint kept: GPU 1 was the device plugin's.
    std::fs::remove_file(split_record(&n)).unwrap();
    let agent = start();
    wait_dp(plugins, uuids, &[0, 1, 2]).await;
    wait_for("a valid record again", || {
        recorded_dra(&n) == Some(Default::default())
    })
    .await;
    assert!(blocked_events(api).is_empty(), "{:?}", blocked_events(api));
    assert!(our_slices(api).is_empty());
    agent.shutdown().await;

    // Both records absent, then the split record corrupt: inferred from the claim
    // allocated on GPU 1.
    let kubelet_checkpoint = n
        .dirs
        .kubelet_dir
        .join("device-plugins/kubelet_internal_checkpoint");
    for (case, damage) in [
        ("absent", None),
        (
            "corrupt",
            Some(&b"{\"version\":1,\"checksum\":\"0\",\"da"[..]),
        ),
    ] {
        match damage {
            None => std::fs::remove_file(split_record(&n)).unwrap(),
            Some(bytes) => std::fs::write(split_record(&n), bytes).unwrap(),
        }
        // (Not there when the last start ended before its device plugin's first list.)
        if let Err(e) = std::fs::remove_file(&kubelet_checkpoint) {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        }
        // Events of earlier starts are gone: the one found is this start's.
        for e in api.events() {
            let name = e["metadata"]["name"].as_str().unwrap().to_string();
            api.delete_object("/apis/events.k8s.io/v1/namespaces/default/events", &name);
        }
        let agent = start();
        let event = wait_blocked(api, 1, "claim ml/late (uid uid-late, allocated)").await;
        assert!(event.contains(&uuids[1]), "{case}: {event}");
        wait_dra(api, &["gpu-1"], Slices::Published).await;
        let want: std::collections::BTreeSet<String> = [uuids[1].clone()].into();
        wait_for("a valid record again", || {
            recorded_dra(&n) == Some(want.clone())
        })
        .await;
        agent.shutdown().await;
    }
}

/// LISTs of this node's slices (not WATCHes) the API server has answered or failed.
fn slice_lists(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with(&format!("GET {SLICES}?")) && !r.contains("watch=true"))
        .count()
}

/// Phase 2 follows the API server's slices with a WATCH instead of polling: while the
/// driver cannot write its slices, the agent (and the publisher's retries) LIST them a
/// handful of times in 1.5 s, not every 100 ms (15 times: the poll this replaced). The watch is then dropped (a compaction:
/// `410 Gone`) and watching again fails for a while (every GET of slices answers 500);
/// once the API server answers, the move completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phase_two_follows_a_watch_and_a_dropped_watch_strands_nothing() {
    let (n, agent) = split_node().await;
    let (api, plugins, uuids) = (&n.api, &n.plugins, &n.uuids);
    let watches = |api: &ApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.starts_with(&format!("GET {SLICES}?")) && r.contains("watch=true"))
            .count()
    };
    let lists_before = plugins.state(GPU).unwrap().lists.len();
    api.fail_requests(&["POST", "PUT", "DELETE"], SLICES);
    let watching = watches(api);
    api.set_label("tessera.io/config", Some("moved"));
    // The publisher, failing, retries with backoff and does not watch meanwhile.
    wait_for("phase 2 watching the slices", || watches(api) > watching).await;
    let lists = slice_lists(api);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let polled = slice_lists(api) - lists;
    assert!(
        polled <= 8,
        "the slices were LISTed {polled} times in 1.5 s: {:#?}",
        api.requests()
    );
    assert!(!dp_ever_listed(plugins, lists_before - 1, &uuids[1]));

    // The watch is dropped and cannot be had again for a while.
    api.fail_requests(&["GET"], SLICES);
    api.compact();
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.stop_failing();
    wait_dra(api, &["gpu-2"], Slices::Published).await;
    // (Held on neither path for ~2 s by the failing writes, it may have been reported
    // stalled meanwhile: that is the stall report doing its job.)
    wait_dp(plugins, uuids, &[0, 1]).await;
    agent.shutdown().await;
}
