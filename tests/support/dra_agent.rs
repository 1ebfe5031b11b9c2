//! Runs the node agent with the DRA path in-process (`agent::run_with`, the code behind
//! `tessera node --dra`), on fake GPUs, against the API-server double, in a directory that
//! survives restarts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::agent::dra::DraSettings;
use tessera::agent::ownership::{DraMode, Ownership};
use tessera::agent::{self, AgentOptions, LogRecorder, Paths};
use tessera::deviceplugin::allocate::AllocateSettings;
use tessera::dra::registration::RetryPolicy;
use tessera::dra::slices::CounterLayout;
use tessera::gpu::GpuBackend;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::apiserver::ApiServer;

pub const NODE: &str = "node-a";

/// Where one node's agent keeps its files (reused across restarts).
#[derive(Clone, Debug)]
pub struct NodeDirs {
    pub root: PathBuf,
    pub kubelet_dir: PathBuf,
    pub cdi_root: PathBuf,
    pub state_dir: PathBuf,
    pub config: PathBuf,
    /// Where [`spawn_binary`] appends the agent's stderr.
    pub agent_log: PathBuf,
}

impl NodeDirs {
    pub fn under(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            kubelet_dir: root.join("kubelet"),
            cdi_root: root.join("cdi"),
            state_dir: root.join("state"),
            config: root.join("layouts"),
            agent_log: root.join("agent.log"),
        }
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.state_dir.join("dra")
    }

    pub fn claim_spec(&self, uid: &str) -> PathBuf {
        self.cdi_root.join(format!("tessera.io-claim-{uid}.json"))
    }
}

/// How to start an agent.
pub struct DraAgentBuilder {
    pub dirs: NodeDirs,
    pub backend: Arc<dyn GpuBackend>,
    /// Named configs (file name → YAML); the node's `tessera.io/config` label picks one.
    pub configs: Vec<(String, String)>,
    pub device_plugin: bool,
    pub dra_gpus: Option<String>,
    pub boot_id: String,
    pub counters: CounterLayout,
    /// Where rejected configs and blocked GPU moves go (default: the log only).
    pub recorder: Option<Arc<dyn tessera::agent::EventRecorder>>,
    /// `--dra` (default `on`, as these tests were written for).
    pub dra: DraMode,
    /// [`DraSettings::move_settle`] (default 20 ms).
    pub move_settle: std::time::Duration,
    /// [`DraSettings::move_stall_warn`] (default 2 s: long enough that a move slowed by a
    /// loaded CI machine is not reported as stalled in tests that assert no stall).
    pub move_stall_warn: std::time::Duration,
}

impl DraAgentBuilder {
    pub fn new(dirs: &NodeDirs, backend: Arc<dyn GpuBackend>) -> Self {
        Self {
            dirs: dirs.clone(),
            backend,
            configs: vec![("default".into(), "version: v1\n".into())],
            device_plugin: false,
            dra_gpus: None,
            boot_id: "boot-1".into(),
            counters: CounterLayout::Separate,
            recorder: None,
            dra: DraMode::On,
            move_settle: std::time::Duration::from_millis(20),
            move_stall_warn: std::time::Duration::from_secs(2),
        }
    }

    /// `--dra` as given (`auto`: registered and published only while it owns a GPU).
    pub fn dra_mode(mut self, mode: DraMode) -> Self {
        self.dra = mode;
        self
    }

    pub fn configs(mut self, configs: &[(&str, &str)]) -> Self {
        self.configs = configs
            .iter()
            .map(|(n, y)| (n.to_string(), y.to_string()))
            .collect();
        self
    }

    /// Both paths on; the DRA driver owns `dra_gpus`.
    pub fn side_by_side(mut self, dra_gpus: &str) -> Self {
        self.device_plugin = true;
        self.dra_gpus = Some(dra_gpus.into());
        self
    }

    /// Both paths on without `--dra-gpus`: the node config's `tessera.dra.gpus` splits
    /// the GPUs.
    pub fn both_paths(mut self) -> Self {
        self.device_plugin = true;
        self.dra_gpus = None;
        self
    }

    /// Record Events on the Node in the API server (as in a cluster).
    pub fn events_on_node(mut self, api: &ApiServer) -> Self {
        self.recorder = Some(Arc::new(tessera::agent::cluster::KubeEventRecorder::new(
            api.client(),
            NODE.into(),
        )));
        self
    }

    pub fn boot_id(mut self, id: &str) -> Self {
        self.boot_id = id.into();
        self
    }

    /// Start on the current runtime; the node label is watched on `api` like in a cluster.
    pub fn start(self, api: &ApiServer) -> DraAgent {
        std::fs::create_dir_all(&self.dirs.config).unwrap();
        for (name, yaml) in &self.configs {
            std::fs::write(self.dirs.config.join(name), yaml).unwrap();
        }
        let cancel = CancellationToken::new();
        let client = api.client();
        let (label_tx, label_rx) = tokio::sync::watch::channel(None);
        tokio::spawn(tessera::agent::cluster::watch_config_label(
            client.clone(),
            NODE.to_string(),
            label_tx,
            cancel.clone(),
        ));
        let mut allocate = AllocateSettings::with_state_dir(&self.dirs.state_dir);
        // The driver's MIG capability table, as a node with these GPUs has it.
        let gpus = self
            .backend
            .inventory()
            .map_or(0, |i| i.gpus.len() as u32)
            .max(8);
        allocate.mig_caps =
            tessera::cdi::migcaps::write_synthetic(&self.dirs.root.join("proc"), gpus, 508)
                .unwrap();
        // A stand-in for the shim library the agent installs at start (vGPU needs one).
        let stand_in = self.dirs.root.join("libtessera_cuda.so");
        std::fs::write(&stand_in, b"stand-in for libtessera_cuda.so").unwrap();
        allocate
            .shim
            .install(&stand_in, &allocate.shim_container_path)
            .unwrap();
        let opts = AgentOptions {
            kubelet_dir: self.dirs.kubelet_dir.clone(),
            cdi_root: self.dirs.cdi_root.clone(),
            config_path: Some(self.dirs.config.clone()),
            config_name: None,
            dev_root: "/dev".into(),
            allocate: allocate.clone(),
            metrics: Arc::new(tessera::metrics::NodeMetrics::new()),
            cdi_verify_interval: std::time::Duration::from_secs(60),
            vgpu_record: None,
            slot_binding: None,
            advertised: None,
        };
        let paths = Paths {
            ownership: Ownership::with_mode(self.device_plugin, self.dra, self.dra_gpus.as_deref())
                .unwrap(),
            dra: Some(DraSettings {
                client,
                node_name: NODE.into(),
                kubelet_dir: self.dirs.kubelet_dir.clone(),
                cdi_root: self.dirs.cdi_root.clone(),
                checkpoint_dir: self.dirs.checkpoint_dir(),
                boot_id: self.boot_id.clone(),
                counters: self.counters,
                allocate,
                retry: RetryPolicy::default(),
                move_settle: self.move_settle,
                move_stall_warn: self.move_stall_warn,
            }),
        };
        let (_reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(agent::run_with(
            self.backend.clone(),
            opts,
            self.recorder.unwrap_or_else(|| Arc::new(LogRecorder)),
            agent::Triggers {
                reload: reload_rx,
                config_label: Some(label_rx),
            },
            paths,
            cancel.clone(),
        ));
        DraAgent {
            dirs: self.dirs,
            cancel,
            task,
            _reload: _reload_tx,
        }
    }
}

pub struct DraAgent {
    pub dirs: NodeDirs,
    pub cancel: CancellationToken,
    pub task: JoinHandle<agent::Result<()>>,
    _reload: tokio::sync::mpsc::UnboundedSender<()>,
}

impl DraAgent {
    /// Graceful stop (SIGTERM).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
    }

    /// Killed (SIGKILL): nothing runs any more, nothing is cleaned up.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        // The label watcher and the DRA tasks are separate tasks: stop them too, as the
        // process would be gone (without their cleanup mattering: sockets stay behind).
        self.cancel.cancel();
    }
}

/// A kubeconfig pointing at the API-server double (no auth), for the `tessera` binary.
pub fn kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster: {{ server: \"{url}\" }}\n\
         users:\n- name: test\n  user: {{}}\ncontexts:\n- name: double\n  context: {{ cluster: double, user: test }}\n\
         current-context: double\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Start the `tessera` binary (`bin`) as `tessera node --dra` for [`NODE`] on `gpus`, DRA
/// only, with the configs already in `dirs.config`; `boot_id` is written to a file the
/// agent reads.
pub fn spawn_binary(
    bin: &str,
    dirs: &NodeDirs,
    api: &ApiServer,
    gpus: &str,
    boot_id: &str,
) -> std::process::Child {
    std::fs::create_dir_all(&dirs.config).unwrap();
    if std::fs::read_dir(&dirs.config).unwrap().next().is_none() {
        std::fs::write(dirs.config.join("default"), "version: v1\n").unwrap();
    }
    // The driver's MIG capability table, as a node with these GPUs has it.
    let proc_root = dirs.root.join("proc");
    tessera::cdi::migcaps::write_synthetic(&proc_root, 32, 508).unwrap();
    let boot_file = dirs.root.join("boot_id");
    std::fs::write(&boot_file, format!("{boot_id}\n")).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&dirs.agent_log)
        .unwrap();
    std::process::Command::new(bin)
        .args(["node", "--gpu-backend", "fake", "--fake-gpus", gpus])
        .args(["--dra", "--device-plugin=false", "--node-name", NODE])
        .arg("--kubelet-dir")
        .arg(&dirs.kubelet_dir)
        .arg("--cdi-root")
        .arg(&dirs.cdi_root)
        .arg("--state-dir")
        .arg(&dirs.state_dir)
        .arg("--config")
        .arg(&dirs.config)
        .arg("--boot-id-file")
        .arg(&boot_file)
        .arg("--proc-root")
        .arg(&proc_root)
        .env("KUBECONFIG", kubeconfig(&dirs.root, &api.url))
        .env(
            "RUST_LOG",
            std::env::var("TESSERA_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        // A file, not a pipe nobody drains: a full pipe would stall the agent.
        .stderr(log)
        .spawn()
        .unwrap()
}

/// What the binaries started by [`spawn_binary`] in `dirs` logged (appended).
pub fn binary_log(dirs: &NodeDirs) -> String {
    std::fs::read_to_string(&dirs.agent_log).unwrap_or_default()
}

/// A ResourceClaim in namespace `ml` for class `class`, allocated `results` (the
/// scheduler's `status.allocation.devices.results`), as the API server would hold it.
pub fn allocated_claim(
    name: &str,
    uid: &str,
    class: &str,
    results: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })
}
