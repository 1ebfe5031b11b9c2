//! Every allocating API is charged at the driver's granularity (pitch at the real pitch)
//! and credited on free, and the shim's view agrees with the driver's (NVML) view.

mod support;
use support::*;

#[test]
fn each_allocation_kind_is_limited_and_credited() {
    // (kind, 64 MiB requests that fit in 1 GiB minus the 300 MiB context)
    let cases = [
        ("alloc", 11),
        ("managed", 11),
        // 1000-byte rows are padded to a 1024-byte pitch: 65.5 MiB, 66 MiB at 2 MiB granularity.
        ("pitch", 10),
        ("async", 11),
        ("pool", 11),
        ("vmm", 11),
        ("array", 11),
        ("array3d", 11),
        ("mipmap", 11),
    ];
    for (kind, fits) in cases {
        for mode in ["direct", "procaddr"] {
            let r = Probe::new(mode, "fill", &["64", kind])
                .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
                .run();
            assert_eq!(
                r.num("count"),
                fits,
                "{kind} via {mode}: {}\n{}",
                r.stdout,
                r.stderr
            );
            assert_eq!(r.num("rc"), 2, "{kind} via {mode}");
            let shim_used = r.u("total") - r.u("free");
            let fake_used = r.u("fake_used");
            assert!(
                shim_used.abs_diff(fake_used) <= 4 * MIB,
                "{kind} via {mode}: shim says {shim_used}, driver says {fake_used}"
            );
            assert!(shim_used <= GIB, "{kind}: never past the limit");
            assert_eq!(
                r.u("after_free"),
                GIB - CTX,
                "{kind} via {mode}: frees credited"
            );
            assert_eq!(
                r.u("after_fake_used"),
                CTX,
                "{kind} via {mode}: driver agrees after free"
            );
        }
    }
}

#[test]
fn small_allocations_count_whole_granules() {
    // 1 MiB requests cost 2 MiB each: (1024 - 300) / 2 = 362 fit.
    let r = Probe::new("direct", "fill", &["1", "alloc"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .run();
    assert_eq!(r.num("count"), 362, "{}", r.stdout);
}

#[test]
fn context_overhead_is_measured_not_guessed() {
    let r = Probe::new("direct", "fill", &["64", "alloc"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .env("FAKE_CUDA_CTX_OVERHEAD_MIB", "100")
        .run();
    assert_eq!(r.num("count"), 14, "(1024 - 100) / 64: {}", r.stdout);
    assert_eq!(r.u("after_free"), GIB - 100 * MIB);
}
