#!/usr/bin/env bash
# Fuzz Tessera's parsers (fuzz/: cargo-fuzz targets on libFuzzer) for a bounded time each.
#
#   hack/fuzz.sh                       every target, FUZZ_SECONDS (default 20) each
#   FUZZ_SECONDS=300 hack/fuzz.sh plan_file layout_config
#
# Passes when no input panics, aborts, or takes over 1 s (libFuzzer -timeout=1); a failing
# input is kept in fuzz/artifacts/<target>/ and its path printed. Inputs that once failed
# live in fuzz/regressions/<target>/ and are replayed first, on every run.
#
# Runs on the stable toolchain: `cargo fuzz ... --sanitizer none` (coverage-guided, no
# AddressSanitizer; Tessera's crates forbid `unsafe`, the shim's parser is safe code). With
# a nightly toolchain, FUZZ_SANITIZER=address adds ASan. The corpus (fuzz/corpus/, not
# committed) is seeded from the repository's examples each run and grows across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-20}
sanitizer=${FUZZ_SANITIZER:-none}
all=(layout_config fake_inventory plan_file simulate_csv admission_review dra_checkpoint
  split_record gpu_config shim_limits extender prometheus_answer pod_views)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

# libFuzzer, our code instrumented for coverage; `seeds` comes out of the same build.
cargo fuzz build --sanitizer "$sanitizer" --debug-assertions
bin=fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/release

# Seeds: the repository's own examples, encoder-made files, committed seeds, regressions.
corpus=fuzz/corpus
seed() { # target file...
  local t=$1; shift
  mkdir -p "$corpus/$t"
  for f in "$@"; do
    [ -f "$f" ] && cp "$f" "$corpus/$t/repo-$(echo "$f" | tr '/' '_')"
  done
  return 0
}
"$bin/seeds" "$corpus"
for d in fuzz/seeds/*/; do seed "$(basename "$d")" "$d"*; done
seed layout_config daemonset/examples/mixed.yaml daemonset/node/configmap.yaml
if python3 -c 'import yaml' 2>/dev/null; then # each named config of the ConfigMap on its own
  python3 - "$corpus/layout_config" <<'EOF'
import sys, yaml
for name, text in yaml.safe_load(open("daemonset/node/configmap.yaml"))["data"].items():
    open(f"{sys.argv[1]}/configmap-{name}", "w").write(text)
EOF
fi
seed plan_file tests/scenarios/plan/*.yaml
mkdir -p "$corpus/simulate_csv"
for f in data/alibaba-gpu-v2023/*.csv; do
  # The header, the first rows and some rows with GPU specs / shares: small and varied.
  { head -20 "$f"; grep -E 'V100|T4|A10|,[1-9][0-9]{0,2},' "$f" | head -20 || true; } \
    > "$corpus/simulate_csv/repo-$(basename "$f")"
done
seed gpu_config $(grep -l 'GpuConfig' daemonset/examples/claims/*.yaml 2>/dev/null || true)

status=0
for t in "${targets[@]}"; do
  echo "== fuzz $t (${seconds}s)"
  mkdir -p "fuzz/artifacts/$t" "$corpus/$t"
  regressions=()
  [ -d "fuzz/regressions/$t" ] && regressions=("fuzz/regressions/$t")
  if [ "${#regressions[@]}" -gt 0 ]; then
    # Replay the inputs that once failed: each must now pass.
    if ! "$bin/$t" -timeout=1 -rss_limit_mb=2048 "fuzz/regressions/$t"/*; then
      echo "FUZZ FAILED: $t: a regression input fails again (fuzz/regressions/$t)" >&2
      status=1
      continue
    fi
  fi
  log=$(mktemp)
  if "$bin/$t" -timeout=1 -rss_limit_mb=2048 -max_total_time="$seconds" -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" "$corpus/$t" >"$log" 2>&1; then
    grep -E '^(stat::number_of_executed_units|stat::new_units_added)' "$log" | tr '\n' ' '
    echo
  else
    tail -40 "$log" >&2
    echo "FUZZ FAILED: $t: $(grep -Eo '(Test unit written to|artifact_prefix.*written to) [^ ]+' "$log" | tail -1)" >&2
    status=1
  fi
  rm -f "$log"
done
exit "$status"
