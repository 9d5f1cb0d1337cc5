#!/usr/bin/env bash
# scale-matrix.sh — run the scale matrix on whatever machine it is given:
#   {1, 3 nodes} × {one Redis, a 3-master Redis Cluster} × {the bench's workers (direct), stock CAP workers (pool)}
# one troupe-bench run per cell, each cell's JSON result in OUT/, and OUT/matrix.md, the markdown table
# (jobs/s, each node's share of the jobs, forwards per job, node and Redis CPU per master, the ceilings they
# imply, jobs lost and received twice). See DEVELOPERS.md.
#
#   scripts/scale-matrix.sh [OUT]            (default OUT: bench-out/scale-matrix-<UTC time>, git-ignored)
#
# Environment (defaults in brackets):
#   JOBS [20000]  WORKERS [10]  NODES ["1 3"]  REDIS_KINDS ["single cluster"]  WORKER_MODES ["direct cap"]
#   MASTERS [3]           masters of each cell's local cluster (troupe-bench --redis-cluster, started per cell)
#   BENCH                 a troupe-bench binary; unset: built from this checkout into OUT/ (needs Go)
#   REDIS_SERVER [redis-server]  the redis-server command (a wrapper script for a carried binary)
#   REDIS_URL             the single Redis of the "single" cells; unset: a private redis-server the script
#                         starts on a free loopback port and stops at exit (no other client skews its CPU)
#   NATS_URL [nats://127.0.0.1:4222]   NATS with JetStream; START_NATS=1 starts a private nats-server instead
#   NATS_SERVER [nats-server]          the nats-server command START_NATS=1 runs
#   PIN                   a command prefix for every process the script starts, e.g. "taskset -c 0,1"
#   TIMEOUT [300s]        troupe-bench --timeout per cell
#   EXTRA                 more troupe-bench flags for every cell, e.g. "--warmup 500"
set -euo pipefail

JOBS=${JOBS:-20000}
WORKERS=${WORKERS:-10}
NODES=${NODES:-"1 3"}
REDIS_KINDS=${REDIS_KINDS:-"single cluster"}
WORKER_MODES=${WORKER_MODES:-"direct cap"}
MASTERS=${MASTERS:-3}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
NATS_SERVER=${NATS_SERVER:-nats-server}
START_NATS=${START_NATS:-0}
PIN=${PIN:-}
TIMEOUT=${TIMEOUT:-300s}
EXTRA=${EXTRA:-}
OUT=${1:-bench-out/scale-matrix-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

say() { printf 'scale-matrix: %s\n' "$*" >&2; }

# port_free PORT: nothing accepts connections on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p=$1
  while ! port_free "$p"; do p=$((p + 1)); done
  echo "$p"
}
# wait_port PORT: up to 10 s for a server to listen.
wait_port() {
  for _ in $(seq 1 200); do port_free "$1" || return 0; sleep 0.05; done
  return 1
}

PIDS=()
TMP=$(mktemp -d)
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -z "${BENCH:-}" ]]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  say "building troupe-bench into $OUT"
  (cd "$root" && GOTOOLCHAIN=${GOTOOLCHAIN:-auto} go build -o "$OUT/troupe-bench" ./cmd/troupe-bench)
  BENCH=$OUT/troupe-bench
fi

if [[ " $REDIS_KINDS " == *" single "* && -z "${REDIS_URL:-}" ]]; then
  port=$(free_port 16379)
  # shellcheck disable=SC2086
  $PIN "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
    >"$OUT/redis-single.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port" || { say "redis-server did not listen on $port (see $OUT/redis-single.log)"; exit 1; }
  REDIS_URL=redis://127.0.0.1:$port
  say "private Redis on $REDIS_URL"
fi

if [[ "$START_NATS" == 1 ]]; then
  port=$(free_port 14222)
  # shellcheck disable=SC2086
  $PIN "$NATS_SERVER" -a 127.0.0.1 -p "$port" -js -sd "$TMP/js" >"$OUT/nats.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port" || { say "nats-server did not listen on $port (see $OUT/nats.log)"; exit 1; }
  NATS_URL=nats://127.0.0.1:$port
  say "private NATS on $NATS_URL"
fi
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}

{
  echo "host: $(uname -n), $(nproc) CPUs; pin: ${PIN:-none}"
  echo "uptime before: $(uptime)"
} >"$OUT/machine.txt"

failed=0
for mode in $WORKER_MODES; do
  for kind in $REDIS_KINDS; do
    for n in $NODES; do
      cell=n$n-$kind-$mode
      redis_args=(--redis "${REDIS_URL:-}")
      [[ "$kind" == cluster ]] && redis_args=(--redis-cluster "$MASTERS" --redis-server "$REDIS_SERVER")
      say "$cell: $JOBS jobs, $WORKERS workers ($(cut -d' ' -f1-3 /proc/loadavg) load)"
      rm -rf "${OUT:?}/$cell"
      # shellcheck disable=SC2086
      if ! $PIN "$BENCH" --jobs "$JOBS" --workers "$WORKERS" --nodes "$n" --worker-mode "$mode" \
        "${redis_args[@]}" --nats "$NATS_URL" --timeout "$TIMEOUT" --no-record --quiet --out "$OUT/$cell" \
        $EXTRA >"$OUT/$cell.txt" 2>&1; then
        say "$cell FAILED (see $OUT/$cell.txt)"
        failed=$((failed + 1))
      fi
      for j in "$OUT/$cell"/*.json; do
        [[ -e "$j" ]] && mv "$j" "$OUT/$cell.json"
      done
      rmdir "$OUT/$cell" 2>/dev/null || true
    done
  done
done

echo "uptime after: $(uptime)" >>"$OUT/machine.txt"
shopt -s nullglob
results=("$OUT"/n*-*.json)
if ((${#results[@]} > 0)); then
  {
    cat "$OUT/machine.txt"
    echo
    "$BENCH" matrix-table "${results[@]}"
  } >"$OUT/matrix.md"
  cat "$OUT/matrix.md"
fi
say "results in $OUT ($failed cells failed)"
exit $((failed > 0))
