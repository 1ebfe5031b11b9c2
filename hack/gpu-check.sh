#!/usr/bin/env bash
# Validate libtessera_cuda.so and the node agent's NVML backend on a real NVIDIA GPU (CUDA
# driver, nvidia-smi, python3 with PyTorch). Prints one table; finishes in under 5 minutes.
# Not run in CI (no GPU there); it runs the tests marked `#[ignore = "needs GPU"]`.
#
#   hack/gpu-check.sh            # builds the shim, agent and tests (release), runs every check
#   SHIM=/path/libtessera_cuda.so LIMIT_GIB=10 hack/gpu-check.sh
#   SHIM=… TESSERA_BIN=…/tessera NVML_TESTS=…/tessera-<hash> hack/gpu-check.sh
#                                # prebuilt artifacts, for a GPU machine without cargo
#   LOG_DIR=/some/dir            # keep each check's stdout/stderr there (default: a temp dir)
#
# Checks: PyTorch allocates until OOM under a LIMIT_GIB limit (default allocator and
# expandable_segments:True, backend:cudaMallocAsync) and stops within one granule + context of
# the limit; two processes sharing one accounting file stay under the limit together;
# torch.cuda.mem_get_info() and nvidia-smi report the slice; a malformed limit refuses CUDA
# with a message naming the variable; a kernel-bound loop under CUDA_DEVICE_SM_LIMIT 30/50/70
# against unlimited (share = throughput ratio); per-call overhead of cudaMalloc+cudaFree and
# an empty kernel launch with and without the shim.
#
# A check that fails prints the end of its stderr below the table and the script goes on;
# the exit status is 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."

LIMIT_GIB=${LIMIT_GIB:-10}
if [[ -z "${SHIM:-}" ]]; then
  cargo build --release -p tessera-cuda >/dev/null || exit 2
  SHIM=$PWD/target/release/libtessera_cuda.so
fi
for tool in nvidia-smi python3; do
  command -v "$tool" >/dev/null || { echo "gpu-check: $tool not found" >&2; exit 2; }
done
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
  { echo "gpu-check: PyTorch with CUDA is required" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOG_DIR=${LOG_DIR:-$WORK/logs}
mkdir -p "$LOG_DIR"
ROWS=()
FAILED=()
row() {
  ROWS+=("$(printf '%-46s %-24s %-24s %s' "$1" "$2" "$3" "$4")")
  [[ $4 == FAIL* ]] && FAILED+=("$5")
}
# Runs "$@" with stdout to $LOG_DIR/$1.out and stderr to $LOG_DIR/$1.err; prints stdout.
step() {
  local name=$1
  shift
  "$@" >"$LOG_DIR/$name.out" 2>"$LOG_DIR/$name.err"
  local rc=$?
  cat "$LOG_DIR/$name.out"
  return $rc
}
shim_env() { env LD_PRELOAD="$SHIM" CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/cache" TESSERA_LOG=warn "$@"; }
num() { [[ ${1:-} =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; }

# --- memory: allocate 256 MiB tensors until OOM -----------------------------------------
cat >"$WORK/fill.py" <<'PY'
import os, sys, time, torch
# argv[1], if given: a file to wait for (at most 60 s) before exiting, holding the memory
flag = sys.argv[1] if len(sys.argv) > 1 else None
xs = []
try:
    while True:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
free, total = torch.cuda.mem_get_info()
print(len(xs) * 256, free >> 20, total >> 20, flush=True)
t0 = time.time()
while flag and not os.path.exists(flag) and time.time() - t0 < 60:
    time.sleep(0.05)
PY
limit_mib=$((LIMIT_GIB * 1024))
i=0
for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
  i=$((i + 1))
  read -r got free total < <(step "oom$i" shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" \
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 120 python3 "$WORK/fill.py")
  # Pass: stopped below the limit but not more than 1 GiB (context + one 256 MiB tensor) short.
  verdict=FAIL
  if num "${got:-}" && num "${total:-}" &&
    ((got <= limit_mib && got >= limit_mib - 1024 && total == limit_mib)); then verdict=ok; fi
  row "OOM under ${LIMIT_GIB} GiB (${conf:-default allocator})" "allocated ${got:-?} MiB" \
    "mem_get_info total ${total:-?}" "$verdict" "oom$i"
done

# --- two processes, one accounting file: together under the limit ------------------------
# The first holds what it got while the second fills; the sum must not pass the limit.
share_env=(CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/cache-share" CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g")
(step share_a shim_env "${share_env[@]}" timeout 120 python3 "$WORK/fill.py" "$WORK/share-done" \
  >/dev/null) &
pid_a=$!
for _ in $(seq 1 200); do [[ -s "$LOG_DIR/share_a.out" ]] && break; sleep 0.1; done
read -r got_b _ _ < <(step share_b shim_env "${share_env[@]}" timeout 120 python3 "$WORK/fill.py")
touch "$WORK/share-done"
wait "$pid_a" 2>/dev/null
read -r got_a _ _ <"$LOG_DIR/share_a.out"
verdict=FAIL
if num "${got_a:-}" && num "${got_b:-}" && ((got_a + got_b <= limit_mib &&
  got_a + got_b >= limit_mib - 2048)); then verdict=ok; fi
row "two processes, one ${LIMIT_GIB} GiB slice" "${got_a:-?} + ${got_b:-?} MiB" \
  "sum <= ${limit_mib}" "$verdict" share_b

# --- nvidia-smi inside the limit ---------------------------------------------------------
smi_total=$(step smi shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" \
  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
verdict=FAIL; num "$smi_total" && ((smi_total == limit_mib)) && verdict=ok
row "nvidia-smi memory.total" "${smi_total:-?} MiB" "want ${limit_mib}" "$verdict" smi

# --- fail closed: a malformed limit refuses CUDA and names the variable -------------------
avail=$(step badenv shim_env CUDA_DEVICE_MEMORY_LIMIT_0="10 gigs" timeout 60 \
  python3 -c 'import torch; print(torch.cuda.is_available())')
verdict=FAIL
if [[ $avail == False ]] && grep -q 'CUDA_DEVICE_MEMORY_LIMIT_0' "$LOG_DIR/badenv.err"; then
  verdict=ok
fi
row "malformed limit (\"10 gigs\")" "is_available ${avail:-?}" "False + named" "$verdict" badenv

# --- SM limit: kernel-bound loop ----------------------------------------------------------
cat >"$WORK/spin.py" <<'PY'
import torch, time
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
for _ in range(20):
    a @ a
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < 8:
    for _ in range(4):
        a @ a
    torch.cuda.synchronize()
    n += 4
print(n / (time.time() - t0))
PY
base=$(step spin_base timeout 60 python3 "$WORK/spin.py")
for pct in 30 50 70; do
  rate=$(step "spin$pct" shim_env CUDA_DEVICE_SM_LIMIT_0="$pct" timeout 60 python3 "$WORK/spin.py")
  share=? verdict=FAIL
  if num "$base" && num "$rate"; then
    share=$(python3 -c "print(round(100 * $rate / $base, 1))")
    verdict=$(python3 -c "print('ok' if abs($share - $pct) <= 5 else 'FAIL')")
  fi
  row "SM limit ${pct}% (matmul throughput)" "${share}% of unlimited" "target ${pct}±5" \
    "$verdict" "spin$pct"
done

# --- per-call overhead ---------------------------------------------------------------------
cat >"$WORK/overhead.py" <<'PY'
import ctypes, glob, os, time, torch
torch.cuda.init()
torch.empty(1, device="cuda")
# The CUDA runtime PyTorch loaded (its wheels ship libcudart.so.<major>).
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l]
found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
cudart = ctypes.CDLL((maps or found or ["libcudart.so"])[0])
p = ctypes.c_void_p()
N = 20000
for _ in range(1000):
    cudart.cudaMalloc(ctypes.byref(p), 1 << 20); cudart.cudaFree(p)
t0 = time.perf_counter_ns()
for _ in range(N):
    cudart.cudaMalloc(ctypes.byref(p), 1 << 20); cudart.cudaFree(p)
t1 = time.perf_counter_ns()
x = torch.empty(1, device="cuda")
for _ in range(1000):
    x.add_(0)
torch.cuda.synchronize()
t2 = time.perf_counter_ns()
for _ in range(N):
    x.add_(0)
torch.cuda.synchronize()
t3 = time.perf_counter_ns()
print((t1 - t0) / N, (t3 - t2) / N)
PY
read -r pair0 launch0 < <(step overhead0 timeout 60 python3 "$WORK/overhead.py")
read -r pair1 launch1 < <(step overhead1 shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" \
  timeout 60 python3 "$WORK/overhead.py")
if num "${pair0:-}" && num "${pair1:-}" && num "${launch0:-}" && num "${launch1:-}"; then
  row "cudaMalloc+cudaFree pair (ns)" "direct ${pair0%.*}" "shim ${pair1%.*}" \
    "+$(python3 -c "print(round($pair1 - $pair0))") ns" overhead1
  row "kernel launch via PyTorch (ns)" "direct ${launch0%.*}" "shim ${launch1%.*}" \
    "+$(python3 -c "print(round($launch1 - $launch0))") ns" overhead1
else
  row "per-call overhead" "direct ${pair0:-?}/${launch0:-?}" "shim ${pair1:-?}/${launch1:-?}" \
    FAIL overhead1
fi

# --- node agent: the NVML backend on this GPU ------------------------------------------
# The `needs GPU` tests (inventory fields, events, a MIG round trip only when
# TESSERA_MIG_TEST_GPU=<uuid> is set) and the layout a node would advertise.
if [[ -n "${NVML_TESTS:-}" ]]; then
  nvml_cmd=("$NVML_TESTS" gpu::nvml --ignored)
else
  nvml_cmd=(cargo test --release --lib gpu::nvml -- --ignored)
fi
if step nvml timeout 180 "${nvml_cmd[@]}" >/dev/null; then
  row "NVML backend tests (needs GPU)" "$(grep -Eo '[0-9]+ passed' "$LOG_DIR/nvml.out" | head -1)" \
    "all pass" "ok" nvml
else
  row "NVML backend tests (needs GPU)" "$(grep -Eo '[0-9]+ failed' "$LOG_DIR/nvml.out" | head -1)" \
    "all pass" "FAIL" nvml
  tail -40 "$LOG_DIR/nvml.out" >>"$LOG_DIR/nvml.err"
fi
if [[ -n "${TESSERA_BIN:-}" ]]; then
  layout_cmd=("$TESSERA_BIN" layout --fake-gpus nvml)
else
  layout_cmd=(cargo run --release --quiet -- layout --fake-gpus nvml)
fi
if step layout timeout 120 "${layout_cmd[@]}" >/dev/null; then
  row "tessera layout --fake-gpus nvml" "$(grep -c '^nvidia.com' "$LOG_DIR/layout.out") resources" \
    ">= 1" "ok" layout
else
  row "tessera layout --fake-gpus nvml" "error" ">= 1 resource" "FAIL" layout
fi

echo
printf '%-46s %-24s %-24s %s\n' "check" "measured" "expected" "result"
printf '%s\n' "${ROWS[@]}"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader -i 0 |
  sed 's/^/gpu: /'
for name in "${FAILED[@]}"; do
  echo
  echo "--- $name: stderr (last 30 lines) ---"
  tail -30 "$LOG_DIR/$name.err"
done
((${#FAILED[@]} == 0))
