#!/usr/bin/env bash
# device-bundle.sh — pack what the scale matrix needs onto a bare Linux host (no Go, Redis or NATS):
#   DIR/troupe-bench                       static (CGO_ENABLED=0) build of cmd/troupe-bench
#   DIR/redis-server, DIR/nats-server      wrappers that start the real binaries (DIR/bin/) through the
#                                          dynamic loader and libraries copied from this host (DIR/lib/),
#                                          so the target's own libc does not matter
#   DIR/run-matrix.sh                      runs scripts/scale-matrix.sh with these (private Redis and NATS)
# and DIR.tar.gz of it all. See DEVELOPERS.md.
#
#   scripts/device-bundle.sh [DIR]         (default DIR: bench-out/device-bundle, git-ignored)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$root/bench-out/device-bundle}
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
DIR=$(cd "$DIR" && pwd)

(cd "$root" && CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-auto} go build -trimpath -ldflags='-s -w' \
  -o "$DIR/troupe-bench" ./cmd/troupe-bench)

# carry NAME: copy the binary NAME on PATH and every library ldd lists (the loader included) and
# write DIR/NAME, a wrapper that runs it through that loader with those libraries.
carry() {
  local src
  src=$(command -v "$1") || { echo "device-bundle: $1 not found" >&2; exit 1; }
  cp -L "$src" "$DIR/bin/$1"
  ldd "$src" | awk '/=> \//{print $3} /^[ \t]*\/.*ld-linux/{print $1}' | while read -r lib; do
    cp -Ln "$lib" "$DIR/lib/" 2>/dev/null || true
  done
  cat >"$DIR/$1" <<WRAP
#!/bin/sh
here=\$(cd "\$(dirname "\$0")" && pwd)
exec "\$here/lib/ld-linux-x86-64.so.2" --library-path "\$here/lib" "\$here/bin/$1" "\$@"
WRAP
  chmod +x "$DIR/$1"
}
carry redis-server
carry nats-server
cp "$root/scripts/scale-matrix.sh" "$DIR/scale-matrix.sh"
cat >"$DIR/run-matrix.sh" <<'RUN'
#!/bin/sh
# run-matrix.sh OUT [env as scale-matrix.sh takes it]: the matrix with the carried binaries.
here=$(cd "$(dirname "$0")" && pwd)
BENCH=$here/troupe-bench REDIS_SERVER=$here/redis-server NATS_SERVER=$here/nats-server START_NATS=1 \
  exec "$here/scale-matrix.sh" "$@"
RUN
chmod +x "$DIR/run-matrix.sh"
tar -C "$(dirname "$DIR")" -czf "$DIR.tar.gz" "$(basename "$DIR")"
echo "device-bundle: $DIR.tar.gz ($(du -h "$DIR.tar.gz" | cut -f1))"
