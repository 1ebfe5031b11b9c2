//! Stderr logging for the shim. A preloaded library must not touch the host application's
//! logging setup, so this is a tiny leveled writer (`TESSERA_LOG`) instead of `tracing`.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Set the level (from the parsed config).
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    level != LogLevel::Off && level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn emit(level: LogLevel, tag: &str, msg: &str) {
    if enabled(level) {
        let line = format!("tessera-cuda[{}]: {tag}: {msg}\n", std::process::id());
        // One write call so lines from several threads do not interleave.
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Errors are printed unless `TESSERA_LOG=off`.
pub fn error(msg: &str) {
    emit(LogLevel::Error, "error", msg);
}

pub fn warn(msg: &str) {
    emit(LogLevel::Warn, "warn", msg);
}

pub fn info(msg: &str) {
    emit(LogLevel::Info, "info", msg);
}

pub fn debug(msg: &str) {
    emit(LogLevel::Debug, "debug", msg);
}
