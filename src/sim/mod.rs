//! Fleet simulator on public cluster traces: the FGD paper's protocol (ATC'23) on the
//! Alibaba GPU trace v2023, run with the placement engine's policies.
//!
//! ```text
//! trace CSVs ──► trace::{read_node_list, read_pod_list} ──► protocol::Prepared
//!   └─► runner::run_all (policies × seeds, threads) ──► protocol::RunResult per run
//!         └─► runner::summarize ──► report (table / JSON) + plot (SVG), beside
//!             reference::PaperResults (the authors' published numbers)
//! ```
//!
//! [`fleet`]: training and inference sharing one fleet over time vs dedicated pools
//! (`tessera simulate fleet`).

pub mod bound;
mod error;
pub mod fleet;
pub mod plot;
pub mod protocol;
pub mod reference;
pub mod report;
pub mod runner;
pub mod trace;

pub use error::{Error, Result};
