#!/usr/bin/env bash
# Prints the import graph of Troupe's own packages: one line per package,
# "package: the module's packages it imports" (standard library and other
# modules left out; tests and commands' test files not counted). Paths are
# relative to the module root; "." is the root package `troupe`.
# ARCHITECTURE.md, "Packages and their imports", holds this output and
# TestArchitectureShowsTheImportGraph fails when the two differ.
# With --update it rewrites that block of ARCHITECTURE.md instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --update ]; then
  graph=$("$0")
  GRAPH="$graph" python3 - <<'PY'
import os, re
p = "ARCHITECTURE.md"
s = open(p).read()
b, e = "<!-- import-graph:begin -->\n```\n", "```\n<!-- import-graph:end -->"
i, j = s.index(b), s.index(e)
open(p, "w").write(s[:i + len(b)] + os.environ["GRAPH"] + "\n" + s[j:])
PY
  exit 0
fi
mod=$(go list -m)
go list -f '{{.ImportPath}}|{{join .Imports " "}}' ./... |
  while IFS='|' read -r pkg imports; do
    case "$pkg" in "$mod"/docs/* | "$mod"/proto/*) continue ;; esac
    deps=()
    for i in $imports; do
      case "$i" in
        "$mod"/proto/*) deps+=("${i#"$mod"/}") ;;
        "$mod") deps+=(".") ;;
        "$mod"/*) deps+=("${i#"$mod"/}") ;;
      esac
    done
    name=${pkg#"$mod"}; name=${name#/}; [ -z "$name" ] && name=.
    printf '%s:' "$name"
    [ ${#deps[@]} -gt 0 ] && printf ' %s' $(printf '%s\n' "${deps[@]}" | sort)
    printf '\n'
  done
