//! The what-if knobs of a fleet run, validated (every refusal names the knob), and the
//! three fleets compared on the same demand and the same GPUs.

use serde::Serialize;

use crate::autoscale::Coupling;
use crate::partition::catalog;
use crate::placement::PolicyKind;
use crate::quota::Time;

const HOUR: Time = 3_600_000;
/// The placement engine keeps a request's allowed models as a 64-bit set.
const MAX_MODELS: usize = 64;

/// A knob with a value that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{knob}: {reason}")]
pub struct InvalidKnob {
    pub knob: &'static str,
    pub reason: String,
}

/// Nodes of one GPU model (`--gpu-models H100-80GB:384,A100-40GB:128`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelNodes {
    pub model: String,
    pub nodes: u32,
}

/// What a fleet run is asked to do (the CLI's flags, defaults documented in
/// `docs/fleet-simulation.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Knobs {
    /// GPUs in the fleet (all three fleets get the same).
    pub gpus: u32,
    pub gpus_per_node: u8,
    /// The fleet's nodes per GPU model, in order (the dedicated inference pool takes
    /// the first nodes, the MIG nodes are the last); their GPUs add up to `gpus`.
    pub gpu_models: Vec<ModelNodes>,
    /// Tessera's fleet only: this many of the last nodes are laid out in MIG
    /// (`mode: mig`, every GPU cut by `mig_layout`); 0: none.
    pub mig_nodes: u32,
    /// The named MIG layout of each GPU of a MIG node (`balanced`, `all-1g.10gb`, ...:
    /// the MIG catalog's names), resolved per model.
    pub mig_layout: String,
    /// Simulated time, in days of the inference trace from its start.
    pub days: f64,
    /// Hours at the start left out of the time averages (the fleet filling up).
    pub warmup_hours: f64,
    /// Inference's nominal quota in the shared fleets, as a share of the fleet; `None`:
    /// the dedicated inference pool's size (its peak, rounded up to whole nodes).
    pub inference_share: Option<f64>,
    /// Training work offered, as a multiple of the GPUs inference leaves on average.
    pub training_load: f64,
    /// Scalers' `pollingInterval`, seconds.
    pub polling_s: u32,
    /// Demand units per replica at which a replica is full (the trigger's threshold):
    /// 0.9 keeps 10 % headroom.
    pub replica_target: f64,
    /// Tessera's fleet's scaling: coupled with quota (its own), or `Off` (KEDA + HPA's,
    /// a what-if that isolates the coupling from fractional GPUs and placement).
    pub tessera_coupling: Coupling,
    /// Coupled scalers' `preemption.persistSeconds`.
    pub persist_s: u32,
    /// Coupled scalers' `preemption.holdFreedSeconds` (0 here by default: the fleet's
    /// services share one ClusterQueue, whose hold would keep the peak of all of them).
    pub hold_s: u32,
    /// Checkpoint interval, minutes: log-uniform between the two.
    pub checkpoint_min: (f64, f64),
    /// Training queue's `minimumRuntime`, minutes (0: none).
    pub min_runtime_min: f64,
    /// GPUs at the busiest minute of the two Azure LLM services (conversation and
    /// code, half each; 0: none), whose load is the Azure LLM inference trace 2023
    /// tiled under a diurnal envelope.
    pub llm_peak_gpus: u32,
    /// The envelope's low point at 02:00, as a share of its 14:00 peak.
    pub llm_trough: f64,
    pub seed: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            gpus: 4096,
            gpus_per_node: 8,
            gpu_models: vec![ModelNodes {
                model: "H100-80GB".into(),
                nodes: 512,
            }],
            mig_nodes: 0,
            mig_layout: "balanced".into(),
            days: 7.0,
            warmup_hours: 6.0,
            inference_share: None,
            training_load: 1.2,
            polling_s: 15,
            replica_target: 0.9,
            tessera_coupling: Coupling::Quota,
            persist_s: 0,
            hold_s: 0,
            checkpoint_min: (5.0, 30.0),
            min_runtime_min: 0.0,
            llm_peak_gpus: 0,
            llm_trough: 0.2,
            seed: 42,
        }
    }
}

impl Knobs {
    /// Refuses values that cannot run, naming the knob.
    pub fn validate(&self) -> Result<(), InvalidKnob> {
        let bad = |knob, reason: &str| {
            Err(InvalidKnob {
                knob,
                reason: reason.to_string(),
            })
        };
        let finite_pos = |v: f64| v.is_finite() && v > 0.0;
        if self.gpus_per_node == 0 || self.gpus_per_node > 16 {
            return bad("gpus-per-node", "must be 1 to 16");
        }
        if self.gpus == 0 || !self.gpus.is_multiple_of(u32::from(self.gpus_per_node)) {
            return bad(
                "gpus",
                &format!(
                    "must be a positive multiple of --gpus-per-node ({})",
                    self.gpus_per_node
                ),
            );
        }
        if self.gpus > 200_000 {
            return bad("gpus", "at most 200000");
        }
        self.validate_models()?;
        if !(finite_pos(self.days) && self.days <= 31.0) {
            return bad(
                "days",
                "must be more than 0 and at most 31 (the trace's length)",
            );
        }
        if !(self.warmup_hours.is_finite()
            && self.warmup_hours >= 0.0
            && self.warmup_hours < self.days * 24.0)
        {
            return bad(
                "warmup-hours",
                "must be at least 0 and shorter than the run",
            );
        }
        if let Some(s) = self.inference_share {
            if !(s.is_finite() && s > 0.0 && s < 1.0) {
                return bad("inference-share", "must be between 0 and 1 (exclusive)");
            }
        }
        if !(self.training_load.is_finite() && (0.0..=20.0).contains(&self.training_load)) {
            return bad("training-load", "must be 0 to 20");
        }
        if self.polling_s == 0 || self.polling_s > 3600 {
            return bad("polling", "must be 1 to 3600 seconds");
        }
        if !(finite_pos(self.replica_target) && self.replica_target <= 100.0) {
            return bad("replica-target", "must be more than 0 and at most 100");
        }
        if self.persist_s > 86_400 {
            return bad("persist", "at most 86400 seconds");
        }
        if self.hold_s > 86_400 {
            return bad("hold", "at most 86400 seconds");
        }
        let (lo, hi) = self.checkpoint_min;
        if !(finite_pos(lo) && finite_pos(hi) && lo <= hi && hi <= 24.0 * 60.0) {
            return bad(
                "checkpoint",
                "must be MIN[-MAX] minutes, 0 < MIN <= MAX <= 1440",
            );
        }
        if !(self.min_runtime_min.is_finite()
            && self.min_runtime_min >= 0.0
            && self.min_runtime_min <= 24.0 * 60.0)
        {
            return bad("min-runtime", "must be 0 to 1440 minutes");
        }
        if self.llm_peak_gpus > self.gpus {
            return bad("llm-peak-gpus", "more than the fleet's GPUs");
        }
        if !(self.llm_trough.is_finite() && (0.0..=1.0).contains(&self.llm_trough)) {
            return bad("llm-trough", "must be 0 to 1 (a share of the peak)");
        }
        Ok(())
    }

    /// Nodes and MIG: every model named once, the nodes adding up to `--gpus`, MIG
    /// nodes only of models with a MIG catalog and a layout the catalog accepts.
    fn validate_models(&self) -> Result<(), InvalidKnob> {
        let bad = |knob, reason: String| Err(InvalidKnob { knob, reason });
        if self.gpu_models.is_empty() {
            return bad("gpu-models", "names no model".into());
        }
        if self.gpu_models.len() > MAX_MODELS {
            return bad("gpu-models", format!("at most {MAX_MODELS} models"));
        }
        let mut nodes = 0u64;
        for (i, m) in self.gpu_models.iter().enumerate() {
            let name = m.model.trim();
            if name.is_empty() || name.contains([',', ':', '|']) {
                return bad("gpu-models", format!("`{}` is not a model name", m.model));
            }
            if m.nodes == 0 {
                return bad("gpu-models", format!("{name}: 0 nodes"));
            }
            if self.gpu_models[..i].iter().any(|o| o.model.trim() == name) {
                return bad("gpu-models", format!("{name} is named twice"));
            }
            nodes += u64::from(m.nodes);
        }
        if nodes * u64::from(self.gpus_per_node) != u64::from(self.gpus) {
            return bad(
                "gpus",
                format!(
                    "{} GPUs, but the models' nodes hold {} ({nodes} nodes × {})",
                    self.gpus,
                    nodes * u64::from(self.gpus_per_node),
                    self.gpus_per_node
                ),
            );
        }
        if u64::from(self.mig_nodes) >= nodes {
            return bad(
                "mig-nodes",
                format!(
                    "{} of {nodes} nodes: leave some outside MIG",
                    self.mig_nodes
                ),
            );
        }
        let mut seen: Vec<&str> = Vec::new();
        for model in self
            .node_models()
            .skip((nodes - u64::from(self.mig_nodes)) as usize)
        {
            if seen.contains(&model) {
                continue;
            }
            seen.push(model);
            let Some(cat) = catalog::lookup(model, 0) else {
                return bad(
                    "mig-nodes",
                    format!("{model} has no MIG profiles (the MIG nodes are the last {} of --gpu-models)", self.mig_nodes),
                );
            };
            if let Err(e) = cat.named_layout(&self.mig_layout) {
                return bad("mig-layout", e.to_string());
            }
        }
        Ok(())
    }

    /// A fleet of `gpus` GPUs of one model.
    pub fn one_model(mut self, model: &str) -> Self {
        let per_node = u32::from(self.gpus_per_node.max(1));
        self.gpu_models = vec![ModelNodes {
            model: model.to_string(),
            nodes: self.gpus / per_node,
        }];
        self
    }

    /// Each node's GPU model, in node order.
    pub fn node_models(&self) -> impl Iterator<Item = &str> {
        self.gpu_models
            .iter()
            .flat_map(|m| std::iter::repeat_n(m.model.trim(), m.nodes as usize))
    }

    /// The fleet's model names, in `--gpu-models` order.
    pub fn model_names(&self) -> Vec<&str> {
        self.gpu_models.iter().map(|m| m.model.trim()).collect()
    }

    /// GPUs on MIG nodes (Tessera's fleet).
    pub fn mig_gpus(&self) -> u32 {
        self.mig_nodes * u32::from(self.gpus_per_node)
    }

    /// The run's length.
    pub fn horizon(&self) -> Time {
        (self.days * 24.0 * HOUR as f64) as Time
    }

    /// When the time averages start.
    pub fn warmup(&self) -> Time {
        (self.warmup_hours * HOUR as f64) as Time
    }

    pub fn checkpoint_ms(&self) -> (Time, Time) {
        let ms = |m: f64| (m * 60_000.0) as Time;
        (ms(self.checkpoint_min.0), ms(self.checkpoint_min.1))
    }
}

/// The three fleets compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FleetKind {
    /// Status quo: an inference pool sized for its peak, training gets the rest; no
    /// borrowing between them; whole GPUs; KEDA + HPA scaling (coupling off).
    Dedicated,
    /// One pool, Kueue-style queues in a cohort (training borrows what inference does not
    /// use, inference reclaims it), KEDA + HPA scaling (coupling off), whole GPUs.
    Shared,
    /// Tessera: the shared pool with coupled scaling, fractional GPUs where a task asks
    /// for less than one, and Tessera's placement policy.
    Tessera,
}

impl FleetKind {
    pub const ALL: [FleetKind; 3] = [FleetKind::Dedicated, FleetKind::Shared, FleetKind::Tessera];

    pub fn label(self) -> &'static str {
        match self {
            FleetKind::Dedicated => "dedicated pools",
            FleetKind::Shared => "shared, Kueue + KEDA",
            FleetKind::Tessera => "Tessera",
        }
    }

    /// The scalers' coupling with quota: Tessera's as `knobs` says, off for the others.
    pub fn coupling(self, knobs: &Knobs) -> Coupling {
        match self {
            FleetKind::Tessera => knobs.tessera_coupling,
            _ => Coupling::Off,
        }
    }

    /// Whether a task asking for part of a GPU gets just that part.
    pub fn fractional(self) -> bool {
        self == FleetKind::Tessera
    }

    /// Whether inference and training share one pool and one cohort.
    pub fn shared(self) -> bool {
        self != FleetKind::Dedicated
    }

    /// The placement policy: BestFit for the status quo (a strong stand-in for a
    /// bin-packing kube-scheduler profile), Tessera's own otherwise.
    pub fn policy(self) -> PolicyKind {
        match self {
            FleetKind::Tessera => PolicyKind::Tessera,
            _ => PolicyKind::BestFit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_their_knob() {
        Knobs::default().validate().unwrap();
        let cases: Vec<(Knobs, &str)> = vec![
            (
                Knobs {
                    gpus: 100,
                    ..Default::default()
                },
                "--gpus",
            ),
            (
                Knobs {
                    gpus_per_node: 0,
                    ..Default::default()
                },
                "--gpus-per-node",
            ),
            (
                Knobs {
                    days: f64::NAN,
                    ..Default::default()
                },
                "--days",
            ),
            (
                Knobs {
                    inference_share: Some(1.5),
                    ..Default::default()
                },
                "--inference-share",
            ),
            (
                Knobs {
                    checkpoint_min: (30.0, 5.0),
                    ..Default::default()
                },
                "--checkpoint",
            ),
            (
                Knobs {
                    polling_s: 0,
                    ..Default::default()
                },
                "--polling",
            ),
            (
                Knobs {
                    warmup_hours: 200.0,
                    ..Default::default()
                },
                "--warmup-hours",
            ),
            (
                Knobs {
                    llm_peak_gpus: 5000,
                    ..Default::default()
                },
                "--llm-peak-gpus",
            ),
            (
                Knobs {
                    llm_trough: 1.5,
                    ..Default::default()
                },
                "--llm-trough",
            ),
        ];
        for (k, knob) in cases {
            let e = k.validate().unwrap_err().to_string();
            assert!(e.starts_with(knob), "{e}");
        }
    }

    #[test]
    fn gpu_models_must_add_up_and_mig_nodes_need_a_catalog() {
        let models = |list: &[(&str, u32)]| -> Vec<ModelNodes> {
            list.iter()
                .map(|&(model, nodes)| ModelNodes {
                    model: model.into(),
                    nodes,
                })
                .collect()
        };
        let mixed = Knobs {
            gpu_models: models(&[("H100-80GB", 384), ("A100-40GB", 128)]),
            ..Default::default()
        };
        mixed.validate().unwrap();
        assert_eq!(
            mixed.node_models().filter(|m| *m == "A100-40GB").count(),
            128
        );
        assert_eq!(mixed.node_models().next(), Some("H100-80GB"));
        let cases: Vec<(Knobs, &str)> = vec![
            (
                Knobs {
                    gpu_models: models(&[("H100-80GB", 384)]),
                    ..Default::default()
                },
                "--gpus: 4096 GPUs, but the models' nodes hold 3072",
            ),
            (
                Knobs {
                    gpu_models: vec![],
                    ..Default::default()
                },
                "--gpu-models: names no model",
            ),
            (
                Knobs {
                    gpu_models: models(&[("H100-80GB", 256), ("H100-80GB", 256)]),
                    ..Default::default()
                },
                "--gpu-models: H100-80GB is named twice",
            ),
            (
                Knobs {
                    gpu_models: models(&[("H100-80GB", 512), ("T4", 0)]),
                    ..Default::default()
                },
                "--gpu-models: T4: 0 nodes",
            ),
            (
                Knobs {
                    gpu_models: models(&[(" ", 512)]),
                    ..Default::default()
                },
                "--gpu-models: ` ` is not a model name",
            ),
            (
                Knobs {
                    mig_nodes: 512,
                    ..Default::default()
                },
                "--mig-nodes: 512 of 512 nodes",
            ),
            (
                Knobs {
                    gpu_models: models(&[("H100-80GB", 500), ("L4", 12)]),
                    mig_nodes: 13,
                    ..Default::default()
                },
                "--mig-nodes: L4 has no MIG profiles",
            ),
            (
                Knobs {
                    mig_nodes: 8,
                    mig_layout: "halves".into(),
                    ..Default::default()
                },
                "--mig-layout: ",
            ),
        ];
        for (k, want) in cases {
            let e = k.validate().unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
        }
        // The MIG nodes are the last ones: 12 L4 nodes first, MIG on H100s is fine.
        Knobs {
            gpu_models: models(&[("L4", 12), ("H100-80GB", 500)]),
            mig_nodes: 100,
            ..Default::default()
        }
        .validate()
        .unwrap();
    }
}
