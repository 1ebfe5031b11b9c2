//! `daemonset/components/vgpu-scheduler` as a whole: the KubeSchedulerConfiguration (not
//! an API object, so kubernetes-validate cannot check it) parsed with types mirroring the
//! Go types' JSON tags of `k8s.io/kube-scheduler/config/v1` (as of v1.34, the pinned
//! image) that refuse unknown fields; its extender URL against the Service, the
//! extender's `--extender-addr` and the paths the extender really serves; its resources
//! against the request parser's names; its profile name against the webhook's flag and
//! matchConditions; the scheduler's and the extender's RBAC, NetworkPolicy and flags.

mod support;

use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use support::apiserver::ApiServer;
use tessera::controller::extender::{serve, Books, BooksConfig, Extender};
use tessera::controller::vgpu_webhook::DEFAULT_SCHEDULER_NAME;
use tessera::controller::webhook_server::Limits;
use tessera::vgpu::request::{ResourceNames, DEFAULT_PREFIX};

const DIR: &str = "daemonset/components/vgpu-scheduler";

/// `KubeSchedulerConfiguration` (kubescheduler.config.k8s.io/v1). Plugin sets and
/// plugin args are kept as JSON: this component sets none.
// Every field of the Go type is here so that each known field is accepted; the
// tests read the ones the component sets.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KubeSchedulerConfiguration {
    api_version: String,
    kind: String,
    parallelism: Option<i32>,
    leader_election: Option<LeaderElectionConfiguration>,
    client_connection: Option<Value>,
    // componentbaseconfigv1alpha1.DebuggingConfiguration, inlined.
    enable_profiling: Option<bool>,
    enable_contention_profiling: Option<bool>,
    percentage_of_nodes_to_score: Option<i32>,
    pod_initial_backoff_seconds: Option<i64>,
    pod_max_backoff_seconds: Option<i64>,
    #[serde(default)]
    profiles: Vec<KubeSchedulerProfile>,
    #[serde(default)]
    extenders: Vec<ExtenderConfig>,
    delay_cache_until_active: Option<bool>,
}

/// `componentbaseconfigv1alpha1.LeaderElectionConfiguration`.
// Every field of the Go type is here so that each known field is accepted; the
// tests read the ones the component sets.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaderElectionConfiguration {
    leader_elect: Option<bool>,
    lease_duration: Option<String>,
    renew_deadline: Option<String>,
    retry_period: Option<String>,
    resource_lock: Option<String>,
    resource_name: Option<String>,
    resource_namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KubeSchedulerProfile {
    scheduler_name: Option<String>,
    percentage_of_nodes_to_score: Option<i32>,
    plugins: Option<Value>,
    #[serde(default)]
    plugin_config: Vec<Value>,
}

/// `Extender`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExtenderConfig {
    url_prefix: String,
    #[serde(default)]
    filter_verb: String,
    #[serde(default)]
    preempt_verb: String,
    #[serde(default)]
    prioritize_verb: String,
    #[serde(default)]
    weight: i64,
    #[serde(default)]
    bind_verb: String,
    #[serde(rename = "enableHTTPS", default)]
    enable_https: bool,
    tls_config: Option<Value>,
    http_timeout: Option<String>,
    #[serde(default)]
    node_cache_capable: bool,
    #[serde(default)]
    managed_resources: Vec<ExtenderManagedResource>,
    #[serde(default)]
    ignorable: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExtenderManagedResource {
    name: String,
    #[serde(default)]
    ignored_by_scheduler: bool,
}

fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{DIR}/{file}")).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn only_container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// The value of `--flag=value` in `args`.
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
}

fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no port named {name}"))
}

/// A Go `time.Duration` string of whole seconds or milliseconds (`5s`, `1500ms`).
fn go_duration_ms(text: &str) -> u64 {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse().unwrap();
    }
    let s = text.strip_suffix('s').expect("a duration in s or ms");
    s.parse::<u64>().unwrap() * 1000
}

fn scheduler_config() -> KubeSchedulerConfiguration {
    let docs = docs("scheduler.yaml");
    let cm = find(&docs, "ConfigMap", "tessera-scheduler-config");
    let text = cm["data"]["config.yaml"].as_str().unwrap();
    serde_saphyr::from_str(text).expect("a KubeSchedulerConfiguration with known fields only")
}

#[test]
fn the_unknown_field_check_is_real() {
    let typo = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                extenders:\n- urlPrefix: http://x\n  nodeCacheable: true\n";
    assert!(serde_saphyr::from_str::<KubeSchedulerConfiguration>(typo).is_err());
    let gated = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                 percentageOfPlacementsToScore: 10\n";
    assert!(
        serde_saphyr::from_str::<KubeSchedulerConfiguration>(gated).is_err(),
        "a field v1.34 lacks is refused"
    );
}

/// One profile, Tessera's name, every feasible node scored, leader election on its own
/// Lease that the scheduler's Role lets it renew; the config file is the one mounted.
#[test]
fn the_profile_is_the_one_the_webhook_sends_pods_to() {
    let config = scheduler_config();
    assert_eq!(config.api_version, "kubescheduler.config.k8s.io/v1");
    assert_eq!(config.kind, "KubeSchedulerConfiguration");
    assert_eq!(config.enable_profiling, Some(false), "no pprof endpoints");
    assert_eq!(config.profiles.len(), 1);
    let profile = &config.profiles[0];
    let name = profile.scheduler_name.as_deref().unwrap();
    assert_eq!(name, DEFAULT_SCHEDULER_NAME);
    assert_eq!(profile.percentage_of_nodes_to_score, Some(100));
    assert!(profile.plugins.is_none() && profile.plugin_config.is_empty());

    // The webhook sets this name: the controller's flag in the component's patch ...
    let kustomization = &docs("kustomization.yaml")[0];
    let patches: Vec<&str> = kustomization["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["patch"].as_str())
        .collect();
    assert!(
        patches
            .iter()
            .any(|p| p.contains(&format!("value: --vgpu-scheduler-name={name}"))),
        "{patches:?}"
    );
    // ... and the matchConditions let pods already naming it through, and select the
    // resources the request parser reads (tests/py/vgpu_match_conditions.py evaluates them).
    let ops = docs("webhook-patch.yaml");
    let entry = &ops[0][0]["value"];
    assert_eq!(entry["name"], "vgpu-pods.admission.tessera.io");
    assert_eq!(entry["clientConfig"]["service"]["path"], "/vgpu");
    let conditions = entry["matchConditions"].as_array().unwrap();
    let scheduler = conditions[1]["expression"].as_str().unwrap();
    assert!(scheduler.contains(&format!("'default-scheduler', '{name}'")));
    let resources = conditions[0]["expression"].as_str().unwrap();
    let names = ResourceNames::new(DEFAULT_PREFIX);
    for share in names.share_names() {
        assert_eq!(
            resources.matches(&format!("'{share}'")).count(),
            4,
            "{share}"
        );
    }
    assert!(
        !resources.contains(&format!("'{}'", names.gpu)),
        "whole-GPU pods not sent"
    );

    let le = config.leader_election.as_ref().unwrap();
    assert_eq!(le.leader_elect, Some(true));
    assert_eq!(le.resource_lock.as_deref(), Some("leases"));
    let scheduler = docs("scheduler.yaml");
    let role = find(&scheduler, "Role", "tessera-scheduler-leader");
    assert_eq!(
        role["metadata"]["namespace"].as_str(),
        le.resource_namespace.as_deref()
    );
    let named = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| !r["resourceNames"].is_null())
        .unwrap();
    assert_eq!(
        strings(&named["resourceNames"]),
        [le.resource_name.as_deref().unwrap()]
    );
    assert_eq!(strings(&named["verbs"]), ["get", "update"]);

    let deployment = find(&scheduler, "Deployment", "tessera-scheduler");
    let c = only_container(deployment);
    let command = strings(&c["command"]);
    assert_eq!(command[0], "kube-scheduler");
    let path = flag(&command, "--config").unwrap();
    let (dir, file) = path.rsplit_once('/').unwrap();
    assert_eq!(file, "config.yaml");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap();
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "tessera-scheduler-config");
}

/// The stock image, pinned to a patch release of a minor that serves matchConditions and
/// the v1 configuration.
#[test]
fn the_scheduler_image_is_the_stock_one_pinned() {
    let scheduler = docs("scheduler.yaml");
    let c = only_container(find(&scheduler, "Deployment", "tessera-scheduler"));
    let image = c["image"].as_str().unwrap();
    let version = image
        .strip_prefix("registry.k8s.io/kube-scheduler:v")
        .unwrap_or_else(|| panic!("{image}"));
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{image}: major.minor.patch");
    assert!(parts[0] == 1 && parts[1] >= 30, "{image}");
}

/// The extender entry: its URL is the Service, whose port reaches the extender's
/// `--extender-addr`; the verbs are the paths the extender serves (checked on a running
/// extender); the managed resources are the request parser's names, the shares ignored
/// by the scheduler, the vGPU slots still counted.
#[tokio::test]
async fn the_extender_entry_reaches_the_extender_as_deployed() {
    let config = scheduler_config();
    assert_eq!(config.extenders.len(), 1);
    let e = &config.extenders[0];
    assert!(!e.enable_https && e.tls_config.is_none());
    assert!(e.node_cache_capable);
    assert!(!e.ignorable);
    assert!(e.weight > 0);
    assert!(e.preempt_verb.is_empty());
    let timeout = go_duration_ms(e.http_timeout.as_deref().unwrap());
    assert!((1000..=30_000).contains(&timeout), "{timeout} ms");

    let rest = e.url_prefix.strip_prefix("http://").unwrap();
    let (host, port) = rest.split_once(':').unwrap();
    let port: u64 = port.parse().unwrap();
    let (service, rest) = host.split_once('.').unwrap();
    let namespace = rest.strip_suffix(".svc").unwrap();
    let extender = docs("extender.yaml");
    let svc = find(&extender, "Service", service);
    assert_eq!(svc["metadata"]["namespace"], namespace);
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .unwrap_or_else(|| panic!("the Service has no port {port}"));
    let deployment = find(&extender, "Deployment", "tessera-extender");
    assert_eq!(deployment["metadata"]["namespace"], namespace);
    assert_eq!(
        svc["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    let c = only_container(deployment);
    let target = container_port(c, svc_port["targetPort"].as_str().unwrap());
    let args = strings(&c["args"]);
    assert_eq!(
        flag(&args, "--extender-addr"),
        Some(format!("0.0.0.0:{target}").as_str())
    );

    // Each verb is a path the extender answers (a bad body: 400, not 404).
    let api = ApiServer::empty().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let ext = std::sync::Arc::new(Extender {
        books: std::sync::Arc::new(Books::new(BooksConfig::default())),
        client: api.client(),
        limits: Limits::default(),
        metrics: Default::default(),
    });
    tokio::spawn(serve(listener, ext, shutdown.clone()));
    let verbs = [&e.filter_verb, &e.prioritize_verb, &e.bind_verb];
    for verb in verbs {
        assert!(!verb.is_empty());
        let code = post(addr, &format!("/{verb}"), "[]").await;
        assert_eq!(code, 400, "POST /{verb}");
    }
    assert_eq!(post(addr, "/preempt", "[]").await, 404, "the control");
    shutdown.cancel();

    let names = ResourceNames::new(DEFAULT_PREFIX);
    let managed: BTreeMap<&str, bool> = e
        .managed_resources
        .iter()
        .map(|r| (r.name.as_str(), r.ignored_by_scheduler))
        .collect();
    let mut want: BTreeMap<&str, bool> =
        names.share_names().into_iter().map(|n| (n, true)).collect();
    want.insert(names.gpu.as_str(), false);
    assert_eq!(managed, want);
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &'static str) -> u16 {
    support::http::call(addr, "POST", path, body).await.0
}

/// Only the scheduler's pods reach the extender's port; the probe port is open for the
/// kubelet; the scheduler itself opens only its secure port.
#[test]
fn only_the_scheduler_reaches_the_extender() {
    let extender = docs("extender.yaml");
    let scheduler = docs("scheduler.yaml");
    let ext_dep = find(&extender, "Deployment", "tessera-extender");
    let sched_dep = find(&scheduler, "Deployment", "tessera-scheduler");
    let ext_labels = &ext_dep["spec"]["template"]["metadata"]["labels"];
    let sched_labels = &sched_dep["spec"]["template"]["metadata"]["labels"];
    assert_ne!(ext_labels, sched_labels);

    let np = find(&extender, "NetworkPolicy", "tessera-extender");
    assert_eq!(&np["spec"]["podSelector"]["matchLabels"], ext_labels);
    assert_eq!(strings(&np["spec"]["policyTypes"]), ["Ingress"]);
    let c = only_container(ext_dep);
    let (extender_port, probe_port) = (container_port(c, "extender"), container_port(c, "probe"));
    let mut opened = BTreeMap::new();
    for rule in np["spec"]["ingress"].as_array().unwrap() {
        for p in rule["ports"].as_array().unwrap() {
            opened.insert(p["port"].as_u64().unwrap(), rule["from"].clone());
        }
    }
    assert_eq!(opened.keys().copied().collect::<Vec<_>>(), {
        let mut ports = vec![extender_port, probe_port];
        ports.sort_unstable();
        ports
    });
    assert_eq!(
        opened[&extender_port],
        json!([{"podSelector": {"matchLabels": sched_labels}}])
    );
    assert!(opened[&probe_port].is_null());

    let np = find(&scheduler, "NetworkPolicy", "tessera-scheduler");
    assert_eq!(&np["spec"]["podSelector"]["matchLabels"], sched_labels);
    let sc = only_container(sched_dep);
    assert_eq!(
        np["spec"]["ingress"],
        json!([{"ports": [{"port": container_port(sc, "https"), "protocol": "TCP"}]}])
    );
}

/// One extender process (the books live in it): one replica, Recreate, no webhook and no
/// quota loop; its flags are flags of the binary; its ServiceAccount is the one bound.
#[test]
fn the_extender_runs_alone_with_its_own_account() {
    let extender = docs("extender.yaml");
    let dep = find(&extender, "Deployment", "tessera-extender");
    assert_eq!(dep["spec"]["replicas"], 1);
    assert_eq!(dep["spec"]["strategy"]["type"], "Recreate");
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = only_container(dep);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let args = strings(&c["args"]);
    assert_eq!(args[0], "controller");
    assert!(args.contains(&"--no-webhook") && args.contains(&"--webhook-only"));
    let probe = container_port(c, "probe");
    assert_eq!(
        flag(&args, "--probe-addr"),
        Some(format!("0.0.0.0:{probe}").as_str())
    );
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let name = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{name} ")) || help.contains(&format!("{name}\n")),
            "{name}"
        );
    }
    assert!(help.contains("--vgpu-scheduler-name "));

    let sa = pod["serviceAccountName"].as_str().unwrap();
    let binding = find(&extender, "ClusterRoleBinding", "tessera-extender");
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["roleRef"]["name"], "tessera-extender");
}

/// The scheduler's account has what the Kubernetes docs give a second scheduler.
#[test]
fn the_scheduler_is_bound_as_the_docs_say() {
    let scheduler = docs("scheduler.yaml");
    let dep = find(&scheduler, "Deployment", "tessera-scheduler");
    let sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let bound: Vec<(&str, &str, &str)> = scheduler
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRoleBinding" | "RoleBinding")
            )
        })
        .filter(|d| d["subjects"][0]["name"] == sa)
        .map(|d| {
            (
                d["metadata"]["namespace"].as_str().unwrap_or(""),
                d["roleRef"]["kind"].as_str().unwrap(),
                d["roleRef"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    for want in [
        ("", "ClusterRole", "system:kube-scheduler"),
        ("", "ClusterRole", "system:volume-scheduler"),
        (
            "kube-system",
            "Role",
            "extension-apiserver-authentication-reader",
        ),
        ("tessera-system", "Role", "tessera-scheduler-leader"),
    ] {
        assert!(bound.contains(&want), "{want:?} in {bound:?}");
    }
}
