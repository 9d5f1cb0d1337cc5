#!/usr/bin/env bash
# bench-private.sh <troupe-bench binary> <label> [troupe-bench args...]
#
# Runs one troupe-bench invocation against a fresh private redis-server and
# nats-server (random loopback ports, a temporary directory, no persistence),
# then stops them: each run starts from empty servers, and the system's
# Redis and NATS (and whatever else uses them) stay out of the figures.
# Alternate two binaries run by run to compare commits:
#   for i in 1 2 3; do for b in old new; do scripts/bench-private.sh ./bench-$b $b --jobs 100000; done; done
# Needs redis-server, redis-cli and nats-server on PATH.
set -euo pipefail
bin=$1 label=$2
shift 2
rport=$((20000 + RANDOM % 10000)) nport=$((30000 + RANDOM % 10000))
dir=$(mktemp -d "${TMPDIR:-/tmp}/troupe-bench-private.XXXXXX")
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
	--daemonize yes --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
nats-server -a 127.0.0.1 -p "$nport" -js -sd "$dir/js" -l "$dir/nats.log" &
npid=$!
cleanup() {
	redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	kill "$npid" 2>/dev/null || true
	wait "$npid" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
	if redis-cli -p "$rport" ping >/dev/null 2>&1 && (echo >"/dev/tcp/127.0.0.1/$nport") 2>/dev/null; then
		break
	fi
	sleep 0.1
done
echo "== $label: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)"
"$bin" --redis "redis://127.0.0.1:$rport" --nats "nats://127.0.0.1:$nport" --quiet --no-record --out "$dir/out" "$@"
echo "== $label: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T) (end)"
