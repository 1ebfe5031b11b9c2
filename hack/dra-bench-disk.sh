#!/usr/bin/env bash
# The DRA bench (benches/dra_node.rs) with the agent's checkpoint on a disk that is quiet,
# beside a light writer, and beside a saturating writer, RUNS times each. CDI specs are on
# tmpfs (/dev/shm), as /var/run/cdi is on a node. Prints each run's table; the issue's
# target is "excluding the agent's claim GET" p99 <= 5 ms.
#
#   hack/dra-bench-disk.sh                       # builds the bench (release) and runs it
#   BENCH=…/dra_node-<hash> hack/dra-bench-disk.sh
#       # a prebuilt bench; it runs the agent binary whose path was compiled into it
#       # (target/release/tessera of the checkout that built it)
#   STATE_DIR=/var/lib/x RUNS=3 BENCH_ROUNDS=5 LOG_DIR=/some/dir hack/dra-bench-disk.sh
#
# Writers (same filesystem as STATE_DIR):
#   light       32 MiB written + fdatasync, then a 0.5 s pause, in a loop
#   saturating  256 MiB written + fdatasync, in a loop
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
export BENCH_ROUNDS=${BENCH_ROUNDS:-5}
STATE_DIR=${STATE_DIR:-$PWD/target/dra-bench-state}
LOG_DIR=${LOG_DIR:-$STATE_DIR/logs}
mkdir -p "$STATE_DIR" "$LOG_DIR"
if [[ -z "${BENCH:-}" ]]; then
  BENCH=$(cargo bench --bench dra_node --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*dra_node[^"]*\)".*/\1/p' | tail -1)
  [[ -x "$BENCH" ]] || { echo "dra-bench-disk: could not build the bench" >&2; exit 2; }
fi
echo "cpus $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
df -h "$STATE_DIR" /dev/shm | sed 's/^/df: /'

writer_pid=
start_writer() {
  case $1 in
    quiet) return ;;
    light) (while :; do dd if=/dev/zero of="$STATE_DIR/writer" bs=1M count=32 \
      conv=fdatasync status=none; sleep 0.5; done) & ;;
    saturating) (while :; do dd if=/dev/zero of="$STATE_DIR/writer" bs=1M count=256 \
      conv=fdatasync status=none; done) & ;;
  esac
  writer_pid=$!
  sleep 2 # let the writer's dirty pages build up before measuring
}
stop_writer() {
  [[ -n $writer_pid ]] || return
  kill "$writer_pid" 2>/dev/null
  wait "$writer_pid" 2>/dev/null
  pkill -x dd 2>/dev/null
  writer_pid=
  rm -f "$STATE_DIR/writer"
}
trap stop_writer EXIT

status=0
for cond in quiet light saturating; do
  start_writer "$cond"
  for run in $(seq 1 "$RUNS"); do
    log="$LOG_DIR/dra-$cond-$run.txt"
    echo
    echo "=== $cond writer, run $run ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
    if DRA_BENCH_DIR="$STATE_DIR" DRA_BENCH_CDI_DIR=/dev/shm timeout 300 "$BENCH" --bench \
      >"$log" 2>&1; then
      grep -E "^NodePrepare|excluding|1 log record|^100 concurrent|republished|SIGKILL" "$log"
      grep -E "^  (get|cdi|completed|started) " "$log" | head -4 | sed 's/^/  whole-GPU step /'
    else
      echo "bench failed; last lines:"
      tail -20 "$log"
      status=1
    fi
  done
  stop_writer
done
exit $status
