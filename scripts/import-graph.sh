#!/usr/bin/env bash
# Prints the import graph of Troupe's own packages: one line per package,
# "package: the module's packages it imports" (standard library and other
# modules left out; tests and commands' test files not counted). Paths are
# relative to the module root; "." is the root package `troupe`.
# ARCHITECTURE.md, "Packages and their imports", holds this output and
# TestArchitectureShowsTheImportGraph fails when the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
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
