//! `tessera layout`.

/// Flags of `tessera layout`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`tessera layout` is not built yet")
}
