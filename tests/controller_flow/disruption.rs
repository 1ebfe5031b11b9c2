//! An eviction refused by a PodDisruptionBudget (429 TooManyRequests): the preemptor
//! says which eviction is blocked and when it is retried, and retries back off
//! exponentially instead of hammering the API server every pass.

use super::*;
use tessera::controller::reconciler::PassState;

/// A client that does not retry 429 itself (as `tessera controller` builds it).
fn client_without_retries(s: &ApiServer) -> kube::Client {
    let mut config = kube::Config::new(s.url.parse().unwrap());
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_blocked_eviction_is_retried_with_backoff_and_named_in_the_reason() {
    let s = cluster().await;
    let client = client_without_retries(&s);
    let c = Config {
        eviction_backoff_base: 5_000,
        eviction_backoff_max: 60_000,
        ..cfg("a")
    };
    let mut state = PassState::new(&c);
    for name in ["low-1", "low-2"] {
        create_pod(&s, name, 2, "low", json!({}), None);
        s.block_evictions(name, true);
    }
    pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(ungated_pods(&s).len(), 2);

    create_pod(&s, "high-1", 2, "high", json!({}), None);
    let at = |secs: u64| NOW + 10_000 + secs * 1_000;
    reconciler::pass_with(&client, &c, &mut state, at(0))
        .await
        .unwrap();
    let victim = s.evictions()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let requests = || s.evictions().len();
    assert_eq!(requests(), 1);
    assert!(
        pod(&s, &victim)["metadata"]["deletionTimestamp"].is_null(),
        "refused"
    );

    // Not retried before 5 s; the preemptor names the blocked eviction.
    reconciler::pass_with(&client, &c, &mut state, at(1))
        .await
        .unwrap();
    assert_eq!(requests(), 1);
    let (reason, message) = condition(&pod(&s, "high-1"));
    assert_eq!(reason, "EvictionBlocked");
    assert!(
        message.starts_with(&format!(
            "eviction of team/{victim} blocked by a PodDisruptionBudget, retrying in 5s"
        )),
        "{message}"
    );
    assert!(message.contains("disruption budget"), "{message}");
    // The reason is stable while waiting: no writes.
    let writes = s.writes();
    reconciler::pass_with(&client, &c, &mut state, at(3))
        .await
        .unwrap();
    assert_eq!(s.writes(), writes);
    assert_eq!(requests(), 1);

    // Retried at 5 s, refused again: the next try waits 10 s.
    reconciler::pass_with(&client, &c, &mut state, at(5))
        .await
        .unwrap();
    assert_eq!(requests(), 2);
    reconciler::pass_with(&client, &c, &mut state, at(6))
        .await
        .unwrap();
    let (reason, message) = condition(&pod(&s, "high-1"));
    assert_eq!(reason, "EvictionBlocked");
    assert!(message.contains("retrying in 10s"), "{message}");

    // The budget allows it now, but the retry waits for its time (15 s).
    s.block_evictions(&victim, false);
    reconciler::pass_with(&client, &c, &mut state, at(10))
        .await
        .unwrap();
    assert_eq!(requests(), 2);
    reconciler::pass_with(&client, &c, &mut state, at(15))
        .await
        .unwrap();
    assert_eq!(requests(), 3);
    assert!(pod(&s, &victim)["metadata"]["deletionTimestamp"].is_string());
    assert!(
        state.evictions.blocked().is_empty(),
        "success clears the backoff"
    );
    assert!(s.delete_object(PODS, &victim));
    reconciler::pass_with(&client, &c, &mut state, at(16))
        .await
        .unwrap();
    assert!(!gated(&pod(&s, "high-1")));
    support::schema::validate_all(&s.objects(EVENTS), &["1.34.0"]);
    assert_rbac_allows_every_request(&s);
}
