//! SM limiting against the fake driver's simulated kernel time: the measured busy share
//! tracks `CUDA_DEVICE_SM_LIMIT` within ±5 points on every launch API, whatever the kernel
//! length and SM count; no limit (or `TESSERA_CORE_POLICY=disable`) does not throttle.

mod support;
use support::*;

struct Run {
    name: String,
    target: Option<f64>,
    probe: Probe,
}

fn spin(mode: &str, api: &str, wave_us: u32, blocks: u32, sms: u32) -> Probe {
    Probe::new(
        mode,
        "spin",
        &["3000", &wave_us.to_string(), &blocks.to_string(), api],
    )
    .env("FAKE_CUDA_SMS", sms.to_string())
}

/// One test's probes at a time: both tests' dozen probes at once on a 2-core machine
/// starve the probes' own launch loops (the unthrottled share fell to 52% and a 70%
/// limit measured 59% that way), which measures the machine, not the limiter.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run all probes at once (they mostly sleep) and check each share.
fn check(runs: Vec<Run>) {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let handles: Vec<_> = runs
        .into_iter()
        .map(|r| (r.name, r.target, r.probe.spawn()))
        .collect();
    let mut failures = Vec::new();
    for (name, target, child) in handles {
        let r = Report::from(child.wait_with_output().unwrap());
        let share = r.f("share");
        match target {
            Some(t) if (share - t).abs() > 5.0 => {
                failures.push(format!("{name}: {share:.1}% vs {t}%"))
            }
            // Unthrottled, the share is what the probe's launch+sync loop achieves, which
            // drops with CPU contention (59–70 % seen on the loaded 2-core CI VM with the
            // dozen probes of this file at once); the limits below are 40 % at most, so
            // 55 % still tells "not throttled" from "throttled to 40 %".
            None if share < 55.0 => {
                failures.push(format!("{name}: {share:.1}% throttled without a limit"))
            }
            _ => eprintln!("{name}: {share:.1}%"),
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn share_tracks_the_limit_at_10_30_50_70() {
    // (target, wave µs, blocks, SMs): kernel lengths and SM counts the controller must learn.
    let cases = [
        (10, 700, 132, 132),
        (30, 300, 264, 132),
        (50, 1000, 188, 188),
        (70, 500, 376, 188),
    ];
    let runs = cases
        .iter()
        .map(|&(t, wave, blocks, sms)| Run {
            name: format!("{t}% wave {wave}µs x{blocks}/{sms}"),
            target: Some(f64::from(t)),
            probe: spin("direct", "kernel", wave, blocks, sms)
                .env("CUDA_DEVICE_SM_LIMIT_0", t.to_string()),
        })
        .collect();
    check(runs);
}

#[test]
fn every_launch_api_and_path_is_throttled() {
    let cases = [
        ("direct", "ex"),
        ("direct", "coop"),
        ("direct", "graph"),
        ("ptsz", "kernel"),
        ("procaddr", "graph"),
        ("dlsym", "coop"),
    ];
    let mut runs: Vec<Run> = cases
        .iter()
        .map(|&(mode, api)| Run {
            name: format!("{mode}/{api} at 40%"),
            target: Some(40.0),
            probe: spin(mode, api, 600, 132, 132).env("CUDA_DEVICE_SM_LIMIT", "40"),
        })
        .collect();
    runs.push(Run {
        name: "no limit".into(),
        target: None,
        probe: spin("direct", "kernel", 600, 132, 132),
    });
    runs.push(Run {
        name: "policy disable".into(),
        target: None,
        probe: spin("direct", "kernel", 600, 132, 132)
            .env("CUDA_DEVICE_SM_LIMIT", "40")
            .env("TESSERA_CORE_POLICY", "disable"),
    });
    check(runs);
}
