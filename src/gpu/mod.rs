//! (node agent; being built under issue 2)

pub mod models;
