#!/usr/bin/env bash
# Peak resident memory (VmHWM) of the release node agent under kubelet load: 8 fake GPUs,
# 1,000 Allocates, a kubelet restart, 1,000 Allocates again (benches/agent_rss.rs; figures
# in benches/README.md). Goal (issue 17): at most 12 MiB.
#
#   hack/agent-rss.sh                    RSS_ALLOCATES=1000, fails above RSS_LIMIT_MIB=12
#   RSS_ALLOCATES=5000 hack/agent-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RSS_LIMIT_MIB="${RSS_LIMIT_MIB:-12}"
cargo bench --bench agent_rss
