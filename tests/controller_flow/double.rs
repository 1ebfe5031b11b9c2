//! The API-server double behaves as a real server does where the controller's clients
//! (kube's `Api`, kube-runtime's watcher) rely on it: paged LISTs of one snapshot,
//! watches ending at `timeoutSeconds`, bookmarks, status left alone by main-resource
//! writes, unsupported field selectors and invalid names refused, distinct creation
//! timestamps. If one of these drifts, the flows tested against the double stop saying
//! anything about a real cluster.

use super::support::apiserver::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde_json::json;
use std::time::{Duration, Instant};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "team"}}))
        .expect("a ConfigMap")
}

#[tokio::test]
async fn lists_page_one_snapshot_and_expire_with_compaction() {
    let api = ApiServer::start("node-a").await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "team");
    for i in 0..5 {
        cms.create(&PostParams::default(), &config_map(&format!("cm-{i}")))
            .await
            .expect("created");
    }
    let first = cms
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().expect("a continue token");
    // A write between pages does not show in the snapshot being paged.
    cms.create(&PostParams::default(), &config_map("cm-late"))
        .await
        .expect("created");
    let second = cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .expect("page 2");
    let third = cms
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(second.metadata.continue_.as_deref().expect("more")),
        )
        .await
        .expect("page 3");
    assert_eq!(third.metadata.continue_, None, "the last page");
    let names: Vec<String> = [first, second, third]
        .iter()
        .flat_map(|l| l.items.iter().filter_map(|c| c.metadata.name.clone()))
        .collect();
    assert_eq!(names, ["cm-0", "cm-1", "cm-2", "cm-3", "cm-4"]);
    // kube's paging lister sees every object of the snapshot too.
    let all = cms
        .list(&ListParams::default().limit(4))
        .await
        .expect("paged");
    assert_eq!(all.items.len(), 4, "a page, not the whole list");
    // A token whose snapshot was compacted away: 410 Expired.
    let open = cms
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    cms.create(&PostParams::default(), &config_map("cm-later"))
        .await
        .expect("created");
    api.compact();
    let err = cms
        .list(&ListParams::default().continue_token(open.metadata.continue_.as_deref().unwrap()))
        .await
        .expect_err("expired");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 410),
        "{err}"
    );
}

#[tokio::test]
async fn a_watch_ends_at_its_timeout_and_gets_bookmarks_when_asked() {
    let api = ApiServer::start("node-a").await;
    api.send_bookmarks_every(Duration::from_millis(100));
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "team");
    let started = Instant::now();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), "0")
        .await
        .expect("a watch")
        .boxed();
    while let Some(e) = stream.next().await {
        assert!(!matches!(e, Ok(WatchEvent::Bookmark(_))), "not asked for");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "ended after {took:?}"
    );
    let mut stream = cms
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .expect("a watch")
        .boxed();
    let mut bookmarks = 0;
    while let Some(e) = stream.next().await {
        if let Ok(WatchEvent::Bookmark(b)) = e {
            assert!(!b.metadata.resource_version.is_empty());
            bookmarks += 1;
        }
    }
    assert!(
        bookmarks >= 3,
        "{bookmarks} bookmarks in a second at 100 ms"
    );
}

#[tokio::test]
async fn main_resource_writes_leave_status_and_status_writes_take_only_status() {
    let api = ApiServer::start("node-a").await;
    let pods: Api<Pod> = Api::namespaced(api.client(), "team");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"}}))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("created");
    let patch = json!({"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Failed"}});
    let after = pods
        .patch("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patched");
    assert_eq!(after.labels().get("a").map(String::as_str), Some("b"));
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    let patch = json!({"metadata": {"labels": {"c": "d"}}, "status": {"phase": "Succeeded"}});
    let after = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patched");
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded")
    );
    assert!(
        !after.labels().contains_key("c"),
        "the status subresource takes only status"
    );
}

#[tokio::test]
async fn bad_field_selectors_and_names_are_refused_and_creations_are_stamped_apart() {
    let api = ApiServer::start("node-a").await;
    let pods: Api<Pod> = Api::namespaced(api.client(), "team");
    let err = pods
        .list(&ListParams::default().fields("spec.priority=5"))
        .await
        .expect_err("unsupported");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400 && s.message.contains("spec.priority")),
        "{err}"
    );
    pods.list(&ListParams::default().fields("spec.nodeName=node-a,status.phase!=Failed"))
        .await
        .expect("supported labels");
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "team");
    let err = cms
        .create(&PostParams::default(), &config_map("Not_A_Name"))
        .await
        .expect_err("invalid name");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err}"
    );
    assert!(
        api.objects("/api/v1/namespaces/team/configmaps").is_empty(),
        "nothing stored"
    );
    let a = cms
        .create(&PostParams::default(), &config_map("a"))
        .await
        .expect("a");
    let b = cms
        .create(&PostParams::default(), &config_map("b"))
        .await
        .expect("b");
    let (ta, tb) = (a.metadata.creation_timestamp, b.metadata.creation_timestamp);
    assert!(ta.is_some() && tb.is_some() && ta < tb, "{ta:?} {tb:?}");
}
