#!/usr/bin/env bash
# Checks the stock CAP worker snippets (docs/cap-snippets/, the same text as
# README's "Heartbeat snippets") against a CAP SDK checkout:
#
#   scripts/check-cap-snippets.sh <sdk-checkout>     (a clone of cordum-io/cap, bare or not)
#
#   Go      built and vetted against the checkout (go.mod replace)
#   Python  compiled (py_compile), and every name it imports from the SDK,
#           every message, enum value and field it names from the SDK's
#           protobuf modules, found in the checkout's source and .proto files
#   Node    the SDK built (npm install, which needs the npm registry), the
#           snippet syntax-checked, then run
#
# Then, when nats-server is installed, the Go and the Node worker each run
# against a private nats-server on a free loopback port: a probe (Node, on
# the SDK's own protobuf definitions) waits for the worker's heartbeat,
# checks its worker_id, pool and max_parallel_jobs, sends it one job on
# job.echo and waits for a SUCCEEDED JobResult.
#
# The SDK is cloned into a temporary directory (removed on exit; KEEP=1
# keeps it): nothing is written into the checkout or this repository.
# SKIP_NODE=1 skips the Node build and every run (no npm registry).
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 <cap-sdk-checkout>" >&2
	exit 2
fi
sdk_src=$1
repo=$(cd "$(dirname "$0")/.." && pwd)
snip=$repo/docs/cap-snippets
work=$(mktemp -d "${TMPDIR:-/tmp}/cap-snippets.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	if [ "${KEEP:-}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Only what the snippets build against is checked out (a snapshot may lack
# files the SDK does not need).
git clone -q --no-checkout "$sdk_src" "$work/cap"
git -C "$work/cap" checkout -q HEAD -- go.mod go.sum cordum proto sdk
rev=$(git -C "$work/cap" rev-parse HEAD)
echo "CAP SDK checkout at $rev"
# The README names the revision its snippets were checked against.
stated=$(grep -o 'cordum-io/cap at [0-9a-f]\{7,40\}' "$repo/README.md" | head -1 | awk '{print $3}' || true)
case "$rev" in
"$stated"*) echo "README states this revision ($stated)" ;;
*) echo "README states revision '${stated:-none}', the checkout is $rev" >&2; [ "${ANY_REV:-}" = 1 ] || exit 1 ;;
esac

echo "== Go: build against the checkout"
mkdir "$work/go"
cp "$snip/go/main.go" "$snip/go/go.mod" "$work/go/"
(
	cd "$work/go"
	go mod edit -require=github.com/cordum-io/cap/v2@v2.0.0 -replace=github.com/cordum-io/cap/v2="$work/cap"
	GOFLAGS=-mod=mod go mod tidy
	go vet .
	go build -o "$work/echo-go-worker" .
)
echo "ok: Go snippet builds and vets"

echo "== Python: compile, and check every SDK name it uses"
python3 - "$snip/python/echo_worker.py" "$work/cap" <<'PY'
import ast, os, py_compile, re, sys, tempfile

src, cap = sys.argv[1], sys.argv[2]
py_compile.compile(src, cfile=os.path.join(tempfile.mkdtemp(), "s.pyc"), doraise=True)
root = os.path.join(cap, "sdk", "python")
protos = os.path.join(cap, "proto", "cordum", "agent", "v1")
tree = ast.parse(open(src).read(), src)
errors = []

def module_path(mod):
    base = os.path.join(root, *mod.split("."))
    for p in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(p):
            return p
    return None

def defines(path, name):
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False

pb2 = {}  # local name -> .proto text of an SDK protobuf module
for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cap":
        path = module_path(node.module)
        if path is None:
            errors.append(f"line {node.lineno}: no module {node.module} in the SDK")
            continue
        for a in node.names:
            if module_path(node.module + "." + a.name):
                if a.name.endswith("_pb2"):
                    proto = os.path.join(protos, a.name[:-4] + ".proto")
                    pb2[a.asname or a.name] = open(proto).read()
            elif not defines(path, a.name):
                errors.append(f"line {node.lineno}: {node.module} has no {a.name}")
    elif isinstance(node, ast.Import):
        for a in node.names:
            if a.name.split(".")[0] == "cap" and module_path(a.name) is None:
                errors.append(f"line {node.lineno}: no module {a.name} in the SDK")

def message_fields(proto, msg):
    m = re.search(r"message\s+%s\s*\{(.*?)\n\}" % re.escape(msg), proto, re.S)
    if not m:
        return None
    return set(re.findall(r"^\s*(?:repeated\s+|optional\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+", m.group(1), re.M))

for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in pb2:
        proto, name = pb2[node.value.id], node.attr
        if not re.search(r"\b(message|enum)\s+%s\b|^\s*%s\s*=" % (name, name), proto, re.M):
            errors.append(f"line {node.lineno}: {node.value.id}.{name} is in no .proto of the SDK")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
            and node.func.value.id in pb2:
        fields = message_fields(pb2[node.func.value.id], node.func.attr)
        for kw in node.keywords:
            if fields is not None and kw.arg not in fields:
                errors.append(f"line {node.lineno}: message {node.func.attr} has no field {kw.arg}")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"ok: Python snippet compiles; SDK modules and names found ({', '.join(sorted(pb2))} against their .proto files)")
PY

if [ "${SKIP_NODE:-}" = 1 ]; then
	echo "SKIP_NODE=1: the Node snippet and the runs are skipped"
	exit 0
fi

echo "== Node: build the SDK (npm install), check and run the snippet"
# The package's main is dist/index.js, and src/protos.ts finds the .proto
# files three directories above it: compile src/ alone into dist/ (the
# package's own "build" script also compiles test/, which moves src/ to
# dist/src/, where neither holds).
(
	cd "$work/cap/sdk/node"
	npm install --no-audit --no-fund --loglevel=error >/dev/null
	echo '{"extends": "./tsconfig.json", "include": ["src/**/*"]}' >tsconfig.snippets.json
	npx tsc -p tsconfig.snippets.json
)
mkdir -p "$work/node/node_modules"
ln -s "$work/cap/sdk/node" "$work/node/node_modules/cap-sdk-node"
cp "$snip/node/echo-worker.js" "$work/node/"
node --check "$work/node/echo-worker.js"
echo "ok: Node SDK builds; snippet parses"

if ! command -v nats-server >/dev/null; then
	echo "no nats-server installed: the runs are skipped"
	exit 0
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
nats-server -a 127.0.0.1 -p "$port" >"$work/nats.log" 2>&1 &
pids+=($!)
export NATS_URL="nats://127.0.0.1:$port"
for _ in $(seq 50); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	sleep 0.1
done

cat >"$work/node/probe.js" <<'JS'
// Waits for a heartbeat from worker argv[2] (pool argv[3], max_parallel_jobs
// argv[4]), sends it one job on job.echo, and waits for its SUCCEEDED result.
const { connectNATS, loadRoot } = require("cap-sdk-node");
const [id, pool, max] = process.argv.slice(2);
const fail = (msg) => { console.error("probe: " + msg); process.exit(1); };
setTimeout(() => fail("no heartbeat and result within 20 s"), 20000);
(async () => {
  const nc = await connectNATS({ url: process.env.NATS_URL, name: "probe" });
  const BusPacket = (await loadRoot()).lookupType("cordum.agent.v1.BusPacket");
  const jobId = "probe-" + Date.now();
  const results = nc.subscribe("sys.job.result");
  for await (const m of nc.subscribe("sys.heartbeat")) {
    const hb = BusPacket.decode(m.data).heartbeat;
    if (!hb || hb.workerId !== id) continue;
    if (hb.pool !== pool || hb.maxParallelJobs !== Number(max)) fail(`heartbeat ${JSON.stringify(hb)}`);
    console.log(`heartbeat: worker_id=${hb.workerId} pool=${hb.pool} max_parallel_jobs=${hb.maxParallelJobs}`);
    break;
  }
  nc.publish("job.echo", BusPacket.encode(BusPacket.fromObject({
    traceId: jobId, senderId: "probe", protocolVersion: 1,
    jobRequest: { jobId, topic: "job.echo", contextPtr: "redis://ctx:" + jobId },
  })).finish());
  for await (const m of results) {
    const res = BusPacket.decode(m.data).jobResult;
    if (!res || res.jobId !== jobId) continue;
    const status = BusPacket.lookupEnum("cordum.agent.v1.JobStatus").valuesById[res.status];
    if (status !== "JOB_STATUS_SUCCEEDED") fail(`result ${JSON.stringify(res)}`);
    console.log(`result: job ${res.jobId} ${status} from ${res.workerId}`);
    process.exit(0);
  }
})().catch((e) => fail(e.stack || String(e)));
JS

run() { # run <name> <worker-id> <max-parallel> <command...>
	local name=$1 id=$2 max=$3
	shift 3
	"$@" >"$work/$name.log" 2>&1 &
	local pid=$!
	pids+=("$pid")
	if ! (cd "$work/node" && timeout 30 node probe.js "$id" echo "$max"); then
		echo "$name worker log:" >&2
		cat "$work/$name.log" >&2
		exit 1
	fi
	kill "$pid" 2>/dev/null || true
	echo "ok: $name snippet ran: heartbeat seen, one job SUCCEEDED"
}
run go echo-go-1 1 "$work/echo-go-worker"
run node echo-node-1 4 node "$work/node/echo-worker.js"
