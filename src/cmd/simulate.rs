//! `tessera simulate`.

/// Flags of `tessera simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera simulate` is not built yet")
}
