//! One module per subcommand: each has `Args` (clap) and `run(args) -> anyhow::Result<()>`.

pub mod controller;
pub mod diagnose;
pub mod layout;
pub mod node;
pub mod plan;
pub mod report;
pub mod simulate;
pub mod simulate_fleet;
pub mod top;
