#!/usr/bin/env bash
# Validate libtessera_cuda.so and the node agent's NVML backend on a real NVIDIA GPU (CUDA
# driver, nvidia-smi, python3 with PyTorch). Prints one table; finishes in under 5 minutes.
# Not run in CI (no GPU there); it runs the tests marked `#[ignore = "needs GPU"]`.
#
#   hack/gpu-check.sh            # builds the shim (release) and runs every check
#   SHIM=/path/libtessera_cuda.so LIMIT_GIB=10 hack/gpu-check.sh
#
# Checks: PyTorch allocates until OOM under a LIMIT_GIB limit (default allocator and
# expandable_segments:True, backend:cudaMallocAsync) and stops within one granule + context of the limit;
# torch.cuda.mem_get_info() and nvidia-smi report the slice; a kernel-bound loop under
# CUDA_DEVICE_SM_LIMIT 30/50/70 against unlimited (share = throughput ratio); per-call
# overhead of cudaMalloc+cudaFree and an empty kernel launch with and without the shim.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT_GIB=${LIMIT_GIB:-10}
if [[ -z "${SHIM:-}" ]]; then
  cargo build --release -p tessera-cuda >/dev/null
  SHIM=$PWD/target/release/libtessera_cuda.so
fi
for tool in nvidia-smi python3; do
  command -v "$tool" >/dev/null || { echo "gpu-check: $tool not found" >&2; exit 2; }
done
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
  { echo "gpu-check: PyTorch with CUDA is required" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROWS=()
row() { ROWS+=("$(printf '%-44s %-22s %-22s %s' "$1" "$2" "$3" "$4")"); }
shim_env() { env LD_PRELOAD="$SHIM" CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/cache" TESSERA_LOG=warn "$@"; }

# --- memory: allocate 256 MiB tensors until OOM -----------------------------------------
cat >"$WORK/fill.py" <<'PY'
import torch, sys
xs = []
try:
    while True:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
free, total = torch.cuda.mem_get_info()
print(len(xs) * 256, free >> 20, total >> 20)
PY
limit_mib=$((LIMIT_GIB * 1024))
for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
  read -r got free total < <(shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" \
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 120 python3 "$WORK/fill.py")
  # Pass: stopped below the limit but not more than 1 GiB (context + one 256 MiB tensor) short.
  verdict=FAIL
  if ((got <= limit_mib && got >= limit_mib - 1024 && total == limit_mib)); then verdict=ok; fi
  row "OOM under ${LIMIT_GIB} GiB (${conf:-default allocator})" "allocated ${got} MiB" "mem_get_info total ${total}" "$verdict"
done

# --- nvidia-smi inside the limit ---------------------------------------------------------
smi_total=$(shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" \
  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
verdict=FAIL; ((smi_total == limit_mib)) && verdict=ok
row "nvidia-smi memory.total" "${smi_total} MiB" "want ${limit_mib}" "$verdict"

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
base=$(timeout 60 python3 "$WORK/spin.py")
for pct in 30 50 70; do
  rate=$(shim_env CUDA_DEVICE_SM_LIMIT_0="$pct" timeout 60 python3 "$WORK/spin.py")
  share=$(python3 -c "print(round(100 * $rate / $base, 1))")
  verdict=$(python3 -c "print('ok' if abs($share - $pct) <= 5 else 'FAIL')")
  row "SM limit ${pct}% (matmul throughput)" "${share}% of unlimited" "target ${pct}±5" "$verdict"
done

# --- per-call overhead ---------------------------------------------------------------------
cat >"$WORK/overhead.py" <<'PY'
import ctypes, time, torch
torch.cuda.init()
cudart = ctypes.CDLL("libcudart.so")
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
read -r pair0 launch0 < <(timeout 60 python3 "$WORK/overhead.py")
read -r pair1 launch1 < <(shim_env CUDA_DEVICE_MEMORY_LIMIT_0="${LIMIT_GIB}g" timeout 60 python3 "$WORK/overhead.py")
row "cudaMalloc+cudaFree pair (ns)" "direct ${pair0%.*}" "shim ${pair1%.*}" "+$(python3 -c "print(round($pair1 - $pair0))") ns"
row "kernel launch via PyTorch (ns)" "direct ${launch0%.*}" "shim ${launch1%.*}" "+$(python3 -c "print(round($launch1 - $launch0))") ns"

# --- node agent: the NVML backend on this GPU ------------------------------------------
# The `needs GPU` tests (inventory fields, events, a MIG round trip only when
# TESSERA_MIG_TEST_GPU=<uuid> is set) and the layout a node would advertise.
if timeout 120 cargo test --release --lib gpu::nvml -- --ignored >"$WORK/nvml.log" 2>&1; then
  row "NVML backend tests (needs GPU)" "$(grep -Eo '[0-9]+ passed' "$WORK/nvml.log" | head -1)" "all pass" "ok"
else
  row "NVML backend tests (needs GPU)" "see below" "all pass" "FAIL"
  tail -20 "$WORK/nvml.log"
fi
if timeout 60 cargo run --release --quiet -- layout --fake-gpus nvml >"$WORK/layout.txt" 2>&1; then
  row "tessera layout --fake-gpus nvml" "$(grep -c '^nvidia.com' "$WORK/layout.txt") resources" ">= 1" "ok"
else
  row "tessera layout --fake-gpus nvml" "error" ">= 1 resource" "FAIL"
  cat "$WORK/layout.txt"
fi

echo
printf '%-44s %-22s %-22s %s\n' "check" "measured" "expected" "result"
printf '%s\n' "${ROWS[@]}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 | sed 's/^/gpu: /'
