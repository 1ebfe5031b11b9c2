//! In a cluster the node's `tessera.io/config` label picks the named config, a label change
//! is applied without a restart, and a rejected config becomes an Event on the Node.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::agent::AgentBuilder;
use support::apiserver::ApiServer;
use support::kubelet::Kubelet;
use tessera::agent::cluster::{watch_config_label, KubeEventRecorder};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selects_config_and_rejections_become_events() {
    let api = ApiServer::start("gpu-node-1").await;
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;

    let (tx, rx) = tokio::sync::watch::channel(None);
    let cancel = CancellationToken::new();
    tokio::spawn(watch_config_label(
        api.client(),
        "gpu-node-1".into(),
        tx,
        cancel.clone(),
    ));

    let mut builder = AgentBuilder::new("2xA100-80GB")
        .root(tmp.path().to_path_buf())
        .named_configs(
            &[
                ("default", "version: v1"),
                (
                    "shared",
                    "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 3 } ] } }",
                ),
            ],
            rx,
        );
    builder.recorder = Some(Arc::new(KubeEventRecorder::new(
        api.client(),
        "gpu-node-1".into(),
    )));
    let agent = builder.start();

    // No label: the default config.
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);

    // Label the node: the named config is applied.
    api.set_label("tessera.io/config", Some("shared"));
    kubelet
        .wait_until(WAIT, "3 replicas per GPU", |m| {
            m["nvidia.com/gpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 6)
        })
        .await;

    // A label naming no config: rejected, an Event on the Node, devices unchanged.
    api.set_label("tessera.io/config", Some("nope"));
    let deadline = Instant::now() + WAIT;
    while api.events().is_empty() {
        assert!(Instant::now() < deadline, "no Event recorded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let event = &api.events()[0];
    assert_eq!(event["regarding"]["kind"], "Node");
    assert_eq!(event["regarding"]["name"], "gpu-node-1");
    assert_eq!(event["reason"], "ConfigRejected");
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .contains("known configs: default, shared"),
        "{event}"
    );
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 6);
    validate_with_official_schema(event);
    // The same rejection again: counted in that Event's series, no new Event.
    api.set_label("tessera.io/config", Some("shared"));
    api.set_label("tessera.io/config", Some("nope"));
    let deadline = Instant::now() + WAIT;
    while api.events()[0]["series"]["count"] != 2 {
        assert!(Instant::now() < deadline, "no series: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(api.events().len(), 1);
    validate_with_official_schema(&api.events()[0]);
    // Another message is an Event of its own, with its own text.
    api.set_label("tessera.io/config", Some("other"));
    let deadline = Instant::now() + WAIT;
    while api.events().len() < 2 {
        assert!(Instant::now() < deadline, "no second Event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        api.events()[1]["note"]
            .as_str()
            .is_some_and(|n| n.contains("other")),
        "{:?}",
        api.events()[1]
    );

    // Label removed: back to default.
    api.set_label("tessera.io/config", None);
    kubelet
        .wait_until(WAIT, "default again", |m| {
            m["nvidia.com/gpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 2)
        })
        .await;
    cancel.cancel();
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// The Event must be valid against the official Kubernetes OpenAPI schema.
fn validate_with_official_schema(object: &serde_json::Value) {
    let mut object = object.clone();
    // Fields the API server adds, not the client.
    object["metadata"].as_object_mut().unwrap().remove("name");
    support::schema::validate(&object, &["1.34.0", "1.35.0"]);
}
