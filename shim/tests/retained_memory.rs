//! Memory the driver keeps after a free: stream-ordered pools hold freed memory up to
//! their release threshold, and the graph memory pool holds what graph allocation nodes
//! needed until `cuDeviceGraphMemTrim`. Both stay counted while the driver holds them
//! (the shim's view and the driver's agree), and graph allocations are refused past the
//! limit.

mod support;
use support::*;

/// Shim-view used bytes of a probe report under `prefix`.
fn shim_used(r: &Report, prefix: &str) -> u64 {
    r.u(&format!("{prefix}total")) - r.u(&format!("{prefix}free"))
}

fn agrees(r: &Report, prefix: &str, want: u64, what: &str) {
    let fake = r.u(&format!("{prefix}fake_used"));
    assert_eq!(fake, want, "{what}: driver holds\n{}", r.stdout);
    let shim = shim_used(r, prefix);
    assert!(
        shim.abs_diff(fake) <= 4 * MIB,
        "{what}: shim says {shim}, driver {fake}\n{}",
        r.stdout
    );
}

#[test]
fn pool_memory_is_counted_until_released() {
    // (release threshold MiB, held after free+sync, plain 400 MiB alloc rc, held after reuse)
    let cases = [
        (1024, CTX + 512 * MIB, 2, CTX + 512 * MIB),
        (0, CTX, 0, CTX + 256 * MIB),
    ];
    for (thr, kept, plain_rc, reuse) in cases {
        let r = Probe::new("direct", "poolkeep", &[&thr.to_string()])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "1g")
            .run();
        assert_eq!(r.num("pooled"), 4, "{}\n{}", r.stdout, r.stderr);
        agrees(
            &r,
            "kept_",
            kept,
            &format!("threshold {thr}: after free + sync"),
        );
        assert_eq!(
            r.num("plain_rc"),
            plain_rc,
            "threshold {thr}: plain allocation while the pool holds memory"
        );
        assert_eq!(r.num("reuse_rc"), 0);
        agrees(&r, "reuse_", reuse, &format!("threshold {thr}: reuse"));
        agrees(&r, "trim_", CTX, &format!("threshold {thr}: trimmed"));
        assert_eq!(r.num("after_trim_rc"), 0);
    }
}

#[test]
fn graph_memory_nodes_are_counted_and_refused() {
    for mode in ["direct", "procaddr"] {
        let r = Probe::new(mode, "graph", &[])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
            .run();
        let rc = |k: &str| r.num(k);
        assert_eq!(
            (rc("a_inst_rc"), rc("a_rc"), rc("a2_rc")),
            (0, 0, 0),
            "{mode}: {}",
            r.stdout
        );
        agrees(&r, "a_", CTX + 1000 * MIB, "launched");
        agrees(
            &r,
            "a2_",
            CTX + 1000 * MIB,
            "relaunch reuses the graph pool",
        );
        assert_eq!(
            rc("plain_rc"),
            2,
            "{mode}: graph pool memory counts against the limit"
        );
        assert_eq!(
            rc("big_add_rc"),
            2,
            "{mode}: a 3 GiB node can never fit 2 GiB"
        );
        assert_eq!(
            rc("big_inst_rc"),
            2,
            "{mode}: 2 x 1200 MiB per launch never fits"
        );
        assert_eq!(rc("trim_rc"), 0);
        agrees(&r, "trim_", CTX, "trimmed");
        assert_eq!(rc("plain2_rc"), 0);
        assert_eq!(
            rc("a3_rc"),
            2,
            "{mode}: launch refused while memory is taken"
        );
        agrees(
            &r,
            "a3_",
            CTX + 1000 * MIB,
            "refused launch left the pool empty",
        );
        assert_eq!(rc("a4_rc"), 0);
        assert_eq!(r.u("graph_reserved"), 1000 * MIB);
        agrees(&r, "a4_", CTX + 1000 * MIB, "relaunched");
        assert_eq!(rc("destroy_rc"), 0);
    }
}

#[test]
fn captured_stream_allocations_count_when_the_graph_runs() {
    for mode in ["direct", "ptsz"] {
        let r = Probe::new(mode, "capture", &[])
            .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
            .run();
        for k in [
            "begin_rc",
            "cap_alloc_rc",
            "cap_free_rc",
            "end_rc",
            "inst_rc",
            "launch_rc",
        ] {
            assert_eq!(r.num(k), 0, "{mode}: {k}\n{}{}", r.stdout, r.stderr);
        }
        agrees(&r, "capalloc_", CTX, "capture allocates nothing");
        agrees(&r, "cap_", CTX, "captured graph not launched yet");
        agrees(
            &r,
            "launched_",
            CTX + 1000 * MIB,
            "launched graph holds its pool",
        );
        assert_eq!(
            r.num("plain_rc"),
            2,
            "{mode}: the launched graph's memory counts"
        );
    }
}

#[test]
fn created_pools_are_counted_where_they_live() {
    // Current device 0 has no limit, device 1 has 1 GiB: a 2000 MiB allocation from a pool
    // created on device 1 is refused; one from a pinned-host pool is not device memory.
    let r = Probe::new("direct", "pools", &["1"])
        .env("FAKE_CUDA_DEVICES", "2")
        .env("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")
        .run();
    assert_eq!(
        (r.num("host_create_rc"), r.num("dev_create_rc")),
        (0, 0),
        "{}",
        r.stdout
    );
    assert_eq!(
        r.num("host_alloc_rc"),
        0,
        "host pool: {}{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        r.num("dev_alloc_rc"),
        2,
        "device-1 pool: {}{}",
        r.stdout,
        r.stderr
    );
    // With device 0 limited the host pool still does not count against it.
    let r = Probe::new("direct", "pools", &["0"])
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
        .run();
    assert_eq!(
        (r.num("host_alloc_rc"), r.num("dev_alloc_rc")),
        (0, 2),
        "{}",
        r.stdout
    );
    agrees(&r, "", CTX, "host pool allocated no device memory");
}

#[test]
fn without_the_shim_the_fake_graph_passes_the_limit() {
    // The scenario above is only meaningful if the fake would otherwise go past 2 GiB.
    let r = Probe::bare("direct", "graph", &[]).run();
    assert_eq!(r.num("plain_rc"), 0);
    assert_eq!(r.num("big_inst_rc"), 0);
}

/// Runs `nested` under the 2 GiB limit (300 MiB context).
fn nested(mode: &str, args: &[&str]) -> Report {
    Probe::new(mode, "nested", args)
        .env("CUDA_DEVICE_MEMORY_LIMIT", "2g")
        .run()
}

#[test]
fn allocation_nodes_in_child_graphs_are_counted() {
    for mode in ["direct", "procaddr"] {
        // A 1000 MiB allocation node inside a child graph moved into its parent.
        let r = nested(mode, &["1", "1000", "-"]);
        assert_eq!(
            (r.num("build_rc"), r.num("inst_rc"), r.num("launch_rc")),
            (0, 0, 0),
            "{mode}: {}{}",
            r.stdout,
            r.stderr
        );
        agrees(&r, "launched_", CTX + 1000 * MIB, "child graph launched");
        assert_eq!(
            r.num("plain_rc"),
            2,
            "{mode}: the child graph's pool memory counts against the limit"
        );
        agrees(&r, "plain_", CTX + 1000 * MIB, "refused plain allocation");

        // 3 × 600 MiB over three nesting levels: fits alone, not next to the context.
        let r = nested(mode, &["3", "600", "-"]);
        assert_eq!(r.num("inst_rc"), 0, "{mode}: {}{}", r.stdout, r.stderr);
        assert_eq!(
            r.num("launch_rc"),
            2,
            "{mode}: nested allocations past the limit"
        );
        agrees(&r, "launched_", CTX, "refused launch allocated nothing");

        // 2 × 1200 MiB per launch (child + grandchild) can never fit 2 GiB.
        let r = nested(mode, &["2", "1200", "-"]);
        assert_eq!(r.num("inst_rc"), 2, "{mode}: {}{}", r.stdout, r.stderr);
    }
}

#[test]
fn nested_graphs_the_shim_cannot_read_are_refused() {
    // (args, env set on the fake, instantiate rc, words expected on stderr)
    let cases: [(&[&str], Option<&str>, i64, &str); 5] = [
        (
            &["1", "1000", "-"],
            Some("FAKE_CUDA_CHILD_QUERY_FAILS"),
            800,
            "cuGraphChildGraphNodeGetGraph failed",
        ),
        (&["17", "0", "-"], None, 800, "nested deeper than 16"),
        (&["16", "0", "-"], None, 0, ""),
        (
            &["1", "1000", "unknown"],
            None,
            800,
            "node type 99 is unknown",
        ),
        // Conditional bodies cannot hold memory nodes: not a reason to refuse.
        (&["1", "1000", "cond"], None, 0, ""),
    ];
    for (args, fail, inst, words) in cases {
        let mut p = Probe::new("direct", "nested", args).env("CUDA_DEVICE_MEMORY_LIMIT", "2g");
        if let Some(k) = fail {
            p = p.env(k, "1");
        }
        let r = p.run();
        assert_eq!(r.num("build_rc"), 0, "{args:?}: {}", r.stdout);
        assert_eq!(r.num("inst_rc"), inst, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains(words), "{args:?}: stderr {}", r.stderr);
        if inst != 0 {
            assert!(r.stderr.contains("refused"), "{args:?}: {}", r.stderr);
        }
    }
    // Without a memory limit the shim does not walk graphs at all.
    let r = Probe::new("direct", "nested", &["17", "0", "unknown"]).run();
    assert_eq!(r.num("inst_rc"), 0, "{}{}", r.stdout, r.stderr);
}

#[test]
fn without_the_shim_nested_graph_memory_passes_the_limit() {
    let r = Probe::bare("direct", "nested", &["3", "600", "-"]).run();
    assert_eq!(
        (r.num("inst_rc"), r.num("launch_rc")),
        (0, 0),
        "{}",
        r.stdout
    );
    assert!(r.u("launched_fake_used") > 2048 * MIB, "{}", r.stdout);
}
