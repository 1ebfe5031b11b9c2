//! `tessera node`.

/// Flags of `tessera node`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera node` is not built yet")
}
