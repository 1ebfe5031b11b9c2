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
        .map(|d| {
            d["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
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
                for sel in r["exactly"]["selectors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
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

/// Every TESSERA_* variable the DaemonSet sets is one `tessera node` reads.
#[test]
fn daemonset_env_is_read_by_the_agent() {
    let text = std::fs::read_to_string("daemonset/node/daemonset.yaml").unwrap();
    let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--help"])
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
        let patch: serde_json::Value = serde_saphyr::from_str(p["patch"].as_str().unwrap()).unwrap();
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
