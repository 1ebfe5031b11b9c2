//! Runs the node agent in-process on the fake backend, in temporary directories.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tessera::agent::{self, AgentOptions, EventRecorder};
use tessera::deviceplugin::allocate::AllocateSettings;
use tessera::gpu::fake::FakeBackend;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Records rejected-config events (stands in for Events on the Node).
#[derive(Default)]
pub struct Events(pub Mutex<Vec<String>>);

impl EventRecorder for Events {
    fn config_rejected(&self, message: &str) {
        self.0.lock().unwrap().push(message.to_string());
    }
}

pub struct RunningAgent {
    pub backend: Arc<FakeBackend>,
    pub metrics: Arc<tessera::metrics::NodeMetrics>,
    pub events: Arc<Events>,
    pub reload: mpsc::UnboundedSender<()>,
    pub cancel: CancellationToken,
    pub task: JoinHandle<agent::Result<()>>,
    pub kubelet_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_root: PathBuf,
    pub state_dir: PathBuf,
    pub config_path: Option<PathBuf>,
    _tmp: Option<tempfile::TempDir>,
}

pub struct AgentBuilder {
    pub gpus: String,
    pub config: Option<String>,
    pub config_name: Option<String>,
    pub root: Option<PathBuf>,
    pub label: Option<tokio::sync::watch::Receiver<Option<String>>>,
    pub named: Vec<(String, String)>,
    /// Replaces the recording double (e.g. with the Kubernetes Event recorder).
    pub recorder: Option<Arc<dyn EventRecorder>>,
    /// See `AgentOptions::cdi_verify_interval`.
    pub cdi_verify_interval: std::time::Duration,
    /// See `AgentOptions::vgpu_record` (the API-server double and the node's name).
    pub vgpu_record: Option<tessera::agent::vgpu_record::RecordSettings>,
    /// See `AgentOptions::slot_binding` (API-server double, PodResources socket).
    pub slot_binding: Option<tessera::agent::slot_binding::BindingSettings>,
    /// See `AgentOptions::advertised` (the usage sampler's feed).
    pub advertised:
        Option<tokio::sync::watch::Sender<tessera::deviceplugin::snapshot::SharedSnapshot>>,
}

impl AgentBuilder {
    pub fn new(gpus: &str) -> Self {
        Self {
            gpus: gpus.to_string(),
            config: None,
            config_name: None,
            root: None,
            label: None,
            named: Vec::new(),
            recorder: None,
            cdi_verify_interval: std::time::Duration::from_secs(60),
            vgpu_record: None,
            slot_binding: None,
            advertised: None,
        }
    }

    /// The default config file's content.
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = Some(yaml.to_string());
        self
    }

    /// Configs are a directory of named files; the node label picks one.
    pub fn named_configs(
        mut self,
        configs: &[(&str, &str)],
        label: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Self {
        self.named = configs
            .iter()
            .map(|(n, y)| (n.to_string(), y.to_string()))
            .collect();
        self.label = Some(label);
        self
    }

    /// Reuse a directory (to restart an agent over the same state).
    pub fn root(mut self, root: PathBuf) -> Self {
        self.root = Some(root);
        self
    }

    pub fn start(self) -> RunningAgent {
        let (tmp, root) = match self.root {
            Some(r) => (None, r),
            None => {
                let t = tempfile::tempdir().unwrap();
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let kubelet_dir = root.join("kubelet");
        let plugin_dir = kubelet_dir.join("device-plugins");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        let cdi_root = root.join("cdi");
        let state_dir = root.join("state");
        let config_path = self.config.map(|yaml| {
            let dir = root.join("config");
            std::fs::create_dir_all(&dir).unwrap();
            let p = dir.join("config.yaml");
            std::fs::write(&p, yaml).unwrap();
            p
        });
        let config_path = if self.named.is_empty() {
            config_path
        } else {
            let dir = root.join("layouts");
            std::fs::create_dir_all(&dir).unwrap();
            for (name, yaml) in &self.named {
                std::fs::write(dir.join(name), yaml).unwrap();
            }
            Some(dir)
        };
        let backend = Arc::new(FakeBackend::from_arg(&self.gpus).unwrap());
        let events = Arc::new(Events::default());
        let metrics = Arc::new(tessera::metrics::NodeMetrics::new());
        let (reload, reload_rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let opts = AgentOptions {
            kubelet_dir: kubelet_dir.clone(),
            cdi_root: cdi_root.clone(),
            config_path: config_path.clone(),
            config_name: self.config_name,
            dev_root: "/dev".into(),
            allocate: AllocateSettings {
                // The driver's MIG capability table, as a node with 8 GPUs has it.
                mig_caps: tessera::cdi::migcaps::write_synthetic(&root.join("proc"), 8, 508)
                    .unwrap(),
                ..AllocateSettings::with_state_dir(&state_dir)
            },
            metrics: metrics.clone(),
            cdi_verify_interval: self.cdi_verify_interval,
            vgpu_record: self.vgpu_record,
            slot_binding: self.slot_binding,
            advertised: self.advertised,
        };
        // A stand-in for the shim library the agent installs at start (vGPU needs one).
        let stand_in = root.join("libtessera_cuda.so");
        std::fs::write(&stand_in, b"stand-in for libtessera_cuda.so").unwrap();
        opts.allocate
            .shim
            .install(&stand_in, &opts.allocate.shim_container_path)
            .unwrap();
        let task = tokio::spawn(agent::run(
            backend.clone(),
            opts,
            self.recorder.unwrap_or_else(|| events.clone()),
            agent::Triggers {
                reload: reload_rx,
                config_label: self.label,
            },
            cancel.clone(),
        ));
        RunningAgent {
            backend,
            metrics,
            events,
            reload,
            cancel,
            task,
            kubelet_dir,
            plugin_dir,
            cdi_root,
            state_dir,
            config_path,
            _tmp: tmp,
        }
    }
}

impl RunningAgent {
    /// Stop the agent and wait for it.
    pub async fn shutdown(self) -> Option<tempfile::TempDir> {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
        self._tmp
    }

    pub fn write_config(&self, yaml: &str) {
        let p = self
            .config_path
            .as_ref()
            .expect("agent started with a config");
        // Replace atomically, as a ConfigMap update does.
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(tmp, p).unwrap();
    }

    pub fn sockets(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.plugin_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("tessera-"))
            .collect();
        v.sort();
        v
    }
}
