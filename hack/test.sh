#!/usr/bin/env bash
# The whole test suite: unit, integration and doc tests of every workspace member.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
