//! Writes seed inputs for the formats the repository has no example files of, made with
//! Tessera's own encoders (their checksums must hold for a fuzzer to get past them).
//!
//! Usage: `seeds <corpus-dir>`: writes `<corpus-dir>/<target>/seed-*`. hack/fuzz.sh runs it
//! before fuzzing, so the seeds follow the current formats.

// `cargo fuzz build` instruments every binary of this crate for coverage: libFuzzer's
// runtime must be linked in for the instrumentation's hooks, even though nothing here fuzzes.
use libfuzzer_sys as _;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tessera::agent::split_record::{self, Recorded};
use tessera::dra::checkpoint::log::{self, Op};
use tessera::dra::checkpoint::{self, CreatedMig, Data, Phase, PreparedClaim, PreparedDevice};

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("seed-{name}")), bytes)
}

fn sample() -> Data {
    let device = |device: &str, mig: Option<CreatedMig>| PreparedDevice {
        pool: "node-a".into(),
        device: device.into(),
        request_names: vec!["gpu".into()],
        cdi_device_ids: vec![format!("gpu.tessera.io/claim={device}")],
        mig,
        time_slice: None,
    };
    let mig = CreatedMig {
        gpu_uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
        profile: "1g.10gb".into(),
        start: 2,
    };
    Data {
        boot_id: "6d1a0d0c-1f7e-4a53-9d3b-0c0c0c0c0c0c".into(),
        claims: BTreeMap::from([
            (
                "uid-1".to_string(),
                PreparedClaim {
                    namespace: "ml".into(),
                    name: "whole".into(),
                    phase: Phase::Completed,
                    devices: vec![device("gpu-0", None)],
                },
            ),
            (
                "uid-2".to_string(),
                PreparedClaim {
                    namespace: "ml".into(),
                    name: "mig".into(),
                    phase: Phase::Started,
                    devices: vec![device("gpu-1-mig-1g.10gb-2", Some(mig))],
                },
            ),
        ]),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .ok_or("usage: seeds <corpus-dir>")?;
    let out = Path::new(&out);
    let data = sample();

    write(
        out,
        "dra_checkpoint",
        "snapshot",
        &checkpoint::encode(&data)?,
    )?;
    write(
        out,
        "dra_checkpoint",
        "snapshot-log",
        &checkpoint::encode_snapshot(&data, 7)?,
    )?;
    write(
        out,
        "dra_checkpoint",
        "empty",
        &checkpoint::encode(&Data::default())?,
    )?;
    write(
        out,
        "dra_checkpoint",
        "content",
        &serde_json::to_vec(&data)?,
    )?;
    let mut log_bytes = log::header(7);
    let claim = data.claims["uid-1"].clone();
    log_bytes.extend(log::record(
        7,
        &[Op::Put {
            uid: "uid-3".into(),
            claim,
        }],
    )?);
    log_bytes.extend(log::record(
        7,
        &[Op::Delete("uid-2".into()), Op::BootId("b".into())],
    )?);
    write(out, "dra_checkpoint", "log", &log_bytes)?;

    let gpus = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let record = Recorded {
        dra: gpus(&["GPU-a", "GPU-b"]),
        withdrawing: gpus(&["GPU-b"]),
        device_plugin: gpus(&["GPU-c"]),
        config: "dra-split".into(),
    };
    write(
        out,
        "split_record",
        "record",
        &split_record::encode(&record)?,
    )?;
    write(
        out,
        "split_record",
        "empty",
        &split_record::encode(&Recorded::default())?,
    )?;
    write(
        out,
        "split_record",
        "content",
        &serde_json::to_vec(&record)?,
    )?;
    Ok(())
}
