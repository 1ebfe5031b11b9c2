//! Health: XIDs mark devices unhealthy in ListAndWatch, application XIDs are ignored,
//! and devices become healthy again when the GPU recovers.

mod support;

use std::time::Duration;

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;
use tessera::gpu::{GpuBackend, HealthEvent};
use tessera::proto::deviceplugin as pb;

const WAIT: Duration = Duration::from_secs(5);

fn health_of(lists: &[Vec<pb::Device>], gpu_prefix: &str) -> Vec<String> {
    lists
        .last()
        .unwrap()
        .iter()
        .filter(|d| d.id.starts_with(gpu_prefix))
        .map(|d| d.health.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_marks_unhealthy_and_recovery_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config(
            "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2 } ] } }",
        )
        .root(tmp.path().to_path_buf())
        .start();
    let devices = kubelet.devices("nvidia.com/gpu").await;
    assert_eq!(devices.len(), 4);
    let gpu0 = agent.backend.inventory().unwrap().gpus[0].uuid.clone();
    let first_lists = kubelet.state("nvidia.com/gpu").unwrap().lists.len();

    // An application error (XID 13) changes nothing.
    agent.backend.inject(HealthEvent::Xid {
        gpu_uuid: gpu0.clone(),
        xid: 13,
    });
    // A hardware fault: both replicas of GPU 0 go Unhealthy, GPU 1's stay Healthy.
    agent.backend.inject(HealthEvent::Xid {
        gpu_uuid: gpu0.clone(),
        xid: 79,
    });
    kubelet
        .wait_until(WAIT, "GPU 0 unhealthy", |m| {
            health_of(&m["nvidia.com/gpu"].lists, &gpu0) == ["Unhealthy", "Unhealthy"]
        })
        .await;
    let st = kubelet.state("nvidia.com/gpu").unwrap();
    assert_eq!(
        st.lists.len(),
        first_lists + 1,
        "XID 13 sent no update; XID 79 exactly one"
    );
    assert!(
        st.lists
            .last()
            .unwrap()
            .iter()
            .filter(|d| d.health == "Healthy")
            .count()
            == 2
    );

    // Allocate on the unhealthy GPU is refused, naming the cause.
    let mut client = kubelet.client("nvidia.com/gpu").await;
    let sick = devices
        .iter()
        .find(|d| d.id.starts_with(&gpu0))
        .unwrap()
        .id
        .clone();
    let err = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![sick.clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("XID 79"), "{}", err.message());
    let text = agent.metrics.encode();
    assert!(
        text.contains(r#"tessera_allocation_errors_total{resource="nvidia.com/gpu",reason="unhealthy_device"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tessera_devices{resource="nvidia.com/gpu",health="unhealthy"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tessera_health_transitions_total{to="unhealthy"} 1"#),
        "{text}"
    );

    // The condition clears: Healthy again, and allocatable.
    agent.backend.inject(HealthEvent::Recovered {
        gpu_uuid: gpu0.clone(),
    });
    kubelet
        .wait_until(WAIT, "GPU 0 healthy again", |m| {
            health_of(&m["nvidia.com/gpu"].lists, &gpu0) == ["Healthy", "Healthy"]
        })
        .await;
    client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![sick],
            }],
        })
        .await
        .unwrap();
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_events_and_configurable_ignore_list() {
    let tmp = tempfile::tempdir().unwrap();
    let inv = tmp.path().join("gpus.yaml");
    std::fs::write(
        &inv,
        "gpus: [ { model: H100-80GB, count: 2 } ]\n\
         healthEvents:\n\
         - { afterMs: 50, gpu: 1, xid: 94 }\n\
         - { afterMs: 100, gpu: 0, xid: 48 }\n",
    )
    .unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    // XID 94 (contained ECC error) is ignored by this node's config; 48 is not.
    let agent = AgentBuilder::new(inv.to_str().unwrap())
        .config("tessera: { health: { additionalIgnoredXids: [94] } }")
        .root(tmp.path().to_path_buf())
        .start();
    let inventory = agent.backend.inventory().unwrap();
    let (g0, g1) = (
        inventory.gpus[0].uuid.clone(),
        inventory.gpus[1].uuid.clone(),
    );
    kubelet
        .wait_until(WAIT, "GPU 0 unhealthy", |m| {
            m.get("nvidia.com/gpu").is_some_and(|s| {
                s.lists
                    .last()
                    .is_some_and(|l| l.iter().any(|d| d.id == g0 && d.health == "Unhealthy"))
            })
        })
        .await;
    let last = kubelet.devices("nvidia.com/gpu").await;
    assert!(last.iter().any(|d| d.id == g1 && d.health == "Healthy"));
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_over_http() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .root(tmp.path().to_path_buf())
        .start();
    kubelet.devices("nvidia.com/gpu").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(tessera::metrics::serve(
        listener,
        agent.metrics.clone(),
        cancel.clone(),
    ));
    // A plain HTTP/1.1 GET, as Prometheus sends it.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains(r#"tessera_devices{resource="nvidia.com/gpu",health="healthy"} 2"#),
        "{body}"
    );
    assert!(
        body.contains(r#"tessera_config_reloads_total{outcome="applied"} 1"#),
        "{body}"
    );
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    cancel.cancel();
    agent.shutdown().await;
}
