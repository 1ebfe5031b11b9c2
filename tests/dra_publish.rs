//! Publishing ResourceSlices against the API-server double: create/replace/delete to the
//! desired set, republish when slices are deleted behind our back (a kubelet wipes them
//! at start), and refuse to leave devices advertised when the API server drops a gated
//! field.

mod support;

use std::time::{Duration, Instant};

use support::apiserver::ApiServer;
use tessera::dra::names::DRIVER;
use tessera::dra::publish::{Error, Publisher};
use tessera::dra::slices::{build_slices, CounterLayout, SliceOptions};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;
use tessera::partition::{config, layout};
use tokio_util::sync::CancellationToken;

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn desired(yaml: &str) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let inv = FakeBackend::from_spec("2xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = config::parse_config("t", yaml).unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    let mut opts = SliceOptions::new("node-a");
    opts.counters = CounterLayout::Separate;
    build_slices(&inv, &plan, &opts).unwrap()
}

const MIG: &str = "tessera: { gpus: [ { match: all, mode: mig, mig: { layout: balanced } } ] }";

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn publishes_and_converges() {
    let api = ApiServer::empty().await;
    // A slice of another node must be left alone.
    api.put_object(
        SLICES,
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "other"}, "spec": {"driver": DRIVER, "nodeName": "node-b",
            "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1}}}),
    );
    let p = Publisher::new(api.client(), "node-a", DRIVER);
    let want = desired(MIG);
    p.publish(&want).await.unwrap();
    let ours = |api: &ApiServer| {
        api.objects(SLICES)
            .into_iter()
            .filter(|o| o["spec"]["nodeName"] == "node-a")
            .count()
    };
    assert_eq!(ours(&api), want.len());
    let writes = api.writes();
    p.publish(&want).await.unwrap();
    assert_eq!(api.writes(), writes, "nothing written when in sync");

    // Fewer GPUs partitioned: extra slices are deleted, the other node's slice stays.
    let fewer = desired("version: v1");
    p.publish(&fewer).await.unwrap();
    assert_eq!(ours(&api), fewer.len());
    assert_eq!(api.objects(SLICES).len(), fewer.len() + 1);
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn republishes_after_slices_are_deleted() {
    let api = ApiServer::empty().await;
    let (tx, rx) = tokio::sync::watch::channel(desired(MIG));
    let (status_tx, status_rx) = tokio::sync::watch::channel(None);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Publisher::new(api.client(), "node-a", DRIVER).run(
        rx,
        status_tx,
        cancel.clone(),
    ));
    let n = tx.borrow().len();
    wait_for("first publish", || api.objects(SLICES).len() == n).await;

    // The kubelet wipes the node's slices when it starts.
    let t0 = Instant::now();
    for o in api.objects(SLICES) {
        api.delete_object(SLICES, o["metadata"]["name"].as_str().unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while api.objects(SLICES).len() != n {
        assert!(
            Instant::now() < deadline,
            "no republish; requests: {:#?}",
            api.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(status_rx.borrow().is_none());

    // A new desired set is applied.
    tx.send_replace(desired("version: v1"));
    let m = tx.borrow().len();
    wait_for("new set", || api.objects(SLICES).len() == m).await;
    cancel.cancel();
    task.await.unwrap();
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test]
async fn dropped_gated_fields_withdraw_the_slices() {
    let api = ApiServer::empty().await;
    // An API server without DRAPartitionableDevices drops these fields silently.
    api.drop_field("spec.sharedCounters");
    api.drop_field("spec.devices.*.consumesCounters");
    let p = Publisher::new(api.client(), "node-a", DRIVER);
    let err = p.publish(&desired(MIG)).await.unwrap_err();
    match &err {
        Error::FieldDropped { gate, .. } => assert_eq!(*gate, "DRAPartitionableDevices"),
        other => panic!("unexpected error {other}"),
    }
    assert!(err
        .to_string()
        .contains("enable the feature gate DRAPartitionableDevices"));
    // No slice that lost a field stays advertised.
    for o in api.objects(SLICES) {
        let devices = o["spec"]["devices"].as_array().cloned().unwrap_or_default();
        assert!(
            devices
                .iter()
                .all(|d| !d["name"].as_str().unwrap().contains("-mig-")),
            "MIG devices without their counters would be mis-allocated: {o}"
        );
        assert!(o["spec"]["sharedCounters"].is_null());
    }
    // Whole GPUs (no gated fields) publish fine on the same server.
    p.publish(&desired("version: v1")).await.unwrap();
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}
