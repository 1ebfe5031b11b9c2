//! `tessera plan`.

/// Flags of `tessera plan`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera plan` is not built yet")
}
