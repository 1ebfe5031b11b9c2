//! The process-global [`Shim`], built lazily by the first hook that needs it and rebuilt in
//! a forked child (the child gets its own accounting slot; the parent's descriptor, which
//! holds the parent's slot lock, is closed in the child).
//!
//! Plain atomics rather than `OnceLock`/`Mutex`: a child forked while another thread was
//! initialising must not inherit a lock that nobody will ever release.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, Ordering};

use crate::config::{Config, LogLevel};
use crate::runtime::{InitError, Shim};
use crate::source;

/// The outcome of initialisation (leaked once per process, so the size gap is harmless).
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Ready(Shim),
    /// The shim refuses CUDA in this process (bad config, accounting unavailable).
    Refused(String),
}

static STATE: AtomicPtr<Outcome> = AtomicPtr::new(std::ptr::null_mut());
static INIT: AtomicU8 = AtomicU8::new(0);
static SHARED_FD: AtomicI32 = AtomicI32::new(-1);
static ATFORK: AtomicBool = AtomicBool::new(false);
const IDLE: u8 = 0;
const BUSY: u8 = 1;

extern "C" fn after_fork_child() {
    STATE.store(std::ptr::null_mut(), Ordering::Release);
    INIT.store(IDLE, Ordering::Release);
    let fd = SHARED_FD.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        super::os::close_fd(fd);
    }
}

/// The state, initialising it on first use.
#[inline]
pub fn get() -> &'static Outcome {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: STATE only ever holds pointers from Box::leak, never freed.
        return unsafe { &*p };
    }
    init_slow()
}

#[cold]
fn init_slow() -> &'static Outcome {
    loop {
        if INIT
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if !ATFORK.swap(true, Ordering::AcqRel) {
                super::os::at_fork_child(after_fork_child);
            }
            let outcome: &'static Outcome = Box::leak(Box::new(build()));
            if let Outcome::Ready(shim) = outcome {
                shim.ledger
                    .set_reserved_query(Box::new(super::pools::reserved));
                if let Some(fd) = shim.shared_fd {
                    SHARED_FD.store(fd, Ordering::Release);
                }
            }
            STATE.store(outcome as *const Outcome as *mut Outcome, Ordering::Release);
            return outcome;
        }
        let p = STATE.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: as in get().
            return unsafe { &*p };
        }
        std::thread::yield_now();
    }
}

fn build() -> Outcome {
    let names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let fs = source::System {
        root: std::path::PathBuf::from("/"),
        read_only: super::os::is_read_only,
    };
    let loaded = source::load(
        &fs,
        |k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()),
        &names,
        source::LIMITS_WAIT,
    );
    match &loaded {
        Ok(l) => {
            crate::log::set_level(l.cfg.log_level);
            for note in &l.ignored {
                crate::log::warn(note);
            }
        }
        Err(_) => {
            // The log level of a refused process: the environment's, if it parses.
            if let Ok(cfg) = Config::from_env() {
                crate::log::set_level(cfg.log_level);
            }
        }
    }
    let origin = loaded.as_ref().map(|l| l.origin.clone()).ok();
    let result = loaded
        .map_err(InitError::from)
        .and_then(|l| Shim::build(l.cfg, u64::from(std::process::id())));
    match result {
        Ok(shim) => {
            if crate::log::enabled(LogLevel::Info) {
                let limits: Vec<String> = shim
                    .cfg
                    .devices
                    .iter()
                    .enumerate()
                    .filter(|(i, d)| *i == 0 || **d != shim.cfg.devices[0])
                    .map(|(i, d)| {
                        format!(
                            "dev{i}: mem={:?} sm={:?}",
                            d.memory,
                            shim.cfg.effective_sm_limit(i)
                        )
                    })
                    .collect();
                let from = match &origin {
                    Some(source::Origin::File(p)) => format!("limits from {}", p.display()),
                    _ => "limits from the environment (standalone)".to_string(),
                };
                crate::log::info(&format!(
                    "active; {from}; {} (unlisted devices as dev0)",
                    limits.join(", ")
                ));
            }
            Outcome::Ready(shim)
        }
        Err(e) => {
            let msg = format!("{e}; refusing CUDA in this process");
            crate::log::error(&msg);
            Outcome::Refused(msg)
        }
    }
}
