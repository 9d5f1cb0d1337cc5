#!/usr/bin/env bash
# Counts the exported identifiers of each public package: every package of
# the module outside internal/, cmd/ (mains) and proto/capv1 (generated code,
# counted on a line of its own).
#
# Rule (internal/apisurface): over a package's non-test .go files, every
# exported top-level const, var, func and type counts once; so does every
# exported method of an exported type, every exported field of an exported
# struct type (an embedded one by its type's name) and every exported method
# of an exported interface type. Unexported names, methods of unexported
# types and fields of anonymous nested structs do not count.
#
#   scripts/exported-count.sh              the counts
#   scripts/exported-count.sh -internal    internal types in exported signatures
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
pkgs=$(go list -f '{{.Dir}}' ./... | sed "s|^$PWD|.|; s|^\.$|.|" |
	grep -v -e '^\./internal/' -e '^\./cmd/' -e '^\./proto/')
if [ "${1:-}" = -internal ]; then
	exec go run ./internal/apisurface/exportcount -internal $pkgs ./proto/capv1
fi
echo "public packages:"
go run ./internal/apisurface/exportcount $pkgs
echo
echo "generated (proto/capv1):"
go run ./internal/apisurface/exportcount ./proto/capv1
