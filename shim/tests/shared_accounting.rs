//! Accounting shared by the processes of one container (`CUDA_DEVICE_MEMORY_SHARED_CACHE`):
//! the sum never passes the limit, killed processes (even inside the lock) never wedge the
//! others and their memory comes back, and a corrupt or foreign file is rebuilt.

mod support;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

fn cache(dir: &tempfile::TempDir) -> String {
    dir.path().join("vgpu.cache").to_string_lossy().into_owned()
}

fn limited(p: Probe, cache: &str, limit: &str) -> Probe {
    p.env("CUDA_DEVICE_MEMORY_LIMIT", limit)
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache)
}

#[test]
fn processes_share_the_limit_and_a_killed_one_is_credited() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    let mut holder = limited(Probe::new("direct", "hold", &["600"]), &c, "2g").spawn();
    assert_eq!(wait_line(&mut holder, "hold_rc=", 20), "hold_rc=0");
    // The holder has 300 MiB context + 600 MiB; we have 300 MiB context: 848 MiB left.
    let r = limited(Probe::new("dlsym", "fill", &["64"]), &c, "2g").run();
    assert_eq!(r.num("count"), 13, "{}\n{}", r.stdout, r.stderr);
    kill9(&mut holder);
    let r = limited(Probe::new("procaddr", "fill", &["64"]), &c, "2g").run();
    assert_eq!(
        r.num("count"),
        27,
        "(2048 - 300) / 64 once the holder is gone: {}",
        r.stdout
    );
}

#[test]
fn a_process_killed_while_holding_the_lock_does_not_wedge_others() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    // Create the file, then have another process take its lock and be killed holding it.
    let r = limited(Probe::new("direct", "info", &[]), &c, "1g").run();
    assert_eq!(r.num("info_rc"), 0);
    // flock(1) holds the lock; its `sleep` child outlives the SIGKILL below as an orphan,
    // so it must not keep the test's stdout/stderr open (that would stall whoever reads
    // the test output until it exits) and must not linger long.
    let mut locker = Command::new("flock")
        .args(["-o", c.as_str(), "sleep", "30"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("flock(1) from util-linux");
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let mut waiter = limited(Probe::new("direct", "fill", &["64"]), &c, "1g").spawn();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "registration waits for the lock"
    );
    kill9(&mut locker);
    let line = wait_line(&mut waiter, "count=", 20);
    assert_eq!(line, "count=11 rc=2");
    assert!(start.elapsed() < Duration::from_secs(10));
    let _ = waiter.wait();
}

#[test]
fn processes_killed_at_random_instants_never_wedge_or_leak() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    for round in 0..4u64 {
        let mut kids: Vec<_> = (0..6)
            .map(|_| {
                limited(
                    Probe::new("direct", "stress", &["4", "100000", "8"]),
                    &c,
                    "1g",
                )
                .env("FAKE_CUDA_CTX_OVERHEAD_MIB", "0")
                .spawn()
            })
            .collect();
        // Kill them at staggered instants: during startup, registration and allocation.
        for (i, k) in kids.iter_mut().enumerate() {
            std::thread::sleep(Duration::from_millis(5 + 17 * (i as u64 + round)));
            kill9(k);
        }
    }
    let start = Instant::now();
    let r = limited(Probe::new("direct", "fill", &["64"]), &c, "1g")
        .env("FAKE_CUDA_CTX_OVERHEAD_MIB", "0")
        .run();
    assert_eq!(
        r.num("count"),
        16,
        "all memory of the dead came back: {}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(start.elapsed() < Duration::from_secs(10), "not wedged");
}

#[test]
fn sixteen_processes_times_eight_threads_never_pass_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    let state = dir.path().join("gpu.state");
    let kids: Vec<_> = (0..16)
        .map(|_| {
            limited(
                Probe::new("direct", "stress", &["8", "1000", "8"]),
                &c,
                "256m",
            )
            .env("FAKE_CUDA_CTX_OVERHEAD_MIB", "0")
            .env("FAKE_GPU_STATE", &state)
            .spawn()
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for k in kids {
        let out = k.wait_with_output().unwrap();
        let r = Report::from(out);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        assert_eq!(r.num("errors"), 0, "{}", r.stdout);
        ok += r.num("ok");
        refused += r.num("refused");
    }
    assert!(ok > 1000, "most allocations succeed: {ok}");
    let (used, peak) = fake_state(&state);
    assert_eq!(used, 0, "everything freed");
    assert!(refused > 0, "the limit was actually contended");
    assert!(
        peak <= 256 * MIB + GRAN,
        "driver peak {peak} passed the limit by more than a granule"
    );
}

#[test]
fn sixty_four_threads_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    let state = dir.path().join("gpu.state");
    let r = limited(
        Probe::new("procaddr", "stress", &["64", "1000", "8"]),
        &c,
        "256m",
    )
    .env("FAKE_CUDA_CTX_OVERHEAD_MIB", "0")
    .env("FAKE_GPU_STATE", &state)
    .run();
    assert!(r.num("refused") > 0 && r.num("ok") > 1000, "{}", r.stdout);
    assert_eq!(r.num("errors"), 0, "{}", r.stdout);
    assert_eq!(r.u("free"), 256 * MIB, "all credited");
    let (used, peak) = fake_state(&state);
    assert_eq!(used, 0);
    assert!(peak <= 256 * MIB + GRAN, "peak {peak}");
}

#[test]
fn corrupt_or_foreign_files_are_rebuilt() {
    let mut foreign = vec![0u8; 25664];
    foreign[..8].copy_from_slice(b"TSRACCT\0");
    foreign[8] = 99; // another version
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"not an accounting file".to_vec()),
        ("foreign version", foreign),
        ("truncated", vec![0xff; 100]),
    ];
    for (what, bytes) in cases {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(&dir);
        std::fs::write(&c, bytes).unwrap();
        let r = limited(Probe::new("direct", "fill", &["64"]), &c, "1g").run();
        assert_eq!(r.num("count"), 11, "{what}: {}\n{}", r.stdout, r.stderr);
        assert!(r.stderr.contains("rebuilding"), "{what}: {}", r.stderr);
        assert_eq!(std::fs::metadata(&c).unwrap().len(), 25664, "{what}");
    }
}

#[test]
fn fork_gives_the_child_its_own_slot() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(&dir);
    let r = limited(Probe::new("direct", "fork", &["64"]), &c, "1g").run();
    assert_eq!(r.num("parent_rc"), 0);
    assert_eq!(r.num("child_rc"), 0, "{}\n{}", r.stdout, r.stderr);
    // The child sees the parent's context + 64 MiB and its own 64 MiB.
    assert_eq!(r.u("child_free"), GIB - CTX - 128 * MIB, "{}", r.stdout);
    // After the child exits its 64 MiB comes back to the parent's view.
    assert_eq!(r.u("parent_free"), GIB - CTX - 64 * MIB, "{}", r.stdout);
}
