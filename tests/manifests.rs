//! The shipped manifests stay in step with the code: every named layout in the example
//! ConfigMap parses and lays out on real GPU models.

use tessera::agent;
use tessera::gpu::fake::FakeBackend;
use tessera::partition::config::parse_config;

#[test]
fn example_configmap_layouts_are_valid() {
    let text = std::fs::read_to_string("daemonset/node/configmap.yaml").unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let data = doc["data"].as_mapping().unwrap();
    assert!(data.contains_key("default"), "a default config must exist");
    for (name, body) in data {
        let name = name.as_str().unwrap();
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
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg =
            parse_config("example", &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let backend = FakeBackend::from_spec("4xA100-80GB").unwrap();
        agent::build(&backend, &cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
