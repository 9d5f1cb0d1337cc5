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
# A port another run's server already listens on would pass the readiness
# check below while this run's server failed to start, and the run would
# measure (and later lose) the other's: pick ports nothing listens on.
port_open() { (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	for _ in $(seq 1 50); do
		p=$(($1 + RANDOM % 10000))
		port_open "$p" || { echo "$p"; return 0; }
	done
	echo "bench-private: no free port from $1" >&2
	return 1
}
rport=$(free_port 20000) nport=$(free_port 30000)
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
ready=
for _ in $(seq 1 100); do
	kill -0 "$npid" 2>/dev/null || break # this run's nats-server exited (its port taken meanwhile?)
	if redis-cli -p "$rport" ping >/dev/null 2>&1 && port_open "$nport"; then
		ready=1
		break
	fi
	sleep 0.1
done
# Both servers must be this run's own: redis-server wrote its pid file, nats-server still runs.
if [ -z "$ready" ] || ! kill -0 "$npid" 2>/dev/null || ! [ -s "$dir/redis.pid" ] ||
	! kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null; then
	echo "bench-private: the private servers did not start (redis :$rport, nats :$nport); their logs:" >&2
	tail -n 5 "$dir/redis.log" "$dir/nats.log" >&2 || true
	exit 1
fi
echo "== $label: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T)"
"$bin" --redis "redis://127.0.0.1:$rport" --nats "nats://127.0.0.1:$nport" --quiet --no-record --out "$dir/out" "$@"
echo "== $label: load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T) (end)"
