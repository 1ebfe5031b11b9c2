//! Compiles the kubelet protos in `proto/` with protox (pure Rust, no system `protoc`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    // Everything but the v1beta1 health API, whose proto package name (`v1beta1`) collides
    // with the device-plugin API's: it gets its own output folder.
    let main_protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
        "proto/podresources/v1/api.proto",
    ];
    compile(&main_protos, out.clone())?;

    let health_out = out.join("health");
    std::fs::create_dir_all(&health_out)?;
    compile(&["proto/dra-health/v1beta1/api.proto"], health_out)?;
    Ok(())
}

fn compile(protos: &[&str], out_dir: PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .out_dir(out_dir)
        .compile_fds(fds)?;
    Ok(())
}
