//! Every way an application reaches the driver lands in the shim: direct binding, dlopen +
//! dlsym, dlvsym, dlsym(RTLD_NEXT), cuGetProcAddress (v1 and v2, several versions, ptsz), NVML; and the bypasses the
//! shim refuses (legacy 32-bit entry points, unknown allocator variants).

mod support;
use support::*;

#[test]
fn baseline_without_shim_is_not_limited() {
    let r = Probe::bare("direct", "fill", &["1024"]).run();
    assert!(r.num("count") > 70, "{}", r.stdout);
}

#[test]
fn every_path_is_limited_and_reports_the_slice() {
    for mode in MODES {
        let r = Probe::new(mode, "fill", &["1024"])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
            .run();
        // 300 MiB of context overhead + 9 GiB fit in 10 GiB; a 10th GiB does not.
        assert_eq!(r.num("count"), 9, "{mode}: {}\n{}", r.stdout, r.stderr);
        assert_eq!(
            r.num("rc"),
            2,
            "{mode}: refused with CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(r.u("total"), 10 * GIB, "{mode}");
        assert_eq!(r.u("device_total"), 10 * GIB, "{mode}");
        assert_eq!(r.u("free"), 10 * GIB - 9 * GIB - CTX, "{mode}");
        assert_eq!(r.u("after_free"), 10 * GIB - CTX, "{mode}: frees credited");
    }
}

#[test]
fn dlvsym_lands_in_the_shim() {
    // Against a driver whose symbols carry a version, dlvsym is a way around a dlsym-only
    // hook: without the shim nothing limits it, with the shim it stops at the slice.
    let bare = Probe::bare("dlvsym", "fill", &["1024"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
        .versioned()
        .run();
    assert!(bare.num("count") > 9, "{}{}", bare.stdout, bare.stderr);
    for mode in ["dlvsym", "dlsym", "direct"] {
        let r = Probe::new(mode, "fill", &["1024"])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
            .versioned()
            .run();
        assert_eq!(r.num("count"), 9, "{mode}: {}\n{}", r.stdout, r.stderr);
        assert_eq!(r.u("after_free"), 10 * GIB - CTX, "{mode}");
    }
}

#[test]
fn per_device_variable_wins() {
    let r = Probe::new("procaddr", "fill", &["512"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "10g")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "2048m")
        .run();
    assert_eq!(r.num("count"), 3, "{}", r.stdout);
    assert_eq!(r.u("total"), 2 * GIB);
}

#[test]
fn legacy_entry_points_are_refused() {
    for mode in ["direct", "dlsym", "procaddr"] {
        let r = Probe::new(mode, "legacy", &[])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .run();
        assert_eq!(r.num("legacy_rc"), 801, "{mode}: CUDA_ERROR_NOT_SUPPORTED");
        assert!(r.stderr.contains("legacy"), "{}", r.stderr);
    }
}

#[test]
fn unknown_allocator_variants_are_matched_by_address_or_refused() {
    let r = Probe::new("procaddr", "future", &[])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
        .run();
    // An alias of cuMemAlloc_v2 is caught by its address and charged.
    assert_eq!(r.num("alias_rc"), 0);
    assert_eq!(r.num("alias_alloc_rc"), 0);
    assert_eq!(r.u("free"), GIB - CTX - 64 * MIB, "{}", r.stdout);
    // An allocator the shim cannot account for is not handed out.
    assert_eq!(r.num("future_rc"), 500);
    assert_eq!(r.num("future_null"), 1);
    assert_eq!(r.num("future_status"), 1);
    assert!(r.stderr.contains("cuMemAllocFuture"), "{}", r.stderr);
}

#[test]
fn nvml_reports_the_slice_like_nvidia_smi() {
    let r = Probe::new("direct", "nvml", &[])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "10240m")
        .run();
    assert_eq!(r.num("nvml_rc"), 0);
    assert_eq!(r.u("nvml_total"), 10 * GIB);
    assert_eq!(r.u("nvml_used"), 0);
    assert_eq!(r.u("nvml2_total"), 10 * GIB);
    assert_eq!(r.u("nvml2_free"), 10 * GIB);
    let bare = Probe::bare("direct", "nvml", &[]).run();
    assert_eq!(bare.u("nvml_total"), 80 * GIB);
}

#[test]
fn nvml_follows_cuda_visible_devices_by_uuid() {
    // Two GPUs, limits 10g on CUDA ordinal 0 and 20g on ordinal 1; (CUDA_VISIBLE_DEVICES,
    // FAKE_NVML_MIG, expected NVML totals of physical GPU 0 and 1). NVML numbers GPUs
    // physically; the limits are per CUDA ordinal, so the slice moves with the list. With
    // FAKE_NVML_MIG CUDA's UUIDs are not NVML GPUs' (MIG instances): index = ordinal.
    let real = 80 * GIB;
    let cases: [(Option<&str>, &str, [u64; 2]); 4] = [
        (None, "0", [10 * GIB, 20 * GIB]),
        (Some("1"), "0", [real, 10 * GIB]),
        (Some("1,0"), "0", [20 * GIB, 10 * GIB]),
        (Some("1"), "1", [10 * GIB, 20 * GIB]),
    ];
    for (visible, mig, want) in cases {
        let mut p = Probe::new("direct", "nvml", &[])
            .env("FAKE_CUDA_DEVICES", "2")
            .env("FAKE_NVML_MIG", mig)
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "10g")
            .env("CUDA_DEVICE_MEMORY_LIMIT_1", "20g");
        if let Some(v) = visible {
            p = p.env("CUDA_VISIBLE_DEVICES", v);
        }
        let r = p.run();
        let got = [r.u("dev0_total"), r.u("dev1_total")];
        assert_eq!(
            got, want,
            "CUDA_VISIBLE_DEVICES={visible:?} mig={mig}\n{}{}",
            r.stdout, r.stderr
        );
    }
}

#[test]
fn no_limit_means_pass_through() {
    let r = Probe::new("dlsym", "fill", &["1024"]).run();
    assert!(r.num("count") > 70);
    assert_eq!(r.u("total"), 80 * GIB);
}

#[test]
fn malformed_configuration_fails_closed_and_loudly() {
    let cases = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "10 gigs"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "-1"),
        ("CUDA_DEVICE_MEMORY_LIMIT_99", "1g"),
        ("CUDA_DEVICE_SM_LIMIT_0", "250"),
        ("TESSERA_CORE_POLICY", "maybe"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/proc/no/such/dir/cache"),
    ];
    for (var, value) in cases {
        let r = Probe::new("direct", "fill", &["64"])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .env(var, value)
            .run();
        assert!(
            r.stdout.contains("init_rc=800"),
            "{var}={value}: {}",
            r.stdout
        );
        assert!(
            r.stderr.contains("refusing CUDA"),
            "{var}={value}: {}",
            r.stderr
        );
        let named = if var == "CUDA_DEVICE_MEMORY_SHARED_CACHE" {
            value
        } else {
            var
        };
        assert!(r.stderr.contains(named), "{var}={value}: {}", r.stderr);
    }
}

#[test]
fn tessera_log_off_silences_info_but_not_behaviour() {
    let r = Probe::new("direct", "fill", &["1024"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .env("TESSERA_LOG", "off")
        .run();
    assert_eq!(r.num("count"), 1);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    let r = Probe::new("direct", "fill", &["1024"])
        .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .env("TESSERA_LOG", "info")
        .run();
    assert!(r.stderr.contains("out of memory"), "{}", r.stderr);
}
