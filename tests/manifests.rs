//! The shipped manifests stay in step with the code: every named layout in the example
//! ConfigMap parses and lays out on real GPU models.

use tessera::agent;
use tessera::gpu::fake::FakeBackend;
use tessera::partition::config::parse_config;

#[test]
fn example_configmap_layouts_are_valid() {
    let text = std::fs::read_to_string("daemonset/node/configmap.yaml").unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let data = doc["data"].as_object().unwrap();
    assert!(data.contains_key("default"), "a default config must exist");
    for (name, body) in data {
        let name = name.as_str();
        let cfg = parse_config(name, body.as_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        for gpus in ["8xA100-80GB", "8xH100-80GB", "4xA30"] {
            let backend = FakeBackend::from_spec(gpus).unwrap();
            agent::build(&backend, &cfg).unwrap_or_else(|e| panic!("{name} on {gpus}: {e}"));
        }
    }
}

#[test]
fn example_layout_files_are_valid() {
    for entry in std::fs::read_dir("daemonset/examples").unwrap() {
        let path = entry.unwrap().path();
        // `claims/` holds Kubernetes objects (checked below and by the manifest script).
        if path.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg =
            parse_config("example", &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let backend = FakeBackend::from_spec("4xA100-80GB").unwrap();
        agent::build(&backend, &cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// Each DeviceClass selects a device type the driver actually publishes.
#[test]
fn device_classes_select_published_types() {
    use tessera::dra::slices::{build_slices, SliceOptions};
    use tessera::gpu::GpuBackend;
    use tessera::partition::layout;
    let text = std::fs::read_to_string("daemonset/dra/deviceclasses.yaml").unwrap();
    let inv = FakeBackend::from_spec("3xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = parse_config(
        "t",
        "tessera: { gpus: [ { match: { index: [0] }, mode: mig, mig: { layout: balanced } }, \
         { match: { index: [1] }, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }",
    )
    .unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    let slices = build_slices(&inv, &plan, &SliceOptions::new("n")).unwrap();
    let published: std::collections::BTreeSet<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| d.attributes.as_ref()?.get("type")?.string.clone())
        .collect();
    let mut classes = 0;
    for v in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
        let expr = v["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        let want = expr
            .split("type == \"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            published.contains(want),
            "class selects type {want}, published: {published:?}"
        );
        assert!(expr.contains("device.driver == \"gpu.tessera.io\""));
        classes += 1;
    }
    assert_eq!(classes, 3);
}

/// Every example claim names a shipped DeviceClass, and what it selects (MIG profile,
/// vGPU capacity) is something the driver publishes.
#[test]
fn example_claims_use_shipped_classes_and_published_devices() {
    use tessera::dra::slices::{build_slices, SliceOptions};
    use tessera::gpu::GpuBackend;
    use tessera::partition::layout;
    let classes = std::fs::read_to_string("daemonset/dra/deviceclasses.yaml").unwrap();
    let class_names: Vec<String> = serde_saphyr::from_multiple::<serde_json::Value>(&classes)
        .unwrap()
        .into_iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let inv = FakeBackend::from_spec("3xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let cfg = parse_config(
        "t",
        "tessera: { gpus: [ { match: { index: [0] }, mode: mig, mig: { layout: balanced } }, \
         { match: { index: [1] }, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }",
    )
    .unwrap();
    let plan = layout::plan(&inv, &cfg).unwrap();
    let devices: Vec<_> = build_slices(&inv, &plan, &SliceOptions::new("n"))
        .unwrap()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect();
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("daemonset/examples/claims").unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for v in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
            let spec = match v["kind"].as_str() {
                Some("ResourceClaimTemplate") => &v["spec"]["spec"],
                Some("ResourceClaim") => &v["spec"],
                _ => continue,
            };
            for r in spec["devices"]["requests"].as_array().unwrap() {
                let class = r["exactly"]["deviceClassName"].as_str().unwrap();
                assert!(
                    class_names.iter().any(|c| c == class),
                    "{}: {class}",
                    path.display()
                );
                kinds.insert(class.to_string());
                for sel in r["exactly"]["selectors"].as_array().into_iter().flatten() {
                    let expr = sel["cel"]["expression"].as_str().unwrap();
                    if let Some(profile) = expr.split("profile == \"").nth(1) {
                        let profile = profile.split('"').next().unwrap();
                        assert!(
                            devices.iter().any(|d| d
                                .attributes
                                .as_ref()
                                .unwrap()
                                .get("profile")
                                .and_then(|a| a.string.as_deref())
                                == Some(profile)),
                            "{}: MIG profile {profile} is never published",
                            path.display()
                        );
                    }
                }
                if let Some(caps) = r["exactly"]["capacity"]["requests"].as_object() {
                    let vgpu = devices
                        .iter()
                        .find(|d| d.allow_multiple_allocations == Some(true))
                        .unwrap();
                    for key in caps.keys() {
                        let key = key.as_str();
                        assert!(
                            vgpu.capacity.as_ref().unwrap().contains_key(key),
                            "capacity {key}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(
        kinds.len(),
        3,
        "an example for every DeviceClass: {kinds:?}"
    );
}

/// Every TESSERA_* variable the DaemonSet sets is one `tessera-node` reads.
#[test]
fn daemonset_env_is_read_by_the_agent() {
    let text = std::fs::read_to_string("daemonset/node/daemonset.yaml").unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tessera-node"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let mut checked = 0;
    for e in env {
        let name = e["name"].as_str().unwrap();
        if name.starts_with("TESSERA_") {
            assert!(
                help.contains(&format!("env: {name}=")),
                "{name} is not a flag's env"
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "DaemonSet sets the path variables");
}

/// The committed CRDs are exactly what `tessera controller crds` generates from the types.
#[test]
fn committed_crds_match_the_generated_ones() {
    let committed = std::fs::read_to_string("daemonset/controller/crds.yaml").unwrap();
    let generated = tessera::controller::crd::crds_yaml().unwrap();
    assert!(
        committed == generated,
        "daemonset/controller/crds.yaml is stale: run `tessera controller crds > daemonset/controller/crds.yaml`"
    );
}

fn yaml_docs(path: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

/// `kubectl apply -k daemonset/` installs every node and DRA manifest (DeviceClasses and
/// the node agent's RBAC for slices and claims included), and lists only files that exist.
#[test]
fn kustomization_installs_the_dra_parts() {
    let k = &yaml_docs("daemonset/kustomization.yaml")[0];
    let listed: Vec<&str> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for r in &listed {
        assert!(
            std::path::Path::new("daemonset").join(r).is_file(),
            "{r} is listed but missing"
        );
    }
    for dir in ["node", "dra"] {
        for entry in std::fs::read_dir(format!("daemonset/{dir}")).unwrap() {
            let name = format!("{dir}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(listed.contains(&name.as_str()), "{name} is not installed");
        }
    }
    // The node agent may publish slices and read and report on claims.
    let rbac = yaml_docs("daemonset/node/rbac.yaml");
    let rules = rbac[0]["rules"].as_array().unwrap();
    let allows = |resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r["apiGroups"][0] == "resource.k8s.io"
                && r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
                && r["verbs"].as_array().unwrap().iter().any(|x| x == verb)
        })
    };
    for (resource, verb) in [
        ("resourceslices", "create"),
        ("resourceslices", "update"),
        ("resourceslices", "delete"),
        ("resourceslices", "watch"),
        ("resourceclaims", "get"),
        ("resourceclaims/status", "update"),
    ] {
        assert!(allows(resource, verb), "node RBAC lacks {verb} {resource}");
    }
}

/// The DaemonSet runs both paths and lets each node's config split the GPUs and decide
/// whether the DRA path serves at all: TESSERA_DRA auto, no TESSERA_DRA_GPUS (which would
/// override every node's config).
#[test]
fn daemonset_lets_the_node_config_choose_dra() {
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(value("TESSERA_DEVICE_PLUGIN").as_deref(), Some("true"));
    assert_eq!(value("TESSERA_DRA").as_deref(), Some("auto"));
    assert_eq!(value("TESSERA_DRA_GPUS"), None);
    assert_eq!(value("TESSERA_DRIVER_ROOT").as_deref(), Some("/"));
    // Every named config splits the GPUs as its comment says.
    use clap::ValueEnum;
    use tessera::agent::ownership::{DraMode, Owner, Ownership};
    assert_eq!(DraMode::from_str("auto", false), Ok(DraMode::Auto));
    use tessera::gpu::GpuBackend;
    let cm = &yaml_docs("daemonset/node/configmap.yaml")[0];
    let both = Ownership::with_mode(true, DraMode::Auto, None).unwrap();
    let inv = FakeBackend::from_spec("8xH100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let dra_gpus = |name: &str| {
        let cfg = parse_config(name, cm["data"][name].as_str().unwrap()).unwrap();
        let a = both.assign(&inv, &cfg);
        inv.gpus
            .iter()
            .filter(|g| a.owner(g) == Owner::Dra)
            .map(|g| g.index)
            .collect::<Vec<_>>()
    };
    assert_eq!(dra_gpus("default"), Vec::<u32>::new());
    assert_eq!(dra_gpus("mixed"), Vec::<u32>::new());
    // Nodes on these configs neither register the DRA plugin nor publish a pool.
    assert!(!both.dra_serves(dra_gpus("default").len()));
    assert!(both.dra_serves(dra_gpus("dra").len()));
    assert_eq!(dra_gpus("dra"), (0..8).collect::<Vec<_>>());
    assert_eq!(dra_gpus("dra-split"), vec![0, 1, 2, 3]);
}

/// The no-dra component removes exactly the shipped DeviceClasses and turns off the
/// agent's DRA path through an env variable the DaemonSet sets.
#[test]
fn no_dra_component_undoes_the_dra_parts() {
    let c = &yaml_docs("daemonset/components/no-dra/kustomization.yaml")[0];
    assert_eq!(c["kind"], "Component");
    let classes: std::collections::BTreeSet<String> = yaml_docs("daemonset/dra/deviceclasses.yaml")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut deleted = std::collections::BTreeSet::new();
    let mut dra_off = false;
    for p in c["patches"].as_array().unwrap() {
        let patch: serde_json::Value =
            serde_saphyr::from_str(p["patch"].as_str().unwrap()).unwrap();
        match patch["kind"].as_str() {
            Some("DeviceClass") => {
                assert_eq!(patch["$patch"], "delete");
                deleted.insert(patch["metadata"]["name"].as_str().unwrap().to_string());
            }
            Some("DaemonSet") => {
                assert_eq!(patch["metadata"]["name"], "tessera-node");
                let env = &patch["spec"]["template"]["spec"]["containers"][0]["env"][0];
                assert_eq!(env["name"], "TESSERA_DRA");
                assert_eq!(env["value"], "off");
                dra_off = true;
            }
            other => panic!("unexpected patch of {other:?}"),
        }
    }
    assert_eq!(deleted, classes);
    assert!(dra_off);
}

/// Every Kubernetes object under `daemonset/` that `kubectl apply -k` can install: the
/// base's files and the patches of each component (examples excluded).
fn installed_docs() -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("daemonset")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("examples") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let name = path.display().to_string();
            for doc in yaml_docs(&name) {
                if doc["kind"] == "Component" {
                    for p in doc["patches"].as_array().into_iter().flatten() {
                        if let Ok(v) = serde_saphyr::from_str::<serde_json::Value>(
                            p["patch"].as_str().unwrap_or(""),
                        ) {
                            out.push((format!("{name} (patch)"), v));
                        }
                    }
                }
                out.push((name.clone(), doc));
            }
        }
    }
    out
}

/// Every `image:` anywhere in `v`.
fn images(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                if k.as_str() == "image" {
                    out.push(x.as_str().unwrap_or("<not a string>").to_string());
                } else {
                    images(x, out);
                }
            }
        }
        serde_json::Value::Array(s) => s.iter().for_each(|x| images(x, out)),
        _ => {}
    }
}

/// One image name, pinned to this release's version, everywhere (no `latest`, no
/// second repository); the one exception is the stock kube-scheduler of
/// components/vgpu-scheduler (pinned too: tests/scheduler_profile.rs).
#[test]
fn one_pinned_image_everywhere() {
    let want = format!("ghcr.io/tessera-io/tessera:{}", env!("CARGO_PKG_VERSION"));
    let mut found = Vec::new();
    for (file, doc) in installed_docs() {
        let mut here = Vec::new();
        images(&doc, &mut here);
        for image in here {
            if file.ends_with("components/vgpu-scheduler/scheduler.yaml")
                && image.starts_with("registry.k8s.io/kube-scheduler:v")
            {
                continue;
            }
            assert_eq!(image, want, "{file}");
            found.push(file.clone());
        }
    }
    assert!(
        found.iter().any(|f| f.ends_with("node/daemonset.yaml"))
            && found
                .iter()
                .any(|f| f.ends_with("controller/deployment.yaml")),
        "both workloads name the image: {found:?}"
    );
    // hack/build-image.sh tags what it builds with the same name and version.
    let script = std::fs::read_to_string("hack/build-image.sh").unwrap();
    assert!(script.contains("ghcr.io/tessera-io/tessera:$version"));
    let containerfile = std::fs::read_to_string("daemonset/image/Containerfile").unwrap();
    assert!(containerfile.contains("ENTRYPOINT [\"/usr/bin/tessera\"]"));
    assert!(script.contains("/usr/lib/tessera/libtessera_cuda.so"));
}

fn container<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The container port a probe's named or numbered port stands for.
fn probe_port(c: &serde_json::Value, probe: &str, path: &str) -> u64 {
    let get = &c[probe]["httpGet"];
    assert_eq!(get["path"], path, "{probe}");
    assert!(
        get["scheme"].is_null() || get["scheme"] == "HTTP",
        "{probe}: plain HTTP"
    );
    match &get["port"] {
        serde_json::Value::Number(n) => n.as_u64().unwrap(),
        serde_json::Value::String(name) => c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("{probe}: no port named {name}")),
        other => panic!("{probe}: port {other:?}"),
    }
}

/// The agent is probed on its metrics port (/livez, /readyz), which its args serve; the
/// controller on the plain-HTTP probe port its `--probe-addr` opens.
#[test]
fn agent_and_controller_have_probes_on_the_ports_they_serve() {
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    let agent = container(ds, "agent");
    let args: Vec<&str> = agent["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let metrics = args
        .iter()
        .position(|a| *a == "--metrics-addr")
        .map(|i| args[i + 1])
        .unwrap();
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let port = probe_port(agent, probe, path);
        assert_eq!(metrics, format!("0.0.0.0:{port}"));
    }
    let dep = yaml_docs("daemonset/controller/deployment.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let ctl = container(&dep, "controller");
    let args: Vec<&str> = ctl["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let port = probe_port(ctl, probe, path);
        assert!(
            args.contains(&format!("--probe-addr=0.0.0.0:{port}").as_str()),
            "{args:?}"
        );
    }
}

/// The flags the manifests pass are flags of the binary (a renamed flag would crash-loop
/// the pod): the agent runs `/usr/bin/tessera-node`, the controller `tessera controller`,
/// and the image ships both at those paths.
#[test]
fn manifest_args_are_flags_of_the_binary() {
    let dep = yaml_docs("daemonset/controller/deployment.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    let image_script = std::fs::read_to_string("hack/build-image.sh").unwrap();
    for c in [container(ds, "agent"), container(&dep, "controller")] {
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
                .unwrap_or_default()
        };
        let (command, mut args) = (strings(&c["command"]), strings(&c["args"]));
        // No command: the image's entrypoint, `/usr/bin/tessera`, and a subcommand.
        let (bin, sub) = match command.as_slice() {
            [] => (env!("CARGO_BIN_EXE_tessera"), Some(args.remove(0))),
            [path] if path == "/usr/bin/tessera-node" => (env!("CARGO_BIN_EXE_tessera-node"), None),
            other => panic!("{}: unexpected command {other:?}", c["name"]),
        };
        if let [path] = command.as_slice() {
            assert!(
                image_script.contains(&format!("$root{path}\"")),
                "the image does not ship {path}"
            );
        }
        let help = std::process::Command::new(bin)
            .args(sub.iter().chain(std::iter::once(&"--help".to_string())))
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            help.contains("--help"),
            "{bin} {sub:?} --help printed no help"
        );
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            let name = flag.split('=').next().unwrap();
            assert!(
                help.contains(&format!("{name} ")) || help.contains(&format!("{name}\n")),
                "`{bin} {sub:?}` has no flag {name}"
            );
        }
    }
}

/// The controller: seccomp RuntimeDefault, non-root, two replicas kept apart and kept up
/// by a PodDisruptionBudget that selects exactly its pods.
#[test]
fn controller_is_hardened_spread_and_budgeted() {
    let dep = yaml_docs("daemonset/controller/deployment.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = container(&dep, "controller");
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert!(c["securityContext"]["privileged"].is_null());
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    let replicas = dep["spec"]["replicas"].as_u64().unwrap();
    assert_eq!(replicas, 2);
    let anti = &pod["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&anti["labelSelector"]["matchLabels"], labels);
    let pdb = &yaml_docs("daemonset/controller/pdb.yaml")[0];
    assert_eq!(pdb["kind"], "PodDisruptionBudget");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    let min = pdb["spec"]["minAvailable"].as_u64().unwrap();
    assert!(
        min >= 1 && min < replicas,
        "a drain can go on, one replica stays"
    );
}

/// Ports a NetworkPolicy opens to the pods it selects.
fn policy_ports(file: &str, labels: &serde_json::Value) -> std::collections::BTreeSet<u64> {
    let np = &yaml_docs(file)[0];
    assert_eq!(np["kind"], "NetworkPolicy");
    assert_eq!(&np["spec"]["podSelector"]["matchLabels"], labels, "{file}");
    assert_eq!(np["spec"]["policyTypes"][0], "Ingress");
    np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| {
            assert!(rule["from"].is_null(), "{file}: from anywhere, ports only");
            rule["ports"].as_array().unwrap().clone()
        })
        .map(|p| p["port"].as_u64().unwrap())
        .collect()
}

/// NetworkPolicies open exactly the ports the pods serve: the webhook and the probe port
/// on the controller, metrics and probes on the agent.
#[test]
fn network_policies_open_only_the_served_ports() {
    let dep = yaml_docs("daemonset/controller/deployment.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let served = |c: &serde_json::Value| -> std::collections::BTreeSet<u64> {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_u64().unwrap())
            .collect()
    };
    let ctl = container(&dep, "controller");
    assert_eq!(
        policy_ports(
            "daemonset/controller/networkpolicy.yaml",
            &dep["spec"]["template"]["metadata"]["labels"]
        ),
        served(ctl)
    );
    assert_eq!(served(ctl), [8081, 9443].into());
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    assert_eq!(
        policy_ports(
            "daemonset/node/networkpolicy.yaml",
            &ds["spec"]["template"]["metadata"]["labels"]
        ),
        served(container(ds, "agent"))
    );
}

/// `privileged` is on the agent only (for MIG), and components/unprivileged takes it away
/// with every capability but the two the agent's host files need.
#[test]
fn privileged_only_where_mig_needs_it() {
    for (file, doc) in installed_docs() {
        for c in doc["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if c["securityContext"]["privileged"] == true {
                assert!(
                    file.ends_with("node/daemonset.yaml") && c["name"] == "agent",
                    "{file}: {} is privileged",
                    c["name"].as_str().unwrap_or("?")
                );
            }
        }
    }
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    assert_eq!(
        ds["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &yaml_docs("daemonset/components/unprivileged/kustomization.yaml")[0];
    let patch: serde_json::Value =
        serde_saphyr::from_str(c["patches"][0]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(patch["metadata"]["name"], "tessera-node");
    let sc = &patch["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    let added: Vec<&str> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(added, ["DAC_OVERRIDE", "FOWNER"]);
}

/// The DaemonSet runs on GPU nodes without NVIDIA's feature discovery: Tessera's own
/// label alone selects a node, and `tessera.io/gpu=false` keeps one out.
#[test]
fn daemonset_runs_without_feature_discovery() {
    let ds = &yaml_docs("daemonset/node/daemonset.yaml")[0];
    let pod = &ds["spec"]["template"]["spec"];
    assert!(
        pod["nodeSelector"].is_null(),
        "no label only GFD sets is required"
    );
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .unwrap();
    // A node's labels against one term (In / NotIn only).
    let matches = |term: &serde_json::Value, labels: &[(&str, &str)]| {
        term["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| {
                let key = e["key"].as_str().unwrap();
                let values: Vec<&str> = e["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                let have = labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
                match e["operator"].as_str().unwrap() {
                    "In" => have.is_some_and(|v| values.contains(&v)),
                    "NotIn" => !have.is_some_and(|v| values.contains(&v)),
                    op => panic!("operator {op}"),
                }
            })
    };
    let runs = |labels: &[(&str, &str)]| terms.iter().any(|t| matches(t, labels));
    assert!(runs(&[("tessera.io/gpu", "true")]));
    assert!(runs(&[(
        "feature.node.kubernetes.io/pci-10de.present",
        "true"
    )]));
    assert!(runs(&[("nvidia.com/gpu.present", "true")]));
    assert!(!runs(&[]), "not on nodes without any GPU label");
    assert!(!runs(&[
        ("nvidia.com/gpu.present", "true"),
        ("tessera.io/gpu", "false")
    ]));
}

/// The controller may not write ConfigMaps at all (its requeue state lives on its own
/// Workload records), nor pods anywhere without a reason: write verbs are in the
/// workloads role (bindable per namespace), and the admission policy covers what RBAC
/// cannot, for the controller's own service account.
#[test]
fn controller_rbac_is_narrowed_to_what_it_manages() {
    let docs = yaml_docs("daemonset/controller/rbac.yaml");
    let role = |name: &str| {
        docs.iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ClusterRole {name}"))["rules"]
            .as_array()
            .unwrap()
            .clone()
    };
    let writes = [
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "*",
    ];
    let has = |r: &serde_json::Value, key: &str, x: &str| {
        r[key]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e.as_str() == Some(x)))
    };
    // The cluster-wide reader writes nothing in tenants' namespaces.
    for r in role("tessera-controller") {
        for res in ["pods", "configmaps", "jobs", "deployments", "secrets"] {
            if has(&r, "resources", res) {
                assert!(
                    !writes.iter().any(|w| has(&r, "verbs", w)),
                    "tessera-controller writes {res}: {r:?}"
                );
            }
        }
    }
    // No ConfigMap or Secret is read or written, in any role.
    for name in ["tessera-controller", "tessera-controller-workloads"] {
        for r in role(name) {
            for res in ["configmaps", "secrets"] {
                assert!(!has(&r, "resources", res), "{name}: {r:?}");
            }
        }
    }
    for r in role("tessera-controller-workloads") {
        assert!(
            !has(&r, "verbs", "*") && !has(&r, "resources", "*"),
            "{r:?}"
        );
    }
    // The workloads role is bound through its own binding, which namespaced-writes removes.
    let binding = docs
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRoleBinding"
                && d["roleRef"]["name"] == "tessera-controller-workloads"
        })
        .unwrap();
    let c = &yaml_docs("daemonset/components/namespaced-writes/kustomization.yaml")[0];
    let patch: serde_json::Value =
        serde_saphyr::from_str(c["patches"][0]["patch"].as_str().unwrap()).unwrap();
    assert_eq!(patch["$patch"], "delete");
    assert_eq!(patch["metadata"]["name"], binding["metadata"]["name"]);
    // The admission policy applies to the controller's service account, is bound, and
    // covers pods (update, delete, eviction).
    let sa = &yaml_docs("daemonset/controller/serviceaccount.yaml")[0];
    let user = format!(
        "system:serviceaccount:{}:{}",
        sa["metadata"]["namespace"].as_str().unwrap(),
        sa["metadata"]["name"].as_str().unwrap()
    );
    let vap = yaml_docs("daemonset/controller/admission-policy.yaml");
    let policy = vap
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let bound = vap
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .unwrap();
    assert_eq!(bound["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(bound["spec"]["validationActions"][0], "Deny");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let cond = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(cond.contains(&format!("\"{user}\"")), "{cond}");
    let rules = policy["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap();
    let covered = |res: &str, op: &str| {
        rules
            .iter()
            .any(|r| has(r, "resources", res) && has(r, "operations", op))
    };
    for (res, op) in [
        ("pods", "UPDATE"),
        ("pods", "DELETE"),
        ("pods/eviction", "CREATE"),
    ] {
        assert!(covered(res, op), "the policy does not cover {op} {res}");
    }
    let checks: String = policy["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["expression"].as_str().unwrap().to_string())
        .collect();
    for want in ["kube-system", "tessera.io/queue-name"] {
        assert!(checks.contains(want), "{want}");
    }
}
