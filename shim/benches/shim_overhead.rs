//! Per-call overhead of the shim against the fake driver, as differences and ratios to
//! calling the fake directly (`cargo bench -p tessera-cuda --bench shim_overhead`).
//!
//! The probe times 200k `cuMemAlloc_v2`+`cuMemFree_v2` pairs and 200k `cuLaunchKernel`
//! calls in one process, in batches of 1000, and reports the median batch (and, for the
//! pair, the fastest batch, the plain mean over all batches, which counts time the
//! process spent preempted on a loaded machine; the first version of this bench reported
//! only that; and the median batch of `cuMemAllocAsync`+`cuMemFreeAsync` pairs on the
//! default pool). Configurations
//! run round-robin, 7 rounds, and the fastest run of each is reported: on a shared 2-core
//! machine the minimum is the figure least polluted by other processes.
//!
//! `SHIM_BENCH_BEFORE=/path/to/old/libtessera_cuda.so` adds rows for that build (shared
//! file and process-local limit), measured in the same rounds: a before/after comparison
//! side by side.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use support::Probe;

/// Full run under `cargo bench` (which passes `--bench`); a quick smoke run otherwise
/// (`cargo test --all-targets` runs harness-less benches too).
fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn main() {
    let (iters, rounds, warm) = if full() {
        ("200000", 7, "1500")
    } else {
        ("2000", 1, "0")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("vgpu.cache");
    type Make = Box<dyn Fn() -> Probe>;
    let configs: Vec<(&str, Make)> = vec![
        (
            "direct (no shim)",
            Box::new(|| Probe::bare("direct", "bench", &[iters])),
        ),
        (
            "shim, no limits",
            Box::new(|| Probe::new("direct", "bench", &[iters])),
        ),
        (
            "shim, memory limit",
            Box::new(|| {
                Probe::new("direct", "bench", &[iters]).env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
            }),
        ),
        (
            "shim, memory limit + shared file",
            Box::new(move || {
                Probe::new("direct", "bench", &[iters])
                    .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
                    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache)
            }),
        ),
        (
            "shim, SM limit 50% (fast path)",
            Box::new(|| {
                Probe::new("direct", "bench", &[iters, warm]).env("CUDA_DEVICE_SM_LIMIT", "50")
            }),
        ),
    ];
    let mut configs = configs;
    if let Some(before) = std::env::var_os("SHIM_BENCH_BEFORE").map(PathBuf::from) {
        let cache = dir.path().join("before.cache");
        let b2 = before.clone();
        configs.push((
            "before: memory limit",
            Box::new(move || {
                Probe::with_shim(&b2, "direct", "bench", &[iters])
                    .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
            }),
        ));
        configs.push((
            "before: memory limit + shared file",
            Box::new(move || {
                Probe::with_shim(&before, "direct", "bench", &[iters])
                    .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
                    .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache)
            }),
        ));
    }
    let mut best = vec![[f64::MAX; 5]; configs.len()];
    for _ in 0..rounds {
        for ((_, make), b) in configs.iter().zip(best.iter_mut()) {
            let r = make().run();
            let keys = [
                "pair_ns",
                "launch_ns",
                "pair_min_ns",
                "pair_mean_ns",
                "async_ns",
            ];
            for (v, k) in b.iter_mut().zip(keys) {
                *v = v.min(r.f(k));
            }
        }
    }
    let base = best[0];
    println!(
        "{:<34} {:>8} {:>7} {:>6} {:>9} {:>7} {:>6} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}",
        "configuration",
        "pair ns",
        "+ns",
        "ratio",
        "launch",
        "+ns",
        "ratio",
        "pair min",
        "+ns",
        "pair mean",
        "+ns",
        "async",
        "+ns"
    );
    for ((name, _), [pair, launch, min, mean, asy]) in configs.iter().zip(best) {
        println!(
            "{name:<34} {pair:>8.1} {:>7.1} {:>6.2} {launch:>9.1} {:>7.1} {:>6.2} {min:>9.1} {:>7.1} {mean:>9.1} {:>7.1} {asy:>9.1} {:>7.1}",
            pair - base[0],
            pair / base[0],
            launch - base[1],
            launch / base[1],
            min - base[2],
            mean - base[3],
            asy - base[4]
        );
    }
}
