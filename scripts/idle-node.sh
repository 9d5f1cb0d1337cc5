#!/usr/bin/env bash
# Measures an idle `troupe node` (no jobs, no workers) on a private
# redis-server and nats-server: its CPU from /proc/<pid>/stat (utime +
# stime) and Redis's INFO commandstats delta per second by command
# (commands run inside scripts included, as Redis counts them), over a
# window that starts after the node has run WARM seconds (default 8: the
# due and saga pollers reach their idle interval after 7 s).
#
#   scripts/idle-node.sh <troupe binary> <label> [seconds, default 30]
#
# Alternate it with the base commit's binary (A B A B ...): the CPU figure
# is noisy on a shared host, the command counts are not. BENCHMARKS.md,
# "Idle node: the pollers back off".
set -uo pipefail
BIN=$1; LABEL=$2; SECS=${3:-30}; WARM=${WARM:-8}
RP=$((20000 + RANDOM % 10000)); NP=$((30000 + RANDOM % 10000)); AP=$((50000 + RANDOM % 10000))
D=$(mktemp -d /tmp/idle-node.XXXX)
redis-server --port $RP --bind 127.0.0.1 --save "" --appendonly no --dir "$D" --daemonize yes --logfile "$D/r.log"
nats-server -a 127.0.0.1 -p $NP -js -sd "$D/js" -l "$D/n.log" &
NPID=$!
sleep 1
"$BIN" node --redis redis://127.0.0.1:$RP --nats nats://127.0.0.1:$NP --admin-listen 127.0.0.1:$AP \
	--id "idle-$LABEL" >"$D/node.log" 2>&1 &
TPID=$!
sleep "$WARM"
stats() { redis-cli -p $RP info commandstats | tr -d '\r' | grep '^cmdstat_' | sed 's/^cmdstat_//; s/:calls=\([0-9]*\),.*/ \1/' | sort; }
cpu() { awk '{print $14+$15}' /proc/$TPID/stat; }
LOAD=$(cut -d' ' -f1 /proc/loadavg)
stats >"$D/s0"; c0=$(cpu); t0=$(date +%s.%N)
sleep "$SECS"
stats >"$D/s1"; c1=$(cpu); t1=$(date +%s.%N)
el=$(echo "$t1 - $t0" | bc -l)
cpums=$(echo "($c1 - $c0) * 1000 / $(getconf CLK_TCK) / $el" | bc -l)
printf "== %s %s UTC load %s: %.1f s, %.2f CPU-ms/s\n" "$LABEL" "$(date -u +%H:%M:%S)" "$LOAD" "$el" "$cpums"
join -a2 -e0 -o 0,1.2,2.2 "$D/s0" "$D/s1" | awk -v e="$el" '{d=$3-$2; t+=d; if (d>0) printf "  %-16s %8.1f/s\n", $1, d/e} END {printf "  %-16s %8.1f/s\n", "TOTAL", t/e}'
kill $TPID; wait $TPID 2>/dev/null
redis-cli -p $RP shutdown nosave >/dev/null 2>&1; kill $NPID; wait $NPID 2>/dev/null
rm -rf "$D"
