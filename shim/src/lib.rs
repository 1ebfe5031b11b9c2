//! `libtessera_cuda.so`: the CUDA intercept library that enforces vGPU memory and SM
//! limits inside a container (issue 3, design.md "Shim contract"); see `docs/shim.md`.
//!
//! Everything that touches C — exported hooks, `dlsym`, the real driver, `mmap`, `flock` —
//! lives in [`ffi`]. Config parsing, accounting and limiting are safe Rust, unit-tested
//! without CUDA.
#![deny(unsafe_code)]

pub mod account;
pub mod config;
#[allow(unsafe_code)]
pub mod ffi;
pub mod limiter;
pub mod log;
pub mod runtime;
pub mod source;
