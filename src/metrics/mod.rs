//! The node agent's Prometheus metrics: one [`NodeMetrics`] owning a `tessera_`-prefixed
//! registry, passed to whoever records, readable by tests, served on `--metrics-addr`.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `tessera_devices` | resource, health | devices advertised now |
//! | `tessera_allocations_total` | resource | containers allocated |
//! | `tessera_allocation_errors_total` | resource, reason | Allocate refusals |
//! | `tessera_health_transitions_total` | to | GPU health flips |
//! | `tessera_config_reloads_total` | outcome | applied / rejected / unchanged |
//! | `tessera_cdi_spec_repairs_total` | | CDI spec rewritten after a check found it wrong |
//! | `tessera_health_watch_restarts_total` | | GPU health watch lost and restarted |
//! | `tessera_gpu_memory_used_bytes` | node, gpu, model, mode | device memory in use (NVML) |
//! | `tessera_gpu_memory_total_bytes` | node, gpu, model, mode | device memory |
//! | `tessera_gpu_utilization_ratio` | node, gpu, model, mode | busy fraction of the last sample period (absent in MIG mode) |
//! | `tessera_container_gpu_allocated_share` | node, gpu, model, mode, namespace, pod, container, queue | share of the GPU the container holds (the chargeback rule) |
//! | `tessera_container_gpu_busy_ratio` | the same | busy fraction of that share charged as used ([`usage`]) |
//! | `tessera_container_gpu_memory_used_bytes` | the same | memory the container holds (whole GPU, MIG device where NVML reports it, vGPU from the shim) |
//! | `tessera_container_gpu_memory_limit_bytes` | the same | memory it may hold (not for time-sliced replicas) |
//! | `tessera_chargeback_gpu_{allocated,used}_seconds_total` | node, gpu, model, mode, namespace, pod, container, queue, team | GPU-seconds per container ([`crate::chargeback::metrics`]; charged every `--usage-interval` by [`sampler`]) |
//! | HAMi's `HostGPUMemoryUsage`, `HostCoreUtilization`, `vGPU_device_memory_{usage_in,limit_in}_bytes` | HAMi's | with `--hami-metrics` ([`hami`]) |
//!
//! The GPU and container gauges are set every `--usage-interval` (default 15 s) by
//! [`sampler`] from the kubelet's PodResources API, the GPU backend and the shim's files.
//! They carry the workload's `namespace` and `pod`: scrape with `honor_labels: true`.
//!
//! The same listener serves the probes `GET /livez` and `GET /readyz` ([`probes`]).

pub mod hami;
pub mod probes;
pub mod sampler;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use self::usage::{ContainerLabels, GpuLabels};

/// A gauge of `f64` values.
pub type F64Gauge = Gauge<f64, AtomicU64>;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    pub resource: String,
    pub health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub resource: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HealthLabels {
    pub to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

/// Everything the node agent measures.
#[derive(Debug)]
pub struct NodeMetrics {
    registry: Registry,
    /// What `/livez` and `/readyz` answer.
    pub probes: Arc<probes::Probes>,
    pub devices: Family<DeviceLabels, Gauge>,
    pub allocations: Family<ResourceLabels, Counter>,
    pub allocation_errors: Family<ErrorLabels, Counter>,
    pub health_transitions: Family<HealthLabels, Counter>,
    pub config_reloads: Family<OutcomeLabels, Counter>,
    /// GPUs on neither kubelet path whose move off the DRA driver has waited past its
    /// warning threshold (`agent::withdraw`).
    pub gpu_moves_stalled: Gauge,
    /// Other device plugins on the node that register a resource Tessera registers or
    /// advertise its GPUs (`deviceplugin::coexist`).
    pub device_plugin_conflicts: Gauge,
    /// The node's CDI spec found missing, damaged or edited on disk and rewritten.
    pub cdi_spec_repairs: Counter,
    /// The GPU backend's health watch lost (ended or failed to start) and restarted.
    pub health_watch_restarts: Counter,
    /// GPU-seconds allocated and used per container (docs/chargeback.md).
    pub chargeback: crate::chargeback::ChargebackMetrics,
    pub gpu_memory_used: Family<GpuLabels, F64Gauge>,
    pub gpu_memory_total: Family<GpuLabels, F64Gauge>,
    pub gpu_utilization: Family<GpuLabels, F64Gauge>,
    pub container_allocated_share: Family<ContainerLabels, F64Gauge>,
    pub container_busy: Family<ContainerLabels, F64Gauge>,
    pub container_memory_used: Family<ContainerLabels, F64Gauge>,
    pub container_memory_limit: Family<ContainerLabels, F64Gauge>,
    /// HAMi's names, served too with `--hami-metrics`.
    pub hami: Option<hami::HamiMetrics>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    pub fn new() -> Self {
        Self::with_hami(false)
    }

    /// With `hami`, HAMi's vGPU monitor names are served too ([`hami`]).
    pub fn with_hami(hami: bool) -> Self {
        let mut registry = Registry::with_prefix("tessera");
        let devices = Family::<DeviceLabels, Gauge>::default();
        let allocations = Family::<ResourceLabels, Counter>::default();
        let allocation_errors = Family::<ErrorLabels, Counter>::default();
        let health_transitions = Family::<HealthLabels, Counter>::default();
        let config_reloads = Family::<OutcomeLabels, Counter>::default();
        let gpu_moves_stalled = Gauge::default();
        let device_plugin_conflicts = Gauge::default();
        let cdi_spec_repairs = Counter::default();
        let health_watch_restarts = Counter::default();
        let chargeback = crate::chargeback::ChargebackMetrics::register(&mut registry);
        registry.register(
            "cdi_spec_repairs",
            "Times the node's CDI spec was found missing, damaged or edited and rewritten",
            cdi_spec_repairs.clone(),
        );
        registry.register(
            "health_watch_restarts",
            "Times the GPU health watch was lost and restarted",
            health_watch_restarts.clone(),
        );
        registry.register(
            "devices",
            "Devices advertised to the kubelet",
            devices.clone(),
        );
        registry.register(
            "allocations",
            "Containers allocated devices",
            allocations.clone(),
        );
        registry.register(
            "allocation_errors",
            "Allocate requests refused",
            allocation_errors.clone(),
        );
        registry.register(
            "health_transitions",
            "GPU health changes",
            health_transitions.clone(),
        );
        registry.register(
            "config_reloads",
            "Layout config reloads by outcome",
            config_reloads.clone(),
        );
        registry.register(
            "gpu_moves_stalled",
            "GPUs on neither kubelet path whose move off the DRA driver is stalled",
            gpu_moves_stalled.clone(),
        );
        registry.register(
            "device_plugin_conflicts",
            "Other device plugins registering a resource Tessera registers or advertising its GPUs",
            device_plugin_conflicts.clone(),
        );
        let gpu = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<GpuLabels, F64Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let gpu_memory_used = gpu(&mut registry, "gpu_memory_used_bytes", "GPU memory in use");
        let gpu_memory_total = gpu(&mut registry, "gpu_memory_total_bytes", "GPU memory");
        let gpu_utilization = gpu(
            &mut registry,
            "gpu_utilization_ratio",
            "Fraction of the last sample period the GPU ran a kernel",
        );
        let ctr = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<ContainerLabels, F64Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let container_allocated_share = ctr(
            &mut registry,
            "container_gpu_allocated_share",
            "Share of the GPU the container holds, as chargeback charges it",
        );
        let container_busy = ctr(
            &mut registry,
            "container_gpu_busy_ratio",
            "Busy fraction of the container's share, as chargeback counts it used",
        );
        let container_memory_used = ctr(
            &mut registry,
            "container_gpu_memory_used_bytes",
            "GPU memory the container holds",
        );
        let container_memory_limit = ctr(
            &mut registry,
            "container_gpu_memory_limit_bytes",
            "GPU memory the container may hold",
        );
        Self {
            registry,
            gpu_memory_used,
            gpu_memory_total,
            gpu_utilization,
            container_allocated_share,
            container_busy,
            container_memory_used,
            container_memory_limit,
            hami: hami.then(hami::HamiMetrics::new),
            probes: Arc::default(),
            devices,
            allocations,
            allocation_errors,
            health_transitions,
            config_reloads,
            gpu_moves_stalled,
            device_plugin_conflicts,
            cdi_spec_repairs,
            health_watch_restarts,
            chargeback,
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if let Some(hami) = &self.hami {
            let _ = encode_registry(&mut out, &hami.registry);
        }
        let _ = encode_eof(&mut out);
        out
    }

    pub fn reload(&self, outcome: &str) {
        self.config_reloads
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }
}

/// Serve `GET /metrics`, `GET /livez` and `GET /readyz` on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<NodeMetrics>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    use http_body_util::Full;
    use hyper::{Response, StatusCode};

    let addr: SocketAddr = listener.local_addr()?;
    info!(%addr, "serving metrics");
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => { warn!(error = %e, "metrics accept failed"); continue; }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    async move {
                        let probe = match req.uri().path() {
                            "/livez" => Some(metrics.probes.live()),
                            "/readyz" => Some(metrics.probes.ready()),
                            _ => None,
                        };
                        let resp = if let Some(answer) = probe {
                            let (status, line) = match answer {
                                Ok(line) => (StatusCode::OK, line),
                                Err(line) => (StatusCode::SERVICE_UNAVAILABLE, line),
                            };
                            Response::builder()
                                .status(status)
                                .header("content-type", "text/plain; charset=utf-8")
                                .body(Full::new(bytes::Bytes::from(format!("{line}\n"))))
                        } else if req.uri().path() == "/metrics" {
                            Response::builder()
                                .header(
                                    "content-type",
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                )
                                .body(Full::new(bytes::Bytes::from(metrics.encode())))
                        } else {
                            Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(bytes::Bytes::from_static(
                                    b"see /metrics, /livez, /readyz\n",
                                )))
                        };
                        resp.map_err(std::io::Error::other)
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await
            {
                warn!(error = %e, "metrics connection failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chargeback::{ChargeLabels, Mode};

    #[test]
    fn chargeback_counters_are_served_with_the_agent_metrics() {
        let metrics = NodeMetrics::new();
        let labels = ChargeLabels {
            node: "n1".into(),
            gpu: "GPU-0".into(),
            model: "H100-80GB".into(),
            mode: Mode::Timeslice,
            namespace: "ml".into(),
            pod: "p".into(),
            container: "c".into(),
            queue: "q".into(),
            team: "t".into(),
        };
        metrics.chargeback.charge(&labels, 0.25, Some(1.0), 40.0);
        let page = metrics.encode();
        assert!(
            page.contains("tessera_chargeback_gpu_allocated_seconds_total{node=\"n1\",gpu=\"GPU-0\",model=\"H100-80GB\",mode=\"timeslice\",namespace=\"ml\",pod=\"p\",container=\"c\",queue=\"q\",team=\"t\"} 10.0"),
            "{page}"
        );
        assert!(
            page.contains("tessera_health_watch_restarts_total"),
            "{page}"
        );
    }
}
