package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
)

// benchMoved is what `troupe bench` prints: the bench harness is its own
// command, not linked into this binary.
const benchMoved = "troupe bench is now its own command: go run ./cmd/troupe-bench [flags] (make bench), " +
	"or go build ./cmd/troupe-bench; see BENCHMARKS.md"

// runBench points to cmd/troupe-bench: exit 2, or 0 when asked for help.
func runBench(_ context.Context, args []string) error {
	fmt.Fprintln(os.Stderr, benchMoved)
	for _, a := range args {
		if isHelp(a) {
			return flag.ErrHelp
		}
	}
	return usageError{errors.New("moved to troupe-bench")}
}
