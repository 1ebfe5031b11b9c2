//! The escapes of issue 17 ("vGPU limits are advisory today"), tried from inside a
//! container built the way a runtime builds it from the agent's own answer: the device
//! plugin's Allocate (served by the agent's `ResourceService`) and the DRA driver's claim
//! CDI spec. Each container is a private mount namespace over a fresh root: the host's
//! `/usr` read-only, the fake driver, and the answer's bind mounts (read-only where the
//! answer says so), its environment; `CAP_SYS_ADMIN` is dropped as container runtimes do,
//! and the memory escapes run as a non-root uid. Against the fake driver (80 GiB), a
//! 16 GiB / 25 % slice:
//!
//! - raising `CUDA_DEVICE_MEMORY_LIMIT_0` to 70g → still 16 GiB;
//! - `TESSERA_CORE_POLICY=disable` → still throttled to 25 %;
//! - unsetting `CUDA_DEVICE_MEMORY_SHARED_CACHE` in a second process → the two share 16 GiB;
//! - writing, removing or remounting the limits file → refused;
//! - unsetting `LD_PRELOAD` (the shim comes from the mounted `/etc/ld.so.preload`) → limited;
//! - a limits file that is not there → CUDA refused (fail closed).
//!
//! Needs root (mount namespaces, chroot). Where that is not available the tests fail,
//! loudly; outside CI, `TESSERA_SKIP_CONTAINER_TESTS=1` turns them into a printed skip.

mod support;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use support::*;
use tessera::deviceplugin::allocate::AllocateSettings;
use tessera::deviceplugin::server::{snapshot_channel, ResourceService};
use tessera::deviceplugin::snapshot::Snapshot;
use tessera::gpu::GpuBackend;
use tessera::proto::deviceplugin as pb;
use tessera::proto::deviceplugin::device_plugin_server::DevicePlugin;

const SLICE: &str =
    "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 4, memory: 16g, cores: 25 } } ] }";
const UID: u32 = 1000;

/// Whether the container tests may run here; panics (fails the test) when they cannot,
/// unless skipping was asked for outside CI.
fn containers_available() -> bool {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .unwrap_or_default();
    if euid == "0" {
        return true;
    }
    let skip = std::env::var_os("TESSERA_SKIP_CONTAINER_TESTS").is_some()
        && std::env::var_os("CI").is_none();
    if skip {
        eprintln!("SKIPPED: container escape tests need root (mount namespaces, chroot)");
        return false;
    }
    panic!(
        "container escape tests need root (mount namespaces, chroot); \
         outside CI, TESSERA_SKIP_CONTAINER_TESTS=1 skips them"
    );
}

struct Bind {
    host: PathBuf,
    container: String,
    read_only: bool,
}

/// A container: a fresh root and its bind mounts.
struct Container {
    root: tempfile::TempDir,
    binds: Vec<Bind>,
    env: BTreeMap<String, String>,
}

impl Container {
    fn new() -> Container {
        let root = tempfile::tempdir().expect("rootfs");
        let r = root.path();
        let mut binds = Vec::new();
        for name in ["bin", "lib", "lib64", "sbin"] {
            let host = Path::new("/").join(name);
            match std::fs::read_link(&host) {
                Ok(target) => std::os::unix::fs::symlink(target, r.join(name)).expect("symlink"),
                Err(_) if host.is_dir() => binds.push(Bind {
                    host,
                    container: format!("/{name}"),
                    read_only: true,
                }),
                Err(_) => {}
            }
        }
        for name in ["bin", "lib", "lib64", "sbin", "libexec"] {
            let host = Path::new("/usr").join(name);
            if host.is_dir() && !host.is_symlink() {
                binds.push(Bind {
                    host,
                    container: format!("/usr/{name}"),
                    read_only: true,
                });
            }
        }
        binds.push(Bind {
            host: fake_dir().to_path_buf(),
            container: "/opt/fake".into(),
            read_only: true,
        });
        std::fs::create_dir_all(r.join("etc")).expect("etc");
        for f in ["ld.so.cache", "passwd", "group"] {
            let _ = std::fs::copy(Path::new("/etc").join(f), r.join("etc").join(f));
        }
        for d in ["proc", "tmp"] {
            std::fs::create_dir_all(r.join(d)).expect("dir");
        }
        let env = [
            ("PATH", "/usr/bin:/bin:/usr/sbin:/sbin"),
            ("LD_LIBRARY_PATH", "/opt/fake"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Container { root, binds, env }
    }

    /// The device plugin's answer for one container.
    fn from_allocate(answer: &pb::ContainerAllocateResponse) -> Container {
        let mut c = Container::new();
        for m in &answer.mounts {
            c.binds.push(Bind {
                host: m.host_path.clone().into(),
                container: m.container_path.clone(),
                read_only: m.read_only,
            });
        }
        c.env
            .extend(answer.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        c
    }

    /// A claim's CDI spec (its claim-wide edits: env and mounts).
    fn from_cdi(edits: &tessera::cdi::ContainerEdits) -> Container {
        let mut c = Container::new();
        for m in &edits.mounts {
            c.binds.push(Bind {
                host: m.host_path.clone().into(),
                container: m.container_path.clone(),
                read_only: m.options.iter().any(|o| o == "ro"),
            });
        }
        for e in &edits.env {
            if let Some((k, v)) = e.split_once('=') {
                c.env.insert(k.to_string(), v.to_string());
            }
        }
        c
    }

    /// `program args` inside the container, with the container's environment changed by
    /// `set` (a `None` value unsets), as `uid` (root when `None`) without CAP_SYS_ADMIN.
    fn command(
        &self,
        program: &str,
        args: &[&str],
        set: &[(&str, Option<&str>)],
        uid: Option<u32>,
    ) -> Command {
        let r = self.root.path();
        let cstr = |p: &Path| CString::new(p.as_os_str().as_bytes()).expect("no NUL");
        let mut mounts = Vec::new();
        for b in &self.binds {
            let target = r.join(b.container.trim_start_matches('/'));
            if b.host.is_dir() {
                std::fs::create_dir_all(&target).expect("mount point");
            } else {
                std::fs::create_dir_all(target.parent().expect("parent")).expect("mount dir");
                if !target.exists() {
                    std::fs::write(&target, b"").expect("mount point file");
                }
            }
            mounts.push((cstr(&b.host), cstr(&target), b.read_only));
        }
        let root = cstr(r);
        let proc_dir = cstr(&r.join("proc"));
        let mut cmd = Command::new(program);
        cmd.args(args).env_clear();
        let mut env = self.env.clone();
        for (k, v) in set {
            match v {
                Some(v) => env.insert(k.to_string(), v.to_string()),
                None => env.remove(*k),
            };
        }
        cmd.envs(&env);
        let hook = move || -> std::io::Result<()> {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            let null = std::ptr::null::<libc::c_char>();
            // SAFETY: plain syscalls on NUL-terminated strings prepared before fork.
            unsafe {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                for (src, dst, ro) in &mounts {
                    check(libc::mount(
                        src.as_ptr(),
                        dst.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    if *ro {
                        check(libc::mount(
                            src.as_ptr(),
                            dst.as_ptr(),
                            null,
                            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                            std::ptr::null(),
                        ))?;
                    }
                }
                check(libc::mount(
                    c"proc".as_ptr(),
                    proc_dir.as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ))?;
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(c"/".as_ptr()))?;
                // What a runtime's default capability set lacks: no mount, no umount.
                check(libc::prctl(libc::PR_CAPBSET_DROP, 21, 0, 0, 0))?;
                if let Some(uid) = uid {
                    check(libc::setgroups(0, std::ptr::null()))?;
                    check(libc::setgid(uid))?;
                    check(libc::setuid(uid))?;
                }
            }
            Ok(())
        };
        // SAFETY: the hook only makes async-signal-safe syscalls.
        unsafe { cmd.pre_exec(hook) };
        cmd
    }

    fn probe(&self, cmd: &str, args: &[&str], set: &[(&str, Option<&str>)]) -> Report {
        let mut full = vec!["direct", cmd];
        full.extend_from_slice(args);
        let out = self
            .command("/opt/fake/probe", &full, set, Some(UID))
            .output()
            .expect("run the probe in the container");
        Report::from(out)
    }
}

/// The agent's settings with the shim installed from this build.
fn settings(state: &Path) -> AllocateSettings {
    let s = AllocateSettings {
        cdi: false,
        ..AllocateSettings::with_state_dir(state)
    };
    s.shim
        .install(&shim_path(), &s.shim_container_path)
        .expect("install the shim");
    s
}

/// The device plugin's Allocate answer for one 16 GiB / 25 % slice.
fn allocate(settings: AllocateSettings) -> pb::ContainerAllocateResponse {
    let inv = tessera::gpu::fake::FakeBackend::from_spec("1xH100-80GB")
        .and_then(|b| b.inventory())
        .expect("fake inventory");
    let cfg = tessera::partition::config::parse_config("t", SLICE).expect("config");
    let plan = tessera::partition::layout::plan(&inv, &cfg).expect("plan");
    let snapshot = Snapshot {
        generation: 1,
        advertisement: tessera::partition::layout::advertise(&inv, &cfg, &plan).expect("adv"),
        allocation: cfg.allocation.clone(),
        ..Default::default()
    };
    let id = snapshot.resource("nvidia.com/vgpu").expect("vgpu").devices[0]
        .id
        .clone();
    let (_tx, rx) = snapshot_channel(snapshot);
    let service = ResourceService::new(
        "nvidia.com/vgpu",
        rx,
        Arc::new(settings),
        tokio_util::sync::CancellationToken::new(),
        Arc::new(tessera::metrics::NodeMetrics::new()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let resp = rt
        .block_on(service.allocate(tonic::Request::new(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![id],
            }],
        })))
        .expect("Allocate")
        .into_inner();
    resp.container_responses
        .into_iter()
        .next()
        .expect("one container")
}

/// `count` and `total` of a `fill 1024` run.
fn fill(c: &Container, set: &[(&str, Option<&str>)]) -> (i64, u64) {
    let r = c.probe("fill", &["1024"], set);
    assert!(
        r.vals.contains_key("count"),
        "{set:?}: {}\n{}",
        r.stdout,
        r.stderr
    );
    (r.num("count"), r.u("total"))
}

#[test]
fn device_plugin_container_cannot_lift_its_limits() {
    if !containers_available() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let answer = allocate(settings(state.path()));
    assert!(!answer.envs.contains_key("LD_PRELOAD"), "preloaded by file");
    let c = Container::from_allocate(&answer);

    // As answered: 300 MiB of context + 15 × 1 GiB in 16 GiB.
    assert_eq!(fill(&c, &[]), (15, 16 * GIB));
    // Raise the limit, lift the cache, clear LD_PRELOAD: the same slice.
    let escapes: &[&[(&str, Option<&str>)]] = &[
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", Some("70g"))],
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", Some("70g")),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", None),
        ],
        &[("CUDA_DEVICE_MEMORY_SHARED_CACHE", Some("/tmp/mine"))],
        &[("LD_PRELOAD", None)],
        &[("LD_PRELOAD", Some(""))],
    ];
    for set in escapes {
        assert_eq!(fill(&c, set), (15, 16 * GIB), "{set:?}");
    }
    // Lowering is allowed.
    assert_eq!(
        fill(&c, &[("CUDA_DEVICE_MEMORY_LIMIT_0", Some("4g"))]).1,
        4 * GIB
    );

    // Two processes, the second without CUDA_DEVICE_MEMORY_SHARED_CACHE: one slice.
    let mut holder = c
        .command(
            "/opt/fake/probe",
            &["direct", "hold", "8192"],
            &[],
            Some(UID),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder");
    assert_eq!(wait_line(&mut holder, "hold_rc=", 20), "hold_rc=0");
    let second = fill(&c, &[("CUDA_DEVICE_MEMORY_SHARED_CACHE", None)]);
    kill9(&mut holder);
    // 16384 − 2 × 300 (contexts) − 8192 leaves 7 GiB, not the 15 a full slice would give.
    assert_eq!(
        second,
        (7, 16 * GIB),
        "the second process got its own slice"
    );

    // TESSERA_CORE_POLICY=disable (and SM limit 100) do not lift the 25 % SM limit.
    let r = c.probe(
        "spin",
        &["3000", "300", "264", "kernel"],
        &[
            ("TESSERA_CORE_POLICY", Some("disable")),
            ("CUDA_DEVICE_SM_LIMIT_0", Some("100")),
            ("FAKE_CUDA_SMS", Some("132")),
        ],
    );
    let share = r.f("share");
    assert!(
        (share - 25.0).abs() <= 6.0,
        "share {share}% under a 25% limit\n{}",
        r.stderr
    );
}

#[test]
fn the_limits_mount_cannot_be_written_and_a_missing_file_refuses_cuda() {
    if !containers_available() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let answer = allocate(settings(state.path()));
    let c = Container::from_allocate(&answer);
    let limits_dir = answer
        .mounts
        .iter()
        .find(|m| m.container_path == "/etc/tessera")
        .map(|m| PathBuf::from(&m.host_path))
        .expect("limits mount");
    let before = std::fs::read(limits_dir.join("limits")).unwrap();
    // Root in the container (no CAP_SYS_ADMIN, as runtimes run it) tries everything.
    let script = "echo CUDA_DEVICE_MEMORY_LIMIT_0=70g >> /etc/tessera/limits; echo append=$?; \
                  rm -f /etc/tessera/limits; echo rm=$?; \
                  echo version=1 > /etc/tessera/new; echo create=$?; \
                  mv /etc/tessera /etc/elsewhere; echo mv=$?; \
                  rm -f /etc/ld.so.preload; echo rm_preload=$?; \
                  umount /etc/tessera; echo umount=$?; \
                  mount -o remount,rw /etc/tessera; echo remount=$?";
    let out = c
        .command("/bin/sh", &["-c", script], &[], None)
        .output()
        .expect("sh in the container");
    let r = Report::from(out);
    for step in [
        "append",
        "rm",
        "create",
        "mv",
        "rm_preload",
        "umount",
        "remount",
    ] {
        assert_ne!(
            r.get(step),
            "0",
            "{step} succeeded:\n{}\n{}",
            r.stdout,
            r.stderr
        );
    }
    assert_eq!(std::fs::read(limits_dir.join("limits")).unwrap(), before);
    assert_eq!(
        fill(&c, &[]),
        (15, 16 * GIB),
        "still limited after the attempts"
    );

    // The file gone (or not written yet): CUDA refused after the bounded wait, saying why.
    std::fs::remove_file(limits_dir.join("limits")).unwrap();
    let r = c.probe(
        "fill",
        &["1024"],
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", Some("70g"))],
    );
    assert!(
        r.stderr.contains("/etc/tessera/limits") && r.stderr.contains("missing"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(!r.stdout.contains("count="), "no allocation: {}", r.stdout);
}

#[test]
fn dra_claim_container_cannot_lift_its_limits() {
    if !containers_available() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let settings = settings(state.path());
    let inv = tessera::gpu::fake::FakeBackend::from_spec("1xH100-80GB")
        .and_then(|b| b.inventory())
        .expect("fake inventory");
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml", "uid": "uid-1"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "driver": "gpu.tessera.io", "pool": "node-a", "device": "gpu-0-vgpu",
                "request": "gpu", "consumedCapacity": {"memory": "16Gi", "cores": "25"}
            }]}}}
        }))
        .expect("claim");
    let plan = tessera::dra::prepare::plan_claim(&claim, "uid-1", "node-a", &inv, &settings)
        .expect("plan");
    tessera::dra::prepare::write_claim_files(&settings, "uid-1", &plan.devices).expect("files");
    let c = Container::from_cdi(&plan.cdi.container_edits);
    assert!(!c.env.contains_key("LD_PRELOAD"));
    assert_eq!(fill(&c, &[]), (15, 16 * GIB));
    assert_eq!(
        fill(
            &c,
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", Some("70g")),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", None),
            ]
        ),
        (15, 16 * GIB)
    );
    // Unprepare removes the claim's directory.
    tessera::dra::prepare::remove_claim_files(&settings, "uid-1").unwrap();
    assert!(!state.path().join("vgpu/claim-uid-1").exists());
}
