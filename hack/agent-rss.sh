#!/usr/bin/env bash
# Peak resident memory (VmHWM) of the node agent under kubelet load: 8 fake GPUs,
# 1,000 Allocates, a kubelet restart, 1,000 Allocates again (benches/agent_rss.rs; figures
# in benches/README.md). Goal (issue 17): at most 12 MiB. It measures the binary the image
# ships: `tessera-node` built with the `node` profile (Cargo.toml), unless TESSERA_BIN
# names another build.
#
#   hack/agent-rss.sh                    RSS_ALLOCATES=1000, fails above RSS_LIMIT_MIB=12
#   RSS_ALLOCATES=5000 hack/agent-rss.sh
#   TESSERA_BIN=target/release/tessera-node hack/agent-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RSS_LIMIT_MIB="${RSS_LIMIT_MIB:-12}"
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build --profile node --locked --bin tessera-node
  export TESSERA_BIN="$PWD/target/node/tessera-node"
fi
cargo bench --bench agent_rss
